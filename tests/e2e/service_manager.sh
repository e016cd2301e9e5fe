#!/usr/bin/env bash
# What systemd sees: snic_server and an agent started with NOTIFY_SOCKET (a datagram socket this
# test reads, as systemd's would be) say READY=1 with a status line, and STOPPING=1 at the end.
# SIGHUP (the units' ExecReload) reloads the server's log level, keeps serving through it,
# refuses a file that no longer parses without changing anything, and names changes that need
# a restart.
source "$(dirname "$0")/lib.sh"
need python3 nc
if ! ldd "$SERVER_BIN" | grep -q libsystemd; then
  echo "SKIP: built without libsystemd (CARACAL_WITH_SYSTEMD off)"
  exit 77
fi

# A notify socket: every datagram, one line per message with its newlines as '|'.
SOCK="$WORK/notify.sock"
python3 - "$SOCK" >"$WORK/notify.log" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
while True:
    print(s.recv(4096).decode().replace("\n", "|"), flush=True)
PY
PIDS+=($!)
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done
export NOTIFY_SOCKET="$SOCK"

CONFIG="io_threads: 1
log_level: info
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: echo
    max_message_bytes: 256
    listeners:
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: line } }"
start_server "$CONFIG"
PORT=$(port_of "tcp/127.0.0.1:0")
wait_for_line "$WORK/notify.log" "^READY=1\|STATUS=serving 1 service\(s\), log level info$"
start_agent echo-1 "$ECHO_AGENT" \
  "  - { name: echo, queues: 1, ring_capacity: 16, slot_bytes: 64, max_message_bytes: 256 }"
wait_for_line "$WORK/notify.log" "^READY=1\|STATUS=connecting to the server at 127.0.0.1:$CONTROL_PORT$"
wait_for_line "$WORK/notify.log" "^STATUS=serving 1 service\(s\) on cpu"

echo_once() { echo "$1" | timeout 10 nc -q1 127.0.0.1 "$PORT"; }
[ "$(echo_once before)" = before ] || fail "no echo before the reload"

# The log level, reloaded: debug lines appear, the server serves on, systemd is told.
sed -i 's/^log_level: info$/log_level: debug/' "$WORK/server.yaml"
kill -HUP "$SERVER_PID"
wait_for_line "$WORK/server.log" "SIGHUP: .*server.yaml reloaded; log level debug$"
wait_for_line "$WORK/notify.log" "^RELOADING=1$"
wait_for_line "$WORK/notify.log" "STATUS=serving 1 service\(s\), log level debug$"
[ "$(echo_once during)" = during ] || fail "no echo after the reload"
grep -q "other than log_level" "$WORK/server.log" && fail "a log level change was called a restart change"

# A file that no longer parses changes nothing; the server is still there.
cp "$WORK/server.yaml" "$WORK/server.yaml.good"
echo "io_threads: [" >>"$WORK/server.yaml"
kill -HUP "$SERVER_PID"
wait_for_line "$WORK/server.log" "SIGHUP: .*server.yaml.*nothing reloaded"
kill -0 "$SERVER_PID" || fail "the server died of a bad reload"
[ "$(echo_once after-bad)" = after-bad ] || fail "no echo after a bad reload"

# A change that needs a restart is named as such.
sed 's/^io_threads: 1$/io_threads: 2/' "$WORK/server.yaml.good" >"$WORK/server.yaml"
kill -HUP "$SERVER_PID"
wait_for_line "$WORK/server.log" "has changes other than log_level; they take effect at a restart"

kill -TERM "$SERVER_PID"
wait_for_line "$WORK/notify.log" "^STOPPING=1$"
echo "PASS: READY, STATUS, RELOADING and STOPPING sent; SIGHUP reloads the log level only"
