#!/usr/bin/env bash
# Throughput and server cores against io_threads, for versions of snic_server side by side:
#
#   bench/compare/threads.sh BUILD_DIR RESULTS_DIR NAME=SNIC_BINARY...
#
# For each count of IO_THREADS, each version in turn (the order turned round every other
# count, so that neither always runs first on a fresh machine) runs bench/compare/run.sh on
# Caracal alone with that many I/O threads and a fresh server and agent, into
# RESULTS_DIR/NAME/tCOUNT: HANDLERS at SIZES over UDP and TCP, one point at one connection and
# one at saturation (SAT_CONNECTIONS x SAT_WINDOW). The agents, loadgen and the baselines come
# from BUILD_DIR; each version's server is its SNIC_BINARY. `engine_threads` is left out of the
# config, so each version runs its own default. SIZES_NAME (e.g. SIZES_old="1024") gives one
# version other sizes, and SPREAD_NAME (flows or datagrams) another UDP `spread`, so that one
# binary can run as two versions (flows=BIN datagrams=BIN), GPU_OPTIONS_NAME (run.sh's
# GPU_OPTIONS, e.g. "busy_polls: 0") another agent GPU policy, DISPATCH_NAME (run.sh's DISPATCH)
# another dispatch policy, and CLIENT_NETNS_NAME (run.sh's CLIENT_NETNS: rps or rfs, the client
# in a network namespace of its own; 0, over loopback) another way to the client (loopback=BIN
# veth=BIN CLIENT_NETNS_veth=rps). threads_report.py RESULTS_DIR then writes threads.json,
# threads.md and, with matplotlib, the plots.
#
# Knobs (environment; the rest pass through to run.sh): IO_THREADS ("2 4 8 12 16 24 32"),
# HANDLERS (matvec), SIZES (1024), OPEN_RATES (none; e.g. "500000 1000000"), OPEN_SIZES (the
# sizes of the open-loop points; SIZES), SAT_CONNECTIONS (16), SAT_WINDOW (16),
# LOADGEN_THREADS (16), AGENT_QUEUES (16), DURATION (1), WARMUP (0.3), PIN (halves: the server
# and its agent on the hyperthreads of the first half of the physical cores, the client on the
# rest, through run.sh's SERVER_CPUS and CLIENT_CPUS; server:N: the first N physical cores to
# the server and its agent, the rest to the client, so that a many-core client can hold the
# server to its own limit; server:threads: as server:N with N the count of I/O threads at each
# count, a server of as many cores as threads; unset: anywhere), SAT_PER_THREAD (C: at each
# count, SAT_CONNECTIONS and LOADGEN_THREADS are C times the I/O threads, the load per thread
# held; unset: the same load at every count).
set -uo pipefail
build=$(realpath "${1:?usage: threads.sh BUILD_DIR RESULTS_DIR NAME=SNIC_BINARY...}")
results=${2:?usage: threads.sh BUILD_DIR RESULTS_DIR NAME=SNIC_BINARY...}
shift 2
[ $# -ge 1 ] || { echo "threads.sh: name at least one NAME=SNIC_BINARY" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"  # physical_cores
mkdir -p "$results"

export HANDLERS=${HANDLERS:-matvec}
export SAT_CONNECTIONS=${SAT_CONNECTIONS:-16}
export SAT_WINDOW=${SAT_WINDOW:-16}
export LOADGEN_THREADS=${LOADGEN_THREADS:-16}
export AGENT_QUEUES=${AGENT_QUEUES:-16}
export DURATION=${DURATION:-1}
export WARMUP=${WARMUP:-0.3}
# OPEN_RATES: open-loop points at these request rates at every thread count, for the cores
# that the same load takes (at OPEN_SIZES); no fractions of saturation.
open_sizes=${OPEN_SIZES:-${SIZES:-1024}}
export OPEN_SIZES="" OPEN_FRACTIONS="" LOW_LOAD_ROUNDS=0 SERVERS=caracal
[ -n "${OPEN_RATES:-}" ] && export OPEN_SIZES=$open_sizes OPEN_RATES
unset ENGINE_THREADS
case "${PIN:-}" in
  "" | halves | server:threads) ;;
  server:[1-9]*) ;;
  *) echo "threads.sh: PIN is halves, server:N or server:threads, not '$PIN'" >&2; exit 2 ;;
esac
# pin_cpus COUNT: SERVER_CPUS and CLIENT_CPUS for PIN at COUNT I/O threads (exported).
pin_cpus() {
  [ -n "${PIN:-}" ] || return 0
  local pin=$PIN cores half
  [ "$pin" = server:threads ] && pin=server:$1
  mapfile -t cores < <(physical_cores)
  if [ "$pin" = halves ]; then half=$((${#cores[@]} / 2)); else half=${pin#server:}; fi
  if [ "$half" -le 0 ] || [ "$half" -ge "${#cores[@]}" ]; then
    echo "threads.sh: PIN=$pin leaves no core to the server or the client (${#cores[@]} cores)" >&2
    return 1
  fi
  SERVER_CPUS=$(IFS=,; echo "${cores[*]:0:half}")
  CLIENT_CPUS=$(IFS=,; echo "${cores[*]:half}")
  export SERVER_CPUS CLIENT_CPUS
  echo "threads.sh: the server on CPUs $SERVER_CPUS, the client on $CLIENT_CPUS"
}
case "${SAT_PER_THREAD:-}" in
  "" | [1-9] | [1-9][0-9]) ;;
  *) echo "threads.sh: SAT_PER_THREAD is a count of connections per thread, not '$SAT_PER_THREAD'" >&2
     exit 2 ;;
esac
sizes=${SIZES:-1024}
counts=${IO_THREADS:-"2 4 8 12 16 24 32"}

specs=("$@")
for spec in "${specs[@]}"; do
  [ -x "${spec#*=}" ] || { echo "threads.sh: ${spec#*=} is not an executable" >&2; exit 2; }
done
failed=0
turn=0
for n in $counts; do
  order=("${specs[@]}")
  if [ $((turn % 2)) -eq 1 ]; then
    order=()
    for ((i = ${#specs[@]} - 1; i >= 0; i--)); do order+=("${specs[i]}"); done
  fi
  turn=$((turn + 1))
  pin_cpus "$n" || exit 2
  if [ -n "${SAT_PER_THREAD:-}" ]; then
    export SAT_CONNECTIONS=$((SAT_PER_THREAD * n)) LOADGEN_THREADS=$((SAT_PER_THREAD * n))
  fi
  for spec in "${order[@]}"; do
    name=${spec%%=*}
    var="SIZES_$name"
    spread_var="SPREAD_$name"
    gpu_var="GPU_OPTIONS_$name"
    netns_var="CLIENT_NETNS_$name"
    dispatch_var="DISPATCH_$name"
    echo "== $name, io_threads $n"
    THREADS=$n SIZES=${!var:-$sizes} SPREAD=${!spread_var:-${SPREAD:-}} \
      GPU_OPTIONS=${!gpu_var:-${GPU_OPTIONS:-}} CLIENT_NETNS=${!netns_var:-${CLIENT_NETNS:-0}} \
      DISPATCH=${!dispatch_var:-${DISPATCH:-}} SNIC=${spec#*=} \
      CARACAL_COMMIT="$name" \
      "$here/run.sh" "$build" "$results/$name/t$n" 2>&1 | grep -E 'saturation|latency|done|run.sh' ||
      failed=$((failed + 1))
  done
done
python3 "$here/threads_report.py" "$results" || failed=$((failed + 1))
exit "$failed"
