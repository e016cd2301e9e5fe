#!/usr/bin/env bash
# The Asio UDP listener and the DPDK listener side by side: one snic_server with both listeners
# on the echo service (CPU echo agent), sockperf UDP ping-pong and throughput against each, the
# runs interleaved (asio, dpdk, asio, dpdk, ...) so that both see the same machine. Writes
#   bench/results/dpdk-udp-<pmd>-<hostname>.md     (the report, also shown)
#   bench/results/dpdk-udp-<pmd>-<hostname>.json
#
#   bench/dpdk/run.sh                 # af_packet on a veth pair, 5 rounds of 5 s per test
#   ROUNDS=3 SECONDS_PER_RUN=3 bench/dpdk/run.sh
#   PMD=tap bench/dpdk/run.sh         # net_tap instead
#
# Environment: BUILD (a build directory with snic_server and caracal_echo_agent; default
# build-bench, configured Release and built here), PMD (af_packet or tap), ROUNDS,
# SECONDS_PER_RUN, MSG_BYTES (64), IDLE_SLEEP_US (the dpdk section's idle_sleep_us, 10),
# RESULTS_DIR, NOTE (free text for the report). Needs root (a network namespace).
#
# Where the clients are: sockperf runs in the namespace. Against the Asio listener it sends
# over the namespace's loopback; against the DPDK listener over the veth pair (or tap) into the
# DPDK port. Both paths end in the same service, engine, agent and rings.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
source bench/lib/bench.sh

pmd=${PMD:-af_packet}
rounds=${ROUNDS:-5}
secs=${SECONDS_PER_RUN:-5}
msg=${MSG_BYTES:-64}
idle=${IDLE_SLEEP_US:-10}
results=${RESULTS_DIR:-bench/results}
build=${BUILD:-build-bench}
[ "$(id -u)" -eq 0 ] || { echo "bench/dpdk/run.sh: needs root (a network namespace)" >&2; exit 1; }

[ -n "${BUILD:-}" ] || release_build . "$build" "$build/build.log" "${JOBS:-2}" -DCARACAL_WITH_CUDA=OFF \
  -DCARACAL_BUILD_BENCH=OFF -- snic_server caracal_echo_agent || exit 1
server_bin="$root/$build/snic_server/snic_server"
agent_bin="$root/$build/examples/echo/caracal_echo_agent"
build_type=$(sed -nE 's/^CMAKE_BUILD_TYPE:[A-Z]+=(.*)/\1/p' "$build/CMakeCache.txt")

work=$(mktemp -d /tmp/caracal-dpdk-bench.XXXXXX)
ns="caracal-bench-$$"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  ip netns del "$ns" 2>/dev/null || true
  [ -n "${KEEP_WORK:-}" ] && echo "kept $work" || rm -rf "$work"
}
trap cleanup EXIT
in_ns() { ip netns exec "$ns" "$@"; }

ip netns add "$ns"
ip -n "$ns" link set lo up
last=$(($(nproc) - 1))
if [ "$pmd" = af_packet ]; then
  ip -n "$ns" link add vdpdk type veth peer name vkern
  ip -n "$ns" link set vdpdk up
  ip -n "$ns" addr add 192.0.2.1/24 dev vkern
  ip -n "$ns" link set vkern up
  in_ns ethtool -K vkern tx off >/dev/null
  vdev="net_af_packet0,iface=vdpdk"
else
  vdev="net_tap0,iface=dtap0"
fi
secret="bench-secret-0123456789"
cat >"$work/server.yaml" <<YAML
io_threads: 1
control: { listen: 127.0.0.1:7100, secret: $secret }
metrics: { listen: 127.0.0.1:9100 }
dpdk:
  eal_args: [--no-huge, -m, "256", --file-prefix=$ns, "--lcores=0@(0-$last),1@(0-$last)", "--vdev=$vdev"]
  ipv4: 192.0.2.2
  queues: 1
  idle_sleep_us: $idle
services:
  - name: echo
    max_message_bytes: 1024
    listeners:
      - { protocol: udp, listen: 127.0.0.1:7000 }
      - { protocol: udp, kind: dpdk, listen: 192.0.2.2:7000 }
