#!/usr/bin/env bash
# Caracal against the baselines, side by side, in one run:
#
#   bench/compare/run.sh BUILD_DIR RESULTS_DIR [--cpu-only]
#
# Servers (each serving one handler at a time, UDP and length-prefixed TCP on loopback):
#   caracal       snic_server (io_threads = $THREADS, engine_threads = $ENGINE_THREADS) + the
#                 handler's agent on $CARACAL_ACCEL
#                 (gpu:0; cpu with --cpu-only) over the shm transport
#   caracal_threads  the same with engine_threads = $ENGINE_THREADS_ALT (2): engine threads of
#                 their own next to the I/O threads, to compare with `caracal` in one run (only
#                 when named in SERVERS)
#   host_centric  caracal_host_centric_server: $THREADS I/O threads, batches of up to $BATCH
#                 requests or $BATCH_TIMEOUT_US us, one copy / launch / copy back per batch
#                 (left out with --cpu-only, or when the build has no CUDA)
#   cpu           caracal_cpu_server: the handler inline on $THREADS I/O threads
# Handlers: echo, matvec and face (examples/; face where memcached is found). Sizes: $SIZES;
# face requests are 4104 bytes (a person id and a 64x64 image). For face the run starts a
# memcached of its own ($MEMCACHED, or memcached from PATH; $MEMCACHED_THREADS threads) and
# stores $FACE_PERSONS references in it with caracal_face_loader; every server fetches from it
# (Caracal through client queues, one per agent queue; the baselines over a connection per I/O
# thread), and with the host-centric server in the run every server is measured again at the
# host-centric server's face saturation rate (open loop, kind open-at-host_centric). For each
# server, handler, size and protocol:
#   latency     closed loop, 1 connection, window 1
#   saturation  closed loop, $SAT_CONNECTIONS connections x window $SAT_WINDOW
#   load steps  open loop at $OPEN_FRACTIONS of the saturation throughput (sizes $OPEN_SIZES)
# plus sockperf ping-pong (UDP) against each server's echo, for every size. Before all of that,
# echo at low load is measured $LOW_LOAD_ROUNDS times over UDP at 64 B (loadgen's latency point
# and sockperf) on each of $LOW_LOAD_SERVERS, a fresh server each time, the servers taking turns
# and the first of each round alternating: one run at this scale moves by several us, so the
# aim (Caracal's p50 over the CPU server's) is read from the median of the rounds. CPU cores used by
# each server's processes (utime + stime from /proc/PID/stat over each run's wall time; for
# Caracal, snic_server and the agent together; and, as process_cores, the first process alone:
# snic_server without its agent) are recorded with every point; for Caracal also
# engine_idle_cores, the seconds per second its engine threads spent without work
# (caracal_engine_idle_seconds_total over the run): with the engine in the I/O threads (no
# ENGINE_THREADS, as threads.sh runs it), I/O threads minus it is the share of its polling
# threads that worked; with engine threads of their own it covers those threads only.
#
# Everything is verified by caracal_loadgen as it runs (a wrong reply is an error in the JSON).
# Results: RESULTS_DIR/raw/ (every loadgen JSON, sockperf output, server logs),
# RESULTS_DIR/compare.json (all of it, with the machine, GPU, date and $CARACAL_COMMIT) and
# RESULTS_DIR/compare.md (the tables). Plots are a separate step: bench/compare/plot.py.
#
# Knobs (environment): DURATION (s per point, 2), WARMUP (s, 0.5), THREADS (4), SIZES
# ("64 1024 16384"), LOADGEN_THREADS (8: a thread per connection; with 4 the client limited
# some 16 KiB points), SAT_CONNECTIONS (8), SAT_WINDOW (16), OPEN_SIZES
# ("1024"; set and empty: none), OPEN_FRACTIONS ("0.25 0.5 0.75 0.9 1.1"; set and empty: none),
# OPEN_RATES (open loop at these requests per second too, the same for every server and
# point, as kind open-at-RATE; none), BATCH (64), BATCH_TIMEOUT_US (20),
# CARACAL_ACCEL (gpu:0), AGENTS (Caracal's agents, 1; several on a GPU: agent i on gpu:i),
# AGENT_QUEUES (8, each), GPU_WORKERS (the agent's gpu.workers; 0: one per
# queue), GPU_OPTIONS (more keys of the agent's gpu map, e.g. "busy_polls: 0"), CPU_WORKERS
# (cpu.workers, 1), SOCKPERF (path; else PATH, else build-debs/*.deb),
# SERVERS (of "caracal host_centric cpu"; default: every one built), SNIC (the snic_server
# binary; another build's, to compare two versions of the server in one session), LOADGEN_ARGS
# (more caracal_loadgen options for every point, e.g. --busy-poll), ENGINE_THREADS (snic_server's
# engine_threads; unset: the key is left out and the server's default applies, so that a server
# older than the key can run), HANDLERS ("echo matvec"), RX_LINES (the agent's rx_lines: on, off
# or auto; unset: the key is left out and the agent's default applies, on for a GPU over shm),
# TX_LINES (the agent's tx_lines, the same way),
# AGENT_RING_CAPACITY (the agent's ring_capacity, 512 slots of 256 bytes), ENGINE_THREADS_ALT
# (caracal_threads' engine_threads, 2), FACE_PERSONS (10000), MEMCACHED, MEMCACHED_THREADS (4),
# MEMCACHED_CPUS (a taskset list for memcached; unset: anywhere),
# FACE_TIMEOUT_MS (the memcached timeout of every server, 1000), LOW_LOAD_ROUNDS (5; 0: none), LOW_LOAD_SERVERS (those of
# "caracal cpu" in SERVERS), PERF (a perf binary: each saturation point also samples the server's
# processes with `perf record -g` over the measured window and keeps the flat profile, per
# thread name, shared object and symbol, as raw/NAME-perf.txt), HOLD_TO (a server of SERVERS:
# see below), HOLD_THREADS, HOLD_PERIOD_US, SERVER_CPUS and CLIENT_CPUS (taskset CPU lists: the
# servers with their agents, and caracal_loadgen, each kept to its own CPUs; unset: anywhere),
# SPREAD (Caracal's UDP listener's `spread`, flows or datagrams; unset: the server's default),
# DISPATCH (Caracal's service `dispatch`: round_robin, the default here, least_loaded or
# flow_affinity),
# CLIENT_NETNS (rps, or 1: caracal_loadgen and sockperf run in a network namespace of their own,
# joined by a veth pair, each side's packets taken in by its own CPUs, as a client on another
# host would have it; rfs: the same, each flow's input on the CPU of its socket's reader; needs
# root, iproute2, SERVER_CPUS and CLIENT_CPUS; lib.sh's client_netns_up says why. Unset or 0:
# loopback). With SERVER_CPUS, each point also records server_cpus_cores: how busy
# those CPUs were over it, whatever ran there (the kernel's work for the server's packets too).
#
# Held points (HOLD_TO set, e.g. host_centric; needs root and a cgroup CPU controller, v2 or v1):
# after the sessions above, Caracal runs each saturation point again inside a cgroup whose CPU
# quota is the cores HOLD_TO used at the same handler, protocol and size (rounded down to 0.01),
# enforced every HOLD_PERIOD_US (10000) us, with HOLD_THREADS I/O threads (default: the quota
# rounded up), a fresh server per point (kind "held"; the point records the quota, the threads,
# and the enforcement periods in which the group ran out of time). So Caracal is measured with
# at most the cores of the server it is compared with, as in a container with that CPU limit.
# With the defaults a full run takes several minutes.
set -uo pipefail

