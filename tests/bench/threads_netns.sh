#!/usr/bin/env bash
# bench/compare/run.sh threads with the client in a network namespace of its own
# (CLIENT_NETNS_NAME), briefly, on the CPU accelerator: one snic_server as two versions, over
# loopback and over a veth pair with each side's packets steered (RFS) to its own CPUs, a server
# of as many cores as threads (PIN=server:threads), the load per thread held (SAT_PER_THREAD) and
# the veth version under another dispatch policy (DISPATCH_NAME). Every reply must be right, the
# veth version's server must have listened on the veth address, every point must say how busy the
# server's CPUs were, and the namespace must be gone afterwards. Measures nothing.
set -euo pipefail
BUILD=$(realpath "${1:?build directory}")
SRC=$(realpath "${2:?source directory}")
[ "$(id -u)" -eq 0 ] || { echo "SKIP: not root (a network namespace and RPS need it)"; exit 77; }
command -v ip >/dev/null || { echo "SKIP: no iproute2"; exit 77; }
command -v taskset >/dev/null || { echo "SKIP: no taskset"; exit 77; }
probe="cbprobe$$"
ip netns add "$probe" 2>/dev/null || { echo "SKIP: cannot create a network namespace"; exit 77; }
ip netns del "$probe"
cores=$(python3 -c 'import glob; print(len({(open(d + "/physical_package_id").read(), open(d + "/core_id").read()) for d in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology")}))')
[ "$cores" -ge 2 ] || { echo "SKIP: one physical core (the server and the client need one each)"; exit 77; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
flow_entries=$(cat /proc/sys/net/core/rps_sock_flow_entries)
rc=0
CARACAL_ACCEL=cpu AGENT_QUEUES=2 THREADS="1" SAT_WINDOW=4 \
  DURATION=0.3 WARMUP=0.1 PIN=server:threads SAT_PER_THREAD=2 CLIENT_NETNS_veth=rfs \
  DISPATCH_veth=flow_affinity \
  "$SRC/bench/compare/run.sh" threads "$BUILD" "$WORK/out" \
  loopback="$BUILD/snic_server/snic_server" veth="$BUILD/snic_server/snic_server" \
  >"$WORK/run.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { cat "$WORK/run.log"; echo "FAIL: run.sh threads exited $rc"; exit 1; }
[ "$(cat /proc/sys/net/core/rps_sock_flow_entries)" = "$flow_entries" ] ||
  { echo "FAIL: net.core.rps_sock_flow_entries was not put back to $flow_entries"; exit 1; }
if ip netns list | grep -q '^cb[0-9]'; then
  ip netns list
  echo "FAIL: a client namespace outlived the run"
  exit 1
fi
grep -q 'listening on tcp/10.203.0.1:0' "$WORK/out/veth/t1/raw/caracal-matvec-server.log" ||
  { echo "FAIL: the veth version's server did not listen on 10.203.0.1"; exit 1; }
grep -q 'listening on tcp/127.0.0.1:0' "$WORK/out/loopback/t1/raw/caracal-matvec-server.log" ||
  { echo "FAIL: the loopback version's server did not listen on 127.0.0.1"; exit 1; }
python3 - "$WORK/out" <<'PY'
import json, sys
out = sys.argv[1]
pts = json.load(open(f"{out}/threads.json"))["points"]
want = {(v, proto, kind) for v in ("loopback", "veth") for proto in ("udp", "tcp")
        for kind in ("latency", "saturation")}
have = {(p["version"], p["proto"], p["kind"]) for p in pts}
assert not want - have, f"points missing: {sorted(want - have)}"
for p in pts:
    where = f"{p['version']} {p['proto']} {p['kind']}"
    assert p["rps"] and p["rps"] > 0, f"{where}: no throughput"
    assert p["errors"] == 0 and p["lost"] == 0, f"{where}: wrong or lost replies"
    # One CPU, and /proc/stat's ticks: each busy field of a reading is cut to a whole tick,
    # up to 4 ticks over a window of some 40 (DURATION 0.3 s + WARMUP at 100 Hz).
    assert p["cpus_cores"] is not None and 0 < p["cpus_cores"] <= 1.10, \
        f"{where}: server CPUs busy {p['cpus_cores']}"
for v, netns, dispatch in (("loopback", "off", "round_robin"), ("veth", "rfs", "flow_affinity")):
    params = json.load(open(f"{out}/{v}/t1/compare.json"))["params"]
    assert params["dispatch"] == dispatch, f"{v}: dispatch {params['dispatch']}"
    assert params["client_netns"] == netns, f"{v}: client_netns {params['client_netns']}"
    assert params["server_cpus"] and params["client_cpus"], f"{v}: not pinned"
    assert params["sat_connections"] == 2 and params["loadgen_threads"] == 2, \
        f"{v}: SAT_PER_THREAD=2 at 1 thread gave {params['sat_connections']} connections"
text = open(f"{out}/threads.md").read()
for needle in ("req/s per busy CPU", "The client of veth (RFS) ran in a network namespace"):
    assert needle in text, f"threads.md lacks '{needle}'"
print("PASS")
PY
