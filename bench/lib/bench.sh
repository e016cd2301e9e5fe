# shellcheck shell=bash
# What the benchmarks' shell scripts share (sourced): builds, the record of the tree and the
# machine, waits, CPU accounting, and for bench/compare/run.sh cgroups, network namespaces and
# memcached. The stand-alone runners that start a server and agents on loopback do it with
# tests/e2e/lib.sh, as the end-to-end tests do, sourced after this file (its wait_for_line
# fails the run where this one returns 1).

# commit_id [PATH...]: CARACAL_COMMIT when set (a copy of the tree without its .git), else the
# tree's commit, with -dirty when tracked files (of PATHs, when given) have changed.
commit_id() {
  local src=${SRC:-.} commit
  [ -z "${CARACAL_COMMIT:-}" ] || { echo "$CARACAL_COMMIT"; return; }
  commit=$(git -C "$src" rev-parse --short=12 HEAD 2>/dev/null) || { echo unknown; return; }
  [ -z "$(git -C "$src" status --porcelain --untracked-files=no -- "$@" 2>/dev/null)" ] ||
    commit=$commit-dirty
  echo "$commit"
}

# need_built FILE...: exits 2, naming the first FILE that is not an executable (build it first).
need_built() {
  local f
  for f in "$@"; do [ -x "$f" ] || { echo "$(basename "$0"): $f is missing (build it first)" >&2; exit 2; }; done
}

# cpu_model: the CPU's model name.
cpu_model() { sed -nE 's/^model name\s*:\s*//p' /proc/cpuinfo | head -1; }

# machine_line: the machine in one line, for a report's head.
machine_line() {
  echo "$(nproc) cores, $(cpu_model), $(uname -r), $(. /etc/os-release && echo "$PRETTY_NAME")"
}

# release_build SRC BUILD LOG JOBS [-DOPTION...] -- TARGET...: a Release build of the tree SRC
# in BUILD (Ninja, no tests, nvcc from /usr/local/cuda where there), its output in LOG; on
# failure, LOG's tail on stderr and 1.
release_build() {
  local src=$1 build=$2 log=$3 jobs=$4 options=()
  shift 4
  while [ $# -gt 0 ] && [ "$1" != -- ]; do options+=("$1"); shift; done
  shift
  mkdir -p "$(dirname "$log")"
  { PATH=/usr/local/cuda/bin:$PATH cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCARACAL_BUILD_TESTS=OFF "${options[@]}" && ninja -C "$build" -j "$jobs" "$@"; } >"$log" 2>&1 &&
    return 0
  echo "$(basename "$0"): the build in $build failed ($log):" >&2
  tail -30 "$log" >&2
  return 1
}

# snic_build SOURCE DIR LOG JOBS [-DOPTION...]: snic_server alone built from SOURCE, a tree or a
# `git archive` .tar (unpacked into DIR/src, again only when the archive changed), in DIR/build.
snic_build() {
  local src=$1 dir=$2 log=$3 jobs=$4 sum
  shift 4
  if [ -f "$src" ]; then
    sum=$(sha256sum "$src" | cut -c1-16)
    if [ "$(cat "$dir/archive.sha256" 2>/dev/null)" != "$sum" ]; then
      rm -rf "$dir" && mkdir -p "$dir/src" && tar -xf "$src" -C "$dir/src" &&
        echo "$sum" >"$dir/archive.sha256" || return 1
    fi
    src=$dir/src
  fi
  release_build "$src" "$dir/build" "$log" "$jobs" -DCARACAL_BUILD_BENCH=OFF "$@" -- snic_server
}

# wait_for_line FILE REGEX [SECONDS]: 0 once FILE has a line matching REGEX; otherwise, after
# SECONDS (10), says so with the file's tail and returns 1.
wait_for_line() {
  for _ in $(seq $((${3:-10} * 20))); do
    grep -Eq "$2" "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "$(basename "$0"): $(basename "$1") never showed /$2/ within ${3:-10} s:" >&2
  tail -20 "$1" >&2
  return 1
}

# stop_all: SIGTERM to every process in the array PIDS (those a runner started), waits for
# them, and empties it.
stop_all() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
}

# wait_attached LOG COUNT: 0 once snic_server's LOG says that COUNT agent regions have attached
# (within 20 s); otherwise says how many did and returns 1.
wait_attached() {
  local attached=0
  for _ in $(seq 200); do
    attached=$(grep -cE "region for service .* attached" "$1")
    [ "$attached" -ge "$2" ] && return 0
    sleep 0.1
  done
  echo "$(basename "$0"): $attached of $2 agents attached within 20 s ($(basename "$1"))" >&2
  return 1
}

