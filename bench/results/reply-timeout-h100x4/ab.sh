#!/usr/bin/env bash
# ab.sh BUILD [SOURCE]: requests/s of the echo service over TCP, pipelined, 64 B, served by a
# CPU agent of 4 workers through a server of 4 I/O threads running the engine. KEYS adds keys to
# the service (", reply_timeout_ms: 0"). What ab.txt beside it was measured with: base (the
# server before reply timeouts), new (with the default bound of 10 s) and new0 (no bound) in
# turn, five times, each run a fresh server and agent.
source "${2:-$(dirname "$0")/../../..}/tests/e2e/lib.sh" "$1" "${2:-$(dirname "$0")/../../..}"
start_server "io_threads: 4
control: { listen: 127.0.0.1:0, secret: $SECRET, heartbeat_interval_ms: 50, agent_timeout_ms: 2000 }
metrics: { listen: 127.0.0.1:0 }
services:
  - { name: echo, max_message_bytes: 512, dispatch: round_robin${KEYS:-},
      listeners: [ { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: line } } ] }"
PORT=$(port_of "tcp/127.0.0.1:0")
AGENT_YAML="cpu: { workers: 4 }" start_agent echo-1 "$ECHO_AGENT" \
  "  - { name: echo, queues: 4, ring_capacity: 256, slot_bytes: 128, max_message_bytes: 512 }"
"$BUILD/tests/e2e/caracal_pipeline_client" --connect "127.0.0.1:$PORT" --connections 64 \
  --requests 20000 --pipeline 16 --min-bytes 64 --max-bytes 64 --framing line --threads 4 \
  --timeout-s 90 | sed -nE 's/.*replies\/s=([0-9]+).*/\1/p'
