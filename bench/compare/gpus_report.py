#!/usr/bin/env python3
"""The report of a bench/compare/gpus.sh run, and the metric scrapes the script takes as it runs.

    gpus_report.py RESULTS_DIR                     gpus.json, gpus.md and, with matplotlib, plots
    gpus_report.py --page URL                      the metrics page, now
    gpus_report.py --scrape URL|FILE               "agent<TAB>answered" lines, now or from a
                                                   page that --page saved
    gpus_report.py --sample URL OUT INTERVAL_MS    the same every INTERVAL_MS ms as JSON lines
                                                   ({"t": unix seconds, "answered": {...}}) into
                                                   OUT, until SIGTERM

Answered requests come from snic_server's caracal_queue_answered_requests (one series per queue,
labelled with its agent), summed per agent.

From RESULTS_DIR/raw/ (run.json, points.jsonl, each point's loadgen JSON, loss-samples.jsonl,
loss-killed-at.txt) it writes RESULTS_DIR/gpus.json (the run and every point with its loadgen
figures) and RESULTS_DIR/gpus.md: throughput against the number of accelerators for each server
and protocol, with the speedup over one; latency against offered load; the requests each agent
served under round_robin and least_loaded with one agent slowed; and throughput over time across
the loss of an agent. With matplotlib: gpus-throughput.png, gpus-latency.png, gpus-loss.png.
"""
import json
import os
import re
import signal
import sys
import time
import urllib.request

AGENT_RE = re.compile(r'agent="([^"]*)"')


def page(source):
    """snic_server's metrics page: fetched from an http URL, or read from a file."""
    if not source.startswith("http"):
        return open(source).read()
    with urllib.request.urlopen(source, timeout=5) as r:
        return r.read().decode()


def scrape(source):
    text = page(source)
    out = {}
    for line in text.splitlines():
        if not line.startswith("caracal_queue_answered_requests{"):
            continue
        m = AGENT_RE.search(line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0) + int(float(line.rsplit(" ", 1)[1]))
    return out


def sample(url, path, interval_ms):
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with open(path, "w") as f:
        while not stop:
            t = time.time()
            try:
                answered = scrape(url)
            except OSError:
                answered = None  # the server is busy or gone; the gap shows in the series
            f.write(json.dumps({"t": t, "answered": answered}) + "\n")
            f.flush()
            time.sleep(max(0.0, interval_ms / 1000 - (time.time() - t)))


def load(results):
    raw = os.path.join(results, "raw")
    run = json.load(open(os.path.join(raw, "run.json")))
    points = []
    for line in open(os.path.join(raw, "points.jsonl")):
        if not line.strip():
            continue
        p = json.loads(line)
        path = os.path.join(raw, p["json"])
        if os.path.exists(path):
            lg = json.load(open(path))
            p["throughput_rps"] = lg.get("throughput_rps")
            p["offered_rps"] = lg.get("offered_rps")
            p["latency"] = {k: v for k, v in (lg.get("latency") or {}).items() if k != "cdf"}
            p["counts"] = lg.get("counts")
            p["client_cpu"] = lg.get("client_cpu")
            if "timeline" in lg:
                p["timeline"] = lg["timeline"]
        means = histogram_means(os.path.join(raw, p["json"][:-len(".json")]))
        if means:
            p["server_means_us"] = means
        points.append(p)
    run["points"] = points
    loss = {}
    samples = os.path.join(raw, "loss-samples.jsonl")
    if os.path.exists(samples):
        loss["samples"] = [json.loads(l) for l in open(samples) if l.strip()]
    killed = os.path.join(raw, "loss-killed-at.txt")
    if os.path.exists(killed):
        loss["killed_at_unix_s"] = float(open(killed).read().strip())
    if loss:
        run["loss"] = loss
    return run


# The histograms of snic_server whose means over a point the report gives, by short name.
MEANS = {"service_latency": "caracal_service_latency_seconds",
         "destination_call": "caracal_destination_call_seconds"}


