#!/usr/bin/env bash
# The cheap gates, which need no build: the C, C++ and CUDA sources as clang-format writes them,
# and the shell scripts clean under shellcheck at warning level. Every finding names its file
# and line; each gate that passes says so in one line. Exits 1 when a gate fails, 2 on a usage
# error or a missing tool. Installs nothing: scripts/deps.sh test installs the tools.
#
#   scripts/lint.sh                    # clang-format and shellcheck
#   scripts/lint.sh --tidy BUILD_DIR   # and clang-tidy, on BUILD_DIR's compile_commands.json
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; }
tidy_build=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tidy)
      [ $# -ge 2 ] || { echo "lint.sh: --tidy needs a build directory" >&2; exit 2; }
      tidy_build=$2
      shift 2
      ;;
    -h | --help) usage; exit 0 ;;
    *) echo "lint.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

for tool in clang-format shellcheck; do
  command -v "$tool" >/dev/null ||
    { echo "lint.sh: $tool is not installed (scripts/deps.sh test installs it)" >&2; exit 2; }
done

# cxx_sources: every tracked C, C++ and CUDA file, NUL-separated.
cxx_sources() {
  git ls-files -z -- '*.cpp' '*.hpp' '*.h' '*.cu' '*.cuh'
}

# shell_scripts: every tracked shell script, NUL-separated: the *.sh files, and the others whose
# first line is a #! for sh or bash (.ci/run, deploy/debian's maintainer scripts; these are
# templates, but their @VAR@ placeholders stand where a command does, so they parse as sh).
shell_scripts() {
  local f first
  while IFS= read -r -d '' f; do
    [ -f "$f" ] || continue
    if [[ $f == *.sh ]]; then
      printf '%s\0' "$f"
      continue
    fi
    first=""
    IFS= read -r first <"$f" 2>/dev/null || true
    if [[ $first =~ ^#![[:space:]]*(/usr)?/bin/(env[[:space:]]+)?(sh|bash)([[:space:]]|$) ]]; then
      printf '%s\0' "$f"
    fi
  done < <(git ls-files -z)
}

# count LIST_FUNCTION: how many files it lists.
count() {
  "$1" | tr -cd '\0' | wc -c
}

failed=0

# The format gate: clang-format names file:line:col of each place unlike .clang-format's style.
if cxx_sources | xargs -0 -r clang-format --dry-run -Werror; then
  echo "lint: clang-format passed ($(count cxx_sources) files)"
else
  echo "lint: clang-format FAILED (run clang-format -i on the files above)"
  failed=1
fi

# The shell gate: one file:line:col line per finding of shellcheck.
if shell_scripts | xargs -0 -r shellcheck -S warning -f gcc; then
  echo "lint: shellcheck passed ($(count shell_scripts) scripts)"
else
  echo "lint: shellcheck FAILED"
  failed=1
fi

# ---- clang-tidy: to be filled in ------------------------------------------------------------
# tidy BUILD_DIR: the clang-tidy gate over BUILD_DIR's compilation database. For now it only
# checks that the database is there; clang-tidy itself is not run yet.
tidy() {
  local build=$1
  if [ ! -f "$build/compile_commands.json" ]; then
    echo "lint: tidy FAILED: $build/compile_commands.json does not exist (configure BUILD_DIR with cmake first)"
    return 1
  fi
  echo "lint: tidy passed ($build/compile_commands.json found; clang-tidy is not run yet)"
}
if [ -n "$tidy_build" ]; then
  tidy "$tidy_build" || failed=1
fi

exit "$failed"
