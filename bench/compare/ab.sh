#!/usr/bin/env bash
# Side by side of snic_server versions in one session: builds snic_server from each source
# archive (git archive --format=tar REV > NAME.tar) and runs bench/compare/run.sh on Caracal
# alone with that server, the agents and clients coming from BUILD_DIR. Each version's results
# go to RESULTS_DIR/NAME; the run of BUILD_DIR's own server (and the baselines) is a plain
# run.sh call.
#   bench/compare/ab.sh BUILD_DIR RESULTS_DIR NAME=ARCHIVE.tar...
# run.sh's knobs (DURATION, SIZES, ...) pass through the environment.
set -uo pipefail
build=$(realpath "${1:?usage: ab.sh BUILD_DIR RESULTS_DIR NAME=ARCHIVE.tar...}")
results=${2:?usage: ab.sh BUILD_DIR RESULTS_DIR NAME=ARCHIVE.tar...}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
work=${AB_WORK:-$build/ab}
failed=0
for spec in "$@"; do
  name=${spec%%=*}
  archive=$(realpath "${spec#*=}")
  src="$work/$name/src"
  rm -rf "$src" && mkdir -p "$src" && tar -xf "$archive" -C "$src" || exit 2
  if ! { cmake -S "$src" -B "$work/$name/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCARACAL_BUILD_TESTS=OFF -DCARACAL_BUILD_BENCH=OFF >"$work/$name/cmake.log" 2>&1 &&
    cmake --build "$work/$name/build" --target snic_server >>"$work/$name/cmake.log" 2>&1; }; then
    echo "ab.sh: $name: the build failed (see $work/$name/cmake.log)" >&2
    tail -20 "$work/$name/cmake.log" >&2
    failed=$((failed + 1))
    continue
  fi
  echo "== $name ($archive)"
  CARACAL_COMMIT="$name ($(basename "$archive"))" SERVERS=caracal \
    SNIC="$work/$name/build/server/snic_server" \
    "$here/run.sh" "$build" "$results/$name" || failed=$((failed + 1))
done
exit "$failed"
