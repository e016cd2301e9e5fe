#!/usr/bin/env bash
# rxe-vm.sh - runs a command inside a throw-away QEMU VM that boots the distribution's stock
# kernel with Soft-RoCE (rdma_rxe) configured, so the rdma transport and its tests run against
# real kernel RDMA (ibverbs + rdma_cm) on a host whose own kernel has none.
#
# Usage: rxe-vm.sh [-f FILE]... [-d DIR]... [-e NAME=VALUE]... [-t SECS] [-m MB] [-s CPUS]
#                  [-l NETDEV -a IP/LEN] [-c PIPE] [-v] [--] [CMD...]
#   -f FILE  copy FILE into the VM as /opt/test/<basename>; the shared libraries it needs (ldd)
#            come along, so binaries built on the host run inside (same glibc)
#   -d DIR   copy directory DIR into the VM as /opt/test/<basename>; its executables' libraries come along
#   -e N=V   export N=V in the guest before CMD runs
#   -t SECS  wall-clock limit for the whole VM run (default 900)
#   -m MB    guest memory (default 1024);  -s N  guest CPUs (default 2)
#   -l NETDEV  a virtio NIC (eth0) on this QEMU netdev, e.g. `socket,udp=127.0.0.1:A,localaddr=
#            127.0.0.1:B` (a link to another VM); with -a, rxe0 sits on it with address IP/LEN
#            instead of on dummy0
#   -c PIPE  a control channel: the guest's second serial port (/dev/ttyS1, raw, in env
#            RXE_VM_CTL) is joined to the host's PIPE.in and PIPE.out (made here as FIFOs)
#   -v       echo the whole serial console (kernel log included)
#   CMD      shell command run in the guest (cwd /opt/test, after rxe0 is up on dummy0 with
#            192.0.2.1/24, or on eth0 with -a; env RXE_IP, RXE_DEV, RXE_GID_IDX set). Default: a
#            smoke test (ibv_devices, ibv_rc_pingpong, rping).
# Exit status: CMD's exit status inside the guest; 124 = timed out; 125 = VM or harness failure;
#   77 = a host tool or the kernel package cannot be had (CTest's SKIP_RETURN_CODE).
# Env: RXE_VM_CACHE      kernel cache (default ${XDG_CACHE_HOME:-$HOME/.cache}/caracal/rxe-vm);
#                        prepared once, then shared by every run (flock)
#      RXE_VM_KERNEL_DEB use this linux-image-*.deb instead of `apt-get download`
# Host needs (scripts/deps.sh test installs them): qemu-system-x86, busybox-static, ibverbs-utils,
#   rdmacm-utils, ibverbs-providers, iproute2, perftest (optional: ib_*_lat), gzip, util-linux
#   (flock), apt (to fetch the kernel once). Root is not needed.
#
# Why TCG: a stock kernel does not boot under this host's KVM (it is a paravirtualised one), so
# the VM is emulated; it uses both cores, so run one VM at a time (CTest RESOURCE_LOCK rxe_vm).
# Gotchas handled here: rdma_rxe needs crc32_generic loaded first; libibverbs finds its
# providers only in a merged-/usr layout; rdma_cm on `lo` hangs, so rxe0 sits on a dummy netdev;
# glibc dlopen()s libgcc_s.so.1 for thread cancellation, so it is copied in.
set -euo pipefail
CACHE=${RXE_VM_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/caracal/rxe-vm}
TIMEOUT=900 MEM=1024 SMP=2 VERBOSE=0 LINK='' LINK_ADDR='' CTL=''
FILES=() DIRS=() ENVS=()
while getopts "f:d:e:t:m:s:l:a:c:vh" o; do
  case $o in
    f) FILES+=("$OPTARG");; d) DIRS+=("$OPTARG");; e) ENVS+=("$OPTARG");; t) TIMEOUT=$OPTARG;;
    m) MEM=$OPTARG;; s) SMP=$OPTARG;; l) LINK=$OPTARG;; a) LINK_ADDR=$OPTARG;; c) CTL=$OPTARG;;
    v) VERBOSE=1;;
    *) sed -n '2,32p' "$0"; exit 125;;
  esac
