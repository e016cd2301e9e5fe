#!/usr/bin/env bash
# Agents that go bad without going away, under pipelined load, next to a healthy agent of the
# same service:
#  - stall: echo-1 stops answering after some requests (--stall-after) but keeps running and
#    heartbeating. Its requests time out with an error reply that names it and the bound, within
#    the bound plus a margin as the client measures it; it is ejected from dispatch (the log line
#    and the counters say so), returns when its ejection ends, and is ejected again for twice as
#    long; echo-2 serves everything meanwhile.
#  - slow: echo-1 answers every request later than the bound (--delay-us). The same, and its
#    answers that come after their timeouts are dropped, counted as `late`, never sent.
#  - fault: echo-1's handler faults (--fault-after): the agent says why and exits 1, the server
#    fails what was in flight to it, and echo-2 serves on.
# In each, the load client checks every reply against its own request, in order: each gets its
# own reply or an error reply, none is wrong, none is missing (a reply sent after its timeout's
# error would be a wrong one). Then a clean run while echo-1 is out of dispatch (or gone) sees
# no error at all.
#
# CARACAL_STALL_CASES picks cases (default "stall slow fault"). The bad agent runs on
# CARACAL_E2E_ACCELERATOR (gpu:0 runs the handler faults as a kernel's: scripts/gpu-check.sh),
# the healthy one on CARACAL_E2E_HEALTHY_ACCELERATOR (default cpu, so that two persistent
# kernels do not time-slice one GPU).
source "$(dirname "$0")/lib.sh"
need curl
CLIENT="$BUILD/tests/e2e/caracal_pipeline_client"
CASES=${CARACAL_STALL_CASES:-stall slow fault}
HEALTHY_ACCELERATOR=${CARACAL_E2E_HEALTHY_ACCELERATOR:-cpu}

BOUND_MS=250
EJECT_MS=1000
# What the client may see beyond the bound: the engine looks every millisecond, and a loaded
# 2-core machine runs the server, two agents and the client.
MARGIN_MS=$((500 * TIME_SCALE))
SERVICE_KEYS=", reply_timeout_ms: $BOUND_MS, eject_after_timeouts: 3, eject_ms: $EJECT_MS, eject_max_ms: 8000"
# Rings large enough that echo-1's share of the load never congests its queues: a congested
# queue stops TCP connections from reading, and the requests they had sent would then wait in
# the socket before the server saw them (the client counts that wait, the bound does not).
AGENT_SERVICE="  - { name: echo, queues: 2, ring_capacity: 512, slot_bytes: 128, max_message_bytes: 512 }"

# echo-1's series of an agent metric.
agent_metric() { metric "$1\\{service=\"echo\",agent=\"$2\"\\}"; }

# run_load SEED: the load of every case, in the foreground: 50 connections x 8 in flight, error
# replies counted. Sets LOAD_ERRORS and ERROR_MAX_MS.
run_load() {
  local rc=0
  "$CLIENT" --connect "127.0.0.1:$PORT" --connections 50 --requests "$(load 6000)" --pipeline 8 \
    --min-bytes 1 --max-bytes 500 --framing line --seed "$1" --timeout-s 120 \
    --error-prefix "ERROR " >"$WORK/client.log" 2>&1 || rc=$?
  cat "$WORK/client.log"
  [ "$rc" -eq 0 ] || fail "the load client saw a wrong or missing reply (exit $rc)"
  LOAD_ERRORS=$(sed -nE 's/.*errors=([0-9]+).*/\1/p' "$WORK/client.log")
  ERROR_MAX_MS=$(sed -nE 's/.*error_max_ms=([0-9]+).*/\1/p' "$WORK/client.log")
}

# clean_run SEED: requests that must all be answered, none with an error.
clean_run() {
  "$CLIENT" --connect "127.0.0.1:$PORT" --connections 20 --requests 100 --pipeline 8 \
    --max-bytes 500 --framing line --seed "$1" --timeout-s 60 ||
    fail "the healthy agent did not serve cleanly while echo-1 was out of dispatch"
}

# clean_run_while_ejected SEED: waits for a fresh ejection of echo-1, sending a few requests
# every 100 ms (echo-2 answers them while echo-1 is out; once it is back, it times them out and
# is ejected again, for longer: it came back less than a period ago), then runs clean_run inside
# that ejection, which lasts at least EJECT_MS.
clean_run_while_ejected() {
  local before
  before=$(agent_metric caracal_agent_ejections_total echo-1)
  for _ in $(seq $((200 * TIME_SCALE))); do
    [ "$(agent_metric caracal_agent_ejections_total echo-1)" -gt "$before" ] && break
    "$CLIENT" --connect "127.0.0.1:$PORT" --connections 4 --requests 8 --pipeline 4 \
      --max-bytes 100 --framing line --seed 99 --timeout-s 30 --error-prefix "ERROR " >/dev/null ||
      fail "a request got no reply or a wrong one while echo-1 was being ejected"
    sleep 0.1
  done
  [ "$(agent_metric caracal_agent_ejections_total echo-1)" -gt "$before" ] ||
    fail "echo-1 was not ejected again"
  [ "$(metric caracal_service_agents_ejected)" -eq 1 ] || fail "echo-1 is not out of dispatch"
  clean_run "$1"
  echo "a clean run while echo-1 was out of dispatch: no error"
}