# A CPU quota for a group of processes (the held points), through a cgroup of its own
# under the CPU controller: cgroup v2 (the unified hierarchy) or v1.
#
# hold_create NAME: makes the group; sets HOLD_CG (its directory) and HOLD_V (2 or 1), or says
# on stderr why it cannot and returns 1.
hold_create() {
  local root=/sys/fs/cgroup dir=
  HOLD_CG='' HOLD_V=''
  if [ -f "$root/cgroup.controllers" ]; then
    if ! grep -qw cpu "$root/cgroup.controllers"; then
      echo "cgroup v2 at $root offers no cpu controller" >&2
      return 1
    fi
    if ! grep -qw cpu "$root/cgroup.subtree_control" &&
      ! echo +cpu 2>/dev/null >"$root/cgroup.subtree_control"; then
      echo "cannot enable the cpu controller in $root/cgroup.subtree_control (not root?)" >&2
      return 1
    fi
    dir=$root/$1
    HOLD_V=2
  else
    local c
    for c in "$root/cpu" "$root/cpu,cpuacct"; do
      [ -f "$c/cpu.cfs_quota_us" ] && dir=$c/$1 && break
    done
    if [ -z "$dir" ]; then
      echo "no cgroup CPU controller under $root (neither v2 nor v1's cpu.cfs_quota_us)" >&2
      return 1
    fi
    HOLD_V=1
  fi
  mkdir -p "$dir" 2>/dev/null || { echo "cannot create the cgroup $dir (not root?)" >&2; return 1; }
  HOLD_CG=$dir
}

# hold_set CORES PERIOD_US: at most CORES CPUs' worth of time in every PERIOD_US, for the group.
hold_set() {
  local quota
  quota=$(awk -v c="$1" -v p="$2" 'BEGIN { printf "%d", c * p + 0.5 }')
  if [ "$HOLD_V" = 2 ]; then
    echo "$quota $2" >"$HOLD_CG/cpu.max"
  else
    echo "$2" >"$HOLD_CG/cpu.cfs_period_us" && echo "$quota" >"$HOLD_CG/cpu.cfs_quota_us"
  fi
}

# hold_stat: "PERIODS THROTTLED", the group's enforcement periods so far and those in which it
# ran out of time.
hold_stat() {
  awk '$1 == "nr_periods" { p = $2 } $1 == "nr_throttled" { t = $2 } END { print p + 0, t + 0 }' \
    "$HOLD_CG/cpu.stat"
}

# hold_exec COMMAND...: runs COMMAND in the group (call it in the background: `hold_exec cmd &`;
# $! is then COMMAND's pid).
hold_exec() {
  echo "$BASHPID" >"$HOLD_CG/cgroup.procs" || exit 1
  exec "$@"
}

# hold_remove: removes the group, once its processes are gone.
hold_remove() {
  [ -n "${HOLD_CG:-}" ] && [ -d "$HOLD_CG" ] || return 0
  for _ in $(seq 50); do
    rmdir "$HOLD_CG" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "cannot remove the cgroup $HOLD_CG" >&2
  return 1
}

# pid_ticks PID...: CPU ticks (utime + stime) so far of the PIDs given (those gone are left out).
pid_ticks() {
  local sum=0 pid rest
  for pid in "$@"; do
    # Fields after the command name (which may hold spaces): utime is the 12th, stime the 13th.
    rest=$(sed -E 's/^.*\) //' "/proc/$pid/stat" 2>/dev/null) || continue
    set -- $rest
    sum=$((sum + ${12} + ${13}))
  done
  echo "$sum"
}

# machine_ticks: CPU ticks so far that the whole machine spent busy (every field of /proc/stat's
# "cpu" line but idle and iowait; guest time is already in user), in the units of pid_ticks.
machine_ticks() {
  awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat
}

# cpus_ticks LIST: CPU ticks so far that the CPUs of LIST (a taskset list, "0-3,8") spent busy,
# from their /proc/stat lines as machine_ticks: whatever ran there, a process or the kernel's
# softirq work for packets steered to them.
cpus_ticks() {
  awk -v list="$1" '
    BEGIN { n = split(list, parts, ",")
            for (i = 1; i <= n; i++)
              if (split(parts[i], r, "-") == 2) { for (c = r[1] + 0; c <= r[2] + 0; c++) want["cpu" c] = 1 }
              else want["cpu" parts[i]] = 1 }
    $1 in want { s += $2 + $3 + $4 + $7 + $8 + $9 }
    END { print s + 0 }' /proc/stat
}