BUILD=$(realpath "${1:?usage: run.sh BUILD_DIR RESULTS_DIR [--cpu-only]}")
RESULTS=${2:?usage: run.sh BUILD_DIR RESULTS_DIR [--cpu-only]}
CPU_ONLY=0
[ "${3:-}" = "--cpu-only" ] && CPU_ONLY=1
SRC=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$RESULTS/raw"
RESULTS=$(realpath "$RESULTS")
RAW="$RESULTS/raw"

DURATION=${DURATION:-2}
WARMUP=${WARMUP:-0.5}
THREADS=${THREADS:-4}
SIZES=${SIZES:-"64 1024 16384"}
LOADGEN_THREADS=${LOADGEN_THREADS:-8}
SAT_CONNECTIONS=${SAT_CONNECTIONS:-8}
SAT_WINDOW=${SAT_WINDOW:-16}
OPEN_SIZES=${OPEN_SIZES-"1024"}  # set and empty: no open-loop points
OPEN_FRACTIONS=${OPEN_FRACTIONS-"0.25 0.5 0.75 0.9 1.1"}
OPEN_RATES=${OPEN_RATES:-}
BATCH=${BATCH:-64}
BATCH_TIMEOUT_US=${BATCH_TIMEOUT_US:-20}
AGENT_QUEUES=${AGENT_QUEUES:-8}
LOADGEN_ARGS=${LOADGEN_ARGS:-}
ENGINE_THREADS=${ENGINE_THREADS:-}
FACE_PERSONS=${FACE_PERSONS:-10000}
MEMCACHED_THREADS=${MEMCACHED_THREADS:-4}
FACE_TIMEOUT_MS=${FACE_TIMEOUT_MS:-1000}
FACE_SIZE=4104
MEMCACHED=${MEMCACHED:-$(command -v memcached || true)}
if [ -z "${HANDLERS:-}" ]; then
  HANDLERS="echo matvec face"
  if [ -z "$MEMCACHED" ]; then
    echo "run.sh: no memcached (set MEMCACHED or install it); face is left out" >&2
    HANDLERS="echo matvec"
  fi
fi
LOW_LOAD_ROUNDS=${LOW_LOAD_ROUNDS:-5}
MAX_MESSAGE=16384
if [ "$CPU_ONLY" -eq 1 ]; then
  CARACAL_ACCEL=${CARACAL_ACCEL:-cpu}
else
  CARACAL_ACCEL=${CARACAL_ACCEL:-gpu:0}
fi

LOADGEN="$BUILD/bench/loadgen/caracal_loadgen"
CPU_SERVER="$BUILD/bench/baselines/caracal_cpu_server"
HC_SERVER="$BUILD/bench/baselines/host_centric_server/caracal_host_centric_server"
SNIC=${SNIC:-"$BUILD/snic_server/snic_server"}
declare -A AGENT=([echo]="$BUILD/examples/echo/caracal_echo_agent"
                  [matvec]="$BUILD/examples/matvec/caracal_matvec_agent"
                  [face]="$BUILD/examples/face_verify/caracal_face_agent")
FACE_LOADER="$BUILD/examples/face_verify/caracal_face_loader"
for bin in "$LOADGEN" "$CPU_SERVER" "$SNIC"; do
  [ -x "$bin" ] || { echo "run.sh: $bin is missing (build the benchmarks first)" >&2; exit 2; }
