#!/usr/bin/env bash
# Where snic_server's engine thread spends its time at saturation: one server and agent per
# point, caracal_loadgen's saturation load (run.sh's), then the server is stopped and the
# engine's report is taken from its log. SNIC must be built with -DCARACAL_ENGINE_PROFILE=ON
# (snic_server/src/mqueue_manager/profile.hpp); with PERF (a perf binary) the engine thread is also
# sampled (cpu-clock) during the measured window, and the flat profile is kept.
#
#   bench/compare/engine_profile.sh BUILD_DIR RESULTS_DIR
#
# Knobs (environment): SNIC (default BUILD_DIR's), POINTS ("echo:udp:16384 echo:tcp:16384"),
# DURATION (2), WARMUP (0.5), THREADS (4), LOADGEN_THREADS (8), SAT_CONNECTIONS (8),
# SAT_WINDOW (16), CARACAL_ACCEL (gpu:0), AGENT_QUEUES (8), GPU_WORKERS (0), PERF, ENGINE_THREADS
# (snic_server's engine_threads; unset: the server's default), SPREAD (the UDP listener's
# `spread`, flows or datagrams; unset: the server's default), OPEN_RATE (open loop at this many
# requests per second over the SAT_CONNECTIONS connections instead of saturation), SERVER_CPUS
# and CLIENT_CPUS (taskset CPU lists for the server with its agent, and for the client). With
# several engine threads each
# prints its own report; PERF samples the first, or with PERF_PROCESS=1 every thread of
# snic_server (the report is then sorted by thread name, then symbol).
set -uo pipefail
BUILD=$(realpath "${1:?usage: engine_profile.sh BUILD_DIR RESULTS_DIR}")
RESULTS=${2:?usage: engine_profile.sh BUILD_DIR RESULTS_DIR}
mkdir -p "$RESULTS"
RESULTS=$(realpath "$RESULTS")
SNIC=${SNIC:-"$BUILD/snic_server/snic_server"}
POINTS=${POINTS:-"echo:udp:16384 echo:tcp:16384"}
DURATION=${DURATION:-2}
WARMUP=${WARMUP:-0.5}
THREADS=${THREADS:-4}
LOADGEN_THREADS=${LOADGEN_THREADS:-8}
SAT_CONNECTIONS=${SAT_CONNECTIONS:-8}
SAT_WINDOW=${SAT_WINDOW:-16}
CARACAL_ACCEL=${CARACAL_ACCEL:-gpu:0}
AGENT_QUEUES=${AGENT_QUEUES:-8}
LOADGEN="$BUILD/bench/loadgen/caracal_loadgen"
SECRET="profile-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"

source "$(dirname "$0")/lib.sh"  # wait_for_line

stop() {  # PID...
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "$@"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
}

failed=0
for p in $POINTS; do
  IFS=: read -r handler proto size <<<"$p"
  name="$handler-$proto-$size"
  log="$RESULTS/$name"
  cat >"$log-server.yaml" <<YAML
io_threads: $THREADS
$([ -n "${ENGINE_THREADS:-}" ] && echo "engine_threads: $ENGINE_THREADS")
log_level: warn
control: { listen: 127.0.0.1:0, secret: $SECRET, agent_timeout_ms: 5000 }
services:
  - name: $handler
    max_message_bytes: 16384
    dispatch: round_robin
    listeners:
      - { protocol: udp, listen: 127.0.0.1:0$([ -n "${SPREAD:-}" ] && echo ", spread: $SPREAD") }
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: length_prefixed, prefix_bytes: 4 } }
YAML
  ${SERVER_CPUS:+taskset -c "$SERVER_CPUS"} "$SNIC" --config "$log-server.yaml" \
    --log-level info >"$log-server.log" 2>&1 &
  spid=$!
  wait_for_line "$log-server.log" "serving [0-9]+ service" 20 || { stop "$spid"; failed=$((failed + 1)); continue; }
  control=$(sed -nE 's/.*control endpoint on .* \(port ([0-9]+)\).*/\1/p' "$log-server.log")
  port=$(sed -nE "s#.*listening on $proto/127.0.0.1:0 \\(port ([0-9]+)\\).*#\\1#p" "$log-server.log" | head -1)
  cat >"$log-agent.yaml" <<YAML
agent: profile-$handler
server: 127.0.0.1:$control
secret: $SECRET
accelerator: $CARACAL_ACCEL
transport: shm
log_level: info
cpu: { workers: 1 }
$([ "${CARACAL_ACCEL#gpu}" != "$CARACAL_ACCEL" ] && echo "gpu: { workers: ${GPU_WORKERS:-0} }")
services:
  - { name: $handler, queues: $AGENT_QUEUES, ring_capacity: 512, slot_bytes: 256, max_message_bytes: 16384 }
YAML
  ${SERVER_CPUS:+taskset -c "$SERVER_CPUS"} "$BUILD/examples/$handler/caracal_${handler}_agent" \
    --config "$log-agent.yaml" >"$log-agent.log" 2>&1 &
  apid=$!
  if ! wait_for_line "$log-server.log" "region for service .* attached" 60; then
    stop "$apid" "$spid"
    failed=$((failed + 1))
    continue
  fi
  perf_pid=
  if [ -n "${PERF:-}" ]; then
    if [ -n "${PERF_PROCESS:-}" ]; then
      target=(-p "$spid")
    else
      target=(-t "$(grep -l caracal-engine /proc/"$spid"/task/*/comm | head -1 | cut -d/ -f5)")
    fi
    (sleep "$WARMUP"; exec "$PERF" record -e cpu-clock -F 4000 "${target[@]}" \
      -o "$log-perf.data" -- sleep "$DURATION") >"$log-perf.log" 2>&1 &
    perf_pid=$!
  fi
  load=()
  [ -n "${OPEN_RATE:-}" ] && load=(--mode open --rate "$OPEN_RATE")
  ${CLIENT_CPUS:+taskset -c "$CLIENT_CPUS"} \
    "$LOADGEN" --port "$port" --proto "$proto" --handler "$handler" --size "$size" "${load[@]}" \
    --warmup "$WARMUP" --duration "$DURATION" --connections "$SAT_CONNECTIONS" \
    --window "$SAT_WINDOW" --threads "$LOADGEN_THREADS" --json "$log-loadgen.json" \
    --label "$name" >"$log-loadgen.out" 2>&1 || failed=$((failed + 1))
  [ -n "$perf_pid" ] && wait "$perf_pid"
  stop "$apid" "$spid"
  echo "== $name: $(head -1 "$log-loadgen.out")"
  grep "engine profile" "$log-server.log" || echo "(no engine profile in the server log)"
  if [ -n "$perf_pid" ] && [ -s "$log-perf.data" ]; then
    sort_keys=dso,sym
    [ -n "${PERF_PROCESS:-}" ] && sort_keys=comm,dso,sym
    "$PERF" report -i "$log-perf.data" --stdio --sort "$sort_keys" 2>/dev/null |
      grep -v '^#' | grep -v '^$' | head -${PERF_LINES:-40} >"$log-perf.txt"
    cat "$log-perf.txt"
  fi
done
exit "$failed"
