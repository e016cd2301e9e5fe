#!/usr/bin/env bash
# Connection limits: a listener's max_connections_per_address and max_connections refuse the
# connection past them as it is accepted (closed, logged with the address and the limit,
# counted under its reason), and take connections again once others close. Then a server held to
# 48 open files by ulimit runs out of descriptors with connections waiting: it says so once per
# interval with a counter, does not spin, and serves every waiting connection once descriptors
# are free again.
source "$(dirname "$0")/lib.sh"
need curl python3
PY="python3 $SRC/tests/e2e/conn_client.py"

start_server "io_threads: 2
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: echo
    max_message_bytes: 256
    listeners:
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: line }, max_connections: 8, max_connections_per_address: 3 }"
start_agent echo-1 "$ECHO_AGENT" "  - { name: echo, queues: 1, ring_capacity: 64, slot_bytes: 128, max_message_bytes: 256 }"
PORT=$(port_of "tcp/127.0.0.1:0")

# 4 from 127.0.0.2 (the 4th over the address limit), 3 + 2 more (8, the listener's limit), then
# one from 127.0.0.5 over the listener's; after 1 closes, another from 127.0.0.5 is taken.
out=$(timeout 30 $PY open "$PORT" 127.0.0.2:4 127.0.0.3:3 127.0.0.4:2 127.0.0.5:1 --then-close 1 --then-open 127.0.0.5) ||
  { echo "$out"; fail "the limits client failed"; }
echo "$out"
[ "$(echo "$out" | head -1)" = "ok ok ok refused ok ok ok ok ok refused" ] || fail "connections were not taken and refused as the limits say"
wait_for_line "$WORK/server.log" "refused a connection from 127.0.0.2: 3 connections open from that address \(max_connections_per_address\)"
wait_for_line "$WORK/server.log" "refused a connection from 127.0.0.5: 8 connections open \(max_connections\)"
per=$(metric 'caracal_listener_refused_connections_total\{.*reason="max_connections_per_address"')
all=$(metric 'caracal_listener_refused_connections_total\{.*reason="max_connections"')
echo "refused: $per by max_connections_per_address, $all by max_connections"
[ "$per" -eq 1 ] || fail "max_connections_per_address refusals counted $per, not 1"
[ "$all" -ge 1 ] || fail "max_connections refusals not counted"
grep "refused a connection" "$WORK/server.log" | sed 's/^/logged: /'

# Out of descriptors: a server that may open 48 files, no agent (each request gets an error
# reply), and 60 connections at once.
cat >"$WORK/fd.yaml" <<YAML
io_threads: 2
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: echo
    max_message_bytes: 256
    listeners:
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: line }, error_reply: 'ERROR {reason}' }
YAML
(ulimit -n 48 && exec "$SERVER_BIN" --config "$WORK/fd.yaml") >"$WORK/fd-server.log" 2>&1 &
FD_PID=$!
PIDS+=("$FD_PID")
wait_for_line "$WORK/fd-server.log" "serving [0-9]+ service"
FD_PORT=$(sed -nE 's#.*listening on tcp/127.0.0.1:0 \(port ([0-9]+)\).*#\1#p' "$WORK/fd-server.log")
FD_METRICS=$(sed -nE 's/.*metrics on http:.*:([0-9]+)\/metrics.*/\1/p' "$WORK/fd-server.log")
grep -q "max_connections.*RLIMIT_NOFILE" "$WORK/fd-server.log" || fail "the server did not warn that max_connections exceeds its file limit"
coproc FLOOD { exec $PY flood "$FD_PORT" 60; }
# A copy of its output: bash forgets FLOOD once the client exits, with its last line unread.
exec {flood_out}<&"${FLOOD[0]}"
read -r -t 20 first <&"$flood_out" || fail "the flood client said nothing"
echo "$first"
wait_for_line "$WORK/fd-server.log" "cannot accept connections: Too many open files"
limit_from=$(now)
# At the limit the acceptor tries again every 100 ms (tunables::kAcceptRetry), where one that
# tried again at once would fail thousands of times a second and hold a core (the failures are
# counted below, once descriptors are free: /metrics cannot be reached at the limit). A retry
# brings no request, so the I/O thread it wakes spins only tunables::kQuietWakeSpinRounds
# before it sleeps again (a retry that restarted the whole spin would keep the thread spinning,
# since retries come more often than a spin lasts; the figures: snic_server/README.md, "The
# engine"). The server's own threads (caracal-io...; not a sanitizer's helper thread) are
# counted for 2 s and bounded at a quarter of a core.
server_ticks() {
  local t stat sum=0
  for t in /proc/"$FD_PID"/task/*; do
    stat=$(cat "$t/stat" 2>/dev/null) || continue
    case "$stat" in *"(caracal-"*) ;; *) continue ;; esac
    set -- ${stat##*) }
    sum=$((sum + ${12} + ${13}))
  done
  echo "$sum"
}
clk=$(getconf CLK_TCK)
t0=$(server_ticks)
w0=$(now)
sleep 2
t1=$(server_ticks)
w1=$(now)
secs=$(awk -v a="$w0" -v b="$w1" 'BEGIN { printf "%.2f", b - a }')
echo "at the file limit: $((t1 - t0)) CPU ticks of $clk a second over $secs s (the server's threads)"
awk -v t="$((t1 - t0))" -v hz="$clk" -v s="$secs" 'BEGIN { exit !(t <= hz * s / 4) }' ||
  fail "the server spun at the file limit ($((t1 - t0)) ticks of its threads in $secs s)"
lines=$(grep -c "cannot accept connections" "$WORK/fd-server.log")
[ "$lines" -le 2 ] || fail "the file limit was logged $lines times in about two seconds"
grep "cannot accept connections" "$WORK/fd-server.log" | head -1 | sed 's/^/logged: /'
limit_to=$(now)
eval "exec ${FLOOD[1]}>&-"  # the client reads its stdin to the end, then closes its connections
read -r -t 20 second <&"$flood_out" || fail "the flood client did not finish"
echo "$second"
echo "$second" | grep -Eq "^after closing the answered ones: ([0-9]+) of \1 waiting" || fail "connections that waited at the file limit were not all served"
fd_failures=$(curl -sf "http://127.0.0.1:$FD_METRICS/metrics" | grep -E '^caracal_listener_accept_failures_total\{.*reason="fd_limit"' | awk '{ s += $NF } END { print s + 0 }')
echo "accept failures counted at the file limit: $fd_failures"
[ "$fd_failures" -ge 1 ] || fail "the file-limit accept failures were not counted"
# One a retry, every 100 ms, over the time at the limit (with a second's slack each side).
awk -v f="$fd_failures" -v a="$limit_from" -v b="$limit_to" 'BEGIN { exit !(f <= (b - a + 2) * 10 * 1.5) }' ||
  fail "$fd_failures failed accepts in $(awk -v a="$limit_from" -v b="$limit_to" 'BEGIN { printf "%.1f", b - a }') s at the file limit: the acceptor did not wait 100 ms between tries"
kill -0 "$FD_PID" || fail "the server at the file limit exited"
echo "PASS"
