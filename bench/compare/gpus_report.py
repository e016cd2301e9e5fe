#!/usr/bin/env python3
"""The report of a bench/compare/run.sh gpus run, and the metric scrapes the driver takes as it
runs.

    gpus_report.py RESULTS_DIR                     gpus.json, gpus.md and, with matplotlib, plots
    gpus_report.py --scrape URL|FILE               "agent<TAB>answered" lines, now or from a
                                                   saved page
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
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import caracal_bench as cb  # noqa: E402


def scrape(source):
    out = {}
    for name, labels, v in cb.metric_samples(cb.metrics_page(source).splitlines()):
        if name == "caracal_queue_answered_requests" and "agent" in labels:
            out[labels["agent"]] = out.get(labels["agent"], 0) + int(v)
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
    raw, run, points = cb.load_run(results)
    for p in points:
        path = os.path.join(raw, p["json"])
        if os.path.exists(path):
            lg = cb.read_json(path)
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
    run["points"] = points
    loss = {}
    samples = os.path.join(raw, "loss-samples.jsonl")
    if os.path.exists(samples):
        loss["samples"] = cb.read_jsonl(samples)
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
    with open(path) as f:
        for name, _, v in cb.metric_samples(f):
            for family in MEANS.values():
                s, n = out.get(family, (0.0, 0.0))
                if name == family + "_sum":
                    out[family] = (s + v, n)
                elif name == family + "_count":
                    out[family] = (s, n + v)
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


def whole_us(ns):
    """A latency in whole us; "-" for none (0 too)."""
    return cb.ns_as_us(ns or None, 0)


def workload(run):
    """The handler and its work per request, as the tables and plots name it."""
    p = run["params"]
    if p.get("handler", "matvec") == "face":
        return f"face verification, {p['face_persons']} references in memcached"
    return f"matvec, {p['rounds']} rounds"


def pinning(params):
    """Where run.sh kept the processes (SERVER_CPUS, CLIENT_CPUS, MEMCACHED_CPUS), if it did."""
    kept = [f"{who} on CPUs {params[key]}" for who, key in
            (("the servers and agents", "server_cpus"), ("the client", "client_cpus"),
             ("memcached", "memcached_cpus")) if params.get(key)]
    return (" Kept (taskset): " + ", ".join(kept) + ".") if kept else ""


def by_point(pts):
    return sorted(pts, key=lambda p: (p["server"], p["proto"], p["accelerators"]))


def scaling_section(run, md):
    pts = cb.matching(run["points"], experiment="scaling")
    counts = sorted({p["accelerators"] for p in pts})
    if not counts:
        return
    kind = "CPU agents" if run["cpu_only"] else "GPUs"
    servers, protos = run["servers"].split(), run["params"]["protos"].split()
    rows, run["scaling"] = [], []
    for server in servers:
        for proto in protos:
            cells = []
            base = None
            for n in counts:
                p = cb.first(pts, server=server, accelerators=n, proto=proto, kind="saturation")
                if not p or p.get("throughput_rps") is None:
                    cells.append("-")
                    continue
                rps = p["throughput_rps"]
                base = rps if n == counts[0] and base is None else base
                speedup = rps / base if base else None
                lat = p.get("latency") or {}
                cells.append(f"{cb.rps_as_krps(rps)} ({speedup:.2f}x; {p['cpu_cores']:.1f}; "
                             f"{whole_us(lat.get('p50_ns'))} / {whole_us(lat.get('p99_ns'))})"
                             if speedup else cb.rps_as_krps(rps))
                run["scaling"].append({"server": server, "proto": proto, "accelerators": n,
                                       "rps": rps, "speedup": speedup,
                                       "cpu_cores": p["cpu_cores"]})
            rows.append([server, proto] + cells)
    md += cb.md_section(f"Throughput against {kind}", ["server", "proto"]
                        + [f"{n} {kind}" for n in counts], rows,
                        f"{workload(run)}, {run['params']['size']} B requests; closed loop, "
                        f"{run['params']['sat_connections']} connections x "
                        f"{run['params']['sat_window']} in flight. k req/s (speedup over 1; "
                        "server cores; p50 / p99 us)." + pinning(run["params"]))
    # Caracal over the host-centric server at each count.
    if "caracal" in servers and "host_centric" in servers:
        md.append("Caracal over host_centric:\n")
        md += cb.md_table(["proto"] + [f"{n} {kind}" for n in counts])
        for proto in protos:
            cells = []
            for n in counts:
                a, b = (cb.first(pts, server=s, accelerators=n, proto=proto, kind="saturation")
                        for s in ("caracal", "host_centric"))
                cells.append(f"{a['throughput_rps'] / b['throughput_rps']:.2f}x" if a and b and
                             a.get("throughput_rps") and b.get("throughput_rps") else "-")
            md.append(cb.md_row([proto] + cells))
        md.append("")

    opens = [p for p in pts if p["kind"].startswith("open-")]
    if opens:
        md += cb.md_section(
            "Latency against load (UDP, open loop)",
            ["server", "accelerators", "offered k req/s", "served k req/s", "p50 us", "p99 us",
             "p99.9 us", "lost"],
            [[p["server"], str(p["accelerators"]), cb.rps_as_krps(p.get("offered_rps")),
              cb.rps_as_krps(p.get("throughput_rps"))]
             + [whole_us((p.get("latency") or {}).get(k)) for k in ("p50_ns", "p99_ns", "p999_ns")]
             + [str((p.get("counts") or {}).get("lost", "-"))]
             for p in sorted(opens, key=lambda p: (p["server"], p["accelerators"],
                                                   p.get("offered_rps") or 0))])


def machine_section(run, md):
    """The machine's CPUs at each saturation point: the server's, memcached's (face), the
    client's and the whole machine's, so that a point the machine's CPUs held shows as such;
    then, where snic_server's metrics were kept, its means over each point."""
    pts = [p for p in cb.matching(run["points"], experiment="scaling", kind="saturation")
           if p.get("machine_cores") is not None]
    if not pts:
        return
    face = any(p.get("memcached_cores") is not None for p in pts)
    md += cb.md_section(
        "Where the machine's CPUs went at saturation",
        ["server", "proto", "accelerators", "k req/s", "server"] + ["memcached"] * face
        + ["client", "machine", "machine idle"],
        [[p["server"], p["proto"], str(p["accelerators"]), cb.rps_as_krps(p.get("throughput_rps")),
          f"{p['cpu_cores']:.1f}"] + ([f"{p.get('memcached_cores'):.1f}"] if face else [])
         + [cb.num((p.get("client_cpu") or {}).get("cores")), f"{p['machine_cores']:.1f}",
            f"{run['online_cpus'] - p['machine_cores']:.1f}"] for p in by_point(pts)],
        "Cores over each point (the server's processes and the whole machine from `/proc`, the "
        "client's threads from caracal_loadgen over its measured window); the machine has "
        f"{run['online_cpus']} CPUs.")
    inside = [p for p in pts if p.get("server_means_us")]
    if inside:
        md.append("Inside snic_server over each point (means of its histograms): a request from "
                  "dispatch to its answer (`caracal_service_latency_seconds`) and a handler's "
                  "call to a destination (`caracal_destination_call_seconds`), us.\n")
        md += cb.md_table(["server", "proto", "accelerators", "request in the server",
                           "destination call"])
        for p in by_point(inside):
            m = p["server_means_us"]
            md.append(cb.md_row([p["server"], p["proto"], str(p["accelerators"])]
                                + [cb.num(m.get(k), 0) for k in MEANS]))
        md.append("")


