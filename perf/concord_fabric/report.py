"""Measures Concord on emulated links and renders the fabric report (Markdown + gnuplot PNGs).

measure(): for each profile and rank count, a concord-perf sweep and a workload run (ResNet-50
unless told otherwise) on an emulated network (emulate.py); then hosts of several ranks
(hosts.py); writes one JSON file of everything measured.
render(): fits alpha/beta per (profile, ranks) sweep, predicts the workload's step time beside the
measured one, and draws the model for real fabrics from 2 to 512 ranks. Every figure in the text
is computed from the data and the model: rendering the committed measurements reproduces the
committed report.
"""

import datetime
import json
import os
import platform
import shutil
import subprocess

from . import emulate, hosts, model

SWEEP_ARGS = ["--bytes", "4K:64M", "--factor", "4", "--iters", "5", "--warmup", "2", "--no-raw"]
WORKLOAD_ARGS = ["--steps", "4", "--warmup", "1", "--rounds", "2", "--no-raw"]
RANKS_MODEL = [2, 4, 8, 16, 32, 64, 128, 256, 512]
LINK_RATE_1GBE = 125e6  # bytes/s
# TCP's goodput on a 1500-byte MTU is about 95% of line rate (1448 payload bytes of 1514 on the
# wire); a profile whose best busbw stays below this fraction of its rate is not link-bound.
LINK_BOUND_FRACTION = 0.9
WORKLOAD_LABELS = {"resnet50": "ResNet-50", "vgg16": "VGG-16", "bert_large": "BERT-large"}


def measure(perf, workload, out_path, profiles=("1gbe", "10gbe"), ranks=(2, 3, 4),
            sweep_only_profiles=("25gbe",), inline_threshold=0, log=print, concordrun=None):
    """inline_threshold: CONCORD_INLINE_THRESHOLD for every run, and the model is told the same
    value. 0 by default, as in the committed report: its runs were made while the inline path
    could hang on the 1gbe profile (since fixed: the coordinator drains its responses before
    entering a collective)."""
    env = {"CONCORD_INLINE_THRESHOLD": str(inline_threshold)}
    load_before = os.getloadavg()[0]
    runs = []
    for profile in list(profiles) + list(sweep_only_profiles):
        for n in ranks if profile in profiles else (2,):
            log(f"== {profile}, {n} ranks: sweep")
            out, sweep, info = emulate.run_perf(perf, n, profile, SWEEP_ARGS, log=log,
                                                extra_env=env)
            log(out.rstrip())
            run = dict(info, sweep=sweep, workload=[])
            if profile in profiles:
                log(f"== {profile}, {n} ranks: workload {os.path.basename(workload)}")
                out, rows, _ = emulate.run_perf(perf, n, profile,
                                                ["--workload", workload] + WORKLOAD_ARGS, log=log,
                                                extra_env=env)
                log(out.rstrip())
                run["workload"] = rows
            runs.append(run)
    host_runs = hosts.measure(perf, concordrun, workload, env, log)
    data = {"measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "cpus": os.cpu_count(),
            "load_average": [load_before, os.getloadavg()[0]],
            "inline_threshold": inline_threshold,
            "workload": os.path.basename(workload), "runs": runs, "hosts": host_runs}
    with open(out_path, "w") as f:
        json.dump(data, f, indent=1)
    return data


def _concord_rows(rows):
    return [r for r in rows if r.get("implementation") == "concord"]


def _fit(run):
    # Sizes from 256 KiB: with the inline path off, every message of a step is at least that (a
    # direct tensor) or a fusion buffer of several.
    alpha, busbw, _ = model.fit_alpha_beta(_concord_rows(run["sweep"]),
                                           min_bytes=model.DIRECT_THRESHOLD)
    return model.Fabric(f"{run['profile']} (emulated, fit)", busbw, alpha, "fit of this run")


