#!/usr/bin/env python3
"""Sums run.sh's flat profiles by part of the server and prints the tables (Markdown): per
protocol and size, for each tree, the median over rounds of requests per server core, and of the
microseconds of server CPU per request that each part took (its share of the profile's samples
times the server's CPU per request).

    parts.py RAW_DIR   (run.sh's points.txt and NAME.perf.txt files)
"""
import collections
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import caracal_bench as cb  # noqa: E402

# A symbol goes to the first part whose pattern it matches: waiting first, then the kernel's
# work, then the server's own parts. "[k] " starts a kernel symbol.
PARTS = [
    ("idle", r"sched_yield|__schedule|\bschedule\b|finish_task_switch|epoll_wait|ep_poll|"
     r"EngineThread::idle|IdlePolicy|sleep_until_woken"),
    ("kernel", r"^\[k\]|__recvmmsg|__sendmmsg|__libc_(recv|send|read|write)|asynccancel|"
     r"__GI___(recv|send|write|read)"),
    ("clock", r"clock_gettime|steady_clock|vdso"),
    ("memcpy", r"memmove|memcpy|memset"),
    ("heap", r"malloc|_int_free|_int_malloc|cfree|tcache|operator new|operator delete"),
    ("locks", r"pthread_mutex|lll_lock|__lll|_Sp_counted|shared_ptr"),
    ("reply", r"deliver|end_burst|send_outgoing|StreamWriter|flush_replies|PendingQueue|"
     r"write_replies|on_written"),
    ("ring", r"Ring(Producer|Consumer)|RemoteRing|write_now|TransportBinding|RegionBinding|"
     r"QueueFlights|Flights|mqueue::"),
    ("engine", r"EngineThread|Engine::|Service::|ReplyTable|dispatch"),
    ("listener", r"UdpListener|Tcp|Codec|[Ff]raming|Decod|on_datagram|drain|receive"),
    ("Asio", r"boost::asio"),
    ("other", r""),
]
LINE = re.compile(r"\s*([\d.]+)%\s+(\S+)\s+(\[[k.]\])\s+(.*)")


def shares_of(path):
    """Each part's share of the samples in one `perf report --sort dso,sym` listing."""
    shares = collections.Counter()
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            pct, _dso, kind, sym = m.groups()
            key = ("[k] " if kind == "[k]" else "") + sym
            part = next(name for name, pattern in PARTS if re.search(pattern, key))
            shares[part] += float(pct) / 100
    total = sum(shares.values()) or 1.0
    return {p: shares[p] / total for p, _ in PARTS}


def main(raw):
    points = collections.defaultdict(list)  # (proto, size, tree) -> [(per core, {part: us})]
    with open(os.path.join(raw, "points.txt")) as f:
        for line in f:
            name, rps, cores = line.split()
            tree, proto, size, _round = name.split("-")
            rps, cores = float(rps), float(cores)
            us = cores * 1e6 / rps  # server CPU per request
            shares = shares_of(os.path.join(raw, name + ".perf.txt"))
            points[(proto, int(size), tree)].append((rps / cores, {p: us * s for p, s in shares.items()}))
    head = ["proto", "size", "tree", "req/s per core (median, range)", "busy us/req"] + [
        p for p, _ in PARTS]
    rows = []
    for key in sorted(points, key=lambda k: (k[0] != "udp", k[1], k[2] != "before")):
        proto, size, tree = key
        v = points[key]
        per_core = [x[0] for x in v]
        busy = cb.median(sum(u for p, u in x[1].items() if p != "idle") for x in v)
        rows.append([proto, str(size), tree,
                     f"{cb.rps_as_krps(cb.median(per_core))} k ({cb.rps_as_krps(min(per_core))}-"
                     f"{cb.rps_as_krps(max(per_core))})", cb.num(busy, 2)]
                    + [cb.num(cb.median(x[1][p] for x in v), 2) for p, _ in PARTS])
    print("\n".join(cb.md_table(head, rows)))
    print()
    print("Microseconds of server CPU per request, medians over the rounds; busy is every part "
          "but idle. Parts: parts.py's PARTS (first pattern that matches a symbol).")


if __name__ == "__main__":
    main(sys.argv[1])
