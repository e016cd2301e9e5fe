#!/usr/bin/env python3
"""Reconciles a chaos run (bench/chaos/run.sh): the clients' counts by category against the
server's counters of each incarnation. Writes OUT/summary.json and OUT/report.md; exits 1 when a
check fails (a wrong reply, a request not accounted for, counters that do not add up).

    reconcile.py OUT_DIR [--commit C] [--seed S] [--settings TEXT] [--machine TEXT] [--duration S]

What each side counts:
- caracal_loadgen (per client): every request it sent ends as a right reply, an error reply (by
  reason), a wrong reply, lost (UDP: no reply within the timeout; a reply that comes later is
  counted late), connection_lost (TCP: in flight on a connection the server closed or reset) or
  unanswered (in flight at the end). The TCP client also lists its sessions: each connection's
  time from a connect to its break, with what was sent and answered on it.
- snic_server (per incarnation): requests and replies per listener (error replies included),
  drops by reason, the service's dispatched requests, answers and error answers. A server
  stopped with SIGTERM logs its final counters; of a server killed with SIGKILL only the last
  scrape before the kill is known, so its figures are lower bounds.

A TCP connection lives within one server incarnation, so the TCP side is reconciled per
incarnation through the sessions; UDP datagrams carry no incarnation, so UDP is reconciled over
the run, with the requests lost placed in time (by when they were sent) against the restarts:
from a timeout before the stop (what was still in flight then) to the next incarnation serving.
"""
import argparse
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import caracal_bench as cb  # noqa: E402

# UDP drops after which no reply is sent (no_agent and oversize send an error reply).
UDP_NO_REPLY = ("reply_slots", "queue_full", "send_buffer_full", "send_failed")


class Counters:
    """The server counters of one incarnation that the reconciliation uses."""

    def __init__(self, samples):
        self.listener_requests = defaultdict(int)  # by protocol
        self.listener_replies = defaultdict(int)
        self.listener_drops = defaultdict(lambda: defaultdict(int))  # [protocol][reason]
        self.service_requests = self.service_answers = self.service_errors = 0
        self.service_drops = defaultdict(int)
        for name, labels, value in samples:
            v = int(value)
            proto = labels.get("listener", "").split("/")[0]
            if name == "caracal_listener_requests_total":
                self.listener_requests[proto] += v
            elif name == "caracal_listener_replies_total":
                self.listener_replies[proto] += v
            elif name == "caracal_listener_drops_total":
                self.listener_drops[proto][labels.get("reason", "?")] += v
            elif name == "caracal_service_requests_total":
                self.service_requests += v
            elif name == "caracal_service_replies_total":
                self.service_answers += v
            elif name == "caracal_service_errors_total":
                self.service_errors += v
            elif name == "caracal_service_drops_total":
                self.service_drops[labels.get("reason", "?")] += v

    def as_dict(self):
        return {
            "listener_requests": dict(self.listener_requests),
            "listener_replies": dict(self.listener_replies),
            "listener_drops": {p: dict(d) for p, d in self.listener_drops.items()},
            "service_requests": self.service_requests,
            "service_answers": self.service_answers,
            "service_errors": self.service_errors,
            "service_drops": dict(self.service_drops),
        }