done
for h in $HANDLERS; do
  [ -n "${AGENT[$h]:-}" ] || { echo "run.sh: no handler '$h' (echo, matvec, face)" >&2; exit 2; }
  [ -x "${AGENT[$h]}" ] || { echo "run.sh: ${AGENT[$h]} is missing (build it first)" >&2; exit 2; }
done
case " $HANDLERS " in
  *" face "*)
    for bin in "$FACE_LOADER" "$MEMCACHED"; do
      [ -x "$bin" ] || { echo "run.sh: face needs $bin (build it, or set MEMCACHED)" >&2; exit 2; }
    done
    ;;
esac
# sizes_of HANDLER: the request sizes a handler is measured at.
sizes_of() { if [ "$1" = face ]; then echo "$FACE_SIZE"; else echo "$SIZES"; fi; }
if [ -z "${SERVERS:-}" ]; then
  SERVERS="caracal cpu"
  if [ "$CPU_ONLY" -eq 0 ]; then
    if [ -x "$HC_SERVER" ]; then
      SERVERS="caracal host_centric cpu"
    else
      echo "run.sh: $HC_SERVER is missing (a build without CUDA); the host-centric server is left out" >&2
    fi
  fi
fi

if [ -z "${LOW_LOAD_SERVERS+x}" ]; then
  LOW_LOAD_SERVERS=""
  for s in caracal cpu; do
    case " $SERVERS " in *" $s "*) LOW_LOAD_SERVERS="$LOW_LOAD_SERVERS $s" ;; esac
  done
  LOW_LOAD_SERVERS=${LOW_LOAD_SERVERS# }
fi
case " $HANDLERS " in *" echo "*) ;; *) LOW_LOAD_SERVERS="" ;; esac  # the rounds serve echo

# sockperf: given, on PATH, or unpacked from build-debs/ (machines without it installed).
if [ -z "${SOCKPERF:-}" ]; then
  if command -v sockperf >/dev/null 2>&1; then
    SOCKPERF=$(command -v sockperf)
  elif ls "$SRC"/build-debs/sockperf*.deb >/dev/null 2>&1; then
    tools="$RAW/tools"
    mkdir -p "$tools"
    for d in "$SRC"/build-debs/sockperf*.deb; do dpkg -x "$d" "$tools"; done
    SOCKPERF="$tools/usr/bin/sockperf"
    export LD_LIBRARY_PATH="$tools/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
  fi
fi
[ -n "${SOCKPERF:-}" ] || echo "run.sh: no sockperf; the sockperf anchor is left out" >&2

PIDS=()
POINTS="$RAW/points.jsonl"
: >"$POINTS"
SECRET="compare-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
CLK_TCK=$(getconf CLK_TCK)
T0=$(date +%s)

stop_servers() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  PIDS=()
}
HOLD_CG=
HOLDING=0
MC_PID=
MC_PORT=
trap 'stop_servers; hold_remove; [ -z "$MC_PID" ] || kill -KILL "$MC_PID" 2>/dev/null' EXIT

log() { echo "[$(($(date +%s) - T0))s] $*" >&2; }

source "$(dirname "$0")/lib.sh"  # wait_for_line, wait_attached, hold_*, start_memcached, face_destinations,
                                     # client_queues, cpus_ticks, client_netns_*

# Where the servers listen for clients, and how a client is started (CLIENT_NETNS).
DATA_ADDR=127.0.0.1
CLIENT_NS=
CLIENT_NETNS=${CLIENT_NETNS:-0}
case "$CLIENT_NETNS" in
  0 | off) CLIENT_NETNS=off ;;
  1 | rps) CLIENT_NETNS=rps ;;
  rfs) ;;
  *) echo "run.sh: CLIENT_NETNS is 0, 1 (rps) or rfs, not '$CLIENT_NETNS'" >&2; exit 2 ;;