def histogram_sums(path):
    """{family: (sum, count)} of MEANS' histograms in a metrics page, summed over labels."""
    out = {}
    for line in open(path):
        for family in MEANS.values():
            for suffix, i in (("_sum", 0), ("_count", 1)):
                if line.startswith(family + suffix + "{") or line.startswith(family + suffix + " "):
                    v = list(out.get(family, (0.0, 0.0)))
                    v[i] += float(line.rsplit(" ", 1)[1])
                    out[family] = tuple(v)
    return out


def histogram_means(stem):
    """Means in us over a point of MEANS' histograms, from STEM-metrics-before.txt and
    STEM-metrics.txt (snic_server's pages before and after it); {} without both."""
    before, after = stem + "-metrics-before.txt", stem + "-metrics.txt"
    if not (os.path.exists(before) and os.path.exists(after)):
        return {}
    b, a = histogram_sums(before), histogram_sums(after)
    out = {}
    for short, family in MEANS.items():
        s = a.get(family, (0, 0))[0] - b.get(family, (0, 0))[0]
        n = a.get(family, (0, 0))[1] - b.get(family, (0, 0))[1]
        if n > 0:
            out[short] = s / n * 1e6
    return out


def us(ns):
    return f"{ns / 1000:.0f}" if ns else "-"


def krps(v):
    return f"{v / 1000:,.1f}" if v is not None else "-"


def find(points, **kw):
    return [p for p in points if all(p.get(k) == v for k, v in kw.items())]


def workload(run):
    """The handler and its work per request, as the tables and plots name it."""
    p = run["params"]
    if p.get("handler", "matvec") == "face":
        return f"face verification, {p['face_persons']} references in memcached"
    return f"matvec, {p['rounds']} rounds"


def pinning(params):
    """Where gpus.sh kept the processes (SERVER_CPUS, CLIENT_CPUS, MEMCACHED_CPUS), if it did."""
    kept = [f"{who} on CPUs {params[key]}" for who, key in
            (("the servers and agents", "server_cpus"), ("the client", "client_cpus"),
             ("memcached", "memcached_cpus")) if params.get(key)]
    return (" Kept (taskset): " + ", ".join(kept) + ".") if kept else ""


