#!/usr/bin/env bash
# Builds snic_server and the echo agent (Release, in build/), then starts snic_server with
# configs/echo-server.yaml and the echo agent (configs/echo-agent.yaml) on the best accelerator
# present, over the embedded shm transport. Extra arguments go to snic_server (for instance
# --log-level debug).
#
# It watches what it started: when the server or the agent exits, it says which one and how,
# stops the other and exits non-zero. Ctrl-C (SIGINT) or SIGTERM stops both, and it exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h | --help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac

scripts/deps.sh run

# Every option this command relies on is set here, whatever an earlier configure of build/ left
# in its cache (scripts/test.sh configures the same folder with the tests on).
# CARACAL_WERROR (ON or OFF), when set, is passed on; unset, the cache keeps what the last
# configure chose (scripts/test.sh turns it on), so neither command recompiles the other's work.
# The generator is CMake's default (Unix Makefiles, or CMAKE_GENERATOR), as for a user who types
# the two cmake lines; a build/ made earlier keeps the generator it was made with.
mkdir -p build
log=build/configure-run.log
werror=()
[ -n "${CARACAL_WERROR:-}" ] && werror=(-DCARACAL_WERROR="$CARACAL_WERROR")
if ! cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCARACAL_BUILD_TESTS=OFF \
  -DCARACAL_BUILD_BENCH=OFF -DCARACAL_SANITIZE= -DCARACAL_ENGINE_PROFILE=OFF "${werror[@]}" \
  >"$log" 2>&1; then
  cat "$log" >&2
  echo "run.sh: configuring the build failed; CMake's output is above and in $log" >&2
  exit 1
fi
# The one line that says which optional parts (CUDA, DPDK, RDMA) this build found.
sed -n 's/^-- \(Caracal: .*\)/\1/p' "$log"
cmake --build build -j "$(nproc)" --target snic_server caracal_echo_agent

metrics=127.0.0.1:9100
server=
agent=
stopping=0
# stop_one PID: SIGINT, then up to 10 s to exit, then SIGKILL.
stop_one() {
  kill -INT "$1" 2>/dev/null || return 0
  for _ in $(seq 100); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
# The agent first, so it detaches from a server that is still there to confirm it.
stop_all() {
  [ -n "$agent" ] && stop_one "$agent"
  [ -n "$server" ] && stop_one "$server"
  return 0
}
on_signal() {
  stopping=1
  echo "run.sh: $1: stopping the server and the agent"
  stop_all
  exit 0
}
trap 'on_signal SIGINT' INT
trap 'on_signal SIGTERM' TERM
trap stop_all EXIT

# how STATUS: "exit status N", or the signal that ended a process (bash reports it as 128+N).
how() {
  if [ "$1" -gt 128 ]; then
    echo "killed by signal $(kill -l "$(($1 - 128))")"
  else
    echo "exit status $1"
  fi
}

# Each process's lines carry its name, as in a process manager's output. Each runs in a session
# of its own (setsid), so that Ctrl-C reaches this script alone and it stops them in order.
setsid build/snic_server/snic_server --config configs/echo-server.yaml "$@" \
  > >(sed -u 's/^/server | /') 2>&1 &
server=$!
# The agent retries until the control endpoint is up; starting it once the server serves
# (its metrics answer) spares the log those retries.
for _ in $(seq 100); do
  curl -fs -o /dev/null "http://$metrics/metrics" 2>/dev/null && break
  kill -0 "$server" 2>/dev/null || break
  sleep 0.1
done
setsid build/examples/echo/caracal_echo_agent --config configs/echo-agent.yaml \
  > >(sed -u 's/^/agent  | /') 2>&1 &
agent=$!

# Ready when the server counts the agent as registered.
ready=0
for _ in $(seq 100); do
  # Read whole, then matched: grep -q would close the pipe on curl, which pipefail reports.
  if [[ "$(curl -fs "http://$metrics/metrics" 2>/dev/null)" == *$'\ncaracal_agents 1'* ]]; then
    ready=1
    break
  fi
  kill -0 "$server" 2>/dev/null && kill -0 "$agent" 2>/dev/null || break
  sleep 0.1
done
if [ $ready = 1 ]; then
  cat <<'TRY'

Caracal is serving the echo handler. Try it from another terminal:
  echo hello | nc -q1 127.0.0.1 7002                        # TCP, one message per line
  echo hello | socat - UDP:127.0.0.1:7000                   # UDP, one datagram per message
  sockperf ping-pong -i 127.0.0.1 -p 7000 -m 64 -t 5        # UDP latency
  sockperf ping-pong --tcp -i 127.0.0.1 -p 7003 -m 64 -t 5  # TCP latency (64-byte messages)
  curl -s 127.0.0.1:9100/metrics                            # Prometheus metrics
Ctrl-C stops the server and the agent.
TRY
elif kill -0 "$server" 2>/dev/null && kill -0 "$agent" 2>/dev/null; then
  echo "run.sh: the agent has not registered with the server after 10 s; still watching both"
fi

# Whichever exits first, the other is stopped: a server with no agent only answers errors, and
# an agent with no server has nothing to serve.
set +e
wait -n -p died "$server" "$agent"
status=$?
set -e
[ $stopping = 1 ] && exit 0
if [ "${died:-}" = "$server" ]; then
  echo "run.sh: snic_server (pid $server) exited, $(how $status); stopping the echo agent" >&2
else
  echo "run.sh: the echo agent (pid $agent) exited, $(how $status); stopping snic_server" >&2
fi
stop_all
exit 1