esac
if [ "$CLIENT_NETNS" != off ]; then
  [ -n "${SERVER_CPUS:-}" ] && [ -n "${CLIENT_CPUS:-}" ] ||
    { echo "run.sh: CLIENT_NETNS needs SERVER_CPUS and CLIENT_CPUS (each side's packets go to its CPUs)" >&2; exit 2; }
  [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null ||
    { echo "run.sh: CLIENT_NETNS needs root and iproute2's ip" >&2; exit 2; }
  CLIENT_NS="cb$$"
  client_netns_up "$CLIENT_NS" "$SERVER_CPUS" "$CLIENT_CPUS" "$CLIENT_NETNS" || exit 2
  trap 'stop_servers; hold_remove; [ -z "$MC_PID" ] || kill -KILL "$MC_PID" 2>/dev/null; client_netns_down "$CLIENT_NS"' EXIT
  DATA_ADDR=10.203.0.1
  log "clients in the network namespace $CLIENT_NS, the servers on $DATA_ADDR (veth, $CLIENT_NETNS)"
fi
# CLIENT: the prefix that starts a client (loadgen, sockperf) where CLIENT_NETNS and CLIENT_CPUS
# put it.
CLIENT=()
[ -n "$CLIENT_NS" ] && CLIENT+=(ip netns exec "$CLIENT_NS")
[ -n "${CLIENT_CPUS:-}" ] && CLIENT+=(taskset -c "$CLIENT_CPUS")

# launch COMMAND...: runs COMMAND (in the background), in the held group while HOLDING is 1.
launch() {
  if [ -n "${SERVER_CPUS:-}" ]; then set -- taskset -c "$SERVER_CPUS" "$@"; fi
  if [ "$HOLDING" = 1 ]; then hold_exec "$@"; fi
  exec "$@"
}

# CPU ticks (utime + stime) so far of the server's processes, or of the PIDs given.
ticks() {
  if [ $# -gt 0 ]; then pid_ticks "$@"; else pid_ticks "${SERVER_PIDS[@]}"; fi
}

# CPU ticks of the server's threads so far, summed per thread name (caracal-io,
# caracal-engine, ...): "name<TAB>ticks" lines.
thread_ticks() {
  local pid t stat name
  for pid in "${SERVER_PIDS[@]}"; do
    for t in /proc/"$pid"/task/*; do
      stat=$(cat "$t/stat" 2>/dev/null) || continue
      name=${stat#*(}
      name=${name%)*}
      set -- ${stat##*) }
      printf '%s\t%s\n' "$name" "$((${12} + ${13}))"
    done
  done | awk -F'\t' '{ a[$1] += $2 } END { for (k in a) printf "%s\t%d\n", k, a[k] }'
}

# threads_json BEFORE AFTER SECONDS: {"name": cores, ...} from two thread_ticks outputs.
threads_json() {
  awk -F'\t' -v hz="$CLK_TCK" -v secs="$3" '
    NR == FNR { before[$1] = $2; next }
    { c = ($2 - before[$1]) / hz / secs; if (c < 0.005) next
      gsub(/["\\]/, "_", $1); s = s (s == "" ? "" : ",") sprintf("\"%s\":%.3f", $1, c) }
    END { printf "{%s}", s }' <(printf '%s\n' "$1") <(printf '%s\n' "$2")
}


# start_server SERVER HANDLER: starts it; sets UDP_PORT, TCP_PORT and SERVER_PIDS (and, for
# snic_server, METRICS_PORT).
start_server() {
  local server=$1 handler=$2 log="$RAW/$1-$2"
  SERVER_PIDS=()
  METRICS_PORT=
  # A server started again under the same name (each low-load round, each held point) must not
  # be read from its predecessor's logs: the background launch truncates them only once it
  # runs, and the ports waited for below would be a stopped server's.
  rm -f "$log-server.log" "$log-agent.log"
  case "$server" in
    caracal | caracal_threads)
      local engine_threads=$ENGINE_THREADS
      [ "$server" = caracal_threads ] && engine_threads=${ENGINE_THREADS_ALT:-2}
      cat >"$log-server.yaml" <<YAML
io_threads: $THREADS
$([ -n "$engine_threads" ] && echo "engine_threads: $engine_threads")
log_level: warn
control: { listen: 127.0.0.1:0, secret: $SECRET, agent_timeout_ms: 5000 }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: $handler
    max_message_bytes: $MAX_MESSAGE
    dispatch: ${DISPATCH:-round_robin}
    listeners:
      - { protocol: udp, listen: $DATA_ADDR:0$([ -n "${SPREAD:-}" ] && echo ", spread: $SPREAD") }
      - { protocol: tcp, listen: $DATA_ADDR:0, framing: { kind: length_prefixed, prefix_bytes: 4 } }
$(face_destinations "$handler")
YAML
      launch "$SNIC" --config "$log-server.yaml" --log-level info >"$log-server.log" 2>&1 &
      local spid=$!
      PIDS+=("$spid")
      wait_for_line "$log-server.log" "serving [0-9]+ service" 20 || return 1
      local control
      control=$(sed -nE 's/.*control endpoint on .* \(port ([0-9]+)\).*/\1/p' "$log-server.log")
      UDP_PORT=$(sed -nE "s#.*listening on udp/$DATA_ADDR:0 \\(port ([0-9]+)\).*#\\1#p" "$log-server.log" | head -1)
      TCP_PORT=$(sed -nE "s#.*listening on tcp/$DATA_ADDR:0 \\(port ([0-9]+)\).*#\\1#p" "$log-server.log" | head -1)
      METRICS_PORT=$(sed -nE 's/.*metrics on http:.*:([0-9]+)\/metrics.*/\1/p' "$log-server.log")
      # AGENTS agents, each with AGENT_QUEUES queues; with several on a GPU accelerator, agent
      # i on gpu:i.
      local i accel apids=()
      for ((i = 0; i < ${AGENTS:-1}; i++)); do
        accel=$CARACAL_ACCEL
        [ "${AGENTS:-1}" -gt 1 ] && [ "${CARACAL_ACCEL#gpu}" != "$CARACAL_ACCEL" ] && accel=gpu:$i
        local alog=$log-agent
        [ "$i" -gt 0 ] && alog=$log-agent$i
        cat >"$alog.yaml" <<YAML
agent: bench-$handler$([ "$i" -gt 0 ] && echo "-$i")
server: 127.0.0.1:$control
secret: $SECRET
accelerator: $accel
transport: shm
log_level: info
cpu: { workers: ${CPU_WORKERS:-1} }
$([ "${accel#gpu}" != "$accel" ] && echo "gpu: { workers: ${GPU_WORKERS:-0}${GPU_OPTIONS:+, $GPU_OPTIONS} }")
reconnect_interval_ms: 100
services:
  - { name: $handler, queues: $AGENT_QUEUES, ring_capacity: ${AGENT_RING_CAPACITY:-512}, slot_bytes: 256, max_message_bytes: $MAX_MESSAGE${RX_LINES:+, rx_lines: $RX_LINES}${TX_LINES:+, tx_lines: $TX_LINES}$(client_queues "$handler") }
YAML
        launch "${AGENT[$handler]}" --config "$alog.yaml" >"$alog.log" 2>&1 &
        apids+=($!)
        PIDS+=($!)
        wait_for_line "$alog.log" "serving [0-9]+ service" 60 || return 1
      done
      wait_attached "$log-server.log" "${AGENTS:-1}" || return 1
      SERVER_PIDS=("$spid" "${apids[@]}")
      ;;
    host_centric | cpu)
      local bin=$CPU_SERVER extra=()
      if [ "$server" = host_centric ]; then
        bin=$HC_SERVER
        extra=(--batch "$BATCH" --batch-timeout-us "$BATCH_TIMEOUT_US" --gpu 0)
      fi
      [ "$handler" = face ] &&
        extra+=(--memcached "127.0.0.1:$MC_PORT" --memcached-timeout-ms "$FACE_TIMEOUT_MS")
      ${SERVER_CPUS:+taskset -c "$SERVER_CPUS"} \
        "$bin" --handler "$handler" --address "$DATA_ADDR" --threads "$THREADS" \
        --max-message-bytes $MAX_MESSAGE \
        "${extra[@]}" >"$log-server.log" 2>&1 &
      local pid=$!
      PIDS+=("$pid")
      wait_for_line "$log-server.log" "^listening udp" 30 || return 1
      UDP_PORT=$(sed -nE 's/^listening udp ([0-9]+) tcp ([0-9]+).*/\1/p' "$log-server.log")
      TCP_PORT=$(sed -nE 's/^listening udp ([0-9]+) tcp ([0-9]+).*/\2/p' "$log-server.log")
      SERVER_PIDS=("$pid")
      ;;
  esac
  [ -n "$UDP_PORT" ] && [ -n "$TCP_PORT" ] || { echo "run.sh: no ports for $server" >&2; return 1; }
}

# perf_command CTL_FD ACK_FD COMMAND: sends a command to `perf record --control` and waits up
# to 30 s for its ack.
perf_command() {
  local reply=
  echo "$3" >&"$1"
  read -r -t 30 reply <&"$2" && [ "$reply" = ack ]
}

# point SERVER HANDLER PROTO SIZE KIND LOADGEN_ARGS...: one loadgen run, with the server's
# CPU use over it; appends a line to points.jsonl.
point() {
  local server=$1 handler=$2 proto=$3 size=$4 kind=$5
  shift 5
  local port=$UDP_PORT
  [ "$proto" = tcp ] && port=$TCP_PORT
  local name="$server-$handler-$proto-$size-$kind${ROUND:+-$ROUND}"
  local t0 t1 p0 p1 w0 w1 rc threads_before threads="{}"
  [ "$kind" = saturation ] && threads_before=$(thread_ticks)
  local perf_pid='' perf_ctl='' perf_ack=''
  if [ -n "${PERF:-}" ] && [ "$kind" = saturation ]; then
    # perf starts with sampling off and answers a ping once it is attached; only then does the
    # load start, and sampling is turned on after the warm-up and off when the load ends. (A
    # perf that slept through the warm-up and then attached on its own time could, on a loaded
    # machine, attach after a short run had ended and sample an idle server.)
    local pids fifo="$RAW/$name.perf"
    pids=$(IFS=,; echo "${SERVER_PIDS[*]}")
    rm -f "$fifo.ctl" "$fifo.ack"
    mkfifo "$fifo.ctl" "$fifo.ack"
    "$PERF" record -q -e cpu-clock -g -F 2999 -D -1 --control "fifo:$fifo.ctl,$fifo.ack" \
      -p "$pids" -o "$RAW/$name.perf.data" >"$RAW/$name-perf.log" 2>&1 &
    perf_pid=$!
    # Read-write opens of a FIFO do not wait for the other end.
    exec {perf_ctl}<>"$fifo.ctl" {perf_ack}<>"$fifo.ack"
    perf_command "$perf_ctl" "$perf_ack" ping ||
      log "$name: perf did not answer (see raw/$name-perf.log)"
  fi
  local hold_before=
  [ "$HOLDING" = 1 ] && hold_before=$(hold_stat)
  local idle0
  idle0=$(engine_idle_seconds)
  local c0='' c1=''
  [ -n "${SERVER_CPUS:-}" ] && c0=$(cpus_ticks "$SERVER_CPUS")
  t0=$(ticks)
  p0=$(ticks "${SERVER_PIDS[0]}")
  w0=$(date +%s.%N)
  local face_args=()
  [ "$handler" = face ] && face_args=(--face-persons "$FACE_PERSONS")
  "${CLIENT[@]}" "$LOADGEN" --host "$DATA_ADDR" --port "$port" --proto "$proto" --handler "$handler" --size "$size" "${face_args[@]}" \
    --warmup "$WARMUP" --duration "$DURATION" --json "$RAW/$name.json" --label "$name" \
    $LOADGEN_ARGS "$@" \
    >"$RAW/$name.out" 2>&1 &
  local loadgen_pid=$!
  if [ -n "$perf_pid" ]; then
    sleep "$WARMUP"
    perf_command "$perf_ctl" "$perf_ack" enable || log "$name: perf did not start sampling"
  fi
  rc=0
  wait "$loadgen_pid" || rc=$?
  w1=$(date +%s.%N)
  t1=$(ticks)
  p1=$(ticks "${SERVER_PIDS[0]}")
  [ -n "$c0" ] && c1=$(cpus_ticks "$SERVER_CPUS")
  local idle_cores=null idle1
  idle1=$(engine_idle_seconds)
  if [ -n "$idle0" ] && [ -n "$idle1" ]; then
    idle_cores=$(awk -v a="$w0" -v b="$w1" -v i0="$idle0" -v i1="$idle1" \
      'BEGIN { printf "%.3f", (i1 - i0) / (b - a) }')
  fi
  if [ -n "$perf_pid" ]; then
    perf_command "$perf_ctl" "$perf_ack" stop || kill -INT "$perf_pid" 2>/dev/null
    wait "$perf_pid" || true
    exec {perf_ctl}>&- {perf_ack}<&-
    rm -f "$fifo.ctl" "$fifo.ack"
    # The flat profile, then where the symbols above 3% were called from.
    { "$PERF" report -i "$RAW/$name.perf.data" --stdio --no-children -g none --percent-limit 0.3 \
        --sort comm,dso,sym
      "$PERF" report -i "$RAW/$name.perf.data" --stdio --no-children -g caller,0.5,callee \
        --percent-limit 3 --sort sym; } 2>>"$RAW/$name-perf.log" | sed -e 's/ *$//' -e '/^# \.\.\./d' >"$RAW/$name-perf.txt"
    rm -f "$RAW/$name.perf.data"
  fi
  local cores process_cores
  cores=$(awk -v t="$((t1 - t0))" -v hz="$CLK_TCK" -v a="$w0" -v b="$w1" \
    'BEGIN { printf "%.3f", (t / hz) / (b - a) }')
  # The first process alone: snic_server without its agent, for Caracal.
  process_cores=$(awk -v t="$((p1 - p0))" -v hz="$CLK_TCK" -v a="$w0" -v b="$w1" \
    'BEGIN { printf "%.3f", (t / hz) / (b - a) }')
  local cpus_cores=null
  [ -n "$c0" ] && cpus_cores=$(awk -v t="$((c1 - c0))" -v hz="$CLK_TCK" -v a="$w0" -v b="$w1" \
    'BEGIN { printf "%.3f", (t / hz) / (b - a) }')
  if [ "$kind" = saturation ]; then
    threads=$(threads_json "$threads_before" "$(thread_ticks)" \
      "$(awk -v a="$w0" -v b="$w1" 'BEGIN { print b - a }')")
  fi
  local hold=
  if [ -n "$hold_before" ]; then
    # The quota and thread count (set by the caller), and the enforcement periods over the run.
    # shellcheck disable=SC2046 # split on purpose: two numbers from each hold_stat
    set -- $hold_before $(hold_stat)
    hold=$(printf '"hold":{"to":"%s","cores":%s,"threads":%d,"period_us":%d,%s},' \
      "$HOLD_TO" "$HOLD_CORES" "$THREADS" "$HOLD_PERIOD_US" \
      "\"periods\":$(($3 - $1)),\"throttled\":$(($4 - $2))")
  fi
  printf '{"server":"%s","handler":"%s","proto":"%s","size":%s,"kind":"%s",%s%s"loadgen_rc":%d,"cpu_cores":%s,"process_cores":%s,"server_cpus_cores":%s,"engine_idle_cores":%s,"threads":%s,"json":"%s"}\n' \
    "$server" "$handler" "$proto" "$size" "$kind" "${ROUND:+\"round\":$ROUND,}" "$hold" "$rc" \
    "$cores" "$process_cores" "$cpus_cores" "$idle_cores" "$threads" "$name.json" >>"$POINTS"
  log "$name: $(head -1 "$RAW/$name.out") [server cores $cores]"
  [ "$rc" -eq 0 ] || FAILED=$((FAILED + 1))
}

# sockperf_point SERVER SIZE [KIND]: sockperf ping-pong against the server's echo over UDP.
sockperf_point() {
  local server=$1 size=$2 kind=${3:-sockperf}
  local name="$server-echo-udp-$size-$kind${ROUND:+-$ROUND}"
  local t0 t1 w0 w1
  t0=$(ticks)
  w0=$(date +%s.%N)
  local secs
  secs=$(awk -v d="$DURATION" 'BEGIN { s = int(d + 0.999); print (s < 1 ? 1 : s) }')
  # --full-rtt: round trips, as loadgen measures them (sockperf's default is half of one).
  timeout $((secs + 30)) "${CLIENT[@]}" "$SOCKPERF" ping-pong -i "$DATA_ADDR" -p "$UDP_PORT" -m "$size" -t "$secs" \
    --full-rtt >"$RAW/$name.txt" 2>&1
  local rc=$?
  w1=$(date +%s.%N)
  t1=$(ticks)
  local cores
  cores=$(awk -v t="$((t1 - t0))" -v hz="$CLK_TCK" -v a="$w0" -v b="$w1" \
    'BEGIN { printf "%.3f", (t / hz) / (b - a) }')
  printf '{"server":"%s","handler":"echo","proto":"udp","size":%s,"kind":"%s",%s"sockperf_rc":%d,"cpu_cores":%s,"sockperf":"%s"}\n' \
    "$server" "$size" "$kind" "${ROUND:+\"round\":$ROUND,}" "$rc" "$cores" "$name.txt" >>"$POINTS"
  log "$name: $(grep -m1 -E 'Summary: (Round trip|Latency)' "$RAW/$name.txt" || echo "sockperf exited $rc")"
}

# engine_idle_seconds: caracal_engine_idle_seconds_total summed over snic_server's engine
# threads (seconds its polling threads found no work); empty for the other servers, or when the
# scrape fails.
engine_idle_seconds() {
  [ -n "${METRICS_PORT:-}" ] || return 0
  curl -sf -m 5 "http://127.0.0.1:$METRICS_PORT/metrics" 2>/dev/null |
    awk '/^caracal_engine_idle_seconds_total\{/ { s += $2; n++ } END { if (n) printf "%.6f", s }'
}

# save_metrics NAME: snic_server's own counters over the session so far, for the record
# (raw/NAME-metrics.txt); nothing for the other servers.
save_metrics() {
  if [ -n "${METRICS_PORT:-}" ]; then
    curl -sf -m 5 "http://127.0.0.1:$METRICS_PORT/metrics" >"$RAW/$1-metrics.txt" 2>/dev/null || true
  fi
}

# Held points: checked before anything runs, so that a run that cannot make them stops at once.
HOLD_PERIOD_US=${HOLD_PERIOD_US:-10000}
if [ -n "${HOLD_TO:-}" ]; then
  case " $SERVERS " in
    *" $HOLD_TO "*) [ "$HOLD_TO" != caracal ] ;;
    *) false ;;
  esac || { echo "run.sh: HOLD_TO=$HOLD_TO is not another server of this run ($SERVERS)" >&2; exit 2; }
  [[ "$HOLD_PERIOD_US" =~ ^[0-9]+$ ]] && [ "$HOLD_PERIOD_US" -ge 1000 ] &&
    [ "$HOLD_PERIOD_US" -le 1000000 ] ||
    { echo "run.sh: HOLD_PERIOD_US=$HOLD_PERIOD_US is not in the kernel's 1000 to 1000000" >&2
      exit 2; }
  [ -z "${HOLD_THREADS:-}" ] || [[ "$HOLD_THREADS" =~ ^[1-9][0-9]*$ ]] ||
    { echo "run.sh: HOLD_THREADS=$HOLD_THREADS is not a thread count" >&2; exit 2; }
  hold_create "caracal-bench-held-$$" ||
    { echo "run.sh: HOLD_TO=$HOLD_TO: no CPU quota can be set here (above)" >&2; exit 2; }
