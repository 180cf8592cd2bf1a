"""concord-fabric: emulated links, real-fabric switches, the scaling model and the fabric report.

  concord-fabric emulate --profile 1gbe (--np 2 | --layout 2x2 [--placement block|cyclic])
                         [--json F] [-- concord-perf arguments]
  concord-fabric cleanup [--all] [--pid PID ...]
  concord-fabric real --fabric ethernet|ib --backend gloo|mpi|nccl -np N [-H ...] -- prog args
  concord-fabric fit SWEEP.json
  concord-fabric predict --workload F [--fit SWEEP.json] [--compute S | --model M --gpu G]
  concord-fabric measure --out FILE   /   concord-fabric render --data FILE --out DIR
"""

import argparse
import json
import os
import sys

from . import emulate, model, report, switches

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def default_binary(name):
    build = os.environ.get("BUILD_DIR", os.path.join(ROOT, "build"))
    sub = "tools" if name == "concordrun" else "perf"
    return os.path.join(build, sub, name)


def default_workload():
    return os.path.join(ROOT, "perf", "workloads", "resnet50.txt")


def fail(message):
    print(f"concord-fabric: {message}", file=sys.stderr)
    return 2


def parse_layout(text):
    """'HxL' -> (H hosts, L ranks per host)."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"layout '{text}': expected HOSTSxRANKS_PER_HOST, e.g. 2x2")
    return int(parts[0]), int(parts[1])


def cmd_emulate(a):
    why = emulate.missing_requirements()
    if why:
        return fail(why)
    perf_args = a.perf_args[1:] if a.perf_args[:1] == ["--"] else a.perf_args
    if not perf_args:
        perf_args = report.SWEEP_ARGS
    hosts, per_host = parse_layout(a.layout) if a.layout else (a.np, 1)
    emulate.install_signal_handlers()
    out, rows, info = emulate.run_perf(a.perf, hosts, a.profile, perf_args,
                                       ranks_per_host=per_host, placement=a.placement)
    print(out, end="")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"link": info, "rows": rows}, f, indent=1)
    return 0


def cmd_cleanup(a):
    why = emulate.missing_requirements()
    if why:
        return fail(why)
    removed = emulate.cleanup_leftovers(all_runs=a.all, pids=set(a.pid) if a.pid else None)
    print(f"removed {len(removed)} namespace(s)" + (": " + " ".join(removed) if removed else ""))
    return 0


def cmd_real(a):
    try:
        env = switches.fabric_env(a.fabric, a.backend, a.iface, a.ib_device)
    except switches.FabricError as e:
        return fail(str(e))
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        return fail("real: give the program to run after --")
    argv = [a.concordrun, "-np", str(a.np)] + (["-H", a.hosts] if a.hosts else []) + command
    for k, v in sorted(env.items()):
        print(f"concord-fabric: {k}={v}", file=sys.stderr)
    os.environ.update(env)
    os.execv(argv[0], argv)


def _load_rows(path):
    with open(path) as f:
        data = json.load(f)
    rows = data["rows"] if isinstance(data, dict) else data
    return [r for r in rows if r.get("implementation") == "concord" and r.get("op") == "allreduce"]


def cmd_fit(a):
    alpha, busbw, n = model.fit_alpha_beta(_load_rows(a.sweep))
    print(f"ranks {n}: alpha {alpha * 1e6:.1f} us, busbw {busbw / 1e6:.1f} MB/s")
    return 0


def cmd_predict(a):
    tensors = model.load_workload(a.workload)
    if a.compute is not None:
        compute, source = a.compute, "--compute"
    else:
        key = (a.model, a.gpu)
        if key not in model.COMPUTE_DEFAULTS:
            known = ", ".join(f"{m}/{g}" for m, g in model.COMPUTE_DEFAULTS)
            return fail(f"no compute default for {a.model}/{a.gpu} (known: {known}); "
                        "give --compute SECONDS")
        compute, source = model.COMPUTE_DEFAULTS[key].seconds, model.COMPUTE_DEFAULTS[key].source
    fabrics = dict(model.FABRICS)
    if a.fit:
        alpha, busbw, n = model.fit_alpha_beta(_load_rows(a.fit))
        fabrics = {"fit": model.Fabric(f"fit ({n} ranks)", busbw, alpha, a.fit), **fabrics}
    ranks = [x.strip() for x in a.ranks.split(",")]
    if not all(x.isdigit() and int(x) >= 1 for x in ranks):
        return fail(f"--ranks '{a.ranks}': expected rank counts of at least 1, e.g. 2,8,64")
    ranks = [int(x) for x in ranks]
    print(f"# {os.path.basename(a.workload)}: {len(tensors)} tensors, "
          f"{sum(t.bytes for t in tensors) / 1e6:.1f} MB; compute {compute:.3f} s/step ({source})")
    print(f"{'fabric':22} {'comp':5} {'fusion':6} {'ranks':>5} {'comm(ms)':>10} {'eff':>5} "
          f"{'eff+ovl':>7}")
    for fabric in fabrics.values():
        for comp in a.compression.split(","):
            for n in ranks:
                t = model.step_time(tensors, n, fabric, fusion=not a.no_fusion, compression=comp,
                                    density=a.density)
                print(f"{fabric.name:22} {comp:5} {'no' if a.no_fusion else 'yes':6} {n:5} "
                      f"{t * 1e3:10.1f} {100 * model.efficiency(compute, t):4.0f}% "
                      f"{100 * model.efficiency(compute, t, overlap=True):6.0f}%")
    return 0


def cmd_measure(a):
    why = emulate.missing_requirements()
    if why:
        return fail(why)
    emulate.install_signal_handlers()
    report.measure(a.perf, a.workload, a.out, ranks=[int(x) for x in a.ranks.split(",")],
                   concordrun=a.concordrun)
    print(f"wrote {a.out}")
    return 0


def cmd_render(a):
    with open(a.data) as f:
        data = json.load(f)
    measured = data.get("workload")
    if not measured:
        return fail(f"{a.data}: no 'workload' (the file measure wrote names the one it ran)")
    workload = a.workload or os.path.join(ROOT, "perf", "workloads", measured)
    if os.path.basename(workload) != measured:
        return fail(f"{a.data} was measured with {measured}: its step times cannot check a "
                    f"model of {os.path.basename(workload)} (use predict for that)")
    path = report.render(data, model.load_workload(workload), a.out, compute=a.compute)
    print(f"wrote {path}")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="concord-fabric", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("emulate", help="run concord-perf across namespaces on a shaped bridge")
    e.add_argument("--profile", required=True, choices=sorted(emulate.PROFILES))
    e.add_argument("--np", type=int, default=2, help="ranks, each its own host")
    e.add_argument("--layout", help="HxL: H hosts (namespaces, one shaped link each) with L "
                   "ranks each, e.g. 2x2 (replaces --np)")
    e.add_argument("--placement", default="block", choices=emulate.PLACEMENTS,
                   help="ranks on hosts: block (rank k on host k // L) or cyclic (k % H)")
    e.add_argument("--perf", default=default_binary("concord-perf"))
    e.add_argument("--json", help="write the link's figures and concord-perf's rows here")
    e.add_argument("perf_args", nargs=argparse.REMAINDER)
    e.set_defaults(func=cmd_emulate)

    c = sub.add_parser("cleanup", help="remove namespaces left by dead runs of this tool")
    c.add_argument("--all", action="store_true", help="also those of runs still alive")
    c.add_argument("--pid", type=int, action="append",
                   help="only the run of this tool's process PID (repeatable)")
    c.set_defaults(func=cmd_cleanup)

    r = sub.add_parser("real", help="run over a real fabric through concordrun")
    r.add_argument("--fabric", required=True, choices=switches.FABRICS)
    r.add_argument("--backend", default="gloo", choices=switches.BACKENDS)
    r.add_argument("--iface", help="Ethernet interface (CONCORD_IFACE, NCCL_SOCKET_IFNAME, ...)")
    r.add_argument("--ib-device", help="RDMA device for UCX_NET_DEVICES / NCCL_IB_HCA")
    r.add_argument("-np", "--np", type=int, required=True)
    r.add_argument("-H", "--hosts")
    r.add_argument("--concordrun", default=default_binary("concordrun"))
    r.add_argument("command", nargs=argparse.REMAINDER)
    r.set_defaults(func=cmd_real)

    f = sub.add_parser("fit", help="fit alpha and busbw to a concord-perf --json sweep")
    f.add_argument("sweep")
    f.set_defaults(func=cmd_fit)

    q = sub.add_parser("predict", help="communication time and efficiency per fabric and ranks")
    q.add_argument("--workload", default=default_workload())
    q.add_argument("--fit", help="also a fabric fitted to this concord-perf --json sweep")
    q.add_argument("--compute", type=float, help="compute seconds per step")
    q.add_argument("--model", default="resnet50", help="compute default: resnet50, vgg16, "
                   "bert_large")
    q.add_argument("--gpu", default="v100", help="compute default: v100, a100 (resnet50 also "
                   "v100-amp, a100-amp)")
    q.add_argument("--ranks", default="2,8,64,512")
    q.add_argument("--compression", default="none,fp16,topk")
    q.add_argument("--density", type=float, default=0.001)
    q.add_argument("--no-fusion", action="store_true")
    q.set_defaults(func=cmd_predict)

    m = sub.add_parser("measure", help="emulated sweeps and workload runs into one JSON file")
    m.add_argument("--out", required=True)
    m.add_argument("--perf", default=default_binary("concord-perf"))
    m.add_argument("--workload", default=default_workload())
    m.add_argument("--ranks", default="2,3,4")
    m.add_argument("--concordrun", default=default_binary("concordrun"),
                   help="launches the shared-memory sweep on this host")
    m.set_defaults(func=cmd_measure)

    d = sub.add_parser("render", help="write the Markdown report and its PNGs")
    d.add_argument("--data", required=True)
    d.add_argument("--out", required=True)
    d.add_argument("--workload", help="the workload the data was measured with (default: the "
                   "file of that name in perf/workloads)")
    d.add_argument("--compute", type=float, help="compute seconds per step (default: the "
                   "workload's on one V100)")
    d.set_defaults(func=cmd_render)

    a = p.parse_args(argv)
    try:
        return a.func(a)
    except (emulate.EmulationError, ValueError, OSError) as err:
        return fail(str(err))
    except KeyboardInterrupt as err:
        return fail(f"interrupted ({err}); everything created was removed")
