#!/usr/bin/env bash
# sockperf against the echo agent through snic_server: ping-pong and throughput over UDP and
# TCP, a few seconds each, with zero errors, drops, duplicates or reordering. The server runs
# its engine in its I/O threads (engine_threads: 0); the other tests use engine threads of its
# own.
source "$(dirname "$0")/lib.sh"
need sockperf curl
# Each run's seconds: 3, scaled like the load runs' requests (CARACAL_E2E_LOAD_PERCENT: 1 s for
# the sanitized and the emulated runs), at least 1. sockperf itself adds 2 s to each run.
SECS=$(load 3)

start_server "io_threads: 2
engine_threads: 0
log_level: info
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: echo
    max_message_bytes: 1024
    dispatch: round_robin
    listeners:
      - { protocol: udp, listen: 127.0.0.1:0 }
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: fixed, size: 64 } }"
start_agent echo-1 "$ECHO_AGENT" "  - { name: echo, queues: 2, ring_capacity: 256, slot_bytes: 256, max_message_bytes: 1024 }"
UDP=$(port_of "udp/127.0.0.1:0")
TCP=$(port_of "tcp/127.0.0.1:0")

sockperf ping-pong -i 127.0.0.1 -p "$UDP" -m 64 -t "$SECS" >"$WORK/pp-udp.out" 2>&1 || fail "sockperf UDP ping-pong exited $?"
pingpong_ok "$WORK/pp-udp.out" "UDP ping-pong"
sockperf ping-pong --tcp -i 127.0.0.1 -p "$TCP" -m 64 -t "$SECS" >"$WORK/pp-tcp.out" 2>&1 || fail "sockperf TCP ping-pong exited $?"
pingpong_ok "$WORK/pp-tcp.out" "TCP ping-pong"

# Throughput: sockperf asks for no replies, so the handler sends none; every message must
# reach the server (TCP) and the service must report no errors.
before=$(metric 'caracal_service_requests_total')
sockperf throughput --tcp -i 127.0.0.1 -p "$TCP" -m 64 -t "$SECS" >"$WORK/tp-tcp.out" 2>&1 || fail "sockperf TCP throughput exited $?"
grep -E "Summary: Message Rate" "$WORK/tp-tcp.out" | sed 's/^/TCP throughput: /'
sent=$(sed -nE "s/.*Total of ([0-9]+) messages sent.*/\1/p" "$WORK/tp-tcp.out" | tail -1)
sockperf throughput -i 127.0.0.1 -p "$UDP" -m 64 -t "$SECS" >"$WORK/tp-udp.out" 2>&1 || fail "sockperf UDP throughput exited $?"
grep -E "Summary: Message Rate" "$WORK/tp-udp.out" | sed 's/^/UDP throughput: /'
# The server may still be reading what sockperf sent (a slow machine, the emulated VM): wait
# until the count stops short of it for good (5 s, scaled by CARACAL_E2E_TIME_SCALE).
for _ in $(seq $((100 * TIME_SCALE))); do
  after=$(metric 'caracal_service_requests_total')
  [ "$((after - before))" -ge "$sent" ] && break
  sleep 0.05
done
[ "$((after - before))" -ge "$sent" ] || fail "the service saw $((after - before)) requests, fewer than the $sent sockperf sent over TCP"
errors=$(metric 'caracal_service_errors_total')
[ "$errors" -eq 0 ] || fail "the service answered $errors errors"
# With no traffic, the I/O threads stop spinning and sleep (5 ms at a time), and say so.
# Their time without work counts as idle, per thread (wall time: a thread descheduled while it
# idles still idles, so a loaded machine does not shorten it).
# The clock is read before the first scrape and after the second, so that the scrapes' window
# lies inside t0..t1 however long each scrape takes (seconds in the emulated VM).
slept=$(metric caracal_engine_sleeps_total)
t0=$(now)
idle_before=$(metric caracal_engine_idle_seconds_total)
sleep 0.3
idle_slept=$(metric caracal_engine_sleeps_total)
idle_after=$(metric caracal_engine_idle_seconds_total)
t1=$(now)
echo "engine sleeps: $slept after the runs, $idle_slept after 0.3 s without traffic"
[ "$idle_slept" -gt "$slept" ] || fail "the idle I/O threads never slept (caracal_engine_sleeps_total $slept, then $idle_slept)"
scrape=$(curl -sf "http://127.0.0.1:$METRICS_PORT/metrics") || fail "the metrics endpoint did not answer"
for t in 0 1; do
  grep -q "^caracal_engine_idle_seconds_total{thread=\"$t\"} " <<<"$scrape" ||
    fail "no caracal_engine_idle_seconds_total for I/O thread $t"
done
echo "engine idle seconds: $idle_before, then $idle_after over $(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }') s"
awk -v a="$idle_before" -v b="$idle_after" -v t0="$t0" -v t1="$t1" \
  'BEGIN { exit !(b - a >= 2 * 0.3 * 0.8 && b - a <= 2 * (t1 - t0) + 0.01) }' ||
  fail "2 idle I/O threads counted $idle_before, then $idle_after idle seconds over $t0..$t1, not about 0.6"
echo "PASS"
