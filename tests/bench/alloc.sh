#!/usr/bin/env bash
# bench/alloc/run.sh, briefly (64 B, a short window): a point per server and protocol, each
# with requests, and none of the default path's UDP requests allocating; first the counter
# against a program whose allocations are known. Measures no time.
set -euo pipefail
BUILD=$(realpath "${1:?build directory}")
SRC=$(realpath "${2:?source directory}")
command -v python3 >/dev/null || { echo "python3 is missing (scripts/deps.sh test)"; exit 77; }
# A sanitizer takes malloc over itself: the counter cannot stand in front of it.
if grep -Eq '^CARACAL_SANITIZE:[A-Z]*=.+' "$BUILD/CMakeCache.txt" 2>/dev/null; then
  echo "a sanitized build: its allocator is the sanitizer's; skipped"
  exit 77
fi
WORK=$(mktemp -d)
# In memory where there is a tmpfs, as run.sh keeps them (a store to a disk file's page that
# cannot be backed is a SIGBUS in the program counted).
COUNT_DIR=$(mktemp -d /dev/shm/caracal-alloc.XXXXXX 2>/dev/null || mktemp -d)
trap 'rm -rf "$WORK" "$COUNT_DIR"' EXIT

# The counter alone: python3 takes objects over 512 bytes from malloc; 100,000 of them kept alive
# are at least as many allocations more than the interpreter's start. The program must finish
# (a failed run would count less and say nothing).
count() {
  local rc=0
  CARACAL_ALLOC_COUNT_FILE=$COUNT_DIR/py.counts LD_PRELOAD=$BUILD/bench/alloc/libcaracal_alloc_count.so \
    python3 -c "import sys; keep = [bytes(1000 + i % 7) for i in range($1)]" 2>"$WORK/py.err" || rc=$?
  if [ "$rc" -ne 0 ]; then
    local why=""
    [ "$rc" -gt 128 ] && why=" (signal $(kill -l $((rc - 128)) 2>/dev/null || echo $((rc - 128))))"
    echo "FAIL: python3 under the counter exited $rc$why, counting into $COUNT_DIR" \
      "($(df -h --output=fstype,avail "$COUNT_DIR" | tail -1 | xargs)): $(cat "$WORK/py.err")" >&2
    return 1
  fi
  python3 - "$COUNT_DIR/py.counts" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
_, used, slots = struct.unpack_from("<QQQ", data, 0)
print(sum(struct.unpack_from("<Q", data, 64 * (i + 1))[0] for i in range(min(used, slots))))
PY
}
none=$(count 0) || exit 1
many=$(count 100000) || exit 1
[ "$((many - none))" -ge 100000 ] ||
  { echo "FAIL: 100,000 allocations counted as $((many - none)) ($many against $none)"; exit 1; }

rc=0
SIZES=64 DURATION=0.3 "$SRC/bench/alloc/run.sh" "$BUILD" "$WORK/out" >"$WORK/run.log" 2>&1 || rc=$?
[ "$rc" -eq 77 ] && { cat "$WORK/run.log"; exit 77; }
[ "$rc" -eq 0 ] || { cat "$WORK/run.log"; echo "FAIL: run.sh exited $rc"; exit 1; }
python3 - "$WORK/out/alloc.json" <<'PY' || { cat "$WORK/run.log"; exit 1; }
import json, sys
run = json.load(open(sys.argv[1]))
points = {(p["server"], p["proto"]): p for p in run["points"]}
problems = []
for server in ("caracal", "caracal_threads", "cpu"):
    for proto in ("udp", "tcp"):
        p = points.get((server, proto))
        if p is None:
            problems.append(f"no point for {server} {proto}")
        elif p["requests"] <= 0 or p["per_request"] is None:
            problems.append(f"{server} {proto}: no requests")
# The steady state of the default path (the engine in the I/O threads) over UDP allocates
# nothing per request: a heartbeat landing in the window (some fifty allocations) is allowed.
p = points.get(("caracal", "udp"))
if p is not None and p["per_request"] is not None and p["per_request"] > 0.05:
    problems.append(f"caracal over UDP allocated {p['per_request']:.3f} times per request")
if problems:
    sys.exit("FAIL: " + "; ".join(problems))
PY
grep -q '^| udp 64 B | ' "$WORK/out/table.md" || { cat "$WORK/out/table.md"; echo "FAIL: no table"; exit 1; }
echo "PASS"
