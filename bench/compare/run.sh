#!/usr/bin/env bash
# The benchmarks of bench/compare, one driver; a scenario says what runs:
#
#   bench/compare/run.sh [SCENARIO] BUILD_DIR RESULTS_DIR [--cpu-only] [NAME[=PATH]...]
#
# SCENARIO is a file of scenarios/ (NAME for NAME.env) or a path; compare when left out. Its
# KEY=value lines (shell syntax, one a line) set what differs from scenarios/defaults.env, which
# lists every key and what it means; INCLUDE=SCENARIO... fills in the keys it leaves unset from
# others. The environment overrides any key for one run. --cpu-only is CPU_ONLY=1, and each
# NAME[=PATH] adds a version to VERSIONS.
#
# REPORT says what the run is:
#   compare    each server of SERVERS (snic_server with AGENTS agents over shm, caracal_threads
#              the same with engine threads of their own, the host-centric and the CPU
#              baselines) on each handler of HANDLERS, a fresh server per server and handler.
#              First LOW_LOAD_ROUNDS rounds of echo at low load over UDP at 64 B (loadgen and
#              sockperf) on LOW_LOAD_SERVERS, a fresh server each time, the order turned every
#              other round: such a point moves by microseconds from one server start to the
#              next, so the report takes the median of the rounds. Then per size and protocol:
#              latency (1 connection, window 1), saturation (SAT_CONNECTIONS x SAT_WINDOW from
#              LOADGEN_THREADS threads), at OPEN_SIZES open loop at OPEN_FRACTIONS of saturation
#              and at OPEN_RATES; sockperf ping-pong against each echo; for face with the
#              host-centric server, every server again at its saturation rate (kind
#              open-at-host_centric); with HOLD_TO, each of Caracal's saturation points again
#              in a cgroup whose CPU quota is the cores HOLD_TO used there (kind held: Caracal
#              with at most the cores of the server it is compared with). Each point records
#              the server's cores (utime + stime of its processes; process_cores: the first
#              alone, snic_server without its agents), with SERVER_CPUS how busy those CPUs
#              were (the kernel's work for the server's packets too), the seconds per second
#              the engine found no work (caracal_engine_idle_seconds_total) and at saturation
#              the cores per thread name (with PERF also a profile). report.py writes
#              compare.json and compare.md; plot.py draws them.
#   gpus       per count n of COUNTS, one snic_server with n agents (agent i on gpu:i) and the
#              host-centric server on GPUs 0 to n-1: saturation over PROTOS, then over UDP open
#              loop at OPEN_FRACTIONS of it. With two GPUs or more, EXPERIMENTS' unequal (two
#              agents, the second slowed by SLOW_DELAY_US a request, under round_robin and
#              least_loaded: how the requests spread) and loss (LOSS_AGENTS agents under TCP
#              load for LOSS_DURATION s, the last killed LOSS_KILL_AT s in; every request must
#              get a reply or an error reply). Each point records the server's, memcached's and
#              the whole machine's cores and each agent's answered requests. gpus_report.py
#              writes gpus.json, gpus.md and plots.
#   instances  per round of ROUNDS, each layout of LAYOUTS in turn (the order turned every other
#              round): NxT is N snic_servers of T I/O threads, an agent per THREADS_PER_AGENT
#              threads (the agents of a layout dealt over the GPUs), all loaded at once, each by
#              its own client (SAT_PER_THREAD x T connections); /ns puts each server with its
#              agents and client in a network namespace of its own; +spinK or +streamK keeps K
#              more cores busy (a loop in registers; dd through 256 MiB buffers, the shared
#              cache and memory). With PIN, server i runs on physical cores i*T to (i+1)*T-1,
#              the clients on the cores no server takes, and a probe on the last core times a
#              loop of fixed work under load against idle: whether a core does less when the
#              others are busy. instances_report.py writes instances.json and instances.md.
#   profile    per handler, protocol and size a fresh snic_server (SNIC built with
#              -DCARACAL_ENGINE_PROFILE=ON) and agent at saturation (at OPEN_RATES' rate when
#              set), then the engine's per-stage report from the server's log; with PERF a
#              cpu-clock profile of the engine thread (PERF_PROCESS=1: of every thread). Its
#              files go straight to RESULTS_DIR.
# VERSIONS run the scenario once per version, into RESULTS_DIR/NAME, each KEY_NAME set standing
# for KEY (SNIC_old, SPREAD_flows, ...); a version's PATH is its snic_server, or a tree or `git
# archive` .tar to build one from. SWEEP=KEY runs it once per value of KEY, a fresh run each,
# the versions' order turned every other value; THREADS runs go to NAME/tVALUE, then
# threads_report.py writes threads.json, threads.md and plots. caracal_loadgen checks every
# reply; loadgen JSON, configs, logs, points.jsonl and run.json go to RESULTS_DIR/raw/, and
# lscpu.txt, gpu.txt and commit.txt (the tree's) to RESULTS_DIR.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
source "$SRC/bench/lib/bench.sh"
usage="usage: run.sh [SCENARIO] BUILD_DIR RESULTS_DIR [--cpu-only] [NAME[=PATH]...]"
die() { echo "run.sh: $*" >&2; exit 2; }
has() { case " $1 " in *" $2 "*) return 0 ;; esac; return 1; }
T0=$(date +%s)
log() { echo "[$(($(date +%s) - T0))s] $*" >&2; }

# load SCENARIO: its keys, each where not set yet, then those of the scenarios it INCLUDEs.
load() {
  local file=$1 line key includes=
  [ -f "$file" ] || file=$HERE/scenarios/$1.env
  [ -f "$file" ] || die "no scenario '$1' (a file, or a name of scenarios/*.env)"
  while IFS= read -r line || [ -n "$line" ]; do
    [[ "$line" =~ ^([A-Za-z_][A-Za-z0-9_]*)= ]] || continue
    key=${BASH_REMATCH[1]}
    if [ "$key" = INCLUDE ]; then
      eval "includes=${line#INCLUDE=}"
    elif [ -z "${!key+x}" ]; then
      eval "$line" || die "$file: cannot read '$line'"
    fi
  done <"$file"
  for file in $includes; do load "$file"; done
}

SCENARIO=compare
if [ -f "${1:-}" ] || [ -f "$HERE/scenarios/${1:-}.env" ]; then SCENARIO=$1; shift
elif [ -n "${1:-}" ] && [ ! -d "$1" ]; then die "no scenario '$1' (a file, or a name of scenarios/*.env)"
fi
BUILD=$(realpath -m "${1:?$usage}")
RESULTS=${2:?$usage}
shift 2
specs=()
for a in "$@"; do
  if [ "$a" = --cpu-only ]; then export CPU_ONLY=1; else specs+=("$a"); fi
done
load "$SCENARIO"
load defaults
mkdir -p "$RESULTS" && RESULTS=$(realpath "$RESULTS")
FAILED=0
# The machine and the tree, for the record, once per call (not again in each version's run).
if [ -z "${RUN_SH_RESULTS:-}" ]; then
  export RUN_SH_RESULTS=$RESULTS
  lscpu >"$RESULTS/lscpu.txt" 2>&1
  ! command -v nvidia-smi >/dev/null ||
    nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv,noheader >"$RESULTS/gpu.txt" 2>&1
  git -C "$SRC" rev-parse HEAD >"$RESULTS/commit.txt" 2>/dev/null
fi
[ "$CARACAL_ACCEL" = auto ] && CARACAL_ACCEL=$([ "$CPU_ONLY" = 1 ] && echo cpu || echo gpu:0)
[ "$SNIC" = auto ] && SNIC=$BUILD/snic_server/snic_server

# The versions: NAME, or NAME=PATH (a snic_server, or a tree or .tar to build it from).
NAMES=()
for spec in $VERSIONS "${specs[@]}"; do
  name=${spec%%=*}
  [[ "$name" =~ ^[A-Za-z0-9]+$ ]] || die "a version is NAME or NAME=PATH, NAME of letters and digits, not '$spec'"
  NAMES+=("$name")
  [ "$spec" = "$name" ] && continue
  path=$(realpath "${spec#*=}")
  if [ -d "$path" ] || [[ "$path" == *.tar ]]; then printf -v "SNIC_SOURCE_$name" %s "$path"
  else printf -v "SNIC_$name" %s "$path"; fi
done

# Builds first, at once, each with half the cores and one more: BUILD_TARGETS of this tree into
# BUILD_DIR, and each snic_server of a source into AB_WORK/NAME.
jobs=$(($(nproc) / 2 + 1))
builds=()
if [ -n "$BUILD_TARGETS" ]; then
  # shellcheck disable=SC2086 # a list of targets
  release_build "$SRC" "$BUILD" "$RESULTS/build.log" "$jobs" -- $BUILD_TARGETS &
  builds+=($!)
