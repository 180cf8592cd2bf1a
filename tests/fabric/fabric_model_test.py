"""Tests of perf/concord_fabric/model.py (ResNet-50 facts, the fit, Concord's plan, compression,
hosts of several ranks) and hosts.py's checks of it."""
import os
import random
import subprocess
import sys
import tempfile
import unittest

from concord_fabric import hosts, model

TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "perf", "concord-fabric")
WORKLOAD = os.environ.get("CONCORD_WORKLOAD", os.path.join(
    os.path.dirname(__file__), "..", "..", "perf", "workloads", "resnet50.txt"))


class ResNet50FactsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tensors = model.load_workload(WORKLOAD)
        cls.compute = model.COMPUTE_DEFAULTS[("resnet50", "v100")].seconds

    def eff(self, fabric, compression="none", n=8):
        t = model.step_time(self.tensors, n, model.FABRICS[fabric], compression=compression)
        return model.efficiency(self.compute, t)

    def test_workload_is_resnet50(self):
        self.assertEqual(len(self.tensors), 161)
        self.assertAlmostEqual(sum(t.bytes for t in self.tensors) / 1e6, 102.2, delta=0.1)

    def test_fp32_at_8_ranks_below_half_on_1gbe_above_85_on_ib(self):
        self.assertLess(self.eff("1gbe"), 0.50)
        self.assertGreater(self.eff("ib100"), 0.85)
        # REFERENCE.md's hand calculation: 1.4 s on 1 GbE (line rate), 15 ms on EDR.
        t = model.step_time(self.tensors, 8, model.FABRICS["ib100"])
        self.assertGreater(t, 0.014)
        self.assertLess(t, 0.020)

    def test_compression_recovers_efficiency_on_1gbe(self):
        none, fp16, topk = (self.eff("1gbe", c) for c in ("none", "fp16", "topk"))
        self.assertGreater(fp16, none + 0.10)
        self.assertGreater(topk, 0.90)

    def test_fusion_pays_at_8_ranks_and_ring_latency_rules_at_512(self):
        ib = model.FABRICS["ib100"]
        fused = model.step_time(self.tensors, 8, ib, inline_threshold=0)
        self.assertLess(fused, model.step_time(self.tensors, 8, ib, fusion=False))
        # At 512 ranks the ring's 2(n-1) alpha per message of 1 MiB and more is most of the step,
        # and slicing a tensor over the lanes doubles its messages: one allreduce per tensor wins.
        cost = model.step_cost(self.tensors, 512, ib)
        self.assertGreater(cost.latency / model.LANES, 0.8 * cost.total(model.LANES))
        self.assertLess(model.step_time(self.tensors, 512, ib, fusion=False),
                        model.step_time(self.tensors, 512, ib, inline_threshold=0))
        # The coordinator's inline star is linear in n: still more than at 8 ranks.
        self.assertGreater(cost.inline, 10 * model.step_cost(self.tensors, 8, ib).inline)

    def test_fabrics_stay_within_published_busbw(self):
        # REFERENCE figures: EDR 12.2 GB/s; NDR 46-48 GB/s per NIC. None above its line rate.
        self.assertEqual(model.FABRICS["ib100"].busbw, 12.2e9)
        self.assertGreaterEqual(model.FABRICS["ib400"].busbw, 46e9)
        self.assertLessEqual(model.FABRICS["ib400"].busbw, 48e9)
        for key, line_gbit in (("1gbe", 1), ("10gbe", 10), ("25gbe", 25), ("100gbe", 100),
                               ("ib100", 100), ("ib200", 200), ("ib400", 400)):
            self.assertLess(model.FABRICS[key].busbw, line_gbit * 1e9 / 8, key)

    def test_predict_refuses_rank_counts_below_one(self):
        for ranks in ("0", "2,-8", "2,x"):
            r = subprocess.run([sys.executable, TOOL, "predict", "--ranks", ranks,
                                "--compute", "0.5"], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2, ranks)
            self.assertIn("--ranks", r.stderr)

    def test_compute_defaults_are_positive_and_sourced(self):
        for key, d in model.COMPUTE_DEFAULTS.items():
            self.assertGreater(d.seconds, 0, key)
            self.assertTrue(d.source, key)


