#!/usr/bin/env python3
"""PNG plots from a bench/compare run (needs matplotlib: Debian python3-matplotlib).

    plot.py RESULTS_DIR/compare.json [OUT_DIR]

Writes, into OUT_DIR (default: next to the JSON):
  cdf-<handler>-<proto>-<size>.png   latency CDF at low load, one line per server
  load-<handler>-<proto>-<size>.png  p50 and p99 latency against offered load (open loop)
A separate step from run.sh, so the GPU machine needs no plotting library.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import caracal_bench as cb  # noqa: E402


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: plot.py compare.json [OUT_DIR]")
    plt = cb.pyplot("plot.py")
    if plt is None:
        sys.exit(1)
    run = cb.read_json(sys.argv[1])
    out = sys.argv[2] if len(sys.argv) == 3 else os.path.dirname(os.path.abspath(sys.argv[1]))
    os.makedirs(out, exist_ok=True)
    pts = [p for p in run["points"] if "latency" in p]
    note = " (CPU-only smoke run)" if run.get("cpu_only") else ""
    made = []

    keys = sorted({(p["handler"], p["proto"], p["size"]) for p in pts})
    for handler, proto, size in keys:
        these = cb.matching(pts, handler=handler, proto=proto, size=size)
        lat = cb.matching(these, kind="latency")
        if lat:
            fig, ax = plt.subplots(figsize=(6, 4))
            for p in lat:
                cdf = p["latency"]["cdf"]
                ax.plot([v / 1000 for _, v in cdf], [q / 100 for q, _ in cdf], marker=".",
                        label=p["server"])
            ax.set_title(f"{handler} {proto} {size} B, 1 connection, window 1{note}", fontsize=9)
            made.append(os.path.join(out, f"cdf-{handler}-{proto}-{size}.png"))
            cb.save_chart(plt, fig, ax, made[-1], grid="both", xscale="log",
                          xlabel="latency (us)", ylabel="fraction of requests")
        opens = [p for p in these if p["kind"].startswith("open-")]
        if opens:
            fig, ax = plt.subplots(figsize=(6, 4))
            for server in sorted({p["server"] for p in opens}):
                cb.plot_latency_against_load(ax, cb.matching(opens, server=server), server)
            ax.set_title(f"{handler} {proto} {size} B, open loop{note}", fontsize=9)
            made.append(os.path.join(out, f"load-{handler}-{proto}-{size}.png"))
            cb.save_chart(plt, fig, ax, made[-1], legend_size=7, grid="both", yscale="log",
                          xlabel="offered load (kreq/s)", ylabel="latency (us)")
    for m in made:
        print(m)


if __name__ == "__main__":
    main()
