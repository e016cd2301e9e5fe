#!/usr/bin/env bash
# One snic_server of many I/O threads against several of few threads each, at once on one
# machine: whether what a request costs a server's CPUs as it grows comes from the server (its
# threads sharing its state) or from the machine (the kernel's shared state, caches, the GPUs):
#
#   bench/compare/instances.sh BUILD_DIR RESULTS_DIR [--cpu-only]
#
# Each layout of LAYOUTS is NxT (N snic_servers of T I/O threads each, their clients all
# loading them at once) or NxT/ns (the same, each server with its agents and its client in a
# network namespace of its own, with its own loopback: no routes, devices or sockets in common
# with the other servers), either followed by +spinK or +streamK: K more cores kept busy
# meanwhile by processes that share nothing with the servers but the machine (spin: a loop in
# registers, as a busy core draws on the processor's power and clock; stream: dd writing
# 256 MiB buffers, as a busy core draws on the shared cache and memory bandwidth). Server i of a layout serves matvec over UDP and length-prefixed TCP
# with T / THREADS_PER_AGENT agents (at least one) of AGENT_QUEUES queues each, the agents of
# the whole layout dealt over the GPUs in turn (cpu with --cpu-only); so 1x12 and 3x4 put the
# same agents on the same GPUs. With PIN (the default), server i with its agents runs on the
# physical cores i*T to (i+1)*T - 1, and its caracal_loadgen on its share of the cores that no
# layout gives a server (contiguous, N shares). Each round runs every layout in turn (the order
# turned round every other round) with fresh servers: for each protocol of PROTOS, a closed
# loop of CONNS_PER_THREAD x T connections x SAT_WINDOW in flight from as many client threads
# per server, all clients started together. Every point records each server's throughput,
# the cores of its processes and how busy its CPUs were (whatever ran there, the kernel's work
# for its packets too). With PIN, the last physical core runs a probe: a loop of fixed work,
# timed over each point's measured window and once with the machine idle before each layout
# starts; its rate under load over its idle rate tells whether a core of this machine does less
# work per second when the others are busy (a processor's clock falls as more of its cores
# run). The hogs take the cores before the probe's, the clients the rest.
#
# Results: RESULTS_DIR/raw/ (loadgen JSON, configs, logs, points.jsonl), then
# instances_report.py writes RESULTS_DIR/instances.json and instances.md: per layout and
# protocol, the medians over the rounds of the total throughput and of the requests per second
# per busy server CPU, beside the one-server layouts of as many threads.
#
# Knobs (environment; GPU defaults, then --cpu-only's): LAYOUTS ("1x4 1x12 3x4 3x4/ns"; "1x1
# 2x1"), PROTOS ("tcp udp"), SIZE (1024; 64), ROUNDS (3; 1), DURATION (3; 0.3), WARMUP (0.5;
# 0.1), CONNS_PER_THREAD (4; 2), SAT_WINDOW (48; 4), THREADS_PER_AGENT (4), AGENT_QUEUES (32;
# 2), DISPATCH (the service's dispatch, round_robin), PIN (1; 0: no CPU is pinned, for a
# machine of too few cores, and neither hogs nor the probe run). /ns layouts need root and
# iproute2.
set -uo pipefail

BUILD=$(realpath "${1:?usage: instances.sh BUILD_DIR RESULTS_DIR [--cpu-only]}")
RESULTS=${2:?usage: instances.sh BUILD_DIR RESULTS_DIR [--cpu-only]}
CPU_ONLY=0
[ "${3:-}" = "--cpu-only" ] && CPU_ONLY=1
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
mkdir -p "$RESULTS/raw"
RESULTS=$(realpath "$RESULTS")
RAW="$RESULTS/raw"
source "$HERE/lib.sh"  # wait_for_line, wait_attached, pid_ticks, cpus_ticks, physical_cores

if [ "$CPU_ONLY" -eq 1 ]; then
  d_layouts="1x1 2x1" d_size=64 d_rounds=1 d_duration=0.3 d_warmup=0.1 d_conns=2 d_window=4
  d_queues=2
else
  d_layouts="1x4 1x12 3x4 3x4/ns" d_size=1024 d_rounds=3 d_duration=3 d_warmup=0.5 d_conns=4
  d_window=48 d_queues=32