class PlanTest(unittest.TestCase):
    fabric = model.Fabric("test", 1e9, 10e-6, "test")

    def test_one_rank_costs_nothing(self):
        self.assertEqual(model.step_time([model.Tensor("a", "float32", 10)], 1, self.fabric), 0)

    def test_allreduce_matches_the_formula(self):
        size, n = 64 << 20, 4
        ring = model.allreduce_time(size, n, self.fabric)
        self.assertAlmostEqual(ring, 2 * 3 * 10e-6 + 2 * 3 / 4 * size / 1e9)
        hd = model.allreduce_time(size, n, self.fabric, "halving_doubling")
        self.assertAlmostEqual(hd, 4 * 10e-6 + 2 * 3 / 4 * size / 1e9)
        with self.assertRaises(ValueError):
            model.allreduce_time(size, n, self.fabric, "tree")

    def test_above_2_ranks_gloo_runs_ring_from_1_MiB(self):
        # backends/gloo/gloo_backend.cc AutoAlgorithm: above 2 ranks, halving-doubling (2 log2 n
        # messages) below 1 MiB, the function-style ring allreduce (2(n-1)) from 1 MiB.
        mid = [model.Tensor("mid", "float32", 1 << 17)]  # 512 KiB: direct, one halving-doubling
        cost = model.step_cost(mid, 8, self.fabric, inline_threshold=0)
        self.assertAlmostEqual(cost.latency, 2 * 3 * 10e-6)
        big = [model.Tensor("big", "float32", 1 << 20)]  # 4 MiB: 2 slices of 2 MiB, ring each
        cost = model.step_cost(big, 8, self.fabric, inline_threshold=0)
        self.assertAlmostEqual(cost.latency, 2 * 2 * 7 * 10e-6)
        self.assertEqual(model.concord_algorithm(8, 1 << 20), "ring")
        self.assertEqual(model.concord_algorithm(8, (1 << 20) - 1), "halving_doubling")
        self.assertEqual(model.concord_algorithm(2, 4096), "ring")

    def test_inline_tensor_goes_through_the_coordinator(self):
        t = [model.Tensor("small", "float32", 1000)]  # 4000 bytes
        cost = model.step_cost(t, 8, self.fabric)
        self.assertAlmostEqual(cost.inline, 2 * 10e-6 + 2 * 7 * 4000 / 1e9)
        self.assertEqual(cost.messages, 0)

    def test_fused_and_direct_and_sliced(self):
        mid = [model.Tensor(f"m{i}", "float32", 16384) for i in range(3)]  # 64 KiB each: fused
        big = [model.Tensor("big", "float32", 1 << 20)]  # 4 MiB: direct, 2 slices
        cost = model.step_cost(mid + big, 2, self.fabric)
        self.assertEqual(cost.messages, 1 + 2)
        self.assertAlmostEqual(cost.bandwidth, (3 * 65536 + (4 << 20)) / 1e9)
        unfused = model.step_cost(mid + big, 2, self.fabric, fusion=False)
        self.assertEqual(unfused.messages, 4)

    def test_fp16_halves_and_topk_sends_8_bytes_per_kept_element(self):
        t = [model.Tensor("w", "float32", 10_000_000)]
        n = 8
        none = model.step_cost(t, n, self.fabric)
        fp16 = model.step_cost(t, n, self.fabric, compression="fp16")
        self.assertAlmostEqual(fp16.bandwidth, none.bandwidth / 2)
        topk = model.step_cost(t, n, self.fabric, compression="topk", density=0.01)
        self.assertAlmostEqual(topk.wire_bytes, (n - 1) * 8 * 0.01 * 10_000_000)
        for bad in ({"compression": "zip"}, {"compression": "topk", "density": 0}):
            with self.assertRaises(ValueError):
                model.step_cost(t, n, self.fabric, **bad)

    def test_efficiency(self):
        self.assertAlmostEqual(model.efficiency(1.0, 1.0), 0.5)
        self.assertAlmostEqual(model.efficiency(0.9, 0.2, overlap=True), 1.0)
        self.assertAlmostEqual(model.efficiency(0.9, 0.9, overlap=True), 0.9 / 1.2)
        with self.assertRaises(ValueError):
            model.efficiency(0, 1)