fi

FAILED=0
case " $HANDLERS " in
  *" face "*) start_memcached || exit 1 ;;
esac
# Echo at low load, LOW_LOAD_ROUNDS times (see the top): a fresh server each round, the order
# of the servers turned round every other round.
if [ "$LOW_LOAD_ROUNDS" -gt 0 ] && [ -n "$LOW_LOAD_SERVERS" ]; then
  log "== low load: $LOW_LOAD_ROUNDS rounds of $LOW_LOAD_SERVERS"
  for ROUND in $(seq "$LOW_LOAD_ROUNDS"); do
    order=$LOW_LOAD_SERVERS
    [ $((ROUND % 2)) -eq 0 ] && order=$(echo "$LOW_LOAD_SERVERS" | tr ' ' '\n' | tac | tr '\n' ' ')
    for server in $order; do
      if start_server "$server" echo; then
        point "$server" echo udp 64 low-load --connections 1 --window 1
        [ -n "${SOCKPERF:-}" ] && sockperf_point "$server" 64 sockperf-low-load
        save_metrics "$server-echo-round$ROUND"
      else
        FAILED=$((FAILED + 1))
      fi
      stop_servers
    done
  done
  unset ROUND
fi
for handler in $HANDLERS; do
  for server in $SERVERS; do
    log "== $server / $handler"
    if ! start_server "$server" "$handler"; then
      FAILED=$((FAILED + 1))
      stop_servers
      continue
    fi
    for proto in udp tcp; do
      for size in $(sizes_of "$handler"); do
        point "$server" "$handler" "$proto" "$size" latency --connections 1 --window 1
        point "$server" "$handler" "$proto" "$size" saturation --connections "$SAT_CONNECTIONS" \
          --window "$SAT_WINDOW" --threads "$LOADGEN_THREADS"
        case " $OPEN_SIZES " in
          *" $size "*)
            sat=$(sed -nE 's/^ *"throughput_rps": ([0-9.]+).*/\1/p' \
              "$RAW/$server-$handler-$proto-$size-saturation.json" | head -1)
            if [ -n "$sat" ] && awk -v s="$sat" 'BEGIN { exit !(s > 100) }'; then
              for f in $OPEN_FRACTIONS; do
                rate=$(awk -v s="$sat" -v f="$f" 'BEGIN { printf "%d", s * f }')
                point "$server" "$handler" "$proto" "$size" "open-$f" --mode open --rate "$rate" \
                  --connections "$SAT_CONNECTIONS" --window "$SAT_WINDOW" \
                  --threads "$LOADGEN_THREADS"
              done
            fi
            for rate in $OPEN_RATES; do
              point "$server" "$handler" "$proto" "$size" "open-at-$rate" --mode open \
                --rate "$rate" --connections "$SAT_CONNECTIONS" --window "$SAT_WINDOW" \
                --threads "$LOADGEN_THREADS"
            done
            ;;
        esac
      done
    done
    if [ "$handler" = echo ] && [ -n "${SOCKPERF:-}" ]; then
      for size in $SIZES; do sockperf_point "$server" "$size"; done
    fi
    save_metrics "$server-$handler"
    stop_servers
  done