fi
LAYOUTS=${LAYOUTS:-$d_layouts}
PROTOS=${PROTOS:-"tcp udp"}
SIZE=${SIZE:-$d_size}
ROUNDS=${ROUNDS:-$d_rounds}
DURATION=${DURATION:-$d_duration}
WARMUP=${WARMUP:-$d_warmup}
CONNS_PER_THREAD=${CONNS_PER_THREAD:-$d_conns}
SAT_WINDOW=${SAT_WINDOW:-$d_window}
THREADS_PER_AGENT=${THREADS_PER_AGENT:-4}
AGENT_QUEUES=${AGENT_QUEUES:-$d_queues}
DISPATCH=${DISPATCH:-round_robin}
PIN=${PIN:-1}

SNIC="$BUILD/snic_server/snic_server"
AGENT_BIN="$BUILD/examples/matvec/caracal_matvec_agent"
LOADGEN="$BUILD/bench/loadgen/caracal_loadgen"
for bin in "$SNIC" "$AGENT_BIN" "$LOADGEN"; do
  [ -x "$bin" ] || { echo "instances.sh: $bin is missing (build it first)" >&2; exit 2; }
done
GPUS=0
if [ "$CPU_ONLY" -eq 0 ]; then
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  [ "$GPUS" -ge 1 ] || { echo "instances.sh: no GPU listed by nvidia-smi (use --cpu-only)" >&2; exit 2; }
fi

# The layouts, checked: per layout its servers, threads, namespaces (1 for /ns), hog kind
# (spin, stream or none) and hog cores.
declare -a LAYOUT_N LAYOUT_T LAYOUT_NS LAYOUT_HOG LAYOUT_HOGS LAYOUT_NAME LAYOUT_SPEC
max_cores=0
max_rest=0
need_netns=0
for l in $LAYOUTS; do
  if [[ ! "$l" =~ ^([1-9][0-9]*)x([1-9][0-9]*)(/ns)?(\+(spin|stream)([1-9][0-9]*))?$ ]]; then
    echo "instances.sh: a layout is NxT or NxT/ns (N servers of T I/O threads), then perhaps" \
      "+spinK or +streamK (K busy cores), not '$l'" >&2
    exit 2
  fi
  LAYOUT_SPEC+=("$l")
  LAYOUT_N+=("${BASH_REMATCH[1]}")
  LAYOUT_T+=("${BASH_REMATCH[2]}")
  ns=0
  [ -n "${BASH_REMATCH[3]}" ] && ns=1 && need_netns=1
  LAYOUT_NS+=("$ns")
  LAYOUT_HOG+=("${BASH_REMATCH[5]:-none}")
  LAYOUT_HOGS+=("${BASH_REMATCH[6]:-0}")
  LAYOUT_NAME+=("${BASH_REMATCH[1]}x${BASH_REMATCH[2]}$([ "$ns" = 1 ] && echo ns)${BASH_REMATCH[5]:+-${BASH_REMATCH[5]}${BASH_REMATCH[6]}}")
  cores=$((BASH_REMATCH[1] * BASH_REMATCH[2]))
  [ "$cores" -gt "$max_cores" ] && max_cores=$cores
  # Cores besides the servers': a client core per server, the hogs' and the probe's.
  rest=$((BASH_REMATCH[1] + ${BASH_REMATCH[6]:-0} + 1))
  [ "$rest" -gt "$max_rest" ] && max_rest=$rest
done
if [ "$PIN" != 1 ] && [[ " $LAYOUTS " =~ \+(spin|stream) ]]; then
  echo "instances.sh: +spin and +stream layouts need PIN=1 (the hogs take cores of their own)" >&2
  exit 2