fi
for name in "" "${NAMES[@]}"; do
  var=SNIC_SOURCE${name:+_$name}
  [ -n "${!var:-}" ] || continue
  opts=SNIC_CMAKE_OPTIONS_$name
  [ -n "${!opts+x}" ] || opts=SNIC_CMAKE_OPTIONS
  # shellcheck disable=SC2086 # a list of options
  snic_build "${!var}" "$AB_WORK/${name:-snic}" "$RESULTS/build-${name:-snic}.log" "$jobs" ${!opts} &
  builds+=($!)
  printf -v "SNIC${name:+_$name}" %s "$AB_WORK/${name:-snic}/build/snic_server/snic_server"
done
for pid in "${builds[@]}"; do wait "$pid" || exit 2; done

# Tools the machine lacks, from DEBS; libraries a build from elsewhere brought along.
[ -d "$BUILD/lib" ] && export LD_LIBRARY_PATH="$BUILD/lib:${LD_LIBRARY_PATH:-}"
if { ! command -v sockperf || ! command -v memcached; } >/dev/null && ls "$DEBS"/*.deb >/dev/null 2>&1; then
  tools=$RESULTS/tools
  mkdir -p "$tools"
  for d in "$DEBS"/*.deb; do dpkg -x "$d" "$tools"; done
  # dpkg -x runs no maintainer scripts, so the `nc` alternative is not made.
  [ -e "$tools/bin/nc.openbsd" ] && ln -sf nc.openbsd "$tools/bin/nc"
  export PATH="$tools/usr/bin:$tools/bin:$tools/usr/sbin:$PATH"
  export LD_LIBRARY_PATH="$tools/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
for t in $E2E; do
  echo "== e2e $t, agents on $CARACAL_ACCEL"
  CARACAL_E2E_ACCELERATOR=$CARACAL_ACCEL timeout 300 bash "$SRC/tests/e2e/$t.sh" "$BUILD" "$SRC" \
    >"$RESULTS/e2e-$t.txt" 2>&1 || FAILED=$((FAILED + 1))
  tail -n 25 "$RESULTS/e2e-$t.txt"
done

# The scenario once per round, value of SWEEP and version, each a fresh run.sh.
if [ ${#NAMES[@]} -gt 0 ] || [ -n "$SWEEP" ]; then
  values=(-)
  if [ -n "$SWEEP" ]; then
    [ -n "${!SWEEP+x}" ] || die "SWEEP=$SWEEP is not a key"
    read -ra values <<<"${!SWEEP}"
  fi
  [ "$SWEEP:$REPORT" != THREADS:compare ] || [ ${#NAMES[@]} -gt 0 ] ||
    die "a THREADS sweep needs versions (NAME=SNIC_BINARY...): threads_report.py reads NAME/tCOUNT"
  [ ${#NAMES[@]} -gt 0 ] || NAMES=("")
  turn=0
  for round in $(seq "$VERSION_ROUNDS"); do
    for value in "${values[@]}"; do
      order=()
      for name in "${NAMES[@]}"; do
        if [ -n "$SWEEP" ] && [ $((turn % 2)) -eq 1 ]; then order=("$name" "${order[@]}"); else order+=("$name"); fi
      done
      turn=$((turn + 1))
      for name in "${order[@]}"; do
        dir=$RESULTS${name:+/$name}
        [ "$VERSION_ROUNDS" -gt 1 ] && dir=$dir-$round
        src=SNIC_SOURCE_$name
        env=(VERSIONS= VERSION_ROUNDS=1 SWEEP= BUILD_TARGETS= SNIC_SOURCE= E2E= "SNIC=$SNIC")
        [ -n "$name" ] && env+=("CARACAL_COMMIT=$name${!src:+ ($(basename "${!src}"))}")
        if [ -n "$SWEEP" ]; then
          dir=$dir/$([ "$SWEEP" = THREADS ] && echo t || echo "${SWEEP,,}-")$value
          env+=("$SWEEP=$value")
        fi
        # Every KEY_NAME set stands for KEY in this version's run.
        for var in $(compgen -v); do
          key=${var%_"$name"}
          [ -n "$name" ] && [ "$key" != "$var" ] && [ "$key" != SNIC_SOURCE ] && [ -n "${!key+x}" ] &&
            env+=("$key=${!var}")
        done
        echo "== ${name:-run}${SWEEP:+, $SWEEP $value}$([ "$VERSION_ROUNDS" -gt 1 ] && echo ", round $round")"
        if [ -n "$SWEEP" ] && [ "$REPORT" = compare ]; then
          env "${env[@]}" "$HERE/run.sh" "$SCENARIO" "$BUILD" "$dir" 2>&1 | grep -E 'saturation|latency|done|run.sh' ||
            FAILED=$((FAILED + 1))
        else
          env "${env[@]}" "$HERE/run.sh" "$SCENARIO" "$BUILD" "$dir" || FAILED=$((FAILED + 1))
        fi
      done
    done
  done
  if [ "$SWEEP:$REPORT" = THREADS:compare ]; then
    python3 "$HERE/threads_report.py" "$RESULTS" || FAILED=$((FAILED + 1))
  fi
  [ "$FAILED" -eq 0 ]
  exit
fi

# One run from here on.
RAW=$RESULTS/raw
[ "$REPORT" = profile ] && RAW=$RESULTS
mkdir -p "$RAW"
case "$REPORT" in compare | gpus | instances | profile) ;; *) die "REPORT is compare, gpus, instances or profile, not '$REPORT'" ;; esac
LOADGEN=$BUILD/bench/loadgen/caracal_loadgen
CPU_SERVER=$BUILD/bench/baselines/caracal_cpu_server
HC_SERVER=$BUILD/bench/baselines/host_centric_server/caracal_host_centric_server
FACE_LOADER=$BUILD/examples/face_verify/caracal_face_loader
declare -A AGENT_BIN=([echo]=$BUILD/examples/echo/caracal_echo_agent
                      [matvec]=$BUILD/examples/matvec/caracal_matvec_agent
                      [face]=$BUILD/examples/face_verify/caracal_face_agent)
[ "$MEMCACHED" = auto ] && MEMCACHED=$(command -v memcached || true)
if [ "$HANDLERS" = auto ]; then
  HANDLERS="echo matvec face"
  [ -n "$MEMCACHED" ] || { echo "run.sh: no memcached (set MEMCACHED or install it); face is left out" >&2; HANDLERS="echo matvec"; }
fi
if [ "$SERVERS" = auto ]; then
  SERVERS=caracal
  if [ "$CPU_ONLY" = 1 ]; then :
  elif [ -x "$HC_SERVER" ]; then SERVERS="$SERVERS host_centric"
  else echo "run.sh: $HC_SERVER is missing (a build without CUDA); the host-centric server is left out" >&2
  fi
  [ "$REPORT" = compare ] && SERVERS="$SERVERS cpu"
fi
[ "$REPORT" = compare ] || [ "$REPORT" = gpus ] || SERVERS=caracal
need=("$LOADGEN")
for s in $SERVERS; do
  case "$s" in
    caracal | caracal_threads) need+=("$SNIC") ;;
    host_centric) need+=("$HC_SERVER") ;;
    cpu) need+=("$CPU_SERVER") ;;
    *) die "no server '$s' (caracal, caracal_threads, host_centric, cpu)" ;;
  esac
done
for h in $HANDLERS; do
  [ -n "${AGENT_BIN[$h]:-}" ] || die "no handler '$h' (echo, matvec, face)"
  need+=("${AGENT_BIN[$h]}")
done
if has "$HANDLERS" face; then
  [ -n "$MEMCACHED" ] || die "face needs memcached (install it or set MEMCACHED)"
  need+=("$FACE_LOADER" "$MEMCACHED")
fi
for bin in "${need[@]}"; do [ -x "$bin" ] || die "$bin is missing (build it first)"; done
if [ "$SOCKPERF" = auto ]; then
  SOCKPERF=$(command -v sockperf || true)
  [ -n "$SOCKPERF" ] || [ "$REPORT" != compare ] || echo "run.sh: no sockperf; the sockperf anchor is left out" >&2
fi
if [ "$GPUS" = auto ]; then
  if [ "$CPU_ONLY" = 1 ]; then GPUS=$([ "$REPORT" = gpus ] && echo 2 || echo 0)
  else GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  fi
fi
if [ "$REPORT" = gpus ] || [ "$REPORT" = instances ]; then
  [ "$CPU_ONLY" = 1 ] || [ "$GPUS" -ge 1 ] || die "nvidia-smi lists no GPU (CPU_ONLY=1 runs on CPU agents)"
  [[ "$HANDLERS" =~ ^[a-z]+$ ]] && [[ "$SIZES" =~ ^[0-9]+$ ]] || die "$REPORT takes one handler and one size, not '$HANDLERS' at '$SIZES'"
  [ "$REPORT" = instances ] || [[ "$HANDLERS" =~ ^(matvec|face)$ ]] || die "gpus serves matvec or face, not '$HANDLERS'"
fi
HANDLER=${HANDLERS%% *}
# sizes: the request sizes of HANDLER (face: a person id and a 64x64 image).
sizes() { if [ "$HANDLER" = face ]; then echo 4104; else echo "$SIZES"; fi; }
if [ "$MAX_MESSAGE" = auto ]; then
  MAX_MESSAGE=$((SIZES > 1024 ? SIZES : 1024))
  [ "$HANDLER" = face ] && MAX_MESSAGE=8192
fi

# The CPUs of the servers and the client from PIN (instances pins on its own).
if [ "$REPORT" != instances ]; then
  case "$PIN" in
    "" | 0) ;;
    halves | server:threads | server:[1-9]*)
      mapfile -t cores < <(physical_cores)
      half=${PIN#server:}
      [ "$PIN" = halves ] && half=$((${#cores[@]} / 2))
      [ "$PIN" = server:threads ] && half=$THREADS
      [ "$half" -gt 0 ] && [ "$half" -lt "${#cores[@]}" ] ||
        die "PIN=$PIN leaves no core to the server or the client (${#cores[@]} cores)"
      SERVER_CPUS=$(IFS=,; echo "${cores[*]:0:half}")
      CLIENT_CPUS=$(IFS=,; echo "${cores[*]:half}")
      log "the server on CPUs $SERVER_CPUS, the client on $CLIENT_CPUS"
      ;;
    *) die "PIN is halves, server:N or server:threads, not '$PIN'" ;;
  esac
fi
[[ "$SAT_PER_THREAD" =~ ^([1-9][0-9]?)?$ ]] || die "SAT_PER_THREAD is a count of connections per thread, not '$SAT_PER_THREAD'"
if [ -n "$SAT_PER_THREAD" ] && [ "$REPORT" != instances ]; then
  SAT_CONNECTIONS=$((SAT_PER_THREAD * THREADS)) LOADGEN_THREADS=$((SAT_PER_THREAD * THREADS))
fi
SAT=(--connections "$SAT_CONNECTIONS" --window "$SAT_WINDOW" --threads "$LOADGEN_THREADS")

PIDS=() SERVER_PIDS=() AGENT_PIDS=() NAMESPACES=() SERVER_PREFIX=() CLIENT=()
HOLD_CG='' HOLDING=0 MC_PID='' MC_PORT='' CLIENT_NS='' ROUND='' ON_LOAD_START='' METRICS_PORT=''
POINTS=$RAW/points.jsonl
[ "$REPORT" = profile ] || : >"$POINTS"
SECRET="$REPORT-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
stop_servers() {
  local pid ns
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  for ns in "${NAMESPACES[@]}"; do ip netns del "$ns" 2>/dev/null; done
  PIDS=() SERVER_PIDS=() NAMESPACES=()
}
trap 'stop_servers; hold_remove; [ -z "$MC_PID" ] || kill -KILL "$MC_PID" 2>/dev/null; [ -z "$CLIENT_NS" ] || client_netns_down "$CLIENT_NS"' EXIT

# Where the servers listen and how a client starts (CLIENT_NETNS, CLIENT_CPUS).
DATA_ADDR=127.0.0.1
case "$CLIENT_NETNS" in
  0 | off) CLIENT_NETNS=off ;;
  1 | rps) CLIENT_NETNS=rps ;;
  rfs) ;;
  *) die "CLIENT_NETNS is 0, 1 (rps) or rfs, not '$CLIENT_NETNS'" ;;
esac
if [ "$CLIENT_NETNS" != off ]; then
  [ "$REPORT" != instances ] || die "instances gives each server a namespace of its own (NxT/ns), not CLIENT_NETNS"
  [ -n "$SERVER_CPUS" ] && [ -n "$CLIENT_CPUS" ] ||
    die "CLIENT_NETNS needs SERVER_CPUS and CLIENT_CPUS (each side's packets go to its CPUs)"
  [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null || die "CLIENT_NETNS needs root and iproute2's ip"
  client_netns_up "cb$$" "$SERVER_CPUS" "$CLIENT_CPUS" "$CLIENT_NETNS" || exit 2
  CLIENT_NS="cb$$" DATA_ADDR=10.203.0.1
  CLIENT=(ip netns exec "$CLIENT_NS")
  log "clients in the network namespace $CLIENT_NS, the servers on $DATA_ADDR (veth, $CLIENT_NETNS)"
fi
[ -n "$CLIENT_CPUS" ] && CLIENT+=(taskset -c "$CLIENT_CPUS")
[ -n "$SERVER_CPUS" ] && SERVER_PREFIX=(taskset -c "$SERVER_CPUS")

# launch COMMAND...: runs COMMAND (call it in the background) after SERVER_PREFIX (a namespace,
# CPUs), in the held group while HOLDING is 1.
launch() {
  [ "$HOLDING" = 1 ] && hold_exec "${SERVER_PREFIX[@]}" "$@"
  exec "${SERVER_PREFIX[@]}" "$@"
}

# start SERVER LOG [slow]: SERVER serving HANDLER, its configs and logs LOG-*. Caracal: snic_server
# and AGENTS agents, started together (a GPU agent takes seconds to set up its device), the last
# slowed by SLOW_DELAY_US with slow; agent k (AGENT_BASE + i) on gpu:k mod GPUS when there are
# more than one. host_centric on the GPUs of HC_GPUS. Sets UDP_PORT, TCP_PORT, METRICS_PORT,
# SERVER_PIDS (the server first) and AGENT_PIDS. A server started again under the same name
# must not be read from its predecessor's logs, so they go first.
start() {
  local server=$1 log=$2 slow=${3:-} i n name accel extra engine=$ENGINE_THREADS control logs=()
  SERVER_PIDS=() AGENT_PIDS=() METRICS_PORT='' UDP_PORT='' TCP_PORT=''
  rm -f "$log"-server.log "$log"-agent*.log
  if [ "$server" = host_centric ] || [ "$server" = cpu ]; then
    extra=(--handler "$HANDLER" --address "$DATA_ADDR" --threads "$THREADS" --max-message-bytes "$MAX_MESSAGE")
    [ "$server" = host_centric ] &&
      extra+=(--batch "$BATCH" --batch-timeout-us "$BATCH_TIMEOUT_US" --gpus "${HC_GPUS:-0}")
    [ "$HANDLER" = matvec ] && [ -n "$MATVEC_ROUNDS" ] && extra+=(--matvec-rounds "$MATVEC_ROUNDS")
    [ "$HANDLER" = face ] && extra+=(--memcached "127.0.0.1:$MC_PORT" --memcached-timeout-ms "$FACE_TIMEOUT_MS")
    launch "$([ "$server" = cpu ] && echo "$CPU_SERVER" || echo "$HC_SERVER")" "${extra[@]}" \
      >"$log-server.log" 2>&1 &
    PIDS+=($!) SERVER_PIDS=($!)
    wait_for_line "$log-server.log" "^listening udp" 30 || return 1
    UDP_PORT=$(sed -nE 's/^listening udp ([0-9]+) tcp ([0-9]+).*/\1/p' "$log-server.log")
    TCP_PORT=$(sed -nE 's/^listening udp ([0-9]+) tcp ([0-9]+).*/\2/p' "$log-server.log")
  else
    [ "$server" = caracal_threads ] && engine=$ENGINE_THREADS_ALT
    cat >"$log-server.yaml" <<YAML
