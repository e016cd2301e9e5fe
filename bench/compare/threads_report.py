#!/usr/bin/env python3
"""Gathers a bench/compare/run.sh threads run: throughput and cores against io_threads.

    threads_report.py RESULTS_DIR [--arm-factor F] [--bf3-cores K]

Reads RESULTS_DIR/NAME/tCOUNT/compare.json (run.sh's, one per version and I/O thread count) and
writes RESULTS_DIR/threads.json and RESULTS_DIR/threads.md: for every handler, protocol and
size, the saturation throughput, snic_server's cores (its process alone, without the agent),
its busy cores (the I/O threads less caracal_engine_idle_seconds_total's rate, run.sh's
engine_idle_cores) and requests per second per core and per busy core of each version against
io_threads; the low-load p50; with run.sh's OPEN_RATES, the cores and busy time per request
that the same offered load took at each count; the server's ceiling per core; and how many
GPUs of a given GPU time per request one server of k cores keeps busy, measured here and
computed for a BlueField-3 (K Arm cores, each taken to do F of the work of one core here). With
matplotlib, also RESULTS_DIR/threads-HANDLER-PROTO-SIZE.png (throughput, cores and busy cores,
requests per core and per busy core against io_threads, one colour per version).
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import caracal_bench as cb  # noqa: E402

# GPU time per request (us) for the table of GPUs kept busy: from a request that is only a
# copy (about 1 us of a GPU) to one of a small model's inference (1 ms).
GPU_US = (1, 5, 20, 100, 1000)


def load(results):
    runs = {}  # (name, threads) -> compare.json
    for name in sorted(os.listdir(results)):
        d = os.path.join(results, name)
        if not os.path.isdir(d):
            continue
        for t in os.listdir(d):
            m = re.fullmatch(r"t(\d+)", t)
            path = os.path.join(d, t, "compare.json")
            if m and os.path.exists(path):
                runs[(name, int(m.group(1)))] = cb.read_json(path)
    return runs


def rows(runs):
    """One row per (name, threads, handler, proto, size, kind)."""
    out = []
    for (name, threads), run in runs.items():
        for p in run["points"]:
            if p.get("server") != "caracal" or not (p["kind"] in ("saturation", "latency") or
                                                    p["kind"].startswith("open-at-")):
                continue
            lat = p.get("latency") or {}
            out.append({
                "version": name, "io_threads": threads, "handler": p["handler"],
                "proto": p["proto"], "size": p["size"], "kind": p["kind"],
                "rps": p.get("throughput_rps"),
                "server_cores": p.get("process_cores"),
                "server_and_agent_cores": p.get("cpu_cores"),
                # run.sh's SERVER_CPUS: how busy the server's CPUs were, whatever ran there.
                "cpus_cores": p.get("server_cpus_cores"),
                "thread_cores": p.get("threads") or {},
                # The I/O threads' time that served (each hosts an engine thread by default):
                # their count less the seconds per second they found no work.
                "busy_cores": (max(0.0, threads - p["engine_idle_cores"])
                               if p.get("engine_idle_cores") is not None else None),
                "p50_us": cb.ns_to_us(lat.get("p50_ns") or None),
                "p99_us": cb.ns_to_us(lat.get("p99_ns") or None),
                "errors": (p.get("counts") or {}).get("wrong", 0),
                "lost": (p.get("counts") or {}).get("lost", 0),
                "client_cpu": p.get("client_cpu"),
            })
    return out


def rps_per(cores):
    """Requests a second per core of a row's CORES (server_cores, busy_cores, cpus_cores)."""
    return lambda r: r["rps"] / r[cores] if r and r.get("rps") and r.get(cores) else None


per_core, per_busy_core, per_cpu = (rps_per(c) for c in ("server_cores", "busy_cores",
                                                          "cpus_cores"))


def in_k(rps):
    """Requests a second in whole thousands: 1,235k."""
    return cb.rps_as_krps(rps, 0, "k")


def agents_text(run_facts):
    """Who served: one agent or several (run.sh's AGENTS), and on what."""
    n = int((run_facts.get("params") or {}).get("agents", 1))
    accel = run_facts.get("caracal_accelerator") or "gpu:0"
    if n == 1:
        return f"One agent on {accel}"
    if accel.startswith("gpu"):
        return f"{n} agents, agent i on gpu:i,"
    return f"{n} agents on {accel},"


def cpu_ranges(cpus):
    """A taskset list ("0,1,2,3,8") written with ranges ("0-3, 8")."""
    if "-" in str(cpus):
        return str(cpus)
    nums = sorted(int(c) for c in str(cpus).split(",") if c)
    out, start = [], None
    for i, c in enumerate(nums):
        if start is None:
            start = c
        if i + 1 == len(nums) or nums[i + 1] != c + 1:
            out.append(str(start) if start == c else f"{start}-{c}")
            start = None
    return ", ".join(out)


