#!/usr/bin/env bash
# 500 concurrent TCP connections with pipelined requests of random sizes through snic_server
# to two echo agents (4 queues, round-robin, so one connection's requests are served by
# different queues, agents and engine threads): every reply must be correct and in request order.
# ENGINE_THREADS (default 2) is the server's engine_threads; e2e.pipeline_hosted runs it with 0
# (each I/O thread runs an engine thread between its socket handlers). RX_LINES (on, off; unset:
# the agent's default) is the first agent's rx_lines, TX_LINES its tx_lines: e2e.pipeline_hosted
# turns both on, so one agent finds its requests through RX lines and announces its short
# replies in TX lines, which the server polls, and the other goes by the tails both ways.
source "$(dirname "$0")/lib.sh"
need curl
CLIENT="$BUILD/tests/e2e/caracal_pipeline_client"

start_server "io_threads: 2
engine_threads: ${ENGINE_THREADS:-2}
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: echo
    max_message_bytes: 1024
    dispatch: round_robin
    listeners:
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: length_prefixed, prefix_bytes: 4 } }
      - { protocol: tcp, listen: 127.0.0.2:0, framing: { kind: line } }"
SERVICE="  - { name: echo, queues: 2, ring_capacity: 64, slot_bytes: 128, max_message_bytes: 1024"
start_agent echo-1 "$ECHO_AGENT" \
  "$SERVICE${RX_LINES:+, rx_lines: $RX_LINES}${TX_LINES:+, tx_lines: $TX_LINES} }"
start_agent echo-2 "$ECHO_AGENT" "$SERVICE }"
if [ "${RX_LINES:-}" = on ]; then
  grep -q "agent 'echo-1' region for service 'echo' attached.*RX.*lines" "$WORK/server.log" ||
    fail "echo-1's region has no RX lines"
  echo "echo-1's region has RX lines"
fi
if [ "${TX_LINES:-}" = on ]; then
  grep -q "agent 'echo-1' region for service 'echo' attached.*TX lines" "$WORK/server.log" ||
    fail "echo-1's region has no TX lines"
  echo "echo-1's region has TX lines"
fi
LP=$(port_of "tcp/127.0.0.1:0")
LINE=$(port_of "tcp/127.0.0.2:0")

"$CLIENT" --connect "127.0.0.1:$LP" --connections 500 --requests "$(load 200)" --pipeline 16 \
  --min-bytes 0 --max-bytes 1024 --framing length_prefixed --seed 1 --timeout-s 120 ||
  fail "length-prefixed pipelined load: client exited $?"
"$CLIENT" --connect "127.0.0.2:$LINE" --connections 500 --requests "$(load 100)" --pipeline 8 \
  --min-bytes 1 --max-bytes 1000 --framing line --seed 2 --timeout-s 120 ||
  fail "line pipelined load: client exited $?"

# Both agents served, and nothing failed or dropped.
[ "$(metric 'caracal_service_errors_total')" -eq 0 ] || fail "the service answered errors"
[ "$(metric 'caracal_service_drops_total')" -eq 0 ] || fail "the service dropped replies"
echo "replies: $(metric 'caracal_service_replies_total')"
# The server takes short replies from their TX lines first where a region has them (echo-1's
# with TX_LINES=on, whose CPU workers write each reply's line before they publish the tail; both
# agents' by default on a GPU, CARACAL_E2E_ACCELERATOR=gpu:0); none where no region has them.
if grep -q "region for service 'echo' attached.*TX lines" "$WORK/server.log"; then
  by_line=$(metric 'caracal_service_tx_line_replies_total')
  [ "$by_line" -gt 0 ] || fail "no reply was taken from a TX line"
  echo "replies taken from TX lines: $by_line"
else
  [ "$(metric 'caracal_service_tx_line_replies_total')" -eq 0 ] ||
    fail "replies taken from TX lines, but no agent has them"
fi
echo "PASS"