done

# Face at the host-centric server's saturation rate: every server at the same offered load.
case " $HANDLERS :$SERVERS " in
  *" face "*" host_centric"*)
    for server in $SERVERS; do
      start_server "$server" face || { FAILED=$((FAILED + 1)); stop_servers; continue; }
      for proto in udp tcp; do
        sat=$(sed -nE 's/^ *"throughput_rps": ([0-9.]+).*/\1/p' \
          "$RAW/host_centric-face-$proto-$FACE_SIZE-saturation.json" 2>/dev/null | head -1)
        [ -n "$sat" ] || continue
        point "$server" face "$proto" "$FACE_SIZE" open-at-host_centric --mode open \
          --rate "$(awk -v s="$sat" 'BEGIN { printf "%d", s }')" --connections "$SAT_CONNECTIONS" \
          --window "$SAT_WINDOW" --threads "$LOADGEN_THREADS"
      done
      stop_servers
    done
    ;;
esac

# Caracal held to HOLD_TO's cores (see the top), a fresh server per point.
if [ -n "${HOLD_TO:-}" ]; then
  log "== caracal held to the cores of $HOLD_TO: $HOLD_CG (cgroup v$HOLD_V)," \
    "period $HOLD_PERIOD_US us"
  for handler in $HANDLERS; do
    for proto in udp tcp; do
      for size in $(sizes_of "$handler"); do
        want="\"server\":\"$HOLD_TO\",\"handler\":\"$handler\",\"proto\":\"$proto\",\"size\":$size"
        ref=$(grep -F "$want,\"kind\":\"saturation\"," "$POINTS" |
          sed -nE 's/.*"cpu_cores":([0-9.]+).*/\1/p' | head -1)
        HOLD_CORES=$(awk -v c="${ref:-0}" 'BEGIN { printf "%.2f", int(c * 100) / 100 }')
        if awk -v c="$HOLD_CORES" 'BEGIN { exit !(c < 0.05) }'; then
          log "$HOLD_TO has no saturation point with CPU for $handler $proto $size; not held"
          FAILED=$((FAILED + 1))
          continue
        fi
        threads=${HOLD_THREADS:-$(awk -v c="$HOLD_CORES" 'BEGIN { t = int(c); print t + (t < c) }')}
        if hold_set "$HOLD_CORES" "$HOLD_PERIOD_US" &&
          HOLDING=1 THREADS=$threads start_server caracal "$handler"; then
          HOLDING=1 THREADS=$threads point caracal "$handler" "$proto" "$size" held \
            --connections "$SAT_CONNECTIONS" --window "$SAT_WINDOW" --threads "$LOADGEN_THREADS"
        else
          FAILED=$((FAILED + 1))
        fi
        stop_servers
      done
    done
  done