def unequal_section(run, md):
    pts = cb.matching(run["points"], experiment="unequal")
    if not pts:
        return
    rows, run["unequal"] = [], []
    for p in pts:
        a = p.get("answered_by_agent") or {}
        a0, a1 = a.get("acc0", 0), a.get("acc1", 0)
        share = a0 / (a0 + a1) if a0 + a1 else None
        rows.append([p["policy"], cb.rps_as_krps(p.get("throughput_rps")), f"{a0:,}", f"{a1:,}",
                     f"{share:.1%}"] if share is not None else [p["policy"]] + ["-"] * 4)
        run["unequal"].append({"policy": p["policy"], "rps": p.get("throughput_rps"),
                               "answered": a, "fast_share": share})
    md += cb.md_section(
        "Two agents of unequal speed",
        ["policy", "k req/s", "acc0 answered", "acc1 answered", "acc0 share"], rows,
        f"The second agent (acc1) waits {run['params']['slow_delay_us']} us more per request "
        "(`--delay-us`, the answer unchanged). UDP saturation; requests each agent answered over "
        "the point (warm-up included), from snic_server's `caracal_queue_answered_requests`.")


def loss_timeline(run):
    """Per interval: the loadgen's replies and error replies, and each agent's answered requests
    (from the samples), as rates, against seconds since the load started."""
    pts = cb.matching(run["points"], experiment="loss")
    if not pts or "timeline" not in pts[0]:
        return None
    p = pts[0]
    tl = p["timeline"]
    step = tl["interval_ms"] / 1000
    start = tl["start_unix_s"]
    rows = [{"t": k * step, "replies_rps": ok / step, "error_replies": err}
            for k, (ok, err) in enumerate(zip(tl["replies"], tl["error_replies"]))]
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
    prm = run["params"]
    md += ["## An agent lost under load\n",
           f"{prm['loss_agents']} agents under closed-loop TCP load ({prm['sat_connections']} "
           f"connections x {prm['sat_window']} in flight) for {prm['loss_duration_s']} s; the "
           f"last one killed with SIGKILL at {k:.2f} s." if k is not None else
           "(the kill time was not recorded)", "",
           f"Requests sent {c.get('sent', 0):,}: right replies {c.get('replies', 0):,}, error "
           f"replies {c.get('error_replies', 0):,}, wrong {c.get('wrong', 0)}, unanswered "
           f"{c.get('unanswered', 0)}, broken connections {c.get('connection_errors', 0)}; "
           f"loadgen exit {p['loadgen_rc']}.\n"]
    summary = {"sent": c.get("sent"), "replies": c.get("replies"),
               "error_replies": c.get("error_replies"), "wrong": c.get("wrong"),
               "unanswered": c.get("unanswered"), "connection_errors": c.get("connection_errors"),
               "killed_at_s": k}
    if k is not None:
        # Mean rates before the kill (after the first intervals) and after it (from a little past
        # the kill to the end of the load), per agent and in total.
        def mean(vals):
            return sum(vals) / len(vals) if vals else None
        end = prm["loss_duration_s"]
        step = lt_step(lt)
        before_total = mean([r["replies_rps"] for r in lt["rows"] if 0.2 <= r["t"] < k - step])
        after_total = mean([r["replies_rps"] for r in lt["rows"]
                            if k + 2 * step <= r["t"] <= end - step])
        md += ["| | before the kill, k req/s | after it, k req/s |", cb.md_rule(3),
               cb.md_row(["all replies (loadgen)", cb.rps_as_krps(before_total),
                          cb.rps_as_krps(after_total)])]
        summary["before_rps"], summary["after_rps"] = before_total, after_total
        summary["agents"] = {}
        for a, s in lt["agents"].items():
            # A sample's rate covers the interval that ends at its t.
            b = mean([v for t, v in s if 0.2 + step <= t < k])
            af = mean([v for t, v in s if k + 2 * step <= t - step and t <= end])
            md.append(cb.md_row([f"{a} (answered)", cb.rps_as_krps(b), cb.rps_as_krps(af)]))
            summary["agents"][a] = {"before_rps": b, "after_rps": af}
        md.append("")
    md.append(f"Every {run['params']['sample_ms']} ms, from the start of the load: right replies "
              "(loadgen) and each agent's answered requests in k req/s, error replies as counted."
              "\n")
    agents = list(lt["agents"])
    # The agents' cells as one (a run without agent samples has an empty one).
    md += [cb.md_row(["t s", "replies", "error replies", " | ".join(agents)]),
           cb.md_rule(3 + len(agents))]
    step = lt_step(lt)
    for r in lt["rows"]:
        cells = []
        for a in agents:
            near = [v for t, v in lt["agents"][a] if abs(t - (r["t"] + step)) < step / 2]
            cells.append(cb.rps_as_krps(near[0]) if near else "")
        mark = " (kill)" if k is not None and r["t"] <= k < r["t"] + step else ""
        md.append(cb.md_row([f"{r['t']:.1f}{mark}", cb.rps_as_krps(r["replies_rps"]),
                             str(r["error_replies"]), " | ".join(cells)]))
    md.append("")
    run["loss_summary"] = summary
    run["loss_timeline"] = {"rows": lt["rows"],
                            "agents": {a: s for a, s in lt["agents"].items()}}


