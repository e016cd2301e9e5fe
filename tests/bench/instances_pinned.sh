#!/usr/bin/env bash
# bench/compare/run.sh instances-cpu's pinned path (PIN=server:threads), briefly: one server of
# one I/O thread on a core of its own, alone and beside a core spinning in registers (+spin1), the
# probe on the last core. Needs 4 physical cores (the server, its client, the hog and the probe),
# else skipped. Every point must have answered every request right, say how busy the server's core
# was and carry the probe's rates; the hog must be gone afterwards. Measures nothing.
set -euo pipefail
BUILD=$(realpath "${1:?build directory}")
SRC=$(realpath "${2:?source directory}")
command -v python3 >/dev/null || { echo "python3 is missing (scripts/deps.sh test)"; exit 77; }
command -v taskset >/dev/null || { echo "SKIP: no taskset"; exit 77; }
cores=$(python3 -c 'import glob; print(len({(open(d + "/physical_package_id").read(), open(d + "/core_id").read()) for d in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology")}))')
[ "$cores" -ge 4 ] || { echo "SKIP: $cores physical cores (the server, its client, a hog and the probe need 4)"; exit 77; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if ! LAYOUTS="1x1 1x1+spin1" CARACAL_COMMIT=ci-smoke \
  "$SRC/bench/compare/run.sh" instances-cpu "$BUILD" "$WORK/out" >"$WORK/run.log" 2>&1; then
  cat "$WORK/run.log"
  echo "FAIL: run.sh instances-cpu exited non-zero"
  exit 1
fi
cat "$WORK/run.log"
if pgrep -f 'while :; do :; done' >/dev/null; then
  pgrep -af 'while :; do :; done'
  echo "FAIL: the spinning hog outlived the run"
  exit 1
fi
python3 - "$WORK/out" <<'PY'
import json, sys
out = sys.argv[1]
report = json.load(open(f"{out}/instances.json"))
layouts = {p["layout"] for p in report["points"]}
assert layouts == {"1x1", "1x1+spin1"}, f"layouts {layouts}"
for p in report["points"]:
    where = f"{p['layout']} {p['proto']}"
    assert p["loadgen_rc"] == 0, f"{where}: loadgen failed"
    assert p["server_cpus"] and p["client_cpus"], f"{where}: not pinned"
    # One CPU, and /proc/stat's ticks: each busy field of a reading is cut to a whole tick,
    # up to 4 ticks over a window of some 40 (DURATION 0.3 s + WARMUP at 100 Hz).
    assert p["server_cpus_cores"] is not None and 0 < p["server_cpus_cores"] <= 1.10, \
        f"{where}: server CPU busy {p['server_cpus_cores']}"
    assert p["probe_idle"] and p["probe_idle"] > 0 and p["probe_load"] and p["probe_load"] > 0, \
        f"{where}: no probe rates ({p['probe_idle']}, {p['probe_load']})"
    assert (p["hog"], p["hog_cores"]) == (("spin", 1) if "+spin" in p["layout"] else ("none", 0)), \
        f"{where}: hog {p['hog']} x {p['hog_cores']}"
for r in report["rows"]:
    assert r["failed_rounds"] == 0 and r["bad_replies"] == 0, f"{r['layout']} {r['proto']}: {r}"
    assert r["median_probe"] is not None, f"{r['layout']} {r['proto']}: no probe ratio"
print("PASS")
PY
