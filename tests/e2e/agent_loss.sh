#!/usr/bin/env bash
# An agent killed (SIGKILL) under load: the server fails that agent's requests in flight with
# error replies, keeps serving with the other agent, and never sends a reply to the wrong
# client (the load client checks every reply against its own request, in order). The agent
# then comes back with a new epoch and is admitted again.
source "$(dirname "$0")/lib.sh"
need curl
CLIENT="$BUILD/tests/e2e/caracal_pipeline_client"

# A killed agent is noticed by its closed connection, whatever the heartbeat timeout.
start_fault_server
start_agent echo-1 "$ECHO_AGENT" "$SERVICE"
start_agent echo-2 "$ECHO_AGENT" "$SERVICE"

start_load 7
# Kill echo-1 once the load is well under way.
wait_for_replies
# shellcheck disable=SC2154 # start_agent (lib.sh) sets AGENT_PID_<name> through eval
kill -KILL "$AGENT_PID_echo_1"
echo "killed echo-1 after $(metric caracal_service_replies_total) replies"
wait_for_line "$WORK/server.log" "agent 'echo-1' lost"
finish_load
echo "requests failed visibly when echo-1 died: $LOAD_ERRORS"
[ "$(metric caracal_agents)" -eq 1 ] || fail "the server still counts $(metric caracal_agents) agents"

# The other agent alone serves everything now, with no errors.
"$CLIENT" --connect "127.0.0.1:$PORT" --connections 50 --requests 200 --pipeline 8 \
  --max-bytes 500 --framing line --seed 8 --timeout-s 60 || fail "the surviving agent did not serve cleanly"

# echo-1 returns (a new process, a new epoch) and is admitted again.
start_agent echo-1 "$ECHO_AGENT" "$SERVICE"
[ "$(grep -c "agent 'echo-1' registered" "$WORK/server.log")" -eq 2 ] || fail "echo-1 was not admitted again"
"$CLIENT" --connect "127.0.0.1:$PORT" --connections 50 --requests 200 --pipeline 8 \
  --max-bytes 500 --framing line --seed 9 --timeout-s 60 || fail "serving failed after echo-1 returned"
[ "$(metric caracal_agents)" -eq 2 ] || fail "the server counts $(metric caracal_agents) agents, not 2"
echo "PASS"
