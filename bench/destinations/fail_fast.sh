#!/usr/bin/env bash
# How fast a handler's call to a destination fails when the destination is down or stalled: the
# key-lookup example (examples/kv_lookup) behind snic_server, a memcached of its own as the
# destination (timeout_ms TIMEOUT_MS, 500), and ROUNDS lookups (20) one at a time on one
# connection in each state: memcached up, stopped (SIGSTOP: connected, never answering),
# resumed (SIGCONT), killed (SIGKILL: the connection refused). Prints, per state, the median
# and largest time from sending a lookup to its reply, and the replies seen; then the
# destination failures the server counted.
#
#   bench/destinations/fail_fast.sh BUILD_DIR
#
# The setup is the end-to-end tests' (tests/e2e/lib.sh): loopback, ports the OS picks, every
# process stopped at the end.
here=$(cd "$(dirname "$0")" && pwd)
set -- "${1:?usage: fail_fast.sh BUILD_DIR}" "$here/../.."
source "$here/../../tests/e2e/lib.sh"
need memcached python3
TIMEOUT_MS=${TIMEOUT_MS:-500}
ROUNDS=${ROUNDS:-20}
KV_AGENT="$BUILD/examples/kv_lookup/caracal_kv_agent"
start_memcached pick
mc_set greeting "hello"
start_server "io_threads: 2
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: kv
    max_message_bytes: 1024
    listeners:
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: line }, error_reply: 'ERROR {reason}' }
destinations:
  - { name: memcached, connect: 127.0.0.1:$MC_PORT, framing: { kind: memcached }, max_message_bytes: 1024, timeout_ms: $TIMEOUT_MS }"
start_agent kv-1 "$KV_AGENT" "  - name: kv
    queues: 2
    ring_capacity: 64
    slot_bytes: 256
    max_message_bytes: 1024
    client_queues: [ { destination: memcached } ]"
KV=$(port_of "tcp/127.0.0.1:0")

# probe STATE: ROUNDS lookups of one key, one at a time.
probe() {
  python3 - "$KV" "$1" "$ROUNDS" <<'PY'
import socket, statistics, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
f = s.makefile("rb")
times, replies = [], set()
for _ in range(int(sys.argv[3])):
    t = time.perf_counter()
    s.sendall(b"greeting\n")
    replies.add(f.readline().decode().strip())
    times.append((time.perf_counter() - t) * 1000)
print(f"{sys.argv[2]:<30} median {statistics.median(times):8.2f} ms, max {max(times):8.2f} ms; "
      f"replies {sorted(replies)}")
PY
}
echo "destination timeout_ms $TIMEOUT_MS, $ROUNDS lookups per state"
probe up
kill -STOP "$MC_PID"
probe "stopped (SIGSTOP)"
kill -CONT "$MC_PID"
sleep 0.5
probe resumed
kill -KILL "$MC_PID"
wait "$MC_PID" 2>/dev/null || true
probe "killed (SIGKILL)"
echo "destination failures counted: $(metric caracal_destination_failures_total)"