io_threads: $THREADS
$([ -n "$engine" ] && echo "engine_threads: $engine")
log_level: warn
control: { listen: 127.0.0.1:0, secret: $SECRET${HEARTBEAT_MS:+, heartbeat_interval_ms: $HEARTBEAT_MS}, agent_timeout_ms: 5000 }
$([ "$METRICS" = 1 ] && echo "metrics: { listen: 127.0.0.1:0 }")
services:
  - name: $HANDLER
    max_message_bytes: $MAX_MESSAGE
    dispatch: $DISPATCH
    listeners:
      - { protocol: udp, listen: $DATA_ADDR:0${ERROR_REPLY:+, error_reply: '$ERROR_REPLY'}${SPREAD:+, spread: $SPREAD} }
      - { protocol: tcp, listen: $DATA_ADDR:0, framing: { kind: length_prefixed, prefix_bytes: 4 }${ERROR_REPLY:+, error_reply: '$ERROR_REPLY'} }
$(face_destinations "$HANDLER")
YAML
    launch "$SNIC" --config "$log-server.yaml" --log-level info >"$log-server.log" 2>&1 &
    PIDS+=($!) SERVER_PIDS=($!)
    wait_for_line "$log-server.log" "serving [0-9]+ service" 20 || return 1
    control=$(sed -nE 's/.*control endpoint on .* \(port ([0-9]+)\).*/\1/p' "$log-server.log")
    UDP_PORT=$(sed -nE "s#.*listening on udp/$DATA_ADDR:0 \\(port ([0-9]+)\).*#\\1#p" "$log-server.log" | head -1)
    TCP_PORT=$(sed -nE "s#.*listening on tcp/$DATA_ADDR:0 \\(port ([0-9]+)\).*#\\1#p" "$log-server.log" | head -1)
    METRICS_PORT=$(sed -nE 's/.*metrics on http:.*:([0-9]+)\/metrics.*/\1/p' "$log-server.log")
    for ((i = 0; i < AGENTS; i++)); do
      n=${i#0} name=bench-$HANDLER${n:+-$n}
      case "$REPORT" in
        gpus) name=acc$i n=$i ;;
        instances) name=instances-$SERVER_INDEX-$i n=$i ;;
        profile) name=profile-$HANDLER ;;
      esac
      accel=$CARACAL_ACCEL
      if [ "${accel#gpu}" != "$accel" ] && { [ "$AGENTS" -gt 1 ] || [ "${AGENT_BASE:-0}" -gt 0 ]; }; then
        accel=gpu:$(((${AGENT_BASE:-0} + i) % (GPUS > 0 ? GPUS : 1024)))
      fi
      extra=()
      [ "$HANDLER" = matvec ] && [ -n "$MATVEC_ROUNDS" ] && extra=(--rounds "$MATVEC_ROUNDS")
      [ "$slow" = slow ] && [ "$i" -eq $((AGENTS - 1)) ] && extra+=(--delay-us "$SLOW_DELAY_US")
      cat >"$log-agent$n.yaml" <<YAML
