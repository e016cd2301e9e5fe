#!/usr/bin/env bash
# One server driving every GPU of the machine, against the host-centric server on the same GPUs:
#
#   bench/compare/gpus.sh BUILD_DIR RESULTS_DIR [--cpu-only]
#
# The handler (HANDLER) is matvec with ROUNDS networks per vector (examples/matvec: the GPU's
# time per request grows with it, and caracal_loadgen checks every reply against the CPU
# reference with the same rounds), or face: face verification (examples/face_verify, 4104-byte
# requests) with the references in a memcached of the run's own ($MEMCACHED or memcached from
# PATH, MEMCACHED_THREADS threads, FACE_PERSONS references), which every agent's client queues
# and the host-centric server's I/O threads call (loadgen checks every verdict against the CPU
# reference). For each count n of accelerators in COUNTS (1 to the GPUs that `nvidia-smi -L`
# lists):
#   caracal       one snic_server (io_threads THREADS, service `matvec` with DISPATCH) and n
#                 caracal_matvec_agent processes, agent i on gpu:i (cpu with --cpu-only), each
#                 registering AGENT_QUEUES queues over shm: one service dispatched across all of
#                 them
#   host_centric  caracal_host_centric_server --gpus 0,...,n-1 (THREADS I/O threads, a batching
#                 thread per GPU, batches of BATCH); left out with --cpu-only or without CUDA
# and for each protocol of PROTOS: throughput at saturation (closed loop, SAT_CONNECTIONS x
# SAT_WINDOW from LOADGEN_THREADS threads), then for UDP an open-loop sweep at OPEN_FRACTIONS of
# that saturation (latency against load). With two accelerators or more, two more experiments
# on Caracal (unequal with matvec only: its agent is the one that can be slowed):
#   unequal  two agents, the second slowed on purpose (--delay-us SLOW_DELAY_US per request, the
#            answer unchanged), under round_robin and under least_loaded: how the requests
#            spread (each agent's answered requests, from snic_server's per-queue
#            caracal_queue_answered_requests) and the throughput
#   loss     LOSS_AGENTS agents (COUNTS' largest, at least 2) under closed-loop TCP load for
#            LOSS_DURATION s; the last agent is killed (SIGKILL) LOSS_KILL_AT s after the load
#            starts. The service answers failed requests with "ERROR {reason}", which loadgen
#            counts as error replies (--error-prefix); its timeline (--timeline-ms) and the
#            server's per-agent counters sampled every SAMPLE_MS ms show the survivors'
#            throughput over time, and every request must get a reply or an error reply
#            (no wrong reply, no broken connection, none unanswered).
# CPU cores of each server's processes (for Caracal snic_server and its agents) are recorded
# with every point, as run.sh does, and beside them the cores of the face handler's memcached
# and of the whole machine (from /proc/stat), so that a point limited by the machine's CPUs
# rather than by the server shows as such. For Caracal, snic_server's metrics page is kept from
# before and after each point (raw/NAME-metrics-before.txt, raw/NAME-metrics.txt).
#
# Results: RESULTS_DIR/raw/ (loadgen JSON, configs, logs, metric samples, points.jsonl,
# run.json), then gpus_report.py writes RESULTS_DIR/gpus.json (every point with the machine,
# GPUs, date and CARACAL_COMMIT), gpus.md (the tables) and, with matplotlib, the plots.
#
# Knobs (environment; GPU defaults, then --cpu-only's): HANDLER (matvec), FACE_PERSONS (10000),
# MEMCACHED_THREADS (4), FACE_TIMEOUT_MS (1000), GPUS (accelerators: nvidia-smi -L's count; 2),
# COUNTS ("1 2 ... GPUS"), SERVERS ("caracal host_centric"; "caracal"), ROUNDS (32; 1), SIZE
# (1024; 64), PROTOS ("udp tcp"), THREADS (8; 2), ENGINE_THREADS (snic_server's engine_threads;
# unset: left out), AGENT_QUEUES (64; 2), GPU_BURST (the agents' gpu.burst and cpu.burst: 1, so
# that a reply is published as soon as it is made, not after a burst of slow requests),
# GPU_OPTIONS (more keys of the agents' gpu map, e.g. "busy_polls: 0"), SPREAD (Caracal's UDP
# listener's `spread`, flows or datagrams; unset: the server's default), BATCH (64),
# BATCH_TIMEOUT_US (20), DISPATCH (least_loaded), SAT_CONNECTIONS (16; 2), SAT_WINDOW (16; 4),
# LOADGEN_THREADS (8; 2), DURATION (1.5; 0.4), WARMUP (0.5; 0.2), OPEN_FRACTIONS ("0.25 0.5 0.75
# 0.9"; "0.1"), SLOW_DELAY_US (1000; 2000), LOSS_DURATION (3; 1.6), LOSS_KILL_AT (1.5; 0.8),
# SAMPLE_MS (100), EXPERIMENTS ("scaling unequal loss"), SERVER_CPUS, CLIENT_CPUS and
# MEMCACHED_CPUS (taskset CPU lists: the servers with their agents, caracal_loadgen, and face's
# memcached, each kept to its own CPUs; unset: anywhere).
set -uo pipefail

