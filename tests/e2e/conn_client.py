#!/usr/bin/env python3
"""Clients for the connection limit and timeout tests (conn_limits.sh, conn_timeouts.sh),
against an echo service with line framing. Each subcommand prints what it saw and exits 0 when
the server behaved as expected, 1 otherwise.

  open PORT SOURCE:COUNT...   opens COUNT connections from each source address in turn, sends
                              one line on each and reads its echo; prints one word per
                              connection: "ok" (echoed) or "refused" (closed before an echo).
                              Then, with --then-close N --then-open SOURCE, closes N of the
                              answered connections and opens one more from SOURCE, which must
                              be answered within --timeout-s.
  idle PORT IDLE_S            a connection that asks once and then stays quiet is closed by the
                              server about IDLE_S later; one that asks every IDLE_S / 3 for
                              3 x IDLE_S is not.
  slow PORT LIMIT_S           a request sent one byte every 0.2 s is cut off: the connection
                              closes within LIMIT_S plus a margin, after an error reply.
  no-read PORT                sends 1000-byte requests without ever reading a reply, until its
                              sends stay blocked for 2 s; prints how many it sent, then waits
                              (the script watches the server close it).
  flood PORT COUNT            opens COUNT connections and sends a line on each; prints how many
                              were answered within 2 s; holds them until stdin closes, then
                              closes the answered ones, and each of the others once answered:
                              every one must be answered within 10 s.
"""
import argparse
import errno
import select
import socket
import sys
import time


