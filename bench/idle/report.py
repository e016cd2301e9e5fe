#!/usr/bin/env python3
"""The report of bench/idle/run.sh: per idle policy, the median over the rounds of the idle
agent's and server's cores and of sockperf's round-trip percentiles, busy and sparse, then every
round. Usage: report.py RAW_DIR COMMIT MACHINE DATE IDLE_S DURATION SPARSE_MPS"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import caracal_bench as cb  # noqa: E402

raw, commit, machine, date, idle_s, duration, sparse_mps = sys.argv[1:8]


def round_trips(path):
    """sockperf --full-rtt's round trips (us: p50, p99, max) and messages sent and received."""
    s = cb.sockperf(os.path.join(raw, path))
    return {"p50": s.get("p50_us"), "p99": s.get("p99_us"), "max": s.get("max_us"),
            "sent": s.get("sent", "-"), "received": s.get("received", "-")}


rounds = cb.read_jsonl(os.path.join(raw, "rounds.jsonl"))
for r in rounds:
    r["busy_rtt"], r["sparse_rtt"] = round_trips(r["busy"]), round_trips(r["sparse"])
policies = list(dict.fromkeys(r["policy"] for r in rounds))

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
print(cb.md_rule(8))
for p in policies:
    rs = cb.matching(rounds, policy=p)
    print(cb.md_row([p] + [cb.num(cb.median(r[k] for r in rs), 3)
                           for k in ("idle_agent_cores", "idle_server_cores")]
                    + [cb.num(cb.median(r[t][k] for r in rs)) for t, k in (
                        ("busy_rtt", "p50"), ("busy_rtt", "p99"), ("sparse_rtt", "p50"),
                        ("sparse_rtt", "p99"), ("sparse_rtt", "max"))]))
print("\nEvery round (raw sockperf output and the processes' logs in `raw/`):\n")
print("| policy | round | idle agent cores | idle server cores | busy p50 | busy p99 | "
      "busy replies | sparse p50 | sparse p99 | sparse replies |")
print(cb.md_rule(10))
for r in rounds:
    b, s = r["busy_rtt"], r["sparse_rtt"]
    print(f"| {r['policy']} | {r['round']} | {r['idle_agent_cores']:.3f} | "
          f"{r['idle_server_cores']:.3f} | {cb.num(b['p50'])} | {cb.num(b['p99'])} | "
          f"{b['received']}/{b['sent']} | {cb.num(s['p50'])} | "
          f"{cb.num(s['p99'])} | {s['received']}/{s['sent']} |")