BUILD=$(realpath "${1:?usage: gpus.sh BUILD_DIR RESULTS_DIR [--cpu-only]}")
RESULTS=${2:?usage: gpus.sh BUILD_DIR RESULTS_DIR [--cpu-only]}
CPU_ONLY=0
[ "${3:-}" = "--cpu-only" ] && CPU_ONLY=1
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
mkdir -p "$RESULTS/raw"
RESULTS=$(realpath "$RESULTS")
RAW="$RESULTS/raw"
source "$HERE/lib.sh"  # wait_for_line, pid_ticks, machine_ticks, start_memcached, face_destinations, client_queues
# The prefixes that keep the servers (with their agents) and the client to their CPUs.
SERVER_PIN=()
CLIENT_PIN=()
[ -n "${SERVER_CPUS:-}" ] && SERVER_PIN=(taskset -c "$SERVER_CPUS")
[ -n "${CLIENT_CPUS:-}" ] && CLIENT_PIN=(taskset -c "$CLIENT_CPUS")

LOADGEN="$BUILD/bench/loadgen/caracal_loadgen"
HC_SERVER="$BUILD/bench/baselines/host_centric_server/caracal_host_centric_server"
SNIC="$BUILD/snic_server/snic_server"
HANDLER=${HANDLER:-matvec}
FACE_LOADER="$BUILD/examples/face_verify/caracal_face_loader"
FACE_PERSONS=${FACE_PERSONS:-10000}
MEMCACHED_THREADS=${MEMCACHED_THREADS:-4}
FACE_TIMEOUT_MS=${FACE_TIMEOUT_MS:-1000}
case "$HANDLER" in
  matvec) AGENT="$BUILD/examples/matvec/caracal_matvec_agent" needs=() ;;
  face)
    AGENT="$BUILD/examples/face_verify/caracal_face_agent"
    MEMCACHED=${MEMCACHED:-$(command -v memcached || true)}
    [ -n "$MEMCACHED" ] || { echo "gpus.sh: face needs memcached (install it or set MEMCACHED)" >&2; exit 2; }
    needs=("$FACE_LOADER" "$MEMCACHED")
    ;;
  *) echo "gpus.sh: HANDLER is matvec or face, not '$HANDLER'" >&2; exit 2 ;;
esac
for bin in "$LOADGEN" "$SNIC" "$AGENT" "${needs[@]}"; do
  [ -x "$bin" ] || { echo "gpus.sh: $bin is missing (build the benchmarks first)" >&2; exit 2; }
done

if [ "$CPU_ONLY" -eq 1 ]; then
  GPUS=${GPUS:-2}
  SERVERS=${SERVERS:-caracal}
  d_rounds=1 d_size=64 d_threads=2 d_queues=2 d_conns=2 d_window=4 d_lthreads=2 d_duration=0.4
  d_warmup=0.2 d_fractions="0.1" d_slow=2000 d_loss_duration=1.6 d_kill_at=0.8
