#!/usr/bin/env bash
# Ten thousand TCP connections open at once with requests flowing on all of them: the client
# (caracal_pipeline_client --together) sends nothing before every connection is open and closes
# none before every one has its replies, each reply checked against its request; the server's
# gauge must show them all open, its memory is printed open and after the close, and every
# connection must be gone from the gauge afterwards. CARACAL_E2E_CONNECTIONS (default 10000)
# changes the count. Skipped (77) when the file limit cannot be raised for that many.
source "$(dirname "$0")/lib.sh"
need curl
N=${CARACAL_E2E_CONNECTIONS:-10000}
CLIENT="$BUILD/tests/e2e/caracal_pipeline_client"
want=$((N + 200))
ulimit -n "$want" 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$want" ]; then
  echo "SKIP: $N connections need $want open files in the client and the server; the limit is $(ulimit -n) (hard $(ulimit -Hn))"
  exit 77
fi

start_server "io_threads: 2
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: echo
    max_message_bytes: 1024
    listeners:
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: length_prefixed, prefix_bytes: 4 }, max_connections: $N }"
start_agent echo-1 "$ECHO_AGENT" "  - { name: echo, queues: 2, ring_capacity: 256, slot_bytes: 256, max_message_bytes: 1024 }"
PORT=$(port_of "tcp/127.0.0.1:0")
grep -E "open files: limit" "$WORK/server.log" | sed 's/^.* info /server: /'
rss() { awk '$1 == "VmRSS:" { printf "%.1f MiB", $2 / 1024 }' "/proc/$SERVER_PID/status"; }
before=$(rss)

requests=$(load 5)
"$CLIENT" --connect "127.0.0.1:$PORT" --connections "$N" --requests "$requests" --pipeline 2 \
  --min-bytes 1 --max-bytes 1024 --seed 10 --together --hold-s 1 --read-buffer-bytes 4096 \
  --timeout-s 150 >"$WORK/client.log" 2>&1 &
CLIENT_PID=$!
PIDS+=("$CLIENT_PID")
wait_for_line "$WORK/client.log" "holding [0-9]+ open connections" 150
open=$(metric caracal_listener_connections)
held=$(rss)
rc=0
wait "$CLIENT_PID" || rc=$?
cat "$WORK/client.log"
[ "$rc" -eq 0 ] || fail "the client saw a wrong or missing reply (exit $rc)"
echo "server: $open connections open at once after every reply; RSS $before before, $held open"
[ "$open" -eq "$N" ] || fail "the server counted $open open connections, not $N"
[ "$(metric caracal_listener_requests_total)" -ge $((N * requests)) ] || fail "the server counted fewer than $((N * requests)) requests"
for _ in $(seq 200); do [ "$(metric caracal_listener_connections)" -eq 0 ] && break; sleep 0.05; done
[ "$(metric caracal_listener_connections)" -eq 0 ] || fail "$(metric caracal_listener_connections) connections still counted open after the client closed"
sleep 1.5  # a memory trim runs once a second after a burst of closes
echo "server: RSS $(rss) after the close ($(metric caracal_memory_trims_total) memory trim(s))"
[ "$(metric 'caracal_listener_refused_connections_total')" -eq 0 ] || fail "connections were refused"
echo "PASS"
