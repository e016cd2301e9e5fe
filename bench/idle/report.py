#!/usr/bin/env python3
"""The report of bench/idle/run.sh: per idle policy, the median over the rounds of the idle
agent's and server's cores and of sockperf's round-trip percentiles, busy and sparse, then every
round. Usage: report.py RAW_DIR COMMIT MACHINE DATE IDLE_S DURATION SPARSE_MPS"""
import json
import os
import re
import statistics
import sys

raw, commit, machine, date, idle_s, duration, sparse_mps = sys.argv[1:8]


def sockperf(path):
    """Round-trip percentiles (us) and message counts from sockperf ping-pong --full-rtt."""
    out = {}
    try:
        text = open(os.path.join(raw, path), encoding="utf-8", errors="replace").read()
    except OSError:
        return out
    for m in re.finditer(r"percentile\s+([0-9.]+)\s*=\s*([0-9.]+)", text):
        out[f"p{float(m.group(1)):g}"] = float(m.group(2))
    m = re.search(r"<MAX> observation\s*=\s*([0-9.]+)", text)
    if m:
        out["max"] = float(m.group(1))
    m = re.search(r"\[Valid Duration\].*SentMessages=(\d+); ReceivedMessages=(\d+)", text)
    if m:
        out["sent"], out["received"] = int(m.group(1)), int(m.group(2))
    return out


rounds = [json.loads(l) for l in open(os.path.join(raw, "rounds.jsonl")) if l.strip()]
for r in rounds:
    r["busy_rtt"] = sockperf(r["busy"])
    r["sparse_rtt"] = sockperf(r["sparse"])
policies = list(dict.fromkeys(r["policy"] for r in rounds))


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


print("# An idle CPU agent: cores and round trips by idle policy\n")
print(f"`bench/idle/run.sh`, {date}, commit {commit}; {machine}.\n")
print("snic_server (2 I/O threads, the engine in them) and the echo agent on the CPU accelerator "
      "(1 worker, 2 queues) over shm, a fresh pair per round, the policies taking turns. "
      f"Idle: cores from /proc over {idle_s} s with no traffic, after a second to settle. "
      f"Busy: `sockperf ping-pong --full-rtt`, UDP, 64 B, one message in flight, {duration} s. "
      f"Sparse: the same at {sparse_mps} messages a second, so each request comes after the "
      "worker's spin has ended. Round trips in microseconds, client to server to agent and "
      f"back; medians over {len(rounds) // max(1, len(policies))} rounds.\n")
print("- `spin`: `cpu.idle_sleep_max_us: 0`, the worker polls without ever sleeping.")
print("- `backoff`: the agent's defaults: full-speed polling for `cpu.idle_spin_us` (200 us) after "
      "the last request, then sleeps between polls from 8 us doubling to `cpu.idle_sleep_max_us` "
      "(1000 us).\n")
print("| policy | idle agent cores | idle server cores | busy p50 | busy p99 | sparse p50 | "
      "sparse p99 | sparse max |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for p in policies:
    rs = [r for r in rounds if r["policy"] == p]
    print(f"| {p} | {fmt(med(r['idle_agent_cores'] for r in rs), 3)} "
          f"| {fmt(med(r['idle_server_cores'] for r in rs), 3)} "
          f"| {fmt(med(r['busy_rtt'].get('p50') for r in rs))} "
          f"| {fmt(med(r['busy_rtt'].get('p99') for r in rs))} "
          f"| {fmt(med(r['sparse_rtt'].get('p50') for r in rs))} "
          f"| {fmt(med(r['sparse_rtt'].get('p99') for r in rs))} "
          f"| {fmt(med(r['sparse_rtt'].get('max') for r in rs))} |")
print("\nEvery round (raw sockperf output and the processes' logs in `raw/`):\n")
print("| policy | round | idle agent cores | idle server cores | busy p50 | busy p99 | "
      "busy replies | sparse p50 | sparse p99 | sparse replies |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rounds:
    b, s = r["busy_rtt"], r["sparse_rtt"]
    print(f"| {r['policy']} | {r['round']} | {r['idle_agent_cores']:.3f} | "
          f"{r['idle_server_cores']:.3f} | {fmt(b.get('p50'))} | {fmt(b.get('p99'))} | "
          f"{b.get('received', '-')}/{b.get('sent', '-')} | {fmt(s.get('p50'))} | "
          f"{fmt(s.get('p99'))} | {s.get('received', '-')}/{s.get('sent', '-')} |")
