#!/usr/bin/env python3
"""The report of a bench/compare/run.sh instances run: RESULTS_DIR/instances.json and
instances.md.

    bench/compare/instances_report.py RESULTS_DIR

Per layout and protocol, each round's total throughput (the servers' together) and requests per
second per busy server CPU (the total over the servers' CPUs' busy time; the servers' process
cores where nothing was pinned), then their medians over the rounds. A layout of N servers of T
threads is set beside the one server of T threads and the one server of N x T threads where the
run has them: if N servers of T threads at once keep the one server of T threads' figure per CPU
while one server of N x T threads falls, what a request costs grows inside the server; if they
fall alike, it grows in what the servers share (the kernel, the machine).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import caracal_bench as cb  # noqa: E402


def load(results):
    raw, run, points = cb.load_run(results)
    for p in points:
        try:
            lg = cb.read_json(os.path.join(raw, p["json"]))
            p["throughput_rps"] = lg["throughput_rps"]
            p["counts"] = lg["counts"]
            p["p50_us"] = lg["latency"]["p50_ns"] / 1000
            p["p99_us"] = lg["latency"]["p99_ns"] / 1000
        except (OSError, ValueError, KeyError) as e:
            p["missing"] = f"{p['json']}: {e}"
    return run, points


def rounds_of(points):
    """{(layout, proto): {round: summary}} with every server's point of the round in it."""
    out = {}
    for p in points:
        out.setdefault((p["layout"], p["proto"]), {}).setdefault(p["round"], []).append(p)
    summary = {}
    for key, by_round in out.items():
        for rnd, pts in by_round.items():
            ok = all("throughput_rps" in p and p["loadgen_rc"] == 0 for p in pts)
            rps = sum(p.get("throughput_rps", 0) for p in pts)
            pinned = all(p["server_cpus_cores"] is not None for p in pts)
            busy = sum(p["server_cpus_cores"] if pinned else p["cpu_cores"] for p in pts)
            bad = sum(p.get("counts", {}).get("wrong", 0) + p.get("counts", {}).get("lost", 0)
                      + p.get("counts", {}).get("connection_errors", 0) for p in pts)
            summary.setdefault(key, {})[rnd] = {
                "ok": ok, "rps": rps, "busy_cpus": busy, "pinned": pinned,
                "per_cpu": rps / busy if busy > 0 else None, "bad_replies": bad,
                "per_server_rps": [p.get("throughput_rps")
                                   for p in sorted(pts, key=lambda q: q["server"])],
                "p99_us": max((p.get("p99_us", 0) for p in pts), default=None),
                # The probe's rate under this round's load over its rate on the idle machine.
                "probe": (pts[0]["probe_load"] / pts[0]["probe_idle"]
                          if pts[0].get("probe_load") and pts[0].get("probe_idle") else None),
            }
    return summary


def main():
    results = sys.argv[1]
    run, points = load(results)
    summary = rounds_of(points)
    layouts = run["params"]["layouts"].split()
    protos = run["params"]["protos"].split()
    rows = []
    for proto in protos:
        for layout in layouts:
            by_round = summary.get((layout, proto))
            if not by_round:
                continue
            n, t = (int(x) for x in layout.split("+")[0].split("/")[0].split("x"))
            ok = [s for s in by_round.values() if s["ok"]]
            rows.append({
                "layout": layout, "servers": n, "threads": t, "netns": "/ns" in layout,
                "median_probe": cb.median(s["probe"] for s in by_round.values()),
                "proto": proto, "rounds": [by_round[r] for r in sorted(by_round)],
                "median_rps": cb.median(s["rps"] for s in ok),
                "median_per_cpu": cb.median(s["per_cpu"] for s in ok),
                "median_busy_cpus": cb.median(s["busy_cpus"] for s in ok),
                "failed_rounds": len(by_round) - len(ok),
                "bad_replies": sum(s["bad_replies"] for s in by_round.values()),
            })
    cb.write_json(os.path.join(results, "instances.json"),
                  {"run": run, "rows": rows, "points": points})

    pinned = all(s["pinned"] for r in rows for s in r["rounds"])
    busy_what = ("how busy the servers' CPUs were (/proc/stat: their processes and the kernel's "
                 "work there)" if pinned else "the servers' process cores (nothing pinned)")
    lines = [
        "# One server of many threads against several of few threads, at once",
        "",
        f"Machine: {run['cpu']}, {run['cpus']} CPUs"
        + (f" ({run['physical_cores']} physical cores)" if run["physical_cores"] else "")
        + f", kernel {run['kernel']}; accelerator {run['accelerator']}"
        + (f" ({run['gpus']} x {run['gpu']})" if run["gpus"] else "") + f". Commit {run['commit']}, "
        f"{run['date']}. matvec at {run['params']['size']} B, {run['params']['conns_per_thread']} "
        f"connections x {run['params']['sat_window']} in flight per I/O thread, an agent of "
        f"{run['params']['agent_queues']} queues per {run['params']['threads_per_agent']} threads, "
        f"{run['params']['duration_s']} s per point, {run['params']['rounds']} rounds. NxT: N "
        "servers of T I/O threads loaded at once; /ns: each in a network namespace of its own. "
        f"Per CPU: the servers' total throughput over {busy_what}. +spinK, +streamK: K more "
        "cores busy meanwhile, in a loop in registers or writing 256 MiB buffers. Probe: the rate of "
        "a loop of fixed work on a core of its own during the points over its rate on the idle "
        "machine (median of the rounds).",
        "",
        "| proto | layout | kreq/s (median) | busy CPUs | kreq/s per CPU (median) | per CPU, each round "
        "| per CPU against 1xT | against 1x(NxT) | probe |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    by = {(r["proto"], r["layout"]): r for r in rows}
    for r in rows:
        one_t = by.get((r["proto"], f"1x{r['threads']}"))
        one_all = by.get((r["proto"], f"1x{r['servers'] * r['threads']}"))

        def ratio(ref):
            if not ref or ref is r or not ref["median_per_cpu"] or not r["median_per_cpu"]:
                return ""
            return f"{r['median_per_cpu'] / ref['median_per_cpu']:.2f}x"

        each = ", ".join(cb.rps_as_krps(s["per_cpu"], 0) + ("" if s["ok"] else " (failed)")
                         for s in r["rounds"])
        bad = f" ({r['bad_replies']} wrong or lost)" if r["bad_replies"] else ""
        lines.append(cb.md_row([r["proto"], r["layout"], cb.rps_as_krps(r["median_rps"], 0) + bad,
                                cb.num(r["median_busy_cpus"]),
                                cb.rps_as_krps(r["median_per_cpu"], 0), each, ratio(one_t),
                                ratio(one_all), cb.num(r["median_probe"], 2)]))
    lines += ["", "Raw data: `raw/` (loadgen JSON per server and round, configs, logs, "
              "points.jsonl)."]
    cb.write_text(os.path.join(results, "instances.md"), "\n".join(lines) + "\n")
    failed = sum(r["failed_rounds"] for r in rows) + sum(r["bad_replies"] > 0 for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