agent: $name
server: 127.0.0.1:$control
secret: $SECRET
accelerator: $accel
transport: shm
log_level: info
cpu: { workers: $CPU_WORKERS${GPU_BURST:+, burst: $GPU_BURST} }
$([ "${accel#gpu}" != "$accel" ] && echo "gpu: { workers: $GPU_WORKERS${GPU_BURST:+, burst: $GPU_BURST}${GPU_OPTIONS:+, $GPU_OPTIONS} }")
reconnect_interval_ms: 100
services:
  - { name: $HANDLER, queues: $AGENT_QUEUES, ring_capacity: $AGENT_RING_CAPACITY, slot_bytes: 256, max_message_bytes: $MAX_MESSAGE${RX_LINES:+, rx_lines: $RX_LINES}${TX_LINES:+, tx_lines: $TX_LINES}$(client_queues "$HANDLER") }
YAML
      launch "${AGENT_BIN[$HANDLER]}" --config "$log-agent$n.yaml" "${extra[@]}" >"$log-agent$n.log" 2>&1 &
      PIDS+=($!) AGENT_PIDS+=($!) logs+=("$log-agent$n.log")
    done
    for f in "${logs[@]}"; do wait_for_line "$f" "serving [0-9]+ service" 60 || return 1; done
    wait_attached "$log-server.log" "$AGENTS" || return 1
    SERVER_PIDS+=("${AGENT_PIDS[@]}")
  fi
  [ -n "$UDP_PORT" ] && [ -n "$TCP_PORT" ] || { echo "run.sh: no ports for $server" >&2; return 1; }
}

# loadgen NAME PROTO PORT SIZE ARGS...: caracal_loadgen on HANDLER from CLIENT against
# DATA_ADDR:PORT, its JSON and summary RAW/NAME.json and .out.
loadgen() {
  local name=$1 proto=$2 port=$3 size=$4 work=()
  shift 4
  [ "$HANDLER" = face ] && work=(--face-persons "$FACE_PERSONS")
  [ "$HANDLER" = matvec ] && [ -n "$MATVEC_ROUNDS" ] && work=(--matvec-rounds "$MATVEC_ROUNDS")
  # shellcheck disable=SC2086 # LOADGEN_ARGS: options, split on purpose
  "${CLIENT[@]}" "$LOADGEN" --host "$DATA_ADDR" --port "$port" --proto "$proto" --handler "$HANDLER" \
    --size "$size" "${work[@]}" --warmup "$WARMUP" --duration "$DURATION" --json "$RAW/$name.json" \
    --label "$name" $LOADGEN_ARGS "$@" >"$RAW/$name.out" 2>&1
}

# engine_idle_seconds: caracal_engine_idle_seconds_total summed over snic_server's engine
# threads (seconds its polling threads found no work); nothing without metrics.
engine_idle_seconds() {
  [ -n "$METRICS_PORT" ] || return 0
  curl -sf -m 5 "http://127.0.0.1:$METRICS_PORT/metrics" 2>/dev/null |
    awk '/^caracal_engine_idle_seconds_total\{/ { s += $2; n++ } END { if (n) printf "%.6f", s }'
}

# save_metrics FILE: snic_server's metrics page now, for the record (RAW/FILE); 1 without one.
save_metrics() {
  [ -n "$METRICS_PORT" ] && curl -sf -m 5 "http://127.0.0.1:$METRICS_PORT/metrics" >"$RAW/$1" 2>/dev/null ||
    { rm -f "$RAW/$1"; return 1; }
}

# answered FILE: save_metrics FILE, and from it the answered requests per agent ("agent<TAB>
# answered" lines; gpus_report.py sums caracal_queue_answered_requests); nothing without a page.
answered() { ! save_metrics "$1" || python3 "$HERE/gpus_report.py" --scrape "$RAW/$1"; }

