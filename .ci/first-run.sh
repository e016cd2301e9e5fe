#!/usr/bin/env bash
# The README's main command as a newcomer runs it, on the clean clone CI starts from:
# scripts/run.sh installs what it needs, builds, starts snic_server and the echo agent, and
# serves; one request over TCP and one over UDP get their echo, and scripts/served.sh counts a
# sockperf run's requests as received and answered. Then, on the same build:
# SIGINT and SIGTERM each stop both processes with exit 0, and an agent killed with SIGKILL is
# reported and the server stopped, with exit 1. Every wait is bounded.
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d)
run=
cleanup() {
  [ -n "$run" ] && kill -TERM "$run" 2>/dev/null && wait "$run" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  echo "--- scripts/run.sh's output:"
  cat "$work/out"
  exit 1
}

# start LIMIT_S: scripts/run.sh in the background until it says it serves. Background jobs of a
# script ignore SIGINT; env gives run.sh the default back, as a terminal would.
start() {
  : >"$work/out"
  env --default-signal=INT scripts/run.sh >"$work/out" 2>&1 &
  run=$!
  local deadline=$((SECONDS + $1))
  until grep -q '^Caracal is serving' "$work/out"; do
    kill -0 "$run" 2>/dev/null || fail "run.sh exited before it served"
    [ $SECONDS -lt $deadline ] || fail "run.sh did not serve within $1 s"
    sleep 0.5
  done
  server=$(pgrep -P "$run" -x snic_server) || fail "no snic_server child"
  agent=$(pgrep -P "$run" -f caracal_echo_agent) || fail "no echo agent child"
}

# finish EXPECTED_STATUS: waits up to 30 s for run.sh, checks its exit status, and that the
# server and the agent it started are gone.
finish() {
  local status=0 deadline=$((SECONDS + 30))
  while kill -0 "$run" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || fail "run.sh still running 30 s later"
    sleep 0.2
  done
  wait "$run" || status=$?
  run=
  [ "$status" -eq "$1" ] || fail "run.sh exited with $status, not $1"
  ! kill -0 "$server" 2>/dev/null || fail "snic_server (pid $server) is still running"
  ! kill -0 "$agent" 2>/dev/null || fail "the echo agent (pid $agent) is still running"
}

t0=$SECONDS
start 2400
echo "run.sh served after $((SECONDS - t0)) s (install and build included)"
grep -q '^Caracal: CUDA .*, DPDK .*, RDMA ' "$work/out" || fail "no configure summary line"
tcp=$(echo hello | timeout 10 nc -q1 127.0.0.1 7002) || true
[ "$tcp" = hello ] || fail "TCP 7002 answered '$tcp', not 'hello'"
udp=$(echo hello | timeout 10 socat -T2 - UDP:127.0.0.1:7000) || true
[ "$udp" = hello ] || fail "UDP 7000 answered '$udp', not 'hello'"
# The README's way to read what the server served under a client's load.
scripts/served.sh -- sockperf ping-pong -i 127.0.0.1 -p 7000 -m 64 -t 1 >"$work/served" 2>&1 ||
  { cat "$work/served"; fail "served.sh around sockperf failed"; }
received=$(sed -nE 's/^  received +([0-9]+) requests$/\1/p' "$work/served")
answered=$(sed -nE 's/^  answered +([0-9]+) .*/\1/p' "$work/served")
[ "${received:-0}" -gt 0 ] && [ "$received" = "$answered" ] ||
  { cat "$work/served"; fail "served.sh: received '$received', answered '$answered'"; }
kill -INT "$run"
finish 0
grep -q 'SIGINT: stopping the server and the agent' "$work/out" || fail "no word of SIGINT"
echo "ok: served TCP and UDP, and $answered sockperf requests by served.sh; SIGINT stopped both"

start 120
kill -TERM "$run"
finish 0
echo "ok: SIGTERM stopped both"

start 120
kill -KILL "$agent"
finish 1
grep -q "the echo agent (pid $agent) exited, killed by signal KILL; stopping snic_server" \
  "$work/out" || fail "run.sh did not say that the agent died"
echo "ok: the agent's death was reported and the server stopped"
