#!/usr/bin/env bash
# bench/compare/run.sh threads, briefly, on the CPU accelerator: one snic_server as two versions
# (UDP spread flows and datagrams, SPREAD_NAME), 1 and 2 I/O threads (THREADS), two agents
# (AGENTS), an open-loop point at a fixed rate (OPEN_RATES). The report must hold every point with
# busy cores from caracal_engine_idle_seconds_total, and every reply must be right. Measures
# nothing.
set -euo pipefail
BUILD=$(realpath "${1:?build directory}")
SRC=$(realpath "${2:?source directory}")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
command -v curl >/dev/null || { echo "SKIP: no curl (the busy cores come from /metrics)"; exit 77; }
rc=0
CARACAL_ACCEL=cpu AGENTS=2 AGENT_QUEUES=2 THREADS="1 2" SAT_CONNECTIONS=2 SAT_WINDOW=4 \
  LOADGEN_THREADS=2 DURATION=0.3 WARMUP=0.1 OPEN_RATES=2000 \
  SPREAD_flows=flows SPREAD_datagrams=datagrams \
  "$SRC/bench/compare/run.sh" threads "$BUILD" "$WORK/out" \
  flows="$BUILD/snic_server/snic_server" datagrams="$BUILD/snic_server/snic_server" \
  >"$WORK/run.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { cat "$WORK/run.log"; echo "FAIL: run.sh threads exited $rc"; exit 1; }
python3 - "$WORK/out" <<'PY'
import json, sys
out = sys.argv[1]
doc = json.load(open(f"{out}/threads.json"))
pts = doc["points"]
want = {(v, t, proto, kind) for v in ("flows", "datagrams") for t in (1, 2)
        for proto in ("udp", "tcp") for kind in ("latency", "saturation", "open-at-2000")}
have = {(p["version"], p["io_threads"], p["proto"], p["kind"]) for p in pts}
missing = want - have
assert not missing, f"points missing: {sorted(missing)}"
for p in pts:
    where = f"{p['version']} t{p['io_threads']} {p['proto']} {p['kind']}"
    assert p["rps"] and p["rps"] > 0, f"{where}: no throughput"
    assert p["errors"] == 0 and p["lost"] == 0, f"{where}: wrong or lost replies"
    assert p["busy_cores"] is not None, f"{where}: no busy cores"
    assert 0 <= p["busy_cores"] <= p["io_threads"] + 0.05, f"{where}: busy {p['busy_cores']}"
for v in ("flows", "datagrams"):
    for t in (1, 2):
        run = json.load(open(f"{out}/{v}/t{t}/compare.json"))
        assert run["params"]["spread"] == v, f"{v} t{t} ran spread {run['params']['spread']}"
        assert run["params"]["agents"] == 2, f"{v} t{t}: {run['params']['agents']} agents"
text = open(f"{out}/threads.md").read()
for needle in ("req/s per busy core", "The same load at every thread count: matvec, UDP 1024 B",
               "2 agents on cpu"):
    assert needle in text, f"threads.md lacks '{needle}'"
print("PASS")
PY
