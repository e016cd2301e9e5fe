#!/usr/bin/env python3
"""Runs a guide's shell steps as a reader would, and checks what they print.

  run_guide.py [--prefix DIR] [--timeout S] GUIDE.md WORKDIR

Every ```sh block of GUIDE.md, in order, except one preceded by an HTML comment that starts
`<!-- not run by the test`, becomes one bash script run in WORKDIR (so `cd` and `&` jobs carry
from block to block). A line ending in `# -> TEXT` is a check: the command is run again, up to
--timeout seconds, until its output (stdout and stderr) contains TEXT, as a reader asks a server
again that was not ready yet. Any other command must exit 0, except `kill` and `wait`, whose
status is a job's. What the jobs started is stopped at the end.

--prefix DIR: the SDK is installed under DIR instead of /usr: `/usr/share/caracal` in the
commands becomes DIR/share/caracal, DIR/bin goes first on PATH and CMake finds the package
there. Exit 0: every step ran and every check saw its text; 1 otherwise, with the step.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys

CHECK = re.compile(r"^(?P<cmd>.*?)\s+#\s*->\s*(?P<want>.+?)\s*$")


def steps(markdown):
    """The lines of the blocks that run, each with its line number in the guide."""
    out, block, skip, pending_skip = [], None, False, False
    for number, line in enumerate(markdown.splitlines(), 1):
        stripped = line.strip()
        if block is None:
            if stripped.startswith("<!-- not run by the test"):
                pending_skip = True
            elif stripped.startswith("```"):
                block, skip = stripped[3:].strip(), pending_skip
                pending_skip = False
            elif stripped:
                pending_skip = False
            continue
        if stripped.startswith("```"):
            block = None
            continue
        if block == "sh" and not skip:
            out.append((number, line))
    # Joined continuation lines.
    joined = []
    for number, line in out:
        if joined and joined[-1][1].endswith("\\"):
            joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line.strip())
        else:
            joined.append((number, line))
    return [(n, l) for n, l in joined if l.strip() and not l.strip().startswith("#")]


def script(lines, guide, timeout):
    out = [
        "set -u",
        "fail() { echo \"run_guide: $1\" >&2; kill $(jobs -p) 2>/dev/null; exit 1; }",
        # check LINE WANT CMD: CMD until its output holds WANT, for up to the timeout.
        "check() {",
        "  local where=$1 want=$2 cmd=$3 got end=$((SECONDS + %d))" % timeout,
        "  while :; do",
        "    got=$(eval \"$cmd\" 2>&1)",
        "    case $got in *\"$want\"*) echo \"$got\"; return 0 ;; esac",
        "    [ $SECONDS -lt $end ] || fail \"$where: '$cmd' printed '$got', not '$want'\"",
        "    sleep 0.3",
        "  done",
        "}",
    ]
    for number, line in lines:
        where = "%s:%d" % (os.path.basename(guide), number)
        out.append("echo %s" % shlex.quote("$ " + line.strip()))
        m = CHECK.match(line)
        if m:
            out.append("check %s %s %s" % (shlex.quote(where), shlex.quote(m.group("want")),
                                           shlex.quote(m.group("cmd").strip())))
        elif line.rstrip().endswith("&") or re.match(r"^\s*(kill|wait)\b", line):
            out.append(line)
        else:
            out.append("%s || fail %s" % (line, shlex.quote(where + ": '" + line.strip() +
                                                              "' failed")))
    out.append("kill $(jobs -p) 2>/dev/null; wait; exit 0")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", default="/usr")
    ap.add_argument("--timeout", type=int, default=20)
    ap.add_argument("guide")
    ap.add_argument("workdir")
    a = ap.parse_args()
    lines = steps(open(a.guide, encoding="utf-8").read())
    if not lines:
        print("run_guide: %s has no sh block to run" % a.guide, file=sys.stderr)
        return 1
    env = dict(os.environ)
    if a.prefix != "/usr":
        lines = [(n, l.replace("/usr/share/caracal", a.prefix + "/share/caracal"))
                 for n, l in lines]
        env["PATH"] = a.prefix + "/bin:" + env.get("PATH", "")
        env["CMAKE_PREFIX_PATH"] = a.prefix
    os.makedirs(a.workdir, exist_ok=True)
    text = script(lines, a.guide, a.timeout)
    with open(os.path.join(a.workdir, "guide.sh"), "w", encoding="utf-8") as f:
        f.write(text)
    return subprocess.call(["bash", "guide.sh"], cwd=a.workdir, env=env)


if __name__ == "__main__":
    sys.exit(main())
