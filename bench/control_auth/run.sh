#!/usr/bin/env bash
# Wrong-secret hellos from one address against the control endpoint, with and without the
# per-address throttle: how many a second reach the secret comparison (the guesses an attacker
# gets), how many are refused unread, and what a hello with the right secret from another
# address waits meanwhile.
#
#   bench/control_auth/run.sh BUILD_DIR [RESULTS_DIR]   (default bench/results/control-auth)
#
# Environment: ROUNDS (5) per mode, SECONDS_PER_ROUND (10), WORKERS (2: connections the
# flooding client keeps going at once, all from 127.0.0.2), LABEL (a name for this run).
#
# Modes: `off` is `auth_failures: 0` (no throttling: every hello is examined); `on` is the
# defaults (5 failures, then 1 s doubling to 60 s). Each round starts a fresh snic_server (no
# agent: the hellos are what is measured), floods it with tests/e2e/control_hello.py for
# SECONDS_PER_ROUND, times one right-secret hello from 127.0.0.3 half-way through, and reads the
# counters: caracal_control_refusals_total{reason="wrong_secret"} (compared and refused) and
# caracal_control_throttled_total (refused unread). Writes RESULTS_DIR/README.md with the median
# and the spread (min-max) over the rounds, and the raw rounds in RESULTS_DIR/rounds.tsv.
BUILD=$(realpath "${1:?usage: run.sh BUILD_DIR [RESULTS_DIR]}")
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${2:-$SRC/bench/results/control-auth}
set -- "$BUILD" "$SRC"
source "$SRC/bench/lib/bench.sh"
source "$SRC/tests/e2e/lib.sh"
ROUNDS=${ROUNDS:-5}
SECONDS_PER_ROUND=${SECONDS_PER_ROUND:-10}
WORKERS=${WORKERS:-2}
LABEL=${LABEL:-this tree}
HELLO="$SRC/tests/e2e/control_hello.py"
need python3 curl
need_built "$SERVER_BIN"
mkdir -p "$OUT"

# round MODE INDEX: one server, one flood; appends a line to rounds.tsv.
round() {
  local mode=$1 i=$2 auth=""
  [ "$mode" = off ] && auth=", auth_failures: 0"
  start_server "io_threads: 2
control: { listen: 127.0.0.1:0, secret: $SECRET$auth }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: echo
    max_message_bytes: 64
    listeners: [ { protocol: udp, listen: 127.0.0.1:0 } ]"
  local port=$CONTROL_PORT
  python3 "$HELLO" flood --port "$port" --source 127.0.0.2 --secret "wrong-$SECRET" \
    --seconds "$SECONDS_PER_ROUND" --workers "$WORKERS" >"$WORK/flood.out" &
  local flood=$!
  sleep "$(awk "BEGIN {print $SECONDS_PER_ROUND / 2}")"
  local other
  other=$(python3 "$HELLO" hello --port "$port" --source 127.0.0.3 --secret "$SECRET" --agent other --time)
  wait "$flood"
  local compared throttled attempts took
  compared=$(metric 'caracal_control_refusals_total\{reason="wrong_secret"\}')
  throttled=$(metric caracal_control_throttled_total)
  attempts=$(sed -nE 's/^attempts=([0-9]+).*/\1/p' "$WORK/flood.out")
  took=$(sed -nE 's/.* seconds=([0-9.]+).*/\1/p' "$WORK/flood.out")
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID" || true
  # shellcheck disable=SC2034 # what lib.sh's cleanup stops
  PIDS=()
  [ "${other%% *}" = welcome ] || { echo "round $mode $i: the right secret from 127.0.0.3 got '$other'"; exit 1; }
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$i" "$took" "$attempts" "$compared" "$throttled" \
    "$(echo "$other" | awk '{print $2}')" >>"$OUT/rounds.tsv"
  echo "$mode round $i: ${took} s, attempts $attempts, compared $compared, throttled $throttled, other address's hello $other"
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
printf 'mode\tround\tseconds\tattempts\tcompared\tthrottled\tother_hello_ms\n' >"$OUT/rounds.tsv"
for i in $(seq "$ROUNDS"); do
  round off "$i"
  round on "$i"
done

# median and min-max of column COL (per second when PER_S) for MODE
stat() {
  awk -F'\t' -v mode="$1" -v col="$2" -v per_s="$3" '
    $1 == mode { v[n++] = per_s ? $col / $3 : $col }
    END {
      for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
      med = n % 2 ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2
      printf "%.1f (%.1f-%.1f)", med, v[0], v[n - 1]
    }' "$OUT/rounds.tsv"
}
{
  echo "# Wrong secrets against the control endpoint, one address"
  echo
  echo "\`bench/control_auth/run.sh\` ($LABEL), $(date -u +%Y-%m-%d), $(nproc) cores ($(cpu_model)), $ROUNDS rounds"
  echo "of ${SECONDS_PER_ROUND} s per mode, $WORKERS connections at a time from 127.0.0.2; median (min-max)."
  echo "Load average before and after: $LOAD_BEFORE; $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine counts)."
  echo
  echo "| mode | hellos sent /s | reached the secret comparison /s | refused unread (throttled) /s | a right-secret hello from 127.0.0.3 meanwhile, ms |"
  echo "| --- | --- | --- | --- | --- |"
  for mode in off on; do
    name=$mode
    [ "$mode" = off ] && name="off (\`auth_failures: 0\`)"
    [ "$mode" = on ] && name="on (defaults: 5, then 1 s doubling to 60 s)"
    echo "| $name | $(stat "$mode" 4 1) | $(stat "$mode" 5 1) | $(stat "$mode" 6 1) | $(stat "$mode" 7 0) |"
  done
  echo
  echo "Per round, compared in total (on): $(awk -F'\t' '$1 == "on" {printf "%s%s", sep, $5; sep = ", "}' "$OUT/rounds.tsv")."
  echo "Raw rounds: [rounds.tsv](rounds.tsv)."
} >"$OUT/README.md"
cat "$OUT/README.md"