class LayoutTest(unittest.TestCase):
    link = model.Fabric("link", 1e8, 50e-6, "test")
    intra = model.Fabric("intra", 4e9, 20e-6, "test")
    big = [model.Tensor("big", "float32", 4 << 20)]  # 16 MiB: direct, 2 slices
    size = 16 << 20

    def cost(self, n=4, tensors=None, **layout):
        layout.setdefault("intra", self.intra)
        return model.step_cost(tensors or self.big, n, self.link, inline_threshold=0,
                               layout=model.Layout(**layout))

    def test_one_rank_per_host_is_the_model_without_hosts(self):
        plain = model.step_cost(self.big, 4, self.link, inline_threshold=0)
        self.assertEqual(self.cost(ranks_per_host=1), plain)
        self.assertEqual(self.cost(ranks_per_host=1, hierarchical=True), plain)

    def test_flat_in_blocks_moves_a_ring_hop_per_host_cyclic_every_hop(self):
        block = self.cost(ranks_per_host=2)
        self.assertAlmostEqual(block.bandwidth, 2 * 3 / 4 * self.size / 1e8)
        self.assertEqual(block.local, 0)
        cyclic = self.cost(ranks_per_host=2, placement="cyclic")
        self.assertAlmostEqual(cyclic.bandwidth, 2 * block.bandwidth)

    def test_hierarchical_is_local_phase_plus_allreduce_across_hosts(self):
        for placement in ("block", "cyclic"):
            hier = self.cost(ranks_per_host=2, placement=placement, hierarchical=True)
            # 2 hosts: 2(H-1)/H S = S over each host's link; 2 slices, each with its local phase.
            self.assertAlmostEqual(hier.bandwidth, self.size / 1e8)
            self.assertAlmostEqual(hier.local,
                                   2 * model.allreduce_time(self.size / 2, 2, self.intra))
            self.assertAlmostEqual(hier.latency, 2 * 2 * 50e-6)
        # 2x2 in blocks: 1.00 S against 1.50 S: the bound of what hierarchical can save.
        ratio = (self.cost(ranks_per_host=2, hierarchical=True).total(model.LANES)
                 / self.cost(ranks_per_host=2).total(model.LANES))
        self.assertGreater(ratio, 2 / 3)
        self.assertLess(ratio, 0.7)

    def test_below_the_threshold_and_on_one_host_it_is_flat(self):
        small = [model.Tensor("fused", "float32", 16384)]  # 64 KiB: one fusion buffer
        self.assertEqual(self.cost(tensors=small, ranks_per_host=2, hierarchical=True),
                         self.cost(tensors=small, ranks_per_host=2))
        one_host = self.cost(ranks_per_host=4, hierarchical=True)
        self.assertEqual(one_host.local, 0)
        self.assertAlmostEqual(one_host.bandwidth, 2 * 3 / 4 * self.size / 4e9)

    def test_inline_star_counts_remote_ranks_only(self):
        t = [model.Tensor("small", "float32", 1000)]  # 4000 bytes
        cost = model.step_cost(t, 8, self.link, layout=model.Layout(4))
        self.assertAlmostEqual(cost.inline, 2 * 50e-6 + 2 * 4 * 4000 / 1e8)

    def test_rejects_layouts_that_do_not_fit(self):
        for bad in ({"ranks_per_host": 3}, {"ranks_per_host": 2, "placement": "random"}):
            with self.assertRaises(ValueError):
                self.cost(**bad)


