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
  # One build per archive, kept while the archive is the same: a version run again (an
  # interleaved round) is not built again.
  sum=$(sha256sum "$archive" | cut -c1-16)
  dir="$work/$(basename "$archive" .tar)"
  server="$dir/build/snic_server/snic_server"
  if [ "$(cat "$dir/archive.sha256" 2>/dev/null)" != "$sum" ] || [ ! -x "$server" ]; then
    rm -rf "$dir" && mkdir -p "$dir/src" && tar -xf "$archive" -C "$dir/src" || exit 2
    if ! { cmake -S "$dir/src" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCARACAL_BUILD_TESTS=OFF -DCARACAL_BUILD_BENCH=OFF >"$dir/cmake.log" 2>&1 &&
      cmake --build "$dir/build" --target snic_server >>"$dir/cmake.log" 2>&1; }; then
      echo "ab.sh: $name: the build failed (see $dir/cmake.log)" >&2
      tail -20 "$dir/cmake.log" >&2
      failed=$((failed + 1))
      continue
    fi
    echo "$sum" >"$dir/archive.sha256"
  fi
  echo "== $name ($archive)"
  CARACAL_COMMIT="$name ($(basename "$archive"))" SERVERS=caracal \
    SNIC="$server" \
    "$here/run.sh" "$build" "$results/$name" || failed=$((failed + 1))
done
exit "$failed"
