#!/usr/bin/env bash
# bench/compare/run.sh end to end, small: Caracal (the engine in the I/O threads), Caracal with
# engine threads of its own (caracal_threads) and the CPU server, with the agents on the CPU
# accelerator (--cpu-only), echo and matvec at 64 B over UDP and TCP: two rounds of echo at low
# load on Caracal and the CPU server, then latency, saturation, one open-loop step (at a tenth
# of the saturation rate: at half of it, on 2 cores shared with three polling threads, the
# open-loop client sometimes fell so far behind that nothing landed in its window) and, where
# sockperf is installed, the sockperf anchor; where perf can sample (linux-perf), the
# saturation points are profiled (PERF) and the report splits them; where a cgroup CPU quota
# can be set (root), Caracal's saturation points run again held to the CPU server's cores
# (HOLD_TO). Then the JSON and the
# tables must hold every point, with the server's and the client's CPU, and every reply right.
# It checks the script and its report on every change; on the GPU machine the same script makes
# bench/results/. Measures nothing.
set -euo pipefail
BUILD=$(realpath "${1:?build directory}")
SRC=$(realpath "${2:?source directory}")
command -v python3 >/dev/null || { echo "python3 is missing (scripts/deps.sh test)"; exit 77; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
PERF=""
# A sanitized build's samples land mostly in the sanitizer's runtime, and the server's own code
# is spread over symbols below the report's cut-off: its profile says nothing about the report,
# so the profile part is checked on the plain build only.
sanitizer=$(sed -n 's/^CARACAL_SANITIZE:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null || true)
if [ -n "$sanitizer" ]; then
  echo "a $sanitizer-sanitized build: the profile part is not checked"
elif command -v perf >/dev/null && perf record -q -e cpu-clock -o "$WORK/probe.data" -- true 2>/dev/null; then
  PERF=$(command -v perf)
else
  echo "perf cannot sample here; the profile part is not checked"
fi
HOLD_TO=""
if (source "$SRC/bench/lib/bench.sh" && hold_create "caracal-bench-probe-$$" && rmdir "$HOLD_CG"); then
  HOLD_TO=cpu
else
  echo "no cgroup CPU quota can be set here; the held points are not checked"
fi
# A held run must name another server of the run, and is refused before anything runs.
rc=0
HOLD_TO=caracal_bogus "$SRC/bench/compare/run.sh" "$BUILD" "$WORK/refused" --cpu-only \
  >"$WORK/refused.log" 2>&1 || rc=$?
if [ "$rc" -ne 2 ] || [ -s "$WORK/refused/raw/points.jsonl" ] ||
  ! grep -q "HOLD_TO=caracal_bogus is not another server of this run" "$WORK/refused.log"; then
  cat "$WORK/refused.log"
  echo "FAIL: run.sh took HOLD_TO=caracal_bogus (exit $rc), or did not say why it refused it"
  exit 1
fi

if ! SERVERS="caracal caracal_threads cpu" HANDLERS="echo matvec" SIZES=64 DURATION=0.3 \
  WARMUP=0.1 THREADS=2 LOADGEN_THREADS=2 SAT_CONNECTIONS=2 SAT_WINDOW=4 OPEN_SIZES=64 \
  OPEN_FRACTIONS=0.1 AGENT_QUEUES=2 ENGINE_THREADS=0 LOW_LOAD_ROUNDS=2 CARACAL_COMMIT=test PERF="$PERF" \
  HOLD_TO="$HOLD_TO" \
  "$SRC/bench/compare/run.sh" "$BUILD" "$WORK/out" --cpu-only >"$WORK/run.log" 2>&1; then
  cat "$WORK/run.log"
  echo "FAIL: run.sh exited non-zero"
  exit 1
fi

grep -q '^engine_threads: 0$' "$WORK/out/raw/caracal-echo-server.yaml" ||
  { echo "FAIL: caracal did not run engine_threads 0"; exit 1; }
grep -q '^engine_threads: 2$' "$WORK/out/raw/caracal_threads-echo-server.yaml" ||
  { echo "FAIL: caracal_threads did not run engine_threads 2"; exit 1; }

python3 - "$WORK/out/compare.json" "$(command -v sockperf || true)" "$PERF" "$HOLD_TO" <<'EOF'
import json
import math
import sys

run = json.load(open(sys.argv[1]))
have_sockperf = bool(sys.argv[2])
have_perf = bool(sys.argv[3])
hold_to = sys.argv[4]
problems = []
if run["failed_points"] != 0:
    problems.append(f"{run['failed_points']} points failed")
if not run["cpu_only"]:
    problems.append("not marked as a CPU-only run")
points = run["points"]


def find(**kw):
    return [p for p in points if all(p.get(k) == v for k, v in kw.items())]


for server in ("caracal", "caracal_threads", "cpu"):
    for handler in ("echo", "matvec"):
        for proto in ("udp", "tcp"):
            for kind in ("latency", "saturation", "open-0.1"):
                where = f"{server} {handler} {proto} {kind}"
                found = find(server=server, handler=handler, proto=proto, size=64, kind=kind)
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
                c = p.get("client_cpu")
                if not c or not 0 < c["busiest_thread_cores"] <= c["cores"] + 1e-9:
                    problems.append(f"{where}: client CPU {c}")
            sat = find(server=server, handler=handler, proto=proto, size=64, kind="saturation")
            if sat and not sat[0].get("threads"):
                problems.append(f"{server} {handler} {proto}: no per-thread cores at saturation")
            # The profile: the kernel's share seen (each server here receives and sends through
            # the kernel), and for Caracal its own code (its engine polls the rings all the
            # time). The CPU server's own code is a thin loop around the kernel's calls: spread
            # over symbols below the report's 0.3% cut-off, it can sum to 0.
            prof = sat[0].get("profile_pct") if sat else None
            own_code_seen = not server.startswith("caracal") or (prof and prof["server code"] > 0)
            if have_perf and not (prof and prof["kernel rest"] > 0 and own_code_seen
                                  and sum(prof.values()) <= 100 + 1e-6 + prof["ring polling"]):
                problems.append(f"{server} {handler} {proto}: profile {prof}")
            if not have_perf and prof:
                problems.append(f"{server} {handler} {proto}: a profile without PERF")
    if have_sockperf:
        sp = find(server=server, kind="sockperf", size=64)
        if len(sp) != 1 or not (sp[0].get("sockperf_latency") or {}).get("p50_us"):
            problems.append(f"{server}: no sockperf p50")
# The low-load rounds: Caracal and the CPU server (the default of LOW_LOAD_SERVERS), each round,
# each with its loadgen point and (with sockperf) its sockperf point, and the paired gaps.
if run["low_load_servers"] != "caracal cpu":
    problems.append(f"low-load servers {run['low_load_servers']!r}")
for server in ("caracal", "cpu"):
    for r in (1, 2):
        found = find(server=server, kind="low-load", round=r)
        if len(found) != 1 or not (found[0].get("latency") or {}).get("p50_ns"):
            problems.append(f"{server} low-load round {r}: {len(found)} points or no p50")
        elif found[0]["counts"]["wrong"] != 0:
            problems.append(f"{server} low-load round {r}: wrong replies")
        if have_sockperf and len(find(server=server, kind="sockperf-low-load", round=r)) != 1:
            problems.append(f"{server} low-load round {r}: no sockperf point")
if find(server="caracal_threads", kind="low-load"):
    problems.append("caracal_threads ran low-load rounds it was not named for")
ll = run.get("low_load") or {}
gap = (ll.get("gaps") or {}).get("loadgen caracal") or {}
lg = ll.get("loadgen") or {}
if len(gap.get("per_round") or []) != 2 or gap.get("median") is None:
    problems.append(f"low-load gaps: {gap}")
elif any(abs(g - (a - b)) > 1e-9
         for g, a, b in zip(gap["per_round"], lg["caracal"], lg["cpu"])):
    problems.append(f"low-load gaps {gap} are not caracal less cpu {lg}")
# Held points: Caracal again at each saturation point, in a group held to the CPU server's cores
# there, with as many I/O threads as the quota rounded up; its cores stay under the quota (a
# tick of /proc's accounting and a tenth over it at most).
held = find(kind="held")
if not hold_to and held:
    problems.append("held points without HOLD_TO")
for handler in ("echo", "matvec") if hold_to else ():
    for proto in ("udp", "tcp"):
        where = f"held {handler} {proto}"
        found = find(server="caracal", handler=handler, proto=proto, size=64, kind="held")
        ref = find(server=hold_to, handler=handler, proto=proto, size=64, kind="saturation")
        if len(found) != 1 or len(ref) != 1:
            problems.append(f"{where}: {len(found)} points, {len(ref)} to hold to")
            continue
        p, h = found[0], found[0].get("hold") or {}
        want = math.floor(ref[0]["cpu_cores"] * 100) / 100
        if h.get("to") != hold_to or abs(h.get("cores", -1) - want) > 0.005:
            problems.append(f"{where}: held to {h}, want {want} cores of {hold_to}")
            continue
        if h["threads"] != math.ceil(h["cores"] - 1e-9) or h["period_us"] != 10000:
            problems.append(f"{where}: {h['threads']} threads, period {h['period_us']} us")
        if not h["periods"] > 0 or not 0 <= h["throttled"] <= h["periods"]:
            problems.append(f"{where}: periods {h['periods']}, throttled {h['throttled']}")
        if not 0 < p["cpu_cores"] <= h["cores"] * 1.1 + 0.05:
            problems.append(f"{where}: {p['cpu_cores']} cores, held to {h['cores']}")
        if p.get("throughput_rps", 0) <= 0 or p["counts"]["wrong"] != 0:
            problems.append(f"{where}: no throughput or wrong replies")
for problem in problems:
    print("FAIL:", problem)
sys.exit(1 if problems else 0)
EOF

md="$WORK/out/compare.md"
for want in "CPU-only smoke run" "caracal_threads: engine_threads 2" "caracal_threads p50" \
  "caracal_threads kreq/s" "client cores (busiest thread)" "echo at low load, 2 rounds" \
  "| loadgen | caracal - cpu |"; do
  grep -qF "$want" "$md" || { echo "FAIL: compare.md lacks '$want'"; exit 1; }
done
# snic_server's counters, kept for each low-load round and each main session.
for name in caracal-echo-round1 caracal-echo-round2 caracal-echo caracal_threads-matvec; do
  grep -q '^caracal_engine_spins_cut_total' "$WORK/out/raw/$name-metrics.txt" 2>/dev/null ||
    { echo "FAIL: no snic_server metrics in raw/$name-metrics.txt"; exit 1; }
done
[ ! -e "$WORK/out/raw/cpu-echo-round1-metrics.txt" ] ||
  { echo "FAIL: metrics kept for the CPU server, which has none"; exit 1; }
if [ -n "$HOLD_TO" ]; then
  grep -qF "## Caracal held to the cores of cpu at saturation" "$md" ||
    { echo "FAIL: compare.md lacks the held points"; exit 1; }
fi
if [ -n "$PERF" ]; then
  grep -qF "| caracal | echo | udp | 64 |" <(sed -n '/^## Where a request/,/^## /p' "$md") ||
    { echo "FAIL: compare.md lacks the profile table"; exit 1; }
fi
echo "run.sh: every point of 3 servers, 2 handlers and 2 protocols, with CPU and reports"