YAML
# Not through in_ns: `ip netns exec` execs the program, so $! is the server itself.
ip netns exec "$ns" "$server_bin" --config "$work/server.yaml" >"$work/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -aq "serving 1 service" "$work/server.log" && break; sleep 0.1; done
grep -aq "serving 1 service" "$work/server.log" || { cat "$work/server.log"; exit 1; }
if [ "$pmd" = tap ]; then
  ip -n "$ns" addr add 192.0.2.1/24 dev dtap0
  ip -n "$ns" link set dtap0 up
fi
cat >"$work/agent.yaml" <<YAML
agent: echo-1
server: 127.0.0.1:7100
secret: $secret
accelerator: cpu
transport: shm
services: [ { name: echo, queues: 1, ring_capacity: 256, slot_bytes: 256, max_message_bytes: 1024 } ]
YAML
ip netns exec "$ns" "$agent_bin" --config "$work/agent.yaml" >"$work/agent.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -aq "serving 1 service" "$work/agent.log" && break; sleep 0.1; done
port_line=$(grep -a "dpdk port" "$work/server.log" | sed -E 's/.*dpdk port //')

requests() {  # caracal_listener_requests_total of one listener
  in_ns curl -sf http://127.0.0.1:9100/metrics |
    awk -v l="$1" 'index($0, "caracal_listener_requests_total{") == 1 && index($0, l) {print $NF}'
}

declare -A target=([asio]=127.0.0.1 [dpdk]=192.0.2.2)
declare -A label=([asio]="udp/127.0.0.1:7000" [dpdk]="dpdk/192.0.2.2:7000")
in_ns sockperf ping-pong -i 192.0.2.2 -p 7000 -m "$msg" -t 1 >/dev/null 2>&1 || true  # ARP, warm-up
samples="$work/samples.tsv"
: >"$samples"
for r in $(seq 1 "$rounds"); do
  for kind in asio dpdk; do
    out="$work/pp-$kind-$r.out"
    in_ns sockperf ping-pong -i "${target[$kind]}" -p 7000 -m "$msg" -t "$secs" >"$out" 2>&1
    grep -Eq "# dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0" "$out" ||
      { echo "$kind ping-pong round $r lost, duplicated or reordered messages:" >&2; cat "$out" >&2; exit 1; }
    p50=$(sed -nE 's/.*percentile 50.000 = *([0-9.]+).*/\1/p' "$out")
    p99=$(sed -nE 's/.*percentile 99.000 = *([0-9.]+).*/\1/p' "$out")
    p999=$(sed -nE 's/.*percentile 99.900 = *([0-9.]+).*/\1/p' "$out")
    avg=$(sed -nE 's/.*Summary: Latency is ([0-9.]+) usec.*/\1/p' "$out")
    out="$work/tp-$kind-$r.out"
    before=$(requests "${label[$kind]}")
    in_ns sockperf throughput -i "${target[$kind]}" -p 7000 -m "$msg" -t "$secs" >"$out" 2>&1
    sleep 0.5
    after=$(requests "${label[$kind]}")
    sent=$(sed -nE 's/.*Summary: Message Rate is ([0-9]+) .*/\1/p' "$out")
    received=$(awk -v a="$after" -v b="$before" -v s="$secs" 'BEGIN {printf "%.0f", (a - b) / s}')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$kind" "$r" "$p50" "$p99" "$p999" "$avg" "$sent" "$received" >>"$samples"
    echo "round $r $kind: ping-pong p50 $p50 us, p99 $p99 us; throughput sent $sent/s, received $received/s" >&2
  done
done

commit=$(commit_id)
host=$(hostname -s 2>/dev/null || hostname)
mkdir -p "$results"
base="$results/dpdk-udp-$pmd-$host"
SAMPLES="$samples" PMD="$pmd" ROUNDS="$rounds" SECS="$secs" MSG="$msg" IDLE="$idle" COMMIT="$commit" \
  HOST="$host" BUILD_TYPE="$build_type" PORT_LINE="$port_line" NOTE="${NOTE:-}" \
  LOAD="$(cut -d' ' -f1-3 /proc/loadavg)" BASE="$base" CPU="$(cpu_model)" \
  VM="$(grep -q '^flags.* hypervisor' /proc/cpuinfo && echo ', virtual machine')" python3 - <<'PY'