def scaling_section(run, md):
    pts = run["points"]
    counts = sorted({p["accelerators"] for p in find(pts, experiment="scaling")})
    if not counts:
        return
    kind = "CPU agents" if run["cpu_only"] else "GPUs"
    md.append(f"## Throughput against {kind}\n")
    md.append(f"{workload(run)}, {run['params']['size']} B requests; closed loop, "
              f"{run['params']['sat_connections']} connections x "
              f"{run['params']['sat_window']} in flight. k req/s (speedup over 1; server cores; "
              "p50 / p99 us)." + pinning(run["params"]) + "\n")
    head = "| server | proto | " + " | ".join(f"{n} {kind}" for n in counts) + " |"
    md.append(head)
    md.append("|" + " --- |" * (2 + len(counts)))
    run["scaling"] = []
    for server in run["servers"].split():
        for proto in run["params"]["protos"].split():
            cells = []
            base = None
            for n in counts:
                f = find(pts, experiment="scaling", server=server, accelerators=n, proto=proto,
                         kind="saturation")
                if not f or f[0].get("throughput_rps") is None:
                    cells.append("-")
                    continue
                p = f[0]
                rps = p["throughput_rps"]
                base = rps if n == counts[0] and base is None else base
                speedup = rps / base if base else None
                lat = p.get("latency") or {}
                cells.append(f"{krps(rps)} ({speedup:.2f}x; {p['cpu_cores']:.1f}; "
                             f"{us(lat.get('p50_ns'))} / {us(lat.get('p99_ns'))})"
                             if speedup else krps(rps))
                run["scaling"].append({"server": server, "proto": proto, "accelerators": n,
                                       "rps": rps, "speedup": speedup,
                                       "cpu_cores": p["cpu_cores"]})
            md.append(f"| {server} | {proto} | " + " | ".join(cells) + " |")
    md.append("")
    # Caracal over the host-centric server at each count.
    servers = run["servers"].split()
    if "caracal" in servers and "host_centric" in servers:
        md.append("Caracal over host_centric:\n")
        md.append("| proto | " + " | ".join(f"{n} {kind}" for n in counts) + " |")
        md.append("|" + " --- |" * (1 + len(counts)))
        for proto in run["params"]["protos"].split():
            cells = []
            for n in counts:
                a = find(pts, experiment="scaling", server="caracal", accelerators=n, proto=proto,
                         kind="saturation")
                b = find(pts, experiment="scaling", server="host_centric", accelerators=n,
                         proto=proto, kind="saturation")
                if a and b and a[0].get("throughput_rps") and b[0].get("throughput_rps"):
                    cells.append(f"{a[0]['throughput_rps'] / b[0]['throughput_rps']:.2f}x")
                else:
                    cells.append("-")
            md.append(f"| {proto} | " + " | ".join(cells) + " |")
        md.append("")

    opens = [p for p in find(pts, experiment="scaling") if p["kind"].startswith("open-")]
    if opens:
        md.append("## Latency against load (UDP, open loop)\n")
        md.append("| server | accelerators | offered k req/s | served k req/s | p50 us | p99 us "
                  "| p99.9 us | lost |")
        md.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for p in sorted(opens, key=lambda p: (p["server"], p["accelerators"],
                                              p.get("offered_rps") or 0)):
            lat = p.get("latency") or {}
            md.append(f"| {p['server']} | {p['accelerators']} | {krps(p.get('offered_rps'))} | "
                      f"{krps(p.get('throughput_rps'))} | {us(lat.get('p50_ns'))} | "
                      f"{us(lat.get('p99_ns'))} | {us(lat.get('p999_ns'))} | "
                      f"{(p.get('counts') or {}).get('lost', '-')} |")
        md.append("")


def machine_section(run, md):
    """The machine's CPUs at each saturation point: the server's, memcached's (face), the
    client's and the whole machine's, so that a point the machine's CPUs held shows as such;
    then, where snic_server's metrics were kept, its means over each point."""
    pts = [p for p in find(run["points"], experiment="scaling", kind="saturation")
           if p.get("machine_cores") is not None]
    if not pts:
        return
    face = any(p.get("memcached_cores") is not None for p in pts)
    md.append("## Where the machine's CPUs went at saturation\n")
    md.append(f"Cores over each point (the server's processes and the whole machine from "
              f"`/proc`, the client's threads from caracal_loadgen over its measured window); "
              f"the machine has {run['online_cpus']} CPUs.\n")
    md.append("| server | proto | accelerators | k req/s | server | "
              + ("memcached | " if face else "") + "client | machine | machine idle |")
    md.append("|" + " --- |" * (8 + face))
    for p in sorted(pts, key=lambda p: (p["server"], p["proto"], p["accelerators"])):
        client = (p.get("client_cpu") or {}).get("cores")
        mc = p.get("memcached_cores")
        md.append(f"| {p['server']} | {p['proto']} | {p['accelerators']} | "
                  f"{krps(p.get('throughput_rps'))} | {p['cpu_cores']:.1f} | "
                  + (f"{mc:.1f} | " if face else "")
                  + (f"{client:.1f}" if client is not None else "-")
                  + f" | {p['machine_cores']:.1f} | "
                  f"{run['online_cpus'] - p['machine_cores']:.1f} |")
    md.append("")
    inside = [p for p in pts if p.get("server_means_us")]
    if inside:
        md.append("Inside snic_server over each point (means of its histograms): a request from "
                  "dispatch to its answer (`caracal_service_latency_seconds`) and a handler's "
                  "call to a destination (`caracal_destination_call_seconds`), us.\n")
        md.append("| server | proto | accelerators | request in the server | destination call |")
        md.append("| --- | --- | --- | --- | --- |")
        for p in sorted(inside, key=lambda p: (p["server"], p["proto"], p["accelerators"])):
            m = p["server_means_us"]
            cells = [f"{m[k]:.0f}" if k in m else "-" for k in ("service_latency",
                                                                 "destination_call")]
            md.append(f"| {p['server']} | {p['proto']} | {p['accelerators']} | "
                      + " | ".join(cells) + " |")
        md.append("")