else
  if [ -z "${GPUS:-}" ]; then
    GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
    [ "${GPUS:-0}" -gt 0 ] || { echo "gpus.sh: nvidia-smi lists no GPU (--cpu-only runs on CPU agents)" >&2; exit 2; }
  fi
  if [ -z "${SERVERS:-}" ]; then
    SERVERS=caracal
    if [ -x "$HC_SERVER" ]; then
      SERVERS="caracal host_centric"
    else
      echo "gpus.sh: $HC_SERVER is missing (a build without CUDA); host_centric is left out" >&2
    fi
  fi
  d_rounds=32 d_size=1024 d_threads=8 d_queues=64 d_conns=16 d_window=16 d_lthreads=8
  d_duration=1.5 d_warmup=0.5 d_fractions="0.25 0.5 0.75 0.9" d_slow=1000 d_loss_duration=3
  d_kill_at=1.5
fi
COUNTS=${COUNTS:-$(seq -s ' ' 1 "$GPUS")}
ROUNDS=${ROUNDS:-$d_rounds}
SIZE=${SIZE:-$d_size}
PROTOS=${PROTOS:-"udp tcp"}
THREADS=${THREADS:-$d_threads}
ENGINE_THREADS=${ENGINE_THREADS:-}
AGENT_QUEUES=${AGENT_QUEUES:-$d_queues}
GPU_BURST=${GPU_BURST:-1}
BATCH=${BATCH:-64}
BATCH_TIMEOUT_US=${BATCH_TIMEOUT_US:-20}
DISPATCH=${DISPATCH:-least_loaded}
SAT_CONNECTIONS=${SAT_CONNECTIONS:-$d_conns}
SAT_WINDOW=${SAT_WINDOW:-$d_window}
LOADGEN_THREADS=${LOADGEN_THREADS:-$d_lthreads}
DURATION=${DURATION:-$d_duration}
WARMUP=${WARMUP:-$d_warmup}
OPEN_FRACTIONS=${OPEN_FRACTIONS-$d_fractions}
SLOW_DELAY_US=${SLOW_DELAY_US:-$d_slow}
LOSS_DURATION=${LOSS_DURATION:-$d_loss_duration}
LOSS_KILL_AT=${LOSS_KILL_AT:-$d_kill_at}
SAMPLE_MS=${SAMPLE_MS:-100}
EXPERIMENTS=${EXPERIMENTS:-"scaling unequal loss"}
if [ "$HANDLER" = face ]; then
  SIZE=4104  # a person id and a 64x64 image (examples/face_verify/face_format.hpp)
  MAX_MESSAGE=8192
else
  MAX_MESSAGE=$((SIZE > 1024 ? SIZE : 1024))
fi
largest=0
for n in $COUNTS; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] && [ "$n" -le "$GPUS" ] ||
    { echo "gpus.sh: COUNTS has $n, not a count of 1 to $GPUS accelerators" >&2; exit 2; }
  [ "$n" -gt "$largest" ] && largest=$n
done
LOSS_AGENTS=${LOSS_AGENTS:-$((largest > 2 ? largest : 2))}

PIDS=()
SERVER_PIDS=()
POINTS="$RAW/points.jsonl"
: >"$POINTS"
SECRET="gpus-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
CLK_TCK=$(getconf CLK_TCK)
T0=$(date +%s)
FAILED=0
log() { echo "[$(($(date +%s) - T0))s] $*" >&2; }

stop_servers() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  PIDS=()
  SERVER_PIDS=()
}
MC_PID=
trap 'stop_servers; [ -z "$MC_PID" ] || kill -KILL "$MC_PID" 2>/dev/null' EXIT


# answered_by_agent FILE: "agent<TAB>answered" lines from a metrics page that save_metrics
# kept (snic_server's per-queue caracal_queue_answered_requests, summed per agent); none
# without it.
answered_by_agent() {
  [ -f "$1" ] && python3 "$HERE/gpus_report.py" --scrape "$1"
}

