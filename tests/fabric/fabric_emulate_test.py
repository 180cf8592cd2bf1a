"""Tests of perf/concord_fabric/emulate.py: tbf shaping delivers the 1gbe profile, and every run
removes what it created (normal exit, SIGTERM, `cleanup` of a dead run's leftovers). Needs root, ip
and tc; exits 77 (ctest: skipped) with the reason otherwise."""
import os
import signal
import subprocess
import sys
import time
import unittest

from concord_fabric import emulate

PERF = os.environ.get("CONCORD_PERF", "")
TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "perf", "concord-fabric")


def left_by(pid):
    """Namespaces of the run of process `pid` (other runs of the tool may be going on)."""
    return [ns for ns in emulate.our_namespaces() if ns.startswith(f"{emulate.PREFIX}{pid}")]


def ranks_running(pid, programs):
    """How many processes below `pid` run one of `programs` (a rank that started: `ip netns exec`
    has entered its namespace and exec'd it), read from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0")[0]
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append((int(entry), argv0))
    count, todo = 0, [pid]
    while todo:
        for child, argv0 in children.get(todo.pop(), []):
            count += os.path.basename(argv0).decode(errors="replace") in programs
            todo.append(child)
    return count


class EmulateTest(unittest.TestCase):
    def assertNothingLeft(self, pid=None):
        self.assertEqual(left_by(os.getpid() if pid is None else pid), [])

    def test_1gbe_caps_a_64_MiB_allreduce_at_125_MBps_and_carries_it(self):
        # The cap must hold on every attempt; that the link carries the traffic (at least half its
        # rate) on one of up to three. How close to the rate it gets is a benchmark's figure
        # (perf/fabric-report, docs/performance.md: 92-95% when quiet), not a test's: on a loaded
        # 2-core machine (load average ~18 seen) the niced ranks sometimes cannot keep even a
        # 1 Gbit link busy (61-82% then; a floor of 85% failed CI on 2026-12-03).
        args = ["--bytes", "64M", "--iters", "3", "--warmup", "1", "--no-raw"]
        fractions = []
        for _ in range(3):
            # Inline path off: with it, the ResNet-50 workload hung intermittently on 1gbe (not
            # this sweep, whose 64 MiB never takes it; off all the same, against flakiness).
            out, rows, info = emulate.run_perf(PERF, 2, "1gbe", args, log=lambda _: None,
                                               timeout=90,
                                               extra_env={"CONCORD_INLINE_THRESHOLD": "0"})
            self.assertNothingLeft()
            self.assertGreater(info["rtt_median_s"], 0)
            (row,) = [r for r in rows if r["implementation"] == "concord"]
            fractions.append(row["busbw_gbps"] * 1e9 / 125e6)
            print(f"1gbe: 64 MiB allreduce busbw {row['busbw_gbps'] * 1e3:.1f} MB/s = "
                  f"{100 * fractions[-1]:.1f}% of 125 MB/s", file=sys.stderr)
            self.assertLessEqual(fractions[-1], 1.0)
            if fractions[-1] >= 0.5:
                break
        self.assertGreaterEqual(max(fractions), 0.5)

    def test_layouts_place_ranks_on_hosts_that_concord_sees(self):
        # Each rank writes its network namespace and local rank; the ranks of a host share one.
        script = ('readlink /proc/self/ns/net > "$0/$CONCORD_RANK"; echo "$CONCORD_LOCAL_RANK '
                  '$CONCORD_LOCAL_SIZE $CONCORD_HOST_ID" >> "$0/$CONCORD_RANK"')
        for placement, hosts_of in (("block", [0, 0, 1, 1]), ("cyclic", [0, 1, 0, 1])):
            with emulate.Emulation(2, "10gbe", ranks_per_host=2, placement=placement) as emu:
                self.assertEqual(len(left_by(os.getpid())), 3)
                emu.run_ranks(["/bin/sh", "-c", script, emu.workdir], timeout=20)
                seen = []
                for k in range(4):
                    with open(os.path.join(emu.workdir, str(k))) as f:
                        seen.append(f.read().split())
            self.assertNothingLeft()
            for k, (ns, local_rank, local_size, host_id) in enumerate(seen):
                same = [j for j in range(4) if seen[j][0] == ns]
                self.assertEqual(same, [j for j in range(4) if hosts_of[j] == hosts_of[k]])
                self.assertEqual(local_rank, str(same.index(k)))
                self.assertEqual(local_size, "2")
                self.assertTrue(host_id.endswith(f"host{hosts_of[k]}"))
        # Concord sees the hosts: CONCORD_HIERARCHICAL=on fails unless there are 2 hosts of 2
        # ranks with shared memory each; a 1 MiB allreduce takes the hierarchical path.
        args = ["--bytes", "1M", "--iters", "2", "--warmup", "1", "--no-raw"]
        for placement in emulate.PLACEMENTS:
            out, rows, info = emulate.run_perf(
                PERF, 2, "10gbe", args, log=lambda _: None, timeout=90, ranks_per_host=2,
                placement=placement, extra_env={"CONCORD_HIERARCHICAL": "on",
                                                "CONCORD_HIERARCHICAL_THRESHOLD": "0"})
            self.assertNothingLeft()
            (row,) = [r for r in rows if r["implementation"] == "concord"]
            self.assertEqual((row["ranks"], info["hosts"], info["placement"]), (4, 2, placement))

    def test_context_removes_everything_on_an_error(self):
        with self.assertRaises(emulate.EmulationError):
            with emulate.Emulation(2, "10gbe") as emu:
                self.assertEqual(len(left_by(os.getpid())), 3)
                workdir = emu.workdir
                emu.run_ranks(["/bin/false"], timeout=20)
        self.assertNothingLeft()
        self.assertFalse(os.path.exists(workdir))

    def test_sigterm_removes_everything(self):
        p = subprocess.Popen([sys.executable, TOOL, "emulate", "--profile", "1gbe", "--np", "2",
                               "--perf", "/bin/sh", "--", "-c", "sleep 60"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if len(left_by(p.pid)) == 3:
                break
            time.sleep(0.1)  # a poll interval
        else:
            p.kill()
            self.fail("the tool did not create its namespaces")
        # The SIGTERM comes while both ranks run (sh, or the sleep it may exec).
        while ranks_running(p.pid, ("sh", "sleep")) < 2:
            if time.monotonic() > deadline:
                p.kill()
                self.fail("the ranks did not start")
            time.sleep(0.1)  # a poll interval
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 2)
        self.assertIn("interrupted", err)
        self.assertNothingLeft(p.pid)

    def test_cleanup_removes_dead_runs_only(self):
        dead = subprocess.Popen(["true"])
        dead.wait()
        leftover = f"{emulate.PREFIX}{dead.pid}-br"
        live = f"{emulate.PREFIX}{os.getpid()}-br"
        for ns in (leftover, live):
            subprocess.run(["ip", "netns", "add", ns], check=True)
        try:
            r = subprocess.run([sys.executable, TOOL, "cleanup"], capture_output=True, text=True,
                               timeout=30)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(leftover, r.stdout)
            now = emulate.our_namespaces()
            self.assertNotIn(leftover, now)
            self.assertIn(live, now)
        finally:
            for ns in (leftover, live):
                subprocess.run(["ip", "netns", "delete", ns], stderr=subprocess.DEVNULL)
        self.assertNothingLeft()
        self.assertNothingLeft(dead.pid)


if __name__ == "__main__":
    why = emulate.missing_requirements()
    if why is None and not os.access(PERF, os.X_OK):
        why = f"concord-perf not found (CONCORD_PERF='{PERF}')"
    if why:
        print(f"SKIPPED: {why}", file=sys.stderr)
        sys.exit(77)
    unittest.main()
