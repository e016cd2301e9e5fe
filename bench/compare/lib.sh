# Shared by bench/compare's scripts (sourced).

# wait_for_line FILE REGEX SECONDS: 0 once FILE has a line matching REGEX; otherwise, after
# SECONDS, says so with the file's tail and returns 1.
wait_for_line() {
  for _ in $(seq $(($3 * 20))); do
    grep -Eq "$2" "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "$(basename "$0"): $(basename "$1") never showed /$2/ within $3 s:" >&2
  tail -20 "$1" >&2
  return 1
}
