#!/usr/bin/env bash
# bench/compare/run.sh gpus-cpu end to end: the gpus run small, on two CPU agents: throughput
# against 1 and 2 agents, two agents of unequal speed (the second sleeps 2 ms per request) under
# round_robin and least_loaded, and the second agent killed (SIGKILL) under TCP load. Then the
# report must hold every point with right replies, and it checks what the design promises,
# which holds on any machine: round_robin gives each agent half of the requests whatever their
# speed, least_loaded gives the fast one most of them; after the kill the survivor keeps
# answering, the dead agent answers nothing, and every request got a reply or an error reply.
# Throughput figures themselves are not checked (2 shared cores measure nothing).
set -euo pipefail
BUILD=$(realpath "${1:?build directory}")
SRC=$(realpath "${2:?source directory}")
command -v python3 >/dev/null || { echo "python3 is missing (scripts/deps.sh test)"; exit 77; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

if ! CARACAL_COMMIT=ci-smoke "$SRC/bench/compare/run.sh" gpus-cpu "$BUILD" "$WORK/out" \
  >"$WORK/run.log" 2>&1; then
  cat "$WORK/run.log"
  echo "FAIL: run.sh gpus-cpu exited non-zero"
  exit 1
fi
cat "$WORK/run.log"

python3 - "$WORK/out/gpus.json" <<'EOF'
import json
import sys

run = json.load(open(sys.argv[1]))
problems = []
if run["failed_points"] != 0:
    problems.append(f"{run['failed_points']} points failed")
if not run["cpu_only"] or run["accelerators"] != 2:
    problems.append(f"not a CPU-only run of 2 agents: {run['cpu_only']}, {run['accelerators']}")
points = run["points"]


def find(**kw):
    return [p for p in points if all(p.get(k) == v for k, v in kw.items())]


def clean(p, where):
    c = p.get("counts") or {}
    if p.get("loadgen_rc") != 0 or c.get("wrong", 1) != 0 or c.get("connection_errors", 1) != 0:
        problems.append(f"{where}: loadgen {p.get('loadgen_rc')}, counts {c}")
    if not p.get("throughput_rps"):
        problems.append(f"{where}: no throughput")
    if not p.get("cpu_cores", 0) > 0:
        problems.append(f"{where}: no server CPU")


for n in (1, 2):
    for proto in ("udp", "tcp"):
        found = find(experiment="scaling", server="caracal", accelerators=n, proto=proto,
                     kind="saturation")
        if len(found) != 1:
            problems.append(f"scaling {n} {proto}: {len(found)} points")
            continue
        clean(found[0], f"scaling {n} {proto}")
        served = found[0].get("answered_by_agent") or {}
        if sorted(served) != [f"acc{i}" for i in range(n)] or min(served.values()) <= 0:
            problems.append(f"scaling {n} {proto}: agents answered {served}")
    if len(find(experiment="scaling", accelerators=n, kind="open-0.1")) != 1:
        problems.append(f"scaling {n}: no open-loop point")
if [r["accelerators"] for r in run.get("scaling", []) if r["proto"] == "udp"] != [1, 2]:
    problems.append(f"scaling table: {run.get('scaling')}")

shares = {}
for policy in ("round_robin", "least_loaded"):
    found = find(experiment="unequal", policy=policy)
    if len(found) != 1:
        problems.append(f"unequal {policy}: {len(found)} points")
        continue
    clean(found[0], f"unequal {policy}")
    a = found[0].get("answered_by_agent") or {}
    total = a.get("acc0", 0) + a.get("acc1", 0)
    shares[policy] = a.get("acc0", 0) / total if total else 0
# Round robin deals the queues' requests evenly; least_loaded sends the slow agent (2 ms a
# request, the fast one tens of us) only what finds the fast agent's queues busier.
if len(shares) == 2:
    if not 0.35 <= shares["round_robin"] <= 0.65:
        problems.append(f"round_robin gave the fast agent {shares['round_robin']:.0%}")
    if not shares["least_loaded"] >= 0.75:
        problems.append(f"least_loaded gave the fast agent only {shares['least_loaded']:.0%}")

s = run.get("loss_summary")
loss = find(experiment="loss")
if not s or len(loss) != 1:
    problems.append(f"loss: summary {s}, {len(loss)} points")
else:
    c = loss[0]["counts"]
    if loss[0]["loadgen_rc"] != 0 or c["wrong"] or c["unanswered"] or c["connection_errors"]:
        problems.append(f"loss: loadgen {loss[0]['loadgen_rc']}, counts {c}")
    if c["replies"] + c["error_replies"] != c["sent"]:
        problems.append(f"loss: {c['sent']} sent, {c['replies']} replies + "
                        f"{c['error_replies']} error replies")
    agents = s.get("agents") or {}
    survivor, victim = agents.get("acc0") or {}, agents.get("acc1") or {}
    if not (survivor.get("after_rps") or 0) > 0:
        problems.append(f"loss: the survivor answered nothing after the kill: {agents}")
    if (victim.get("after_rps") or 0) != 0:
        problems.append(f"loss: the killed agent still answered: {agents}")
    if not (s.get("after_rps") or 0) > 0:
        problems.append(f"loss: no replies after the kill: {s}")
for problem in problems:
    print("FAIL:", problem)
sys.exit(1 if problems else 0)
EOF

md="$WORK/out/gpus.md"
for want in "## Throughput against CPU agents" "## Latency against load" \
  "## Two agents of unequal speed" "## An agent lost under load" "(kill)"; do
  grep -qF "$want" "$md" || { echo "FAIL: gpus.md lacks '$want'"; exit 1; }
done
echo "run.sh gpus-cpu: scaling, unequal agents and a lost agent, with the report"
