#!/usr/bin/env bash
# A fault that fails many requests at once does not flood the log: with no agent behind a
# length-prefixed listener that has no error_reply, each of 400 connections is closed with a
# warning. The server writes the first few of them in each second and then one line that counts
# the rest, while /metrics counts every one of them.
source "$(dirname "$0")/lib.sh"
need curl
CLIENT="$BUILD/tests/e2e/caracal_pipeline_client"
CONNECTIONS=400

start_server "io_threads: 2
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: echo
    max_message_bytes: 512
    listeners:
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: length_prefixed, prefix_bytes: 4 } }"
PORT=$(port_of "tcp/127.0.0.1:0")

# Every request fails (no agent serves echo), so every connection is closed: the client reports
# them as failures, which is what this test wants.
timeout 120 "$CLIENT" --connect "127.0.0.1:$PORT" --connections $CONNECTIONS --requests 1 \
  --pipeline 1 --max-bytes 100 --framing length_prefixed --seed 3 --timeout-s 60 \
  >"$WORK/client.log" 2>&1 || true

dropped=$(metric 'caracal_listener_drops_total\{.*reason="request_failed"')
[ "$dropped" -eq $CONNECTIONS ] || fail "/metrics counts $dropped failed requests, not $CONNECTIONS"
# Every closed connection is in a warning line of its own or counted in a summary; the
# periodic flush writes a window's summary within about a second of the window's end.
counts() {
  single=$(grep "closing the connection from" "$WORK/server.log" | grep -vc "more like this" || true)
  summarised=$(sed -nE 's/.* ([0-9]+) more like this in the last [0-9.]+ s; the last: .*closing the connection.*/\1/p' \
    "$WORK/server.log" | awk '{s += $1} END {print s + 0}')
}
for _ in $(seq 100); do
  counts
  [ $((single + summarised)) -ge $CONNECTIONS ] && break
  sleep 0.1
done
echo "$CONNECTIONS connections closed: $single warning lines, $summarised more in summaries"
[ $((single + summarised)) -eq $CONNECTIONS ] ||
  fail "$single warning lines and $summarised summarised do not add up to $CONNECTIONS"
# At most 5 lines a second from one place, over a fault of a few seconds.
[ "$single" -le 50 ] || fail "$single warning lines for $CONNECTIONS closed connections"
[ "$summarised" -gt 0 ] || fail "nothing was summarised"
echo "PASS"