def lt_step(lt):
    rows = lt["rows"]
    return rows[1]["t"] - rows[0]["t"] if len(rows) > 1 else 0.1


def plots(run, results):
    plt = cb.pyplot("gpus_report.py")
    if plt is None:
        return
    kind = "CPU agents" if run["cpu_only"] else "GPUs"
    sc = run.get("scaling") or []
    if sc:
        fig, ax = plt.subplots(figsize=(6, 4))
        for server in run["servers"].split():
            for proto in run["params"]["protos"].split():
                g = cb.matching(sc, server=server, proto=proto)
                if g:
                    ax.plot([r["accelerators"] for r in g], [r["rps"] / 1000 for r in g],
                            marker="o", label=f"{server} {proto}")
        cb.save_chart(plt, fig, ax, os.path.join(results, "gpus-throughput.png"), xlabel=kind,
                      ylabel="k req/s at saturation", ylim=(0, None),
                      xticks=sorted({r["accelerators"] for r in sc}),
                      title=f"{workload(run)}, {run['params']['size']} B")
    opens = [p for p in cb.matching(run["points"], experiment="scaling")
             if p["kind"].startswith("open-")]
    if opens:
        fig, ax = plt.subplots(figsize=(6, 4))
        for server, n in sorted({(p["server"], p["accelerators"]) for p in opens}):
            cb.plot_latency_against_load(ax, cb.matching(opens, server=server, accelerators=n),
                                         f"{server}, {n} {kind},")
        cb.save_chart(plt, fig, ax, os.path.join(results, "gpus-latency.png"), legend_size=7,
                      xlabel="offered k req/s (UDP, open loop)", ylabel="latency us",
                      yscale="log")
    lt = run.get("loss_timeline")
    if lt:
        fig, ax = plt.subplots(figsize=(6, 4))
        ts = [r["t"] for r in lt["rows"]]
        ax.plot(ts, [r["replies_rps"] / 1000 for r in lt["rows"]], label="all replies (loadgen)")
        ax.plot(ts, [r["error_replies"] / lt_step(lt) / 1000 for r in lt["rows"]],
                label="error replies")
        for a, s in lt["agents"].items():
            ax.plot([t for t, _ in s], [v / 1000 for _, v in s], linestyle="--",
                    label=f"{a} answered")
        k = (run.get("loss_summary") or {}).get("killed_at_s")
        if k is not None:
            ax.axvline(k, color="red", alpha=0.5, label="SIGKILL")
        cb.save_chart(plt, fig, ax, os.path.join(results, "gpus-loss.png"), legend_size=7,
                      xlabel="s since the load started", ylabel="k req/s", ylim=(0, None))


def report(results):
    run = load(results)
    md = ["# One server, every accelerator: run.sh gpus", ""]
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
    cb.write_json(os.path.join(results, "gpus.json"), run)
    cb.write_text(os.path.join(results, "gpus.md"), "\n".join(md) + "\n")
    plots(run, results)
    return 0


def main(argv):
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