class HostsTest(unittest.TestCase):
    def test_measured_threshold_is_where_hierarchical_stays_ahead(self):
        rows = [(4096, 100, 150), (65536, 300, 290), (262144, 900, 950), (1 << 20, 3000, 2500),
                (4 << 20, 9000, 7000)]
        self.assertEqual(hosts.measured_threshold(rows), 1 << 20)
        self.assertIsNone(hosts.measured_threshold([(4096, 100, 150), (65536, 200, 250)]))
        self.assertEqual(hosts.measured_threshold([(4096, 100, 90)]), 4096)

    def test_step_checks_predict_with_the_given_fabrics(self):
        tensors = [model.Tensor("big", "float32", 4 << 20)]
        intra = model.Fabric("x", 3e9, 30e-6, "")
        sweep = [{"bytes": size, "ranks": 2, "implementation": "concord",
                  "time_us": model.allreduce_time(size, 2, intra) * 1e6}
                 for size in (1 << 18, 1 << 20, 1 << 22, 1 << 24)]
        data = {"hosts": 2, "ranks_per_host": 2, "intra": sweep,
                "steps": [{"placement": "cyclic", "mode": "flat", "seconds": 0.5},
                          {"placement": "block", "mode": "hierarchical", "seconds": 0.2}]}
        link = model.Fabric("link", 1e8, 50e-6, "")
        rows = hosts.step_checks(data, tensors, link, inline_threshold=0)
        fitted = hosts.intra_fabric(data)
        self.assertAlmostEqual(fitted.busbw / 3e9, 1, places=3)
        for row, placement, hier in zip(rows, ("cyclic", "block"), (False, True)):
            expected = model.step_time(tensors, 4, link, inline_threshold=0,
                                       layout=model.Layout(2, placement, hier, fitted))
            self.assertAlmostEqual(row["predicted"], expected)
            self.assertAlmostEqual(row["error"], expected / row["seconds"] - 1)


class FitTest(unittest.TestCase):
    def rows(self, alpha, busbw, n, noise=0.0, seed=1):
        rng = random.Random(seed)
        out = []
        size = 4096
        while size <= 64 << 20:
            # Concord's choice (gloo_backend.cc): halving-doubling below 1 MiB above 2 ranks.
            algorithm = "halving_doubling" if n > 2 and size < 1 << 20 else "ring"
            t = model.allreduce_time(size, n, model.Fabric("x", busbw, alpha, ""), algorithm)
            t *= 1 + rng.uniform(-noise, noise)
            out.append({"bytes": size, "time_us": t * 1e6, "ranks": n})
            size *= 4
        return out

    def test_recovers_alpha_and_beta_exactly(self):
        for n in (2, 4, 8):
            alpha, busbw, got_n = model.fit_alpha_beta(self.rows(150e-6, 117e6, n))
            self.assertEqual(got_n, n)
            self.assertAlmostEqual(alpha / 150e-6, 1, places=6)
            self.assertAlmostEqual(busbw / 117e6, 1, places=6)

    def test_recovers_them_within_noise(self):
        alpha, busbw, _ = model.fit_alpha_beta(self.rows(80e-6, 1.1e9, 2, noise=0.05))
        self.assertLess(abs(alpha / 80e-6 - 1), 0.25)
        self.assertLess(abs(busbw / 1.1e9 - 1), 0.08)

    def test_rejects_what_cannot_be_fitted(self):
        one_size = [{"bytes": 1 << 20, "time_us": 100.0, "ranks": 2}] * 3
        with self.assertRaises(ValueError):
            model.fit_alpha_beta(one_size)
        mixed = self.rows(1e-4, 1e9, 2) + self.rows(1e-4, 1e9, 4)
        with self.assertRaises(ValueError):
            model.fit_alpha_beta(mixed)
        with self.assertRaises(ValueError):
            model.fit_alpha_beta([])


class LoadWorkloadTest(unittest.TestCase):
    def write(self, text):
        f = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
        f.write(text)
        f.close()
        self.addCleanup(os.unlink, f.name)
        return f.name

    def test_parses_shapes_and_comments(self):
        path = self.write("# c\n\na float32 3x5\nb float16 7\n")
        t = model.load_workload(path)
        self.assertEqual([(x.name, x.elements, x.bytes) for x in t], [("a", 15, 60), ("b", 7, 14)])

    def test_rejects_bad_lines_and_empty_files(self):
        for text in ("a float99 3\n", "a float32\n", "# only a comment\n", "a float32 3xq\n"):
            with self.assertRaises(ValueError, msg=text):
                model.load_workload(self.write(text))


if __name__ == "__main__":
    unittest.main()
