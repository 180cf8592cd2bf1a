"""The perf tests' checks, shared: check() prints "ok: WHAT" or "FAIL: WHAT" with the output that
shows why, and counts the failures; finish() then exits 1 naming how many, if any."""
import sys

failures = 0


def check(ok, what, out=""):
    global failures
    if ok:
        print(f"ok: {what}")
    else:
        failures += 1
        print(f"FAIL: {what}\n{out}")


def finish():
    if failures:
        print(f"{failures} failure(s)")
        sys.exit(1)