fi
if [ "$need_netns" -eq 1 ]; then
  [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null ||
    { echo "instances.sh: /ns layouts need root and iproute2's ip" >&2; exit 2; }
fi

# CORES[k]: the CPUs of physical core k (comma-separated), in the order of their lowest CPU.
CORES=()
if [ "$PIN" = 1 ]; then
  mapfile -t CORES < <(physical_cores)
  if [ "${#CORES[@]}" -lt $((max_cores + max_rest)) ]; then
    echo "instances.sh: the layouts need $max_cores physical cores for servers and $max_rest" \
      "for the clients (one a server at least), the hogs and the probe; this machine has" \
      "${#CORES[@]} (PIN=0 runs unpinned)" >&2
    exit 2
  fi
fi
# cores_list FIRST COUNT: the CPUs of physical cores FIRST to FIRST + COUNT - 1.
cores_list() {
  local k out=""
  for ((k = $1; k < $1 + $2; k++)); do out="$out${out:+,}${CORES[k]}"; done
  echo "$out"
}

SECRET="instances-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
CLK_TCK=$(getconf CLK_TCK)
T0=$(date +%s)
log() { echo "[$(($(date +%s) - T0))s] $*" >&2; }
POINTS="$RAW/points.jsonl"
: >"$POINTS"
PIDS=()
NAMESPACES=()
PROBE_CPU=
[ "$PIN" = 1 ] && PROBE_CPU=${CORES[${#CORES[@]} - 1]%%,*}
# probe SECONDS [DELAY]: after DELAY s, millions of rounds per second of a loop of fixed work
# on the probe's CPU over SECONDS (the time read is the vDSO's, no system call).
probe() {
  taskset -c "$PROBE_CPU" python3 -c '
import sys, time
time.sleep(float(sys.argv[2]))
secs = float(sys.argv[1])
n, t0 = 0, time.perf_counter()
end = t0 + secs
while time.perf_counter() < end:
    for _ in range(1000):
        pass
    n += 1
print(f"{n / (time.perf_counter() - t0) / 1000:.4f}")' "$1" "${2:-0}"
}
stop_all() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  PIDS=()
  local ns
  for ns in "${NAMESPACES[@]}"; do ip netns del "$ns" 2>/dev/null; done
  NAMESPACES=()
}
trap stop_all EXIT

# Per server of the running layout: how its client starts (namespace, CPUs), its ports,
# processes and CPUs.
declare -a S_CLIENT S_UDP S_TCP S_PIDS S_CPUS S_CLIENT_CPUS

# start_layout INDEX: starts the layout's servers and agents; 1 if one did not come up.
start_layout() {
  local n=${LAYOUT_N[$1]} t=${LAYOUT_T[$1]} ns=${LAYOUT_NS[$1]} i a agents
  local name=${LAYOUT_NAME[$1]} hog=${LAYOUT_HOG[$1]} hogs=${LAYOUT_HOGS[$1]}
  agents=$((t / THREADS_PER_AGENT))
  [ "$agents" -ge 1 ] || agents=1
  # The clients' cores: after the servers', before the hogs' and the probe's.
  local pool_first=$max_cores pool=$((${#CORES[@]} - max_cores - hogs - 1)) share
  share=$((pool / n))
  S_CLIENT=() S_UDP=() S_TCP=() S_PIDS=() S_CPUS=() S_CLIENT_CPUS=()
  PROBE_IDLE=null
  if [ "$PIN" = 1 ]; then
    PROBE_IDLE=$(probe 1) || PROBE_IDLE=null
    local k first=$((${#CORES[@]} - 1 - hogs))
    for ((k = first; k < first + hogs; k++)); do
      if [ "$hog" = spin ]; then
        taskset -c "${CORES[k]}" bash -c 'while :; do :; done' &
      else
        taskset -c "${CORES[k]}" dd if=/dev/zero of=/dev/null bs=256M 2>/dev/null &
      fi
      PIDS+=($!)
    done
  fi
  for ((i = 0; i < n; i++)); do
    local prefix="" client="" cpus="" ccpus="" nsname=""
    if [ "$ns" = 1 ]; then
      nsname="ci$$-$i"
      ip netns add "$nsname" && ip netns exec "$nsname" ip link set lo up ||
        { echo "instances.sh: could not set up the namespace $nsname" >&2; return 1; }
      NAMESPACES+=("$nsname")
      prefix="ip netns exec $nsname"
    fi
    client=$prefix
    if [ "$PIN" = 1 ]; then
      cpus=$(cores_list $((i * t)) "$t")
      ccpus=$(cores_list $((pool_first + i * share)) "$share")
      prefix="$prefix taskset -c $cpus"
      client="$client taskset -c $ccpus"
    fi
    local log="$RAW/$name-s$i"
    rm -f "$log-server.log"
    cat >"$log-server.yaml" <<YAML
io_threads: $t
log_level: warn
control: { listen: 127.0.0.1:0, secret: $SECRET, agent_timeout_ms: 5000 }
services:
  - name: matvec
    max_message_bytes: 16384
    dispatch: $DISPATCH
    listeners:
      - { protocol: udp, listen: 127.0.0.1:0 }
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: length_prefixed, prefix_bytes: 4 } }
YAML
    $prefix "$SNIC" --config "$log-server.yaml" --log-level info >"$log-server.log" 2>&1 &
    local spid=$!
    PIDS+=("$spid")
    wait_for_line "$log-server.log" "serving [0-9]+ service" 20 || return 1
    local control
    control=$(sed -nE 's/.*control endpoint on .* \(port ([0-9]+)\).*/\1/p' "$log-server.log")
    S_UDP+=("$(sed -nE 's#.*listening on udp/127.0.0.1:0 \(port ([0-9]+)\).*#\1#p' "$log-server.log" | head -1)")
    S_TCP+=("$(sed -nE 's#.*listening on tcp/127.0.0.1:0 \(port ([0-9]+)\).*#\1#p' "$log-server.log" | head -1)")
    local pids="$spid"
    for ((a = 0; a < agents; a++)); do
      local accel=cpu
      [ "$GPUS" -ge 1 ] && accel="gpu:$(((i * agents + a) % GPUS))"
      cat >"$log-agent$a.yaml" <<YAML
agent: instances-$i-$a
server: 127.0.0.1:$control
secret: $SECRET
accelerator: $accel
transport: shm
log_level: info
cpu: { workers: 1 }
$([ "$accel" != cpu ] && echo "gpu: { workers: 0 }")
reconnect_interval_ms: 100
services:
  - { name: matvec, queues: $AGENT_QUEUES, ring_capacity: 512, slot_bytes: 256, max_message_bytes: 16384 }
YAML
      $prefix "$AGENT_BIN" --config "$log-agent$a.yaml" >"$log-agent$a.log" 2>&1 &
      PIDS+=($!)
      pids="$pids $!"
      wait_for_line "$log-agent$a.log" "serving [0-9]+ service" 60 || return 1
    done
    wait_attached "$log-server.log" "$agents" || return 1
    S_CLIENT+=("$client") S_PIDS+=("$pids")
    S_CPUS+=("$cpus") S_CLIENT_CPUS+=("$ccpus")
  done
  log "$name: $n servers of $t I/O threads, $agents agents of $AGENT_QUEUES queues each$(
    [ "$hog" != none ] && echo ", $hogs cores of $hog")$([ "$PIN" = 1 ] && echo ", probe idle $PROBE_IDLE")"
}

# measure INDEX ROUND PROTO: every server of the running layout loaded at once; a line per
# server in points.jsonl.
measure() {
  local li=$1 round=$2 proto=$3 n=${LAYOUT_N[$1]} t=${LAYOUT_T[$1]} ns=${LAYOUT_NS[$1]} i
  local name=${LAYOUT_NAME[$1]}
  local conns=$((CONNS_PER_THREAD * t))
  local -a t0 c0 lpids
  for ((i = 0; i < n; i++)); do
    t0[i]=$(pid_ticks ${S_PIDS[i]})
    c0[i]=0
    [ -n "${S_CPUS[i]}" ] && c0[i]=$(cpus_ticks "${S_CPUS[i]}")
  done
  local w0 w1 probe_out="$RAW/$name-r$round-$proto.probe" probe_pid=
  if [ "$PIN" = 1 ]; then
    probe "$DURATION" "$WARMUP" >"$probe_out" &
    probe_pid=$!
  fi
  w0=$(date +%s.%N)
  for ((i = 0; i < n; i++)); do
    local port=${S_UDP[i]}
    [ "$proto" = tcp ] && port=${S_TCP[i]}
    local out="$name-r$round-$proto-s$i"
    ${S_CLIENT[i]} "$LOADGEN" --host 127.0.0.1 --port "$port" --proto "$proto" --handler matvec \
      --size "$SIZE" --connections "$conns" --window "$SAT_WINDOW" --threads "$conns" \
      --warmup "$WARMUP" --duration "$DURATION" --json "$RAW/$out.json" --label "$out" \
      >"$RAW/$out.out" 2>&1 &
    lpids[i]=$!
  done
  local rc=0 failed=0
  for ((i = 0; i < n; i++)); do
    rc=0
    wait "${lpids[i]}" || rc=$?
    [ "$rc" -eq 0 ] || failed=$((failed + 1))
    lpids[i]=$rc
  done
  w1=$(date +%s.%N)
  local probe_load=null
  if [ -n "$probe_pid" ]; then
    wait "$probe_pid" && probe_load=$(cat "$probe_out")
    [ -n "$probe_load" ] || probe_load=null
  fi
  for ((i = 0; i < n; i++)); do
    local t1 c1=0 out="$name-r$round-$proto-s$i"
    t1=$(pid_ticks ${S_PIDS[i]})
    [ -n "${S_CPUS[i]}" ] && c1=$(cpus_ticks "${S_CPUS[i]}")
    awk -v layout="${LAYOUT_SPEC[li]}" -v n="$n" -v t="$t" -v ns="$ns" -v round="$round" -v proto="$proto" \
      -v hog="${LAYOUT_HOG[li]}" -v hogs="${LAYOUT_HOGS[li]}" -v pidle="$PROBE_IDLE" -v pload="$probe_load" \
      -v i="$i" -v rc="${lpids[i]}" -v dt="$((t1 - t0[i]))" -v dc="$((c1 - c0[i]))" \
      -v pinned="$PIN" -v hz="$CLK_TCK" -v a="$w0" -v b="$w1" -v json="$out.json" \
      -v cpus="${S_CPUS[i]}" -v ccpus="${S_CLIENT_CPUS[i]}" 'BEGIN {
        w = b - a
        printf "{\"layout\":\"%s\",\"servers\":%d,\"threads\":%d,\"netns\":%s,\"round\":%d,", layout, n, t, ns ? "true" : "false", round
        printf "\"proto\":\"%s\",\"server\":%d,\"loadgen_rc\":%d,\"cpu_cores\":%.3f,", proto, i, rc, dt / hz / w
        printf "\"server_cpus_cores\":%s,", pinned == 1 ? sprintf("%.3f", dc / hz / w) : "null"
        printf "\"hog\":\"%s\",\"hog_cores\":%d,\"probe_idle\":%s,\"probe_load\":%s,", hog, hogs, pidle, pload
        printf "\"server_cpus\":\"%s\",\"client_cpus\":\"%s\",\"json\":\"%s\"}\n", cpus, ccpus, json }' >>"$POINTS"
    log "$out: $(head -1 "$RAW/$out.out")"
  done
  return "$failed"
}

FAILED=0
for ((round = 1; round <= ROUNDS; round++)); do
  order=()
  for ((li = 0; li < ${#LAYOUT_N[@]}; li++)); do order+=("$li"); done
  if [ $((round % 2)) -eq 0 ]; then
    rev=()
    for ((k = ${#order[@]} - 1; k >= 0; k--)); do rev+=("${order[k]}"); done
    order=("${rev[@]}")
  fi
  for li in "${order[@]}"; do
    if start_layout "$li"; then
      for proto in $PROTOS; do measure "$li" "$round" "$proto" || FAILED=$((FAILED + 1)); done
    else
      FAILED=$((FAILED + 1))
    fi
    stop_all
  done
done

commit=${CARACAL_COMMIT:-$(git -C "$SRC" rev-parse HEAD 2>/dev/null || echo unknown)}
cat >"$RAW/run.json" <<JSON
{"commit": "$commit", "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "accelerator": "$([ "$GPUS" -ge 1 ] && echo gpu || echo cpu)",
 "gpus": $GPUS, "gpu": "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)",
 "cpu": "$(sed -nE 's/^model name\s*: //p' /proc/cpuinfo | head -1)", "cpus": $(nproc),
 "physical_cores": ${#CORES[@]}, "kernel": "$(uname -r)",
 "params": {"layouts": "$LAYOUTS", "protos": "$PROTOS", "size": $SIZE, "rounds": $ROUNDS,
  "duration_s": $DURATION, "warmup_s": $WARMUP, "conns_per_thread": $CONNS_PER_THREAD,
  "sat_window": $SAT_WINDOW, "threads_per_agent": $THREADS_PER_AGENT, "agent_queues": $AGENT_QUEUES,
  "dispatch": "$DISPATCH", "pin": $PIN}}
JSON
python3 "$HERE/instances_report.py" "$RESULTS" || FAILED=$((FAILED + 1))
log "done ($FAILED failed)"
exit "$FAILED"
