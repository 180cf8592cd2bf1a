"""perf/gloo_algos end to end at 2 ranks over small sizes: every algorithm of every size gives a
figure on both sides (the backend may refuse an algorithm, as it does bcube), and the header says
that both sides are timed alike, back to back after the warm-up (the backend side once had a
barrier before every run and the raw side not, so the two columns measured different things).

Usage: gloo_algos_test.py GLOO_ALGOS
"""
import re
import subprocess
import sys

from checks import check, finish

GLOO_ALGOS = sys.argv[1]

p = subprocess.run([GLOO_ALGOS, "2", "3", "1"], capture_output=True, text=True, timeout=120)
out = p.stdout + p.stderr
check(p.returncode == 0, "gloo_algos 2 3 1 exits 0", out)
lines = p.stdout.splitlines()
check(bool(lines) and "median of 3 iterations, back to back after 2 warm-up" in lines[0],
      "the header says both sides run back to back after the warm-up", out)
# 4 KiB to 1 MiB by 4: five sizes, five algorithms each, "BACKEND / RAW" in milliseconds.
cell = r"\s+(?:[0-9.]+|refused) /\s+[0-9.]+"
rows = [line for line in lines[2:] if re.fullmatch(r"\s*[0-9]+" + cell * 5, line)]
check(len(rows) == 5 and len(lines) == 7, "five sizes, each with a figure on both sides", out)
check("n/a" not in out, "no algorithm failed", out)

finish()
print("all passed")
