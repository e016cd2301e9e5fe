#!/usr/bin/env bash
# The control endpoint against wrong secrets and a guessing burst, with real clients:
#  1. With control.listen and metrics.listen left out, the server listens on loopback only
#     (127.0.0.1:7100 and :9100), and nothing of it on any other address.
#  2. The echo agent with a wrong secret is refused, counted, and exits non-zero.
#  3. A burst of wrong-secret hellos from 127.0.0.2 (tests/e2e/control_hello.py): the first
#     auth_failures are examined and refused, the rest refused unread as throttled; the counters
#     and the log say so, once. Meanwhile a hello with the secret from 127.0.0.3 is admitted, the
#     right secret from 127.0.0.2 waits out the penalty and is then admitted, and the data path
#     serves a checked load throughout.
#  4. Wrong secrets from the agent binary until its own address (127.0.0.1) is throttled; an echo
#     agent with the right secret from there is told to wait, waits, and registers.
source "$(dirname "$0")/lib.sh"
need python3 ss curl
HELLO="python3 $(dirname "$0")/control_hello.py"

# 1. Defaults: loopback only.
if ss -Hltn '( sport = :7100 or sport = :9100 )' | grep -q .; then
  echo "defaults: 7100 or 9100 is taken on this machine; that check is left out"
else
  cat >"$WORK/defaults.yaml" <<YAML
control: { secret: $SECRET }
metrics: {}
services:
  - name: echo
    max_message_bytes: 64
    listeners: [ { protocol: udp, listen: 127.0.0.1:0 } ]