def checks(data, tensors):
    """Predicted against measured step time for every run with a workload row."""
    result = []
    for run in data["runs"]:
        steps = [r for r in run["workload"] if r.get("implementation") == "concord step"]
        if not steps:
            continue
        fabric = _fit(run)
        predicted = model.step_time(
            tensors, run["ranks"], fabric,
            inline_threshold=data.get("inline_threshold", model.INLINE_THRESHOLD))
        measured = steps[0]["time_us"] * 1e-6
        result.append({"profile": run["profile"], "ranks": run["ranks"], "alpha": fabric.alpha,
                       "busbw": fabric.busbw, "predicted": predicted, "measured": measured,
                       "error": predicted / measured - 1})
    return result


def delivered_1gbe(data):
    """busbw of the 64 MiB allreduce on 1gbe with 2 ranks, as a fraction of 125 MB/s, or None."""
    for run in data["runs"]:
        if run["profile"] == "1gbe" and run["ranks"] == 2:
            rows = [r for r in _concord_rows(run["sweep"]) if r["bytes"] >= 64 * 2**20 - 64]
            if rows:
                return rows[-1]["busbw_gbps"] * 1e9 / LINK_RATE_1GBE
    return None


def fabrics_for_model(data):
    """Published fabrics; 1 GbE taken from this machine's emulated 2-rank sweep when present."""
    fabrics = dict(model.FABRICS)
    for run in data["runs"]:
        if run["profile"] == "1gbe" and run["ranks"] == 2:
            fit = _fit(run)
            fabrics["1gbe"] = model.Fabric("1 GbE (fit, emulated here)", fit.busbw, fit.alpha,
                                           "alpha/beta fitted to the emulated 1gbe sweep")
    return fabrics


def _gnuplot(script, cwd):
    if shutil.which("gnuplot") is None:
        raise RuntimeError("gnuplot is not installed (scripts/setup.sh installs gnuplot-nox)")
    subprocess.run(["gnuplot"], input=script, text=True, cwd=cwd, check=True)


def _write(path, lines):
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


COMMON = ('set terminal pngcairo size 900,640 font "sans,11"\n'
          "set grid\nset key below maxrows 5\n")


def _plot_busbw(data, outdir):
    plots = []
    for i, run in enumerate(r for r in data["runs"] if r["ranks"] == 2):
        rows = _concord_rows(run["sweep"])
        name = f"data/busbw_{run['profile']}.dat"
        _write(os.path.join(outdir, name), [f"{r['bytes']} {r['busbw_gbps'] * 1e3}" for r in rows])
        fit = _fit(run)
        model_name = f"data/busbw_{run['profile']}_model.dat"
        lines = []
        size = 4096
        while size <= 64 * 2**20:
            t = model.allreduce_time(size, 2, fit)
            lines.append(f"{size} {size / t / 1e6}")  # busbw = algbw at n = 2
            size *= 2
        _write(os.path.join(outdir, model_name), lines)
        plots.append(f"'{name}' using 1:2 with points pt 7 ps 1.3 lc {i + 1} "
                     f"title '{run['profile']} measured'")
        plots.append(f"'{model_name}' using 1:2 with lines lc {i + 1} dt 2 "
                     f"title '{run['profile']} alpha-beta fit'")
    script = (COMMON + "set output 'busbw.png'\nset logscale xy\n"
              "set title 'Allreduce busbw against message size, 2 ranks on emulated links "
              "(fit: sizes from 256 KiB)'\n"
              "set xlabel 'message size (bytes)'\nset ylabel 'busbw (MB/s)'\n"
              "set format x '%.0s%cB'\n"
              "plot " + ", \\\n     ".join(plots) + "\n")
    _gnuplot(script, outdir)
    return "busbw.png"


def best_fraction(run):
    """The best busbw of a run's sweep as a fraction of its profile's line rate."""
    best = max(r["busbw_gbps"] for r in _concord_rows(run["sweep"])) * 1e9
    return best / (run["rate_bps"] / 8)


