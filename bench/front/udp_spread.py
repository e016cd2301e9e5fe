#!/usr/bin/env python3
"""How evenly snic_server deals UDP datagrams among a listener's sockets (one per I/O thread).

    bench/front/udp_spread.py BUILD_DIR [RESULTS_DIR]   (default bench/results/udp-spread-vm)

For each count of I/O threads (IO_THREADS, "4 8 16 32") and each `spread` (flows, datagrams),
one snic_server with a UDP listener and no agent (each datagram gets the "no agent" error reply,
so none is left unreceived); for each count of client flows (FLOWS, "1 4 16 64": UDP sockets
of their own, so each has its own source port) TRIALS (20) trials of fresh flows, each flow
sending DATAGRAMS (200) datagrams. After each trial the listener's
caracal_listener_socket_datagrams_total{socket} says what each socket received; the report
gives, per point, the median over the trials of the sockets that received nothing and of the
busiest socket's datagrams over an even share. Writes udp-spread.md and udp-spread.json.
"""
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import caracal_bench as cb  # noqa: E402

BUILD = os.path.realpath(sys.argv[1]) if len(sys.argv) > 1 else sys.exit(__doc__)
SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = sys.argv[2] if len(sys.argv) > 2 else os.path.join(SRC, "bench/results/udp-spread-vm")
IO_THREADS = [int(x) for x in os.environ.get("IO_THREADS", "4 8 16 32").split()]
FLOWS = [int(x) for x in os.environ.get("FLOWS", "1 4 16 64").split()]
TRIALS = int(os.environ.get("TRIALS", "20"))
DATAGRAMS = int(os.environ.get("DATAGRAMS", "200"))
SPREADS = os.environ.get("SPREADS", "flows datagrams").split()


def wait_for(path, pattern, seconds=20):
    deadline = time.time() + seconds
    while time.time() < deadline:
        with open(path) as f:
            m = re.search(pattern, f.read())
        if m:
            return m
        time.sleep(0.05)
    sys.exit(f"udp_spread.py: no '{pattern}' in {path} within {seconds} s:\n" + open(path).read())


def per_socket(metrics_port):
    page = cb.metrics_page(f"http://127.0.0.1:{metrics_port}/metrics")
    return {int(labels["socket"]): int(v) for name, labels, v in
            cb.metric_samples(page.splitlines())
            if name == "caracal_listener_socket_datagrams_total"}


def trial(port, flows):
    """Sends DATAGRAMS from each of `flows` fresh sockets, a few at a time, and takes every
    reply; returns the replies that did not come."""
    clients = []
    for _ in range(flows):
        c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        c.settimeout(5)
        clients.append(c)
    missing = 0
    for _ in range(0, DATAGRAMS, 8):
        for c in clients:
            for _ in range(8):
                c.sendto(b"x", ("127.0.0.1", port))
        for c in clients:
            for _ in range(8):
                try:
                    c.recv(256)
                except socket.timeout:
                    missing += 1
                    break
    for c in clients:
        c.close()
    return missing


def run_server(workdir, threads, spread):
    config = os.path.join(workdir, f"server-{threads}-{spread}.yaml")
    with open(config, "w") as f:
        f.write(f"""io_threads: {threads}
log_level: info
control: {{ listen: 127.0.0.1:0, secret: 0123456789abcdef-spread }}
metrics: {{ listen: 127.0.0.1:0 }}
services:
  - name: s
    max_message_bytes: 64
    listeners:
      - {{ protocol: udp, listen: 127.0.0.1:0, error_reply: "E {{reason}}", spread: {spread} }}
""")
    log = config.replace(".yaml", ".log")
    proc = subprocess.Popen([os.path.join(BUILD, "snic_server/snic_server"), "--config", config],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    port = int(wait_for(log, r"listening on udp/\S+ \(port (\d+)\)").group(1))
    metrics = int(wait_for(log, r"metrics on http://[^:]+:(\d+)/").group(1))
    return proc, port, metrics


def main():
    os.makedirs(OUT, exist_ok=True)
    points = []
    with tempfile.TemporaryDirectory() as workdir:
        for threads in IO_THREADS:
            for spread in SPREADS:
                proc, port, metrics = run_server(workdir, threads, spread)
                try:
                    for flows in FLOWS:
                        idle, busiest, missing = [], [], 0
                        before = per_socket(metrics)
                        for _ in range(TRIALS):
                            missing += trial(port, flows)
                            after = per_socket(metrics)
                            got = [after.get(i, 0) - before.get(i, 0) for i in range(threads)]
                            before = after
                            even = sum(got) / threads
                            idle.append(sum(1 for g in got if g == 0))
                            busiest.append(max(got) / even if even else 0.0)
                        point = {"io_threads": threads, "spread": spread, "flows": flows,
                                 "idle_sockets_median": cb.median(idle),
                                 "idle_sockets_max": max(idle),
                                 "busiest_over_even_median": round(cb.median(busiest), 2),
                                 "busiest_over_even_max": round(max(busiest), 2),
                                 "replies_missing": missing}
                        points.append(point)
                        print(json.dumps(point), flush=True)
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
    machine = f"{platform.node()}, {os.cpu_count()} CPUs, Linux {platform.release()}"
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    commit = subprocess.run(["git", "-C", SRC, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "?"
    cb.write_json(os.path.join(OUT, "udp-spread.json"),
                  {"machine": machine, "date": when, "commit": commit, "trials": TRIALS,
                   "datagrams_per_flow": DATAGRAMS, "points": points})
    lines = [
        "# snic_server: UDP datagrams dealt among a listener's sockets",
        "",
        f"`bench/front/udp_spread.py`, {machine}, {when}, commit {commit}. Each point: "
        f"{TRIALS} trials of fresh client flows (a UDP socket each, {DATAGRAMS} datagrams "
        "each) against one server with a socket per I/O thread; medians over the trials "
        "(largest in brackets). `spread: flows` (the default) is the kernel's SO_REUSEPORT "
        "hash of the sender's address and port, `datagrams` a random socket per datagram.",
        "",
    ] + cb.md_table(["io_threads", "flows"] + [f"{what}, {s}" for what in (
        "idle sockets", "busiest over even share") for s in ("flows", "datagrams")])

    def cell(threads, flows, spread, key):
        p = cb.first(points, io_threads=threads, flows=flows, spread=spread)
        return f"{p[key + '_median']} ({p[key + '_max']})" if p else ""
    lines += [cb.md_row([str(threads), str(flows)] + [
        cell(threads, flows, s, k) for k in ("idle_sockets", "busiest_over_even")
        for s in ("flows", "datagrams")]) for threads in IO_THREADS for flows in FLOWS]
    missing = sum(p["replies_missing"] for p in points)
    lines += ["", f"Replies that did not come: {missing}."]
    cb.write_text(os.path.join(OUT, "udp-spread.md"), "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
