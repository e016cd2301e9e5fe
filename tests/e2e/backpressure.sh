#!/usr/bin/env bash
# Backpressure and shutdown with requests in flight. The agent is frozen (SIGSTOP) so its
# rings fill: TCP connections stop reading (counted pauses; the server's backlog stays
# bounded) and UDP datagrams are dropped and counted; once the agent runs again every TCP
# reply arrives, correct and in order. Then SIGTERM reaches the server while requests are
# waiting for the frozen agent: it drains them (every reply arrives) and exits 0. The server
# runs two engine threads, one for each of the agent's queues.
source "$(dirname "$0")/lib.sh"
need nc curl
if [ "$ACCELERATOR" != cpu ]; then
  # SIGSTOP freezes the agent's host threads; a persistent GPU kernel keeps serving.
  echo "SKIP: freezing the agent does not freeze a $ACCELERATOR accelerator"
  exit 77
fi
CLIENT="$BUILD/tests/e2e/caracal_pipeline_client"

# A long agent timeout: a frozen agent sends no heartbeats and must not be declared lost here.
start_server "io_threads: 2
engine_threads: ${ENGINE_THREADS:-2}
control: { listen: 127.0.0.1:0, secret: $SECRET, heartbeat_interval_ms: 100, agent_timeout_ms: 20000 }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: echo
    max_message_bytes: 256
    dispatch: least_loaded
    listeners:
      - { protocol: udp, listen: 127.0.0.1:0 }
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: line } }"
start_agent echo-1 "$ECHO_AGENT" "  - { name: echo, queues: 2, ring_capacity: 16, slot_bytes: 64, max_message_bytes: 256 }"
UDP=$(port_of "udp/127.0.0.1:0")
TCP=$(port_of "tcp/127.0.0.1:0")

# shellcheck disable=SC2154 # start_agent (lib.sh) sets AGENT_PID_<name> through eval
kill -STOP "$AGENT_PID_echo_1"
"$CLIENT" --connect "127.0.0.1:$TCP" --connections 8 --requests 20000 --pipeline 4000 \
  --min-bytes 1 --max-bytes 200 --framing line --seed 3 --timeout-s 120 >"$WORK/client.log" 2>&1 &
CLIENT_PID=$!
PIDS+=("$CLIENT_PID")
for _ in $(seq 100); do
  [ "$(metric caracal_service_backpressure_pauses_total)" -ge 1 ] && break
  sleep 0.05
done
sleep 0.5
pauses=$(metric caracal_service_backpressure_pauses_total)
waiting=$(metric caracal_queue_waiting_requests)
read_so_far=$(metric caracal_listener_requests_total)
echo "agent frozen: $pauses pauses, $waiting requests waiting, $read_so_far read of 160000"
[ "$pauses" -ge 1 ] || fail "no TCP connection stopped reading while the agent was frozen"
# Each connection reads at most one buffer (64 KiB) past the point where the queues congest.
[ "$read_so_far" -lt 40000 ] || fail "the server kept reading ($read_so_far requests) with nowhere to put them"
for _ in $(seq 200); do printf 'x' | nc -u -w 0 127.0.0.1 "$UDP" >/dev/null 2>&1 || true; done
sleep 0.3
[ "$(metric 'caracal_listener_drops_total\{.*reason="queue_full"')" -ge 1 ] || fail "no UDP datagram was dropped as queue_full"
echo "UDP drops while congested: $(metric 'caracal_listener_drops_total\{.*reason="queue_full"')"
kill -CONT "$AGENT_PID_echo_1"
client_rc=0
wait "$CLIENT_PID" || client_rc=$?
cat "$WORK/client.log"
[ "$client_rc" -eq 0 ] || fail "after the agent resumed, the client saw wrong or missing replies (exit $client_rc)"

# Shutdown with requests in flight: they are answered before the server exits.
kill -STOP "$AGENT_PID_echo_1"
base=$(metric caracal_listener_requests_total)
coproc REQ { exec nc 127.0.0.1 "$TCP"; }
# Keep our own copies of the coprocess's pipes: bash unsets REQ as soon as nc
# exits (the server closes the connection once it has drained), and the replies
# still waiting in the pipe must remain readable.
exec {req_out}<&"${REQ[0]}" {req_in}>&"${REQ[1]}"
# All 100 in one write, so that they reach the server together: read in pieces, the first
# ones congest the frozen agent's queues and the connection stops reading the rest.
seq -f 'request-%g' 100 >&"$req_in"
for _ in $(seq 100); do
  [ "$(metric caracal_listener_requests_total)" -ge $((base + 100)) ] && break
  sleep 0.05
done
kill -TERM "$SERVER_PID"
sleep 0.3
kill -CONT "$AGENT_PID_echo_1"
got=0
while read -r -t 10 line <&"$req_out"; do
  got=$((got + 1))
  [ "$line" = "request-$got" ] || fail "reply $got during shutdown was '$line'"
  [ "$got" -eq 100 ] && break
done
[ "$got" -eq 100 ] || fail "only $got of 100 requests in flight were answered during shutdown"
server_rc=0
wait "$SERVER_PID" || server_rc=$?
[ "$server_rc" -eq 0 ] || fail "the server exited $server_rc after SIGTERM"
grep -q "SIGTERM received: draining" "$WORK/server.log" || fail "the server did not log the drain"
echo "shutdown: 100 requests in flight answered, exit 0"
echo "PASS"
