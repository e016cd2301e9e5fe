#!/usr/bin/env bash
# The Lynx deployment, emulated across two architectures: the SmartNIC and the GPU host as two
# virtual machines joined by a link, clients on the network outside.
#
#   "BlueField": tests/vm/bluefield-vm.sh, an arm64 machine (qemu-system-aarch64, Debian's stock
#     arm64 kernel, systemd) into whose root mmdebstrap made, apt installed the arm64
#     caracal-server package; systemd starts caracal-server.service. Soft-RoCE (rdma_rxe) on its
#     link NIC stands in for the BlueField's ConnectX.
#   "GPU host": tests/vm/rxe-vm.sh, an x86-64 machine with Soft-RoCE on its link NIC, running the
#     echo agent (CPU handler) with transport rdma: it exports its region, the server reaches it
#     with one-sided RDMA across the link.
#   The link: a QEMU socket netdev (UDP on loopback) between the two VMs, 198.51.100.0/24.
#   Clients: this host, through the BlueField VM's management NIC (QEMU user networking with
#     forwarded ports): sockperf over UDP, caracal_pipeline_client over TCP, nc with bad input.
#
# What it checks: the unit is active as user caracal (Type=notify READY reached); the agent
# registers across the link and its region is reached over rdma; replies are exact; bad input
# is refused and counted; an agent killed with SIGKILL makes its requests fail with an error
# reply (none lost, none wrong) and is re-admitted when it returns; `systemctl restart` of the
# server is followed by the agent registering again by itself.
#
# Emulation on 2 cores is slow: the load is bounded and nothing here is a measurement. QEMU runs
# the arm64 guest with the host's (x86's) memory ordering, so this cannot show how the server
# behaves under Arm's weaker ordering; it shows the wire contract holds across architectures.
#
# Usage: topology.sh BUILD_DIR SOURCE_DIR [ARM64_PACKAGES_DIR]
#   BUILD_DIR: an amd64 build (the echo agent, caracal_pipeline_client);
#   ARM64_PACKAGES_DIR: default $CARACAL_ARM64_PACKAGES or SOURCE_DIR/build-arm64/packages
#   (scripts/cross-arm64.sh makes them). Exit 77 when the packages, QEMU, the kernels or a client
#   tool cannot be had. CARACAL_BLUEFIELD_KEEP=1 keeps the work directory.
set -euo pipefail
BUILD=$(realpath "${1:?build directory}")
SRC=$(realpath "${2:?source directory}")
PKGS=${3:-${CARACAL_ARM64_PACKAGES:-$SRC/build-arm64/packages}}
T_START=$(date +%s)
skip() { echo "SKIP: $*"; exit 77; }
for t in qemu-system-aarch64 qemu-system-x86_64 mmdebstrap ssh ssh-keygen sockperf curl nc python3; do
  command -v $t >/dev/null || skip "$t is not installed (scripts/deps.sh test installs it)"
done
DEB=$(ls "$PKGS"/caracal-server_*_arm64.deb 2>/dev/null | tail -1) || true
[ -n "$DEB" ] || skip "no arm64 caracal-server package in $PKGS (scripts/cross-arm64.sh makes it)"
AGENT_BIN=$BUILD/examples/echo/caracal_echo_agent
PIPELINE=$BUILD/tests/e2e/caracal_pipeline_client
for f in "$AGENT_BIN" "$PIPELINE"; do [ -x "$f" ] || skip "$f is not built"; done

