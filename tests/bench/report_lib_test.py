#!/usr/bin/env python3
"""bench/lib/caracal_bench.py, and each report script that uses it on a small run in the shape
its driver writes: the lines the reports print for it. Python's standard library only (the
plots are left out where matplotlib is missing, as in the reports). Measures nothing.

    report_lib_test.py [SOURCE_DIR]
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SRC = os.path.abspath(sys.argv.pop(1) if len(sys.argv) > 1 else
                      os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "bench", "lib"))
import caracal_bench as cb  # noqa: E402

SOCKPERF = """sockperf: [Valid Duration] RunTime=4.545 sec; SentMessages=910; ReceivedMessages=908
sockperf: # dropped messages = 2; # duplicated messages = 0; # out-of-order messages = 1
sockperf: Summary: Round trip is 228.152 usec
sockperf: ---> <MAX> observation = 3191.901
sockperf: ---> percentile 99.900 = 3172.854
sockperf: ---> percentile 99.000 = 1474.417
sockperf: ---> percentile 50.000 =   83.339
"""
PAGE = """# HELP caracal_queue_answered_requests answered
caracal_queue_answered_requests{service="echo",agent="a0",queue="0"} 10
caracal_queue_answered_requests{service="echo",agent="a0",queue="1"} 5
caracal_queue_answered_requests{service="echo",agent="a1",queue="0"} 7
caracal_service_latency_seconds_sum{service="echo"} 0.5
caracal_service_latency_seconds_count{service="echo"} 1000
"""


def loadgen(rps, p50_ns, p99_ns):
    return {"throughput_rps": rps, "offered_rps": rps, "errors": {}, "config": {}, "machine": {},
            "latency": {"p50_ns": p50_ns, "p99_ns": p99_ns, "p999_ns": 2 * p99_ns,
                        "cdf": [[50, p50_ns], [99, p99_ns]]},
            "counts": {"sent": 10, "replies": 10, "wrong": 0, "lost": 0, "connection_errors": 0}}


def write_run(results, run, points, files):
    raw = os.path.join(results, "raw")
    os.makedirs(raw, exist_ok=True)
    cb.write_json(os.path.join(raw, "run.json"), run)
    cb.write_text(os.path.join(raw, "points.jsonl"),
                  "".join(json.dumps(p) + "\n\n" for p in points))
    for name, body in files.items():
        cb.write_text(os.path.join(raw, name), body if isinstance(body, str) else json.dumps(body))


def script(*args):
    p = subprocess.run([sys.executable, os.path.join(SRC, "bench", args[0])] + list(args[1:]),
                       capture_output=True, text=True)
    assert p.returncode in (0, 1), p.stderr
    return p.stdout


class Library(unittest.TestCase):
    def test_numbers_and_tables(self):
        self.assertEqual(cb.median([3, None, 1, 2]), 2)
        self.assertEqual(cb.median([4, 1, 2, 3]), 2.5)
        self.assertIsNone(cb.median([None]))
        self.assertEqual([cb.ns_as_us(12345), cb.ns_as_us(None), cb.ns_as_us(999, 0)],
                         ["12.3", "-", "1"])
        self.assertEqual([cb.rps_as_krps(1234567), cb.rps_as_krps(2500, 0, "k")],
                         ["1,234.6", "2k"])
        self.assertEqual(cb.md_table(["a", "b"], [["1", "2"]]), ["| a | b |", "| --- | --- |",
                                                                 "| 1 | 2 |"])
        self.assertEqual(cb.md_rule(2, compact=True), "|---|---|")
        pts = [{"k": 1, "v": "x"}, {"k": 2}, {"k": 1, "v": "y"}]
        self.assertEqual(len(cb.matching(pts, k=1)), 2)
        self.assertEqual(cb.first(pts, k=1)["v"], "x")
        self.assertIsNone(cb.first(pts, k=3))

    def test_sockperf_and_metrics(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "s.txt")
            cb.write_text(path, SOCKPERF)
            s = cb.sockperf(path)
            self.assertEqual(cb.sockperf(os.path.join(d, "none.txt")), {})
        self.assertEqual((s["round_trip"], s["avg_us"], s["max_us"], s["percentile_us"][99.9]),
                         (True, 228.152, 3191.901, 3172.854))
        self.assertEqual((s["sent"], s["received"], s["dropped"], s["out_of_order"]),
                         (910, 908, 2, 1))
        samples = cb.metric_samples(PAGE.splitlines())
        self.assertEqual(len(samples), 5)
        self.assertEqual(samples[2], ("caracal_queue_answered_requests",
                                      {"service": "echo", "agent": "a1", "queue": "0"}, 7.0))


class Reports(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def read(self, *path):
        with open(os.path.join(self.d, *path)) as f:
            return f.read()

    def test_compare(self):
        params = {"duration_s": 1, "warmup_s": 0.3, "server_threads": 2, "loadgen_threads": 2,
                  "sat_connections": 4, "sat_window": 8, "batch": 64, "batch_timeout_us": 20,
                  "sizes": "64", "low_load_rounds": 0}
        run = {"date_utc": "D", "commit": "C", "cpu_only": True, "gpu": "", "cpu_model": "M",
               "online_cpus": 2, "kernel": "K", "servers": "caracal cpu", "low_load_servers": "",
               "caracal_accelerator": "cpu", "params": params, "failed_points": 0}
        pts, files = [], {"sp.txt": SOCKPERF}
        for s, k in (("caracal", 1), ("cpu", 2)):
            for kind in ("latency", "saturation"):
                pts.append({"server": s, "handler": "echo", "proto": "udp", "size": 64,
                            "kind": kind, "cpu_cores": 1.0 * k, "threads": {},
                            "json": f"{s}{kind}.json"})
                files[f"{s}{kind}.json"] = loadgen(100000 * k, 10000 * k, 20000 * k)
        pts.append({"server": "cpu", "handler": "echo", "proto": "udp", "size": 64,
                    "kind": "sockperf", "sockperf": "sp.txt"})
        write_run(self.d, run, pts, files)
        script("compare/report.py", self.d)
        md = self.read("compare.md")
        self.assertIn("| udp | 64 | 10.0 | 20.0 | 40.0 | 20.0 | 40.0 | 80.0 |", md)
        self.assertIn("| udp | 64 | 100.0 | 1.00 | 100.0 | 200.0 | 2.00 | 100.0 |", md)
        self.assertIn("| cpu | 64 | 228.2 | 83.3 | 1474.4 | 3172.9 | 2 |", md)
        self.assertEqual(json.loads(self.read("compare.json"))["points"][-1]["sockperf_latency"],
                         {"round_trip": True, "avg_us": 228.152, "p50_us": 83.339,
                          "p99_us": 1474.417, "p999_us": 3172.854, "max_us": 3191.901,
                          "dropped": 2, "duplicated": 0, "out_of_order": 1})

    def test_gpus(self):
        params = {"threads": 2, "engine_threads": "default", "dispatch": "round_robin",
                  "agent_queues": 4, "gpu_burst": 1, "batch": 64, "batch_timeout_us": 20,
                  "duration_s": 1, "warmup_s": 0.3, "size": 1024, "rounds": 4, "protos": "udp",
                  "sat_connections": 4, "sat_window": 8}
        run = {"date_utc": "D", "commit": "C", "cpu_model": "M", "online_cpus": 2, "kernel": "K",
               "cpu_only": True, "accelerators": 2, "servers": "caracal", "params": params,
               "failed_points": 0}
        pts = [{"experiment": "scaling", "server": "caracal", "accelerators": n, "proto": "udp",
                "kind": "saturation", "cpu_cores": float(n), "json": f"n{n}.json"} for n in (1, 2)]
        write_run(self.d, run, pts, {"n1.json": loadgen(100000, 50000, 90000),
                                     "n2.json": loadgen(180000, 50000, 90000), "page.txt": PAGE})
        script("compare/gpus_report.py", self.d)
        self.assertIn("| caracal | udp | 100.0 (1.00x; 1.0; 50 / 90) | "
                      "180.0 (1.80x; 2.0; 50 / 90) |", self.read("gpus.md"))
        self.assertEqual(script("compare/gpus_report.py", "--scrape",
                                os.path.join(self.d, "raw", "page.txt")), "a0\t15\na1\t7\n")

    def test_threads(self):
        for name, t, rps in (("old", 2, 100000), ("new", 2, 150000), ("new", 4, 250000)):
            pts = [{"server": "caracal", "handler": "matvec", "proto": "udp", "size": 1024,
                    "kind": "saturation", "throughput_rps": rps, "process_cores": t / 2,
                    "engine_idle_cores": 0.5, "latency": {}, "counts": {}},
                   {"server": "caracal", "handler": "matvec", "proto": "udp", "size": 1024,
                    "kind": "latency", "latency": {"p50_ns": 30000}}]
            os.makedirs(os.path.join(self.d, name, f"t{t}"))
            cb.write_json(os.path.join(self.d, name, f"t{t}", "compare.json"),
                          {"params": {"agents": 1}, "points": pts})
        out = script("compare/threads_report.py", self.d)
        self.assertIn("| 4 | - | - | - | - | - | - us | 250k | 2.0 | 125k | 3.5 | 71k | 30.0 us |",
                      out)
        self.assertIn("| matvec, UDP 1024 B | **150k** (2, 150k, 1.0) | - | - | - |", out)

    def test_instances(self):
        run = {"commit": "C", "date": "D", "accelerator": "cpu", "gpus": 0, "gpu": "", "cpu": "M",
               "cpus": 4, "physical_cores": 0, "kernel": "K",
               "params": {"layouts": "1x2 2x1", "protos": "udp", "size": 64, "rounds": 1,
                          "duration_s": 1, "conns_per_thread": 2, "sat_window": 4,
                          "threads_per_agent": 2, "agent_queues": 4}}
        pts, files = [], {}
        for layout, servers in (("1x2", 1), ("2x1", 2)):
            for i in range(servers):
                pts.append({"layout": layout, "round": 1, "proto": "udp", "server": i,
                            "loadgen_rc": 0, "cpu_cores": 1.0, "server_cpus_cores": None,
                            "probe_idle": None, "probe_load": None, "json": f"{layout}-{i}.json"})
                files[f"{layout}-{i}.json"] = loadgen(100000, 10000, 20000)
        write_run(self.d, run, pts, files)
        script("compare/instances_report.py", self.d)
        self.assertIn("| udp | 2x1 | 200 | 2.0 | 100 | 100 |  | 1.00x | - |",
                      self.read("instances.md"))

    def test_idle(self):
        cb.write_text(os.path.join(self.d, "rounds.jsonl"), json.dumps(
            {"policy": "spin", "round": 1, "idle_agent_cores": 1.0, "idle_server_cores": 0.01,
             "busy": "b.txt", "sparse": "none.txt"}) + "\n")
        cb.write_text(os.path.join(self.d, "b.txt"), SOCKPERF)
        out = script("idle/report.py", self.d, "C", "M", "D", "5", "5", "200")
        self.assertIn("| spin | 1.000 | 0.010 | 83.3 | 1474.4 | - | - | - |", out)
        self.assertIn("| spin | 1 | 1.000 | 0.010 | 83.3 | 1474.4 | 908/910 | - | - | -/- |", out)


if __name__ == "__main__":
    unittest.main()
