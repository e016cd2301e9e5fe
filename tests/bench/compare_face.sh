#!/usr/bin/env bash
# bench/compare/run.sh's face verification part, small, on the CPU accelerator: a memcached of
# the run's own loaded by caracal_face_loader, then Caracal (the face agent fetching through
# client queues) and the CPU server (its own memcached connections) at latency, saturation and
# one open-loop step over UDP and TCP, every reply checked against the CPU reference; the JSON
# and the tables must hold every point. It keeps the script working; it measures nothing.
set -euo pipefail
BUILD=$(realpath "${1:?build directory}")
SRC=$(realpath "${2:?source directory}")
command -v python3 >/dev/null || { echo "python3 is missing (scripts/deps.sh test)"; exit 77; }
command -v memcached >/dev/null || { echo "SKIP: memcached is not installed (scripts/deps.sh test)"; exit 77; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

if ! SERVERS="caracal cpu" HANDLERS=face DURATION=0.3 WARMUP=0.1 THREADS=2 LOADGEN_THREADS=2 \
  SAT_CONNECTIONS=2 SAT_WINDOW=4 OPEN_SIZES=4104 OPEN_FRACTIONS=0.1 AGENT_QUEUES=2 \
  LOW_LOAD_ROUNDS=0 FACE_PERSONS=200 MEMCACHED_THREADS=1 CARACAL_COMMIT=test \
  "$SRC/bench/compare/run.sh" "$BUILD" "$WORK/out" --cpu-only >"$WORK/run.log" 2>&1; then
  cat "$WORK/run.log"
  echo "FAIL: run.sh exited non-zero"
  exit 1
fi
grep -q "stored 200 references" "$WORK/out/raw/face-loader.log" ||
  { echo "FAIL: the loader did not store the face set"; exit 1; }
grep -q "service 'face': 2 queue(s), rings of 512 slots of 256 B, 2 client queue(s)" \
  "$WORK/out/raw/caracal-face-agent.log" || { echo "FAIL: the agent had no client queue per queue"; exit 1; }

python3 - "$WORK/out/compare.json" <<'PY'
import json
import sys

run = json.load(open(sys.argv[1]))
problems = []
if run["failed_points"] != 0:
    problems.append(f"{run['failed_points']} points failed")
for server in ("caracal", "cpu"):
    for proto in ("udp", "tcp"):
        for kind in ("latency", "saturation", "open-0.1"):
            where = f"{server} face {proto} {kind}"
            found = [p for p in run["points"] if p.get("server") == server and
                     p.get("handler") == "face" and p.get("proto") == proto and
                     p.get("size") == 4104 and p.get("kind") == kind]
            if len(found) != 1:
                problems.append(f"{where}: {len(found)} points")
                continue
            p = found[0]
            if p.get("throughput_rps", 0) <= 0:
                problems.append(f"{where}: no throughput")
            if p["counts"]["wrong"] != 0 or p["counts"]["connection_errors"] != 0:
                problems.append(f"{where}: wrong replies or connection errors")
            if p.get("cpu_cores", 0) <= 0:
                problems.append(f"{where}: no server CPU")
for problem in problems:
    print("FAIL:", problem)
sys.exit(1 if problems else 0)
PY
for want in "## face: latency at low load" "## face: throughput at saturation" "| udp | 4104 |"; do
  grep -qF "$want" "$WORK/out/compare.md" || { echo "FAIL: compare.md lacks '$want'"; exit 1; }
done
echo "run.sh face: every point of Caracal and the CPU server over UDP and TCP, verified"