# point NAME PROTO SIZE KIND HEAD LOADGEN_ARGS...: one loadgen run against the running server
# with the server's CPU over it; a line of points.jsonl: HEAD (its first fields), then REPORT's.
point() {
  local name=$1 proto=$2 size=$3 kind=$4 head=$5 port=$UDP_PORT rc=0 sat=0 fifo=$RAW/$1.perf
  local t0 t1 p0 p1 m0 m1 a0 a1 w0 w1 c0='' c1='' i0='' i1='' th0='' threads='{}' perf='' ctl='' ack='' hold='' hook=''
  local before='' agents='{}' cores idle=null cpus=null lpid
  shift 5
  [ "$proto" = tcp ] && port=$TCP_PORT
  [ "$REPORT:$kind" = compare:saturation ] && sat=1 && th0=$(thread_ticks "${SERVER_PIDS[@]}")
  if [ "$sat" = 1 ] && [ -n "$PERF" ]; then
    # perf starts with sampling off and answers a ping once it is attached; only then does the
    # load start, and sampling is turned on after the warm-up and off when the load ends. (A
    # perf that slept through the warm-up and then attached on its own time could, on a loaded
    # machine, attach after a short run had ended and sample an idle server.)
    rm -f "$fifo.ctl" "$fifo.ack"
    mkfifo "$fifo.ctl" "$fifo.ack"
    "$PERF" record -q -e cpu-clock -g -F 2999 -D -1 --control "fifo:$fifo.ctl,$fifo.ack" \
      -p "$(IFS=,; echo "${SERVER_PIDS[*]}")" -o "$RAW/$name.perf.data" >"$RAW/$name-perf.log" 2>&1 &
    perf=$!
    # Read-write opens of a FIFO do not wait for the other end.
    exec {ctl}<>"$fifo.ctl" {ack}<>"$fifo.ack"
    perf_command "$ctl" "$ack" ping || log "$name: perf did not answer (see raw/$name-perf.log)"
  fi
  [ "$REPORT" = gpus ] && [ -n "$METRICS_PORT" ] && before=$(answered "$name-metrics-before.txt")
  [ "$HOLDING" = 1 ] && hold=$(hold_stat)
  [ "$REPORT" = compare ] && i0=$(engine_idle_seconds)
  # The wall-clock window encloses the tick readings (read it first, and last after the load),
  # so that a reading that is slow to start, as on a loaded machine, cannot count ticks outside
  # it: a pinned server's CPUs are never more than fully busy.
  w0=$(date +%s.%N)
  [ -n "$SERVER_CPUS" ] && c0=$(cpus_ticks "$SERVER_CPUS")
  t0=$(pid_ticks "${SERVER_PIDS[@]}") p0=$(pid_ticks "${SERVER_PIDS[0]}") m0=$(pid_ticks $MC_PID) a0=$(machine_ticks)
  # ON_LOAD_START, when set, names a command started (in the background) as the load starts.
  if [ -n "$ON_LOAD_START" ]; then $ON_LOAD_START & hook=$!; fi
  loadgen "$name" "$proto" "$port" "$size" "$@" &
  lpid=$!
  if [ -n "$perf" ]; then
    sleep "$WARMUP"
    perf_command "$ctl" "$ack" enable || log "$name: perf did not start sampling"
  fi
  wait "$lpid" || rc=$?
  t1=$(pid_ticks "${SERVER_PIDS[@]}") p1=$(pid_ticks "${SERVER_PIDS[0]}") m1=$(pid_ticks $MC_PID) a1=$(machine_ticks)
  [ -n "$SERVER_CPUS" ] && c1=$(cpus_ticks "$SERVER_CPUS")
  w1=$(date +%s.%N)
  [ -n "$SERVER_CPUS" ] && cpus=$(cores_over $((c1 - c0)) "$w0" "$w1")
  [ "$REPORT" = compare ] && i1=$(engine_idle_seconds)
  [ -n "$i0" ] && [ -n "$i1" ] && idle=$(awk -v a="$w0" -v b="$w1" -v i0="$i0" -v i1="$i1" 'BEGIN { printf "%.3f", (i1 - i0) / (b - a) }')
  [ -z "$hook" ] || wait "$hook"
  if [ -n "$perf" ]; then
    perf_command "$ctl" "$ack" stop || kill -INT "$perf" 2>/dev/null
    wait "$perf" || true
    exec {ctl}>&- {ack}<&-
    rm -f "$fifo.ctl" "$fifo.ack"
    # The flat profile, then where the symbols above 3% were called from.
    { "$PERF" report -i "$RAW/$name.perf.data" --stdio --no-children -g none --percent-limit 0.3 \
        --sort comm,dso,sym
      "$PERF" report -i "$RAW/$name.perf.data" --stdio --no-children -g caller,0.5,callee \
        --percent-limit 3 --sort sym; } 2>>"$RAW/$name-perf.log" | sed -e 's/ *$//' -e '/^# \.\.\./d' >"$RAW/$name-perf.txt"
    rm -f "$RAW/$name.perf.data"
  fi
  if [ "$REPORT" = gpus ] && [ -n "$METRICS_PORT" ]; then
    # Answered per agent over the point (warm-up included), as JSON.
    agents=$(awk -F'\t' 'NR == FNR { b[$1] = $2; next }
      { s = s (s == "" ? "" : ",") sprintf("\"%s\":%d", $1, $2 - b[$1]) }
      END { printf "{%s}", s }' <(printf '%s\n' "$before") <(printf '%s\n' "$(answered "$name-metrics.txt")"))
  fi
  [ "$sat" = 1 ] && threads=$(threads_json "$th0" "$(thread_ticks "${SERVER_PIDS[@]}")" "$(awk -v a="$w0" -v b="$w1" 'BEGIN { print b - a }')")
  if [ -n "$hold" ]; then
    # The quota and thread count (set by the caller), and the enforcement periods over the run.
    # shellcheck disable=SC2046 # split on purpose: two numbers from each hold_stat
    set -- $hold $(hold_stat)
    hold=$(printf '"hold":{"to":"%s","cores":%s,"threads":%d,"period_us":%d,"periods":%d,"throttled":%d},' \
      "$HOLD_TO" "$HOLD_CORES" "$THREADS" "$HOLD_PERIOD_US" $(($3 - $1)) $(($4 - $2)))
  fi
  cores=$(cores_over $((t1 - t0)) "$w0" "$w1")
  if [ "$REPORT" = gpus ]; then
    printf '%s"loadgen_rc":%d,"cpu_cores":%s,"memcached_cores":%s,"machine_cores":%s,"wall_s":%s,"answered_by_agent":%s,"json":"%s"}\n' \
      "$head" "$rc" "$cores" "$([ -n "$MC_PID" ] && cores_over $((m1 - m0)) "$w0" "$w1" || echo null)" \
      "$(cores_over $((a1 - a0)) "$w0" "$w1")" "$(awk -v a="$w0" -v b="$w1" 'BEGIN { printf "%.3f", b - a }')" \
      "$agents" "$name.json" >>"$POINTS"
  else
    printf '%s%s"loadgen_rc":%d,"cpu_cores":%s,"process_cores":%s,"server_cpus_cores":%s,"engine_idle_cores":%s,"threads":%s,"json":"%s"}\n' \
      "$head" "$hold" "$rc" "$cores" "$(cores_over $((p1 - p0)) "$w0" "$w1")" "$cpus" "$idle" "$threads" \
      "$name.json" >>"$POINTS"
  fi
  log "$name: $(head -1 "$RAW/$name.out") [server cores $cores]${METRICS_PORT:+${before:+ answered $agents}}"
  [ "$rc" -eq 0 ] || FAILED=$((FAILED + 1))
}

# cpoint SERVER PROTO SIZE KIND LOADGEN_ARGS...: a point of compare, of SERVER on HANDLER.
cpoint() {
  local server=$1 proto=$2 size=$3 kind=$4
  shift 4
  point "$server-$HANDLER-$proto-$size-$kind${ROUND:+-$ROUND}" "$proto" "$size" "$kind" \
    "$(printf '{"server":"%s","handler":"%s","proto":"%s","size":%s,"kind":"%s",%s' "$server" \
      "$HANDLER" "$proto" "$size" "$kind" "${ROUND:+\"round\":$ROUND,}")" "$@"
}

# gpoint EXPERIMENT SERVER COUNT PROTO KIND POLICY LOADGEN_ARGS...: a point of gpus.
gpoint() {
  local experiment=$1 server=$2 count=$3 proto=$4 kind=$5 policy=$6
  shift 6
  point "$experiment-$server-n$count-$proto-$kind${policy:+-$policy}" "$proto" "$SIZE" "$kind" \
    "$(printf '{"experiment":"%s","server":"%s","accelerators":%d,"proto":"%s","size":%d,"kind":"%s","policy":"%s",' \
      "$experiment" "$server" "$count" "$proto" "$SIZE" "$kind" "$policy")" "$@"
}

# sockperf_point SERVER SIZE [KIND]: sockperf ping-pong against the server's echo over UDP.
sockperf_point() {
  local server=$1 size=$2 kind=${3:-sockperf} t0 t1 w0 w1 rc=0 cores
  local name="$server-echo-udp-$size-$kind${ROUND:+-$ROUND}"
  local secs
  secs=$(awk -v d="$DURATION" 'BEGIN { s = int(d + 0.999); print (s < 1 ? 1 : s) }')
  t0=$(pid_ticks "${SERVER_PIDS[@]}") w0=$(date +%s.%N)
  # --full-rtt: round trips, as loadgen measures them (sockperf's default is half of one).
  timeout $((secs + 30)) "${CLIENT[@]}" "$SOCKPERF" ping-pong -i "$DATA_ADDR" -p "$UDP_PORT" -m "$size" \
    -t "$secs" --full-rtt >"$RAW/$name.txt" 2>&1 || rc=$?
  w1=$(date +%s.%N) t1=$(pid_ticks "${SERVER_PIDS[@]}")
  cores=$(cores_over $((t1 - t0)) "$w0" "$w1")
  printf '{"server":"%s","handler":"echo","proto":"udp","size":%s,"kind":"%s",%s"sockperf_rc":%d,"cpu_cores":%s,"sockperf":"%s"}\n' \
    "$server" "$size" "$kind" "${ROUND:+\"round\":$ROUND,}" "$rc" "$cores" "$name.txt" >>"$POINTS"
  log "$name: $(grep -m1 -E 'Summary: (Round trip|Latency)' "$RAW/$name.txt" || echo "sockperf exited $rc")"
}

# The start of a compare server: host_centric on one GPU.
cstart() { HC_GPUS=0 start "$1" "$RAW/$1-$HANDLER"; }
# rate SATURATION FRACTION: that fraction of a saturation throughput, in requests per second.
rate() { awk -v s="$1" -v f="$2" 'BEGIN { printf "%d", s * f }'; }

# What the run was, for the reports (run.json); each report reads its own keys, in this order.
facts() {
  local commit=${CARACAL_COMMIT:-$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo unknown)}
  local gpu more='' params
  if [ "$REPORT" = instances ]; then
    cat <<JSON
{"commit": "${CARACAL_COMMIT:-$(git -C "$SRC" rev-parse HEAD 2>/dev/null || echo unknown)}", "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "accelerator": "$([ "$GPUS" -ge 1 ] && echo gpu || echo cpu)",
 "gpus": $GPUS, "gpu": "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)",
 "cpu": "$(cpu_model)", "cpus": $(nproc),
 "physical_cores": ${#CORES[@]}, "kernel": "$(uname -r)",
 "params": {"layouts": "$LAYOUTS", "protos": "$PROTOS", "size": $SIZE, "rounds": $ROUNDS,
  "duration_s": $DURATION, "warmup_s": $WARMUP, "conns_per_thread": $SAT_PER_THREAD,
  "sat_window": $SAT_WINDOW, "threads_per_agent": $THREADS_PER_AGENT, "agent_queues": $(json_word "$AGENT_QUEUES"),
  "dispatch": "$DISPATCH", "pin": $PINNED}}
JSON
    return
  fi
  if [ "$REPORT" = compare ]; then
    gpu="\"gpu\": \"$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)\""
    more=", \"low_load_servers\": \"$LOW_LOAD_SERVERS\", \"caracal_accelerator\": \"$CARACAL_ACCEL\""
    params="\"duration_s\": $DURATION, \"warmup_s\": $WARMUP, \"server_threads\": $THREADS, \"engine_threads\": \"${ENGINE_THREADS:-default}\", \"engine_threads_alt\": \"$ENGINE_THREADS_ALT\", \"rx_lines\": \"${RX_LINES:-default}\", \"tx_lines\": \"${TX_LINES:-default}\", \"loadgen_threads\": $LOADGEN_THREADS, \"sat_connections\": $SAT_CONNECTIONS, \"sat_window\": $SAT_WINDOW, \"batch\": $BATCH, \"batch_timeout_us\": $BATCH_TIMEOUT_US, \"agent_queues\": $(json_word "$AGENT_QUEUES"), \"agents\": $AGENTS, \"gpu_workers\": $GPU_WORKERS, \"gpu_options\": \"$GPU_OPTIONS\", \"cpu_workers\": $CPU_WORKERS, \"sizes\": \"$SIZES\", \"handlers\": \"$HANDLERS\", \"face_persons\": $FACE_PERSONS, \"memcached_threads\": $MEMCACHED_THREADS, \"low_load_rounds\": $LOW_LOAD_ROUNDS, \"open_sizes\": \"$OPEN_SIZES\", \"open_fractions\": \"$OPEN_FRACTIONS\", \"open_rates\": \"$OPEN_RATES\", \"loadgen_args\": \"$LOADGEN_ARGS\", \"hold_to\": \"$HOLD_TO\", \"hold_threads\": \"${HOLD_THREADS:-quota}\", \"hold_period_us\": $HOLD_PERIOD_US, \"server_cpus\": \"$SERVER_CPUS\", \"client_cpus\": \"$CLIENT_CPUS\", \"spread\": \"${SPREAD:-default}\", \"dispatch\": \"$DISPATCH\", \"client_netns\": \"$CLIENT_NETNS\""
  else
    gpu="\"gpus\": $( (nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>/dev/null || true) |
      python3 -c 'import json, sys; print(json.dumps([l.strip() for l in sys.stdin if l.strip()]))'), \"accelerators\": $GPUS"
    params="\"handler\": \"$HANDLER\", \"face_persons\": $FACE_PERSONS, \"memcached_threads\": $MEMCACHED_THREADS, \"counts\": \"$COUNTS\", \"rounds\": ${MATVEC_ROUNDS:-1}, \"size\": $SIZE, \"protos\": \"$PROTOS\", \"threads\": $THREADS, \"engine_threads\": \"${ENGINE_THREADS:-default}\", \"agent_queues\": $(json_word "$AGENT_QUEUES"), \"gpu_burst\": ${GPU_BURST:-1}, \"gpu_options\": \"$GPU_OPTIONS\", \"spread\": \"${SPREAD:-default}\", \"batch\": $BATCH, \"batch_timeout_us\": $BATCH_TIMEOUT_US, \"dispatch\": \"$DISPATCH\", \"sat_connections\": $SAT_CONNECTIONS, \"sat_window\": $SAT_WINDOW, \"loadgen_threads\": $LOADGEN_THREADS, \"duration_s\": $DURATION, \"warmup_s\": $WARMUP, \"open_fractions\": \"$OPEN_FRACTIONS\", \"slow_delay_us\": $SLOW_DELAY_US, \"loss_agents\": $LOSS_AGENTS, \"loss_duration_s\": $LOSS_DURATION, \"loss_kill_at_s\": $LOSS_KILL_AT, \"sample_ms\": $SAMPLE_MS, \"experiments\": \"$EXPERIMENTS\", \"server_cpus\": \"$SERVER_CPUS\", \"client_cpus\": \"$CLIENT_CPUS\", \"memcached_cpus\": \"$MEMCACHED_CPUS\""
  fi
  cat <<JSON
{"date_utc": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "commit": "$commit", "cpu_only": $([ "$CPU_ONLY" = 1 ] && echo true || echo false), $gpu,
 "cpu_model": "$(cpu_model)", "online_cpus": $(nproc --all),
 "kernel": "$(uname -sr)", "hostname": "$(hostname)", "servers": "$SERVERS"$more,
 "params": {$params},
 "failed_points": $FAILED}
JSON
}