def connect(port, source=None, rcvbuf=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    if source:
        s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def ask(s, line, timeout=3.0):
    """Sends a line and reads its echo: the reply, or None when the server closed first."""
    try:
        s.sendall(line.encode() + b"\n")
    except (BrokenPipeError, ConnectionResetError):
        return None
    return read_line(s, timeout)


def read_line(s, timeout):
    data = b""
    deadline = time.monotonic() + timeout
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no reply within %.1f s" % timeout)
        s.settimeout(left)
        try:
            chunk = s.recv(4096)
        except ConnectionResetError:
            return None
        except socket.timeout:
            raise TimeoutError("no reply within %.1f s" % timeout)
        if not chunk:
            return None
        data += chunk
    return data[:-1].decode()


def cmd_open(a):
    held = []
    words = []
    for spec in a.sources:
        source, count = spec.split(":")
        for i in range(int(count)):
            s = connect(a.port, source)
            reply = ask(s, "hello %s %d" % (source, i))
            if reply is None:
                words.append("refused")
                s.close()
            elif reply == "hello %s %d" % (source, i):
                words.append("ok")
                held.append(s)
            else:
                print("unexpected reply %r" % reply)
                return 1
    print(" ".join(words))
    sys.stdout.flush()
    if a.then_close:
        for s in held[: a.then_close]:
            s.close()
        # The server sees the close when it next reads: retry until a new connection is taken.
        deadline = time.monotonic() + a.timeout_s
        while True:
            s = connect(a.port, a.then_open)
            if ask(s, "again") == "again":
                print("after closing %d: a new connection from %s was answered" % (a.then_close, a.then_open))
                break
            s.close()
            if time.monotonic() > deadline:
                print("after closing %d: new connections are still refused" % a.then_close)
                return 1
            time.sleep(0.1)
    return 0


def wait_closed(s, timeout):
    """Seconds until the server closes `s` (EOF or reset), reading what it sends meanwhile."""
    start = time.monotonic()
    got = b""
    while time.monotonic() - start < timeout:
        r, _, _ = select.select([s], [], [], 0.05)
        if r:
            try:
                chunk = s.recv(4096)
            except ConnectionResetError:
                return time.monotonic() - start, got
            if not chunk:
                return time.monotonic() - start, got
            got += chunk
    return None, got


def cmd_idle(a):
    s = connect(a.port)
    if ask(s, "once") != "once":
        print("no echo on the idle connection")
        return 1
    after, _ = wait_closed(s, a.idle_s * 4 + 2)
    if after is None:
        print("the idle connection was not closed within %.1f s" % (a.idle_s * 4 + 2))
        return 1
    print("idle connection closed after %.2f s" % after)
    if after < a.idle_s * 0.8:
        print("closed earlier than the idle timeout")
        return 1
    busy = connect(a.port)
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < a.idle_s * 3:
        if ask(busy, "busy %d" % n) != "busy %d" % n:
            print("a connection asking every %.2f s was closed after %.2f s" % (a.idle_s / 3, time.monotonic() - start))
            return 1
        n += 1
        time.sleep(a.idle_s / 3)
    print("a connection asking every %.2f s stayed open for %.2f s (%d requests)" % (a.idle_s / 3, time.monotonic() - start, n))
    return 0


def cmd_slow(a):
    s = connect(a.port)
    start = time.monotonic()
    got = b""
    sent = 0
    while time.monotonic() - start < a.limit_s * 3 + 2:
        try:
            s.send(b"x")
            sent += 1
        except (BrokenPipeError, ConnectionResetError):
            break
        r, _, _ = select.select([s], [], [], 0.2)
        if r:
            try:
                chunk = s.recv(4096)
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
    after = time.monotonic() - start
    print("one byte every 0.2 s: closed after %.2f s and %d bytes; the server sent %r" % (after, sent, got.decode(errors="replace")))
    if after > a.limit_s + 1.5:
        print("the slow request was not cut off within %.1f s" % (a.limit_s + 1.5))
        return 1
    if after < a.limit_s * 0.8:
        print("cut off earlier than the request timeout")
        return 1
    if not got.startswith(b"ERROR "):
        print("no error reply before the close")
        return 1
    return 0


def cmd_no_read(a):
    s = connect(a.port, rcvbuf=4096)
    s.setblocking(False)
    line = b"r" * 999 + b"\n"
    sent = 0
    pending = b""
    blocked_since = None
    while sent < 200000:
        if not pending:
            pending = line
        try:
            n = s.send(pending)
            pending = pending[n:]
            if not pending:
                sent += 1
            blocked_since = None
        except BlockingIOError:
            now = time.monotonic()
            if blocked_since is None:
                blocked_since = now
            elif now - blocked_since > 2:
                break
            select.select([], [s], [], 0.1)
        except (BrokenPipeError, ConnectionResetError):
            print("closed by the server after %d requests" % sent)
            break
    print("sent %d requests of 1000 bytes without reading a reply" % sent)
    sys.stdout.flush()
    sys.stdin.read()  # the script closes stdin when it is done watching
    return 0


def cmd_flood(a):
    socks = []
    for i in range(a.count):
        s = connect(a.port)
        s.sendall(b"flood %d\n" % i)
        socks.append(s)
    answered = set()
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and len(answered) < len(socks):
        r, _, _ = select.select([s for i, s in enumerate(socks) if i not in answered], [], [], 0.1)
        for s in r:
            answered.add(socks.index(s))
            s.recv(4096)
    print("answered %d of %d" % (len(answered), len(socks)))
    sys.stdout.flush()
    sys.stdin.read()
    waiting = [s for i, s in enumerate(socks) if i not in answered]
    for i in answered:
        socks[i].close()
    late = 0
    deadline = time.monotonic() + 10
    pending = list(waiting)
    while pending and time.monotonic() < deadline:
        r, _, _ = select.select(pending, [], [], 0.1)
        for s in r:
            data = s.recv(4096)
            if data.startswith(b"flood ") or data.startswith(b"ERROR "):
                late += 1
            pending.remove(s)
            s.close()  # gives the server its descriptor back for the next one waiting
    print("after closing the answered ones: %d of %d waiting connections answered" % (late, len(waiting)))
    return 0 if late == len(waiting) else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("open")
    o.add_argument("port", type=int)
    o.add_argument("sources", nargs="+")
    o.add_argument("--then-close", type=int, default=0)
    o.add_argument("--then-open", default="127.0.0.1")
    o.add_argument("--timeout-s", type=float, default=5)
    i = sub.add_parser("idle")
    i.add_argument("port", type=int)
    i.add_argument("idle_s", type=float)
    s = sub.add_parser("slow")
    s.add_argument("port", type=int)
    s.add_argument("limit_s", type=float)
    n = sub.add_parser("no-read")
    n.add_argument("port", type=int)
    f = sub.add_parser("flood")
    f.add_argument("port", type=int)
    f.add_argument("count", type=int)
    a = p.parse_args()
    return {"open": cmd_open, "idle": cmd_idle, "slow": cmd_slow, "no-read": cmd_no_read, "flood": cmd_flood}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
