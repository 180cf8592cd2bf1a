"""Tests of perf/concord_fabric/switches.py: real-fabric switches fail at once without a fabric."""
import os
import subprocess
import sys
import tempfile
import unittest

from concord_fabric import switches

TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "perf", "concord-fabric")


class SwitchesTest(unittest.TestCase):
    def test_ib_without_sysfs_names_what_is_missing(self):
        with self.assertRaises(switches.FabricError) as e:
            switches.fabric_env("ib", "gloo", sysfs="/nonexistent/infiniband")
        self.assertIn("/nonexistent/infiniband does not exist", str(e.exception))

    def test_ib_with_empty_sysfs(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(switches.FabricError) as e:
                switches.fabric_env("ib", "nccl", sysfs=d)
            self.assertIn("empty", str(e.exception))

    def test_ib_with_a_device(self):
        with tempfile.TemporaryDirectory() as d:
            os.mkdir(os.path.join(d, "mlx5_0"))
            self.assertEqual(switches.fabric_env("ib", "gloo", sysfs=d),
                             {"CONCORD_BACKEND": "gloo-ibverbs"})
            env = switches.fabric_env("ib", "mpi", ib_device="mlx5_0", sysfs=d)
            self.assertEqual((env["OMPI_MCA_pml"], env["UCX_NET_DEVICES"]), ("ucx", "mlx5_0:1"))
            env = switches.fabric_env("ib", "nccl", iface="eth0", ib_device="mlx5_0", sysfs=d)
            self.assertEqual((env["NCCL_IB_DISABLE"], env["NCCL_IB_HCA"]), ("0", "mlx5_0"))

    def test_ethernet(self):
        self.assertEqual(switches.fabric_env("ethernet", "gloo", iface="eth1"),
                         {"CONCORD_BACKEND": "gloo", "CONCORD_IFACE": "eth1"})
        env = switches.fabric_env("ethernet", "nccl", iface="eth1")
        self.assertEqual((env["NCCL_IB_DISABLE"], env["NCCL_SOCKET_IFNAME"]), ("1", "eth1"))
        env = switches.fabric_env("ethernet", "mpi", iface="eth1")
        self.assertEqual((env["OMPI_MCA_btl"], env["OMPI_MCA_btl_tcp_if_include"]),
                         ("self,vader,tcp", "eth1"))

    def test_unknown_names(self):
        for fabric, backend in (("ib", "tcp"), ("omnipath", "gloo")):
            with self.assertRaises(switches.FabricError):
                switches.fabric_env(fabric, backend, sysfs="/nonexistent")

    @unittest.skipIf(os.path.isdir("/sys/class/infiniband"), "this host has an RDMA fabric")
    def test_tool_fails_at_once_here(self):
        r = subprocess.run([sys.executable, TOOL, "real", "--fabric", "ib", "-np", "2", "--",
                            "true"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("/sys/class/infiniband does not exist", r.stderr)


if __name__ == "__main__":
    unittest.main()