# Held points: checked before anything runs, so that a run that cannot make them stops at once.
if [ "$REPORT" = compare ] && [ -n "$HOLD_TO" ]; then
  { has "$SERVERS" "$HOLD_TO" && [ "$HOLD_TO" != caracal ]; } ||
    die "HOLD_TO=$HOLD_TO is not another server of this run ($SERVERS)"
  [[ "$HOLD_PERIOD_US" =~ ^[0-9]+$ ]] && [ "$HOLD_PERIOD_US" -ge 1000 ] && [ "$HOLD_PERIOD_US" -le 1000000 ] ||
    die "HOLD_PERIOD_US=$HOLD_PERIOD_US is not in the kernel's 1000 to 1000000"
  [[ "$HOLD_THREADS" =~ ^([1-9][0-9]*)?$ ]] || die "HOLD_THREADS=$HOLD_THREADS is not a thread count"
  hold_create "caracal-bench-held-$$" || die "HOLD_TO=$HOLD_TO: no CPU quota can be set here (above)"
fi
if [ "$LOW_LOAD_SERVERS" = auto ]; then
  LOW_LOAD_SERVERS=
  for s in caracal cpu; do has "$SERVERS" "$s" && LOW_LOAD_SERVERS="${LOW_LOAD_SERVERS:+$LOW_LOAD_SERVERS }$s"; done
fi
has "$HANDLERS" echo || LOW_LOAD_SERVERS=  # the rounds serve echo
SIZE=$(sizes)
if [ "$REPORT" = gpus ]; then
  [ "$COUNTS" = auto ] && COUNTS=$(seq -s ' ' 1 "$GPUS")
  largest=0
  for n in $COUNTS; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] && [ "$n" -le "$GPUS" ] || die "COUNTS has $n, not a count of 1 to $GPUS accelerators"
    [ "$n" -gt "$largest" ] && largest=$n
  done
  [ "$LOSS_AGENTS" = auto ] && LOSS_AGENTS=$((largest > 2 ? largest : 2))
fi
has "$HANDLERS" face && [ "$REPORT" != instances ] && { start_memcached || exit 1; }

