#!/usr/bin/env bash
# bench/front/udp_spread.py, briefly (4 I/O threads, one client flow, two trials): one flow must
# reach one socket with spread: flows and all four with spread: datagrams, every datagram
# answered. Measures nothing.
set -euo pipefail
BUILD=$(realpath "${1:?build directory}")
SRC=$(realpath "${2:?source directory}")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
rc=0
IO_THREADS=4 FLOWS=1 TRIALS=2 python3 "$SRC/bench/front/udp_spread.py" "$BUILD" "$WORK/out" \
  >"$WORK/run.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { cat "$WORK/run.log"; echo "FAIL: udp_spread.py exited $rc"; exit 1; }
report="$WORK/out/udp-spread.md"
# io_threads 4, 1 flow: 3 idle sockets with flows, none with datagrams (200 datagrams over 4
# sockets leave one out with a chance of about 10^-25); the busiest socket takes all with flows.
grep -Eq '^\| 4 \| 1 \| 3(\.0)? \(3\) \| 0(\.0)? \(0\) \| 4\.0 \(4\.0\) \| [0-9.]+ \([0-9.]+\) \|$' "$report" ||
  { cat "$report"; echo "FAIL: the row of 4 I/O threads and one flow"; exit 1; }
grep -q "Replies that did not come: 0." "$report" || { cat "$report"; echo "FAIL: replies lost"; exit 1; }
echo "PASS"