def unequal_section(run, md):
    pts = find(run["points"], experiment="unequal")
    if not pts:
        return
    md.append("## Two agents of unequal speed\n")
    md.append(f"The second agent (acc1) waits {run['params']['slow_delay_us']} us more per "
              "request (`--delay-us`, the answer unchanged). UDP saturation; requests each agent "
              "answered over the point (warm-up included), from snic_server's "
              "`caracal_queue_answered_requests`.\n")
    md.append("| policy | k req/s | acc0 answered | acc1 answered | acc0 share |")
    md.append("| --- | --- | --- | --- | --- |")
    run["unequal"] = []
    for p in pts:
        a = p.get("answered_by_agent") or {}
        a0, a1 = a.get("acc0", 0), a.get("acc1", 0)
        share = a0 / (a0 + a1) if a0 + a1 else None
        md.append(f"| {p['policy']} | {krps(p.get('throughput_rps'))} | {a0:,} | {a1:,} | "
                  f"{share:.1%} |" if share is not None else f"| {p['policy']} | - | - | - | - |")
        run["unequal"].append({"policy": p["policy"], "rps": p.get("throughput_rps"),
                               "answered": a, "fast_share": share})
    md.append("")


def loss_timeline(run):
    """Per interval: the loadgen's replies and error replies, and each agent's answered requests
    (from the samples), as rates, against seconds since the load started."""
    pts = find(run["points"], experiment="loss")
    if not pts or "timeline" not in pts[0]:
        return None
    p = pts[0]
    tl = p["timeline"]
    step = tl["interval_ms"] / 1000
    start = tl["start_unix_s"]
    rows = []
    for k, (ok, err) in enumerate(zip(tl["replies"], tl["error_replies"])):
        rows.append({"t": k * step, "replies_rps": ok / step, "error_replies": err})
    samples = [s for s in (run.get("loss") or {}).get("samples", []) if s.get("answered")]
    agents = sorted({a for s in samples for a in s["answered"]})
    series = {a: [] for a in agents}  # (t, rate)
    for prev, cur in zip(samples, samples[1:]):
        dt = cur["t"] - prev["t"]
        if dt <= 0:
            continue
        for a in agents:
            if a in cur["answered"]:
                d = cur["answered"][a] - prev["answered"].get(a, 0)
                series[a].append((cur["t"] - start, max(d, 0) / dt))
            else:
                series[a].append((cur["t"] - start, 0.0))  # its series left with its region
    killed = (run.get("loss") or {}).get("killed_at_unix_s")
    return {"rows": rows, "agents": series,
            "killed_at_s": killed - start if killed else None, "point": p}


