#!/usr/bin/env bash
# The dictionary example, a handler with settings and state: its words loaded once by setup
# from the file its `handler:` settings name (relative to the agent's configuration), served
# over line-framed TCP by two workers that share the table, settings from the command line
# over the file, a bad setting refused at its line by --check-config, a setup that fails
# stopping the agent before it registers, and the teardown's report at exit.
source "$(dirname "$0")/lib.sh"
need python3
DICT_AGENT="$BUILD/examples/dictionary/caracal_dictionary_agent"

printf 'caracal\ta wild cat\nLynx\ta northern cat\n' >"$WORK/words.tsv"

start_server "io_threads: 2
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: dictionary
    max_message_bytes: 256
    dispatch: round_robin
    listeners:
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: line }, error_reply: 'ERROR {reason}' }"
PORT=$(port_of "tcp/127.0.0.1:0")

SERVICE="  - name: dictionary
    queues: 2
    ring_capacity: 64
    slot_bytes: 256
    max_message_bytes: 256
    handler:
      words: words.tsv
      buckets: 64"

# The shipped configuration: its words file found next to it.
out=$("$DICT_AGENT" --config "$SRC/configs/dictionary-agent.yaml" --check-config) ||
  fail "the shipped configuration was refused: $out"
[[ "$out" == *"handler settings: words=$SRC/configs/dictionary-words.tsv, buckets=1024"* ]] ||
  fail "the shipped configuration's settings came to: $out"

# A misspelt setting: refused at its line, naming the ones the handler declares.
cat >"$WORK/bad.yaml" <<YAML
agent: dict-bad
server: 127.0.0.1:$CONTROL_PORT
secret: $SECRET
services:
$SERVICE
      bukets: 64
YAML
rc=0
out=$("$DICT_AGENT" --config "$WORK/bad.yaml" --check-config 2>&1) || rc=$?
[ "$rc" = 2 ] || fail "--check-config of a misspelt setting exited $rc: $out"
[[ "$out" == *"bad.yaml:13:7: services[0].handler: unknown setting 'bukets' (known here: words, buckets, case_sensitive, not_found)"* ]] ||
  fail "the misspelt setting gave: $out"
echo "misspelt setting refused at its line"

# An unknown --set is refused too.
sed -i '/bukets/d' "$WORK/bad.yaml"
rc=0
out=$("$DICT_AGENT" --config "$WORK/bad.yaml" --set bukets=1 --check-config 2>&1) || rc=$?
[ "$rc" = 2 ] && [[ "$out" == *"command line (--set bukets=1): unknown handler setting 'bukets'"* ]] ||
  fail "an unknown --set exited $rc: $out"

# A setup that fails (a line without a tab) stops the agent before it registers. Paths given
# with --set are relative to the working directory.
printf 'caracal\ta wild cat\nno tab\n' >"$WORK/broken.tsv"
rc=0
(cd "$WORK" && timeout 20 "$DICT_AGENT" --config "$WORK/bad.yaml" --set words=broken.tsv \
  >"$WORK/broken.log" 2>&1) || rc=$?
[ "$rc" = 1 ] || fail "a failed setup exited $rc: $(cat "$WORK/broken.log")"
grep -q "service 'dictionary': handler setup on $ACCELERATOR failed: $WORK/broken.tsv:2: no tab" \
  "$WORK/broken.log" || fail "the failed setup said: $(cat "$WORK/broken.log")"
! grep -q "dict-bad" "$WORK/server.log" || fail "the agent whose setup failed reached the server"
echo "failed setup: exit 1 before registering"

# Served: case folded by default, the table shared by both workers.
AGENT_YAML="cpu: { workers: 2 }" start_agent dict-1 "$DICT_AGENT" "$SERVICE" \
  --set not_found=UNKNOWN
grep -q "handler settings: words=$WORK/words.tsv, buckets=64, case_sensitive=false (default), not_found=UNKNOWN" \
  "$WORK/dict-1.log" || fail "the settings were not logged as read: $(cat "$WORK/dict-1.log")"

ask() {
  python3 - "$PORT" "$@" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=20)
s.sendall("".join(line + "\n" for line in sys.argv[2:]).encode())
f = s.makefile("rb")
for _ in sys.argv[2:]:
    sys.stdout.write(f.readline().decode())
PY
}
out=$(ask caracal LYNX puma "$(printf 'x%.0s' $(seq 70))")
expected=$'a wild cat\na northern cat\nUNKNOWN\nERROR a word is 1-64 bytes'
[ "$out" = "$expected" ] || fail "lookups gave '$out'"
words=()
for _ in $(seq 40); do words+=(caracal lynx); done
out=$(ask "${words[@]}")
[ "$(grep -c . <<<"$out")" = 80 ] && ! grep -qv -e '^a wild cat$' -e '^a northern cat$' <<<"$out" ||
  fail "pipelined lookups gave: $out"
echo "83 lookups answered from the shared table"

# SIGHUP (what reloads the server) is said and ignored: the agent goes on serving.
# shellcheck disable=SC2154 # start_agent (lib.sh) sets AGENT_PID_<name> through eval
kill -HUP "$AGENT_PID_dict_1"
for _ in $(seq 50); do grep -q "received SIGHUP" "$WORK/dict-1.log" && break; sleep 0.1; done
grep -q "received SIGHUP: an agent does not reload" "$WORK/dict-1.log" || fail "SIGHUP not logged"
kill -0 "$AGENT_PID_dict_1" || fail "the agent died on SIGHUP"
out=$(ask lynx)
[ "$out" = "a northern cat" ] || fail "after SIGHUP a lookup gave '$out'"
echo "SIGHUP: logged, still serving"

# SIGTERM: the teardown reads the counters every worker added to.
kill -TERM "$AGENT_PID_dict_1"
wait "$AGENT_PID_dict_1" || fail "the agent exited $? on SIGTERM"
grep -q "dictionary 'dictionary': 84 lookups, 1 not found" "$WORK/dict-1.log" ||
  fail "no teardown report: $(cat "$WORK/dict-1.log")"
echo "teardown: counters read back"
echo PASS
