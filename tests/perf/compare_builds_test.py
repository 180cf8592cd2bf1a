"""perf/compare_builds.py on two made-up builds whose concordrun prints a canned concord-perf sweep
of 3 ranks: the size asked for (4K) is the row's key even where concord-perf printed the size it
ran (4092 bytes, rounded down; once the ratios were keyed by that and the table showed nan), and a
run without a Concord / best raw ratio is an error, not a blank.

Usage: compare_builds_test.py   (no build needed)
"""
import os
import stat
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "perf",
                      "compare_builds.py")


def make_build(root, ratio):
    for sub, name in (("tools", "concordrun"), ("perf", "concord-perf")):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
        path = os.path.join(root, sub, name)
        with open(path, "w") as f:
            if ratio is None:
                f.write("#!/bin/sh\necho '[0]         4092  concord  40.0  0.1  0.1'\n")
            else:
                f.write("#!/bin/sh\necho '[0]         4092  concord  40.0  0.1  0.1'\n"
                        "echo '[0]               concord/best raw: time x%s, busbw x1.0'\n" % ratio)
        os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)


def run(old, new):
    return subprocess.run([sys.executable, SCRIPT, "--old", old, "--new", new, "--rounds", "2",
                           "--np", "3", "--sizes", "4K"], capture_output=True, text=True,
                          timeout=60)


with tempfile.TemporaryDirectory() as tmp:
    old, new, bare = (os.path.join(tmp, n) for n in ("old", "new", "bare"))
    make_build(old, "2.00")
    make_build(new, "1.00")
    make_build(bare, None)
    p = run(old, new)
    row = [line for line in p.stdout.splitlines() if line.startswith("4096 B")]
    if p.returncode != 0 or not row or row[0].split()[-1] != "0.50":
        print("FAIL: the 4K row holds both builds' ratios and new/old = 0.50\n" + p.stdout +
              p.stderr)
        sys.exit(1)
    print("ok: the 4K row is keyed by the size asked for")
    p = run(old, bare)
    if p.returncode == 0 or "no Concord / best raw ratio" not in p.stderr:
        print("FAIL: a run without a ratio is an error\n" + p.stdout + p.stderr)
        sys.exit(1)
    print("ok: a run without a ratio is an error")
print("PASS")
