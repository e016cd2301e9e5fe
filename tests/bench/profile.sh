#!/usr/bin/env bash
# bench/profile/run.sh, briefly: this build as both trees, one round of UDP and TCP at 64 B, and
# its summary checked: a row per protocol and tree, each with its parts in microseconds that
# sum to more than the busy ones. Skipped (77) where perf cannot record.
set -euo pipefail
BUILD=$(realpath "${1:?build directory}")
SRC=$(realpath "${2:?source directory}")
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
rc=0
ROUNDS=1 SIZES=64 DURATION=1 bash "$SRC/bench/profile/run.sh" "$BUILD" "$BUILD" "$OUT" \
  >"$OUT/run.log" 2>&1 || rc=$?
[ "$rc" -eq 77 ] && { tail -1 "$OUT/run.log"; exit 77; }
[ "$rc" -eq 0 ] || { echo "FAIL: run.sh exited $rc:"; tail -20 "$OUT/run.log"; exit 1; }
python3 - "$OUT/summary.md" <<'PY'
import sys
rows = [l.strip().strip("|").split("|") for l in open(sys.argv[1]) if l.startswith("| udp") or l.startswith("| tcp")]
rows = [[c.strip() for c in r] for r in rows]
seen = {(r[0], r[2]) for r in rows}
want = {(p, t) for p in ("udp", "tcp") for t in ("before", "after")}
assert seen == want, f"rows for {sorted(seen)}, not {sorted(want)}"
for r in rows:
    busy, parts = float(r[4]), [float(c) for c in r[5:]]
    assert busy > 0, f"{r[0]} {r[2]}: no busy time ({r})"
    assert abs(sum(parts) - parts[0] - busy) < 0.05 * busy + 0.02, f"{r[0]} {r[2]}: parts do not sum to busy ({r})"
print(f"profile summary: {len(rows)} rows, parts summing to busy")
PY