done
[ -z "$LINK_ADDR" ] || [ -n "$LINK" ] || { echo "rxe-vm: -a needs -l" >&2; exit 125; }
shift $((OPTIND-1))
CMD="${*:-__smoke__}"
die() { echo "rxe-vm: $*" >&2; exit 125; }
skip() { echo "rxe-vm: $* (skipping)" >&2; exit 77; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }
T_ALL=$(now)
for t in qemu-system-x86_64 busybox ldd gzip flock cpio ibv_devices rdma dpkg-deb; do
  [ "$t" = cpio ] && continue  # busybox provides it
  command -v $t >/dev/null || skip "missing host tool: $t"
done

# ---- 1. kernel (cached; pruned to vmlinuz + the modules we need, ~15 MB) ----------------------
MODS="crc32_generic rdma_rxe rdma_ucm dummy veth virtio_pci virtio_net"
mkdir -p "$CACHE" || die "cannot create cache dir $CACHE"
exec 9>"$CACHE/.lock"; flock 9            # parallel runs share the cache
# .ok holds the module list it was prepared for: a changed list prepares the cache again.
if [ "$(cat "$CACHE/kpkg/.ok" 2>/dev/null)" != "$MODS" ]; then
  T0=$(now)
  rm -rf "$CACHE/kpkg" "$CACHE/full" "$CACHE/dl"; mkdir -p "$CACHE/dl"
  if [ -n "${RXE_VM_KERNEL_DEB:-}" ]; then
    [ -f "$RXE_VM_KERNEL_DEB" ] || die "RXE_VM_KERNEL_DEB=$RXE_VM_KERNEL_DEB is not a file"
    DEBS=("$RXE_VM_KERNEL_DEB")
  else
    # Debian: linux-image-amd64 -> linux-image-6.1.0-NN-amd64 (modules included).
    # Ubuntu: linux-image-generic -> linux-image-6.8.0-NN-generic, whose modules come in
    # linux-modules-VER and linux-modules-extra-VER (rdma_rxe is in the extra one).
    PKG=
    for meta in linux-image-amd64 linux-image-generic; do
      PKG=$(apt-cache depends "$meta" 2>/dev/null |
            awk '/Depends: linux-image-(unsigned-)?[0-9]/{print $2; exit}') && [ -n "$PKG" ] && break
    done
    [ -n "$PKG" ] || skip "no stock kernel package known to apt (linux-image-amd64 or linux-image-generic; run apt-get update)"
    KV=${PKG#linux-image-}; KV=${KV#unsigned-}
    WANT=("$PKG")
    for extra in "linux-modules-$KV" "linux-modules-extra-$KV"; do
      apt-cache show "$extra" >/dev/null 2>&1 && WANT+=("$extra")
    done
    (cd "$CACHE/dl" && apt-get download "${WANT[@]}" >/dev/null 2>&1) ||
      skip "apt-get download ${WANT[*]} failed"
    DEBS=("$CACHE"/dl/*.deb)
  fi
  for deb in "${DEBS[@]}"; do dpkg-deb -x "$deb" "$CACHE/full" || die "cannot unpack $deb"; done
  KVER=$(ls "$CACHE/full/lib/modules" | head -1)
  [ -n "$KVER" ] || die "no /lib/modules in ${DEBS[*]}"
  # busybox modprobe loads plain .ko only: unpack compressed modules (Ubuntu ships .ko.zst).
  while IFS= read -r -d '' m; do
    case $m in
      *.zst) command -v zstd >/dev/null || die "modules are zstd-compressed and zstd is missing"
             zstd -qd --rm "$m";;
      *.xz) xz -d "$m";;
      *.gz) gzip -d "$m";;
    esac
  done < <(find "$CACHE/full/lib/modules/$KVER" -name '*.ko.*' -print0)
  busybox depmod -b "$CACHE/full" "$KVER" || die "depmod failed"
  mkdir -p "$CACHE/kpkg/boot" "$CACHE/kpkg/lib/modules/$KVER"
  cp "$CACHE"/full/boot/vmlinuz-* "$CACHE/kpkg/boot/" || die "no vmlinuz in ${DEBS[*]}"
  for m in $MODS; do
    if grep -qE "(^|/)$m\.ko\$" "$CACHE/full/lib/modules/$KVER/modules.builtin" 2>/dev/null; then
      continue  # built into this kernel
    fi
    line=$(grep -E "(^|/)$m\.ko:" "$CACHE/full/lib/modules/$KVER/modules.dep") ||
      die "module $m not in kernel $KVER"
    for p in $(echo "$line" | tr -d ':'); do
      mkdir -p "$CACHE/kpkg/lib/modules/$KVER/$(dirname "$p")"
      cp "$CACHE/full/lib/modules/$KVER/$p" "$CACHE/kpkg/lib/modules/$KVER/$p"
    done
  done
  cp "$CACHE/full/lib/modules/$KVER"/modules.{builtin,order} "$CACHE/kpkg/lib/modules/$KVER/"
  busybox depmod -b "$CACHE/kpkg" "$KVER" || die "depmod failed"
  rm -rf "$CACHE/full" "$CACHE/dl"; echo "$MODS" > "$CACHE/kpkg/.ok"
  echo "rxe-vm: prepared kernel $KVER in $(since "$T0")s under $CACHE" >&2
fi
flock -u 9
KVER=$(ls "$CACHE/kpkg/lib/modules" | head -1)
VMLINUZ=$(ls "$CACHE"/kpkg/boot/vmlinuz-* | head -1)
MODDIR=$CACHE/kpkg/lib/modules/$KVER

# ---- 2. initramfs --------------------------------------------------------------------------
T_INITRD=$(now)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rxe_vm.XXXXXX")
QPID=
cleanup() { [ -n "$QPID" ] && kill "$QPID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
trap 'exit 125' INT TERM
R=$WORK/root; mkdir -p "$R"/{bin,sbin,etc,proc,sys,dev,tmp,run,opt/test,usr/bin,usr/lib,usr/lib64}
ln -s usr/lib "$R/lib"; ln -s usr/lib64 "$R/lib64"   # merged-/usr like the host
cp "$(command -v busybox)" "$R/bin/busybox"
file_is_elf() { [ "$(head -c4 "$1" 2>/dev/null | od -An -c | tr -d ' ')" = '177ELF' ]; }
add_file() {  # copy a host file to the same path in the guest (following symlinks)
  local f=$1; [ -e "$R$f" ] && return 0
  mkdir -p "$R$(dirname "$f")"; cp -L "$f" "$R$f"
}
add_libs() {  # copy the shared libraries an ELF file needs
  file_is_elf "$1" || return 0
  ldd "$1" 2>/dev/null | awk '/=> \//{print $3} /^\t\/.*ld-linux/{print $1}' |
    while read -r l; do add_file "$l"; done
}
mkdir -p "$R/lib/modules"; cp -r "$MODDIR" "$R/lib/modules/"
# rdma-core userspace and tools (perftest's are optional); iproute2's ip, for what busybox's
# lacks (veth pairs, neighbour entries; tests/rdma/link_fault.sh)
for b in ip rdma ibv_devices ibv_devinfo ibv_rc_pingpong rping ib_write_lat ib_read_lat ib_send_lat \
         ib_write_bw ib_read_bw; do
  p=$(command -v $b 2>/dev/null) || continue; add_file "$p"; add_libs "$p"
done
ML=$(dirname "$(ldd "$(command -v ibv_devices)" | awk '/libibverbs/{print $3}')")
for p in "$ML"/libibverbs/librxe-*.so; do [ -e "$p" ] || skip "no rxe provider (ibverbs-providers)"; add_file "$p"; add_libs "$p"; done
[ -e /etc/libibverbs.d/rxe.driver ] || skip "no /etc/libibverbs.d/rxe.driver (ibverbs-providers)"
mkdir -p "$R/etc/libibverbs.d"; cp /etc/libibverbs.d/rxe.driver "$R/etc/libibverbs.d/"
add_file "$(ldconfig -p | awk '/libgcc_s.so.1 .*x86-64/{print $NF; exit}')"
for f in "${FILES[@]}"; do
  [ -e "$f" ] || die "no such file: $f"; cp -L "$f" "$R/opt/test/"; add_libs "$f"
done
for d in "${DIRS[@]}"; do
  [ -d "$d" ] || die "no such dir: $d"; cp -rL "$d" "$R/opt/test/"
  while IFS= read -r -d '' f; do add_libs "$f"; done < <(find "$d" -type f -perm -u+x -print0)
done
{
  for e in "${ENVS[@]}"; do printf 'export %q\n' "$e"; done
  [ "$CMD" = __smoke__ ] || printf '%s\n' "$CMD"
} > "$R/opt/test/.cmd.sh"
[ "$CMD" = __smoke__ ] && : > "$R/opt/test/.smoke"
[ -n "$LINK_ADDR" ] && echo "$LINK_ADDR" > "$R/opt/test/.link"
echo "root:x:0:0:root:/root:/bin/sh" > "$R/etc/passwd"; echo "root:x:0:" > "$R/etc/group"
printf '127.0.0.1 localhost\n192.0.2.1 rxehost\n' > "$R/etc/hosts"

cat > "$R/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/usr/bin:/usr/sbin:/bin:/sbin HOME=/root
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm /root; mount -t devpts devpts /dev/pts; mount -t tmpfs tmp /tmp
mount -t tmpfs shm /dev/shm
fail() { echo "RXE_VM_SETUP_FAILED: $*"; dmesg | tail -15; lsmod; ip link; echo "RXE_VM_EXIT_CODE=125"; poweroff -f; }
for m in crc32_generic rdma_rxe rdma_ucm dummy veth virtio_pci virtio_net; do modprobe $m || fail "modprobe $m"; done
ip link set lo up
if [ -f /opt/test/.link ]; then      # -a: rxe0 on the link to the other machine
  NET=eth0 ADDR=$(cat /opt/test/.link)
  for _ in $(seq 50); do ip link show eth0 >/dev/null 2>&1 && break; sleep 0.1; done
else
  NET=dummy0 ADDR=192.0.2.1/24
  ip link show dummy0 >/dev/null 2>&1 || ip link add dummy0 type dummy
fi
ip addr add $ADDR dev $NET || fail "ip addr add $ADDR dev $NET"; ip link set $NET up
export RXE_IP=${ADDR%/*} RXE_DEV=rxe0
[ -c /dev/ttyS1 ] && { stty -F /dev/ttyS1 raw -echo 2>/dev/null; export RXE_VM_CTL=/dev/ttyS1; }
rdma link add rxe0 type rxe netdev $NET || fail "rdma link add"
# GID index of the IPv4-mapped RoCEv2 GID (::ffff:a.b.c.d) for RXE_IP
for i in 0 1 2 3 4 5 6 7 8; do sleep 0.2; g=$(cat /sys/class/infiniband/rxe0/ports/1/gids/$i 2>/dev/null); t=$(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$i 2>/dev/null)
  case "$g" in 0000:0000:0000:0000:0000:ffff:*) [ "$t" = "RoCE v2" ] && { export RXE_GID_IDX=$i; break; };; esac; done
[ -n "${RXE_GID_IDX:-}" ] || fail "no RoCEv2 IPv4 GID"
ulimit -l unlimited
cd /opt/test
echo; echo "RXE_VM_BEGIN kernel=$(uname -r) uptime=$(cut -d' ' -f1 /proc/uptime) dev=$NET ip=$RXE_IP gid_idx=$RXE_GID_IDX"
if [ ! -f /opt/test/.smoke ]; then sh /opt/test/.cmd.sh; RC=$?
else
  set -x
  rdma link show && ibv_devices && ibv_devinfo -d rxe0 | head -20 || RC=1
  ibv_rc_pingpong -d rxe0 -g $RXE_GID_IDX -n 1000 & SP=$!; sleep 1
  ibv_rc_pingpong -d rxe0 -g $RXE_GID_IDX -n 1000 $RXE_IP; C1=$?; wait $SP; S1=$?
  rping -s -a $RXE_IP -C 10 & SP=$!; sleep 1
  rping -c -a $RXE_IP -C 10 -v -S 64 > /tmp/rping.out; C2=$?; tail -3 /tmp/rping.out; wait $SP; S2=$?
  set +x
  RC=$((C1|S1|C2|S2|${RC:-0}))
fi
echo "RXE_VM_EXIT_CODE=$RC uptime=$(cut -d' ' -f1 /proc/uptime)"
sync; poweroff -f
EOF
chmod +x "$R/init"
(cd "$R" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) > "$WORK/initrd.gz"
INITRD_S=$(since "$T_INITRD")

# ---- 3. boot -------------------------------------------------------------------------------
T_VM=$(now)
LOG=$WORK/console.log
# -cpu max: every instruction-set extension TCG emulates. The default model (qemu64) lacks
# SSE4.2 and more, which binaries built for this host may use (Debian's DPDK, linked into
# snic_server where it is found, stops on an illegal instruction there).
NIC=(-nic none) SERIAL2=()
[ -n "$LINK" ] && NIC=(-netdev "$LINK,id=link0" -device "virtio-net-pci,netdev=link0,mac=52:54:00:c0:00:02")
if [ -n "$CTL" ]; then
  for f in "$CTL.in" "$CTL.out"; do [ -p "$f" ] || mkfifo "$f" || die "cannot make FIFO $f"; done
  SERIAL2=(-serial "pipe:$CTL")
fi
timeout --foreground -k 5 "$TIMEOUT" qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m "$MEM" \
  -smp "$SMP" -nographic -no-reboot "${NIC[@]}" -monitor none -serial stdio "${SERIAL2[@]}" -display none \
  -kernel "$VMLINUZ" -initrd "$WORK/initrd.gz" \
  -append "console=ttyS0 panic=-1 quiet loglevel=3" </dev/null >"$LOG" 2>&1 &
QPID=$!
if [ $VERBOSE = 1 ]; then tail -n +1 -f "$LOG" --pid=$QPID & fi
set +e; wait $QPID; QRC=$?; set -e; QPID=
echo "rxe-vm: initrd ${INITRD_S}s, vm $(since "$T_VM")s, total $(since "$T_ALL")s (kernel $KVER, tcg)" >&2
sleep 0.2
tr -d '\r' < "$LOG" > "$LOG.txt"
if [ $VERBOSE = 0 ]; then sed -n '/RXE_VM_BEGIN/,/^RXE_VM_EXIT_CODE=/p;/RXE_VM_SETUP_FAILED/p' "$LOG.txt"; fi
RC=$(sed -n 's/^RXE_VM_EXIT_CODE=\([0-9]*\).*/\1/p' "$LOG.txt" | tail -1)
if [ -z "$RC" ]; then
  if [ "$QRC" = 124 ] || [ "$QRC" = 137 ]; then
    echo "rxe-vm: VM timed out after ${TIMEOUT}s; console tail:" >&2; tail -20 "$LOG.txt" >&2; exit 124
  fi
  echo "rxe-vm: no exit marker (qemu rc=$QRC); console tail:" >&2; tail -30 "$LOG.txt" >&2; exit 125
fi
exit "$RC"