def loss_section(run, md):
    lt = loss_timeline(run)
    if lt is None:
        return
    p = lt["point"]
    c = p.get("counts") or {}
    k = lt["killed_at_s"]
    md.append("## An agent lost under load\n")
    md.append(f"{run['params']['loss_agents']} agents under closed-loop TCP load "
              f"({run['params']['sat_connections']} connections x {run['params']['sat_window']} "
              f"in flight) for {run['params']['loss_duration_s']} s; the last one killed with "
              f"SIGKILL at {k:.2f} s." if k is not None else "(the kill time was not recorded)")
    md.append("")
    md.append(f"Requests sent {c.get('sent', 0):,}: right replies {c.get('replies', 0):,}, error "
              f"replies {c.get('error_replies', 0):,}, wrong {c.get('wrong', 0)}, unanswered "
              f"{c.get('unanswered', 0)}, broken connections {c.get('connection_errors', 0)}; "
              f"loadgen exit {p['loadgen_rc']}.\n")
    summary = {"sent": c.get("sent"), "replies": c.get("replies"),
               "error_replies": c.get("error_replies"), "wrong": c.get("wrong"),
               "unanswered": c.get("unanswered"), "connection_errors": c.get("connection_errors"),
               "killed_at_s": k}
    if k is not None:
        # Mean rates before the kill (after the first intervals) and after it (from a little past
        # the kill to the end of the load), per agent and in total.
        def mean(vals):
            return sum(vals) / len(vals) if vals else None
        end = run["params"]["loss_duration_s"]
        step = lt_step(lt)
        before_total = mean([r["replies_rps"] for r in lt["rows"] if 0.2 <= r["t"] < k - step])
        after_total = mean([r["replies_rps"] for r in lt["rows"]
                            if k + 2 * step <= r["t"] <= end - step])
        md.append("| | before the kill, k req/s | after it, k req/s |")
        md.append("| --- | --- | --- |")
        md.append(f"| all replies (loadgen) | {krps(before_total)} | {krps(after_total)} |")
        summary["before_rps"], summary["after_rps"] = before_total, after_total
        summary["agents"] = {}
        for a, s in lt["agents"].items():
            # A sample's rate covers the interval that ends at its t.
            b = mean([v for t, v in s if 0.2 + step <= t < k])
            af = mean([v for t, v in s if k + 2 * step <= t - step and t <= end])
            md.append(f"| {a} (answered) | {krps(b)} | {krps(af)} |")
            summary["agents"][a] = {"before_rps": b, "after_rps": af}
        md.append("")
    md.append(f"Every {run['params']['sample_ms']} ms, from the start of the load: right replies "
              "(loadgen) and each agent's answered requests in k req/s, error replies as counted."
              "\n")
    agents = list(lt["agents"])
    md.append("| t s | replies | error replies | " + " | ".join(agents) + " |")
    md.append("|" + " --- |" * (3 + len(agents)))
    for r in lt["rows"]:
        cells = []
        for a in agents:
            near = [v for t, v in lt["agents"][a] if abs(t - (r["t"] + lt_step(lt))) < lt_step(lt) / 2]
            cells.append(krps(near[0]) if near else "")
        mark = " (kill)" if k is not None and r["t"] <= k < r["t"] + lt_step(lt) else ""
        md.append(f"| {r['t']:.1f}{mark} | {krps(r['replies_rps'])} | "
                  f"{r['error_replies']} | " + " | ".join(cells) + " |")
    md.append("")
    run["loss_summary"] = summary
    run["loss_timeline"] = {"rows": lt["rows"],
                            "agents": {a: s for a, s in lt["agents"].items()}}


def lt_step(lt):
    rows = lt["rows"]
    return rows[1]["t"] - rows[0]["t"] if len(rows) > 1 else 0.1