# thread_ticks PID...: CPU ticks of the processes' threads so far, summed per thread name
# (caracal-io, caracal-engine, ...): "name<TAB>ticks" lines.
thread_ticks() {
  local pid t stat name
  for pid in "$@"; do
    for t in /proc/"$pid"/task/*; do
      stat=$(cat "$t/stat" 2>/dev/null) || continue
      name=${stat#*(}
      name=${name%)*}
      # shellcheck disable=SC2086 # the fields after the name, split on purpose
      set -- ${stat##*) }
      printf '%s\t%s\n' "$name" "$((${12} + ${13}))"
    done
  done | awk -F'\t' '{ a[$1] += $2 } END { for (k in a) printf "%s\t%d\n", k, a[k] }'
}

# threads_json BEFORE AFTER SECONDS: {"name": cores, ...} from two thread_ticks outputs.
threads_json() {
  awk -F'\t' -v hz="$(getconf CLK_TCK)" -v secs="$3" '
    NR == FNR { before[$1] = $2; next }
    { c = ($2 - before[$1]) / hz / secs; if (c < 0.005) next
      gsub(/["\\]/, "_", $1); s = s (s == "" ? "" : ",") sprintf("\"%s\":%.3f", $1, c) }
    END { printf "{%s}", s }' <(printf '%s\n' "$1") <(printf '%s\n' "$2")
}

# cores_over TICKS FROM TO: TICKS of CPU time over the wall time FROM to TO (date +%s.%N), in
# cores.
cores_over() {
  awk -v t="$1" -v hz="$(getconf CLK_TCK)" -v a="$2" -v b="$3" 'BEGIN { printf "%.3f", (t / hz) / (b - a) }'
}

# saturation_rps JSON: the throughput in a loadgen JSON file; nothing when there is none.
saturation_rps() {
  sed -nE 's/^ *"throughput_rps": ([0-9.]+).*/\1/p' "$1" 2>/dev/null | head -1
}

# perf_command CTL_FD ACK_FD COMMAND: sends a command to `perf record --control` and waits up
# to 30 s for its ack.
perf_command() {
  local reply=
  echo "$3" >&"$1"
  read -r -t 30 reply <&"$2" && [ "$reply" = ack ]
}

# physical_cores: a line per physical core (package, core id), its CPUs comma-separated, in the
# order of their lowest CPU.
physical_cores() {
  python3 - <<'PY'
import collections, glob
cores = collections.defaultdict(list)
for d in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology"):
    cpu = int(d.split("/")[-2][3:])
    key = (open(d + "/physical_package_id").read().strip(), open(d + "/core_id").read().strip())
    cores[key].append(cpu)
for k in sorted(cores, key=lambda k: min(cores[k])):
    print(",".join(str(c) for c in sorted(cores[k])))
PY
}

