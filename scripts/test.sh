#!/usr/bin/env bash
# Installs dependencies, builds and runs the tests.
#
#   scripts/test.sh                        # everything, Release build in build/
#   scripts/test.sh --sanitize thread      # TSan build in build-thread/
#   scripts/test.sh --sanitize address     # ASan+UBSan build in build-address/
#   scripts/test.sh -L 'mqueue|accel'      # only these CTest labels, and only what they run is built
#   scripts/test.sh --skip-labels dpdk     # everything but these labels
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=""
labels=""
skip_labels=""
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) sanitize="$2"; shift 2 ;;
    -L) labels="$2"; shift 2 ;;
    --skip-labels) skip_labels="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

scripts/deps.sh test

jobs=$(nproc)
# Every option this command relies on is set here, whatever an earlier configure of the same
# build folder left in its cache (scripts/run.sh configures build/ without the tests).
cmake_args=(-DCARACAL_BUILD_TESTS=ON)
if [ -n "$sanitize" ]; then
  build="build-$sanitize"
  # A folder of its own: Ninja, unless an earlier run made it with another generator.
  if ! [ -f "$build/CMakeCache.txt" ] || grep -qx 'CMAKE_GENERATOR:INTERNAL=Ninja' "$build/CMakeCache.txt"; then
    cmake_args+=(-G Ninja)
  fi
  cmake_args+=(-DCMAKE_BUILD_TYPE=RelWithDebInfo)
  # Sanitizer builds cover host code; the CUDA object and the benchmarks add nothing there.
  # They are built to run the tests, not to be fast: -Og and line tables only (what sanitizer
  # reports print) compile much faster than -O2 -g, and the TSan suite runs no slower.
  cmake_args+=(-DCARACAL_SANITIZE="$sanitize" -DCARACAL_WITH_CUDA=OFF -DCARACAL_BUILD_BENCH=OFF
               "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-Og -g1 -DNDEBUG")
  # The engine's stage profile is for benchmarks; the ASan+UBSan build compiles and runs it so
  # that code is checked too (it only adds timers and a report at exit).
  case $sanitize in
    *address*) cmake_args+=(-DCARACAL_ENGINE_PROFILE=ON) ;;
    *) cmake_args+=(-DCARACAL_ENGINE_PROFILE=OFF) ;;
  esac
else
  # build/ is scripts/run.sh's folder too, at the same build type and with the same generator
  # (CMake's default, Unix Makefiles, or CMAKE_GENERATOR; a build/ made earlier keeps its own).
  # So CI's one build/ also shows that the default generator builds everything, tests and
  # benchmarks included, and one command after the other rebuilds little: after run.sh, what
  # run.sh built is compiled again with warnings as errors (unless run.sh had CARACAL_WERROR=ON,
  # as in CI); run.sh after this rebuilds nothing.
  build="build"
  # Warnings are errors in this build, the one every test run makes: a new warning fails it.
  cmake_args+=(-DCMAKE_BUILD_TYPE=Release -DCARACAL_BUILD_BENCH=ON -DCARACAL_SANITIZE=
               -DCARACAL_ENGINE_PROFILE=OFF -DCARACAL_WERROR=ON)
fi

build_args=()
# A run that finds no test fails: a test command that tests nothing must not pass.
ctest_args=(--test-dir "$build" --output-on-failure -j "$jobs" --timeout 600 --no-tests=error)
if [ -n "$sanitize" ]; then
  # The rdma tests run in an emulated VM (tests/vm/rxe-vm.sh): sanitized, they would take far
  # too long there, and the VM's kernel, not this build, is what they exercise.
  skip_labels="rdma${skip_labels:+|$skip_labels}"
fi
if [ -n "$labels" ]; then
  # Each label has a target that builds what its tests run (tests/CMakeLists.txt). Labels are
  # then matched whole, so that no test runs whose programs were not built.
  IFS='|' read -ra names <<<"$labels"
  for name in "${names[@]}"; do
    build_args+=(--target "caracal_tests_$name")
  done
  ctest_args+=(-L "^($labels)\$")
fi
if [ -n "$skip_labels" ]; then
  # One -LE (ctest keeps only the last one given).
  ctest_args+=(-LE "^($skip_labels)\$")
fi

cmake -S . -B "$build" "${cmake_args[@]}"
cmake --build "$build" -j "$jobs" "${build_args[@]}"
ctest "${ctest_args[@]}"
