"""Emulated links: H hosts, each a network namespace, joined to a bridge by veth pairs; L ranks
per host (the layout H x L; 1 rank per host unless asked).

Layout of one run (every name carries the tool's prefix and this process's pid, so concurrent runs
never collide and `cleanup` can tell leftovers of dead runs from live ones):
  cfab-<pid>-br   a namespace holding the bridge br0 and the bridge ends p0..pH-1 of the veths
  cfab-<pid>-<h>  host h's namespace: eth0 (the other veth end) with 10.231.0.<h+1>/24, and lo
  $TMPDIR/cfab-<pid>-XXXX  the run's directory: the ranks' file store, their output, --json rows
Nothing is created in the host's own namespace. The ranks run in sessions of their own (a
terminal's Ctrl-C reaches the tool only); if the tool is killed (SIGKILL) they go on running in
its namespaces, and `cleanup` stops them (the processes `ip netns pids` lists in the namespaces of
a dead run) before it deletes the namespaces and the run's directory.

Each link is shaped in both directions with tbf (eth0's egress: what the host sends; p<h>'s
egress: what it receives), the burst scaled with the rate (1 ms of traffic: tbf under-delivers
with a fixed small burst). The kernel has no netem, so no
latency can be added: the run measures and states the round trip the links have (veth: ~20-50 us).

Ranks are placed on hosts in blocks (rank k on host k // L, as mpirun, Slurm and torchrun place
them by default) or cyclically (rank k on host k % H, mpirun --map-by node). The ranks of host h
run in its namespace: they share its one shaped link (as the GPUs of a server share its NIC),
talk to each other over its loopback, and are told they share a host by CONCORD_HOST_ID (`ip
netns exec` gives every process its own mount namespace, which Concord's own host identity counts,
so without it each rank would look like a host of its own): the ranks of a host use shared
memory, and a layout with L > 1 on several hosts runs Concord's hierarchical collectives unless
CONCORD_HIERARCHICAL=off.
"""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PREFIX = "cfab-"
# tbf's queue: at most this much delay before it drops (the limit in bytes follows from the rate).
TBF_LATENCY = "20ms"
SUBNET = "10.231.0."

# The names this tool gives its namespaces (group 1: the pid of the run that made them).
OUR_NAME = re.compile(r"^cfab-(\d+)-(br|\d+)$")
# Signals that unwind a run (install_signal_handlers); held back while namespaces are made or
# deleted, so that no name is left unrecorded or undeleted.
UNWINDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM)

# How ranks are spread over hosts (Emulation.host_of).
PLACEMENTS = ("block", "cyclic")

# name -> (tc rate, bits per second)
PROFILES = {
    "1gbe": ("1gbit", 1e9),
    "10gbe": ("10gbit", 10e9),
    "25gbe": ("25gbit", 25e9),
}


class EmulationError(RuntimeError):
    pass


def missing_requirements():
    """Why emulation cannot run here, or None."""
    if os.geteuid() != 0:
        return "emulation needs root (network namespaces, veth, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (Debian package iproute2)"
    return None


def _run(args, check=True):
    result = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and result.returncode != 0:
        raise EmulationError(f"{' '.join(args)}: {result.stderr.strip() or result.returncode}")
    return result


def burst_bytes(bits_per_second):
    """tbf burst: 1 ms worth of the rate, at least 64 KiB (one GSO super-packet must fit)."""
    return max(65536, int(bits_per_second / 8 / 1000))


def our_namespaces():
    """Namespaces whose name starts with the tool's prefix (also names outside its scheme)."""
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines()
            if line.strip() and line.split()[0].startswith(PREFIX)]