def _plot_vs_ranks(data, tensors, compute, fabrics, outdir, checks_rows, workload_label):
    """step time and efficiency against ranks: one line per fabric (fp32), plus compression."""
    step_plots, eff_plots = [], []
    series = [(key, "none") for key in fabrics] + [("1gbe", "fp16"), ("1gbe", "topk")]
    for i, (key, comp) in enumerate(series):
        fabric = fabrics[key]
        name = f"data/ranks_{key}_{comp}.dat"
        lines = []
        for n in RANKS_MODEL:
            t = model.step_time(tensors, n, fabric, compression=comp)
            lines.append(f"{n} {t * 1e3} {100 * model.efficiency(compute, t)} "
                         f"{100 * model.efficiency(compute, t, overlap=True)}")
        _write(os.path.join(outdir, name), lines)
        label = fabric.name + ("" if comp == "none" else f", {comp}" + (
            " 0.1%" if comp == "topk" else ""))
        style = "lw 2" if comp == "none" else "lw 2 dt 3"
        step_plots.append(f"'{name}' using 1:2 with lines {style} lc {i + 1} title '{label}'")
        eff_plots.append(f"'{name}' using 1:3 with lines {style} lc {i + 1} title '{label}'")
    for j, profile in enumerate(sorted({c["profile"] for c in checks_rows})):
        name = f"data/measured_{profile}.dat"
        _write(os.path.join(outdir, name), [f"{c['ranks']} {c['measured'] * 1e3}"
                                           for c in checks_rows if c["profile"] == profile])
        step_plots.append(f"'{name}' using 1:2 with points pt {5 + 2 * j} ps 1.6 lc rgb 'black' "
                          f"title '{profile} emulated, measured'")
        name = f"data/predicted_{profile}.dat"
        _write(os.path.join(outdir, name), [f"{c['ranks']} {c['predicted'] * 1e3}"
                                           for c in checks_rows if c["profile"] == profile])
        step_plots.append(f"'{name}' using 1:2 with linespoints pt {4 + 2 * j} ps 1.6 lw 1 "
                          f"lc rgb 'black' title '{profile} emulated, model (fit of the run)'")
    _gnuplot(COMMON + "set output 'step_time.png'\nset logscale x 2\nset logscale y\n"
             "set xrange [2:512]\n"
             f"set title '{workload_label} communication time per step (model; points measured "
             "here)'\n"
             "set xlabel 'ranks'\nset ylabel 'ms per step'\n"
             "plot " + ", \\\n     ".join(step_plots) + "\n", outdir)
    _gnuplot(COMMON + "set output 'efficiency.png'\nset logscale x 2\nset xrange [2:512]\n"
             "set yrange [0:105]\n"
             f"set title '{workload_label} fp32 scaling efficiency, "
             f"compute {compute:.2f} s/step, no overlap'\n"
             "set xlabel 'ranks'\nset ylabel 'efficiency (%)'\n"
             "plot " + ", \\\n     ".join(eff_plots) + "\n", outdir)
    return ["step_time.png", "efficiency.png"]


HOST_SERIES = [("1gbe", "block", False), ("1gbe", "block", True), ("1gbe", "cyclic", False),
               ("10gbe", "block", False), ("10gbe", "block", True), ("ib100", "block", False),
               ("ib100", "block", True)]


def _plot_hosts(tensors, fabrics, outdir, workload_label):
    """The workload's step time against ranks on servers of 8 GPUs joined by one link each."""
    plots = []
    for key, placement, hier in HOST_SERIES:
        layout = model.Layout(8, placement, hier, model.INTRA_FABRICS["nvlink"])
        name = f"data/hosts_{key}_{placement}_{'hier' if hier else 'flat'}.dat"
        _write(os.path.join(outdir, name),
               [f"{n} {model.step_time(tensors, n, fabrics[key], layout=layout) * 1e3}"
                for n in RANKS_MODEL if n >= 8])
        style = "lw 2" if hier else ("lw 2 dt 3" if placement == "cyclic" else "lw 2 dt 2")
        label = (f"{fabrics[key].name}, {'hierarchical' if hier else 'flat'}"
                 + (", cyclic placement" if placement == "cyclic" else ""))
        color = 1 + [k for k, _, _ in HOST_SERIES].index(key)  # one color per fabric
        plots.append(f"'{name}' using 1:2 with lines {style} lc {color} title '{label}'")
    _gnuplot(COMMON + "set output 'hosts.png'\nset logscale x 2\nset logscale y\n"
             "set xrange [8:512]\n"
             f"set title '{workload_label} communication per step, servers of 8 GPUs (NVLink) "
             "with one link each (model)'\n"
             "set xlabel 'ranks'\nset ylabel 'ms per step'\n"
             "plot " + ", \\\n     ".join(plots) + "\n", outdir)
    return "hosts.png"


