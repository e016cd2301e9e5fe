#!/usr/bin/env bash
# Malformed frames against snic_server's DPDK port (net_af_packet on a veth pair, or net_tap,
# as DPDK_PMD says): bad IPv4 and
# UDP lengths, bad checksums, truncated headers, fragments, frames for another address or
# protocol, a datagram to a port nobody serves and one over max_message_bytes, sent from the
# kernel side through a raw packet socket (frames.py). Each is dropped and counted under
# its reason, nothing answers them, good frames between them (IPv4 options, no UDP checksum)
# are answered, sockperf works afterwards, and every mbuf is back in the pool.
#
# Fragments: net_tap hands them to the port, which drops and counts each. net_af_packet's
# sockets form a PACKET_FANOUT group with PACKET_FANOUT_FLAG_DEFRAG, so the kernel reassembles
# fragments before the port sees them: a whole fragmented datagram arrives reassembled and is
# answered, and lone fragments never arrive.
source "$(dirname "$0")/lib.sh"
FRAMES="$(dirname "$0")/frames.py"

start_server "io_threads: 1
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
$(dpdk_section 1)
services:
  - name: echo
    max_message_bytes: 1024
    listeners:
      - { protocol: udp, kind: dpdk, listen: $DPDK_IP:7000, error_reply: 'ERR {reason}' }"
dpdk_link_up
start_agent echo-1 "$ECHO_AGENT" "  - { name: echo, queues: 1, ring_capacity: 64, slot_bytes: 2048, max_message_bytes: 1024 }"
MAC=$(dpdk_mac)
[ -n "$MAC" ] || fail "no MAC in the server's log"
baseline=$(metric 'caracal_dpdk_mbufs_available')
drops() { metric "caracal_dpdk_drops_total\{port=\"$DPDK_PORT_NAME\",reason=\"$1\""; }
declare -A before
for r in truncated bad_length bad_checksum fragment not_for_us other_protocol no_listener; do
  before[$r]=$(drops "$r")
done

if [ "$DPDK_PMD" = tap ]; then
  pair=fragment_pair fragments=4
else
  pair=fragment_pair_reassembled fragments=0
fi
python3 "$FRAMES" "$KERNEL_IFACE" "$MAC" "$KERNEL_IP" "$DPDK_IP" 7000 \
  good bad_ip_total_length bad_ihl bad_version udp_length_too_long udp_length_too_short \
  bad_ip_checksum bad_udp_checksum truncated_ip truncated_udp ethernet_only \
  fragment_first fragment_later $pair good not_our_ip not_our_mac arp_other_ip no_listener icmp ipv6 \
  ip_options no_udp_checksum oversize good || fail "frames.py: an answer was missing or wrong"

# Exact counts where only this test sends such frames; at least for the reasons that the
# kernel's own traffic (IPv6 neighbour discovery, multicast) also feeds.
expect() {
  local reason=$1 op=$2 n=$3 got
  got=$(($(drops "$reason") - ${before[$reason]}))
  echo "drops $reason: $got"
  # `test`, not `[ ]`: shellcheck cannot parse a [ ] whose operator is in a variable.
  test "$got" "$op" "$n" || fail "$reason: counted $got, expected $op $n"
}
expect bad_length -eq 5
expect bad_checksum -eq 2
expect truncated -eq 3
expect fragment -eq "$fragments"
expect no_listener -eq 1
expect not_for_us -ge 3
expect other_protocol -ge 2
oversize=$(metric 'caracal_listener_drops_total\{.*reason="oversize"')
[ "$oversize" -eq 1 ] || fail "oversize: counted $oversize, expected 1"
echo "listener oversize drops: $oversize"
requests=$(metric 'caracal_listener_requests_total')
want=$((fragments == 0 ? 7 : 6))  # 5 good, 1 oversize, and the reassembled datagram
[ "$requests" -eq "$want" ] || fail "the listener counted $requests requests, expected $want"

sockperf ping-pong -i "$DPDK_IP" -p 7000 -m 64 -t 1 >"$WORK/pp.out" 2>&1 || fail "sockperf ping-pong exited $?"
pingpong_ok "$WORK/pp.out" "ping-pong after the malformed frames"
mbufs_settle "$baseline"
echo "mbufs available: $baseline before and after"
echo "PASS"
