#!/usr/bin/env bash
# A destination that answers once too often: the key-lookup example calls a memcached stand-in
# (a Python server here) that sends one reply more than it was asked for after the key "stray".
# Replies pair with calls in order, so the extra one loses the pairing: the server drops the
# connection, logs why (even with no call waiting) and counts it; the next call connects again
# and is answered.
source "$(dirname "$0")/lib.sh"
need nc curl python3
KV_AGENT="$BUILD/examples/kv_lookup/caracal_kv_agent"

# The stand-in: "END\r\n" (a miss) to every get, and a second one after "get stray".
python3 - "$WORK/dest.port" >"$WORK/dest.log" 2>&1 <<'PY' &
import socket, sys, threading
srv = socket.create_server(("127.0.0.1", 0))
open(sys.argv[1], "w").write(f"{srv.getsockname()[1]}\n")
def serve(c):
    f = c.makefile("rb")
    for line in f:
        c.sendall(b"END\r\n" * (2 if line.strip() == b"get stray" else 1))
        print("answered", line.strip().decode(), flush=True)
while True:
    conn, _ = srv.accept()
    print("connection", flush=True)
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
PY
PIDS+=("$!")
for _ in $(seq 100); do [ -s "$WORK/dest.port" ] && break; sleep 0.05; done
DEST_PORT=$(cat "$WORK/dest.port") || fail "the stand-in destination did not start"

start_server "io_threads: 2
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: kv
    max_message_bytes: 1024
    listeners:
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: line }, error_reply: 'ERROR {reason}' }
destinations:
  - { name: memcached, connect: 127.0.0.1:$DEST_PORT, framing: { kind: memcached }, max_message_bytes: 1024 }"
start_agent kv-1 "$KV_AGENT" "  - name: kv
    queues: 1
    ring_capacity: 64
    slot_bytes: 256
    max_message_bytes: 1024
    client_queues: [ { destination: memcached } ]"
KV=$(port_of "tcp/127.0.0.1:0")

ask() { printf '%s\n' "$1" | timeout 10 nc -N 127.0.0.1 "$KV"; }

[ "$(ask first)" = NOT_FOUND ] || fail "the first lookup was not answered"
[ "$(metric caracal_destination_disconnects_total)" -eq 0 ] || fail "a disconnect before the stray reply"
# The stray key's own call is answered by the first END; the second has no call to answer.
[ "$(ask stray)" = NOT_FOUND ] || fail "the lookup of 'stray' was not answered"
wait_for_line "$WORK/server.log" \
  "destination memcached \(127.0.0.1:$DEST_PORT\): sent a reply of 5 bytes with no call waiting"
for _ in $(seq 50); do
  [ "$(metric caracal_destination_disconnects_total)" -eq 1 ] && break
  sleep 0.1
done
[ "$(metric caracal_destination_disconnects_total)" -eq 1 ] ||
  fail "the dropped connection counted $(metric caracal_destination_disconnects_total) times, not once"
grep "no call waiting" "$WORK/server.log" | sed 's/^/logged: /'
# The next call connects again and is answered; no call failed on the way.
[ "$(ask after)" = NOT_FOUND ] || fail "the lookup after the stray reply was not answered"
[ "$(grep -c '^connection' "$WORK/dest.log")" -eq 2 ] ||
  fail "the stand-in saw $(grep -c '^connection' "$WORK/dest.log") connections, not 2"
[ "$(metric caracal_destination_failures_total)" -eq 0 ] || fail "a call failed"
echo "PASS"