def _hosts_section(data, tensors, fabrics, outdir, workload_label):
    """The Markdown of hosts of several ranks: measured, predicted, the threshold, the plot."""
    h = data["hosts"]
    link = _fit(next(r for r in data["runs"] if r["profile"] == h["profile"] and r["ranks"] == 2))
    intra = hosts.intra_fabric(h)
    checks_rows = hosts.step_checks(h, tensors, link, data.get("inline_threshold",
                                                               model.INLINE_THRESHOLD))
    md = ["## Hosts of several ranks: hierarchical against flat", "",
          f"{h['hosts']} emulated hosts x {h['ranks_per_host']} ranks on the {h['profile']} "
          "profile: the ranks of a host share its namespace and its one shaped link, and use "
          "shared memory between them. In blocks (rank k on host k // 2, the launchers' default) "
          "or cyclically (host k % 2, `mpirun --map-by node`); hierarchical is "
          "`CONCORD_HIERARCHICAL=auto` (chosen for this layout), flat `off`. Predicted with the "
          f"link fitted to the 2-rank {h['profile']} sweep (busbw {link.busbw / 1e6:.0f} MB/s, "
          f"alpha {link.alpha * 1e6:.0f} us) and the intra-host fabric fitted to 2 ranks on this "
          f"host (busbw {intra.busbw / 1e9:.2f} GB/s, alpha {intra.alpha * 1e6:.0f} us).", "",
          "| placement | collectives | measured step | predicted | error | against flat |",
          "|---|---|---|---|---|---|"]
    flat = {c["placement"]: c["seconds"] for c in checks_rows if c["mode"] == "flat"}
    for c in checks_rows:
        md.append(f"| {c['placement']} | {c['mode']} | {c['seconds'] * 1e3:.0f} ms | "
                  f"{c['predicted'] * 1e3:.0f} ms | {100 * c['error']:+.1f}% | "
                  f"{c['seconds'] / flat[c['placement']]:.2f}x |")
    n_hosts, n = h["hosts"], h["hosts"] * h["ranks_per_host"]
    hier_bytes, flat_bytes = 2 * (n_hosts - 1) / n_hosts, 2 * (n - 1) / n
    md += ["", "In blocks the flat ring already crosses each host's link only once, so "
           "hierarchical saves only the difference between 2(n-1)/n S and 2(H-1)/H S on it "
           f"({flat_bytes:.2f} against {hier_bytes:.2f} S at {n_hosts}x{h['ranks_per_host']}): "
           f"{hier_bytes / flat_bytes:.2f}x is the bound there, whatever the implementation. "
           "Cyclically every ring hop crosses the link and hierarchical saves the factor L.", "",
           "Allreduce by size, blocks, every allreduce hierarchical "
           "(`CONCORD_HIERARCHICAL=on`, threshold 0) against flat:", "",
           "| bytes | flat | hierarchical | ratio |", "|---|---|---|---|"]
    rows = hosts.threshold_rows(h)
    for size, flat_us, hier_us in rows:
        md.append(f"| {size} | {flat_us:.0f} us | {hier_us:.0f} us | {hier_us / flat_us:.2f}x |")
    best = hosts.measured_threshold(rows)
    md += ["", "Hierarchical is at least as fast from "
           + (f"**{best} bytes** on" if best is not None else "no size of the sweep at")
           + f" (the default CONCORD_HIERARCHICAL_THRESHOLD is {model.HIERARCHICAL_THRESHOLD}).",
           "", f"![hosts]({_plot_hosts(tensors, fabrics, outdir, workload_label)})", "",
           "The model for servers of 8 GPUs (NVLink within, one link per server; 8 ranks are one "
           "server, no network): in blocks, a hierarchical allreduce puts 2(H-1)/H S on each "
           "server's link against the flat ring's 2(n-1)/n S, about half at 2 servers (1.00 "
           "against 1.88 S), a gap in bytes that closes as servers multiply (both tend to 2 S). "
           "The gap in latency does not: from 1 MiB a flat allreduce is a ring of all n ranks, "
           "2(n-1) messages, against 2(n/8-1) across the servers, and that is most of the "
           "difference at 512 ranks; placed cyclically, flat costs 8x the bytes.", "",
           "| fabric | ranks | flat (blocks) | hierarchical | flat (cyclic) |",
           "|---|---|---|---|---|"]
    for key in ("1gbe", "ib100"):
        for n in (64, 512):
            t = {(p, hier): model.step_time(tensors, n, fabrics[key], layout=model.Layout(
                8, p, hier, model.INTRA_FABRICS["nvlink"]))
                for p, hier in (("block", False), ("block", True), ("cyclic", False))}
            md.append(f"| {fabrics[key].name} | {n} | {t[('block', False)] * 1e3:.1f} ms | "
                      f"{t[('block', True)] * 1e3:.1f} ms | {t[('cyclic', False)] * 1e3:.1f} ms |")
    return md


