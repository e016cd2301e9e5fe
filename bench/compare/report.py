#!/usr/bin/env python3
"""Gathers a bench/compare/run.sh run into one JSON and markdown tables (stdlib only).

    report.py RESULTS_DIR

Reads RESULTS_DIR/raw/run.json, raw/points.jsonl, the loadgen JSON and sockperf output each
point names, and the perf profiles of a run with PERF (raw/NAME-perf.txt); writes
RESULTS_DIR/compare.json and RESULTS_DIR/compare.md.
"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import caracal_bench as cb  # noqa: E402


def sockperf_latency(path):
    """p50/p90/p99/p99.9/max/average latency (us) and the message counts of a sockperf point,
    or None. run.sh passes --full-rtt (round_trip); older runs recorded half of one."""
    s = cb.sockperf(path)
    return {k: s[k] for k in ("round_trip", "avg_us", "p50_us", "p90_us", "p99_us", "p999_us",
                              "max_us", "dropped", "duplicated", "out_of_order") if k in s} or None


# Kernel symbols that copy a message between user memory and socket buffers.
KERNEL_COPIES = {"_copy_to_iter", "_copy_from_iter", "_copy_to_user", "_copy_from_user",
                 "rep_movs_alternative", "copy_user_enhanced_fast_string",
                 "copy_user_generic_string"}
# The columns of the profile table, in order (see perf_profile()).
PROFILE_PARTS = ("kernel copies", "kernel wake-ups", "kernel rest", "server code",
                 "ring polling", "mutexes", "libc, no symbol")


def perf_profile(path):
    """Shares of the samples (percent) by part, from run.sh's flat profile (perf report
    --sort comm,dso,sym), or None. Parts: kernel copies (KERNEL_COPIES); kernel wake-ups
    (_raw_spin_unlock_irqrestore: in a VM sampled by cpu-clock, the time with interrupts off
    shows up where they are turned back on, which the call graphs put mostly in waking a
    socket's reader); the rest of the kernel; the servers' own binaries, and of that the
    engine's polling of its regions (TransportBinding::serve); pthread mutexes; libc code perf
    has no symbol for (its memcpy and memmove variants, foremost). The symbols under the
    report's cut-off are in no part."""
    try:
        text = open(path, encoding="utf-8", errors="replace").read()
    except OSError:
        return None
    parts = dict.fromkeys(PROFILE_PARTS, 0.0)
    sections = text.split("# Samples")
    if len(sections) < 2:
        return None
    for line in sections[1].splitlines():
        m = re.match(r"\s+([0-9.]+)%\s+(\S+)\s+(\S+)\s+\[(.)\]\s+(.*)", line)
        if not m:
            continue
        pct, dso, sym = float(m.group(1)), m.group(3), m.group(5).strip()
        if dso == "[kernel.kallsyms]":
            part = ("kernel copies" if sym in KERNEL_COPIES else
                    "kernel wake-ups" if sym == "_raw_spin_unlock_irqrestore" else "kernel rest")
        elif dso.startswith("libc."):
            part = ("mutexes" if "pthread_mutex" in sym else
                    "libc, no symbol" if sym.startswith("0x") else None)
        elif not dso.startswith("[") and not dso.startswith("lib"):
            part = "server code"
            if "TransportBinding" in sym and "::serve" in sym:
                parts["ring polling"] += pct
        else:
            part = None
        if part:
            parts[part] += pct
    return parts


# What compare.json keeps of each point's loadgen JSON: (its key, loadgen's).
LOADGEN_KEYS = (("throughput_rps",) * 2, ("offered_rps",) * 2, ("latency",) * 2,
                ("counts",) * 2, ("errors",) * 2, ("config",) * 2, ("loadgen_machine", "machine"))


def load(results):
    raw, run, points = cb.load_run(results)
    for p in points:
        if "json" in p:
            try:
                lg = cb.read_json(os.path.join(raw, p["json"]))
                for key, lg_key in LOADGEN_KEYS:
                    p[key] = lg[lg_key]
                if "client_cpu" in lg:
                    p["client_cpu"] = lg["client_cpu"]
            except (OSError, ValueError, KeyError) as e:
                p["missing"] = f"{p['json']}: {e}"
        if "sockperf" in p:
            p["sockperf_latency"] = sockperf_latency(os.path.join(raw, p["sockperf"]))
        if "json" in p:
            prof = perf_profile(os.path.join(raw, p["json"][:-len(".json")] + "-perf.txt"))
            if prof:
                p["profile_pct"] = prof
    run["points"] = points
    run["low_load"] = low_load_rounds(run)
    return run


def low_load_rounds(run):
    """Echo at low load, round by round (run.sh's LOW_LOAD_ROUNDS): {"servers", "rounds",
    "loadgen"/"sockperf": {server: [p50 us or None per round]}, "median", "gaps"}, or None.
    A gap is a server's p50 less the CPU server's in the same round; its median is over the
    rounds where both were measured."""
    servers = run.get("low_load_servers", "").split()
    rounds = run["params"].get("low_load_rounds", 0)
    if not servers or not rounds:
        return None
    pts = run["points"]
    out = {"servers": servers, "rounds": rounds, "loadgen": {}, "sockperf": {}}
    for s in servers:
        lg, sp = [], []
        for r in range(1, rounds + 1):
            q = cb.first(pts, server=s, kind="low-load", round=r)
            lg.append(cb.ns_to_us(((q or {}).get("latency") or {}).get("p50_ns")))
            q = cb.first(pts, server=s, kind="sockperf-low-load", round=r)
            sp.append(((q or {}).get("sockperf_latency") or {}).get("p50_us"))
        out["loadgen"][s] = lg
        out["sockperf"][s] = sp
    out["median"] = {tool: {s: cb.median(out[tool][s])
                            for s in servers} for tool in ("loadgen", "sockperf")}
    out["gaps"] = {}
    if "cpu" in servers:
        for tool in ("loadgen", "sockperf"):
            base = out[tool]["cpu"]
            for s in servers:
                if s == "cpu":
                    continue
                g = [None if a is None or b is None else a - b
                     for a, b in zip(out[tool][s], base)]
                out["gaps"][f"{tool} {s}"] = {"per_round": g, "median": cb.median(g)}
    return out


def errors(q):
    return " (errors)" if q["counts"]["wrong"] + q["counts"]["connection_errors"] else ""


def markdown(run):
    pts = run["points"]
    servers = run["servers"].split()
    all_sizes = [int(s) for s in run["params"]["sizes"].split()]
    lines = ["# Caracal against the baselines", ""]
    if run.get("cpu_only"):
        lines += ["**CPU-only smoke run: no GPU; Caracal's agent on the CPU accelerator. This "
                  "shows that the script works end to end; the numbers say nothing about "
                  "Caracal's performance.**", ""]
    p = run["params"]
    lines += [f"- date (UTC): {run['date_utc']}, commit {run['commit']}",
              f"- GPU: {run['gpu'] or 'none'}; Caracal accelerator: {run['caracal_accelerator']}",
              f"- CPU: {run['cpu_model']} ({run['online_cpus']} CPUs), {run['kernel']}",
              f"- {p['duration_s']} s per point after {p['warmup_s']} s warm-up; servers "
              f"with {p['server_threads']} I/O threads (snic_server: engine_threads "
              f"{p.get('engine_threads', 'default')}"
              + (f"; caracal_threads: engine_threads {p.get('engine_threads_alt', 2)}"
                 if "caracal_threads" in servers else "")
              + f"); saturation = {p['sat_connections']} connections x window "
              f"{p['sat_window']} from {p['loadgen_threads']} loadgen threads; host-centric "
              f"batches up to {p['batch']} requests or {p['batch_timeout_us']} us"]
    if run.get("failed_points"):
        lines.append(f"- **{run['failed_points']} points failed** (see raw/)")
    lines.append("")

    ll = run.get("low_load")
    if ll:
        rows = []
        for tool in ("loadgen", "sockperf"):
            rows += [[tool, s] + [cb.num(x) for x in ll[tool][s]] + [cb.num(ll["median"][tool][s])]
                     for s in ll["servers"] if any(x is not None for x in ll[tool][s])]
            gaps = [(s, ll["gaps"].get(f"{tool} {s}")) for s in ll["servers"]]
            rows += [[tool, f"{s} - cpu"] + [cb.num(x) for x in g["per_round"]]
                     + [f"**{cb.num(g['median'])}**"]
                     for s, g in gaps if g and g["median"] is not None]
        lines += cb.md_section(
            f"echo at low load, {ll['rounds']} rounds (UDP, 64 B, 1 connection, window 1): p50, us",
            ["tool", "server", *(f"round {r}" for r in range(1, ll["rounds"] + 1)), "median"], rows,
            "Measured before everything else, a fresh server each round, the servers taking turns "
            "(the first of each round alternating). A gap is the server's p50 less the CPU "
            "server's in the same round; the aim is read from the median gap, since one round "
            "moves by several us.", compact=True)

    handlers = [h for h in ("echo", "matvec", "face") if any(q.get("handler") == h for q in pts)]
    for handler in handlers:
        # face has one request size, whatever SIZES says
        sizes = sorted({q["size"] for q in pts if q.get("handler") == handler
                        and q.get("kind") in ("latency", "saturation")}) or all_sizes
        keys = [(proto, size) for proto in ("udp", "tcp") for size in sizes]

        def point(server, proto, size, kind):
            return cb.first(pts, server=server, handler=handler, proto=proto, size=size, kind=kind)

        def saturation(q):
            if not q or "throughput_rps" not in q:
                return ["-", "-", "-"]
            k, c = q["throughput_rps"] / 1000, q.get("cpu_cores") or 0
            return [f"{k:.1f}{errors(q)}", f"{c:.2f}", f"{k / c:.1f}" if c > 0 else "-"]
        lines += cb.md_section(
            f"{handler}: latency at low load (1 connection, window 1), us",
            ["proto", "size"] + [f"{s} {p}" for s in servers for p in ("p50", "p99", "p99.9")],
            [[proto, str(size)] + [cb.ns_as_us(((point(s, proto, size, "latency") or {})
                                                .get("latency") or {}).get(k))
                                   for s in servers for k in ("p50_ns", "p99_ns", "p999_ns")]
             for proto, size in keys], compact=True)
        lines += cb.md_section(
            f"{handler}: throughput at saturation (kreq/s, server CPU cores, kreq/s per core)",
            ["proto", "size"] + [f"{s} {p}" for s in servers for p in ("kreq/s", "cores",
                                                                        "per core")],
            [[proto, str(size)] + [c for s in servers
                                   for c in saturation(point(s, proto, size, "saturation"))]
             for proto, size in keys], compact=True)

    # Face verification against the host-centric server: saturation, cores, and every server's
    # latency at the host-centric server's saturation rate (open loop, kind open-at-host_centric).
    ref = "host_centric"
    if "face" in handlers and ref in servers and "caracal" in servers:
        rows = []
        for proto in ("udp", "tcp"):
            c = cb.first(pts, server="caracal", handler="face", proto=proto, kind="saturation")
            h = cb.first(pts, server=ref, handler="face", proto=proto, kind="saturation")
            if not c or not h or "throughput_rps" not in c or "throughput_rps" not in h:
                continue
            ck, hk = c["throughput_rps"] / 1000, h["throughput_rps"] / 1000
            cc, hc = c.get("cpu_cores") or 0, h.get("cpu_cores") or 0
            per_core = f"{(ck / cc) / (hk / hc):.2f}x" if cc > 0 and hc > 0 and hk > 0 else "-"
            rows.append([proto, f"{ck:.1f}", f"{cc:.2f}", f"{hk:.1f}", f"{hc:.2f}",
                         f"{ck / hk:.2f}x" if hk > 0 else "-", per_core]
                        + [cb.ns_as_us(((cb.first(pts, server=s, handler="face", proto=proto,
                                                  kind=f"open-at-{ref}") or {})
                                        .get("latency") or {}).get("p99_ns")) for s in servers])
        lines += cb.md_section(
            "face: Caracal against the host-centric server",
            ["proto", "caracal kreq/s", "caracal cores", "host_centric kreq/s",
             "host_centric cores", "throughput ratio", "per-core ratio"]
            + [f"{s} p99 us at host_centric's saturation" for s in servers], rows, compact=True)

    sats = [q for q in pts if q.get("kind") == "saturation" and q.get("threads")]
    if sats:
        lines += cb.md_section(
            "Where the server cores go at saturation (cores per thread name)",
            ["server", "handler", "proto", "size", "cores", "threads",
             "client cores (busiest thread)"],
            [[q["server"], q["handler"], q["proto"], str(q["size"]),
              f"{q.get('cpu_cores') or 0:.2f}",
              ", ".join(f"{n} {c:.2f}"
                        for n, c in sorted(q["threads"].items(), key=lambda kv: -kv[1])),
              f"{cc['cores']:.2f} ({cc['busiest_thread_cores']:.2f})" if cc else "-"]
             for q in sats for cc in [q.get("client_cpu")]],
            "Threads of one name are summed (caracal-io: snic_server's I/O threads, "
            "caracal-engine: its engine, caracal_*_agent: the agent's main thread). "
            "The last column is the load generator's own CPU over the measured window, "
            "all its threads and the busiest one: a busiest thread near 1.00 means the "
            "client may be what limits the point.", compact=True)

    profiled = [q for q in pts if q.get("profile_pct") and q.get("throughput_rps")
                and q.get("cpu_cores")]
    if profiled:
        rows = []
        for q in profiled:
            per_request = q["cpu_cores"] / q["throughput_rps"] * 1e6
            shares = q["profile_pct"]
            counted = sum(v for k, v in shares.items() if k != "ring polling")
            rows.append([q["server"], q["handler"], q["proto"], str(q["size"]),
                         f"{per_request:.2f}"]
                        + [f"{shares[k] / 100 * per_request:.2f}" for k in PROFILE_PARTS]
                        + [f"{(100 - counted) / 100 * per_request:.2f}"])
        lines += cb.md_section(
            "Where a request's server CPU goes at saturation (perf), us per request",
            ["server", "handler", "proto", "size", "us per request", *PROFILE_PARTS, "rest"], rows,
            "The server's cores over its throughput, split by the share of perf's "
            "samples (cpu-clock) in each part (see `report.py`, perf_profile()). "
            "Server code is the servers' own binaries (for Caracal, snic_server and "
            "the agent); ring polling is the part of it that polls the agents' "
            "regions. Rest: other libraries, and symbols under 0.3% each. Sampling "
            "slows the servers a little: compare within a run.", compact=True)

    held = [q for q in pts if q.get("kind") == "held" and q.get("hold")]
    if held:
        ref = held[0]["hold"]["to"]
        rows = []
        for q in held:
            if "throughput_rps" not in q:
                continue
            h, lat = q["hold"], q.get("latency") or {}
            r = cb.first(pts, server=ref, handler=q["handler"], proto=q["proto"], size=q["size"],
                         kind="saturation")
            rk = (r or {}).get("throughput_rps")
            rows.append(
                [q["handler"], q["proto"], str(q["size"])]
                + ([f"{rk / 1000:.1f}", f"{r.get('cpu_cores') or 0:.2f}"] if rk else ["-", "-"])
                + [str(h["threads"]), f"{h['cores']:.2f}", f"{q.get('cpu_cores') or 0:.2f}",
                   f"{q['throughput_rps'] / 1000:.1f}{errors(q)}", cb.ns_as_us(lat.get("p50_ns")),
                   cb.ns_as_us(lat.get("p99_ns")), f"{h['throttled']} of {h['periods']}",
                   str(q["counts"]["lost"]), f"{q['throughput_rps'] / rk:.2f}x" if rk else "-"])
        lines += cb.md_section(
            f"Caracal held to the cores of {ref} at saturation (cgroup CPU quota)",
            ["handler", "proto", "size", f"{ref} kreq/s", f"{ref} cores", "held: I/O threads",
             "held: quota", "held: cores", "held: kreq/s", "held: p50 us", "held: p99 us",
             "throttled", "lost", f"held / {ref}"], rows,
            f"Each point again, with snic_server and the agent in a cgroup whose CPU "
            f"quota is the cores {ref} used at the same point (rounded down to 0.01; "
            f"enforced every {held[0]['hold']['period_us'] / 1000:g} ms), a fresh "
            "server per point. Throttled: the enforcement periods in which the group "
            "ran out of its quota.", compact=True)

    opens = [q for q in pts if str(q.get("kind", "")).startswith("open-") and "latency" in q]
    if opens:
        lines += cb.md_section(
            "Latency against offered load (open loop)",
            ["server", "handler", "proto", "size", "offered kreq/s", "achieved kreq/s", "p50 us",
             "p99 us", "lost"],
            [[q["server"], q["handler"], q["proto"], str(q["size"]),
              f"{q['offered_rps'] / 1000:.1f}", f"{q['throughput_rps'] / 1000:.1f}",
              cb.ns_as_us(q["latency"]["p50_ns"]), cb.ns_as_us(q["latency"]["p99_ns"]),
              str(q["counts"]["lost"])] for q in opens], compact=True)

    sp = [q for q in pts if q.get("kind") == "sockperf"]
    if sp:
        lines += cb.md_section(
            "sockperf ping-pong (UDP, echo): the unmodified client, us",
            ["server", "size", "avg", "p50", "p99", "p99.9", "dropped"],
            [[q["server"], str(q["size"])]
             + [cb.num(s.get(k)) for k in ("avg_us", "p50_us", "p99_us", "p999_us")]
             + [str(s.get("dropped", "-"))] for q in sp for s in [q.get("sockperf_latency") or {}]],
            "Round trips (`--full-rtt`), as loadgen measures them."
            if all((q.get("sockperf_latency") or {}).get("round_trip") for q in sp) else
            "sockperf's default: half the round trip, unlike loadgen's figures.", compact=True)
    return "\n".join(lines)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: report.py RESULTS_DIR")
    results = sys.argv[1]
    run = load(results)
    cb.write_json(os.path.join(results, "compare.json"), run, indent=2, newline=True)
    cb.write_text(os.path.join(results, "compare.md"), markdown(run) + "\n")


if __name__ == "__main__":
    main()
