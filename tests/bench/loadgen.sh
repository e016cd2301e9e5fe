#!/usr/bin/env bash
# caracal_loadgen against the real snic_server with the echo and matvec agents (CPU
# accelerator by default), then against the CPU baseline server: UDP and TCP, closed and open
# loop, 64 B to 16 KiB. Every reply is verified by loadgen (echo: the same bytes; matvec: the
# CPU reference's answer); --strict fails the run on any wrong, lost, late or unanswered
# request. The runs are short (half a second each): this checks the tools, it measures
# nothing.
source "$(dirname "$0")/../e2e/lib.sh"
need curl
LOADGEN="$BUILD/bench/loadgen/caracal_loadgen"
CPU_SERVER="$BUILD/bench/baselines/caracal_cpu_server"
MATVEC_AGENT="$BUILD/examples/matvec/caracal_matvec_agent"

start_server "io_threads: 2
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: echo
    max_message_bytes: 16384
    dispatch: round_robin
    listeners:
      - { protocol: udp, listen: 127.0.0.1:0 }
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: length_prefixed, prefix_bytes: 4 } }
  - name: matvec
    max_message_bytes: 16384
    dispatch: round_robin
    listeners:
      - { protocol: udp, listen: 127.0.0.2:0 }
      - { protocol: tcp, listen: 127.0.0.2:0, framing: { kind: length_prefixed, prefix_bytes: 4 } }"
GEOMETRY="queues: 2, ring_capacity: 256, slot_bytes: 256, max_message_bytes: 16384"
start_agent echo-1 "$ECHO_AGENT" "  - { name: echo, $GEOMETRY }"
start_agent matvec-1 "$MATVEC_AGENT" "  - { name: matvec, $GEOMETRY }"

# gen NAME ARGS...: one strict loadgen run; its JSON must say what it measured.
gen() {
  local name=$1
  shift
  "$LOADGEN" --warmup 0.1 --duration 0.4 --timeout-ms 10000 --strict --json "$WORK/$name.json" \
    "$@" >"$WORK/$name.out" 2>&1 || { cat "$WORK/$name.out"; fail "$name: loadgen exited $?"; }
  sed "s/^/$name: /" "$WORK/$name.out"
  grep -q '"p99_ns"' "$WORK/$name.json" || fail "$name: no latency in the JSON"
  # The client's own CPU over the window: some, and no thread above the total.
  local cores busiest
  cores=$(sed -nE 's/^ *"cores": ([0-9.e+-]+),?$/\1/p' "$WORK/$name.json")
  busiest=$(sed -nE 's/^ *"busiest_thread_cores": ([0-9.e+-]+),?$/\1/p' "$WORK/$name.json")
  [ -n "$cores" ] && [ -n "$busiest" ] || fail "$name: no client CPU in the JSON"
  awk -v c="$cores" -v b="$busiest" 'BEGIN { exit !(c > 0 && b > 0 && b <= c + 1e-9) }' ||
    fail "$name: client CPU $cores cores, busiest thread $busiest"
  grep -q "; client [0-9.]* cores (busiest thread [0-9.]*)" "$WORK/$name.out" ||
    fail "$name: no client CPU in the summary line"
}

SIZES=64:1,1024:1,16384:1
E_UDP=$(port_of "udp/127.0.0.1:0")
E_TCP=$(port_of "tcp/127.0.0.1:0")
M_UDP=$(port_of "udp/127.0.0.2:0")
M_TCP=$(port_of "tcp/127.0.0.2:0")
gen caracal-echo-udp-closed --port "$E_UDP" --proto udp --handler echo --sizes $SIZES \
  --connections 2 --window 4 --threads 2
gen caracal-echo-tcp-closed --port "$E_TCP" --proto tcp --handler echo --sizes $SIZES \
  --connections 2 --window 8 --threads 2
# 256 datagrams in flight: the engine flushes replies in bursts larger than one sendmmsg (64).
gen caracal-echo-udp-burst --port "$E_UDP" --proto udp --handler echo --size 64 \
  --connections 4 --window 64 --threads 2
gen caracal-echo-udp-open --port "$E_UDP" --proto udp --handler echo --size 64 --mode open \
  --rate 2000 --connections 2 --window 16
gen caracal-echo-tcp-open --port "$E_TCP" --proto tcp --handler echo --size 1024 --mode open \
  --rate 2000 --connections 2 --window 16
gen caracal-matvec-udp --host 127.0.0.2 --port "$M_UDP" --proto udp --handler matvec \
  --sizes $SIZES --connections 2 --window 2
gen caracal-matvec-tcp --host 127.0.0.2 --port "$M_TCP" --proto tcp --handler matvec \
  --sizes $SIZES --connections 2 --window 4 --mode open --rate 1000
[ "$(metric 'caracal_service_errors_total')" -eq 0 ] || fail "the server counted errors"

# The CPU baseline serves the same handlers with the same framing.
for handler in echo matvec; do
  "$CPU_SERVER" --handler $handler --threads 2 >"$WORK/cpu-$handler.log" 2>&1 &
  PIDS+=("$!")
  wait_for_line "$WORK/cpu-$handler.log" "^listening udp"
  udp=$(sed -nE 's/^listening udp ([0-9]+) tcp ([0-9]+).*/\1/p' "$WORK/cpu-$handler.log")
  tcp=$(sed -nE 's/^listening udp ([0-9]+) tcp ([0-9]+).*/\2/p' "$WORK/cpu-$handler.log")
  gen cpu-$handler-udp --port "$udp" --proto udp --handler $handler --sizes $SIZES \
    --connections 2 --window 4
  gen cpu-$handler-tcp --port "$tcp" --proto tcp --handler $handler --sizes $SIZES \
    --connections 2 --window 4 --mode open --rate 1000
done

# A wrong answer is caught: the echo server cannot pass as the matvec service.
if "$LOADGEN" --port "$E_TCP" --proto tcp --handler matvec --size 64 --warmup 0 --duration 0.2 \
  >"$WORK/wrong.out" 2>&1; then
  fail "loadgen accepted echo replies as matvec answers"
fi
grep -q "matvec reply: output" "$WORK/wrong.out" || { cat "$WORK/wrong.out"; fail "no reason given for the wrong replies"; }
echo "PASS"