W=$(mktemp -d "${TMPDIR:-/tmp}/caracal-bluefield.XXXXXX")
BF_PID='' GPU_PID=''
elapsed() { echo "$(($(date +%s) - T_START)) s"; }
say() { echo "[$(elapsed)] $*"; }
cleanup() {
  local rc=$?
  set +e
  if [ -n "$GPU_PID" ]; then
    timeout 2 sh -c "echo quit >'$W/ctl.in'" 2>/dev/null
    sleep 2; kill "$GPU_PID" 2>/dev/null
  fi
  [ -n "$BF_PID" ] && kill "$BF_PID" 2>/dev/null
  wait 2>/dev/null
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
    echo "===== BlueField VM console (last 40 lines)"; tail -40 "$W/bf-console.log" 2>/dev/null | tr -d '\r'
    echo "===== GPU host VM (last 30 lines)"; tail -30 "$W/gpu.log" 2>/dev/null
    [ -s "$W/journal.txt" ] && { echo "===== caracal-server's journal"; tail -40 "$W/journal.txt"; }
  fi
  [ -n "${CARACAL_BLUEFIELD_KEEP:-}" ] && echo "kept $W" || rm -rf "$W"
  exit "$rc"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

# Free loopback ports: the link's two UDP ends and what the management NIC forwards.
read -r P_LINK_BF P_LINK_GPU P_SSH P_UDP P_LP P_LINE P_METRICS < <(python3 - <<'EOF'
import socket
socks = []
for kind in [socket.SOCK_DGRAM] * 2 + [socket.SOCK_STREAM] + [socket.SOCK_DGRAM] + [socket.SOCK_STREAM] * 3:
    s = socket.socket(socket.AF_INET, kind); s.bind(("127.0.0.1", 0)); socks.append(s)
print(*[s.getsockname()[1] for s in socks])
EOF
)

# ---- 1. the BlueField's root: the arm64 package installed with apt, then provisioned --------
say "making the BlueField root with $(basename "$DEB")"
rc=0
"$SRC/tests/vm/bluefield-vm.sh" image "$W/bf" "$DEB" || rc=$?
[ "$rc" -eq 0 ] || { [ "$rc" -eq 77 ] && skip "the arm64 root cannot be made here"; fail "bluefield-vm.sh image exited $rc"; }
R=$W/bf/root
# The operator's changes to the packaged configuration: agents register on the link's address;
# the metrics endpoint is reachable from the management network.
# Both machines are emulated and share two cores: connecting to a region (rdma_cm's address
# and route resolution, the queue pair's handshake) takes seconds, not the 2 s allowed by default.
sed -i 's/listen: 127.0.0.1:7100/listen: 198.51.100.1:7100/; s/listen: 127.0.0.1:9100/listen: 0.0.0.0:9100/
        s/^\(  *\)agent_timeout_ms: .*/&\n\1rdma_connect_timeout_ms: 20000/' "$R/etc/caracal/server.yaml"
grep -q 'listen: 198.51.100.1:7100' "$R/etc/caracal/server.yaml" && grep -q rdma_connect_timeout_ms "$R/etc/caracal/server.yaml" ||
  fail "the packaged server.yaml has no control listen or agent_timeout_ms line to change"
mkdir -p "$R/etc/systemd/network"
printf '[Match]\nMACAddress=52:54:00:b1:00:01\n[Network]\nAddress=10.0.2.15/24\nGateway=10.0.2.2\n' \
  >"$R/etc/systemd/network/10-management.network"
printf '[Match]\nMACAddress=52:54:00:b1:00:02\n[Network]\nAddress=198.51.100.1/24\n' \
  >"$R/etc/systemd/network/20-gpu-link.network"
# Soft-RoCE on the link NIC, before the server starts: what the ConnectX gives a real BlueField.
cat >"$R/etc/systemd/system/soft-roce.service" <<'EOF'
[Unit]
Description=Soft-RoCE on the link to the GPU host (a BlueField has its ConnectX instead)
Wants=network-online.target
After=network-online.target
Before=caracal-server.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'rdma link add rxe0 type rxe netdev $(basename $(dirname $(grep -l 52:54:00:b1:00:02 /sys/class/net/*/address)))'
[Install]
WantedBy=multi-user.target
EOF
chroot "$R" systemctl enable -q systemd-networkd systemd-networkd-wait-online soft-roce 2>/dev/null ||
  fail "systemctl enable in the BlueField root failed"
ssh-keygen -q -t ed25519 -N '' -f "$W/key"
install -d -m 0700 "$R/root/.ssh"; cp "$W/key.pub" "$R/root/.ssh/authorized_keys"
# The agent presents the secret the package generated, copied to the GPU host as deploy/README
# says (mode 0600 there).
install -m 0600 "$R/etc/caracal/secret" "$W/secret"
cat >"$W/agent.yaml" <<'EOF'
agent: gpu-host-1
server: 198.51.100.1:7100
secret_file: /opt/test/secret
accelerator: cpu
transport: rdma
rdma: { bind_address: 198.51.100.2 }
reconnect_interval_ms: 500
services:
  - { name: echo, queues: 2, ring_capacity: 256, slot_bytes: 256, max_message_bytes: 1024 }
EOF

# ---- 2. both machines up, joined by the link ------------------------------------------------
say "booting the BlueField (arm64) and the GPU host (x86-64)"
"$SRC/tests/vm/bluefield-vm.sh" boot "$W/bf" \
  -netdev "user,id=mgmt,net=10.0.2.0/24,hostfwd=tcp:127.0.0.1:$P_SSH-:22,hostfwd=udp:127.0.0.1:$P_UDP-:7000,hostfwd=tcp:127.0.0.1:$P_LP-:7001,hostfwd=tcp:127.0.0.1:$P_LINE-:7002,hostfwd=tcp:127.0.0.1:$P_METRICS-:9100" \
  -device virtio-net-pci,netdev=mgmt,mac=52:54:00:b1:00:01 \
  -netdev "socket,id=link,udp=127.0.0.1:$P_LINK_GPU,localaddr=127.0.0.1:$P_LINK_BF" \
  -device virtio-net-pci,netdev=link,mac=52:54:00:b1:00:02 >"$W/bf-console.log" 2>&1 &
BF_PID=$!
mkfifo "$W/ctl.in" "$W/ctl.out"   # the control channel's ends; rxe-vm.sh -c joins them to ttyS1
"$SRC/tests/vm/rxe-vm.sh" -t 1500 -m 768 -s 1 \
  -l "socket,udp=127.0.0.1:$P_LINK_BF,localaddr=127.0.0.1:$P_LINK_GPU" -a 198.51.100.2/24 \
  -c "$W/ctl" -f "$AGENT_BIN" -f "$SRC/tests/bluefield/agent_vm.sh" -f "$W/agent.yaml" -f "$W/secret" \
  -- 'sh agent_vm.sh' >"$W/gpu.log" 2>&1 &
GPU_PID=$!
exec 4<>"$W/ctl.out"
# gpu CMD: one command to the GPU host's agent_vm.sh, its one-line answer printed.
gpu() {
  local line
  echo "$1" >"$W/ctl.in"
  read -r -t "${2:-60}" line <&4 || fail "the GPU host did not answer '$1'"
  echo "$line"
}
read -r -t 600 line <&4 || fail "the GPU host VM did not come up"
say "GPU host: $line"

SSH=(ssh -q -i "$W/key" -p "$P_SSH" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null
  -o ConnectTimeout=20 -o BatchMode=yes root@127.0.0.1)
bf() { "${SSH[@]}" "$@"; }
for i in $(seq 120); do
  bf true 2>/dev/null && break
  kill -0 "$BF_PID" 2>/dev/null || fail "the BlueField VM exited"
  [ "$i" -lt 120 ] || fail "no ssh to the BlueField VM after 10 minutes"
  sleep 5
done
say "BlueField: $(bf 'uname -srm; . /etc/os-release; echo $PRETTY_NAME' | tr '\n' ' ')"
bf 'systemctl is-system-running --wait' >/dev/null 2>&1 || true
state=$(bf systemctl show -p ActiveState,SubState,Type,User,NRestarts caracal-server | tr '\n' ' ')
say "caracal-server.service: $state"
grep -q "ActiveState=active" <<<"$state" && grep -q "Type=notify" <<<"$state" ||
  fail "caracal-server.service is not active: $state"
user=$(bf 'ps -o user= -p $(systemctl show -p MainPID --value caracal-server)')
[ "$user" = caracal ] || fail "snic_server runs as '$user', not caracal"
say "installed: $(bf dpkg-query -W -f='\${Package}\ \${Version}\ \${Architecture}' caracal-server); $(bf rdma link show | head -1)"

# metric PATTERN: the sum of the series matching PATTERN (0 when none does yet).
metric() {
  curl -sf -m 10 "http://127.0.0.1:$P_METRICS/metrics" | awk -v re="^$1" '$0 ~ re {s += $NF} END {print s + 0}'
}
journal() { bf journalctl -u caracal-server --no-pager -o cat >"$W/journal.txt" 2>&1 || true; }
# wait_attached N SECS: the journal has said N times, since the unit last started, that the
# agent's region is attached (registered, reached over rdma, its queues in service).
wait_attached() {
  for _ in $(seq "$2"); do
    journal
    [ "$(awk '/Started caracal-server.service/ {n = 0} /region for service .echo. attached/ {n++}
              END {print n + 0}' "$W/journal.txt")" -ge "$1" ] && return 0
    sleep 1
  done
  fail "the agent's region was not attached $1 time(s) within $2 s"
}

# ---- 3. the agent registers across the link; its region is reached over rdma ----------------
say "GPU host: $(gpu start)"
wait_attached 1 180
grep -Eq "connecting to rdma 198\.51\.100\.2:" "$W/journal.txt" || fail "the server did not reach the region over rdma"
grep -E "registered|connecting to rdma|attached" "$W/journal.txt" | sed 's/^/journal: /'
say "agent registered; region reached over rdma and attached"

# ---- 4. clients, bounded ------------------------------------------------------------------
reply=$(echo "from-the-network" | timeout 30 nc -q 5 127.0.0.1 "$P_LINE" || true)
[ "$reply" = from-the-network ] || fail "line echo got '$reply'"
"$PIPELINE" --connect "127.0.0.1:$P_LP" --connections 4 --requests 100 --pipeline 8 \
  --max-bytes 512 --timeout-s 120 || fail "caracal_pipeline_client (length-prefixed) exited $?"
"$PIPELINE" --connect "127.0.0.1:$P_LINE" --framing line --connections 2 --requests 50 --pipeline 4 \
  --max-bytes 200 --timeout-s 120 || fail "caracal_pipeline_client (line) exited $?"
sockperf ping-pong -i 127.0.0.1 -p "$P_UDP" -m 64 -t 5 --mps 100 >"$W/sockperf.out" 2>&1 ||
  fail "sockperf exited $?: $(tail -3 "$W/sockperf.out")"
grep -q "Summary: Latency is" "$W/sockperf.out" || fail "sockperf reported no latency: $(tail -5 "$W/sockperf.out")"
grep -Eq "# dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0" "$W/sockperf.out" ||
  fail "sockperf saw drops, duplicates or reordering: $(grep dropped "$W/sockperf.out")"
say "sockperf UDP: $(grep -E 'Summary: Latency is' "$W/sockperf.out" | sed 's/.*Summary: //')"

# Bad input: an oversize length prefix and an oversize datagram are refused and counted; the
# server names what was wrong in its journal; good requests keep being served.
printf '\x00\x10\x00\x00' | timeout 20 nc -q 5 127.0.0.1 "$P_LP" >"$W/oversize.out" || true
[ ! -s "$W/oversize.out" ] || fail "an oversize request got a reply"
drops_before=$(metric 'caracal_listener_drops_total.*reason="oversize"')
head -c 1500 /dev/zero | timeout 5 nc -u -w 1 127.0.0.1 "$P_UDP" >/dev/null || true
for _ in $(seq 20); do
  [ "$(metric 'caracal_listener_drops_total.*reason="oversize"')" -gt "$drops_before" ] && break; sleep 1
done
[ "$(metric 'caracal_listener_drops_total.*reason="oversize"')" -gt "$drops_before" ] ||
  fail "the oversize datagram was not counted"
journal
grep -q "closing the connection from .*over max_message_bytes" "$W/journal.txt" || fail "the journal does not say why the oversize request was refused"
say "bad input: $(grep -m1 'closing the connection' "$W/journal.txt" | cut -c1-150)"

# ---- 5. the agent killed and back: errors, not silence; then re-admitted ---------------------
# One request every 50 ms on a line connection while the agent is killed and restarted: every
# request gets its own answer, the echo or an error reply; both are seen, and echoes again at
# the end.
python3 - "$P_LINE" "$W/ctl.in" >"$W/kill.out" 2>&1 <<'EOF' &
import socket, sys, time
port, ctl = int(sys.argv[1]), sys.argv[2]
s = socket.create_connection(("127.0.0.1", port), timeout=30)
f = s.makefile("rb")
seq = []
start = time.time()
i = 0
while time.time() - start < 90:
    i += 1
    msg = f"seq-{i}"
    s.sendall(msg.encode() + b"\n")
    line = f.readline().decode().rstrip("\n")
    seq.append("echo" if line == msg else "error" if line.startswith("ERROR ") else f"wrong:{line!r}")
    if seq[-1].startswith("wrong"):
        print("WRONG", msg, line); sys.exit(1)
    if len(seq) > 40 and seq[-40:].count("echo") == 40 and "error" in seq:
        break
    time.sleep(0.05)
kinds = []
for k in seq:
    if not kinds or kinds[-1][0] != k: kinds.append([k, 0])
    kinds[-1][1] += 1
print("SEQUENCE", " ".join(f"{k}x{n}" for k, n in kinds))
ok = [k for k, _ in kinds] == ["echo", "error", "echo"]
sys.exit(0 if ok else 2)
EOF
CLIENT=$!
sleep 5
say "GPU host: $(gpu kill)"
for _ in $(seq 60); do [ "$(metric 'caracal_agents ')" = 0 ] && break; sleep 1; done
sleep 3
say "GPU host: $(gpu start)"
wait_attached 2 180
rc=0; wait "$CLIENT" || rc=$?
cat "$W/kill.out"
[ "$rc" -eq 0 ] || fail "requests across the agent's kill and return: exit $rc (want echo, then error replies, then echo)"
journal
grep -E "agent 'gpu-host-1'" "$W/journal.txt" | tail -4 | sed 's/^/journal: /'

# ---- 6. the server restarted by systemd: the agent registers again by itself ----------------
bf systemctl restart caracal-server
wait_attached 1 180
reply=$(echo "after-restart" | timeout 30 nc -q 5 127.0.0.1 "$P_LINE" || true)
[ "$reply" = after-restart ] || fail "after the server's restart the line echo got '$reply'"
say "server restarted by systemd; the agent registered again by itself"
gpu quit >/dev/null || true
say "PASS: BlueField (arm64, systemd, apt) and GPU host (x86-64) over rdma"