# start_caracal NAME AGENTS POLICY [SLOW_AGENT]: snic_server and AGENTS agents (agent i on
# accelerator i), the last one slowed by SLOW_DELAY_US when SLOW_AGENT is "slow". Sets
# UDP_PORT, TCP_PORT, METRICS_PORT, SERVER_PIDS (the server first) and AGENT_PIDS.
start_caracal() {
  local name=$1 agents=$2 policy=$3 slow=${4:-} log="$RAW/$1"
  SERVER_PIDS=()
  AGENT_PIDS=()
  cat >"$log-server.yaml" <<YAML
io_threads: $THREADS
$([ -n "$ENGINE_THREADS" ] && echo "engine_threads: $ENGINE_THREADS")
log_level: warn
control: { listen: 127.0.0.1:0, secret: $SECRET, heartbeat_interval_ms: 100, agent_timeout_ms: 5000 }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: $HANDLER
    max_message_bytes: $MAX_MESSAGE
    dispatch: $policy
    listeners:
      - { protocol: udp, listen: 127.0.0.1:0, error_reply: 'ERROR {reason}'$([ -n "${SPREAD:-}" ] && echo ", spread: $SPREAD") }
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: length_prefixed, prefix_bytes: 4 }, error_reply: 'ERROR {reason}' }
$(face_destinations "$HANDLER")
YAML
  "${SERVER_PIN[@]}" "$SNIC" --config "$log-server.yaml" --log-level info >"$log-server.log" 2>&1 &
  local spid=$!
  PIDS+=("$spid")
  wait_for_line "$log-server.log" "serving [0-9]+ service" 20 || return 1
  local control
  control=$(sed -nE 's/.*control endpoint on .* \(port ([0-9]+)\).*/\1/p' "$log-server.log")
  UDP_PORT=$(sed -nE 's#.*listening on udp/127.0.0.1:0 \(port ([0-9]+)\).*#\1#p' "$log-server.log" | head -1)
  TCP_PORT=$(sed -nE 's#.*listening on tcp/127.0.0.1:0 \(port ([0-9]+)\).*#\1#p' "$log-server.log" | head -1)
  METRICS_PORT=$(sed -nE 's/.*metrics on http:.*:([0-9]+)\/metrics.*/\1/p' "$log-server.log")
  SERVER_PIDS=("$spid")
  local i accel extra
  # The agents start together (a GPU agent takes seconds to set up its device), then each must
  # be serving and attached.
  for ((i = 0; i < agents; i++)); do
    accel="gpu:$i"
    [ "$CPU_ONLY" -eq 1 ] && accel=cpu
    extra=()
    [ "$HANDLER" = matvec ] && extra=(--rounds "$ROUNDS")
    [ "$slow" = slow ] && [ "$i" -eq $((agents - 1)) ] && extra+=(--delay-us "$SLOW_DELAY_US")
    cat >"$log-agent$i.yaml" <<YAML
agent: acc$i
server: 127.0.0.1:$control
secret: $SECRET
accelerator: $accel
transport: shm
log_level: info
cpu: { workers: 1, burst: $GPU_BURST }
$([ "$CPU_ONLY" -eq 0 ] && echo "gpu: { workers: 0, burst: $GPU_BURST${GPU_OPTIONS:+, $GPU_OPTIONS} }")
reconnect_interval_ms: 100
services:
  - { name: $HANDLER, queues: $AGENT_QUEUES, ring_capacity: 512, slot_bytes: 256, max_message_bytes: $MAX_MESSAGE$(client_queues "$HANDLER") }
YAML
    "${SERVER_PIN[@]}" "$AGENT" --config "$log-agent$i.yaml" "${extra[@]}" >"$log-agent$i.log" 2>&1 &
    AGENT_PIDS+=("$!")
    PIDS+=("$!")
  done
  for ((i = 0; i < agents; i++)); do
    wait_for_line "$log-agent$i.log" "serving [0-9]+ service" 60 || return 1
    wait_for_line "$log-server.log" "agent 'acc$i' region for service .* attached" 20 || return 1
  done
  SERVER_PIDS+=("${AGENT_PIDS[@]}")
}


