#!/usr/bin/env bash
# Bad input gets a clear error and costs nothing else: a bad config line, an agent with the
# wrong secret, an oversize or malformed TCP message (that connection closes with the reason
# logged; another connection keeps working; an oversize line with error_reply is skipped and
# answered instead), an oversize UDP datagram (dropped, counted).
source "$(dirname "$0")/lib.sh"
need nc curl

# A bad config: non-zero exit and the file, line and key in the message.
cat >"$WORK/bad.yaml" <<YAML
control: { listen: 127.0.0.1:0, secret: $SECRET }
services:
  - name: echo
    max_message_bytes: 1024
    dispatch: fastest
    listeners: [ { protocol: udp, listen: 127.0.0.1:0 } ]
YAML
if "$SERVER_BIN" --config "$WORK/bad.yaml" >"$WORK/bad.out" 2>&1; then fail "a bad config was accepted"; fi
grep -Eq "bad.yaml:5:[0-9]+: services\[0\]\.dispatch: 'fastest' is not one of" "$WORK/bad.out" ||
  { cat "$WORK/bad.out"; fail "the config error does not name bad.yaml:5 and services[0].dispatch"; }
echo "bad config: $(cat "$WORK/bad.out")"
if "$SERVER_BIN" --config "$WORK/bad.yaml" --check-config >/dev/null 2>&1; then fail "--check-config accepted a bad config"; fi

start_server "io_threads: 2
control: { listen: 127.0.0.1:0, secret: $SECRET, heartbeat_interval_ms: 50, agent_timeout_ms: 500 }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: echo
    max_message_bytes: 1024
    listeners:
      - { protocol: udp, listen: 127.0.0.1:0 }
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: length_prefixed, prefix_bytes: 4, prefix_counts_itself: true } }
      - { protocol: tcp, listen: 127.0.0.2:0, framing: { kind: line }, error_reply: 'ERROR {reason}' }"

# An agent with the wrong secret is refused and exits non-zero; nothing is registered.
cat >"$WORK/intruder.yaml" <<YAML
agent: intruder
server: 127.0.0.1:$CONTROL_PORT
secret: not-the-secret-0123456789
accelerator: cpu
services: [ { name: echo, queues: 1, ring_capacity: 64, slot_bytes: 256, max_message_bytes: 1024 } ]
YAML
if timeout 10 "$ECHO_AGENT" --config "$WORK/intruder.yaml" >"$WORK/intruder.log" 2>&1; then
  fail "an agent with the wrong secret exited 0"
fi
grep -q "agent 'intruder' refused: wrong secret" "$WORK/server.log" || fail "the server did not log the refusal"
[ "$(metric caracal_agents)" -eq 0 ] || fail "the intruder is counted as an agent"
compgen -G "/dev/shm/*caracal-intruder*" >/dev/null && fail "the refused agent left its region in /dev/shm"
echo "wrong secret: refused, agent exited non-zero"

start_agent echo-1 "$ECHO_AGENT" "  - { name: echo, queues: 2, ring_capacity: 64, slot_bytes: 256, max_message_bytes: 1024 }"
UDP=$(port_of "udp/127.0.0.1:0")
LP=$(port_of "tcp/127.0.0.1:0")
LINE=$(port_of "tcp/127.0.0.2:0")

# A connection that stays open across the bad ones below.
coproc GOOD { exec nc 127.0.0.2 "$LINE"; }
echo "before" >&"${GOOD[1]}"
read -r -t 5 reply <&"${GOOD[0]}" || fail "no reply on the long-lived connection"
[ "$reply" = "before" ] || fail "long-lived connection got '$reply'"

# Length prefix larger than max_message_bytes: refused before the payload arrives.
printf '\x00\x10\x00\x00' | timeout 5 nc 127.0.0.1 "$LP" >"$WORK/oversize.out" || true
[ ! -s "$WORK/oversize.out" ] || fail "an oversize request got a reply"
wait_for_line "$WORK/server.log" "closing the connection from 127.0.0.1:[0-9]+: .*1048572.*"
# A prefix that counts itself but is shorter than itself: malformed.
printf '\x00\x00\x00\x02abcd' | timeout 5 nc 127.0.0.1 "$LP" >"$WORK/malformed.out" || true
[ ! -s "$WORK/malformed.out" ] || fail "a malformed request got a reply"
wait_for_line "$WORK/server.log" "closing the connection from 127.0.0.1:[0-9]+: .*prefix"
grep "closing the connection" "$WORK/server.log" | sed 's/^/logged: /'

# A good request on the same listener still works.
printf '\x00\x00\x00\x09hello' | timeout 5 nc -q 2 127.0.0.1 "$LP" >"$WORK/good.out" || true
[ "$(tail -c 5 "$WORK/good.out")" = "hello" ] || fail "a good request after the bad ones got '$(cat "$WORK/good.out")'"

# An oversize line with error_reply is skipped to its newline and answered in its place, and
# the requests around it on the connection are served (as memcached answers a request it cannot
# take): a line that arrives whole, and one longer than the read buffer, skipped across reads.
oversize_before=$(metric 'caracal_listener_drops_total\{.*reason="oversize"')
for n in 2000 300000; do
  { printf 'one\n'; head -c "$n" /dev/zero | tr '\0' 'x'; printf '\ntwo\n'; } |
    timeout 10 nc -N 127.0.0.2 "$LINE" >"$WORK/line.out" || true
  mapfile -t got <"$WORK/line.out"
  [ "${#got[@]}" -eq 3 ] && [ "${got[0]}" = one ] && [ "${got[2]}" = two ] &&
    [[ "${got[1]}" =~ ^ERROR\ .*max_message_bytes\ 1024$ ]] ||
    fail "a $n-byte line between two requests got '$(head -c 300 "$WORK/line.out")'"
  echo "oversize line of $n bytes: ${got[1]}; the requests around it answered"
done
oversize=$(($(metric 'caracal_listener_drops_total\{.*reason="oversize"') - oversize_before))
[ "$oversize" -eq 2 ] || fail "2 oversize lines counted as $oversize"

# A last line without its newline, ended by the client's half-close (nc -N): answered as a line.
printf 'first\nlast' | timeout 5 nc -N 127.0.0.2 "$LINE" >"$WORK/last.out" || true
[ "$(cat "$WORK/last.out")" = "$(printf 'first\nlast')" ] ||
  fail "a last line without a newline got '$(cat "$WORK/last.out")'"
echo "a last line without its newline: answered"

# An oversize datagram: dropped and counted.
head -c 1500 /dev/zero | timeout 2 nc -u -w 1 127.0.0.1 "$UDP" >/dev/null || true
sleep 0.3
[ "$(metric 'caracal_listener_drops_total\{.*reason="oversize"')" -ge 1 ] || fail "the oversize datagram was not counted"

# The long-lived connection never noticed.
echo "after" >&"${GOOD[1]}"
read -r -t 5 reply <&"${GOOD[0]}" || fail "the long-lived connection stopped answering"
[ "$reply" = "after" ] || fail "long-lived connection got '$reply'"
echo "PASS"
