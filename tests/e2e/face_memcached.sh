#!/usr/bin/env bash
# Face verification (examples/face_verify) against a real memcached started here and loaded by
# caracal_face_loader: verdicts over UDP and TCP checked against the CPU reference, a loadgen
# burst with every reply verified, and each failure answered with its error status, never a
# verdict: a request that is not a face, an id with no reference, a reference damaged in place
# (bad checksum), a value that is not a reference at all, memcached stopped (the destination's
# timeout_ms) and memcached killed, also under thousands of open calls; and each time the
# service recovers.
source "$(dirname "$0")/lib.sh"
need memcached nc
FACE_AGENT="$BUILD/examples/face_verify/caracal_face_agent"
LOADER="$BUILD/examples/face_verify/caracal_face_loader"
CLIENT="$BUILD/examples/face_verify/caracal_face_client"
LOADGEN="$BUILD/bench/loadgen/caracal_loadgen"

start_memcached pick
# Persons 0-49 are whole; 55 is damaged, 57 forgotten, 58 holds a value that is no reference.
"$LOADER" --memcached "127.0.0.1:$MC_PORT" --persons 56 --damage 55 --forget 57 ||
  fail "the loader failed"
mc_set face:58 "not a face reference"

start_server "io_threads: 2
engine_threads: ${ENGINE_THREADS:-0}
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: face
    max_message_bytes: 8192
    dispatch: least_loaded
    listeners:
      - { protocol: udp, listen: 127.0.0.1:0 }
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: length_prefixed, prefix_bytes: 4 } }
destinations:
  - { name: memcached, connect: 127.0.0.1:$MC_PORT, framing: { kind: memcached }, max_message_bytes: 8192, timeout_ms: 300 }"
start_agent face-1 "$FACE_AGENT" "  - name: face
    queues: 2
    ring_capacity: 256
    slot_bytes: 256
    max_message_bytes: 8192
    client_queues: [ { destination: memcached }, { destination: memcached } ]"
UDP="127.0.0.1:$(port_of "udp/127.0.0.1:0")"
TCP="127.0.0.1:$(port_of "tcp/127.0.0.1:0")"

# ask EXPECT ARGS...: one request; its reply must be EXPECT (verdict: the reference's exactly).
ask() {
  local expect=$1
  shift
  out=$("$CLIENT" --expect "$expect" "$@") || fail "asked $*: '$out', expected $expect"
  echo "$* -> $out"
}

ask verdict --udp "$UDP" --person 3
ask match --udp "$UDP" --person 3
ask verdict --tcp "$TCP" --person 3 --variant 4
ask verdict --udp "$UDP" --person 3 --face 20
ask no_match --tcp "$TCP" --person 3 --face 20
ask bad_request --udp "$UDP" --person 3 --bad
ask unknown_person --udp "$UDP" --person 57
ask unknown_person --tcp "$TCP" --person 4000000
ask corrupt_reference --udp "$UDP" --person 55
ask corrupt_reference --tcp "$TCP" --person 58
[[ "$out" == *"wrong length"* ]] || fail "a value that is no reference gave '$out'"

# A burst with every reply checked against the reference, pipelined over TCP and over UDP.
for proto in tcp udp; do
  port=${TCP#*:}; [ "$proto" = udp ] && port=${UDP#*:}
  "$LOADGEN" --port "$port" --proto "$proto" --handler face --size 4104 --face-persons 50 \
    --connections 2 --window 8 --threads 1 --warmup 0.2 --duration 1 --strict \
    --json "$WORK/loadgen-$proto.json" >"$WORK/loadgen-$proto.log" 2>&1 ||
    { cat "$WORK/loadgen-$proto.log"; fail "loadgen over $proto saw a wrong or missing reply"; }
  echo "loadgen $proto: $(head -1 "$WORK/loadgen-$proto.log")"
done

# memcached stopped: the server's calls time out (timeout_ms 300) and the handler says so.
kill -STOP "$MC_PID"
ask store_unavailable --udp "$UDP" --person 3 --timeout-ms 3000
ask store_unavailable --tcp "$TCP" --person 4 --timeout-ms 3000
kill -CONT "$MC_PID"
ask verdict --udp "$UDP" --person 3
echo "memcached stopped, then going again: ok"

# memcached killed: error replies; back and reloaded: verdicts again.
kill -KILL "$MC_PID"
wait "$MC_PID" 2>/dev/null || true
ask store_unavailable --tcp "$TCP" --person 3
start_memcached
"$LOADER" --memcached "127.0.0.1:$MC_PORT" --persons 50 >/dev/null || fail "the reload failed"
ask verdict --tcp "$TCP" --person 3
# Thousands of calls open at once (the handler is overlapped: 4 connections of 32 requests in
# flight over 2 queues), memcached killed in the middle and started again: every request gets
# its right verdict or an outage's status (store_unavailable; unknown_person until the reload
# is done), none a wrong one, and verdicts come back.
"$LOADGEN" --port "${TCP#*:}" --proto tcp --handler face --size 4104 --face-persons 50 \
  --connections 4 --window 32 --threads 1 --warmup 0 --duration 5 --timeout-ms 3000 \
  --face-store-outage --timeline-ms 250 \
  --json "$WORK/loadgen-kill.json" >"$WORK/loadgen-kill.log" 2>&1 &
LOADGEN_PID=$!
# The kill comes once the run has been answered (a loaded or sanitized machine starts it late),
# at most 10 s after the start; the kill's and the reload's times place the timeline's intervals.
if command -v curl >/dev/null; then
  before=$(metric 'caracal_service_replies_total')
  for _ in $(seq 100); do
    [ "$(metric 'caracal_service_replies_total')" -ge $((before + 200)) ] && break
    sleep 0.1
  done
else
  sleep 1.5
fi
killed_at=$(date +%s.%N)
kill -KILL "$MC_PID"
wait "$MC_PID" 2>/dev/null || true
sleep 0.8
start_memcached
"$LOADER" --memcached "127.0.0.1:$MC_PORT" --persons 50 >/dev/null || fail "the second reload failed"
reloaded_at=$(date +%s.%N)
wait "$LOADGEN_PID" ||
  { cat "$WORK/loadgen-kill.log"; fail "loadgen across a memcached restart saw a wrong reply"; }
python3 - "$WORK/loadgen-kill.json" "$killed_at" "$reloaded_at" <<'PY' ||
import json, sys
r = json.load(open(sys.argv[1]))
killed, reloaded = float(sys.argv[2]), float(sys.argv[3])
c = r["counts"]
print("across the memcached restart:", c["replies"], "verdicts,", c["error_replies"],
      "outage replies", r["error_reasons"], c["wrong"], "wrong")
assert c["wrong"] == 0 and c["unaccounted"] == 0, c
assert c["replies"] >= 1000 and c["error_replies"] >= 1, c
# Verdicts in the intervals that began before the kill, and in those that began after the
# reload.
t = r["timeline"]
step, start, tl = t["interval_ms"] / 1000.0, t["start_unix_s"], t["replies"]
before = [n for k, n in enumerate(tl) if start + k * step < killed]
after = [n for k, n in enumerate(tl) if start + k * step >= reloaded]
assert sum(before) > 0 and sum(after) > 0, (tl, killed - start, reloaded - start)
PY
  fail "the run across the restart did not recover"
if command -v curl >/dev/null; then
  [ "$(metric 'caracal_destination_failures_total')" -ge 3 ] || fail "the failed calls were not counted"
fi
echo "PASS"
