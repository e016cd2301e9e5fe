#!/usr/bin/env bash
# The cheap gates: the C, C++ and CUDA sources as clang-format writes them, the shell scripts
# clean under shellcheck at warning level, and (given a configured build folder) the product's
# sources clean under clang-tidy's checks in .clang-tidy. Every finding names its file and line;
# each gate that passes says so in one line. Exits 1 when a gate fails, 2 on a usage error or a
# missing tool. Installs nothing: scripts/deps.sh test installs the tools.
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

# The shell gate: one file:line:col line per finding of shellcheck, a batch of scripts per core
# (each file is checked on its own either way: no script is followed into another).
if shell_scripts | xargs -0 -r -n 8 -P "$(nproc)" shellcheck -S warning -f gcc; then
  echo "lint: shellcheck passed ($(count shell_scripts) scripts)"
else
  echo "lint: shellcheck FAILED"
  failed=1
fi

# The tidy gate: clang-tidy with the root's .clang-tidy (bugprone and performance checks, every
# finding an error) on the product's C++ sources that BUILD_DIR compiles for the host (mqueue,
# accel_lib, host_init, snic_server, examples; not tests or benchmarks), one per core. The build's
# precompiled headers are GCC's, which clang cannot read, and some of its warning options are
# GCC's alone: clang-tidy gets a copy of the compilation database without them.
tidy() {
  local build=$1 db
  if [ ! -f "$build/compile_commands.json" ]; then
    echo "lint: tidy FAILED: $build/compile_commands.json does not exist (configure BUILD_DIR with cmake first)"
    return 1
  fi
  command -v clang-tidy >/dev/null ||
    { echo "lint.sh: clang-tidy is not installed (scripts/deps.sh test installs it)" >&2; exit 2; }
  db=$(mktemp -d)
  # shellcheck disable=SC2064 # expanded now: the folder of this call
  trap "rm -rf '$db'" RETURN
  python3 - "$build/compile_commands.json" "$db" <<'PY'
import json, os, shlex, subprocess, sys
entries = json.load(open(sys.argv[1]))
out, files = [], []
ours = set(subprocess.run(
    ["git", "ls-files", "mqueue/*.cpp", "accel_lib/*.cpp", "host_init/*.cpp",
     "snic_server/*.cpp", "examples/*.cpp"], capture_output=True, text=True,
    check=True).stdout.split())
for e in entries:
    args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
    if os.path.basename(args[0]) == "nvcc":
        continue  # a handler compiled for the device: clang-tidy reads host C++ only
    kept, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
        elif a == "-include" and i + 1 < len(args) and args[i + 1].endswith("cmake_pch.hxx"):
            skip = True
        elif a != "-Winvalid-pch" and not a.startswith(("-Werror", "-Wno-error=")):
            kept.append(a)  # GCC's warning options are left to GCC: clang knows not all
    out.append({"directory": e["directory"], "file": e["file"], "arguments": kept})
    rel = os.path.relpath(os.path.join(e["directory"], e["file"]))
    if rel in ours:
        files.append(rel)
json.dump(out, open(os.path.join(sys.argv[2], "compile_commands.json"), "w"))
open(os.path.join(sys.argv[2], "files"), "w").write("".join(f + "\0" for f in sorted(set(files))))
PY
  local n
  n=$(tr -cd '\0' <"$db/files" | wc -c)
  # clang-tidy counts the warnings it suppressed (system headers) on stderr: left out.
  local rc=0
  xargs -0 -r -n 1 -P "$(nproc)" clang-tidy -p "$db" --quiet <"$db/files" >"$db/out" 2>&1 || rc=$?
  grep -vE '^[0-9]+ warnings? generated\.$' "$db/out" || true
  if [ "$rc" -eq 0 ]; then
    echo "lint: clang-tidy passed ($n files)"
  else
    echo "lint: clang-tidy FAILED (the findings above; .clang-tidy lists the checks)"
    return 1
  fi
}
if [ -n "$tidy_build" ]; then
  tidy "$tidy_build" || failed=1
fi

exit "$failed"
