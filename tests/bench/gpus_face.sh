#!/usr/bin/env bash
# bench/compare/run.sh gpus-cpu with the face verification handler (HANDLERS=face), small, on
# two CPU agents: a memcached of the run's own, throughput against 1 and 2 agents whose client
# queues fetch the references from it, and the second agent killed (SIGKILL) under TCP load.
# Every verdict is checked against the CPU reference by loadgen; each agent must have answered
# its share and called memcached through client queues of its own. The processes are kept to
# CPU lists (SERVER_CPUS, CLIENT_CPUS, MEMCACHED_CPUS), here every CPU but memcached's last. It
# keeps the face form of the script working; it measures nothing.
set -euo pipefail
BUILD=$(realpath "${1:?build directory}")
SRC=$(realpath "${2:?source directory}")
command -v python3 >/dev/null || { echo "python3 is missing (scripts/deps.sh test)"; exit 77; }
command -v memcached >/dev/null || { echo "SKIP: memcached is not installed (scripts/deps.sh test)"; exit 77; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

last=$(($(nproc) - 1))
if ! HANDLERS=face FACE_PERSONS=200 MEMCACHED_THREADS=1 EXPERIMENTS="scaling loss" \
  SERVER_CPUS="0-$last" CLIENT_CPUS="0-$last" MEMCACHED_CPUS="$last" \
  CARACAL_COMMIT=ci-smoke "$SRC/bench/compare/run.sh" gpus-cpu "$BUILD" "$WORK/out" \
  >"$WORK/run.log" 2>&1; then
  cat "$WORK/run.log"
  echo "FAIL: run.sh gpus-cpu exited non-zero"
  exit 1
fi
cat "$WORK/run.log"
grep -q "stored 200 references" "$WORK/out/raw/face-loader.log" ||
  { echo "FAIL: the loader did not store the face set"; exit 1; }
for i in 0 1; do
  grep -q "service 'face': 2 queue(s), rings of 512 slots of 256 B, 2 client queue(s)" \
    "$WORK/out/raw/scaling-caracal-n2-agent$i.log" ||
    { echo "FAIL: agent $i had no client queue per queue"; exit 1; }
done

python3 - "$WORK/out/gpus.json" <<'PY'
import json
import sys

run = json.load(open(sys.argv[1]))
problems = []
if run["failed_points"] != 0:
    problems.append(f"{run['failed_points']} points failed")
if run["params"].get("handler") != "face" or run["params"]["size"] != 4104:
    problems.append(f"not a face run: {run['params']}")
if not run["params"].get("server_cpus") or not run["params"].get("memcached_cpus"):
    problems.append(f"the CPU lists are not in the params: {run['params']}")
points = run["points"]
for n in (1, 2):
    for proto in ("udp", "tcp"):
        found = [p for p in points if p["experiment"] == "scaling" and p["accelerators"] == n
                 and p["proto"] == proto and p["kind"] == "saturation"]
        if len(found) != 1:
            problems.append(f"scaling {n} {proto}: {len(found)} points")
            continue
        p = found[0]
        c = p.get("counts") or {}
        if p.get("loadgen_rc") != 0 or c.get("wrong", 1) or c.get("error_replies", 1):
            problems.append(f"scaling {n} {proto}: loadgen {p.get('loadgen_rc')}, counts {c}")
        # memcached's cores are measured at every point, and the machine spent at least what
        # the server did.
        if not isinstance(p.get("memcached_cores"), float):
            problems.append(f"scaling {n} {proto}: memcached cores {p.get('memcached_cores')}")
        if not (p.get("machine_cores") or 0) >= p["cpu_cores"] * 0.9:
            problems.append(f"scaling {n} {proto}: machine cores {p.get('machine_cores')} "
                            f"below the server's {p['cpu_cores']}")
        # Caracal's points carry the means of snic_server's histograms over the point: every
        # face request called memcached, so both are there.
        means = p.get("server_means_us") or {}
        if not (means.get("service_latency", 0) > 0 and means.get("destination_call", 0) > 0):
            problems.append(f"scaling {n} {proto}: server means {means}")
        served = p.get("answered_by_agent") or {}
        if sorted(served) != [f"acc{i}" for i in range(n)] or min(served.values()) <= 0:
            problems.append(f"scaling {n} {proto}: agents answered {served}")
# memcached answered every request's get: over the run (at 10 ms a tick) it spent CPU.
if not sum(p.get("memcached_cores") or 0 for p in points) > 0:
    problems.append("memcached spent no CPU in any point")
loss = [p for p in points if p["experiment"] == "loss"]
if len(loss) != 1:
    problems.append(f"loss: {len(loss)} points")
else:
    c = loss[0]["counts"]
    if loss[0]["loadgen_rc"] != 0 or c["wrong"] or c["unanswered"] or c["connection_errors"]:
        problems.append(f"loss: loadgen {loss[0]['loadgen_rc']}, counts {c}")
for problem in problems:
    print("FAIL:", problem)
sys.exit(1 if problems else 0)
PY
grep -qF "face verification, 200 references in memcached" "$WORK/out/gpus.md" ||
  { echo "FAIL: gpus.md does not name the face workload"; exit 1; }
grep -q "^| caracal | udp | 2 | .* | .* | .* | .* | .* | .* |$" "$WORK/out/gpus.md" ||
  { echo "FAIL: gpus.md has no row of the machine's CPUs with memcached's"; exit 1; }
grep -qE "^\| caracal \| udp \| 2 \| [0-9]+ \| [0-9]+ \|$" "$WORK/out/gpus.md" ||
  { echo "FAIL: gpus.md has no row of snic_server's request and destination call means"; exit 1; }
echo "run.sh gpus-cpu HANDLERS=face: scaling and a lost agent, every verdict right"
