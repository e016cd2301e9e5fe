"""What the benchmarks' Python scripts share (the standard library; plots need matplotlib).

Reading what the drivers write (run.json and points.jsonl under RESULTS_DIR/raw/, loadgen's
JSON, sockperf's output, snic_server's metrics pages), medians, number formats with the unit in
the name, Markdown tables and plots. A script under bench/ finds it with

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
"""
import json
import os
import re
import statistics
import sys
import urllib.request


# Loading.

def read_json(path):
    with open(path) as f:
        return json.load(f)


def read_jsonl(path):
    """The objects of a JSON-lines file, its blank lines skipped."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def load_run(results):
    """A driver's RESULTS/raw/: (that folder, its run.json, the lines of its points.jsonl)."""
    raw = os.path.join(results, "raw")
    return (raw, read_json(os.path.join(raw, "run.json")),
            read_jsonl(os.path.join(raw, "points.jsonl")))


def write_json(path, obj, indent=1, newline=False):
    with open(path, "w") as f:
        json.dump(obj, f, indent=indent)
        f.write("\n" if newline else "")


def write_text(path, text):
    with open(path, "w") as f:
        f.write(text)


def sockperf(path):
    """What `sockperf ping-pong` wrote into PATH, as far as it got: round_trip (True for
    --full-rtt's "Round trip is", False for the default "Latency is", half of one), avg_us,
    percentile_us ({percent: us}) and of those p50_us, p90_us, p99_us and p999_us, max_us,
    dropped, duplicated, out_of_order, and sent and received over the valid duration. {}
    without the file."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return {}
    out = {"percentile_us": {}}
    m = re.search(r"Summary: (Round trip|Latency) is ([0-9.]+) usec", text)
    if m:
        out["round_trip"], out["avg_us"] = m.group(1) == "Round trip", float(m.group(2))
    for m in re.finditer(r"percentile\s+([0-9.]+)\s*=\s*([0-9.]+)", text):
        out["percentile_us"].setdefault(float(m.group(1)), float(m.group(2)))
    out.update((f"p{str(p).replace('.', '')}_us", out["percentile_us"][p])
               for p in (50, 90, 99, 99.9) if p in out["percentile_us"])
    m = re.search(r"<MAX> observation\s*=\s*([0-9.]+)", text)
    if m:
        out["max_us"] = float(m.group(1))
    m = re.search(r"# dropped messages = (\d+); # duplicated messages = (\d+); "
                  r"# out-of-order messages = (\d+)", text)
    if m:
        out["dropped"], out["duplicated"], out["out_of_order"] = map(int, m.groups())
    m = re.search(r"\[Valid Duration\].*SentMessages=(\d+); ReceivedMessages=(\d+)", text)
    if m:
        out["sent"], out["received"] = int(m.group(1)), int(m.group(2))
    return out


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def metrics_page(source):
    """snic_server's metrics page (Prometheus text): fetched from an http URL, or read from a
    file."""
    if not source.startswith("http"):
        with open(source) as f:
            return f.read()
    with urllib.request.urlopen(source, timeout=5) as r:
        return r.read().decode()


def metric_samples(lines):
    """[(name, {label: value}, value)] of the samples among the lines of a metrics page."""
    out = []
    for line in lines:
        m = SAMPLE.match(line.strip())
        if not m or line.startswith("#"):
            continue
        out.append((m.group(1), dict(LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


# Statistics and selection.

def median(values):
    """statistics.median of the values that are not None; None if none are."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def matching(points, **fields):
    """The points whose fields have these values."""
    return [p for p in points if all(p.get(k) == v for k, v in fields.items())]


def first(points, **fields):
    """The first point whose fields have these values, or None."""
    return next(iter(matching(points, **fields)), None)


# Numbers in tables: "-" for None.

def num(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def ns_to_us(ns):
    return None if ns is None else ns / 1000


def ns_as_us(ns, digits=1):
    return num(ns_to_us(ns), digits)


def rps_as_krps(rps, digits=1, unit=""):
    """Requests a second in thousands, with a thousands separator (1,234.5)."""
    return "-" if rps is None else f"{rps / 1000:,.{digits}f}{unit}"


# Markdown.

def md_row(cells):
    return "| " + " | ".join(cells) + " |"


def md_rule(columns, compact=False):
    """The line under a table's head: | --- | --- | (compact: |---|---|)."""
    return "|" + ("---|" if compact else " --- |") * columns


def md_table(head, rows=(), compact=False):
    """A table's lines: the head's cells, the rule, each row's cells (more rows may follow)."""
    return [md_row(head), md_rule(len(head), compact)] + [md_row(r) for r in rows]


def md_section(title, head, rows, *intro, compact=False):
    """A section's lines: "## TITLE", each INTRO paragraph, the table of HEAD and ROWS, each
    followed by a blank line."""
    return ([f"## {title}", ""] + [line for p in intro for line in (p, "")]
            + md_table(head, rows, compact) + [""])


# Plots.

def pyplot(script):
    """matplotlib.pyplot drawing into files (Agg), or None without matplotlib (said on stderr)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{script}: no matplotlib; no plots", file=sys.stderr)
        return None
    return plt


def style_axes(ax, legend_size=None, grid="major", **props):
    """PROPS on AX (xlabel, yscale, ylim, title...), a light grid and the legend."""
    ax.set(**props)
    ax.grid(True, which=grid, alpha=0.3)
    ax.legend(fontsize=legend_size)


def plot_latency_against_load(ax, points, label):
    """The p50 (solid) and p99 (dashed) of POINTS, in us, against their offered load in kreq/s:
    two lines on AX, named LABEL p50 and LABEL p99."""
    points = sorted(points, key=lambda p: p.get("offered_rps") or 0)
    xs = [(p.get("offered_rps") or 0) / 1000 for p in points]
    for pct, style in (("p50", {"marker": "o"}), ("p99", {"marker": "x", "linestyle": "--"})):
        ax.plot(xs, [(p["latency"].get(f"{pct}_ns") or 0) / 1000 for p in points],
                label=f"{label} {pct}", **style)


def save_chart(plt, fig, ax, path, dpi=120, **style):
    """style_axes(AX, **STYLE), then FIG written into PATH and closed."""
    style_axes(ax, **style)
    save_figure(plt, fig, path, dpi)


def save_figure(plt, fig, path, dpi=120):
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