def fmt(n):
    return f"{n:,}" if isinstance(n, int) else str(n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--seed", default="")
    ap.add_argument("--settings", default="")
    ap.add_argument("--machine", default="")
    ap.add_argument("--duration", type=float, default=0)
    args = ap.parse_args()
    out = Path(args.out)

    events = cb.read_jsonl(out / "events.jsonl")
    udp, tcp = (cb.read_json(out / f"client-{p}.json") for p in ("udp", "tcp"))

    # ---- the server's incarnations ----
    inc = {}
    for e in events:
        k = e.get("incarnation")
        if e["event"] == "server_start":
            inc[k] = {"k": k, "spawn": e["t"], "how": None, "exit": None, "scrape_t": None}
        elif e["event"] == "server_serving":
            inc[k]["serving"] = e["t"]
        elif e["event"] == "server_stop":
            inc[k]["how"], inc[k]["stop"] = e["how"], e["t"]
        elif e["event"] == "server_exit":
            inc[k]["exit"], inc[k]["rc"] = e["t"], e["rc"]
        elif e["event"] == "scrape":
            inc[k]["scrape_t"] = e["taken"]
        elif e["event"] == "agents_back":
            inc[k]["agents_back"] = e["t"]
    for k, i in inc.items():
        log = (out / f"server-{k}.log").read_text(errors="replace").splitlines()
        finals = [l.split("final counter ", 1)[1] for l in log if "final counter " in l]
        prom = out / f"server-{k}.prom"
        scraped = Counters(cb.metric_samples(prom.read_text().splitlines())) if prom.exists() else None
        i["scraped"] = scraped
        i["exact"] = i["how"] != "kill"
        i["counters"] = Counters(cb.metric_samples(finals)) if i["exact"] else scraped
        if i["counters"] is None:
            i["counters"] = Counters([])
    order = sorted(inc)
    killed = [k for k in order if not inc[k]["exact"]]

    checks = []

    def check(name, ok, detail):
        checks.append({"check": name, "ok": bool(ok), "detail": detail})

    # ---- the clients ----
    cats = {}
    for proto, c in (("udp", udp), ("tcp", tcp)):
        n = c["counts"]
        cats[proto] = n
        wrong_kinds = {k: n[k] for k in ("wrong_other_client", "wrong_other_slot",
                                         "wrong_other_request", "wrong_corrupt",
                                         "wrong_unsolicited")}
        check(f"{proto}: no reply went to the wrong client or request", n["wrong"] == 0,
              f"wrong {n['wrong']} ({wrong_kinds})")
        check(f"{proto}: every request sent is accounted for", n["unaccounted"] == 0,
              f"sent {n['sent']:,} = replies {n['replies']:,} + error replies "
              f"{n['error_replies']:,} + wrong {n['wrong_answered']} + lost {n['lost']:,} + "
              f"connection lost {n['connection_lost']:,} + unanswered {n['unanswered']} "
              f"(unaccounted {n['unaccounted']})")
        check(f"{proto}: nothing left unanswered at the end", n["unanswered"] == 0,
              f"{n['unanswered']} request(s) in flight got no reply within the timeout at the end")

    # ---- TCP, per incarnation, through the sessions ----
    def incarnation_of(t):
        for k in order:
            i = inc[k]
            if i["spawn"] <= t <= (i["exit"] or float("inf")):
                return k
        return None

    per_inc = {k: defaultdict(int) for k in order}
    orphans = []
    for s in tcp.get("sessions", []):
        k = incarnation_of(s["start_unix_s"])
        if k is None:
            orphans.append(s)
            continue
        d = per_inc[k]
        d["sessions"] += 1
        for f in ("sent", "replies", "error_replies", "wrong", "connection_lost", "unanswered"):
            d[f] += s[f]
    check("tcp: every session lies within one server incarnation", not orphans,
          f"{len(orphans)} session(s) started when no server ran")
    tcp_rows = []
    for k in order:
        i, d, c = inc[k], per_inc[k], inc[k]["counters"]
        answered = d["replies"] + d["error_replies"] + d["wrong"]
        q, p = c.listener_requests["tcp"], c.listener_replies["tcp"]
        row = {"incarnation": k, "stopped": i["how"], "exact": i["exact"],
               "client_sessions": d["sessions"], "client_sent": d["sent"],
               "client_answered": answered, "client_connection_lost": d["connection_lost"],
               "client_unanswered": d["unanswered"], "server_requests": q, "server_replies": p,
               "server_drops": dict(c.listener_drops["tcp"])}
        if i["exact"]:
            # Every request the server read got a reply, every reply it wrote was read, and what
            # it never read is what the client lost with the connection.
            row["read_not_replied"] = q - p
            row["replied_not_received"] = p - answered
            row["sent_never_read"] = d["sent"] - q
            check(f"tcp, incarnation {k}: every request the server read was answered", q == p,
                  f"requests {q:,}, replies {p:,}")
            check(f"tcp, incarnation {k}: every reply the server wrote reached its client",
                  p == answered, f"server replies {p:,}, client answers {answered:,}")
            check(f"tcp, incarnation {k}: what the client lost with its connections is what the "
                  "server never read", d["sent"] - q == d["connection_lost"] + d["unanswered"],
                  f"sent {d['sent']:,} - read {q:,} = {d['sent'] - q:,}; connection lost "
                  f"{d['connection_lost']:,}, unanswered {d['unanswered']}")
        else:
            # Killed: the last scrape is a lower bound of what it read and answered.
            row["unscraped_ms"] = round((i["stop"] - i["scrape_t"]) * 1000, 1) if i["scrape_t"] else None
            row["answered_after_scrape"] = answered - p
            check(f"tcp, incarnation {k} (killed): its last scrape is within what the client saw",
                  q <= d["sent"] and p <= answered + d["connection_lost"],
                  f"scraped requests {q:,} <= sent {d['sent']:,}; scraped replies {p:,} <= "
                  f"answered {answered:,} + lost with the connections {d['connection_lost']:,}")
        tcp_rows.append(row)

    # ---- UDP, over the run ----
    tl = udp.get("timeline", {})
    step = tl.get("interval_ms", 50) / 1000
    t0 = tl.get("start_unix_s", 0)
    # A request a restart lost was in flight when the server stopped: sent at most the client's
    # timeout before the stop (an older one was counted lost already), or while no server ran.
    timeout_s = udp["config"]["timeout_ms"] / 1000
    windows = []  # (from, to)
    for a, b in zip(order, order[1:]):
        windows.append((inc[a]["stop"] - timeout_s, inc[b]["serving"]))
    lost_in_windows = lost_elsewhere = 0
    lost_elsewhere_at = []
    for j, n in enumerate(tl.get("lost", [])):
        if not n:
            continue
        lo, hi = t0 + j * step, t0 + (j + 1) * step
        if any(hi > w0 - step and lo < w1 + step for w0, w1 in windows):
            lost_in_windows += n
        else:
            lost_elsewhere += n
            lost_elsewhere_at.append((round(lo - t0, 2), n))
    u = cats["udp"]
    received = u["replies"] + u["error_replies"] + u["late"] + u["late_error_replies"] + u["wrong"]
    q_udp = sum(inc[k]["counters"].listener_requests["udp"] for k in order)
    p_udp = sum(inc[k]["counters"].listener_replies["udp"] for k in order)
    noreply = {r: sum(inc[k]["counters"].listener_drops["udp"].get(r, 0) for k in order)
               for r in UDP_NO_REPLY}
    udp_rows = []
    for k in order:
        c = inc[k]["counters"]
        qq, pp = c.listener_requests["udp"], c.listener_replies["udp"]
        nr = sum(c.listener_drops["udp"].get(r, 0) for r in UDP_NO_REPLY)
        udp_rows.append({"incarnation": k, "stopped": inc[k]["how"], "exact": inc[k]["exact"],
                         "server_requests": qq, "server_replies": pp,
                         "server_drops": dict(c.listener_drops["udp"])})
        if inc[k]["exact"]:
            check(f"udp, incarnation {k}: every datagram the server read was answered or "
                  "dropped with a counted reason", qq == pp + nr,
                  f"requests {qq:,}, replies {pp:,}, drops without a reply {nr:,}")
    if killed:
        check("udp: the servers' known replies are within what the client received",
              p_udp <= received and q_udp <= u["sent"],
              f"server replies {p_udp:,} (incarnations {killed} up to their last scrape) <= "
              f"received {received:,}; server requests {q_udp:,} <= sent {u['sent']:,}")
    else:
        check("udp: every reply the servers sent was received", p_udp == received,
              f"server replies {p_udp:,}, client received {received:,}")
    check("udp: every request lost was in flight at a restart or sent during one, or dropped by "
          "the server with a counted reason", lost_elsewhere <= sum(noreply.values()),
          f"lost {u['lost']:,}: {lost_in_windows:,} sent in the {len(windows)} restarts (or the "
          f"timeout before them), "
          f"{lost_elsewhere:,} elsewhere (at {lost_elsewhere_at[:10]} s), server drops without "
          f"a reply {noreply}")

    # ---- error replies, by reason, against what the server counted ----
    reasons = defaultdict(lambda: {"udp": 0, "tcp": 0})
    for proto, c in (("udp", udp), ("tcp", tcp)):
        for r, n in c.get("error_reasons", {}).items():
            key = "agent lost" if re.fullmatch(r"agent \S+ lost", r) else r
            reasons[key][proto] += n
    agent_lost = reasons["agent lost"]["udp"] + reasons["agent lost"]["tcp"]
    service_errors = sum(inc[k]["counters"].service_errors for k in order)
    no_agent = {p: sum(inc[k]["counters"].listener_drops[p].get("no_agent", 0) for k in order)
                for p in ("udp", "tcp")}
    late_errors = u["late_error_replies"] + cats["tcp"]["late_error_replies"]
    if killed:
        check("errors: the server's known error answers are within the clients' error replies",
              service_errors <= agent_lost + late_errors
              and all(no_agent[p] <= reasons["no agent serves service echo"][p]
                      for p in ("udp", "tcp")),
              f"service errors {service_errors:,} <= 'agent lost' replies {agent_lost:,} (+ late "
              f"{late_errors}); no_agent drops {no_agent} <= 'no agent' replies "
              f"{ {p: reasons['no agent serves service echo'][p] for p in ('udp', 'tcp')} }")
    else:
        check("errors: 'agent lost' error replies are the requests the server failed",
              service_errors == agent_lost + late_errors,
              f"service errors {service_errors:,}, 'agent lost' replies {agent_lost:,}, late "
              f"{late_errors}")
        check("errors: 'no agent' error replies are the server's no_agent drops",
              all(no_agent[p] == reasons["no agent serves service echo"][p]
                  for p in ("udp", "tcp")),
              f"no_agent drops {no_agent}, replies "
              f"{ {p: reasons['no agent serves service echo'][p] for p in ('udp', 'tcp')} }")
    unknown = {r: v for r, v in reasons.items()
               if r not in ("agent lost", "no agent serves service echo")}
    check("errors: no error reply of another kind", not unknown, f"{unknown}")

    # ---- the run's events ----
    kills = [e for e in events if e["event"] == "agent_kill"]
    restarts = [e for e in events if e["event"] == "server_stop" and e["how"] != "end"]
    starts = {(e["agent"], e["t"]) for e in events if e["event"] == "agent_start"}
    reattach = []
    for e in events:
        if e["event"] == "agent_attached":
            st = max(t for a, t in starts if a == e["agent"] and t <= e["t"])
            reattach.append(e["t"] - st)
    down = []
    for e in kills:
        st = min((t for a, t in starts if a == e["agent"] and t > e["t"]), default=None)
        if st:
            down.append(st - e["t"])
    back = [inc[k]["agents_back"] - inc[k]["serving"] for k in order[1:] if "agents_back" in inc[k]]
    gaps = [inc[b]["serving"] - inc[a]["stop"] for a, b in zip(order, order[1:])]

    def stats(xs):
        xs = sorted(xs)
        if not xs:
            return None
        return {"n": len(xs), "min_ms": round(xs[0] * 1000, 1),
                "median_ms": round(xs[len(xs) // 2] * 1000, 1), "max_ms": round(xs[-1] * 1000, 1)}

    ok = all(c["ok"] for c in checks)
    # The machine's 1-minute load average at the start and the end (other work on it shows).
    loadavg = [e.get("loadavg") for e in events if e["event"] in ("run_start", "run_end")]
    summary = {
        "ok": ok,
        "commit": args.commit,
        "seed": args.seed,
        "settings": args.settings,
        "machine": args.machine,
        "duration_s": args.duration,
        "loadavg_start_end": loadavg,
        "agent_kills": len(kills),
        "server_restarts": {"sigterm": sum(1 for e in restarts if e["how"] == "term"),
                            "sigkill": sum(1 for e in restarts if e["how"] == "kill")},
        "agent_down": stats(down),
        "agent_reregistered_after_start": stats(reattach),
        "server_down": stats(gaps),
        "agents_back_after_server_start": stats(back),
        "clients": {p: {k: v for k, v in cats[p].items() if k != "measured"}
                    for p in ("udp", "tcp")},
        "error_reasons": {r: dict(v) for r, v in reasons.items()},
        "udp": {"received": received, "server_requests": q_udp, "server_replies": p_udp,
                "sent_never_read": u["sent"] - q_udp,
                "server_drops_without_reply": noreply, "lost_in_restart_windows": lost_in_windows,
                "lost_elsewhere": lost_elsewhere, "per_incarnation": udp_rows},
        "tcp": {"per_incarnation": tcp_rows},
        "server": {"service_errors": service_errors,
                   "per_incarnation": [{"incarnation": k, "stopped": inc[k]["how"],
                                        "exact": inc[k]["exact"], "rc": inc[k].get("rc"),
                                        **inc[k]["counters"].as_dict()} for k in order]},
        "checks": checks,
    }
    cb.write_json(out / "summary.json", summary, newline=True)

    # ---- the report ----
    md = [f"Chaos run at {args.commit}, seed {args.seed}, {args.duration:.0f} s; {args.machine}; "
          f"load average {loadavg[0] if loadavg else '?'} at the start, "
          f"{loadavg[-1] if loadavg else '?'} at the end", "", f"Settings: {args.settings}", "",
          f"{len(kills)} agent kills (SIGKILL), {len(restarts)} server restarts "
          f"({summary['server_restarts']['sigterm']} SIGTERM, "
          f"{summary['server_restarts']['sigkill']} SIGKILL). Agent down "
          f"{summary['agent_down']}; registered again after its start "
          f"{summary['agent_reregistered_after_start']}; server down (stop to serving) "
          f"{summary['server_down']}; both agents back by themselves after the server "
          f"started {summary['agents_back_after_server_start']}.", "",
          "| what the clients saw | UDP | TCP |", "| --- | ---: | ---: |"]
    rows = [("sent", "sent"), ("right replies", "replies"), ("error replies", "error_replies"),
            ("wrong replies (misdelivered or corrupt)", "wrong"),
            ("lost: no reply within the timeout (UDP)", "lost"),
            ("... of which answered late", "late"),
            ("lost with a connection the server closed or reset (TCP)", "connection_lost"),
            ("unanswered at the end", "unanswered"), ("unaccounted", "unaccounted"),
            ("connections broken / made again (TCP)", None),
            ("receive errors (UDP: port unreachable)", "receive_errors")]
    for label, key in rows:
        md.append(cb.md_row([label] + [
            fmt(cats[p][key]) if key else
            f"{cats[p]['connection_errors']:,} / {cats[p]['reconnects']:,}"
            for p in ("udp", "tcp")]))
    md += ["", "Error replies by reason: " + ", ".join(
        f"{r}: UDP {v['udp']:,}, TCP {v['tcp']:,}" for r, v in sorted(reasons.items())), "",
        "| incarnation | stopped by | TCP sessions | TCP sent | server read | server replied | "
        "client answered | lost with the connections | UDP server requests | UDP server replies "
        "| UDP drops |", "| --- | --- |" + " ---: |" * 8 + " --- |"]
    for t, uu in zip(tcp_rows, udp_rows):
        bound = "" if t["exact"] else " (last scrape)"
        md.append(f"| {t['incarnation']} | {t['stopped']} | {t['client_sessions']} | "
                  f"{t['client_sent']:,} | {t['server_requests']:,}{bound} | "
                  f"{t['server_replies']:,}{bound} | {t['client_answered']:,} | "
                  f"{t['client_connection_lost']:,} | {uu['server_requests']:,}{bound} | "
                  f"{uu['server_replies']:,}{bound} | {uu['server_drops'] or '-'} |")
    md += ["", "| check | held | detail |", cb.md_rule(3)]
    md += [cb.md_row([c["check"], "yes" if c["ok"] else "**NO**", c["detail"]]) for c in checks]
    md.append("")
    cb.write_text(out / "report.md", "\n".join(md))
    print("\n".join(md))
    print("RECONCILED" if ok else "NOT RECONCILED: see the checks marked NO")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
