#!/usr/bin/env bash
# Memory per TCP connection: snic_server's resident memory before, while CONNECTIONS
# connections are open at once with requests flowing on all of them, and after they close,
# over ROUNDS rounds against one server (the echo agent on the CPU accelerator over shm).
#
#   bench/conn_memory/run.sh BUILD_DIR [RESULTS_DIR]   (default bench/results/conn-memory)
#
# Environment: CONNECTIONS (10000), REQUESTS per connection (10), PIPELINE (2), MIN_BYTES (16),
# MAX_BYTES (1024), ROUNDS (3), SETTLE_S (3: the wait after the clients close before the
# "after" figure), LABEL (a name for this run's rows, default "this tree").
#
# The server's file limit is raised to its hard limit; the client needs CONNECTIONS + 100
# descriptors, so the hard limit must allow that (run as root, or raise it first). Each phase
# reads VmRSS and RssAnon from /proc/PID/status and the kernel's TCP memory from
# /proc/net/sockstat (socket buffers, which live in the kernel, not in the process).
BUILD=$(realpath "${1:?usage: run.sh BUILD_DIR [RESULTS_DIR]}")
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${2:-$SRC/bench/results/conn-memory}
set -- "$BUILD" "$SRC"
source "$SRC/bench/lib/bench.sh"
# The agent on the CPU over shm, whatever the environment says for the end-to-end tests.
CARACAL_E2E_ACCELERATOR=cpu CARACAL_E2E_TRANSPORT=shm source "$SRC/tests/e2e/lib.sh"
CONNECTIONS=${CONNECTIONS:-10000}
REQUESTS=${REQUESTS:-10}
PIPELINE=${PIPELINE:-2}
MIN_BYTES=${MIN_BYTES:-16}
MAX_BYTES=${MAX_BYTES:-1024}
ROUNDS=${ROUNDS:-3}
SETTLE_S=${SETTLE_S:-3}
LABEL=${LABEL:-this tree}
CLIENT="$BUILD/tests/e2e/caracal_pipeline_client"
need_built "$SERVER_BIN" "$ECHO_AGENT" "$CLIENT"
need curl
need_files=$((CONNECTIONS + 100))
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need_files" ]; then
  echo "run.sh: $CONNECTIONS connections need $need_files open files; the limit is $(ulimit -n) (hard $(ulimit -Hn))"
  exit 77
fi
mkdir -p "$OUT"

# kib FIELD: a field of the server's /proc status, in KiB.
kib() { awk -v f="$1:" '$1 == f { print $2 }' "/proc/$SERVER_PID/status"; }
# tcp_kib: the kernel's memory for every TCP socket on the machine, in KiB.
tcp_kib() { awk -v p="$(getconf PAGESIZE)" '$1 == "TCP:" { for (i = 2; i < NF; i++) if ($i == "mem") print $(i + 1) * p / 1024 }' /proc/net/sockstat; }

start_server "io_threads: 2
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: echo
    max_message_bytes: 1024
    listeners:
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: length_prefixed, prefix_bytes: 4 } }"
PORT=$(port_of "tcp/127.0.0.1:0")
start_agent echo-1 "$ECHO_AGENT" \
  "  - { name: echo, queues: 2, ring_capacity: 256, slot_bytes: 256, max_message_bytes: 1024 }"

# A few connections first, so that "start" counts what any serving server holds (threads'
# arenas, the reply table) and not the first connection's one-time costs.
"$CLIENT" --connect "127.0.0.1:$PORT" --connections 10 --requests 10 --pipeline 2 \
  --min-bytes "$MIN_BYTES" --max-bytes "$MAX_BYTES" --seed 99 --timeout-s 30 >/dev/null
sleep 1
START_RSS=$(kib VmRSS)
START_ANON=$(kib RssAnon)
START_TCP=$(tcp_kib)
ROWS=()
for round in $(seq "$ROUNDS"); do
  "$CLIENT" --connect "127.0.0.1:$PORT" --connections "$CONNECTIONS" --requests "$REQUESTS" \
    --pipeline "$PIPELINE" --min-bytes "$MIN_BYTES" --max-bytes "$MAX_BYTES" --seed "$round" \
    --read-buffer-bytes 4096 --hold-s 3 --timeout-s 300 >"$WORK/client-$round.log" 2>&1 &
  client=$!
  wait_for_line "$WORK/client-$round.log" "holding [0-9]+ open connections" 20
  sleep 1
  held_rss=$(kib VmRSS)
  held_anon=$(kib RssAnon)
  held_tcp=$(tcp_kib)
  open=$(metric caracal_listener_connections)
  wait "$client" || { cat "$WORK/client-$round.log"; echo "run.sh: the client failed in round $round"; exit 1; }
  for _ in $(seq 200); do [ "$(metric caracal_listener_connections)" -eq 0 ] && break; sleep 0.05; done
  sleep "$SETTLE_S"
  after_rss=$(kib VmRSS)
  after_anon=$(kib RssAnon)
  ROWS+=("$round $open $held_rss $held_anon $held_tcp $after_rss $after_anon")
  echo "round $round: $open open: RSS $held_rss KiB (anon $held_anon), kernel TCP $held_tcp KiB; after close: RSS $after_rss KiB (anon $after_anon)"
done
TRIMS=$(metric caracal_memory_trims_total)

{
  echo "## $LABEL: $(date -u +%Y-%m-%d), commit $(commit_id)"
  echo
  echo "$(machine_line). $CONNECTIONS connections at once," \
    "$REQUESTS requests each ($MIN_BYTES-$MAX_BYTES bytes, $PIPELINE in flight), length-prefixed" \
    "framing, max_message_bytes 1024, 2 I/O threads running the engine, echo agent on the CPU;" \
    "\"after\" is $SETTLE_S s after the last connection closed. RSS of snic_server in MiB; per" \
    "connection: (open - start) / connections. Memory trims: ${TRIMS}."
  echo
  echo "| round | open | RSS start | RSS open | per connection | RSS after close | held after close | anon open | anon after | kernel TCP open |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  for row in "${ROWS[@]}"; do
    read -r r open hr ha ht ar aa <<<"$row"
    awk -v r="$r" -v open="$open" -v sr="$START_RSS" -v sa="$START_ANON" -v hr="$hr" -v ha="$ha" -v ht="$ht" -v ar="$ar" -v aa="$aa" -v st="$START_TCP" -v n="$CONNECTIONS" 'BEGIN {
      printf "| %d | %d | %.1f | %.1f | %.1f KiB | %.1f | %.1f | %.1f | %.1f | %.1f |\n",
        r, open, sr / 1024, hr / 1024, (hr - sr) / n, ar / 1024, (ar - sr) / 1024, ha / 1024, aa / 1024, (ht - st) / 1024 }'
  done
  echo
} | tee -a "$OUT/runs.md"
