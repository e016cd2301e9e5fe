# shellcheck shell=bash
# Shared by the DPDK end-to-end tests (sourced instead of ../e2e/lib.sh, which it sources): the test runs inside a
# network namespace of its own, where snic_server's DPDK port sits on one side of a link and the
# kernel (sockperf, python, curl, the agent's control connection) on the other:
#
#   af_packet: veth pair vdpdk (DPDK, net_af_packet) <-> vkern 192.0.2.1/24 (kernel)
#   tap:       net_tap creates dtap0 in the namespace; the kernel side gets 192.0.2.1/24
#
# The DPDK port is 192.0.2.2. The script re-runs itself inside the namespace (so lib.sh's
# cleanup, the server and the agents all live there) and deletes the namespace afterwards.
# Skips (77) when not root, when namespaces or veth cannot be made, when a tool is missing, or
# when snic_server was built without DPDK.
#
# EAL memory: hugepages when at least 256 MiB of 2 MiB pages are free and hugetlbfs is mounted,
# else --no-huge -m 256. The lcores float over every CPU (--lcores N@(0-last)), because CI
# machines have few cores and the main lcore is the server's main thread.
set -euo pipefail

DPDK_IP=192.0.2.2
KERNEL_IP=192.0.2.1
DPDK_PMD=${DPDK_PMD:-af_packet}  # af_packet or tap; CTest sets it per test
# shellcheck disable=SC2034 # KERNEL_IFACE and DPDK_PORT_NAME are read by the test scripts
case "$DPDK_PMD" in
  af_packet) KERNEL_IFACE=vkern DPDK_PORT_NAME=net_af_packet0 ;;
  tap) KERNEL_IFACE=dtap0 DPDK_PORT_NAME=net_tap0 ;;
  *) echo "FAIL: DPDK_PMD '$DPDK_PMD' is not af_packet or tap"; exit 1 ;;
esac

if [ -z "${CARACAL_DPDK_NETNS:-}" ]; then
  skip() {
    echo "SKIP: $*"
    exit 77
  }
  [ "$(id -u)" -eq 0 ] || skip "the DPDK tests need root (network namespaces, raw sockets)"
  for tool in ip ethtool sockperf curl python3; do
    command -v "$tool" >/dev/null 2>&1 || skip "$tool is not installed (scripts/deps.sh test installs it)"
  done
  server_bin="${1:?build directory}/snic_server/snic_server"
  probe=$(mktemp)
  printf '%s\n' "control: { listen: 127.0.0.1:0, secret: 0123456789abcdef0123 }" \
    "dpdk: { ipv4: $DPDK_IP }" \
    "services: [ { name: s, max_message_bytes: 8, listeners: [ { protocol: udp, kind: dpdk, listen: $DPDK_IP:9 } ] } ]" \
    >"$probe"
  if ! "$server_bin" --config "$probe" --check-config >"$probe.out" 2>&1; then
    grep -q "built without DPDK" "$probe.out" && skip "snic_server was built without DPDK"
    cat "$probe.out"
    rm -f "$probe" "$probe.out"
    echo "FAIL: snic_server refused a minimal dpdk config"
    exit 1
  fi
  rm -f "$probe" "$probe.out"
  ns="caracal-dpdk-$$"
  ip netns add "$ns" 2>/dev/null || skip "cannot create a network namespace"
  rc=0
  ip -n "$ns" link set lo up
  if [ "$DPDK_PMD" = af_packet ]; then
    if ! ip -n "$ns" link add vdpdk type veth peer name vkern; then
      ip netns del "$ns"
      skip "cannot create a veth pair"
    fi
    ip -n "$ns" link set vdpdk up
    ip -n "$ns" addr add "$KERNEL_IP/24" dev vkern
    ip -n "$ns" link set vkern up
    # veth hands the kernel's datagrams over with the UDP checksum left to the (absent)
    # hardware; af_packet passes them on as they are, so the port would count them bad.
    ip netns exec "$ns" ethtool -K vkern tx off >/dev/null
  fi
  CARACAL_DPDK_NETNS="$ns" ip netns exec "$ns" bash "$0" "$@" || rc=$?
  ip netns del "$ns" 2>/dev/null || true
  exit "$rc"
fi

source "$(dirname "${BASH_SOURCE[0]}")/../e2e/lib.sh"

# dpdk_eal_memory: the EAL memory arguments, as a YAML flow list's items.
dpdk_eal_memory() {
  local free size
  free=$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)
  size=$(awk '/Hugepagesize/ {print $2}' /proc/meminfo)
  if [ "${free:-0}" -gt 0 ] && [ $((free * size)) -ge $((256 * 1024)) ] && grep -q hugetlbfs /proc/mounts; then
    echo '--in-memory, -m, "256"'
  else
    echo '--no-huge, -m, "256"'
  fi
}

# dpdk_section QUEUES [EXTRA_KEYS]: the server's dpdk: section for DPDK_PMD with one worker
# lcore per queue, all lcores floating over every CPU.
dpdk_section() {
  local queues=$1 extra=${2:-} last lcores i vdev
  if [ "$DPDK_PMD" = af_packet ]; then
    vdev="net_af_packet0,iface=vdpdk,qpairs=$queues"
  else
    vdev="net_tap0,iface=dtap0"
  fi
  last=$(($(nproc) - 1))
  lcores="0@(0-$last)"
  for i in $(seq 1 "$queues"); do lcores="$lcores,$i@(0-$last)"; done
  cat <<YAML
dpdk:
  eal_args: [$(dpdk_eal_memory), --file-prefix=$CARACAL_DPDK_NETNS, "--lcores=$lcores", "--vdev=$vdev"]
  ipv4: $DPDK_IP
  queues: $queues
  mbufs: 8191
  rx_descriptors: 512
  tx_descriptors: 512
  idle_sleep_us: ${DPDK_IDLE_SLEEP_US:-10}
$extra
YAML
}

# dpdk_link_up: after start_server, the kernel's side of a tap gets its address (the tap PMD
# creates dtap0 when the port starts).
dpdk_link_up() {
  if [ "$DPDK_PMD" = tap ]; then
    ip addr add "$KERNEL_IP/24" dev dtap0
    ip link set dtap0 up
  fi
}

# dpdk_mac: the port's MAC, from the server's log line about the port.
dpdk_mac() {
  sed -nE "s/.*dpdk port .* $DPDK_IP ([0-9A-Fa-f:]{17}) mtu.*/\1/p" "$WORK/server.log" | head -1
}


# mbufs_settle BASELINE: waits until the pool has BASELINE mbufs available again.
mbufs_settle() {
  local want=$1 now=""
  for _ in $(seq 50); do
    now=$(metric 'caracal_dpdk_mbufs_available')
    [ "$now" -eq "$want" ] && return 0
    sleep 0.1
  done
  fail "the mbuf pool has $now mbufs available, $want before: mbufs were not returned"
}