def markdown(run_facts, table, versions, args):
    out = ["# snic_server: throughput and cores against io_threads", ""]
    params = run_facts.get("params") or {}
    per_thread = run_facts.get("sat_per_thread")
    load = (f"{per_thread} connections x {params.get('sat_window', '?')} in flight per I/O "
            f"thread, from as many client threads" if per_thread else
            f"{params.get('sat_connections', '?')} connections x "
            f"{params.get('sat_window', '?')} in flight from "
            f"{params.get('loadgen_threads', '?')} client threads")
    out.append(f"Machine: {run_facts.get('cpu_model', '?')}, {run_facts.get('online_cpus', '?')} "
               f"CPUs, {run_facts.get('gpu', '?')}; {run_facts.get('date_utc', '?')}. "
               f"Versions: {', '.join(versions)}. "
               + agents_text(run_facts)
               + " over shm with "
               f"{params.get('agent_queues', '?')} queues each; saturation is {load}; "
               "cores are snic_server's process alone (utime + stime over the point), not the "
               "agent's; `engine_threads` is each version's default.")
    pinned = run_facts.get("pinned") or {}
    if len(set(pinned.values())) == 1:
        server_cpus, client_cpus = next(iter(pinned.values()))
        out[-1] += (f" The server and its agent ran on CPUs {cpu_ranges(server_cpus)}, the "
                    f"client on {cpu_ranges(client_cpus)} (taskset).")
    elif pinned:
        out[-1] += (" The server and its agent ran on CPUs of their own, the client on the rest "
                    "(taskset): " + "; ".join(f"at {t} I/O threads, {cpu_ranges(sc)} and "
                                              f"{cpu_ranges(cc)}"
                                              for t, (sc, cc) in sorted(pinned.items())) + ".")
    if run_facts.get("dispatch"):
        out[-1] += (" Dispatch: " + ", ".join(f"{v} {run_facts['dispatch'][v]}" for v in versions
                                              if v in run_facts["dispatch"]) + ".")
    if run_facts.get("netns_versions"):
        named = ", ".join(f"{n} ({s.upper()})" for n, s in run_facts["netns_versions"].items())
        out[-1] += (f" The client of {named} ran in a network namespace of its own, joined by a "
                    "veth pair, each side's packets taken in on its own CPUs (run.sh's "
                    "CLIENT_NETNS: RPS, a flow's input on one of them by its hash, as a NIC's "
                    "RSS; RFS, on the CPU of the socket's reader, as a NIC's accelerated RFS); "
                    "the others' over loopback.")
    out.append("")
    keys = sorted({(r["handler"], r["proto"], r["size"]) for r in table})
    for handler, proto, size in keys:
        sat, lat = ({(r["version"], r["io_threads"]): r for r in
                     cb.matching(table, handler=handler, proto=proto, size=size, kind=kind)}
                    for kind in ("saturation", "latency"))
        counts = sorted({t for _, t in sat})
        have = [v for v in versions if any((v, t) in sat for t in counts)]
        if not have:
            continue
        busy = any(r.get("busy_cores") is not None for r in sat.values())
        cpus = any(r.get("cpus_cores") is not None for r in sat.values())
        rows = []
        for t in counts:
            cells = [str(t)]
            for v in have:
                r = sat.get((v, t))
                cells += [in_k(r and r["rps"]), cb.num(r and r["server_cores"]), in_k(per_core(r))]
                if busy:
                    cells += [cb.num(r and r.get("busy_cores")), in_k(per_busy_core(r))]
                if cpus:
                    cells += [cb.num(r and r.get("cpus_cores")), in_k(per_cpu(r))]
                cells.append(f"{cb.num(lat.get((v, t), {}).get('p50_us'))} us")
            rows.append(cells)
        out += cb.md_section(f"{handler}, {proto.upper()} {size} B", ["io_threads"] + [
            c for v in have for c in [f"{v}: req/s", f"{v}: cores", f"{v}: req/s per core"]
            + [f"{v}: busy cores", f"{v}: req/s per busy core"] * busy
            + [f"{v}: server CPUs busy", f"{v}: req/s per busy CPU"] * cpus
            + [f"{v}: p50 at 1 connection"]], rows)
        if cpus:
            out += ["Server CPUs busy: how busy the CPUs that the server and its agent were kept "
                    "to (SERVER_CPUS) were over the point, whatever ran there: the processes, "
                    "and the kernel's softirq work for packets taken in on them (/proc/stat).", ""]
        if busy:
            out += ["Busy cores: the I/O threads (each runs an engine thread) less the seconds "
                    "per second they spent in rounds without work, spinning or asleep "
                    "(`caracal_engine_idle_seconds_total` over the point).", ""]

    # OPEN_RATES: the same offered load at every thread count; what it cost.
    for handler, proto, size in keys:
        opened = [r for r in cb.matching(table, handler=handler, proto=proto, size=size)
                  if r["kind"].startswith("open-at-")]
        rates = sorted({int(r["kind"][len("open-at-"):]) for r in opened})
        if not rates:
            continue
        rows = []
        for t in sorted({r["io_threads"] for r in opened}):
            cells = [str(t)]
            for v in versions:
                for rate in rates:
                    r = cb.first(opened, version=v, io_threads=t, kind=f"open-at-{rate}")
                    us = (r["busy_cores"] / r["rps"] * 1e6
                          if r and r.get("busy_cores") is not None and r.get("rps") else None)
                    p99 = r and r.get("p99_us")
                    cells += [in_k(r and r["rps"]), cb.num(r and r["server_cores"]),
                              cb.num(r and r.get("busy_cores"), 2), cb.num(us),
                              "-" if p99 is None else f"{p99:,.0f} us"]
            rows.append(cells)
        out += cb.md_section(
            f"The same load at every thread count: {handler}, {proto.upper()} {size} B",
            ["io_threads"] + [c for v in versions for rate in rates for c in (
                f"{v} at {in_k(rate)}: req/s", "cores", "busy cores", "busy us per request",
                "p99")], rows,
            "Open loop at a fixed rate: the cores it took and the busy time per request (busy "
            "cores / req/s), by io_threads. Equal busy time per request at every count: more "
            "threads cost nothing per request; more threads than the load needs wait (idle) "
            "rather than work.")

    # The ceiling per core: the best requests per second per server core at saturation of the
    # last version named (the new one), with the I/O thread count it was reached at.
    new = versions[-1]
    rows, ceiling = [], {}
    for handler, proto, size in keys:
        sat = cb.matching(table, version=new, handler=handler, proto=proto, size=size,
                          kind="saturation")
        best = max(sat, key=lambda r: per_core(r) or 0, default=None)
        if not best or not per_core(best):
            continue
        ceiling[(handler, proto, size)] = best
        by_t = {r["io_threads"]: r for r in sat}
        rows.append([f"{handler}, {proto.upper()} {size} B",
                     f"**{in_k(per_core(best))}** ({best['io_threads']}, {in_k(best['rps'])}, "
                     f"{cb.num(best['server_cores'])})"]
                    + [in_k(per_core(by_t.get(t))) for t in (8, 16, 32)])
    out += cb.md_section(f"Requests per second per server core at saturation ({new})",
                         ["handler, protocol, size",
                          "best req/s per core (io_threads, req/s, cores)", "at 8 I/O threads",
                          "at 16", "at 32"], rows)

    # GPUs one server keeps busy: a GPU that spends g us on each request serves 1e6/g requests a
    # second, so a server that sustains R requests a second keeps R * g / 1e6 such GPUs busy.
    if ceiling:
        ref = ceiling.get(("matvec", "udp", 1024)) or next(iter(ceiling.values()))
        rate = per_core(ref)
        label = f"{ref['handler']}, {ref['proto'].upper()} {ref['size']} B"
        out += ["## GPUs one server keeps busy", "",
                f"A GPU that spends g us on each request serves 10^6 / g requests a second; a "
                f"server that sustains R requests a second keeps R x g / 10^6 of them busy. "
                f"R here is the best per-core rate above for {label} ({in_k(rate)} req/s per "
                f"core) times k cores: measured where the run had k cores' worth of I/O "
                f"threads, and for a BlueField-3 computed with {args.bf3_cores} Arm cores "
                f"each doing {args.arm_factor} of the work of a core here.", ""]
        out += cb.md_table(["server", "R (req/s)"] + [f"g = {g} us" for g in GPU_US])

        def gpus_row(server, rps):
            return cb.md_row([server, in_k(rps)] + [f"{rps * g / 1e6:.1f}" for g in GPU_US])
        sat = {r["io_threads"]: r for r in cb.matching(
            table, version=new, handler=ref["handler"], proto=ref["proto"], size=ref["size"],
            kind="saturation")}
        out += [gpus_row(f"measured: {t} I/O threads ({cb.num(sat[t]['server_cores'])} cores)",
                         sat[t]["rps"]) for t in sorted(sat) if sat[t].get("rps")]
        out += [gpus_row(f"{cores} cores here, at the per-core ceiling", rate * cores)
                for cores in (8, 16, 32, 64)]
        out += [gpus_row(f"BlueField-3, {args.bf3_cores} Arm cores x {args.arm_factor}",
                         rate * args.bf3_cores * args.arm_factor), ""]
    return "\n".join(out)


