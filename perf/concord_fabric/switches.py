"""Real fabrics: the environment that makes a Concord job run over Ethernet or InfiniBand.

One switch, --fabric ethernet|ib, per backend:
  gloo  ethernet: CONCORD_BACKEND=gloo (TCP; CONCORD_IFACE picks the NIC)
        ib:       CONCORD_BACKEND=gloo-ibverbs (Gloo's ibverbs transport: first RDMA device, port 1)
  mpi   ethernet: OMPI_MCA_pml=ob1, OMPI_MCA_btl=self,vader,tcp, OMPI_MCA_btl_tcp_if_include=IFACE,
                  UCX_TLS=tcp,sm,self (if UCX is used anyway), UCX_NET_DEVICES=IFACE
        ib:       OMPI_MCA_pml=ucx, UCX_TLS=rc,ud,sm,self, UCX_NET_DEVICES=DEV:1 (with --ib-device)
  nccl  ethernet: NCCL_IB_DISABLE=1, NCCL_SOCKET_IFNAME=IFACE
        ib:       NCCL_IB_DISABLE=0, NCCL_IB_HCA=DEV (with --ib-device), NCCL_SOCKET_IFNAME=IFACE
                  (NCCL's bootstrap still uses a socket)
The variables are set for every rank (concordrun passes its environment on); the mpi and nccl
backends are built on other branches: until they are, concordrun's ranks fail with Concord's own
"backend ... is not built" message. An ib switch on a host without an RDMA device fails before
anything starts, saying what is missing.
"""

import os

BACKENDS = ("gloo", "mpi", "nccl")
FABRICS = ("ethernet", "ib")


class FabricError(RuntimeError):
    pass


def rdma_devices(sysfs="/sys/class/infiniband"):
    try:
        return sorted(os.listdir(sysfs))
    except FileNotFoundError:
        return None


def check_fabric(fabric, sysfs="/sys/class/infiniband"):
    """Raises FabricError naming what is missing for `fabric` on this host."""
    if fabric not in FABRICS:
        raise FabricError(f"unknown fabric '{fabric}' (known: {', '.join(FABRICS)})")
    if fabric == "ib":
        devices = rdma_devices(sysfs)
        if devices is None:
            raise FabricError(f"--fabric ib: no InfiniBand or RoCE device: {sysfs} does not exist "
                              "(no RDMA NIC, or its kernel driver and rdma-core are not loaded); "
                              "use --fabric ethernet")
        if not devices:
            raise FabricError(f"--fabric ib: {sysfs} is empty: no RDMA device is registered; "
                              "use --fabric ethernet")


def fabric_env(fabric, backend, iface=None, ib_device=None, sysfs="/sys/class/infiniband"):
    """The variables that select `fabric` for `backend`; checks the fabric exists first."""
    if backend not in BACKENDS:
        raise FabricError(f"unknown backend '{backend}' (known: {', '.join(BACKENDS)})")
    check_fabric(fabric, sysfs)
    env = {}
    if iface:
        env["CONCORD_IFACE"] = iface
    if backend == "gloo":
        env["CONCORD_BACKEND"] = "gloo-ibverbs" if fabric == "ib" else "gloo"
    elif backend == "mpi":
        env["CONCORD_BACKEND"] = "mpi"
        if fabric == "ib":
            env.update({"OMPI_MCA_pml": "ucx", "UCX_TLS": "rc,ud,sm,self"})
            if ib_device:
                env["UCX_NET_DEVICES"] = f"{ib_device}:1"
        else:
            env.update({"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self,vader,tcp",
                        "UCX_TLS": "tcp,sm,self"})
            if iface:
                env.update({"OMPI_MCA_btl_tcp_if_include": iface, "UCX_NET_DEVICES": iface})
    else:
        env["CONCORD_BACKEND"] = "nccl"
        env["NCCL_IB_DISABLE"] = "0" if fabric == "ib" else "1"
        if iface:
            env["NCCL_SOCKET_IFNAME"] = iface
        if fabric == "ib" and ib_device:
            env["NCCL_IB_HCA"] = ib_device
    return env