import datetime, json, os, platform, sys
sys.path.insert(0, "bench/lib")
import caracal_bench as cb
e = os.environ
rows = [l.rstrip("\n").split("\t") for l in open(e["SAMPLES"]) if l.strip()]
names = {"p50_us": "ping-pong p50 (us)", "p99_us": "ping-pong p99 (us)", "p999_us": "ping-pong p99.9 (us)",
         "avg_us": "ping-pong mean (us)", "sent_per_s": "throughput: sockperf sent (msg/s)",
         "received_per_s": "throughput: listener received (msg/s)"}
data = {k: {f: [float(r[2 + i]) for r in rows if r[0] == k] for i, f in enumerate(names)} for k in ("asio", "dpdk")}
med = {k: {f: cb.median(v[f]) for f in names} for k, v in data.items()}
machine = f"{e['CPU'] or '?'}, {os.cpu_count()} CPUs{e['VM']}, Linux {platform.release()}"
date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
cb.write_json(e["BASE"] + ".json", {
    "benchmark": "dpdk-udp", "pmd": e["PMD"], "machine": machine, "host": e["HOST"], "date": date,
    "commit": e["COMMIT"], "build": e["BUILD_TYPE"], "dpdk_port": e["PORT_LINE"],
    "rounds": int(e["ROUNDS"]), "seconds_per_run": int(e["SECS"]), "message_bytes": int(e["MSG"]),
    "idle_sleep_us": int(e["IDLE"]), "load_average_at_end": e["LOAD"], "note": e["NOTE"],
    "samples": data, "medians": med,
    "ratios_dpdk_over_asio": {f: (med["dpdk"][f] / med["asio"][f] if med["asio"][f] else None) for f in names},
}, indent=2)
def fmt(v):
    return f"{v:,.0f}" if v >= 1000 else f"{v:.1f}"
out = [f"# Caracal UDP: Asio listener vs DPDK listener ({e['PMD']})", "",
       f"- machine: {machine}",
       f"- host {e['HOST']}, {date}, commit {e['COMMIT']}, build {e['BUILD_TYPE']}",
       f"- DPDK port: {e['PORT_LINE']}; idle_sleep_us {e['IDLE']}",
       f"- one snic_server (io_threads 1) with both listeners on the echo service, one CPU echo agent (1 queue); "
       f"sockperf in the server's network namespace: over loopback to the Asio listener, over "
       f"{'a veth pair into net_af_packet' if e['PMD'] == 'af_packet' else 'a tap device into net_tap'} to the DPDK listener",
       f"- {e['ROUNDS']} rounds of {e['SECS']} s per test, asio and dpdk interleaved; medians over the rounds; "
       f"{e['MSG']}-byte messages; load average at the end: {e['LOAD']}"]
out += [f"- note: {e['NOTE']}"] * bool(e["NOTE"])
out += ["", "This is a 2-core virtual machine shared with other work, and the DPDK port is a software "
        "PMD over the kernel (every frame still crosses the kernel, by a packet socket or a tap "
        "device), while the Asio side uses loopback. The numbers say how the two paths compare "
        "here; they say little about a BlueField with a ConnectX PMD, where the DPDK port owns "
        "the NIC. The DPDK workers poll (and spin while a request of theirs is in flight), so on a "
        "machine with more runnable threads than cores they take CPU time from the engine and the "
        "agent, where the Asio I/O thread sleeps in epoll until a datagram arrives; the load "
        "average above says how busy the machine was.", "",
        "| test | asio | dpdk | dpdk / asio |", "| --- | ---: | ---: | ---: |"]
out += [cb.md_row([names[f], fmt(a), fmt(d), f"{d / a:.2f}x" if a else "-"])
        for f in names for a, d in [(med["asio"][f], med["dpdk"][f])]]
out += ["", "Throughput: sockperf sends as fast as it can and asks for no replies; \"received\" is the "
        "listener's `caracal_listener_requests_total` over the run, what reached the server.", "",
        "## Every round", "", "| listener | round | p50 us | p99 us | p99.9 us | mean us | sent/s | received/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"] + [cb.md_row(r) for r in rows]
text = "\n".join(out) + "\n"
cb.write_text(e["BASE"] + ".md", text)
print(text)
PY
echo "wrote $base.md and $base.json" >&2