# start_host_centric NAME GPUS: the host-centric server on GPUs 0..GPUS-1.
start_host_centric() {
  local name=$1 gpus=$2 log="$RAW/$1" extra=(--matvec-rounds "$ROUNDS")
  [ "$HANDLER" = face ] &&
    extra=(--memcached "127.0.0.1:$MC_PORT" --memcached-timeout-ms "$FACE_TIMEOUT_MS")
  "${SERVER_PIN[@]}" "$HC_SERVER" --handler "$HANDLER" --threads "$THREADS" \
    --max-message-bytes "$MAX_MESSAGE" \
    --batch "$BATCH" --batch-timeout-us "$BATCH_TIMEOUT_US" --gpus "$(seq -s, 0 $((gpus - 1)))" \
    "${extra[@]}" >"$log-server.log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  wait_for_line "$log-server.log" "^listening udp" 30 || return 1
  UDP_PORT=$(sed -nE 's/^listening udp ([0-9]+) tcp ([0-9]+).*/\1/p' "$log-server.log")
  TCP_PORT=$(sed -nE 's/^listening udp ([0-9]+) tcp ([0-9]+).*/\2/p' "$log-server.log")
  METRICS_PORT=
  SERVER_PIDS=("$pid")
}

# save_metrics FILE: snic_server's whole metrics page now (the report takes the means of its
# latency histograms over a point from the pages before and after it).
save_metrics() {
  python3 "$HERE/gpus_report.py" --page "http://127.0.0.1:$METRICS_PORT/metrics" >"$1" \
    2>/dev/null || rm -f "$1"
}

# cores_over TICKS FROM TO: TICKS of CPU time over the wall time FROM to TO (date +%s.%N), in
# cores.
cores_over() {
  awk -v t="$1" -v hz="$CLK_TCK" -v a="$2" -v b="$3" 'BEGIN { printf "%.3f", (t / hz) / (b - a) }'
}

# point EXPERIMENT SERVER COUNT PROTO KIND POLICY LOADGEN_ARGS...: one loadgen run, with the
# server's cores over it and, for Caracal, each agent's answered requests; a line of
# points.jsonl.
point() {
  local experiment=$1 server=$2 count=$3 proto=$4 kind=$5 policy=$6
  shift 6
  local port=$UDP_PORT
  [ "$proto" = tcp ] && port=$TCP_PORT
  local name="$experiment-$server-n$count-$proto-$kind${policy:+-$policy}"
  local t0 t1 m0 m1 all0 all1 w0 w1 rc=0 before="" after="" agents="{}"
  if [ -n "$METRICS_PORT" ]; then
    save_metrics "$RAW/$name-metrics-before.txt"
    before=$(answered_by_agent "$RAW/$name-metrics-before.txt")
  fi
  t0=$(pid_ticks "${SERVER_PIDS[@]}")
  m0=$(pid_ticks $MC_PID)
  all0=$(machine_ticks)
  w0=$(date +%s.%N)
  # ON_LOAD_START, when set, names a command started (in the background) as the load starts.
  local hook=
  if [ -n "${ON_LOAD_START:-}" ]; then
    $ON_LOAD_START &
    hook=$!
  fi
  local work=(--matvec-rounds "$ROUNDS")
  [ "$HANDLER" = face ] && work=(--face-persons "$FACE_PERSONS")
  "${CLIENT_PIN[@]}" "$LOADGEN" --port "$port" --proto "$proto" --handler "$HANDLER" \
    --size "$SIZE" "${work[@]}" --warmup "$WARMUP" --duration "$DURATION" \
    --json "$RAW/$name.json" --label "$name" "$@" >"$RAW/$name.out" 2>&1 || rc=$?
  w1=$(date +%s.%N)
  t1=$(pid_ticks "${SERVER_PIDS[@]}")
  m1=$(pid_ticks $MC_PID)
  all1=$(machine_ticks)
  [ -z "$hook" ] || wait "$hook"
  if [ -n "$METRICS_PORT" ]; then
    save_metrics "$RAW/$name-metrics.txt"
    after=$(answered_by_agent "$RAW/$name-metrics.txt")
    # Answered per agent over the point (warm-up included), as JSON.
    agents=$(awk -F'\t' 'NR == FNR { b[$1] = $2; next }
      { s = s (s == "" ? "" : ",") sprintf("\"%s\":%d", $1, $2 - b[$1]) }
      END { printf "{%s}", s }' <(printf '%s\n' "$before") <(printf '%s\n' "$after"))
  fi
  local cores mc_cores="null"
  cores=$(cores_over $((t1 - t0)) "$w0" "$w1")
  [ -n "$MC_PID" ] && mc_cores=$(cores_over $((m1 - m0)) "$w0" "$w1")
  printf '{"experiment":"%s","server":"%s","accelerators":%d,"proto":"%s","size":%d,"kind":"%s","policy":"%s","loadgen_rc":%d,"cpu_cores":%s,"memcached_cores":%s,"machine_cores":%s,"wall_s":%s,"answered_by_agent":%s,"json":"%s"}\n' \
    "$experiment" "$server" "$count" "$proto" "$SIZE" "$kind" "$policy" "$rc" "$cores" \
    "$mc_cores" "$(cores_over $((all1 - all0)) "$w0" "$w1")" \
    "$(awk -v a="$w0" -v b="$w1" 'BEGIN { printf "%.3f", b - a }')" "$agents" "$name.json" >>"$POINTS"
  log "$name: $(head -1 "$RAW/$name.out") [server cores $cores${MC_PID:+, memcached $mc_cores}]${METRICS_PORT:+ answered $agents}"
  [ "$rc" -eq 0 ] || FAILED=$((FAILED + 1))
}

SAT=(--connections "$SAT_CONNECTIONS" --window "$SAT_WINDOW" --threads "$LOADGEN_THREADS")

# saturation_rps NAME: throughput of a saturation point's JSON.
saturation_rps() {
  sed -nE 's/^ *"throughput_rps": ([0-9.]+).*/\1/p' "$RAW/$1.json" 2>/dev/null | head -1
}

has() { case " $1 " in *" $2 "*) return 0 ;; esac; return 1; }

