#!/usr/bin/env python3
"""The fault-injection suite: no silent hangs (README.md beside this file).

Runs fault_rank (fault_rank.cc) as N ranks for each scenario, class x ranks x backend x launcher,
checks that every surviving rank gets an error naming the culprit within the class's threshold +
5 s and that every process exits non-zero on its own, and prints the matrix:

  run_faults.py --driver build/tests/faults/fault_rank --concordrun build/tools/concordrun
                [--mpirun mpirun] [--class C]... [--backend B]... [--launcher L]... [--np N]...
                [--ops allreduce|mixed] [-j JOBS] [--log-dir DIR] [--json FILE]

Exit status: 0 when every scenario run passed, 1 when one failed, 77 when none could run (e.g.
only partition scenarios and no root), 2 for a usage error.

Every scenario runs under this script's own limits: ranks must start within START_LIMIT_S, the
culprit must inject within FAULT_LIMIT_S of that, and everything must have ended by the fault +
the class's threshold + 5 s + CONCORD_TIMEOUT_S + 2 s (the finalize after an error may wait for
its barrier). Whatever still runs then is SIGKILLed, to clean up, and the scenario FAILS ("needed
SIGKILL"). Network namespaces it creates are removed at the end of their scenario, on failure
too, and leftovers of runs that died are removed at the start of the next.
"""

import argparse
import concurrent.futures
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

CLASSES = ["missing", "mismatch", "crash", "stop", "partition", "uneven"]
BACKENDS = ["gloo", "mpi"]
LAUNCHERS = ["concordrun", "plain"]
NPS = [3, 4]

# Short thresholds, so that the whole matrix runs in a few minutes.
TIMEOUT_S = 2
STALL_WARNING_S = 1
STALL_SHUTDOWN_S = 3
MARGIN_S = 5  # "within the configured threshold + 5 s"
# The setting each class's detection is measured against (seconds).
THRESHOLD = {
    "missing": STALL_SHUTDOWN_S,  # the stall shutdown fails the tensor on the ranks waiting
    "mismatch": 0,  # negotiation refuses it at once
    "crash": TIMEOUT_S,  # a closed connection, at worst a collective's deadline
    "stop": TIMEOUT_S,  # a silent peer (liveness) or a collective's deadline
    "partition": TIMEOUT_S,  # the same, with nothing closed
    "uneven": TIMEOUT_S,  # the early rank's finalize barrier waits at most this long
}
# Which tensor the error must name, where the fault concerns one.
TENSOR = {"missing": "grad.1", "mismatch": "grad.1"}
# The grace under MPI (concordrun --backend mpi --grace, which becomes mpirun's --mca
# odls_base_sigkill_timeout, and that option itself for plain mpirun). Open MPI waits it out twice
# (before SIGTERM, before SIGKILL) even when every rank has exited, so an MPI job whose rank failed
# ends about 2 x grace after the first exit: the limit for everything to have ended grows by that
# under MPI (the ranks' own exits are not given more time: they must not be killed). A stopped
# culprit, continued once the others have ended, needs its collective's deadline (2 s) to find
# out; Open MPI SIGTERMs what is left about 1 s after the first exit with a grace of 3 s, 2 s
# with 5 s, more than 4 s with 8 s (measured here), so stop gets 8 s.
MPIRUN_GRACE_S = {"stop": 8}
MPIRUN_GRACE_DEFAULT_S = 5
START_LIMIT_S = 20
FAULT_LIMIT_S = 20
LAUNCHER_SETTLE_S = 1.0  # an MPI launcher's time to end by itself once every rank has exited
EXIT_ALLOWANCE_S = TIMEOUT_S + 2  # after the detection limit: finalize (barrier) and exit

NETNS_PREFIX = "cflt-"
SUBNET = "10.233.0."
# MPI over the partition's network: TCP between ranks (shared memory would bypass the links), on
# each rank's eth0, and mpirun in the bridge's namespace (br0: BRIDGE_ADDR) so that ranks reach
# it, PMIx included (its clients connect over TCP), over their links like the rest: a cut rank is
# cut from mpirun too, as a host is when its cable is pulled.
BRIDGE_ADDR = "10.233.0.254"
MPI_PARTITION_ENV = {"OMPI_MCA_btl": "tcp,self", "OMPI_MCA_btl_tcp_if_include": "eth0",
                     "OMPI_MCA_oob_tcp_if_include": "br0",
                     "PMIX_MCA_ptl_tcp_remote_connections": "1",
                     "PMIX_MCA_ptl_tcp_if_include": "br0"}

