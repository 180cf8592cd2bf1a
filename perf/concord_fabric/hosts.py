"""Hosts of several ranks: what the fabric report measures of them, and how it checks the model.

measure() runs, on the emulated 1gbe profile (emulate.py, 2 hosts x 2 ranks):
  - the workload with the ranks placed in blocks and cyclically, hierarchical (CONCORD_HIERARCHICAL
    auto, which picks it for this layout) and flat (off): four step times;
  - a sweep in blocks with every allreduce hierarchical (on, threshold 0) and one flat: the sizes
    from which hierarchical pays, i.e. the measurement behind CONCORD_HIERARCHICAL_THRESHOLD;
  - a sweep of 2 ranks on this one host (concordrun, shared memory): the intra-host fabric.
The model (model.Layout) is then checked against the four step times with the link fitted to the
1gbe sweep of one rank per host and the intra-host fabric fitted to the shared-memory sweep: no
figure of the runs it predicts goes into the prediction.
"""

import json
import os
import subprocess
import tempfile

from . import emulate, model

PROFILE = "1gbe"
HOSTS, RANKS_PER_HOST = 2, 2
# 10 iterations: with the report's 5, one size in eight came out 10-40% off a repeat's figure,
# enough to move the threshold it reads from the sweep.
SWEEP_ARGS = ["--bytes", "4K:64M", "--factor", "4", "--iters", "10", "--warmup", "2", "--no-raw"]
WORKLOAD_ARGS = ["--steps", "4", "--warmup", "1", "--rounds", "2", "--no-raw"]
MODES = {"hierarchical": {"CONCORD_HIERARCHICAL": "auto"}, "flat": {"CONCORD_HIERARCHICAL": "off"}}
# The threshold sweep: every allreduce hierarchical, against every allreduce flat.
THRESHOLD_MODES = {"hierarchical": {"CONCORD_HIERARCHICAL": "on",
                                    "CONCORD_HIERARCHICAL_THRESHOLD": "0"},
                   "flat": {"CONCORD_HIERARCHICAL": "off"}}


def _concord(rows, implementation="concord"):
    return [r for r in rows if r.get("implementation") == implementation]


def _intra_sweep(perf, concordrun, env, log):
    """concord-perf's sweep on 2 ranks of this host (shared memory), through concordrun."""
    with tempfile.TemporaryDirectory(prefix="cfab-shm-") as tmp:
        path = os.path.join(tmp, "rows.json")
        argv = [concordrun, "-np", "2", perf] + SWEEP_ARGS + ["--json", path]
        result = subprocess.run(argv, env=dict(os.environ, **env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, timeout=600)
        if result.returncode != 0:
            raise emulate.EmulationError(f"{' '.join(argv)}: {result.stderr.strip()[-1500:]}")
        log(result.stdout.rstrip())
        with open(path) as f:
            return json.load(f)


def measure(perf, concordrun, workload, env, log=print):
    """Everything above, as the 'hosts' part of the report's JSON."""
    layout = {"profile": PROFILE, "hosts": HOSTS, "ranks_per_host": RANKS_PER_HOST}
    log("== one host, 2 ranks: sweep (shared memory)")
    data = dict(layout, intra=_intra_sweep(perf, concordrun, env, log), steps=[], sweeps={})
    for placement in emulate.PLACEMENTS:
        for mode, mode_env in MODES.items():
            log(f"== {PROFILE}, {HOSTS}x{RANKS_PER_HOST} {placement}, {mode}: workload")
            out, rows, info = emulate.run_perf(perf, HOSTS, PROFILE,
                                               ["--workload", workload] + WORKLOAD_ARGS, log=log,
                                               extra_env=dict(env, **mode_env),
                                               ranks_per_host=RANKS_PER_HOST, placement=placement)
            log(out.rstrip())
            (step,) = _concord(rows, "concord step")
            data["steps"].append({"placement": placement, "mode": mode,
                                  "seconds": step["time_us"] * 1e-6,
                                  "rtt_median_s": info["rtt_median_s"]})
    for mode, mode_env in THRESHOLD_MODES.items():
        log(f"== {PROFILE}, {HOSTS}x{RANKS_PER_HOST} block, every allreduce {mode}: sweep")
        out, rows, _ = emulate.run_perf(perf, HOSTS, PROFILE, SWEEP_ARGS, log=log,
                                        extra_env=dict(env, **mode_env),
                                        ranks_per_host=RANKS_PER_HOST)
        log(out.rstrip())
        data["sweeps"][mode] = _concord(rows)
    return data


def intra_fabric(data):
    """The intra-host fabric fitted to the shared-memory sweep (sizes from 256 KiB)."""
    alpha, busbw, _ = model.fit_alpha_beta(_concord(data["intra"]),
                                           min_bytes=model.DIRECT_THRESHOLD)
    return model.Fabric("shared memory (fit, this host)", busbw, alpha,
                        "alpha/beta fitted to 2 ranks of concord-perf on this host")


def step_checks(data, tensors, link, inline_threshold):
    """The four step times beside the model's, with `link` (one rank per host's fit)."""
    intra = intra_fabric(data)
    n = data["hosts"] * data["ranks_per_host"]
    rows = []
    for step in data["steps"]:
        layout = model.Layout(data["ranks_per_host"], step["placement"],
                              step["mode"] == "hierarchical", intra)
        predicted = model.step_time(tensors, n, link, inline_threshold=inline_threshold,
                                    layout=layout)
        rows.append(dict(step, predicted=predicted, error=predicted / step["seconds"] - 1))
    return rows


def threshold_rows(data):
    """(bytes, flat us, hierarchical us) for every size of the threshold sweep."""
    flat = {r["bytes"]: r["time_us"] for r in data["sweeps"]["flat"]}
    hier = {r["bytes"]: r["time_us"] for r in data["sweeps"]["hierarchical"]}
    return [(size, flat[size], hier[size]) for size in sorted(flat) if size in hier]


def measured_threshold(rows):
    """The smallest size from which hierarchical is at least as fast at every larger size, or
    None when it never is."""
    best = None
    for size, flat_us, hier_us in reversed(rows):
        if hier_us > flat_us:
            break
        best = size
    return best
