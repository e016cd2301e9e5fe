#!/usr/bin/env bash
# bench/chaos/run.sh, short: pipelined UDP and TCP load while the two echo agents are killed
# (SIGKILL) and started again 6 times, and the server is restarted twice under them (SIGTERM,
# then SIGKILL), the agents registering again and the TCP client reconnecting by themselves.
# Fails on any reply that went to the wrong client or request, any request not accounted for,
# counters of the server that do not reconcile with what the clients saw (reconcile.py's
# checks), and anything the driver sees go wrong itself (a process that dies, a server that
# does not stop or start, an agent that does not come back, load that stalls).
source "$(dirname "$0")/lib.sh"
need curl python3

rc=0
CYCLES=6 SERVER_EVERY=3 SERVER_KILL=2 AGENT_DOWN_MS=20:200 SETTLE_MS=100:300 CONNECTIONS=4 \
  WINDOW=8 TIME_SCALE="$TIME_SCALE" LOAD_PERCENT="${CARACAL_E2E_LOAD_PERCENT:-100}" \
  CARACAL_COMMIT=e2e "$SRC/bench/chaos/run.sh" "$BUILD" "$WORK" >"$WORK/chaos.out" 2>&1 || rc=$?
cat "$WORK/chaos.out"
[ "$rc" -ne 77 ] || exit 77
[ "$rc" -eq 0 ] || fail "the chaos run failed (exit $rc)"

python3 - "$WORK/summary.json" <<'EOF' || fail "the summary does not show the run asked for"
import json
import sys

s = json.load(open(sys.argv[1]))
problems = []
if not s["ok"]:
    problems.append("checks failed: " + str([c["check"] for c in s["checks"] if not c["ok"]]))
if s["agent_kills"] != 6:
    problems.append(f"{s['agent_kills']} agent kills, not 6")
if s["server_restarts"] != {"sigterm": 1, "sigkill": 1}:
    problems.append(f"server restarts {s['server_restarts']}, not one of each")
for proto in ("udp", "tcp"):
    c = s["clients"][proto]
    if c["replies"] == 0:
        problems.append(f"{proto}: no replies")
if s["clients"]["tcp"]["reconnects"] == 0:
    problems.append("the TCP client never reconnected")
print("\n".join(problems) or "summary: as asked")
sys.exit(1 if problems else 0)
EOF
echo "PASS"