# check_timeouts: the timeouts the client saw are the server's, within the bound, with echo-1
# ejected and echo-2 never timed out.
check_timeouts() {
  [ "$LOAD_ERRORS" -gt 0 ] || fail "no request timed out"
  grep -q "first error reply: ERROR agent 'echo-1' did not answer within $BOUND_MS ms" \
    "$WORK/client.log" || fail "the error reply does not name echo-1 and the bound"
  [ "$ERROR_MAX_MS" -le $((BOUND_MS + MARGIN_MS)) ] ||
    fail "an error reply came $ERROR_MAX_MS ms after its request (bound $BOUND_MS ms + $MARGIN_MS)"
  local timeouts ejections lines
  timeouts=$(agent_metric caracal_agent_reply_timeouts_total echo-1)
  [ "$timeouts" -eq "$LOAD_ERRORS" ] ||
    fail "the server counts $timeouts timeouts of echo-1, the client got $LOAD_ERRORS error replies"
  [ "$(agent_metric caracal_agent_reply_timeouts_total echo-2)" -eq 0 ] || fail "echo-2 timed out"
  [ "$(metric caracal_service_errors_total)" -eq "$LOAD_ERRORS" ] ||
    fail "the server counts $(metric caracal_service_errors_total) errors, the client $LOAD_ERRORS"
  ejections=$(agent_metric caracal_agent_ejections_total echo-1)
  lines=$(grep -c "agent 'echo-1' ejected from the dispatch of service 'echo'" "$WORK/server.log")
  [ "$ejections" -ge 1 ] || fail "echo-1 was never ejected"
  [ "$lines" -eq "$ejections" ] || fail "$ejections ejections counted, $lines logged"
  [ "$(agent_metric caracal_agent_ejections_total echo-2)" -eq 0 ] || fail "echo-2 was ejected"
  echo "echo-1: $timeouts timeouts (the slowest error reply $ERROR_MAX_MS ms after its request," \
    "bound $BOUND_MS ms), $ejections ejections"
  grep -E "ejected from the dispatch|back in the dispatch" "$WORK/server.log" | head -n 6
}

# The server and the two agents of a case; the arguments are echo-1's handler options.
start_case() {
  start_fault_server "" "$SERVICE_KEYS"
  start_agent echo-1 "$ECHO_AGENT" "$AGENT_SERVICE" "$@"
  AGENT_ACCELERATOR=$HEALTHY_ACCELERATOR AGENT_YAML="" start_agent echo-2 "$ECHO_AGENT" \
    "$AGENT_SERVICE"
}

# The end of a case: the agents and the server go; the next case starts afresh.
end_case() {
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
  mkdir -p "$WORK/$1" && mv "$WORK"/*.log "$WORK"/*.yaml "$WORK/$1/"
}

for c in $CASES; do
  echo "===== $c"
  case $c in
    stall)
      # Each of echo-1's workers (a CPU thread for both queues; on a GPU a warp per queue)
      # answers 100 requests, then blocks in the handler for good.
      start_case --stall-after 100
      run_load 11
      check_timeouts
      clean_run_while_ejected 12
      grep -q "agent 'echo-1' is back in the dispatch of service 'echo': its ejection ended" \
        "$WORK/server.log" || fail "echo-1 never came back after its ejection"
      grep -q "ejected from the dispatch of service 'echo' for $((2 * EJECT_MS)) ms" \
        "$WORK/server.log" || fail "an ejection soon after the agent's return did not double"
      [ "$(metric caracal_agents)" -eq 2 ] || fail "a stalled agent was dropped: it heartbeats"
      ;;
    slow)
      # 400 ms a request, against a bound of 250; each reply published as it is made (a worker
      # publishes its replies once per burst, by default 32 requests).
      AGENT_YAML=$'cpu: { burst: 1 }\ngpu: { burst: 1 }' start_case --delay-us 400000
      run_load 21
      check_timeouts
      # Answers keep coming for requests that timed out; each is dropped, none reaches a client.
      for _ in $(seq 100); do
        [ "$(metric 'caracal_service_drops_total\{service="echo",reason="late"\}')" -gt 0 ] && break
        sleep 0.05
      done
      late=$(metric 'caracal_service_drops_total\{service="echo",reason="late"\}')
      [ "$late" -gt 0 ] || fail "no late reply was counted"
      [ "$(metric 'caracal_service_drops_total\{service="echo",reason="unknown_token"\}')" -eq 0 ] ||
        fail "a late reply was counted as an unknown token"
      echo "late replies dropped: $late"
      clean_run_while_ejected 22
      ;;
    fault)
      # Each of echo-1's workers answers 300 requests, then its handler faults.
      start_case --fault-after 300
      run_load 31
      rc=0
      # shellcheck disable=SC2154 # start_agent (lib.sh) sets AGENT_PID_<name> through eval
      for _ in $(seq $((100 * TIME_SCALE))); do
        kill -0 "$AGENT_PID_echo_1" 2>/dev/null || break
        sleep 0.05
      done
      wait "$AGENT_PID_echo_1" || rc=$?
      [ "$rc" -eq 1 ] || fail "the faulting agent exited $rc, not 1"
      grep -Eq "the accelerator .* stopped: .*(handler fault|failed)" "$WORK/echo-1.log" ||
        fail "the faulting agent did not say why it stopped"
      grep -E "stopped:" "$WORK/echo-1.log" | head -n 1
      wait_for_line "$WORK/server.log" "agent 'echo-1' lost"
      [ "$(metric caracal_agents)" -eq 1 ] || fail "the server counts $(metric caracal_agents) agents"
      echo "requests failed visibly when echo-1 faulted: $LOAD_ERRORS"
      [ "$(metric caracal_service_errors_total)" -eq "$LOAD_ERRORS" ] ||
        fail "the server counts $(metric caracal_service_errors_total) errors, the client $LOAD_ERRORS"
      clean_run 32
      ;;
    *) fail "unknown case '$c' (stall, slow, fault)" ;;
  esac
  end_case "$c"
done
echo "PASS"