# rps_mask LIST: the CPUs of a taskset list as the hex mask that sysfs's rps_cpus takes (32-bit
# groups, most significant first, comma-separated).
rps_mask() {
  local part c i words=1 out=''
  local -a word=()
  for part in ${1//,/ }; do
    for ((c = ${part%-*}; c <= ${part#*-}; c++)); do
      word[c / 32]=$((${word[c / 32]:-0} | 1 << (c % 32)))
      [ $((c / 32)) -lt "$words" ] || words=$((c / 32 + 1))
    done
  done
  for ((i = words - 1; i >= 0; i--)); do out=$out${out:+,}$(printf '%08x' "${word[i]:-0}"); done
  echo "$out"
}

# client_netns_up NAME SERVER_CPUS CLIENT_CPUS [STEERING]: a network namespace NAME for the
# client, joined to this one by a veth pair (NAME-s here, 10.203.0.1; NAME-c there,
# 10.203.0.2), with each side's receive steered to its own CPUs. Over loopback, the sending core
# also runs the receiver's TCP/UDP input, so client and server share the kernel's work and
# state; here, as with a NIC, the server's CPUs take its packets' input and the client's CPUs
# the replies'. STEERING rps (the default): a flow's input goes to one of the side's CPUs by its
# hash, as a NIC's RSS does; rfs: to the CPU where the socket's reader last ran, as a NIC's
# accelerated RFS does (sets the machine's net.core.rps_sock_flow_entries, put back by
# client_netns_down). Needs root and iproute2; NAME at most 13 characters. Undone by
# client_netns_down NAME.
client_netns_up() {
  local ns=$1 steering=${4:-rps} server_mask client_mask flows=
  case "$steering" in
    rps) ;;
    rfs) flows=32768 ;;
    *) echo "client_netns_up: STEERING is rps or rfs, not '$steering'" >&2; return 1 ;;
  esac
  server_mask=$(rps_mask "$2") && client_mask=$(rps_mask "$3") || return 1
  if ip -4 addr show | grep -q ' 10\.203\.0\.1/'; then
    echo "client_netns_up: 10.203.0.1 is already on an interface (another run?)" >&2
    return 1
  fi
  ip netns add "$ns" &&
    ip link add "$ns-s" type veth peer name "$ns-c" netns "$ns" &&
    ip addr add 10.203.0.1/30 dev "$ns-s" && ip link set "$ns-s" up &&
    echo "$server_mask" >"/sys/class/net/$ns-s/queues/rx-0/rps_cpus" &&
    ip netns exec "$ns" sh -c "ip link set lo up && ip addr add 10.203.0.2/30 dev $ns-c &&
      ip link set $ns-c up && echo $client_mask >/sys/class/net/$ns-c/queues/rx-0/rps_cpus" ||
    { echo "client_netns_up: could not set up the namespace $ns" >&2; client_netns_down "$ns"; return 1; }
  if [ -n "$flows" ]; then
    CLIENT_NETNS_FLOW_ENTRIES_WAS=$(cat /proc/sys/net/core/rps_sock_flow_entries)
    echo "$flows" >/proc/sys/net/core/rps_sock_flow_entries &&
      echo "$flows" >"/sys/class/net/$ns-s/queues/rx-0/rps_flow_cnt" &&
      ip netns exec "$ns" sh -c "echo $flows >/sys/class/net/$ns-c/queues/rx-0/rps_flow_cnt" ||
      { echo "client_netns_up: could not turn RFS on" >&2; client_netns_down "$ns"; return 1; }
  fi
}

# client_netns_down NAME: removes the namespace (and with it the veth pair), and puts back the
# rps_sock_flow_entries that client_netns_up found, if it set it.
client_netns_down() {
  ip netns del "$1" 2>/dev/null
  ip link del "$1-s" 2>/dev/null
  if [ -n "${CLIENT_NETNS_FLOW_ENTRIES_WAS:-}" ]; then
    echo "$CLIENT_NETNS_FLOW_ENTRIES_WAS" >/proc/sys/net/core/rps_sock_flow_entries
    CLIENT_NETNS_FLOW_ENTRIES_WAS=
  fi
  return 0
}

# start_memcached: a memcached of the run's own for the face references ($MEMCACHED, on a free
# loopback port, $MEMCACHED_THREADS threads; as nobody when root; kept to the CPUs of
# $MEMCACHED_CPUS, a taskset list, when set), loaded with $FACE_PERSONS references by
# $FACE_LOADER. Sets MC_PORT and MC_PID (the caller kills it); its logs go to
# $RAW/memcached.log and $RAW/face-loader.log.
start_memcached() {
  local as_user=() pin=()
  [ "$(id -u)" -eq 0 ] && as_user=(-u nobody)
  [ -n "${MEMCACHED_CPUS:-}" ] && pin=(taskset -c "$MEMCACHED_CPUS")
  MC_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "${pin[@]}" "$MEMCACHED" "${as_user[@]}" -l 127.0.0.1 -p "$MC_PORT" -U 0 -m 1024 -c 4096 \
    -t "$MEMCACHED_THREADS" >"$RAW/memcached.log" 2>&1 &
  # shellcheck disable=SC2034 # read by the caller, which kills it
  MC_PID=$!
  local _
  for _ in $(seq 100); do
    if "$FACE_LOADER" --memcached "127.0.0.1:$MC_PORT" --persons "$FACE_PERSONS" \
      >"$RAW/face-loader.log" 2>&1; then
      echo "memcached on $MC_PORT: $(cat "$RAW/face-loader.log")" >&2
      return 0
    fi
    sleep 0.1
  done
  echo "$(basename "$0"): memcached did not start or take the references (memcached.log, face-loader.log in $RAW)" >&2
  return 1
}

# The face handler's side of a Caracal config, nothing for the other handlers:
# face_destinations HANDLER: snic_server's `destinations:` block, the memcached of
# start_memcached (MC_PORT) with FACE_TIMEOUT_MS;
# client_queues HANDLER: the tail of the agent's service mapping, one client queue per queue
# (count: per_queue, whatever AGENT_QUEUES is), so that each worker or block calls memcached on
# its own.
# json_word VALUE: VALUE as a JSON number when it is one, else as a string ("auto").
json_word() {
  if [[ "$1" =~ ^[0-9]+$ ]]; then echo "$1"; else echo "\"$1\""; fi
}
face_destinations() {
  [ "$1" = face ] || return 0
  echo "destinations:
  - { name: memcached, connect: 127.0.0.1:$MC_PORT, framing: { kind: memcached }, max_message_bytes: 8192, timeout_ms: $FACE_TIMEOUT_MS }"
}
client_queues() {
  [ "$1" = face ] || return 0
  echo ", client_queues: [ { destination: memcached, count: per_queue } ]"
}
