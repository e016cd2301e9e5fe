#!/usr/bin/env bash
# flow_affinity with the engine in the I/O threads: snic_server with two I/O threads, each the
# engine thread of two of the echo agent's four queues, and a TCP listener whose connections
# are dealt to the two threads in turn. A thread applies the policy to its own two queues, so
# its connections (every other one) must spread over both of them: the listener's connection
# count taken as the flow as it is would put all of a thread's connections on one queue. 16
# pipelined connections get every reply in order, and each of the four queues answers some.
source "$(dirname "$0")/lib.sh"
need curl

start_server "io_threads: 2
engine_threads: 0
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: echo
    max_message_bytes: 256
    dispatch: flow_affinity
    listeners:
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: line } }"
start_agent echo-1 "$ECHO_AGENT" "  - { name: echo, queues: 4, ring_capacity: 64, slot_bytes: 128, max_message_bytes: 256 }"
PORT=$(port_of "tcp/127.0.0.1:0")

timeout $((60 * TIME_SCALE)) "$BUILD/tests/e2e/caracal_pipeline_client" --connect "127.0.0.1:$PORT" \
  --connections 16 --requests 50 --pipeline 4 --min-bytes 1 --max-bytes 200 --framing line \
  --seed 7 --timeout-s $((50 * TIME_SCALE)) --together >"$WORK/client.log" 2>&1 ||
  fail "the client saw a wrong or missing reply (client.log below)"
cat "$WORK/client.log"
used=0
for q in 0 1 2 3; do
  n=$(metric "caracal_queue_answered_requests\\{[^}]*queue=\"$q\"")
  echo "queue $q answered $n"
  [ "$n" -gt 0 ] && used=$((used + 1))
done
[ "$(metric caracal_service_replies_total)" -eq 800 ] || fail "not 16 x 50 replies counted"
[ "$used" -eq 4 ] || fail "16 connections used $used of the 4 queues (flow_affinity)"
echo "flow_affinity: 16 connections over both I/O threads used all 4 queues"