@contextlib.contextmanager
def _signals_held():
    """Holds back UNWINDING_SIGNALS in this thread; a pending one is delivered on leaving."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, UNWINDING_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_processes_in(ns):
    """SIGKILLs the processes that run in namespace `ns` (a dead run's ranks)."""
    out = _run(["ip", "netns", "pids", ns], check=False).stdout
    for pid in out.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def cleanup_leftovers(all_runs=False, pids=None):
    """Removes what runs of this tool (names matching OUR_NAME) whose process is gone left: stops
    the processes in their namespaces, deletes the namespaces and the runs' directories; with
    all_runs, also those of live runs; with pids, only those of the runs of these pids. Returns
    the namespaces deleted."""

    def wanted(pid):
        return (pids is None or pid in pids) and (all_runs or not _pid_alive(pid))

    removed = []
    with _signals_held():
        for ns in our_namespaces():
            match = OUR_NAME.match(ns)
            if not match or not wanted(int(match.group(1))):
                continue
            _kill_processes_in(ns)
            _run(["ip", "netns", "delete", ns], check=False)
            removed.append(ns)
        tmp = tempfile.gettempdir()
        for entry in os.listdir(tmp):
            match = re.match(r"^cfab-(\d+)-", entry)
            if match and wanted(int(match.group(1))):
                shutil.rmtree(os.path.join(tmp, entry), ignore_errors=True)
    return removed


class Emulation(contextlib.AbstractContextManager):
    """One emulated network of `hosts` namespaces shaped to `profile`, `ranks_per_host` ranks on
    each; removed on exit.

    Use as a context manager: everything created is deleted on leaving it, also on an exception.
    SIGINT/SIGTERM are turned into exceptions while it is active (install_signal_handlers). Not
    thread-safe.
    """

    def __init__(self, hosts, profile, ranks_per_host=1, placement="block"):
        if profile not in PROFILES:
            raise EmulationError(f"unknown profile '{profile}' (known: {', '.join(PROFILES)})")
        if not 2 <= hosts <= 64:
            raise EmulationError("hosts must be between 2 and 64")
        if not 1 <= ranks_per_host <= 16:
            raise EmulationError("ranks per host must be between 1 and 16")
        if placement not in PLACEMENTS:
            raise EmulationError(f"unknown placement '{placement}' (known: "
                                 f"{', '.join(PLACEMENTS)})")
        self.placement = placement
        self.hosts = hosts
        self.ranks_per_host = ranks_per_host
        self.ranks = hosts * ranks_per_host
        self.profile = profile
        self.base = f"{PREFIX}{os.getpid()}"
        self.bridge_ns = f"{self.base}-br"
        self.host_ns = [f"{self.base}-{h}" for h in range(hosts)]
        self.created = []
        self.processes = []
        self.workdir = None

    def address(self, host):
        return f"{SUBNET}{host + 1}"

    def host_of(self, rank):
        if self.placement == "cyclic":
            return rank % self.hosts
        return rank // self.ranks_per_host

    def local_rank_of(self, rank):
        if self.placement == "cyclic":
            return rank // self.hosts
        return rank % self.ranks_per_host

    def __enter__(self):
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _netns_add(self, ns):
        with _signals_held():
            _run(["ip", "netns", "add", ns])
            self.created.append(ns)

    def _create(self):
        rate, bps = PROFILES[self.profile]
        burst = burst_bytes(bps)
        self.workdir = tempfile.mkdtemp(prefix=f"{self.base}-")
        self._netns_add(self.bridge_ns)
        br = ["ip", "-n", self.bridge_ns]
        _run(br + ["link", "add", "br0", "type", "bridge"])
        _run(br + ["link", "set", "br0", "up"])
        for k, ns in enumerate(self.host_ns):
            self._netns_add(ns)
            _run(br + ["link", "add", f"p{k}", "type", "veth", "peer", "name", "eth0", "netns", ns])
            _run(br + ["link", "set", f"p{k}", "master", "br0"])
            _run(br + ["link", "set", f"p{k}", "up"])
            inside = ["ip", "-n", ns]
            _run(inside + ["addr", "add", f"{self.address(k)}/24", "dev", "eth0"])
            _run(inside + ["link", "set", "eth0", "up"])
            _run(inside + ["link", "set", "lo", "up"])
            for where, dev in ((ns, "eth0"), (self.bridge_ns, f"p{k}")):
                _run(["ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                      "rate", rate, "burst", str(burst), "latency", TBF_LATENCY])

    def close(self):
        with _signals_held():
            self._close()

    def _close(self):
        for p in self.processes:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
        for p in self.processes:
            with contextlib.suppress(Exception):
                p.wait(timeout=10)
        self.processes = []
        for ns in reversed(self.created):
            _run(["ip", "netns", "delete", ns], check=False)
        self.created = []
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def spawn(self, host, argv, env=None, **kwargs):
        """Starts argv inside host's namespace in its own process group; killed on close()."""
        full_env = dict(os.environ if env is None else env)
        p = subprocess.Popen(["ip", "netns", "exec", self.host_ns[host]] + argv, env=full_env,
                             start_new_session=True, **kwargs)
        self.processes.append(p)
        return p

    def round_trip(self, count=200):
        """Median and minimum seconds of a 1-byte TCP ping-pong from host 0 to host 1."""
        port = 17000 + os.getpid() % 1000
        server_code = (
            "import socket\n"
            "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            f"s.bind(('{self.address(1)}', {port})); s.listen(1); c,_=s.accept()\n"
            "c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n"
            "while True:\n"
            "  d=c.recv(1)\n"
            "  if not d: break\n"
            "  c.sendall(d)\n")
        client_code = (
            "import socket, time, statistics\n"
            "for _ in range(200):\n"
            "  try:\n"
            f"    c=socket.create_connection(('{self.address(1)}', {port})); break\n"
            "  except OSError: time.sleep(0.02)\n"
            "c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n"
            "t=[]\n"
            f"for _ in range({count}):\n"
            "  a=time.perf_counter(); c.sendall(b'x'); c.recv(1); t.append(time.perf_counter()-a)\n"
            "print(statistics.median(t), min(t))\n")
        server = self.spawn(1, [sys.executable, "-c", server_code])
        client = self.spawn(0, [sys.executable, "-c", client_code], stdout=subprocess.PIPE,
                            text=True)
        try:
            out, _ = client.communicate(timeout=60)
            if client.returncode != 0:
                raise EmulationError("round-trip measurement failed")
            server.wait(timeout=10)
        except subprocess.TimeoutExpired as e:
            raise EmulationError(f"round-trip measurement did not finish ({e})")
        median, minimum = (float(x) for x in out.split())
        return median, minimum

    def run_ranks(self, argv, extra_env=None, timeout=600):
        """Runs argv as ranks 0..N-1 of one job (placed by host_of); returns rank 0's stdout.

        Rendezvous is a file store in this run's private directory (namespaces share the
        filesystem); each rank binds and advertises its host's address on eth0. The ranks write
        their output to files there, not pipes: a rank that is not read while it prints would
        block, and with it the collective rank 0 is waiting in.
        """
        store = tempfile.mkdtemp(prefix="store-", dir=self.workdir)
        logs = tempfile.mkdtemp(prefix="output-", dir=self.workdir)
        procs = []
        for k in range(self.ranks):
            env = dict(os.environ)
            host = self.host_of(k)
            env.update({"CONCORD_RANK": str(k), "CONCORD_SIZE": str(self.ranks),
                        "CONCORD_LOCAL_RANK": str(self.local_rank_of(k)),
                        "CONCORD_LOCAL_SIZE": str(self.ranks_per_host),
                        "CONCORD_HOST_ID": f"{self.base}-host{host}",
                        "CONCORD_STORE": f"file://{store}", "CONCORD_JOB_ID": self.base,
                        "CONCORD_HOST": self.address(host), "CONCORD_IFACE": "eth0"})
            env.update(extra_env or {})
            with open(os.path.join(logs, f"{k}.out"), "w") as out, \
                    open(os.path.join(logs, f"{k}.err"), "w") as err:
                procs.append(self.spawn(host, argv, env=env, stdout=out, stderr=err))
        deadline = time.monotonic() + timeout
        for k, p in enumerate(procs):
            try:
                p.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise EmulationError(f"rank {k} did not finish within {timeout} s")

        def output(k, stream):
            with open(os.path.join(logs, f"{k}.{stream}"), errors="replace") as f:
                return f.read()

        failed = [k for k, p in enumerate(procs) if p.returncode != 0]
        if failed:
            raise EmulationError("; ".join(
                f"rank {k} exited with {procs[k].returncode}: {output(k, 'err').strip()[-1500:]}"
                for k in failed))
        return output(0, "out")


def _raise_on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def install_signal_handlers(deadline_s=None):
    """SIGTERM (and SIGINT, SIGHUP) unwind the stack so every Emulation removes what it made.

    deadline_s: also unwind after that many seconds (SIGALRM), e.g. before a test harness's
    timeout kills the process with SIGKILL, which nothing can clean up after.
    """
    for sig in UNWINDING_SIGNALS:
        signal.signal(sig, _raise_on_signal)
    if deadline_s is not None:
        signal.alarm(max(1, int(deadline_s)))


def run_perf(perf, hosts, profile, perf_args, log=print, extra_env=None, timeout=600,
             ranks_per_host=1, placement="block"):
    """Creates the network, states its round trip, runs concord-perf across it, removes it.

    Returns (rank 0's output, the --json rows, {'rtt_median_s', 'rtt_min_s', ...}).
    """
    with Emulation(hosts, profile, ranks_per_host, placement) as emu:
        rate, bps = PROFILES[profile]
        median, minimum = emu.round_trip()
        info = {"profile": profile, "ranks": emu.ranks, "hosts": hosts,
                "ranks_per_host": ranks_per_host, "placement": placement, "rate_bps": bps,
                "burst_bytes": burst_bytes(bps), "rtt_median_s": median, "rtt_min_s": minimum}
        log(f"# fabric-emu: {hosts} hosts x {ranks_per_host} ranks ({placement} placement) on "
            f"{profile} (tbf rate {rate}, "
            f"burst {burst_bytes(bps)} bytes, both directions of each host's link); measured TCP "
            f"round trip host 0 <-> host 1: median {median * 1e6:.0f} us, min "
            f"{minimum * 1e6:.0f} us. "
            "No netem on this kernel: latency cannot be added, so this is the links' own.")
        json_path = os.path.join(emu.workdir, "rows.json")
        out = emu.run_ranks([perf] + list(perf_args) + ["--json", json_path],
                            extra_env=extra_env, timeout=timeout)
        with open(json_path) as f:
            rows = json.load(f)
        for r in rows:
            r["profile"] = profile
        return out, rows, info
