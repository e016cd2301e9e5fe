#!/usr/bin/env bash
# Connection timeouts and unsent replies, with short settings: a connection idle for
# idle_timeout_ms is closed and one that keeps asking is not; a request sent one byte every
# 0.2 s is cut off request_timeout_ms after its first byte, with an error reply; a client that
# never reads its replies makes the connection stop reading at max_queued_reply_bytes (the
# server reads far less than it was sent, and holds at most that plus the replies of the
# max_pipeline requests in flight) and is closed after send_timeout_ms. Each is counted.
source "$(dirname "$0")/lib.sh"
need curl python3
PY="python3 $SRC/tests/e2e/conn_client.py"

start_server "io_threads: 2
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: echo
    max_message_bytes: 1024
    listeners:
      - protocol: tcp
        listen: 127.0.0.1:0
        framing: { kind: line }
        error_reply: 'ERROR {reason}'
        max_pipeline: 16
        idle_timeout_ms: 600
        request_timeout_ms: 1000
        max_queued_reply_bytes: 65536
        send_timeout_ms: 1000"
start_agent echo-1 "$ECHO_AGENT" "  - { name: echo, queues: 2, ring_capacity: 64, slot_bytes: 256, max_message_bytes: 1024 }"
PORT=$(port_of "tcp/127.0.0.1:0")
closed() { metric "caracal_listener_closed_connections_total\\{.*reason=\"$1\""; }

timeout 30 $PY idle "$PORT" 0.6 || fail "idle timeout"
[ "$(closed idle_timeout)" -eq 1 ] || fail "idle closes counted $(closed idle_timeout), not 1"

timeout 30 $PY slow "$PORT" 1.0 || fail "request timeout"
[ "$(closed request_timeout)" -eq 1 ] || fail "request timeouts counted $(closed request_timeout), not 1"
wait_for_line "$WORK/server.log" "closing the connection from 127.0.0.1:[0-9]+: a request was not whole 1000 ms after its first byte"

coproc NOREAD { exec $PY no-read "$PORT"; }
exec {noread_out}<&"${NOREAD[0]}"
read -r -t 30 line <&"$noread_out" || fail "the client that never reads said nothing"
echo "$line"
sent=$(echo "$line" | sed -nE 's/^(sent|closed by the server after) ([0-9]+) requests.*/\2/p')
[ -n "$sent" ] || fail "the client that never reads said '$line'"
for _ in $(seq 100); do [ "$(closed send_timeout)" -ge 1 ] && break; sleep 0.05; done
read_by_server=$(metric caracal_listener_requests_total)
pauses=$(metric caracal_listener_reply_backlog_pauses_total)
echo "the server read $read_by_server requests in all (the client that never reads sent $sent), stopped reading $pauses time(s) for unsent replies, closed $(closed send_timeout) for send_timeout"
[ "$pauses" -ge 1 ] || fail "the connection never stopped reading for its unsent replies"
[ "$(closed send_timeout)" -eq 1 ] || fail "the client that never reads was not closed by send_timeout_ms"
[ "$read_by_server" -lt "$sent" ] || fail "the server read every request of a client that never read a reply"
wait_for_line "$WORK/server.log" "it took no reply bytes for 1000 ms \(send_timeout_ms\)"
queued=$(sed -nE 's/.*\(send_timeout_ms\), ([0-9]+) bytes of replies queued.*/\1/p' "$WORK/server.log")
echo "replies queued when it closed: $queued bytes"
[ "$queued" -le $((65536 + 16 * 1001)) ] || fail "$queued bytes of replies queued, over max_queued_reply_bytes and max_pipeline replies"
eval "exec ${NOREAD[1]}>&-"
echo "PASS"