case "$REPORT" in
  compare)
    # Echo at low load, LOW_LOAD_ROUNDS times: a fresh server each round, the order of the
    # servers turned round every other round.
    if [ "$LOW_LOAD_ROUNDS" -gt 0 ] && [ -n "$LOW_LOAD_SERVERS" ]; then
      log "== low load: $LOW_LOAD_ROUNDS rounds of $LOW_LOAD_SERVERS"
      HANDLER='echo'
      for ROUND in $(seq "$LOW_LOAD_ROUNDS"); do
        turns=$LOW_LOAD_SERVERS
        [ $((ROUND % 2)) -eq 0 ] && turns=$(echo "$LOW_LOAD_SERVERS" | tr ' ' '\n' | tac | tr '\n' ' ')
        for server in $turns; do
          if cstart "$server"; then
            cpoint "$server" udp 64 low-load --connections 1 --window 1
            [ -n "$SOCKPERF" ] && sockperf_point "$server" 64 sockperf-low-load
            save_metrics "$server-echo-round$ROUND-metrics.txt"
          else
            FAILED=$((FAILED + 1))
          fi
          stop_servers
        done
      done
      ROUND=
    fi
    for HANDLER in $HANDLERS; do
      for server in $SERVERS; do
        log "== $server / $HANDLER"
        cstart "$server" || { FAILED=$((FAILED + 1)); stop_servers; continue; }
        for proto in $PROTOS; do
          for size in $(sizes); do
            cpoint "$server" "$proto" "$size" latency --connections 1 --window 1
            cpoint "$server" "$proto" "$size" saturation "${SAT[@]}"
            has "$OPEN_SIZES" "$size" || continue
            sat=$(saturation_rps "$RAW/$server-$HANDLER-$proto-$size-saturation.json")
            if [ -n "$sat" ] && awk -v s="$sat" 'BEGIN { exit !(s > 100) }'; then
              for f in $OPEN_FRACTIONS; do
                cpoint "$server" "$proto" "$size" "open-$f" --mode open --rate "$(rate "$sat" "$f")" "${SAT[@]}"
              done
            fi
            for r in $OPEN_RATES; do
              cpoint "$server" "$proto" "$size" "open-at-$r" --mode open --rate "$r" "${SAT[@]}"
            done
          done
        done
        if [ "$HANDLER" = echo ] && [ -n "$SOCKPERF" ]; then
          for size in $SIZES; do sockperf_point "$server" "$size"; done
        fi
        save_metrics "$server-$HANDLER-metrics.txt"
        stop_servers
      done
    done
    # Face at the host-centric server's saturation rate: every server at the same offered load.
    if has "$HANDLERS" face && has "$SERVERS" host_centric; then
      HANDLER=face
      for server in $SERVERS; do
        cstart "$server" || { FAILED=$((FAILED + 1)); stop_servers; continue; }
        for proto in $PROTOS; do
          sat=$(saturation_rps "$RAW/host_centric-face-$proto-4104-saturation.json")
          [ -n "$sat" ] || continue
          cpoint "$server" "$proto" 4104 open-at-host_centric --mode open --rate "$(rate "$sat" 1)" "${SAT[@]}"
        done
        stop_servers
      done
    fi
    # Caracal held to HOLD_TO's cores at each saturation point, a fresh server per point.
    if [ -n "$HOLD_TO" ]; then
      log "== caracal held to the cores of $HOLD_TO: $HOLD_CG (cgroup v$HOLD_V), period $HOLD_PERIOD_US us"
      for HANDLER in $HANDLERS; do
        for proto in $PROTOS; do
          for size in $(sizes); do
            want="\"server\":\"$HOLD_TO\",\"handler\":\"$HANDLER\",\"proto\":\"$proto\",\"size\":$size"
            ref=$(grep -F "$want,\"kind\":\"saturation\"," "$POINTS" | sed -nE 's/.*"cpu_cores":([0-9.]+).*/\1/p' | head -1)
            HOLD_CORES=$(awk -v c="${ref:-0}" 'BEGIN { printf "%.2f", int(c * 100) / 100 }')
            if awk -v c="$HOLD_CORES" 'BEGIN { exit !(c < 0.05) }'; then
              log "$HOLD_TO has no saturation point with CPU for $HANDLER $proto $size; not held"
              FAILED=$((FAILED + 1))
              continue
            fi
            threads=${HOLD_THREADS:-$(awk -v c="$HOLD_CORES" 'BEGIN { t = int(c); print t + (t < c) }')}
            if hold_set "$HOLD_CORES" "$HOLD_PERIOD_US" && HOLDING=1 THREADS=$threads cstart caracal; then
              HOLDING=1 THREADS=$threads cpoint caracal "$proto" "$size" held "${SAT[@]}"
            else
              FAILED=$((FAILED + 1))
            fi
            stop_servers
          done
        done
      done
    fi
    facts >"$RAW/run.json"
    python3 "$HERE/report.py" "$RESULTS" || FAILED=$((FAILED + 1))
    log "done: $RESULTS/compare.json, $RESULTS/compare.md ($FAILED failed)"
    ;;

  gpus)
    # Throughput (and latency against load) against the number of accelerators.
    if has "$EXPERIMENTS" scaling; then
      for n in $COUNTS; do
        for server in $SERVERS; do
          log "== scaling: $server on $n accelerator(s)"
          policy=
          [ "$server" = host_centric ] || policy=$DISPATCH
          AGENTS=$n HC_GPUS=$(seq -s, 0 $((n - 1))) start "$server" "$RAW/scaling-$server-n$n" ||
            { FAILED=$((FAILED + 1)); stop_servers; continue; }
          for proto in $PROTOS; do
            gpoint scaling "$server" "$n" "$proto" saturation "$policy" "${SAT[@]}"
            [ "$proto" = udp ] || continue
            sat=$(saturation_rps "$RAW/scaling-$server-n$n-$proto-saturation${policy:+-$policy}.json")
            [ -n "$sat" ] && awk -v s="$sat" 'BEGIN { exit !(s > 10) }' || continue
            for f in $OPEN_FRACTIONS; do
              gpoint scaling "$server" "$n" "$proto" "open-$f" "$policy" --mode open --rate "$(rate "$sat" "$f")" "${SAT[@]}"
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
        AGENTS=2 DISPATCH=$policy start caracal "$RAW/unequal-$policy" slow ||
          { FAILED=$((FAILED + 1)); stop_servers; continue; }
        gpoint unequal caracal 2 udp saturation "$policy" "${SAT[@]}"
        stop_servers
      done
    fi
    # An agent lost under load.
    if has "$EXPERIMENTS" loss && [ "$GPUS" -ge 2 ]; then
      log "== loss: $LOSS_AGENTS agents, the last killed ${LOSS_KILL_AT}s into ${LOSS_DURATION}s of TCP load"
      if AGENTS=$LOSS_AGENTS start caracal "$RAW/loss" && [ "$LOSS_AGENTS" -ge 2 ]; then
        python3 "$HERE/gpus_report.py" --sample "http://127.0.0.1:$METRICS_PORT/metrics" \
          "$RAW/loss-samples.jsonl" "$SAMPLE_MS" &
        sampler=$!
        victim=${AGENT_PIDS[$((LOSS_AGENTS - 1))]}
        kill_victim() {
          sleep "$LOSS_KILL_AT"
          kill -KILL "$victim"
          date +%s.%N >"$RAW/loss-killed-at.txt"
        }
        # Unanswered requests fail the point (--strict): every request must get a reply or an
        # error reply. The measured window is the whole run (no warm-up).
        ON_LOAD_START=kill_victim WARMUP=0 DURATION=$LOSS_DURATION gpoint loss caracal \
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
    facts >"$RAW/run.json"
    python3 "$HERE/gpus_report.py" "$RESULTS" || FAILED=$((FAILED + 1))
    log "done: $RESULTS/gpus.json, $RESULTS/gpus.md ($FAILED failed)"
    ;;

  instances)
    # The layouts, checked: per layout its servers, threads, namespaces (1 for /ns), hog kind
    # (spin, stream or none) and hog cores.
    case "$PIN" in
      "" | 0) PINNED=0 ;;
      1 | server:threads) PINNED=1 ;;
      *) die "instances keeps each server to cores of its own with PIN=server:threads (or 0: none), not '$PIN'" ;;
    esac
    L_N=() L_T=() L_NS=() L_HOG=() L_HOGS=() L_NAME=() L_SPEC=()
    max_cores=0 max_rest=0 need_netns=0
    for l in $LAYOUTS; do
      [[ "$l" =~ ^([1-9][0-9]*)x([1-9][0-9]*)(/ns)?(\+(spin|stream)([1-9][0-9]*))?$ ]] ||
        die "a layout is NxT or NxT/ns (N servers of T I/O threads), then perhaps +spinK or +streamK (K busy cores), not '$l'"
      n=${BASH_REMATCH[1]} t=${BASH_REMATCH[2]} ns=0 hog=${BASH_REMATCH[5]:-none} hogs=${BASH_REMATCH[6]:-0}
      [ -n "${BASH_REMATCH[3]}" ] && ns=1 && need_netns=1
      L_SPEC+=("$l") L_N+=("$n") L_T+=("$t") L_NS+=("$ns") L_HOG+=("$hog") L_HOGS+=("$hogs")
      L_NAME+=("${n}x$t$([ "$ns" = 1 ] && echo ns)$([ "$hog" != none ] && echo "-$hog$hogs")")
      [ $((n * t)) -gt "$max_cores" ] && max_cores=$((n * t))
      # Cores besides the servers': a client core per server, the hogs' and the probe's.
      [ $((n + hogs + 1)) -gt "$max_rest" ] && max_rest=$((n + hogs + 1))
    done
    [ "$PINNED" = 1 ] || ! [[ " $LAYOUTS " =~ \+(spin|stream) ]] ||
      die "+spin and +stream layouts need PIN=server:threads (the hogs take cores of their own)"
    [ "$need_netns" -eq 0 ] || { [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null; } ||
      die "/ns layouts need root and iproute2's ip"
    # CORES[k]: the CPUs of physical core k (comma-separated), in the order of their lowest CPU.
    CORES=()
    if [ "$PINNED" = 1 ]; then
      mapfile -t CORES < <(physical_cores)
      [ "${#CORES[@]}" -ge $((max_cores + max_rest)) ] ||
        die "the layouts need $max_cores physical cores for servers and $max_rest for the clients" \
          "(one a server at least), the hogs and the probe; this machine has ${#CORES[@]} (PIN=0 runs unpinned)"
    fi
    # cores_list FIRST COUNT: the CPUs of physical cores FIRST to FIRST + COUNT - 1.
    cores_list() { local k out=""; for ((k = $1; k < $1 + $2; k++)); do out="$out${out:+,}${CORES[k]}"; done; echo "$out"; }
    PROBE_CPU=
    [ "$PINNED" = 1 ] && PROBE_CPU=${CORES[${#CORES[@]} - 1]%%,*}
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
    # start_layout INDEX: the layout's hogs, servers and agents; 1 if one did not come up. Per
    # server: how its client starts (namespace, CPUs), its ports, processes and CPUs.
    start_layout() {
      local n=${L_N[$1]} t=${L_T[$1]} ns=${L_NS[$1]} name=${L_NAME[$1]} hogs=${L_HOGS[$1]} i k agents
      agents=$((t / THREADS_PER_AGENT))
      [ "$agents" -ge 1 ] || agents=1
      # The clients' cores: after the servers', before the hogs' and the probe's.
      local share=$(((${#CORES[@]} - max_cores - hogs - 1) / n)) first=$((${#CORES[@]} - 1 - hogs))
      S_CLIENT=() S_UDP=() S_TCP=() S_PIDS=() S_CPUS=() S_CLIENT_CPUS=()
      PROBE_IDLE=null
      if [ "$PINNED" = 1 ]; then
        PROBE_IDLE=$(probe 1) || PROBE_IDLE=null
        for ((k = first; k < first + hogs; k++)); do
          if [ "${L_HOG[$1]}" = spin ]; then
            taskset -c "${CORES[k]}" bash -c 'while :; do :; done' &
          else
            taskset -c "${CORES[k]}" dd if=/dev/zero of=/dev/null bs=256M 2>/dev/null &
          fi
          PIDS+=($!)
        done
      fi
      for ((i = 0; i < n; i++)); do
        local netns=() cpus="" ccpus=""
        if [ "$ns" = 1 ]; then
          ip netns add "ci$$-$i" && ip netns exec "ci$$-$i" ip link set lo up ||
            { echo "run.sh: could not set up the namespace ci$$-$i" >&2; return 1; }
          NAMESPACES+=("ci$$-$i")
          netns=(ip netns exec "ci$$-$i")
        fi
        SERVER_PREFIX=("${netns[@]}") CLIENT=("${netns[@]}")
        if [ "$PINNED" = 1 ]; then
          cpus=$(cores_list $((i * t)) "$t") ccpus=$(cores_list $((max_cores + i * share)) "$share")
          SERVER_PREFIX+=(taskset -c "$cpus") CLIENT+=(taskset -c "$ccpus")
        fi
        AGENTS=$agents THREADS=$t SERVER_INDEX=$i AGENT_BASE=$((i * agents)) start caracal "$RAW/$name-s$i" ||
          return 1
        S_CLIENT+=("${CLIENT[*]}") S_UDP+=("$UDP_PORT") S_TCP+=("$TCP_PORT") S_PIDS+=("${SERVER_PIDS[*]}")
        S_CPUS+=("$cpus") S_CLIENT_CPUS+=("$ccpus")
      done
      log "$name: $n servers of $t I/O threads, $agents agents of $AGENT_QUEUES queues each$(
        [ "$hogs" -gt 0 ] && echo ", $hogs cores of ${L_HOG[$1]}")$([ "$PINNED" = 1 ] && echo ", probe idle $PROBE_IDLE")"
    }
    # measure INDEX ROUND PROTO: every server of the running layout loaded at once; a line per
    # server in points.jsonl.
    measure() {
      local li=$1 round=$2 proto=$3 n=${L_N[$1]} t=${L_T[$1]} name=${L_NAME[$1]} i w0 w1 failed=0 out
      local conns=$((SAT_PER_THREAD * t)) probe_pid='' probe_load=null t0=() c0=() rcs=() lpids=()
      w0=$(date +%s.%N) # before the tick readings and after them at the end, as in point()
      for ((i = 0; i < n; i++)); do
        # shellcheck disable=SC2086 # a list of pids
        t0[i]=$(pid_ticks ${S_PIDS[i]})
        c0[i]=0
        [ -n "${S_CPUS[i]}" ] && c0[i]=$(cpus_ticks "${S_CPUS[i]}")
      done
      if [ "$PINNED" = 1 ]; then
        probe "$DURATION" "$WARMUP" >"$RAW/$name-r$round-$proto.probe" &
        probe_pid=$!
      fi
      for ((i = 0; i < n; i++)); do
        read -ra CLIENT <<<"${S_CLIENT[i]}"
        loadgen "$name-r$round-$proto-s$i" "$proto" "$([ "$proto" = tcp ] && echo "${S_TCP[i]}" || echo "${S_UDP[i]}")" \
          "$SIZE" --connections "$conns" --window "$SAT_WINDOW" --threads "$conns" &
        lpids[i]=$!
      done
      for ((i = 0; i < n; i++)); do
        rcs[i]=0
        wait "${lpids[i]}" || rcs[i]=$?
        [ "${rcs[i]}" -eq 0 ] || failed=$((failed + 1))
      done
      local t1=() c1=()
      for ((i = 0; i < n; i++)); do
        # shellcheck disable=SC2086 # a list of pids
        t1[i]=$(pid_ticks ${S_PIDS[i]})
        c1[i]=0
        [ -n "${S_CPUS[i]}" ] && c1[i]=$(cpus_ticks "${S_CPUS[i]}")
      done
      w1=$(date +%s.%N)
      if [ -n "$probe_pid" ]; then
        wait "$probe_pid" && probe_load=$(cat "$RAW/$name-r$round-$proto.probe")
        [ -n "$probe_load" ] || probe_load=null
      fi
      for ((i = 0; i < n; i++)); do
        out="$name-r$round-$proto-s$i"
        awk -v layout="${L_SPEC[li]}" -v n="$n" -v t="$t" -v ns="${L_NS[li]}" -v round="$round" -v proto="$proto" \
          -v hog="${L_HOG[li]}" -v hogs="${L_HOGS[li]}" -v pidle="$PROBE_IDLE" -v pload="$probe_load" \
          -v i="$i" -v rc="${rcs[i]}" -v dt="$((t1[i] - t0[i]))" -v dc="$((c1[i] - c0[i]))" \
          -v pinned="$PINNED" -v hz="$(getconf CLK_TCK)" -v a="$w0" -v b="$w1" -v json="$out.json" \
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
    for ((round = 1; round <= ROUNDS; round++)); do
      order=()
      for ((li = 0; li < ${#L_N[@]}; li++)); do
        if [ $((round % 2)) -eq 0 ]; then order=("$li" "${order[@]}"); else order+=("$li"); fi
      done
      for li in "${order[@]}"; do
        if start_layout "$li"; then
          for proto in $PROTOS; do measure "$li" "$round" "$proto" || FAILED=$((FAILED + 1)); done
        else
          FAILED=$((FAILED + 1))
        fi
        stop_servers
      done
    done
    facts >"$RAW/run.json"
    python3 "$HERE/instances_report.py" "$RESULTS" || FAILED=$((FAILED + 1))
    log "done ($FAILED failed)"
    ;;

  profile)
    for HANDLER in $HANDLERS; do
      for proto in $PROTOS; do
        for size in $(sizes); do
          name=$HANDLER-$proto-$size
          start caracal "$RAW/$name" || { FAILED=$((FAILED + 1)); stop_servers; continue; }
          perf=
          if [ -n "$PERF" ]; then
            target=(-p "${SERVER_PIDS[0]}")
            [ -n "$PERF_PROCESS" ] ||
              target=(-t "$(grep -l caracal-engine /proc/"${SERVER_PIDS[0]}"/task/*/comm | head -1 | cut -d/ -f5)")
            (sleep "$WARMUP"; exec "$PERF" record -e cpu-clock -F 4000 "${target[@]}" \
              -o "$RAW/$name-perf.data" -- sleep "$DURATION") >"$RAW/$name-perf.log" 2>&1 &
            perf=$!
          fi
          load=("${SAT[@]}")
          [ -n "$OPEN_RATES" ] && load+=(--mode open --rate "$OPEN_RATES")
          loadgen "$name-loadgen" "$proto" "$([ "$proto" = tcp ] && echo "$TCP_PORT" || echo "$UDP_PORT")" \
            "$size" "${load[@]}" || FAILED=$((FAILED + 1))
          [ -z "$perf" ] || wait "$perf"
          stop_servers
          echo "== $name: $(head -1 "$RAW/$name-loadgen.out")"
          grep "engine profile" "$RAW/$name-server.log" || echo "(no engine profile in the server log)"
          if [ -n "$perf" ] && [ -s "$RAW/$name-perf.data" ]; then
            "$PERF" report -i "$RAW/$name-perf.data" --stdio --sort "$([ -n "$PERF_PROCESS" ] && echo comm,)dso,sym" \
              2>/dev/null | grep -v '^#' | grep -v '^$' | head -"$PERF_LINES" >"$RAW/$name-perf.txt"
            cat "$RAW/$name-perf.txt"
          fi
        done
      done
    done
    ;;
esac
[ "$FAILED" -eq 0 ]
