#!/usr/bin/env bash
# bluefield-vm.sh - an arm64 machine standing in for a BlueField's Arm cores: Debian's stock
# arm64 kernel, booted by qemu-system-aarch64 (emulated), on a root filesystem made with
# mmdebstrap into which .deb packages are installed with apt; systemd is its init.
#
#   bluefield-vm.sh image DIR DEB...        DIR/root (the packages installed by apt, their
#                                           maintainer scripts run), DIR/vmlinuz, DIR/initrd.img
#   bluefield-vm.sh boot DIR [QEMU-ARG...]  packs DIR/root into DIR/root.img and boots it in the
#                                           foreground (console on stdout); QEMU-ARGs add the NICs
#
# Between the two, the caller may change DIR/root (configuration, units), as an operator's
# provisioning would. The machine: `virt`, Cortex-A72 (BlueField-2's core), 2 CPUs, 1 GiB,
# a virtio disk and a virtio RNG; kernel command line `net.ifnames=0` (NICs are eth0, eth1, ...
# in the order of the QEMU-ARGs).
#
# The base root (minbase, systemd, udev, iproute2, openssh-server, the stock kernel, the rdma
# tools and every package the DEBs depend on) is made once and cached under
# ${CARACAL_VM_CACHE:-~/.cache/caracal}/bluefield-vm, keyed by the fixed part of that list; a run copies
# it and installs the DEBs into the copy. Making it takes minutes (every maintainer script runs
# under qemu-user); a run from the cache takes seconds. Its initramfs holds only what mounting
# the virtio disk needs (MODULES=list): initramfs-tools' default, MODULES=most, runs modinfo on
# every module of the kernel, which takes many minutes under qemu-user.
#
# Needs root (mmdebstrap --mode=root, chroot, file ownership in the image), mmdebstrap,
# qemu-user-static with binfmt (the arm64 chroot), qemu-system-arm, e2fsprogs. Exit 77 when one
# is missing or this host cannot fetch Debian's arm64 packages.
set -euo pipefail
CACHE=${CARACAL_VM_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/caracal}/bluefield-vm
SUITE=${CARACAL_VM_SUITE:-bookworm}
skip() { echo "bluefield-vm: $* (skipping)" >&2; exit 77; }
die() { echo "bluefield-vm: $*" >&2; exit 125; }
now() { date +%s; }

# Packages of the base root besides the DEBs' dependencies: an init, the network and the
# operator's tools, and the kernel with its initramfs.
BASE_PACKAGES=(systemd systemd-sysv udev kmod iproute2 openssh-server linux-image-arm64
  ibverbs-utils rdmacm-utils)

# The Depends of every DEB that are not among the DEBs themselves: names only (versions and
# alternatives after the first dropped), sorted, one line.
depends_of() {
  local own=() d
  for d in "$@"; do own+=("$(dpkg-deb -f "$d" Package)"); done
  for d in "$@"; do dpkg-deb -f "$d" Depends; done | tr ',' '\n' |
    sed -E 's/\|.*//; s/\(.*\)//; s/[[:space:]]//g' | grep -v '^$' |
    grep -vxF -f <(printf '%s\n' "${own[@]}") | sort -u | tr '\n' ' '
}