def eight_rank_table(tensors, compute, fabrics, n=8):
    rows = []
    for key, fabric in fabrics.items():
        for comp in ("none", "fp16", "topk"):
            t = model.step_time(tensors, n, fabric, compression=comp)
            rows.append({"fabric": fabric.name, "key": key, "compression": comp, "comm": t,
                         "eff": model.efficiency(compute, t),
                         "eff_overlap": model.efficiency(compute, t, overlap=True)})
    return rows


def render(data, tensors, outdir, compute=None):
    """Writes outdir/README.md and its PNGs; returns the Markdown path.

    tensors: the workload the data was measured with (data["workload"]); compute: seconds per
    step, by default the workload's on one V100 (model.COMPUTE_DEFAULTS).
    """
    workload_name = os.path.splitext(data["workload"])[0]
    label = WORKLOAD_LABELS.get(workload_name, workload_name)
    if compute is None:
        default = model.COMPUTE_DEFAULTS.get((workload_name, "v100"))
        if default is None:
            raise ValueError(f"no compute default for {workload_name}: give --compute SECONDS")
        compute, compute_source = default.seconds, f"{label} fp32 on one V100: {default.source}"
    else:
        compute_source = "given with --compute"
    os.makedirs(os.path.join(outdir, "data"), exist_ok=True)
    fabrics = fabrics_for_model(data)
    check_rows = checks(data, tensors)
    images = [_plot_busbw(data, outdir)]
    images += _plot_vs_ranks(data, tensors, compute, fabrics, outdir, check_rows, label)
    total = sum(t.bytes for t in tensors)
    load = ""
    if data.get("load_average"):
        load = ", load average " + "/".join(f"{x:.1f}" for x in data["load_average"]) + \
            " before/after"
    md = [f"# Concord on Ethernet and InfiniBand: {workload_name}, measured and modelled", "",
          f"Measured {data['measured']} on {data['host']} ({data['cpus']} CPUs{load}), "
          "emulated links "
          "(network namespaces, veth, bridge, tbf shaping in both directions; no netem, so no "
          "latency is added: the round trip below is the links' own). Generated by "
          "`perf/fabric-report`.", ""]
    frac = delivered_1gbe(data)
    if frac is not None:
        md += [f"**1gbe profile, 64 MiB allreduce, 2 ranks: {frac * 125:.1f} MB/s busbw = "
               f"{100 * frac:.1f}% of 125 MB/s.**", ""]
    md += ["## Links and fits", "",
           "| profile | ranks | tbf burst | TCP round trip (median / min) | fitted alpha | "
           "fitted busbw | best busbw / line rate |", "|---|---|---|---|---|---|---|"]
    for run in data["runs"]:
        fit = _fit(run)
        md.append(f"| {run['profile']} | {run['ranks']} | {run['burst_bytes']} B | "
                  f"{run['rtt_median_s'] * 1e6:.0f} / {run['rtt_min_s'] * 1e6:.0f} us | "
                  f"{fit.alpha * 1e6:.0f} us | {fit.busbw / 1e6:.0f} MB/s | "
                  f"{100 * best_fraction(run):.0f}% |")
    cpu_bound = sorted({r["profile"] for r in data["runs"]
                        if r["ranks"] == 2 and best_fraction(r) < LINK_BOUND_FRACTION})
    md += ["", "alpha is fitted per message and contains Concord's own cost per operation, not "
           "only the wire's; fitted to sizes from 256 KiB it is poorly determined (often 0), "
           "unlike busbw, what a large allreduce achieves. TCP carries about 95% of line rate "
           "(1500-byte MTU)"
           + (f"; below {100 * LINK_BOUND_FRACTION:.0f}% at 2 ranks ({', '.join(cpu_bound)}), the "
              f"{data['cpus']} CPUs, not the shaped link, set busbw: those profiles measure this "
              "machine more than the link." if cpu_bound else "."), "",
           f"![busbw]({images[0]})", "",
           "## Predicted against measured step time", "",
           f"The {workload_name} workload ({len(tensors)} tensors, {total / 1e6:.1f} MB fp32) as "
           "concord-perf runs it (all tensors enqueued, then waited for; no compute). Prediction: "
           "the model below with alpha and busbw fitted to the sweep of the same profile and rank "
           "count, and CONCORD_INLINE_THRESHOLD="
           f"{data.get('inline_threshold', model.INLINE_THRESHOLD)} as in the runs (with the "
           "inline path on, this workload hung intermittently on the 1gbe profile: see "
           "report.measure()).", "",
           "| profile | ranks | predicted | measured | error |", "|---|---|---|---|---|"]
    for c in check_rows:
        md.append(f"| {c['profile']} | {c['ranks']} | {c['predicted'] * 1e3:.1f} ms | "
                  f"{c['measured'] * 1e3:.1f} ms | {100 * c['error']:+.1f}% |")
    if check_rows:
        worst = max(check_rows, key=lambda c: abs(c["error"]))
        md += ["", f"Largest error: {100 * abs(worst['error']):.1f}% ({worst['profile']}, "
               f"{worst['ranks']} ranks; the bar is 25%). Where the CPUs set the rate (above), "
               "the error depends on what else runs on them: the load average of the run is in "
               "the first paragraph."]
    md += ["", f"![step time]({images[1]})", "", f"![efficiency]({images[2]})", ""]
    if data.get("hosts"):
        md += _hosts_section(data, tensors, fabrics, outdir, label) + [""]
    md += [
           "## What the model says at 8 ranks", "",
           f"Compute {compute:.3f} s per step ({compute_source}). top-k keeps 0.1% of each "
           "gradient (DGC's density).",
           "", "| fabric | compression | comm per step | efficiency | with overlap |",
           "|---|---|---|---|---|"]
    for r in eight_rank_table(tensors, compute, fabrics):
        md.append(f"| {r['fabric']} | {r['compression']} | {r['comm'] * 1e3:.1f} ms | "
                  f"{100 * r['eff']:.0f}% | {100 * r['eff_overlap']:.0f}% |")
    table = {(r["key"], r["compression"]): r for r in eight_rank_table(tensors, compute, fabrics)}
    g = {c: table[("1gbe", c)] for c in ("none", "fp16", "topk")}
    md += ["", f"**{label} fp32 at 8 ranks: {100 * g['none']['eff']:.0f}% efficiency on 1 GbE "
           f"against {100 * table[('ib100', 'none')]['eff']:.0f}% on 100 Gb InfiniBand. On 1 GbE, "
           f"fp16 recovers {100 * (g['fp16']['eff'] - g['none']['eff']):.0f} points (to "
           f"{100 * g['fp16']['eff']:.0f}%; {100 * g['fp16']['eff_overlap']:.0f}% with overlap) "
           f"and top-k at 0.1% {100 * (g['topk']['eff'] - g['none']['eff']):.0f} points (to "
           f"{100 * g['topk']['eff']:.0f}%).**",
           "", "## Compute defaults (`concord-fabric predict --model M --gpu G`)", "",
           "| model | GPU | seconds per step | source |", "|---|---|---|---|"]
    for (name, gpu), d in model.COMPUTE_DEFAULTS.items():
        md.append(f"| {name} | {gpu} | {d.seconds:.3f} | {d.source} |")
    md += ["", "## Fusion at scale", "",
           "| fabric | ranks | Concord's plan | same, CONCORD_INLINE_THRESHOLD=0 "
           "| one allreduce per tensor |",
           "|---|---|---|---|---|"]
    for key in ("1gbe", "ib100"):
        for n in (8, 64, 512):
            fused = model.step_time(tensors, n, fabrics[key])
            no_inline = model.step_time(tensors, n, fabrics[key], inline_threshold=0)
            unfused = model.step_time(tensors, n, fabrics[key], fusion=False)
            md.append(f"| {fabrics[key].name} | {n} | {fused * 1e3:.1f} ms | "
                      f"{no_inline * 1e3:.1f} ms | {unfused * 1e3:.1f} ms |")
    ib = fabrics["ib100"]
    at8, at512 = (model.step_cost(tensors, n, ib) for n in (8, 512))
    step512 = at512.total(model.LANES)
    unfused512 = model.step_time(tensors, 512, ib, fusion=False)
    md += ["", f"On {ib.name}, the coordinator's inline path (a star, linear in n) is "
           f"{100 * at8.inline / at8.total(model.LANES):.0f}% of Concord's step at 8 ranks and "
           f"{100 * at512.inline / step512:.0f}% at 512. What grows faster is latency: from 1 MiB "
           "Concord's Gloo backend runs a ring, 2(n-1) messages per allreduce, and cuts a tensor "
           "of 2 MiB or more into one slice per lane, which doubles its messages; at 512 ranks "
           f"latency is {100 * at512.latency / model.LANES / step512:.0f}% of the step, and one "
           "allreduce per tensor is "
           + ("faster" if unfused512 < step512 else "slower") + " than Concord's plan."]
    md += ["", "## Fabrics in the model", "", "| fabric | busbw | alpha | source |",
           "|---|---|---|---|"]
    for fabric in fabrics.values():
        md.append(f"| {fabric.name} | {fabric.busbw / 1e9:.3f} GB/s | "
                  f"{fabric.alpha * 1e6:.0f} us | "
                  f"{fabric.source} |")
    md += ["", "How the model treats Concord's plan (perf/concord_fabric/model.py): tensors up to "
           "32 KiB go inline through the coordinator (a star: 2(n-1)S/B on rank 0's link, cheap at "
           "8 ranks, linear in n at 512); 32-256 KiB are fused into buffers of up to 64 MiB; from "
           "256 KiB each tensor is its own allreduce, cut into one slice per lane from 2 MiB; "
           "the 2 lanes share the link (bandwidth terms add) but overlap their latencies "
           "(latency / 2). "
           "Latency per allreduce is what Concord's Gloo backend runs: 2(n-1) alpha (a ring) at 2 "
           "ranks and from 1 MiB, 2 log2(n) alpha (halving-doubling) below 1 MiB above 2 ranks. "
           "fp16 halves the bytes; top-k at density d is an allgather of 8 d N bytes per rank.",
           ""]
    path = os.path.join(outdir, "README.md")
    _write(path, md)
    return path