[ "$HANDLER" = face ] && { start_memcached || exit 1; }

# Throughput (and latency against load) against the number of accelerators.
if has "$EXPERIMENTS" scaling; then
  for n in $COUNTS; do
    for server in $SERVERS; do
      log "== scaling: $server on $n accelerator(s)"
      policy=
      if [ "$server" = caracal ]; then
        policy=$DISPATCH
        start_caracal "scaling-caracal-n$n" "$n" "$DISPATCH" || { FAILED=$((FAILED + 1)); stop_servers; continue; }
      else
        start_host_centric "scaling-host_centric-n$n" "$n" || { FAILED=$((FAILED + 1)); stop_servers; continue; }
      fi
      for proto in $PROTOS; do
        point scaling "$server" "$n" "$proto" saturation "$policy" "${SAT[@]}"
        [ "$proto" = udp ] || continue
        sat=$(saturation_rps "scaling-$server-n$n-$proto-saturation${policy:+-$policy}")
        [ -n "$sat" ] && awk -v s="$sat" 'BEGIN { exit !(s > 10) }' || continue
        for f in $OPEN_FRACTIONS; do
          rate=$(awk -v s="$sat" -v f="$f" 'BEGIN { printf "%d", s * f }')
          point scaling "$server" "$n" "$proto" "open-$f" "$policy" --mode open --rate "$rate" "${SAT[@]}"
        done
      done
      stop_servers
    done
  done
fi

# Two agents of unequal speed, under each policy.
if has "$EXPERIMENTS" unequal && [ "$GPUS" -ge 2 ] && [ "$HANDLER" = matvec ]; then
  for policy in round_robin least_loaded; do
    log "== unequal: 2 agents, the second slowed by $SLOW_DELAY_US us per request, $policy"
    start_caracal "unequal-$policy" 2 "$policy" slow || { FAILED=$((FAILED + 1)); stop_servers; continue; }
    point unequal caracal 2 udp saturation "$policy" "${SAT[@]}"
    stop_servers
  done
fi