MARKER = "FAULT_RANK "
ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def monotonic():
    # CLOCK_MONOTONIC, as the ranks' "t" fields.
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def run_cmd(args):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# ---- network namespaces (partition) ----

def partition_unavailable():
    """Why the partition class cannot run here, or None."""
    if os.geteuid() != 0:
        return "partition needs root (network namespaces); skipped"
    if shutil.which("ip") is None:
        return "partition needs 'ip' (iproute2); skipped"
    probe = f"{NETNS_PREFIX}{os.getpid()}-probe"
    made = run_cmd(["ip", "netns", "add", probe])
    if made.returncode != 0:
        return f"'ip netns add' failed ({made.stderr.strip()}); partition skipped"
    run_cmd(["ip", "netns", "delete", probe])
    return None


def remove_leftover_namespaces():
    """Deletes namespaces named by this script for runs whose process is gone."""
    listing = run_cmd(["ip", "netns", "list"]).stdout if shutil.which("ip") else ""
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(NETNS_PREFIX):
            continue
        pid = name[len(NETNS_PREFIX):].split("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            run_cmd(["ip", "netns", "delete", name])


class Network:
    """Rank k in namespace <base>-r<k> (eth0: 10.233.0.<k+1>/24), joined by a veth pair to the
    bridge br0 in <base>-br (ends p0..pN-1). cut(k) takes p<k> down: rank k's link, as if pulled
    at the switch; nothing is closed, packets are dropped. Nothing is made in the host's own
    namespace. close() deletes everything; it runs whatever happened."""

    def __init__(self, base, ranks):
        self.base = base
        self.bridge = f"{base}-br"
        self.rank_ns = [f"{base}-r{k}" for k in range(ranks)]
        self.created = []

    def _ip(self, *args):
        r = run_cmd(["ip"] + list(args))
        if r.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")

    def create(self):
        self._ip("netns", "add", self.bridge)
        self.created.append(self.bridge)
        self._ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        self._ip("-n", self.bridge, "link", "set", "br0", "up")
        for k, ns in enumerate(self.rank_ns):
            self._ip("netns", "add", ns)
            self.created.append(ns)
            self._ip("-n", self.bridge, "link", "add", f"p{k}", "type", "veth", "peer", "name",
                     "eth0", "netns", ns)
            self._ip("-n", self.bridge, "link", "set", f"p{k}", "master", "br0")
            self._ip("-n", self.bridge, "link", "set", f"p{k}", "up")
            self._ip("-n", ns, "addr", "add", f"{SUBNET}{k + 1}/24", "dev", "eth0")
            self._ip("-n", ns, "link", "set", "eth0", "up")
            self._ip("-n", ns, "link", "set", "lo", "up")

    def address_bridge(self):
        """Gives the bridge namespace BRIDGE_ADDR on br0 (for a launcher that runs there)."""
        self._ip("-n", self.bridge, "addr", "add", f"{BRIDGE_ADDR}/24", "dev", "br0")
        self._ip("-n", self.bridge, "link", "set", "lo", "up")

    def cut(self, k):
        self._ip("-n", self.bridge, "link", "set", f"p{k}", "down")

    def close(self):
        for ns in reversed(self.created):
            run_cmd(["ip", "netns", "delete", ns])
        self.created = []


# ---- processes ----

def pid_alive(pid, driver_name):
    """Whether `pid` still runs fault_rank (not a zombie, not a reused pid)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X") and driver_name.encode() in cmdline


def pid_stopped(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


class Job:
    """The processes of one scenario (one launcher, or N ranks) and their merged output."""

    def __init__(self):
        self.procs = []  # (label, Popen)
        self.lines = queue.Queue()  # (monotonic, label, line)
        self.log = []  # every line, "+s label: text"
        self.readers = []
        self.watching = threading.Event()

    def watch_events(self, directory):
        """Reads the ranks' event files (fault_rank's FAULT_RANK_EVENTS_DIR: <pid>.events, one
        line per write) into `lines` as they grow, until finish_reading: a rank's events arrive
        whatever its launcher does with its stdout (mpirun forwards it late, or never when it
        is ended)."""
        self.watching.set()
        reader = threading.Thread(target=self._watch, args=(directory,), daemon=True)
        reader.start()
        self.readers.append(reader)

    def _watch(self, directory):
        offsets = {}
        while True:
            last = not self.watching.is_set()
            for name in sorted(os.listdir(directory)):
                path = os.path.join(directory, name)
                with open(path, "rb") as f:
                    f.seek(offsets.get(name, 0))
                    data = f.read()
                end = data.rfind(b"\n") + 1  # whole lines only
                offsets[name] = offsets.get(name, 0) + end
                for raw in data[:end].splitlines():
                    self.lines.put((monotonic(), "events", raw.decode(errors="replace")))
            if last:
                return
            time.sleep(0.02)

    def start(self, label, argv, env):
        p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((label, p))
        reader = threading.Thread(target=self._read, args=(label, p.stdout), daemon=True)
        reader.start()
        self.readers.append(reader)
        return p

    def _read(self, label, stream):
        for raw in iter(stream.readline, b""):
            self.lines.put((monotonic(), label, raw.decode(errors="replace").rstrip("\n")))
        stream.close()

    def running(self):
        return any(p.poll() is None for _, p in self.procs)

    def kill_all(self):
        """SIGKILLs every process group still running; returns their labels."""
        killed = []
        for label, p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                killed.append(label)
        for _, p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        return killed

    def finish_reading(self):
        self.watching.clear()
        for r in self.readers:
            r.join(timeout=2)


# ---- one scenario ----

class Scenario:
    def __init__(self, cls, np_, backend, launcher, index, opts):
        self.cls, self.np, self.backend, self.launcher = cls, np_, backend, launcher
        self.index = index
        self.opts = opts
        self.culprit = np_ - 1
        self.threshold = THRESHOLD[cls]
        self.limit = self.threshold + MARGIN_S

    @property
    def name(self):
        ops = "" if self.opts.ops == "allreduce" else f"/{self.opts.ops}"
        return f"{self.cls}/np{self.np}/{self.backend}/{self.launcher}{ops}"

    def launcher_name(self):
        if self.launcher == "concordrun":
            return "concordrun --backend mpi" if self.backend == "mpi" else "concordrun"
        return "mpirun" if self.backend == "mpi" else "file store"

    @property
    def launcher_linger(self):
        # mpirun waits out its kill timeout twice after a rank failed, even once all have exited.
        return 2 * self.mpirun_grace if self.backend == "mpi" else 0

    @property
    def mpirun_grace(self):
        return MPIRUN_GRACE_S.get(self.cls, MPIRUN_GRACE_DEFAULT_S)

    def env(self):
        env = dict(os.environ)
        for k in list(env):
            if k.startswith("CONCORD_") or k.startswith("OMPI_") or k.startswith("PMIX_"):
                del env[k]
        env.update({"CONCORD_TIMEOUT_S": str(TIMEOUT_S),
                    "CONCORD_STALL_WARNING_S": str(STALL_WARNING_S),
                    "CONCORD_STALL_SHUTDOWN_S": str(STALL_SHUTDOWN_S)})
        if self.backend == "mpi":
            env.update(ROOT_ENV)
        return env

    def driver_args(self, go_file):
        args = [self.opts.driver, "--class", self.cls, "--ops", self.opts.ops]
        if self.cls == "partition":
            args += ["--go-file", go_file]
        return args

    def run(self):
        result = {"scenario": self.name, "class": self.cls, "np": self.np,
                  "backend": self.backend, "launcher": self.launcher_name(),
                  "threshold_s": self.threshold, "limit_s": self.limit}
        if self.cls == "partition" and self.opts.partition_unavailable:
            result.update(status="SKIP", problems=[self.opts.partition_unavailable])
            return result
        workdir = tempfile.mkdtemp(prefix="concord-faults-")
        network = None
        job = Job()
        began = self.t0 = monotonic()
        try:
            if self.cls == "partition":
                network = Network(f"{NETNS_PREFIX}{os.getpid()}-{self.index}", self.np)
                network.create()
                if self.backend == "mpi":
                    network.address_bridge()
            self._launch(job, workdir, network)
            outcome = self._supervise(job, network, os.path.join(workdir, "link-down"))
        except (OSError, RuntimeError) as e:  # the machinery, not Concord: say so
            result.update(status="FAIL", problems=[f"the runner could not run it: {e}"],
                          ranks=[], timeline=[], launcher_rc=[], detected="-", named="-",
                          exited="-", detect_s=None, end_s=None)
            outcome = None
        finally:
            job.kill_all()
            job.finish_reading()
            self._drain(job, None)
            if network is not None:
                network.close()
            shutil.rmtree(workdir, ignore_errors=True)
        if outcome is not None:
            result.update(self._evaluate(outcome))
        result["wall_s"] = round(monotonic() - began, 2)
        result["log"] = job.log
        return result

    def _launch(self, job, workdir, network):
        events = os.path.join(workdir, "events")
        os.mkdir(events)
        env = dict(self.env(), FAULT_RANK_EVENTS_DIR=events)
        if self.backend == "mpi":
            # Open MPI's session directory and shared-memory segments, which a failed job leaves
            # behind (about 8 MiB each), go into this scenario's directory, removed after it.
            env.update(OMPI_MCA_orte_tmpdir_base=workdir,
                       OMPI_MCA_btl_vader_backing_directory=workdir)
        job.watch_events(events)
        go_file = os.path.join(workdir, "link-down")
        driver = self.driver_args(go_file)
        store = f"file://{workdir}/store"
        if self.backend == "gloo" and self.launcher == "plain":
            for k in range(self.np):
                rank_env = dict(env, CONCORD_RANK=str(k), CONCORD_SIZE=str(self.np),
                                CONCORD_STORE=store, CONCORD_JOB_ID=f"faults{self.index}")
                argv = driver
                if network is not None:
                    rank_env["CONCORD_IFACE"] = "eth0"
                    argv = ["ip", "netns", "exec", network.rank_ns[k]] + driver
                job.start(f"[{k}]", argv, rank_env)
        elif self.backend == "gloo":
            argv = [self.opts.concordrun, "-np", str(self.np), "--timeout", str(TIMEOUT_S)]
            if network is not None:
                # concordrun's store listens on the loopback of this namespace, which a rank in
                # its own namespace cannot reach: the ranks meet in a file store instead.
                # concordrun still starts, supervises, stops and reports them.
                argv += ["sh", "-c",
                         'ns="$0-r$CONCORD_RANK"; store="$1"; shift; exec ip netns exec "$ns" '
                         'env CONCORD_STORE="$store" CONCORD_IFACE=eth0 "$@"',
                         network.base, store]
            job.start("concordrun", argv + driver, env)
        elif self.launcher == "concordrun":
            argv = [self.opts.concordrun, "-np", str(self.np), "--backend", "mpi", "--timeout",
                    str(TIMEOUT_S), "--grace", str(self.mpirun_grace)]
            argv, driver, env = self._mpi_network(network, argv, driver, env)
            job.start("concordrun", argv + driver, env)
        else:
            # What README.md ("Under your own mpirun") tells users to pass: without it Open MPI
            # SIGTERMs every rank 1 s after one fails, before the survivors can report.
            argv = [self.opts.mpirun, "-np", str(self.np), "--oversubscribe", "--tag-output",
                    "--mca", "odls_base_sigkill_timeout", str(self.mpirun_grace),
                    "-x", "CONCORD_BACKEND=mpi", "-x", "FAULT_RANK_EVENTS_DIR"]
            for var in ("CONCORD_TIMEOUT_S", "CONCORD_STALL_WARNING_S",
                        "CONCORD_STALL_SHUTDOWN_S"):
                argv += ["-x", var]
            argv, driver, env = self._mpi_network(network, argv, driver, env)
            job.start("mpirun", argv + driver, env)

    @staticmethod
    def _mpi_network(network, argv, driver, env):
        """An MPI launch over the partition's network (MPI_PARTITION_ENV), else unchanged."""
        if network is None:
            return argv, driver, env
        wrap = ["sh", "-c", 'exec ip netns exec "$0-r$OMPI_COMM_WORLD_RANK" "$@"', network.base]
        return (["ip", "netns", "exec", network.bridge] + argv, wrap + driver,
                dict(env, **MPI_PARTITION_ENV))

    def _drain(self, job, events):
        """Moves the lines read so far into the log (and the events list, when given)."""
        while True:
            try:
                t, label, line = job.lines.get_nowait()
            except queue.Empty:
                return
            self._take(job, events, t, label, line)

    def _take(self, job, events, t, label, line):
        job.log.append(f"{t - self.t0:8.3f} {label} {line}")
        if events is None:
            return
        at = line.find(MARKER)
        if at < 0:
            return
        try:
            events.append(json.loads(line[at + len(MARKER):]))
        except ValueError:
            job.log.append(f"{t - self.t0:8.3f} runner: cannot parse the line above")

    def _supervise(self, job, network, go_file):
        """Runs the job to its end (or the limits); returns what happened."""
        events = []
        out = {"events": events, "t_fault": None, "killed": [], "timeline": [],
               "resumed_at": None, "problem": None}
        driver_name = os.path.basename(self.opts.driver)
        deadline = self.t0 + START_LIMIT_S
        phase = "start"
        resume_at = None
        all_gone_at = None
        while True:
            try:
                t, label, line = job.lines.get(timeout=0.02)
                self._take(job, events, t, label, line)
            except queue.Empty:
                pass
            now = monotonic()
            starts = {e["rank"]: e for e in events if e["event"] == "start"}
            pids = {r: e["pid"] for r, e in starts.items()}
            fault = next((e for e in events if e["event"] == "fault"), None)
            if phase == "start" and len(starts) == self.np:
                phase = "fault"
                deadline = now + FAULT_LIMIT_S
            if phase in ("start", "fault") and fault is not None:
                phase = "after"
                if self.cls == "partition":
                    network.cut(self.culprit)
                    out["t_fault"] = monotonic()
                    out["timeline"].append(f"link of rank {self.culprit} down at "
                                           f"+{out['t_fault'] - self.t0:.3f} s")
                    open(go_file, "w").close()
                else:
                    out["t_fault"] = fault["t"]
                deadline = out["t_fault"] + self.limit + EXIT_ALLOWANCE_S + self.launcher_linger
                if self.cls == "stop":
                    resume_at = out["t_fault"] + self.limit
            if self.cls == "stop" and resume_at is not None and out["resumed_at"] is None:
                culprit_pid = pids.get(self.culprit)
                others_done = all(self._rank_done(events, r, pids.get(r), driver_name)
                                  for r in range(self.np) if r != self.culprit)
                if now >= resume_at or others_done:
                    if culprit_pid and pid_alive(culprit_pid, driver_name):
                        os.kill(culprit_pid, signal.SIGCONT)
                        out["resumed_at"] = monotonic()
                        out["timeline"].append(
                            f"SIGCONT to rank {self.culprit} at "
                            f"+{out['resumed_at'] - out['t_fault']:.3f} s after the fault")
                        deadline = max(deadline, out["resumed_at"] + EXIT_ALLOWANCE_S + 1 +
                                       self.launcher_linger)
                    else:
                        out["resumed_at"] = -1
                        out["timeline"].append(
                            f"rank {self.culprit} was gone before it could be continued")
            launcher_done = not job.running()
            ranks_left = [r for r, pid in pids.items() if pid_alive(pid, driver_name)]
            if launcher_done and not ranks_left and job.lines.empty():
                break
            if (self.backend == "mpi" and phase == "after" and len(pids) == self.np and
                    not ranks_left and not launcher_done):
                # Every rank has exited (its events come from its events file, not through the
                # launcher): what is left is mpirun waiting out its kill timeout twice
                # (launcher_linger), Open MPI's, not Concord's. Give the launcher a second to end
                # by itself, then end it.
                all_gone_at = all_gone_at or now
                if now - all_gone_at >= LAUNCHER_SETTLE_S:
                    ended = job.kill_all()  # under MPI the job's processes are its launcher
                    out["timeline"].append(
                        f"every rank had exited; the suite ended {', '.join(ended)} (waiting "
                        f"out its kill timeout) at +{now - (out['t_fault'] or self.t0):.1f} s")
            if now >= deadline:
                if phase == "start":
                    out["problem"] = (f"only {len(starts)} of {self.np} ranks started within "
                                      f"{START_LIMIT_S} s")
                elif phase == "fault":
                    out["problem"] = f"the culprit did not inject within {FAULT_LIMIT_S} s"
                self._kill_leftovers(job, pids, driver_name, out, now)
                break
        job.finish_reading()
        self._drain(job, events)
        out["launcher_rc"] = [(label, p.returncode) for label, p in job.procs]
        out["log"] = job.log
        return out

    def _kill_leftovers(self, job, pids, driver_name, out, now):
        when = "at the limit"
        if out["t_fault"] is not None:
            when = f"+{now - out['t_fault']:.1f} s after the fault"
        alive = {r for r, pid in pids.items() if pid_alive(pid, driver_name)}
        for r in sorted(alive):
            state = " (stopped)" if pid_stopped(pids[r]) else ""
            out["killed"].append(f"rank {r}{state}")
            try:
                os.kill(pids[r], signal.SIGKILL)
            except ProcessLookupError:
                pass
        for label in job.kill_all():
            if label.startswith("["):
                if int(label[1:-1]) not in alive:
                    out["killed"].append(f"rank {label[1:-1]}")
            else:
                out["killed"].append(label)
        out["timeline"].append(f"runner SIGKILLed {', '.join(out['killed']) or 'nothing'} {when}")

    @staticmethod
    def _rank_done(events, rank, pid, driver_name):
        if any(e["rank"] == rank and e["event"] in ("exit", "signal") for e in events):
            return True
        return pid is not None and not pid_alive(pid, driver_name)

    @staticmethod
    def _how_it_ended(out, rank):
        """What the launchers saw of a rank that printed no exit line."""
        for label, rc in out["launcher_rc"]:
            if label == f"[{rank}]" and rc is not None and rc < 0:
                return f"killed by {signal.Signals(-rc).name}"
            if label == f"[{rank}]" and rc is not None:
                return f"exit status {rc}"
        for line in out["log"]:
            m = re.search(rf"concordrun: rank {rank} \(pid \d+\) was killed by signal (\d+)", line)
            if m is None:
                m = re.search(rf"process rank {rank} with PID \d+ .*exited on signal (\d+)", line)
            if m is not None:
                return f"killed by {signal.Signals(int(m.group(1))).name} (the launcher says)"
        return "no exit line, nothing from the launcher: SIGKILLed by it, presumably"

    # ---- the criteria ----

    def _names_culprit(self, message):
        c = self.culprit
        return re.search(rf"\branks? (?:\d+, )*{c}\b", message) is not None

    def _evaluate(self, out):
        """The criteria, per rank and for the scenario: status, problems and the matrix cells."""
        t_fault = out["t_fault"]
        problems = [out["problem"]] if out["problem"] else []
        must_report = [r for r in range(self.np)
                       if not (r == self.culprit and self.cls == "crash")]
        # Named: the survivors always; the culprit only where its own message is about it.
        must_name = [r for r in must_report if r != self.culprit or self.cls == "mismatch"]
        warnings = {}  # informational: the first warning of the library on each rank
        for line in out["log"]:
            m = re.search(r"\[concord rank (\d+)\] WARNING (.*)", line)
            if m is not None:
                warnings.setdefault(int(m.group(1)), m.group(2))
        rows, detect_times = [], []
        counts = {"detected": 0, "named": 0, "exited": 0}
        for r in range(self.np):
            ev = [e for e in out["events"] if e.get("rank") == r]
            role = "culprit" if r == self.culprit else "survivor"
            fault = next((e for e in ev if e["event"] == "fault"), None)
            if r == self.culprit and self.cls == "crash":
                rows.append(f"rank {r} (culprit): {fault['detail'] if fault else 'no fault line'}")
                continue
            parts = []
            if r == self.culprit:
                parts.append(f"fault: {fault['detail']}" if fault else "no fault line")
            if r == self.culprit and self.cls == "stop" and (out["resumed_at"] or 0) > 0:
                parts.append(f"continued at +{out['resumed_at'] - t_fault:.2f} s")
            report = self._rank_report(r, ev, out, r in must_name)
            parts += report["parts"]
            problems += report["problems"]
            if report["error_t"] is not None:
                counts["detected"] += 1
                if t_fault is not None and not (r == self.culprit and self.cls == "stop"):
                    detect_times.append(report["error_t"] - t_fault)
            counts["named"] += report["named"]
            counts["exited"] += report["exited"]
            if r in warnings:
                parts.append(f"warned: {warnings[r]}")
            rows.append(f"rank {r} ({role}): " + "; ".join(parts))
        if out["killed"]:
            problems.append("needed SIGKILL: " + ", ".join(out["killed"]))
        n = len(must_report)
        return {"status": "FAIL" if problems else "PASS", "problems": problems, "ranks": rows,
                "timeline": out["timeline"], "launcher_rc": out["launcher_rc"],
                "detected": f"{counts['detected']}/{n}",
                "named": f"{counts['named']}/{len(must_name)}",
                "exited": f"{counts['exited']}/{n}",
                "detect_s": round(max(detect_times), 2) if detect_times else None}

    def _rank_report(self, r, ev, out, must_name):
        """One reporting rank: its error (when, what), whether it names the culprit, its end."""
        t_fault = out["t_fault"]

        def rel(t):
            return t - t_fault if t_fault is not None else float("nan")

        def first(kind):
            return next((e for e in ev if e["event"] == kind), None)

        parts, problems = [], []
        errors = [e for e in ev if e["event"] == "error"]
        failed = [e for e in ev if e["event"] == "failed"]
        fin, ex, sig, init_failed = first("finalize"), first("exit"), first("signal"), \
            first("init_failed")
        if init_failed:
            parts.append(f"init failed: {init_failed['status']}: {init_failed['message']}")
        # Its error: the first failed request of the step that failed, or (the uneven culprit)
        # a failed finalize.
        error_t, messages = None, []
        if errors:
            error_t = min([errors[0]["error_t"]] + [f["t"] for f in failed])
            messages = errors[0]["messages"]
            parts.append(f"error +{rel(error_t):.2f} s: {errors[0]['status']}: "
                         + " | ".join(messages))
        elif failed:
            error_t = failed[0]["t"]
            tensors = ", ".join(f"{f['tensor']} {f['status']} at +{rel(f['t']):.2f} s"
                                for f in failed)
            parts.append(f"requests failed ({tensors}) but the step had not ended (another wait "
                         "had not returned) when the process ended, so no message was read")
        elif self.cls == "uneven" and r == self.culprit and fin and fin["status"] != "SUCCESS":
            error_t, messages = fin["t"], [fin["message"]]
        if error_t is None:
            what = "no error"
            if self.cls == "uneven" and r == self.culprit and fin is not None:
                what = f"its early finalize returned {fin['status']} after {fin['seconds']} s"
            role = "culprit" if r == self.culprit else "survivor"
            problems.append(f"rank {r} ({role}) got no error: {what}")
        elif rel(error_t) > self.limit and not (r == self.culprit and self.cls == "stop"):
            problems.append(f"rank {r} got its error {rel(error_t):.2f} s after the fault "
                            f"(limit {self.limit} s)")
        named = 0
        if error_t is not None and must_name:
            tensor = TENSOR.get(self.cls)
            if not messages:
                problems.append(f"rank {r}: a request failed at +{rel(error_t):.2f} s, but the "
                                "rank never finished the step to read its message")
            elif any(self._names_culprit(m) and (tensor is None or f"'{tensor}'" in m)
                     for m in messages):
                named = 1
            else:
                want = f"rank {self.culprit}" + (f" and tensor '{tensor}'" if tensor else "")
                problems.append(f"rank {r}: the error does not name {want}")
        if fin is not None:
            parts.append(f"finalize {fin['status']} in {fin['seconds']:.2f} s" +
                         (f" ({fin['message']})" if fin["message"] else ""))
        # Its end: an exit line, a terminating signal it reported, or neither.
        exited = 0
        if ex is not None:
            parts.append(f"exit {ex['code']} at +{rel(ex['t']):.2f} s")
            if ex["code"] == 0:
                problems.append(f"rank {r} exited 0")
            else:
                exited = 1
        elif sig is not None:
            name = signal.Signals(sig["signal"]).name
            parts.append(f"killed by {name} at +{rel(sig['t']):.2f} s")
            problems.append(f"rank {r} did not exit on its own: {name} (from the launcher) at "
                            f"+{rel(sig['t']):.2f} s")
        elif f"rank {r}" in [k.split(" (")[0] for k in out["killed"]]:
            parts.append("SIGKILLed by the runner")  # counted once, as "needed SIGKILL"
        else:
            how = self._how_it_ended(out, r)
            parts.append(f"no exit line: {how}")
            problems.append(f"rank {r} did not exit on its own: {how}")
        return {"parts": parts, "problems": problems, "error_t": error_t, "named": named,
                "exited": exited}


