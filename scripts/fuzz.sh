#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang, ASan and UBSan in build-fuzz/, and fuzzes
# each for a bounded time, one process each, one after the other.
#
#   scripts/fuzz.sh                   # every target for 10 s (what CI runs)
#   scripts/fuzz.sh 300               # every target for 300 s: a campaign
#   scripts/fuzz.sh 60 tx_ring line   # only the targets whose names contain these words
#
# A campaign on a machine of many cores: FUZZ_FORK=N runs each target in libFuzzer's fork mode
# with N processes, FUZZ_PARALLEL=M runs M targets at once. FUZZ_BUILD names the build
# (build-fuzz); FUZZ_NO_BUILD=1 uses the fuzzers already there, built elsewhere (a machine
# without clang: carry the build's tests/fuzz/ and the shared libraries they need, named by
# LD_LIBRARY_PATH).
#
# Each target starts from its seeds and regressions (tests/fuzz/corpus/<target>,
# tests/fuzz/regressions/<target>) and keeps the inputs it finds in build-fuzz/fuzz-corpus/<target>
# (the tree's folders are only read), so a later run goes on from there. An input that crashes a
# target is left in build-fuzz/fuzz-crashes/<target>/, its log in build-fuzz/fuzz-logs/. Prints a
# line per target (executions, executions per second, coverage, corpus) and exits 1 if any
# target crashed, after running them all.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-10}
shift || true
case $seconds in
  '' | *[!0-9]*) echo "fuzz.sh: the first argument is seconds per target (got '$seconds')" >&2; exit 2 ;;
esac
filters=("$@")

build=${FUZZ_BUILD:-build-fuzz}
fork=${FUZZ_FORK:-0}
parallel=${FUZZ_PARALLEL:-1}
if [ "${FUZZ_NO_BUILD:-0}" != 1 ]; then
  scripts/deps.sh test

  # Every library is instrumented (the fuzzers see the code they drive) and built for that: -O1 and
  # line tables, what libFuzzer's documentation advises and what stack traces need. The optional
  # parts the targets do not drive stay out; DPDK stays AUTO for its frame parser. Without the
  # tests, the targets link slices of the libraries: only the sources they link are compiled
  # (tests/fuzz/CMakeLists.txt, caracal_fuzz_slice).
  cmake -S . -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" -DCARACAL_BUILD_FUZZERS=ON -DCARACAL_SANITIZE= \
    -DCARACAL_BUILD_TESTS=OFF -DCARACAL_BUILD_BENCH=OFF -DCARACAL_WITH_CUDA=OFF \
    -DCARACAL_WITH_RDMA=OFF -DCARACAL_WITH_SYSTEMD=OFF -DCARACAL_ENGINE_PROFILE=OFF >/dev/null
  cmake --build "$build" -j2 --target caracal_fuzzers
fi

targets=()
while read -r t; do
  [ -n "$t" ] || continue
  if [ ${#filters[@]} -gt 0 ]; then
    keep=0
    for f in "${filters[@]}"; do
      case $t in *"$f"*) keep=1 ;; esac
    done
    [ $keep = 1 ] || continue
  fi
  targets+=("$t")
done <"$build/tests/fuzz/fuzzers.txt"
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz.sh: no target matches '${filters[*]}' (targets: $(tr '\n' ' ' <"$build/tests/fuzz/fuzzers.txt"))" >&2
  exit 2
fi

# fuzz_one TARGET: one target for $seconds; its summary line goes to $build/fuzz-logs/TARGET.line.
fuzz_one() {
  local t=$1 work="$build/fuzz-corpus/$1" crashes="$build/fuzz-crashes/$1"
  local log="$build/fuzz-logs/$1.log" rc=0
  local inputs=("$work" "tests/fuzz/corpus/$t") mode=()
  [ -d "tests/fuzz/regressions/$t" ] && inputs+=("tests/fuzz/regressions/$t")
  [ "$fork" -gt 0 ] && mode=(-fork="$fork")
  # -timeout: an input that runs this long is a finding (a hang); -rss_limit_mb: so is one that
  # makes the process this large.
  "$build/tests/fuzz/caracal_fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    "${mode[@]}" -print_final_stats=1 -artifact_prefix="$crashes/" "${inputs[@]}" >"$log" 2>&1 ||
    rc=$?
  local runs speed last cov ft corp result=ok
  # The last status line: "#RUNS ... cov: C ft: F corp: N/..." (fork mode: "#RUNS: cov: ...",
  # its runs those of every process, and no final stats).
  last=$(grep -E '^#[0-9]+' "$log" | grep 'cov:' | tail -n1 || true)
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  [ -n "$runs" ] || runs=$(sed -n 's/^#\([0-9]*\).*/\1/p' <<<"$last")
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  [ -n "$speed" ] || [ -z "$runs" ] || speed=$((runs / (seconds > 0 ? seconds : 1)))
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([^ ]*\).*/\1/p' <<<"$last")
  [ $rc -eq 0 ] || result="CRASH (exit $rc): $log, input in $crashes/"
  printf '%-24s %12s %8s %6s %7s %14s  %s\n' "$t" "${runs:-?}" "${speed:-?}" "${cov:-?}" \
    "${ft:-?}" "${corp:-?}" "$result" >"$build/fuzz-logs/$t.line"
  return $rc
}

failed=()
printf '%-24s %12s %8s %6s %7s %14s  %s\n' target executions exec/s cov ft corpus result
for t in "${targets[@]}"; do
  mkdir -p "$build/fuzz-corpus/$t" "$build/fuzz-crashes/$t" "$build/fuzz-logs"
done
declare -A pid_of=()
for ((i = 0; i < ${#targets[@]}; i += parallel)); do
  for t in "${targets[@]:i:parallel}"; do
    fuzz_one "$t" &
    pid_of[$t]=$!
  done
  for t in "${targets[@]:i:parallel}"; do
    wait "${pid_of[$t]}" || failed+=("$t")
    cat "$build/fuzz-logs/$t.line"
  done
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: ${#failed[@]} target(s) crashed: ${failed[*]}" >&2
  grep -h -m3 -E 'ERROR: |fuzz check failed|runtime error' "$build"/fuzz-logs/*.log >&2 || true
  exit 1
fi