YAML
  "$SERVER_BIN" --config "$WORK/defaults.yaml" >"$WORK/defaults.log" 2>&1 &
  DEFAULTS_PID=$!
  PIDS+=("$DEFAULTS_PID")
  wait_for_line "$WORK/defaults.log" "serving [0-9]+ service"
  grep -q "control endpoint on 127.0.0.1:7100 (port 7100)" "$WORK/defaults.log" ||
    fail "the default control endpoint is not 127.0.0.1:7100"
  # A few tries: once (under TSan, with the BlueField VMs starting beside it) the first scrape
  # failed within milliseconds of the server saying it listened. What came back is shown.
  scraped=""
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    scraped=$(curl -sS -f -m 5 http://127.0.0.1:9100/metrics 2>&1) &&
      grep -q '^caracal_agents ' <<<"$scraped" && break
    sleep 0.2
  done
  if ! grep -q '^caracal_agents ' <<<"$scraped"; then
    echo "$scraped" | head -5
    ss -Hltnp '( sport = :9100 )'
    fail "no metrics on the default 127.0.0.1:9100"
  fi
  ss -Hlntup | grep "pid=$DEFAULTS_PID," >"$WORK/defaults.ss" || true
  sed 's/^/listening: /' "$WORK/defaults.ss"
  [ "$(wc -l <"$WORK/defaults.ss")" -ge 3 ] || fail "ss shows fewer than 3 sockets of the server"
  if awk '{print $5}' "$WORK/defaults.ss" | grep -Ev '^(127\.[0-9.]+|\[::1\]):[0-9]+$'; then
    fail "the server listens on a non-loopback address with the default control and metrics"
  fi
  kill -TERM "$DEFAULTS_PID"
  wait "$DEFAULTS_PID" || fail "the server with the default addresses did not stop cleanly"
  echo "defaults: control and metrics on loopback only"
fi

# 2-4: five failed hellos from one address, then penalties of 1 s doubling to 4 s.
start_fault_server ", auth_failures: 5, auth_penalty_ms: 1000, auth_penalty_max_ms: 4000"
start_agent echo-1 "$ECHO_AGENT" "$SERVICE"
refusals() { metric "caracal_control_refusals_total\{reason=\"$1\"\}"; }

# A checked load on the data path across everything below: rounds of the pipeline client, each
# of which must see every reply right, until told to stop.
(
  round=0
  while [ ! -e "$WORK/stop-load" ]; do
    round=$((round + 1))
    "$BUILD/tests/e2e/caracal_pipeline_client" --connect "127.0.0.1:$PORT" --connections 4 \
      --requests "$(load 200)" --pipeline 4 --min-bytes 1 --max-bytes 200 --framing line \
      --seed "$round" --timeout-s 30 >>"$WORK/client.log" 2>&1 || exit 1
    sleep 0.05
  done
) &
LOAD_PID=$!
PIDS+=("$LOAD_PID")

# 2. The agent binary with a wrong secret.
cat >"$WORK/intruder.yaml" <<YAML
agent: intruder
server: 127.0.0.1:$CONTROL_PORT
secret: not-the-secret-0123456789
accelerator: cpu
services: [ { name: echo, queues: 1, ring_capacity: 64, slot_bytes: 128, max_message_bytes: 512 } ]
YAML
intrude() { timeout 20 "$ECHO_AGENT" --config "$WORK/intruder.yaml" >>"$WORK/intruder.log" 2>&1; }
if intrude; then fail "an agent with the wrong secret exited 0"; fi
grep -q "refused agent 'intruder': authentication failed: wrong secret" "$WORK/intruder.log" ||
  fail "the intruder was not told why"
[ "$(refusals wrong_secret)" -eq 1 ] || fail "the wrong secret was not counted"
echo "wrong secret: refused and counted"

# 3. A burst from 127.0.0.2.
$HELLO hello --port "$CONTROL_PORT" --source 127.0.0.2 --secret "guess-$SECRET" --count 20 >"$WORK/burst.out"
examined=$(grep -c '^refused .*wrong secret' "$WORK/burst.out" || true)
throttled=$(grep -c '^throttled ' "$WORK/burst.out" || true)
echo "burst of 20 from 127.0.0.2: $examined examined, $throttled throttled; first throttled: $(grep -m1 '^throttled' "$WORK/burst.out")"
[ "$examined" -eq 5 ] && [ "$throttled" -eq 15 ] || { cat "$WORK/burst.out"; fail "expected 5 examined and 15 throttled"; }
[ "$(refusals wrong_secret)" -eq 6 ] || fail "wrong_secret refusals: $(refusals wrong_secret), expected 6"
[ "$(metric caracal_control_throttled_total)" -eq 15 ] || fail "throttled_total is not 15"
[ "$(metric caracal_control_penalties_total)" -eq 1 ] || fail "penalties_total is not 1"
wait_for_line "$WORK/server.log" "5 failed hellos in a row from 127.0.0.2 \(the last: wrong_secret\); its connections are refused for 1000 ms"
[ "$(grep -c "refusing hellos from 127.0.0.2" "$WORK/server.log")" -eq 1 ] ||
  fail "the throttled refusals of one penalty were not logged exactly once"

# Another address is admitted meanwhile.
[ "$($HELLO hello --port "$CONTROL_PORT" --source 127.0.0.3 --secret "$SECRET" --agent other)" = welcome ] ||
  fail "a hello with the secret from 127.0.0.3 was not welcomed while 127.0.0.2 was throttled"
# The right secret from the throttled address: told to wait, then admitted.
read -r kind retry _ < <($HELLO hello --port "$CONTROL_PORT" --source 127.0.0.2 --secret "$SECRET" --agent patient)
[ "$kind" = throttled ] && [ "$retry" -gt 0 ] || fail "the right secret from 127.0.0.2 was not told to wait ($kind)"
sleep "$(awk "BEGIN {print $retry / 1000 + 0.05}")"
[ "$($HELLO hello --port "$CONTROL_PORT" --source 127.0.0.2 --secret "$SECRET" --agent patient --epoch 2)" = welcome ] ||
  fail "the right secret from 127.0.0.2 was not welcomed after the penalty"
echo "another address admitted meanwhile; the right secret from 127.0.0.2 admitted after ${retry} ms"

# 4. The agent binary's own address throttled: four more failures (one came in 2).
for _ in 1 2 3 4; do intrude && fail "an agent with the wrong secret exited 0"; done
wait_for_line "$WORK/server.log" "5 failed hellos in a row from 127.0.0.1"
cat >"$WORK/echo-2.yaml" <<YAML
agent: echo-2
server: 127.0.0.1:$CONTROL_PORT
secret: $SECRET
accelerator: $ACCELERATOR
$TRANSPORT_YAML
reconnect_interval_ms: 100
services:
$SERVICE
YAML
"$ECHO_AGENT" --config "$WORK/echo-2.yaml" >"$WORK/echo-2.log" 2>&1 &
PIDS+=("$!")
wait_for_line "$WORK/echo-2.log" "refused agent 'echo-2' for now: throttled: .*; trying again in [0-9]+ ms" 5
wait_for_line "$WORK/echo-2.log" "serving 1 service" 10
echo "agent echo-2 from a throttled address: $(grep -m1 -o 'trying again in [0-9]* ms' "$WORK/echo-2.log"), then registered"

# The data path served throughout, every reply checked.
touch "$WORK/stop-load"
wait "$LOAD_PID" || { tail "$WORK/client.log"; fail "the load saw a wrong or missing reply"; }
rounds=$(grep -c "errors=" "$WORK/client.log")
failed=$(grep "errors=" "$WORK/client.log" | grep -vc "errors=0" || true)
echo "data path meanwhile: $rounds rounds of the pipeline client, $(metric caracal_service_replies_total) replies, $failed rounds with errors"
[ "$rounds" -ge 5 ] || fail "only $rounds load rounds ran across the test"
[ "$failed" -eq 0 ] || fail "requests failed during the burst"
grep -E '^caracal_control_(refusals_total\{reason="(wrong_secret|malformed|not_hello)"|throttled|penalties|tracked)' \
  <(curl -sf "http://127.0.0.1:$METRICS_PORT/metrics") | sed 's/^/metric: /'
echo "PASS"