# ---- the matrix ----

def print_matrix(results, out=sys.stdout):
    head = (f"{'class':<10} {'np':>2} {'backend':<7} {'launcher':<24} {'result':<6} "
            f"{'detected':>8} {'named':>6} {'seconds':>7} {'limit':>5} {'exited':>6} "
            f"{'wall':>5}")
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in results:
        if r["status"] in ("SKIP", "N/A"):
            print(f"{r['class']:<10} {r['np']:>2} {r['backend']:<7} {r['launcher']:<24} "
                  f"{r['status']:<6} {r['problems'][0]}", file=out)
            continue
        secs = "-" if r["detect_s"] is None else f"{r['detect_s']:.2f}"
        print(f"{r['class']:<10} {r['np']:>2} {r['backend']:<7} {r['launcher']:<24} "
              f"{r['status']:<6} {r['detected']:>8} {r['named']:>6} {secs:>7} "
              f"{r['limit_s']:>5} {r['exited']:>6} {r['wall_s']:>5.1f}", file=out)
    print("(detected: ranks that got an error, of those that must; named: whose error names the "
          "culprit (and tensor); seconds: the slowest detection after the fault; limit: the "
          "class's threshold + 5 s; exited: ranks that exited non-zero on their own)", file=out)


def print_details(results, out=sys.stdout):
    for r in results:
        if r["status"] != "FAIL":
            continue
        print(f"\n== FAIL {r['scenario']} ({r['launcher']})", file=out)
        for p in r["problems"]:
            print(f"   - {p}", file=out)
        for line in r["timeline"]:
            print(f"   runner: {line}", file=out)
        for line in r["ranks"]:
            print(f"   {line}", file=out)
        print(f"   launcher exit status: {r['launcher_rc']}", file=out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--driver", required=True, help="the fault_rank binary")
    ap.add_argument("--concordrun", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--class", dest="classes", action="append", choices=CLASSES)
    ap.add_argument("--backend", dest="backends", action="append", choices=BACKENDS)
    ap.add_argument("--launcher", dest="launchers", action="append", choices=LAUNCHERS)
    ap.add_argument("--np", dest="nps", action="append", type=int, choices=NPS)
    ap.add_argument("--ops", choices=["allreduce", "mixed"], default="allreduce",
                    help="each step's requests (fault_rank --ops): three allreduces, or one of "
                         "every operation")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="scenarios at once")
    ap.add_argument("--log-dir", help="write each scenario's full output there")
    ap.add_argument("--json", help="write the results there")
    opts = ap.parse_args()
    opts.driver = os.path.abspath(opts.driver)
    if not os.access(opts.driver, os.X_OK) or not os.access(opts.concordrun, os.X_OK):
        ap.error("--driver and --concordrun must be executables")
    classes = opts.classes or CLASSES
    backends = opts.backends or BACKENDS
    if "mpi" in backends and not (opts.mpirun and shutil.which(opts.mpirun)):
        ap.error(f"--backend mpi: mpirun '{opts.mpirun}' not found")
    opts.partition_unavailable = None
    if "partition" in classes:
        opts.partition_unavailable = partition_unavailable()
        if opts.partition_unavailable is None:
            remove_leftover_namespaces()
    scenarios = []
    for cls in classes:
        for backend in backends:
            for launcher in opts.launchers or LAUNCHERS:
                for np_ in opts.nps or NPS:
                    scenarios.append(Scenario(cls, np_, backend, launcher, len(scenarios), opts))

    # SIGTERM (ctest's timeout) unwinds like ^C, so every scenario's cleanup runs.
    def interrupted(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, interrupted)

    began = monotonic()
    results = [None] * len(scenarios)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
        futures = {pool.submit(s.run): i for i, s in enumerate(scenarios)}
        for f in concurrent.futures.as_completed(futures):
            i = futures[f]
            results[i] = f.result()
            r = results[i]
            extra = f" ({r['detect_s']} s)" if r.get("detect_s") is not None else ""
            print(f"{r['status']:<5} {r['scenario']}{extra}", flush=True)
    print(f"\nfault-injection matrix ({len(scenarios)} scenarios, {monotonic() - began:.1f} s; "
          f"CONCORD_TIMEOUT_S={TIMEOUT_S}, CONCORD_STALL_WARNING_S={STALL_WARNING_S}, "
          f"CONCORD_STALL_SHUTDOWN_S={STALL_SHUTDOWN_S}; culprit: the last rank; requests: "
          f"{opts.ops})\n")
    print_matrix(results)
    print_details(results)
    if opts.log_dir:
        os.makedirs(opts.log_dir, exist_ok=True)
        for r in results:
            if "log" in r:
                with open(os.path.join(opts.log_dir, r["scenario"].replace("/", "_") + ".log"),
                          "w") as f:
                    f.write("\n".join(r["log"]) + "\n")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump([{k: v for k, v in r.items() if k != "log"} for r in results], f, indent=1)
    ran = [r for r in results if r["status"] in ("PASS", "FAIL")]
    if any(r["status"] == "FAIL" for r in ran):
        return 1
    return 0 if ran else 77


if __name__ == "__main__":
    sys.exit(main())
