#!/usr/bin/env python3
"""Speaks the first step of the control protocol (control/protocol.hpp) as an agent would, from
a chosen source address: a framed hello (a 4-byte big-endian length, then a YAML mapping), then
reads the server's answer. For tests/e2e/control_auth.sh and bench/control_auth/run.sh.

  control_hello.py hello --port P --source 127.0.0.2 --secret S [--count N] [--agent NAME]
      N hellos, one connection each, one after another; one line per answer:
      "welcome", "refused <message>" or "throttled <retry_after_ms> <message>"; with --time,
      the kind and the milliseconds from connect to the answer.
  control_hello.py flood --port P --source 127.0.0.2 --secret S --seconds T [--workers W]
      hellos as fast as W connections in turn allow, for T seconds; prints the answers counted
      by kind, and per second: "attempts=... refused=... throttled=... welcome=... seconds=..."
"""
import argparse
import re
import socket
import struct
import sys
import threading
import time

TYPE = re.compile(rb"type: (\w+)")
RETRY = re.compile(rb"retry_after_ms: (\d+)")
MESSAGE = re.compile(rb"message: (\"(?:[^\"\\]|\\.)*\"|'[^']*'|[^,}]*)")


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def hello_frame(secret: str, agent: str, epoch: int) -> bytes:
    quoted = "'" + secret.replace("'", "''") + "'"
    return frame(
        f"{{type: hello, protocol: 1, secret: {quoted}, agent: {agent}, epoch: {epoch}, "
        f"accelerator: cpu}}".encode())


def read_exactly(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return data
        data += chunk
    return data


def one_hello(port, source, secret, agent, epoch, timeout=5.0):
    """Returns (kind, retry_after_ms, message): kind is welcome, refused, throttled or closed."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        s.sendall(hello_frame(secret, agent, epoch))
        prefix = read_exactly(s, 4)
        if len(prefix) < 4:
            return ("closed", 0, "")
        (n,) = struct.unpack(">I", prefix)
        body = read_exactly(s, n)
    t = TYPE.search(body)
    kind = t.group(1).decode() if t else "?"
    m = MESSAGE.search(body)
    message = m.group(1).decode().strip("'\"") if m else ""
    r = RETRY.search(body)
    if kind == "refused" and r:
        return ("throttled", int(r.group(1)), message)
    return (kind, 0, message)


def cmd_hello(a):
    for i in range(a.count):
        start = time.monotonic()
        kind, retry, message = one_hello(a.port, a.source, a.secret, a.agent, a.epoch + i)
        if a.time:
            print(f"{kind} {(time.monotonic() - start) * 1000:.2f} ms", flush=True)
        elif kind == "throttled":
            print(f"throttled {retry} {message}", flush=True)
        elif kind == "refused":
            print(f"refused {message}", flush=True)
        else:
            print(kind, flush=True)


def cmd_flood(a):
    counts = {}
    lock = threading.Lock()
    deadline = time.monotonic() + a.seconds
    epoch = [1]

    def worker():
        while time.monotonic() < deadline:
            with lock:
                epoch[0] += 1
                e = epoch[0]
            try:
                kind, _, _ = one_hello(a.port, a.source, a.secret, a.agent, e, timeout=2.0)
            except OSError:
                kind = "error"
            with lock:
                counts[kind] = counts.get(kind, 0) + 1

    start = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(a.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - start
    total = sum(counts.values())
    fields = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
    print(f"attempts={total} {fields} seconds={took:.2f} per_second={total / took:.1f}")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("hello", "flood"):
        s = sub.add_parser(name)
        s.add_argument("--port", type=int, required=True)
        s.add_argument("--source", default="127.0.0.1")
        s.add_argument("--secret", required=True)
        s.add_argument("--agent", default="probe")
        s.add_argument("--epoch", type=int, default=1)
        if name == "hello":
            s.add_argument("--count", type=int, default=1)
            s.add_argument("--time", action="store_true",
                           help="print each answer's kind and how long it took, in ms")
        else:
            s.add_argument("--seconds", type=float, default=5.0)
            s.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    (cmd_hello if a.cmd == "hello" else cmd_flood)(a)


if __name__ == "__main__":
    sys.exit(main())