image() {
  local dir=$1; shift
  [ $# -gt 0 ] || die "image: no .deb given"
  local d
  for d in "$@"; do [ -f "$d" ] || die "no such package: $d"; done
  [ "$(id -u)" -eq 0 ] || skip "needs root (mmdebstrap --mode=root, chroot)"
  for t in mmdebstrap mke2fs dpkg-deb chroot; do command -v $t >/dev/null || skip "missing $t"; done
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || skip "no binfmt for arm64 (qemu-user-static)"
  local pkgs key base
  pkgs="${BASE_PACKAGES[*]} $(depends_of "$@")"
  # Keyed by the suite and the fixed list only: the DEBs' dependencies are installed into the
  # base when it is made (so that a run need not fetch them), and a run fetches any that a newer
  # DEB adds, rather than making the base again.
  key=$(printf '%s %s\n' "$SUITE" "${BASE_PACKAGES[*]}" | sha256sum | cut -c1-16)
  base=$CACHE/base-$key
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.lock"; flock 9
  if [ ! -f "$base/.ok" ]; then
    local t0; t0=$(now)
    rm -rf "$CACHE"/base-*    # one base at a time: a changed list replaces the old one
    mkdir -p "$base"
    echo "bluefield-vm: making the arm64 base root ($SUITE): $pkgs" >&2
    # Every dpkg and maintainer script runs under qemu-user, so what they need not do is cut:
    # no fsync per file (the root is copied before use), no manual pages, documentation or
    # translations, and one initramfs instead of two (the trigger's second run, after the
    # kernel's postinst made one, is turned off; force-confold keeps that setting over the
    # package's conffile). The dpkg settings are removed at the end, so that the DEBs install
    # as they would on any Debian machine.
    mmdebstrap --architectures=arm64 --variant=minbase --mode=root \
      --include="$(echo "$pkgs" | tr ' ' ',' | sed 's/,*$//')" \
      --dpkgopt=force-unsafe-io --dpkgopt=force-confold \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
      --essential-hook='mkdir -p "$1/etc/initramfs-tools/conf.d" "$1/usr/share/initramfs-tools/modules.d"' \
      --essential-hook='echo update_initramfs=no >"$1/etc/initramfs-tools/update-initramfs.conf"' \
      --essential-hook='echo MODULES=list >"$1/etc/initramfs-tools/conf.d/caracal-vm.conf"' \
      --essential-hook='printf "%s\n" virtio_pci virtio_blk crc32c_generic ext4 >"$1/usr/share/initramfs-tools/modules.d/caracal-vm"' \
      --customize-hook='echo update_initramfs=yes >"$1/etc/initramfs-tools/update-initramfs.conf"' \
      --customize-hook='rm -f "$1/etc/dpkg/dpkg.cfg.d/99mmdebstrap"' \
      --customize-hook='echo bluefield >"$1/etc/hostname"' \
      --customize-hook='rm -f "$1"/etc/ssh/ssh_host_*' \
      "$SUITE" "$base/root" >"$CACHE/base.log" 2>&1 ||
      { tail -20 "$CACHE/base.log" >&2
        grep -Eq "Failed to fetch|Could not resolve|Temporary failure|Unable to locate package" "$CACHE/base.log" &&
          skip "Debian's arm64 packages cannot be fetched (log: $CACHE/base.log)"
        die "mmdebstrap of the arm64 root failed (log: $CACHE/base.log)"; }
    touch "$base/.ok"
    echo "bluefield-vm: base root made in $(($(now) - t0)) s ($(du -sh "$base/root" | cut -f1))" >&2
  fi
  flock -u 9
  local t0; t0=$(now)
  rm -rf "$dir"; mkdir -p "$dir"
  cp -a "$base/root" "$dir/root"
  local r=$dir/root
  # apt installs the DEBs (their dependencies are in the base); no service starts in a chroot.
  mkdir -p "$r/tmp/debs"; cp "$@" "$r/tmp/debs/"
  printf '#!/bin/sh\nexit 101\n' >"$r/usr/sbin/policy-rc.d"; chmod +x "$r/usr/sbin/policy-rc.d"
  mount -t proc proc "$r/proc"
  local rc=0
  chroot "$r" env DEBIAN_FRONTEND=noninteractive sh -c \
    'apt-get install -y -q /tmp/debs/*.deb || { apt-get update -q && apt-get install -y -q /tmp/debs/*.deb; }' \
    >"$dir/apt.log" 2>&1 || rc=$?
  chroot "$r" ssh-keygen -A >/dev/null 2>&1 || rc=$?   # this image's own host keys
  umount "$r/proc"
  rm -rf "$r/usr/sbin/policy-rc.d" "$r/tmp/debs"
  [ "$rc" -eq 0 ] || { tail -20 "$dir/apt.log" >&2; die "apt could not install $* into the arm64 root"; }
  cp "$(ls "$r"/boot/vmlinuz-* | tail -1)" "$dir/vmlinuz"
  cp "$(ls "$r"/boot/initrd.img-* | tail -1)" "$dir/initrd.img"
  echo "bluefield-vm: $(basename -a "$@" | tr '\n' ' ')installed with apt into $dir/root in $(($(now) - t0)) s" >&2
}

boot() {
  local dir=$1; shift
  command -v qemu-system-aarch64 >/dev/null || skip "missing qemu-system-aarch64 (qemu-system-arm)"
  [ -d "$dir/root" ] && [ -f "$dir/vmlinuz" ] || die "boot: $dir has no image (run: $0 image $dir DEB...)"
  local mb
  mb=$(du -sm "$dir/root" | cut -f1)
  rm -f "$dir/root.img"
  mke2fs -q -t ext4 -L root -d "$dir/root" "$dir/root.img" "$((mb * 3 / 2 + 256))M" ||
    die "mke2fs -d $dir/root failed"
  # -cpu cortex-a72: the cores of a BlueField-2; emulated (TCG), no KVM for arm64 here.
  exec qemu-system-aarch64 -M virt -cpu cortex-a72 -smp 2 -m 1024 -accel tcg,thread=multi \
    -nographic -no-reboot -monitor none -serial stdio \
    -kernel "$dir/vmlinuz" -initrd "$dir/initrd.img" \
    -append "root=/dev/vda rw console=ttyAMA0 net.ifnames=0 panic=-1" \
    -drive "if=none,id=disk,file=$dir/root.img,format=raw" -device virtio-blk-pci,drive=disk \
    -device virtio-rng-pci "$@" </dev/null
}

case ${1:-} in
  image) shift; [ $# -ge 2 ] || die "usage: $0 image DIR DEB..."; image "$@";;
  boot) shift; [ $# -ge 1 ] || die "usage: $0 boot DIR [QEMU-ARG...]"; boot "$@";;
  *) sed -n '2,25p' "$0"; exit 2;;
esac