# An agent lost under load.
if has "$EXPERIMENTS" loss && [ "$GPUS" -ge 2 ]; then
  log "== loss: $LOSS_AGENTS agents, the last killed ${LOSS_KILL_AT}s into ${LOSS_DURATION}s of TCP load"
  if start_caracal loss "$LOSS_AGENTS" "$DISPATCH" && [ "$LOSS_AGENTS" -ge 2 ]; then
    python3 "$HERE/gpus_report.py" --sample "http://127.0.0.1:$METRICS_PORT/metrics" \
      "$RAW/loss-samples.jsonl" "$SAMPLE_MS" &
    sampler=$!
    victim=${AGENT_PIDS[$((LOSS_AGENTS - 1))]}
    kill_victim() {
      sleep "$LOSS_KILL_AT"
      kill -KILL "$victim"
      date +%s.%N >"$RAW/loss-killed-at.txt"
    }
    # Unanswered requests fail the point (--strict): every request must get a reply or an error
    # reply. The measured window is the whole run (no warm-up).
    ON_LOAD_START=kill_victim WARMUP=0 DURATION=$LOSS_DURATION point loss caracal \
      "$LOSS_AGENTS" tcp closed "$DISPATCH" "${SAT[@]}" --error-prefix "ERROR " \
      --timeline-ms "$SAMPLE_MS" --strict --timeout-ms 10000
    sleep 0.3
    kill -TERM "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null
    grep -E "acc$((LOSS_AGENTS - 1))' (lost|.*failed)" "$RAW/loss-server.log" >"$RAW/loss-events.txt" || true
    grep -E "request\(s\) in flight failed" "$RAW/loss-server.log" >>"$RAW/loss-events.txt" || true
  else
    FAILED=$((FAILED + 1))
  fi
  stop_servers
fi

gpu_list=$( (nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>/dev/null ||
  true) | python3 -c 'import json, sys; print(json.dumps([l.strip() for l in sys.stdin if l.strip()]))')
{
  echo "{"
  echo "  \"date_utc\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
  echo "  \"commit\": \"${CARACAL_COMMIT:-$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo unknown)}\","
  echo "  \"cpu_only\": $([ "$CPU_ONLY" -eq 1 ] && echo true || echo false),"
  echo "  \"gpus\": $gpu_list,"
  echo "  \"accelerators\": $GPUS,"
  echo "  \"cpu_model\": \"$(sed -nE 's/^model name\s*: (.*)/\1/p' /proc/cpuinfo | head -1)\","
  echo "  \"online_cpus\": $(nproc --all),"
  echo "  \"kernel\": \"$(uname -sr)\","
  echo "  \"hostname\": \"$(hostname)\","
  echo "  \"servers\": \"$SERVERS\","
  echo "  \"params\": {\"handler\": \"$HANDLER\", \"face_persons\": $FACE_PERSONS, \"memcached_threads\": $MEMCACHED_THREADS, \"counts\": \"$COUNTS\", \"rounds\": $ROUNDS, \"size\": $SIZE, \"protos\": \"$PROTOS\", \"threads\": $THREADS, \"engine_threads\": \"${ENGINE_THREADS:-default}\", \"agent_queues\": $AGENT_QUEUES, \"gpu_burst\": $GPU_BURST, \"gpu_options\": \"${GPU_OPTIONS:-}\", \"spread\": \"${SPREAD:-default}\", \"batch\": $BATCH, \"batch_timeout_us\": $BATCH_TIMEOUT_US, \"dispatch\": \"$DISPATCH\", \"sat_connections\": $SAT_CONNECTIONS, \"sat_window\": $SAT_WINDOW, \"loadgen_threads\": $LOADGEN_THREADS, \"duration_s\": $DURATION, \"warmup_s\": $WARMUP, \"open_fractions\": \"$OPEN_FRACTIONS\", \"slow_delay_us\": $SLOW_DELAY_US, \"loss_agents\": $LOSS_AGENTS, \"loss_duration_s\": $LOSS_DURATION, \"loss_kill_at_s\": $LOSS_KILL_AT, \"sample_ms\": $SAMPLE_MS, \"experiments\": \"$EXPERIMENTS\", \"server_cpus\": \"${SERVER_CPUS:-}\", \"client_cpus\": \"${CLIENT_CPUS:-}\", \"memcached_cpus\": \"${MEMCACHED_CPUS:-}\"},"
  echo "  \"failed_points\": $FAILED"
  echo "}"
} >"$RAW/run.json"
python3 "$HERE/gpus_report.py" "$RESULTS" || FAILED=$((FAILED + 1))
log "done: $RESULTS/gpus.json, $RESULTS/gpus.md ($FAILED failed)"
[ "$FAILED" -eq 0 ]
