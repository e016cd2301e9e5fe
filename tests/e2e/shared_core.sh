#!/usr/bin/env bash
# More polling threads than cores: snic_server with two engine threads of their own (next to
# two I/O threads), and the echo agent (its CPU worker polls too), all pinned to one CPU.
# Requests are dealt to both engine threads, so both spin while their requests are in flight. A
# spinning thread there holds the core that the thread it waits for needs until the scheduler
# takes it away, so the engine threads must notice that they lose their core and spin short
# (caracal_engine_spins_cut_total). (With the engine in the I/O threads, one client's requests
# go to one engine thread only, which keeps the core and loses little of it: the cut there is
# left to chance, and the test would be too.) sockperf ping-pong over UDP then gets every reply,
# in order, and the metric shows the engine cut its spinning. The latency is printed, not
# judged (bench/ measures performance).
source "$(dirname "$0")/lib.sh"
need sockperf curl taskset

start_server "io_threads: 2
engine_threads: 2
control: { listen: 127.0.0.1:0, secret: $SECRET }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: echo
    max_message_bytes: 256
    dispatch: round_robin
    listeners:
      - { protocol: udp, listen: 127.0.0.1:0 }"
start_agent echo-1 "$ECHO_AGENT" "  - { name: echo, queues: 2, ring_capacity: 64, slot_bytes: 128, max_message_bytes: 256 }"
UDP=$(port_of "udp/127.0.0.1:0")

# Every thread of both processes on CPU 0 (threads started later inherit it).
taskset -a -c -p 0 "$SERVER_PID" >/dev/null || fail "cannot pin snic_server to CPU 0"
# shellcheck disable=SC2154 # start_agent (lib.sh) sets AGENT_PID_<name> through eval
taskset -a -c -p 0 "$AGENT_PID_echo_1" >/dev/null || fail "cannot pin the agent to CPU 0"

# .log: printed with the other logs on a failure.
timeout 60 sockperf ping-pong -i 127.0.0.1 -p "$UDP" -m 64 -t 2 >"$WORK/pingpong.log" 2>&1 ||
  fail "sockperf ping-pong exited $? (pingpong.log below)"
pingpong_ok "$WORK/pingpong.log" "UDP ping-pong, server and agent on one CPU"
cut=$(metric caracal_engine_spins_cut_total || true)  # absent: 0
echo "engine spins cut short: $cut"
[ "$cut" -ge 1 ] || fail "the engine threads never noticed that they shared one CPU"
replies=$(metric caracal_service_replies_total)
[ "$replies" -ge 1 ] || fail "no replies counted"
echo "shared core: $replies replies, every one in order; the engine cut its spinning $cut times"
