#!/usr/bin/env bash
# The key-lookup example against a real memcached started here: the handler calls memcached
# through a client queue (the server holds the connection; two engine threads, so one of the
# two server queues is served by another thread than the client queue). Hits, misses, bad
# keys, a value changed behind its back, and memcached going away (error replies, then
# recovery).
source "$(dirname "$0")/lib.sh"
need memcached nc curl python3
KV_AGENT="$BUILD/examples/kv_lookup/caracal_kv_agent"

start_memcached pick
mc_set greeting "hello from memcached"
mc_set empty ""

start_server "io_threads: 2
engine_threads: ${ENGINE_THREADS:-2}
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: kv
    max_message_bytes: 1024
    dispatch: least_loaded
    listeners:
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: line }, error_reply: 'ERROR {reason}' }
destinations:
  - { name: memcached, connect: 127.0.0.1:$MC_PORT, framing: { kind: memcached }, max_message_bytes: 1024 }"
start_agent kv-1 "$KV_AGENT" "  - name: kv
    queues: 2
    ring_capacity: 64
    slot_bytes: 256
    max_message_bytes: 1024
    client_queues: [ { destination: memcached } ]"
KV=$(port_of "tcp/127.0.0.1:0")

# ask LINE...: sends the lines on one connection and prints a reply line for each, read as they
# come (not after a fixed wait, which a loaded machine can outlast); 20 s at most.
ask() {
  python3 - "$KV" "$@" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=20)
s.sendall("".join(line + "\n" for line in sys.argv[2:]).encode())
f = s.makefile("rb")
for _ in sys.argv[2:]:
    sys.stdout.write(f.readline().decode())
PY
}

out=$(ask greeting missing-key greeting)
expected=$'hello from memcached\nNOT_FOUND\nhello from memcached'
[ "$out" = "$expected" ] || fail "lookups gave '$out'"
echo "hit, miss, hit: ok"

mc_set greeting "changed"
[ "$(ask greeting)" = "changed" ] || fail "the lookup did not see the new value"
[ "$(ask empty)" = "" ] || fail "an empty value came back as '$(ask empty)'"

# A key memcached would reject never reaches it: the handler answers with an error.
out=$(ask $'bad\tkey')
[[ "$out" == "ERROR key has a space or control character" ]] || fail "a bad key gave '$out'"

# Pipelined lookups on one connection come back in order.
keys=()
for i in $(seq 50); do mc_set "k$i" "v$i"; keys+=("k$i"); done
out=$(ask "${keys[@]}")
expected=$(for i in $(seq 50); do echo "v$i"; done)
[ "$out" = "$expected" ] || fail "pipelined lookups came back wrong or out of order"
echo "50 pipelined lookups: in order"

# Every call so far was answered by memcached, and each answer's time was observed.
calls=$(metric 'caracal_destination_calls_total')
timed=$(metric 'caracal_destination_call_seconds_count')
[ "$calls" -ge 55 ] && [ "$timed" = "$calls" ] ||
  fail "$calls calls to memcached, $timed of them timed (caracal_destination_call_seconds)"
awk -v s="$(metric 'caracal_destination_call_seconds_sum')" -v n="$timed" \
  'BEGIN { exit !(s > 0 && s / n < 1) }' || fail "the calls' times do not add up to a plausible sum"
echo "$timed calls timed"

# memcached goes away: lookups fail visibly (error replies); it comes back: they work again.
kill -KILL "$MC_PID"
wait "$MC_PID" 2>/dev/null || true
out=$(ask greeting)
[[ "$out" == ERROR* ]] || fail "with memcached down a lookup gave '$out'"
echo "memcached down: $out"
start_memcached
mc_set greeting "back again"
[ "$(ask greeting)" = "back again" ] || fail "lookups did not recover when memcached came back"
[ "$(metric 'caracal_destination_failures_total')" -ge 1 ] || fail "the failed call was not counted"
# A failed call is counted, not timed: the timed calls are the answered ones.
[ "$(metric 'caracal_destination_call_seconds_count')" -eq $(($(metric 'caracal_destination_calls_total') - $(metric 'caracal_destination_failures_total'))) ] ||
  fail "caracal_destination_call_seconds counted other than the answered calls"
echo "PASS"
