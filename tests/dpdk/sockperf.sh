#!/usr/bin/env bash
# snic_server's DPDK port serving the echo agent on the CPU, on net_af_packet (a veth pair in a
# namespace) with two queue pairs (af_packet's qpairs, a PACKET_FANOUT group), or on net_tap
# with one (DPDK_PMD says which): sockperf UDP
# ping-pong from the kernel side with nothing lost, duplicated or reordered, then throughput;
# no service errors, and every mbuf back in the pool afterwards.
source "$(dirname "$0")/lib.sh"
queues=$([ "$DPDK_PMD" = af_packet ] && echo 2 || echo 1)

start_server "io_threads: 1
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
$(dpdk_section "$queues")
services:
  - name: echo
    max_message_bytes: 1024
    listeners:
      - { protocol: udp, kind: dpdk, listen: $DPDK_IP:7000 }
      - { protocol: udp, kind: dpdk, listen: 0.0.0.0:7001 }"
grep -E "dpdk port" "$WORK/server.log"
grep -q "listening on dpdk/$DPDK_IP:7000 (port 7000)" "$WORK/server.log" || fail "no dpdk listener in the log"
dpdk_link_up
start_agent echo-1 "$ECHO_AGENT" "  - { name: echo, queues: 2, ring_capacity: 256, slot_bytes: 256, max_message_bytes: 1024 }"
baseline=$(metric 'caracal_dpdk_mbufs_available')

# Two listeners share the port: each answers from its own UDP port.
python3 - "$DPDK_IP" <<'PY' || fail "a dpdk listener answered wrongly"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
for port in (7000, 7001, 7000):
    s.sendto(b"to %d" % port, (sys.argv[1], port))
    data, frm = s.recvfrom(2048)
    assert data == b"to %d" % port and frm == (sys.argv[1], port), (data, frm)
    print("listener %d answered %r from %s:%d" % (port, data, *frm))
PY

sockperf ping-pong -i "$DPDK_IP" -p 7000 -m 64 -t 3 >"$WORK/pp.out" 2>&1 || fail "sockperf ping-pong exited $?"
pingpong_ok "$WORK/pp.out" "$DPDK_PMD UDP ping-pong"
[ "$(metric 'caracal_dpdk_arp_replies_total')" -ge 1 ] || fail "the kernel reached the port without an ARP reply from it"

before=$(metric 'caracal_listener_requests_total')
sockperf throughput -i "$DPDK_IP" -p 7000 -m 64 -t 3 >"$WORK/tp.out" 2>&1 || fail "sockperf throughput exited $?"
grep -E "Summary: Message Rate" "$WORK/tp.out" | sed "s/^/$DPDK_PMD UDP throughput: /"
sent=$(sed -nE "s/.*Total of ([0-9]+) messages sent.*/\1/p" "$WORK/tp.out" | tail -1)
sleep 0.5
after=$(metric 'caracal_listener_requests_total')
echo "throughput: sockperf sent $sent, the listener received $((after - before))," \
  "queue_full drops $(metric 'caracal_listener_drops_total\{.*reason="queue_full"')"
[ "$((after - before))" -gt 0 ] || fail "the listener received nothing of the throughput run"
[ "$(metric 'caracal_service_errors_total')" -eq 0 ] || fail "the service answered errors"
for q in $(seq 0 $((queues - 1))); do
  echo "queue $q: $(metric "caracal_dpdk_rx_frames_total\{port=\"$DPDK_PORT_NAME\",queue=\"$q\"") frames received"
done
echo "port drops: $(curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" | grep -E '^caracal_dpdk_drops_total' | grep -v ' 0$' | tr '\n' ' ')"
# A ping-pong again: the port still answers after the flood.
sockperf ping-pong -i "$DPDK_IP" -p 7000 -m 64 -t 1 >"$WORK/pp2.out" 2>&1 || fail "sockperf ping-pong exited $?"
pingpong_ok "$WORK/pp2.out" "$DPDK_PMD UDP ping-pong after throughput"
mbufs_settle "$baseline"
echo "mbufs available: $baseline before and after"
echo "PASS"