def plot(results, table, versions):
    plt = cb.pyplot("threads_report.py")
    if plt is None:
        return []
    made = []
    keys = sorted({(r["handler"], r["proto"], r["size"]) for r in table})
    for handler, proto, size in keys:
        sat = cb.matching(table, handler=handler, proto=proto, size=size, kind="saturation")
        fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
        for i, v in enumerate(versions):
            pts = sorted((r["io_threads"], r) for r in sat if r["version"] == v and r["rps"])
            if not pts:
                continue
            color = f"C{i}"
            xs = [t for t, _ in pts]
            a.plot(xs, [r["rps"] / 1000 for _, r in pts], marker="o", color=color, label=v)
            b.plot(xs, [r["server_cores"] or 0 for _, r in pts], marker="o", color=color,
                   label=f"{v}: cores")
            c.plot(xs, [(per_core(r) or 0) / 1000 for _, r in pts], marker="o", color=color,
                   label=f"{v}: per core")
            busy = [(t, r) for t, r in pts if r.get("busy_cores")]
            if busy:
                b.plot([t for t, _ in busy], [r["busy_cores"] for _, r in busy], marker="x",
                       linestyle="--", color=color, label=f"{v}: busy cores")
                c.plot([t for t, _ in busy], [per_busy_core(r) / 1000 for _, r in busy],
                       marker="x", linestyle="--", color=color, label=f"{v}: per busy core")
        for ax, ylabel in zip((a, b, c), ("k requests/s at saturation", "snic_server cores",
                                          "k requests/s per core")):
            cb.style_axes(ax, legend_size=8, xlabel="io_threads", ylabel=ylabel, ylim=(0, None))
        fig.suptitle(f"snic_server, {handler} over {proto.upper()} at {size} B")
        path = os.path.join(results, f"threads-{handler}-{proto}-{size}.png")
        cb.save_figure(plt, fig, path, dpi=110)
        made.append(path)
    return made


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--arm-factor", type=float, default=0.5)
    ap.add_argument("--bf3-cores", type=int, default=16)
    args = ap.parse_args()
    runs = load(args.results)
    if not runs:
        raise SystemExit(f"threads_report.py: no NAME/tCOUNT/compare.json under {args.results}")
    table = rows(runs)
    # Versions in the order run.sh was given them, as the results name them; the first
    # is the baseline.
    versions = sorted({n for n, _ in runs}, key=lambda n: (n != "old", n))
    facts = next(iter(runs.values()))
    facts = {key: facts.get(key) for key in ("date_utc", "gpu", "cpu_model", "online_cpus",
                                             "caracal_accelerator", "kernel", "params")}
    # Where each thread count's server and client were kept (run.sh's SERVER_CPUS and
    # CLIENT_CPUS; run.sh's PIN may give each count its own), and which versions had their
    # client in a network namespace.
    facts["pinned"] = {t: (r["params"]["server_cpus"], r["params"].get("client_cpus"))
                       for (_, t), r in runs.items() if (r.get("params") or {}).get("server_cpus")}
    # run.sh's SAT_PER_THREAD: the same connections per I/O thread at every count.
    ratios = {r["params"]["sat_connections"] / t for (_, t), r in runs.items()
              if (r.get("params") or {}).get("sat_connections")}
    facts["sat_per_thread"] = (int(next(iter(ratios))) if len(ratios) == 1 and len(
        {t for _, t in runs}) > 1 and next(iter(ratios)).is_integer() else None)
    dispatch = {n: (r.get("params") or {}).get("dispatch", "round_robin")
                for (n, _), r in runs.items()}
    facts["dispatch"] = dispatch if set(dispatch.values()) != {"round_robin"} else {}
    # run.sh's CLIENT_NETNS per version (older runs wrote 0 or 1, 1 being rps).
    steering = {}
    for (n, _), r in runs.items():
        v = str((r.get("params") or {}).get("client_netns", "off"))
        v = {"0": "off", "1": "rps"}.get(v, v)
        if v != "off":
            steering[n] = v
    facts["netns_versions"] = {n: steering[n] for n in versions if n in steering}
    cb.write_json(os.path.join(args.results, "threads.json"),
                  {"facts": facts, "versions": versions, "points": table})
    text = markdown(facts, table, versions, args)
    cb.write_text(os.path.join(args.results, "threads.md"), text + "\n")
    print(text)
    for p in plot(args.results, table, versions):
        print("wrote", p)


if __name__ == "__main__":
    main()
