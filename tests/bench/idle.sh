#!/usr/bin/env bash
# bench/idle/run.sh, briefly (one round of each policy, a second each): the report must hold
# both policies with their idle cores and every sockperf message answered. Measures nothing.
set -euo pipefail
BUILD=$(realpath "${1:?build directory}")
SRC=$(realpath "${2:?source directory}")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
rc=0
ROUNDS=1 IDLE_S=1 DURATION=1 SPARSE_MPS=100 "$SRC/bench/idle/run.sh" "$BUILD" "$WORK/out" \
  >"$WORK/run.log" 2>&1 || rc=$?
[ "$rc" -eq 77 ] && { cat "$WORK/run.log"; exit 77; }
[ "$rc" -eq 0 ] || { cat "$WORK/run.log"; echo "FAIL: run.sh exited $rc"; exit 1; }
report="$WORK/out/README.md"
for policy in spin backoff; do
  grep -Eq "^\| $policy \| [0-9]+\.[0-9]{3} \| [0-9]+\.[0-9]{3} \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|" "$report" ||
    { cat "$report"; echo "FAIL: no summary row for $policy"; exit 1; }
  # Every message each sockperf run sent was answered.
  row=$(grep -E "^\| $policy \| 1 \|" "$report")
  for pair in $(echo "$row" | grep -oE '[0-9]+/[0-9]+'); do
    [ "${pair%/*}" = "${pair#*/}" ] && [ "${pair%/*}" -gt 0 ] ||
      { cat "$report"; echo "FAIL: $policy answered $pair"; exit 1; }
  done
done
echo "PASS"