def plots(run, results):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("gpus_report.py: no matplotlib; no plots", file=sys.stderr)
        return
    kind = "CPU agents" if run["cpu_only"] else "GPUs"
    sc = run.get("scaling") or []
    if sc:
        fig, ax = plt.subplots(figsize=(6, 4))
        for server in run["servers"].split():
            for proto in run["params"]["protos"].split():
                xs = [r["accelerators"] for r in sc if r["server"] == server and r["proto"] == proto]
                ys = [r["rps"] / 1000 for r in sc if r["server"] == server and r["proto"] == proto]
                if xs:
                    ax.plot(xs, ys, marker="o", label=f"{server} {proto}")
        ax.set_xlabel(kind)
        ax.set_ylabel("k req/s at saturation")
        ax.set_xticks(sorted({r["accelerators"] for r in sc}))
        ax.set_ylim(bottom=0)
        ax.set_title(f"{workload(run)}, {run['params']['size']} B")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(results, "gpus-throughput.png"), dpi=120)
        plt.close(fig)
    opens = [p for p in find(run["points"], experiment="scaling") if p["kind"].startswith("open-")]
    if opens:
        fig, ax = plt.subplots(figsize=(6, 4))
        groups = sorted({(p["server"], p["accelerators"]) for p in opens})
        for server, n in groups:
            g = sorted([p for p in opens if p["server"] == server and p["accelerators"] == n],
                       key=lambda p: p.get("offered_rps") or 0)
            xs = [(p.get("offered_rps") or 0) / 1000 for p in g]
            ax.plot(xs, [(p["latency"].get("p50_ns") or 0) / 1000 for p in g], marker="o",
                    label=f"{server}, {n} {kind}, p50")
            ax.plot(xs, [(p["latency"].get("p99_ns") or 0) / 1000 for p in g], marker="x",
                    linestyle="--", label=f"{server}, {n} {kind}, p99")
        ax.set_xlabel("offered k req/s (UDP, open loop)")
        ax.set_ylabel("latency us")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(results, "gpus-latency.png"), dpi=120)
        plt.close(fig)
    lt = run.get("loss_timeline")
    if lt:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([r["t"] for r in lt["rows"]], [r["replies_rps"] / 1000 for r in lt["rows"]],
                label="all replies (loadgen)")
        step = lt["rows"][1]["t"] - lt["rows"][0]["t"] if len(lt["rows"]) > 1 else 0.1
        ax.plot([r["t"] for r in lt["rows"]],
                [r["error_replies"] / step / 1000 for r in lt["rows"]], label="error replies")
        for a, s in lt["agents"].items():
            ax.plot([t for t, _ in s], [v / 1000 for _, v in s], linestyle="--",
                    label=f"{a} answered")
        k = (run.get("loss_summary") or {}).get("killed_at_s")
        if k is not None:
            ax.axvline(k, color="red", alpha=0.5, label="SIGKILL")
        ax.set_xlabel("s since the load started")
        ax.set_ylabel("k req/s")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(results, "gpus-loss.png"), dpi=120)
        plt.close(fig)


def report(results):
    run = load(results)
    md = ["# One server, every accelerator: gpus.sh", ""]
    md.append(f"{run['date_utc']}, commit {run['commit']}, {run['cpu_model']} "
              f"({run['online_cpus']} CPUs), {run['kernel']}; accelerators: "
              + (f"{run['accelerators']} CPU agents (a CPU-only smoke run: measures nothing)"
                 if run["cpu_only"] else "; ".join(run["gpus"])) + ".")
    p = run["params"]
    md.append(f"snic_server io_threads {p['threads']}, engine_threads {p['engine_threads']}, "
              f"dispatch {p['dispatch']}; agents: {p['agent_queues']} queues each, burst "
              f"{p['gpu_burst']}; host_centric: batches of {p['batch']} or "
              f"{p['batch_timeout_us']} us per GPU; points {p['duration_s']} s after "
              f"{p['warmup_s']} s. Failed points: {run['failed_points']}.")
    md.append("")
    scaling_section(run, md)
    machine_section(run, md)
    unequal_section(run, md)
    loss_section(run, md)
    with open(os.path.join(results, "gpus.json"), "w") as f:
        json.dump(run, f, indent=1)
    with open(os.path.join(results, "gpus.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    plots(run, results)
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "--page":
        sys.stdout.write(page(argv[2]))
        return 0
    if len(argv) == 3 and argv[1] == "--scrape":
        for agent, n in sorted(scrape(argv[2]).items()):
            print(f"{agent}\t{n}")
        return 0
    if len(argv) == 5 and argv[1] == "--sample":
        sample(argv[2], argv[3], int(argv[4]))
        return 0
    if len(argv) == 2:
        return report(argv[1])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
