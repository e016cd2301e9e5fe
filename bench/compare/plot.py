#!/usr/bin/env python3
"""PNG plots from a bench/compare run (needs matplotlib: Debian python3-matplotlib).

    plot.py RESULTS_DIR/compare.json [OUT_DIR]

Writes, into OUT_DIR (default: next to the JSON):
  cdf-<handler>-<proto>-<size>.png   latency CDF at low load, one line per server
  load-<handler>-<proto>-<size>.png  p50 and p99 latency against offered load (open loop)
A separate step from run.sh, so the GPU machine needs no plotting library.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: plot.py compare.json [OUT_DIR]")
    run = json.load(open(sys.argv[1]))
    out = sys.argv[2] if len(sys.argv) == 3 else os.path.dirname(os.path.abspath(sys.argv[1]))
    os.makedirs(out, exist_ok=True)
    pts = [p for p in run["points"] if "latency" in p]
    note = " (CPU-only smoke run)" if run.get("cpu_only") else ""
    made = []

    keys = sorted({(p["handler"], p["proto"], p["size"]) for p in pts})
    for handler, proto, size in keys:
        lat = [p for p in pts if (p["handler"], p["proto"], p["size"]) == (handler, proto, size)
               and p["kind"] == "latency"]
        if lat:
            fig, ax = plt.subplots(figsize=(6, 4))
            for p in lat:
                cdf = p["latency"]["cdf"]
                ax.plot([v / 1000 for _, v in cdf], [q / 100 for q, _ in cdf], marker=".",
                        label=p["server"])
            ax.set_xscale("log")
            ax.set_xlabel("latency (us)")
            ax.set_ylabel("fraction of requests")
            ax.set_title(f"{handler} {proto} {size} B, 1 connection, window 1{note}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
            name = os.path.join(out, f"cdf-{handler}-{proto}-{size}.png")
            fig.tight_layout()
            fig.savefig(name, dpi=120)
            plt.close(fig)
            made.append(name)
        opens = [p for p in pts if (p["handler"], p["proto"], p["size"]) == (handler, proto, size)
                 and p["kind"].startswith("open-")]
        if opens:
            fig, ax = plt.subplots(figsize=(6, 4))
            for server in sorted({p["server"] for p in opens}):
                ps = sorted((p for p in opens if p["server"] == server),
                            key=lambda p: p["offered_rps"])
                x = [p["offered_rps"] / 1000 for p in ps]
                ax.plot(x, [p["latency"]["p50_ns"] / 1000 for p in ps], marker="o",
                        label=f"{server} p50")
                ax.plot(x, [p["latency"]["p99_ns"] / 1000 for p in ps], marker="x",
                        linestyle="--", label=f"{server} p99")
            ax.set_yscale("log")
            ax.set_xlabel("offered load (kreq/s)")
            ax.set_ylabel("latency (us)")
            ax.set_title(f"{handler} {proto} {size} B, open loop{note}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
            name = os.path.join(out, f"load-{handler}-{proto}-{size}.png")
            fig.tight_layout()
            fig.savefig(name, dpi=120)
            plt.close(fig)
            made.append(name)
    for m in made:
        print(m)


if __name__ == "__main__":
    main()
