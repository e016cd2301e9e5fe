#!/usr/bin/env bash
# bench/compare/run.sh instances-cpu, unpinned (PIN=0, any machine):
# one server of one I/O thread, then two at once, each in a network namespace of its own where
# the machine allows it. Every server of every layout must have answered every request right,
# the namespaces must be gone afterwards, and the report must set the two-server layout beside
# the one-server one. A hog layout without pinning must be refused with a reason. Measures
# nothing.
set -euo pipefail
BUILD=$(realpath "${1:?build directory}")
SRC=$(realpath "${2:?source directory}")
command -v python3 >/dev/null || { echo "python3 is missing (scripts/deps.sh test)"; exit 77; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
layouts="1x1 2x1"
probe="ciprobe$$"
if [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null && ip netns add "$probe" 2>/dev/null; then
  ip netns del "$probe"
  layouts="1x1 2x1/ns"
else
  echo "note: no network namespaces here (not root or no iproute2); 2x1 runs without them"
fi
if ! PIN=0 LAYOUTS="$layouts" CARACAL_COMMIT=ci-smoke \
  "$SRC/bench/compare/run.sh" instances-cpu "$BUILD" "$WORK/out" >"$WORK/run.log" 2>&1; then
  cat "$WORK/run.log"
  echo "FAIL: run.sh instances-cpu exited non-zero"
  exit 1
fi
cat "$WORK/run.log"
if ip netns list 2>/dev/null | grep -q '^ci[0-9]'; then
  ip netns list
  echo "FAIL: a server's namespace outlived the run"
  exit 1
fi
python3 - "$WORK/out" "$layouts" <<'PY'
import json, sys
out, layouts = sys.argv[1], sys.argv[2].split()
report = json.load(open(f"{out}/instances.json"))
rows = {(r["layout"], r["proto"]): r for r in report["rows"]}
for layout in layouts:
    servers = int(layout.split("x")[0])
    for proto in ("tcp", "udp"):
        r = rows.get((layout, proto))
        assert r, f"no row for {layout} over {proto}"
        assert r["failed_rounds"] == 0 and r["bad_replies"] == 0, f"{layout} {proto}: {r}"
        assert r["median_rps"] and r["median_rps"] > 0, f"{layout} {proto}: no throughput"
        (rnd,) = r["rounds"]
        assert len(rnd["per_server_rps"]) == servers and all(x > 0 for x in rnd["per_server_rps"]), \
            f"{layout} {proto}: each server must have served: {rnd['per_server_rps']}"
        assert r["netns"] == ("/ns" in layout), f"{layout}: netns {r['netns']}"
for p in report["points"]:
    if p["netns"]:
        log = open(f"{out}/raw/{p['layout'].replace('/', '')}-s{p['server']}-server.log").read()
        assert "listening on tcp/127.0.0.1:0" in log, f"server {p['server']} of {p['layout']} did not listen"
text = open(f"{out}/instances.md").read()
assert f"| tcp | {layouts[1]} |" in text and "per CPU against 1xT" in text, "instances.md lacks the rows"
print("PASS: report")
PY
if PIN=0 LAYOUTS="1x1+spin1" "$SRC/bench/compare/run.sh" instances-cpu "$BUILD" "$WORK/hog" \
  >"$WORK/hog.log" 2>&1; then
  echo "FAIL: a hog layout ran unpinned"
  exit 1
fi
grep -q "need PIN=server:threads" "$WORK/hog.log" || { cat "$WORK/hog.log"; echo "FAIL: no reason given"; exit 1; }
echo "PASS"
