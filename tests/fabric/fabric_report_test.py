"""Tests of perf/concord_fabric/report.py and `concord-fabric render`: the committed report is the
committed measurements rendered by the current model, its text follows what it was given, and the
fabric section of docs/performance.md quotes it."""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

from concord_fabric import hosts, model, report

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
RESULTS = os.path.join(ROOT, "perf", "results", "fabric")
DATA = os.path.join(RESULTS, "measurements.json")
TOOL = os.path.join(ROOT, "perf", "concord-fabric")
RERENDER = f"rerender: perf/concord-fabric render --data {DATA} --out {RESULTS}"


class RenderTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(DATA) as f:
            cls.data = json.load(f)
        cls.tensors = model.load_workload(
            os.path.join(ROOT, "perf", "workloads", cls.data["workload"]))

    def render(self, **kwargs):
        """(README.md's text, the output directory); the PNGs are left out (gnuplot)."""
        out = tempfile.mkdtemp(prefix="fabric-report-")
        self.addCleanup(shutil.rmtree, out)
        real = report._gnuplot
        report._gnuplot = lambda script, cwd: None
        try:
            with open(report.render(self.data, self.tensors, out, **kwargs)) as f:
                return f.read(), out
        finally:
            report._gnuplot = real

    def test_committed_report_is_the_committed_data_rendered(self):
        text, out = self.render()
        with open(os.path.join(RESULTS, "README.md")) as f:
            self.assertEqual(text, f.read(), RERENDER)
        for name in sorted(os.listdir(os.path.join(out, "data"))):
            with open(os.path.join(out, "data", name)) as a, \
                    open(os.path.join(RESULTS, "data", name)) as b:
                self.assertEqual(a.read(), b.read(), f"data/{name}: {RERENDER}")

    def test_states_the_compute_it_was_given(self):
        text, _ = self.render(compute=0.25)
        self.assertIn("Compute 0.250 s per step (given with --compute)", text)
        self.assertNotIn("V100", text.split("## Compute defaults")[0])

    def test_refuses_a_workload_other_than_the_measured_one(self):
        out = tempfile.mkdtemp(prefix="fabric-report-")
        self.addCleanup(shutil.rmtree, out)
        r = subprocess.run([sys.executable, TOOL, "render", "--data", DATA, "--out", out,
                            "--workload", os.path.join(ROOT, "perf", "workloads", "vgg16.txt")],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn(f"measured with {self.data['workload']}", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(out, "README.md")))


class DocsQuoteTheReportTest(unittest.TestCase):
    """The figures docs/performance.md takes from the report are the report's."""

    @classmethod
    def setUpClass(cls):
        with open(DATA) as f:
            cls.data = json.load(f)
        cls.tensors = model.load_workload(
            os.path.join(ROOT, "perf", "workloads", cls.data["workload"]))
        with open(os.path.join(ROOT, "docs", "performance.md")) as f:
            cls.docs = " ".join(f.read().split())

    def quoted(self, pattern):
        match = re.search(pattern, self.docs)
        self.assertIsNotNone(match, pattern)
        return [float(x) for x in match.groups()]

    def test_efficiency_at_8_ranks(self):
        compute = model.COMPUTE_DEFAULTS[("resnet50", "v100")].seconds
        rows = {(r["key"], r["compression"]): r for r in report.eight_rank_table(
            self.tensors, compute, report.fabrics_for_model(self.data))}
        got = self.quoted(r"ResNet-50 fp32 at 8 ranks: (\d+)% on 1 GbE, (\d+)% on 100 Gb "
                          r"InfiniBand; on 1 GbE fp16 brings it to (\d+)% and top-k \(0.1%\) to "
                          r"(\d+)%")
        want = [rows[k]["eff"] for k in (("1gbe", "none"), ("ib100", "none"), ("1gbe", "fp16"),
                                         ("1gbe", "topk"))]
        self.assertEqual(got, [float(f"{100 * e:.0f}") for e in want])

    def test_delivered_rate_and_model_errors(self):
        frac = report.delivered_1gbe(self.data)
        got = self.quoted(r"The 1gbe profile delivers (\d+) MB/s \((\d+)% of 125 MB/s\)")
        self.assertEqual(got, [float(f"{125 * frac:.0f}"), float(f"{100 * frac:.0f}")])
        checks = report.checks(self.data, self.tensors)
        worst = {p: max(abs(c["error"]) for c in checks if c["profile"] == p)
                 for p in ("1gbe", "10gbe")}
        h = self.data["hosts"]
        link = report._fit(next(r for r in self.data["runs"]
                                if r["profile"] == h["profile"] and r["ranks"] == 2))
        steps = hosts.step_checks(h, self.tensors, link, self.data["inline_threshold"])
        got = self.quoted(r"predicted step times within (\d+)% of measured on 1gbe and (\d+)% on "
                          r"10gbe \([0-9-]+\), and within (\d+)% on hosts of 2 ranks")
        want = [worst["1gbe"], worst["10gbe"], max(abs(s["error"]) for s in steps)]
        self.assertEqual(got, [float(math.ceil(100 * e)) for e in want])


if __name__ == "__main__":
    unittest.main()
