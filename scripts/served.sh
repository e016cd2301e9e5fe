#!/usr/bin/env bash
# What the server did with a client's load: reads snic_server's /metrics before and after a
# command and prints, over the command's run, the requests the listeners received, the answers
# the handlers gave (errors among them) and the requests dropped, by reason. A load client's
# own figure is what it sent; sockperf's throughput mode, for one, reports its send rate and
# reads no replies.
#
#   scripts/served.sh [--metrics HOST:PORT] -- COMMAND [ARG...]
#   scripts/served.sh -- sockperf throughput -i 127.0.0.1 -p 7000 -m 64 -t 5
#
# --metrics is the server's metrics.listen (default 127.0.0.1:9100, as configs/echo-server.yaml).
set -euo pipefail
metrics=127.0.0.1:9100
while [ $# -gt 0 ]; do
  case "$1" in
    --metrics) metrics=$2; shift 2 ;;
    --) shift; break ;;
    -h | --help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "served.sh: no command to run (see --help)" >&2; exit 2; }

scrape() {
  curl -fsS -m 5 "http://$metrics/metrics" ||
    { echo "served.sh: cannot read http://$metrics/metrics (is snic_server running?)" >&2; exit 1; }
}
before=$(scrape)
t0=$(date +%s.%N)
rc=0
"$@" || rc=$?
t1=$(date +%s.%N)
after=$(scrape)

# The counters' increase over the run (rates are left to the reader: the command's run includes
# its own start and warm-up, and its measured window is what to divide by): the listeners' requests, the handlers' answers and errors,
# and the drops of listeners and services summed by reason.
awk -v secs="$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" '
  function reason(line) { return match(line, /reason="[^"]*"/) ? substr(line, RSTART + 8, RLENGTH - 9) : "" }
  function add(line, sign,   name, v) {
    if (line ~ /^#/ || line == "") return
    v = $NF * sign
    name = line; sub(/[{ ].*/, "", name)
    if (name == "caracal_listener_requests_total") received += v
    else if (name == "caracal_service_replies_total") answered += v
    else if (name == "caracal_service_errors_total") errors += v
    else if (name == "caracal_listener_drops_total" || name == "caracal_service_drops_total") {
      dropped += v; by[reason(line)] += v
    }
  }
  FNR == NR { add($0, -1); next }
  { add($0, 1) }
  END {
    printf "snic_server, over the %.1f s the command ran:\n", secs
    printf "  received %12d requests\n", received
    printf "  answered %12d", answered
    if (received > 0) printf " (%.1f%% of those received)", 100 * answered / received
    printf ", %d of them errors\n", errors
    printf "  dropped  %12d", dropped
    if (received > 0) printf " (%.1f%%)", 100 * dropped / received
    sep = ": "
    for (r in by) if (by[r] > 0) { printf "%s%s %d", sep, r, by[r]; sep = ", " }
    printf "\n"
  }' <(printf '%s\n' "$before") <(printf '%s\n' "$after")
exit $rc
