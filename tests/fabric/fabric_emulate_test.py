"""Tests of perf/concord_fabric/emulate.py: tbf shaping delivers the 1gbe profile, and every run
removes what it created (normal exit, SIGTERM, `cleanup` of a dead run's leftovers). Needs root, ip
and tc; exits 77 (ctest: skipped) with the reason otherwise."""
import os
import signal
import subprocess
import sys
import tempfile
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


def stopped(pid, wait_s=5):
    """Whether process `pid` has ended within wait_s (gone, or a zombie its new parent has not
    reaped yet)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)  # a poll interval


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

    def test_what_a_host_receives_is_shaped_too(self):
        # Two hosts send to a third at once: each sender's own link allows 125 MB/s, so only the
        # shaping of the receiver's link (its bridge end) holds the sum to 125 MB/s.
        receiver = ("import socket, sys, threading, time\n"
                    "s = socket.socket(); s.bind((sys.argv[1], 18000)); s.listen(2)\n"
                    "got = [0, 0]\n"
                    "def read(c, k):\n"
                    "  while True:\n"
                    "    d = c.recv(1 << 20)\n"
                    "    if not d: return\n"
                    "    got[k] += len(d)\n"
                    "threads = [threading.Thread(target=read, args=(s.accept()[0], k)) "
                    "for k in range(2)]\n"
                    "start = time.perf_counter()\n"
                    "for t in threads: t.start()\n"
                    "for t in threads: t.join()\n"
                    "print(sum(got) / (time.perf_counter() - start))\n")
        sender = ("import socket, sys, time\n"
                  "for _ in range(100):\n"
                  "  try: c = socket.create_connection((sys.argv[1], 18000)); break\n"
                  "  except OSError: time.sleep(0.05)\n"
                  "end = time.perf_counter() + 1.5\n"
                  "while time.perf_counter() < end: c.sendall(bytes(1 << 20))\n")
        with emulate.Emulation(3, "1gbe") as emu:
            r = emu.spawn(0, [sys.executable, "-c", receiver, emu.address(0)],
                          stdout=subprocess.PIPE, text=True)
            senders = [emu.spawn(h, [sys.executable, "-c", sender, emu.address(0)])
                       for h in (1, 2)]
            for p in senders:
                p.wait(timeout=30)
            out, _ = r.communicate(timeout=30)
        self.assertNothingLeft()
        rate = float(out)
        print(f"1gbe: 2 senders into one host: {rate / 1e6:.1f} MB/s", file=sys.stderr)
        self.assertLessEqual(rate, 125e6)

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

    def test_a_signal_while_closing_still_removes_everything(self):
        # A second Ctrl-C or SIGTERM that lands while close() deletes the namespaces.
        real_run = emulate._run
        sent = []

        def run_and_signal(args, check=True):
            if args[:3] == ["ip", "netns", "delete"] and not sent:
                sent.append(args)
                os.kill(os.getpid(), signal.SIGTERM)
            return real_run(args, check)

        emulate.install_signal_handlers()  # as the tool does: SIGTERM unwinds
        emulate._run = run_and_signal
        try:
            with self.assertRaises(KeyboardInterrupt):
                with emulate.Emulation(2, "10gbe"):
                    self.assertEqual(len(left_by(os.getpid())), 3)
        finally:
            emulate._run = real_run
        self.assertTrue(sent)
        self.assertNothingLeft()

    def test_ranks_that_print_a_lot_do_not_stall_the_run(self):
        # Rank 1 writes 1 MiB to stdout and stderr before rank 0 may finish: more than a pipe holds.
        script = ('if [ "$CONCORD_RANK" = 1 ]; then head -c 1048576 /dev/zero; '
                  'head -c 1048576 /dev/zero >&2; touch "$0/done"; else '
                  'while [ ! -e "$0/done" ]; do sleep 0.05; done; echo rank0; fi')
        with emulate.Emulation(2, "10gbe") as emu:
            out = emu.run_ranks(["/bin/sh", "-c", script, emu.workdir], timeout=15)
        self.assertEqual(out, "rank0\n")
        self.assertNothingLeft()

    def test_a_deadline_unwinds_a_hung_run(self):
        # What this file's main does against ctest's TIMEOUT (a SIGKILL, after which nothing can
        # remove the namespaces or stop the ranks).
        with tempfile.TemporaryDirectory() as d:
            code = ("import sys\nfrom concord_fabric import emulate\n"
                    "emulate.install_signal_handlers(deadline_s=2)\n"
                    "with emulate.Emulation(2, '10gbe') as emu:\n"
                    "    emu.run_ranks(['/bin/sh', '-c', 'echo $$ >> \"$0/pids\"; exec sleep 60', "
                    "sys.argv[1]], timeout=600)\n")
            p = subprocess.Popen([sys.executable, "-c", code, d], stderr=subprocess.PIPE,
                                 text=True)
            try:
                _, err = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                self.fail("the deadline did not end the run")
            finally:
                self.assertNothingLeft(p.pid)
            self.assertIn("signal 14", err)  # SIGALRM
            with open(os.path.join(d, "pids")) as f:
                pids = f.read().split()
        self.assertEqual(len(pids), 2)
        for pid in pids:
            self.assertTrue(stopped(int(pid)), f"rank {pid} still runs")

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

    def test_cleanup_after_sigkill_stops_the_ranks_and_removes_the_run_directory(self):
        p = subprocess.Popen([sys.executable, TOOL, "emulate", "--profile", "1gbe", "--np", "2",
                              "--perf", "/bin/sh", "--", "-c", "sleep 60"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while ranks_running(p.pid, ("sh", "sleep")) < 2:
            if time.monotonic() > deadline:
                p.kill()
                self.fail("the ranks did not start")
            time.sleep(0.1)  # a poll interval
        p.kill()
        p.wait()
        ranks = []
        for ns in left_by(p.pid):
            out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            ranks += [int(x) for x in out.stdout.split()]
        self.assertGreaterEqual(len(ranks), 2)  # sh, and sleep unless sh exec'd it
        workdirs = [d for d in os.listdir(tempfile.gettempdir())
                    if d.startswith(f"{emulate.PREFIX}{p.pid}-")]
        self.assertEqual(len(workdirs), 1)
        r = subprocess.run([sys.executable, TOOL, "cleanup", "--pid", str(p.pid)],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNothingLeft(p.pid)
        for pid in ranks:
            self.assertTrue(stopped(pid), f"rank {pid} still runs")
        self.assertFalse(os.path.exists(os.path.join(tempfile.gettempdir(), workdirs[0])))

    def test_cleanup_leaves_names_outside_its_scheme(self):
        # Only cfab-<pid>-br and cfab-<pid>-<host> are the tool's; others may be anyone's.
        others = [f"{emulate.PREFIX}{os.getpid()}x1-br", f"{emulate.PREFIX}test"]
        try:
            for ns in others:
                subprocess.run(["ip", "netns", "add", ns], check=True)
            r = subprocess.run([sys.executable, TOOL, "cleanup", "--all", "--pid",
                                str(os.getpid())], capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 0, r.stderr)
            now = emulate.our_namespaces()
            for ns in others:
                self.assertIn(ns, now)
        finally:
            for ns in others:
                subprocess.run(["ip", "netns", "delete", ns], stderr=subprocess.DEVNULL)

    def test_cleanup_removes_dead_runs_only(self):
        dead = subprocess.Popen(["true"])
        dead.wait()
        leftover = f"{emulate.PREFIX}{dead.pid}-br"
        live = f"{emulate.PREFIX}{os.getpid()}-br"
        try:
            for ns in (leftover, live):
                subprocess.run(["ip", "netns", "add", ns], check=True)
            # Limited to these two runs: other runs' leftovers are not this test's to remove.
            r = subprocess.run([sys.executable, TOOL, "cleanup", "--pid", str(dead.pid), "--pid",
                                str(os.getpid())], capture_output=True, text=True, timeout=30)
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


# Under ctest's TIMEOUT of this test (tests/fabric/CMakeLists.txt): unwind and remove everything
# before ctest kills the process.
DEADLINE_S = 100

if __name__ == "__main__":
    why = emulate.missing_requirements()
    if why is None and not os.access(PERF, os.X_OK):
        why = f"concord-perf not found (CONCORD_PERF='{PERF}')"
    if why:
        print(f"SKIPPED: {why}", file=sys.stderr)
        sys.exit(77)
    emulate.install_signal_handlers(deadline_s=DEADLINE_S)
    unittest.main()