fi

# The run's facts, then everything into one JSON and the tables.
{
  echo "{"
  echo "  \"date_utc\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
  echo "  \"commit\": \"${CARACAL_COMMIT:-$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo unknown)}\","
  echo "  \"cpu_only\": $([ "$CPU_ONLY" -eq 1 ] && echo true || echo false),"
  echo "  \"gpu\": \"$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)\","
  echo "  \"cpu_model\": \"$(sed -nE 's/^model name\s*: (.*)/\1/p' /proc/cpuinfo | head -1)\","
  echo "  \"online_cpus\": $(nproc --all),"
  echo "  \"kernel\": \"$(uname -sr)\","
  echo "  \"hostname\": \"$(hostname)\","
  echo "  \"servers\": \"$SERVERS\","
  echo "  \"low_load_servers\": \"$LOW_LOAD_SERVERS\","
  echo "  \"caracal_accelerator\": \"$CARACAL_ACCEL\","
  echo "  \"params\": {\"duration_s\": $DURATION, \"warmup_s\": $WARMUP, \"server_threads\": $THREADS, \"engine_threads\": \"${ENGINE_THREADS:-default}\", \"engine_threads_alt\": \"${ENGINE_THREADS_ALT:-2}\", \"rx_lines\": \"${RX_LINES:-default}\", \"tx_lines\": \"${TX_LINES:-default}\", \"loadgen_threads\": $LOADGEN_THREADS, \"sat_connections\": $SAT_CONNECTIONS, \"sat_window\": $SAT_WINDOW, \"batch\": $BATCH, \"batch_timeout_us\": $BATCH_TIMEOUT_US, \"agent_queues\": $AGENT_QUEUES, \"agents\": ${AGENTS:-1}, \"gpu_workers\": ${GPU_WORKERS:-0}, \"gpu_options\": \"${GPU_OPTIONS:-}\", \"cpu_workers\": ${CPU_WORKERS:-1}, \"sizes\": \"$SIZES\", \"handlers\": \"$HANDLERS\", \"face_persons\": $FACE_PERSONS, \"memcached_threads\": $MEMCACHED_THREADS, \"low_load_rounds\": $LOW_LOAD_ROUNDS, \"open_sizes\": \"$OPEN_SIZES\", \"open_fractions\": \"$OPEN_FRACTIONS\", \"open_rates\": \"$OPEN_RATES\", \"loadgen_args\": \"$LOADGEN_ARGS\", \"hold_to\": \"${HOLD_TO:-}\", \"hold_threads\": \"${HOLD_THREADS:-quota}\", \"hold_period_us\": $HOLD_PERIOD_US, \"server_cpus\": \"${SERVER_CPUS:-}\", \"client_cpus\": \"${CLIENT_CPUS:-}\", \"spread\": \"${SPREAD:-default}\", \"dispatch\": \"${DISPATCH:-round_robin}\", \"client_netns\": \"$CLIENT_NETNS\"},"
  echo "  \"failed_points\": $FAILED"
  echo "}"
} >"$RAW/run.json"
python3 "$SRC/bench/compare/report.py" "$RESULTS" || FAILED=$((FAILED + 1))
log "done: $RESULTS/compare.json, $RESULTS/compare.md ($FAILED failed)"
[ "$FAILED" -eq 0 ]
