#!/usr/bin/env python3
"""Medians of low-load-pairs.csv, TX lines on against off: per machine, and over the pairs of
1cd19c5 (machines D and E)."""
import csv
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
rows = list(csv.DictReader(open(os.path.join(HERE, "low-load-pairs.csv"))))


def col(rs, key):
    return [float(r[key]) for r in rs]


def gap(rs, a, b):
    return [float(r[a]) - float(r[b]) for r in rs]


def describe(xs):
    return f"{statistics.median(xs):.2f} ({min(xs):.2f} to {max(xs):.2f})"


for machine in ("D", "E", "H", None):
    rs = [r for r in rows
          if r["machine"] == machine or (machine is None and r["commit"] == "1cd19c5")]
    name = machine or "D and E (1cd19c5)"
    on = [r for r in rs if r["tx_lines"] == "on"]
    off = [r for r in rs if r["tx_lines"] == "off"]
    print(f"== machine {name}: {len(on)} pairs, commit {rs[0]['commit']}")
    for label, key in (("sockperf", "sockperf_p50_us"), ("loadgen udp", "udp_p50_us"),
                       ("loadgen tcp", "tcp_p50_us")):
        for tx, group in (("on", on), ("off", off)):
            print(f"  {label:12s} tx_lines {tx:3s}: Caracal {describe(col(group, 'caracal_' + key))}"
                  f", over the CPU server {describe(gap(group, 'caracal_' + key, 'cpu_' + key))}")
        paired = [float(a["caracal_" + key]) - float(b["caracal_" + key]) for a, b in zip(on, off)]
        print(f"  {label:12s} Caracal on - off, paired: {describe(paired)}")
    for label, key in (("saturation udp", "caracal_udp_sat_kreqs"),
                       ("saturation tcp", "caracal_tcp_sat_kreqs")):
        print(f"  {label}: on {describe(col(on, key))}, off {describe(col(off, key))} k req/s")
