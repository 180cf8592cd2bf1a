"""The alpha-beta scaling model of a data-parallel step, as Concord runs it.

One allreduce of S bytes on n ranks costs  T = L(n) * alpha + 2(n-1)/n * S / B
with B the link's measured busbw (bytes/s), alpha the per-message latency and L(n) the number of
sequential messages: 2(n-1) for a ring, 2*ceil(log2 n) for halving-doubling (both give 2 at
n = 2). Which one is Concord's Gloo backend's choice by message size (concord_algorithm, from
backends/gloo/gloo_backend.cc AutoAlgorithm): at 2 ranks a ring; above, halving-doubling below
1 MiB and Gloo's function-style ring allreduce from 1 MiB, so the large messages that carry most
of a step's bytes pay 2(n-1) alpha, which dominates at hundreds of ranks. An allgather in which
every rank contributes s bytes costs (n-1) alpha + (n-1) s / B (Gloo's ring allgather).

A step enqueues every gradient of a workload at once. Concord plans it like this (the defaults of
README's configuration table), and so does the model:
- inline (<= 32 KiB): all of them travel with the negotiation to the coordinator, which reduces them
  and sends the sums back: a star, not a ring, so rank 0's link carries (n-1) S in and then (n-1) S
  out: T = 2 alpha + 2(n-1) S / B. Cheap at 2-8 ranks, linear in n at hundreds.
- fused (32 KiB .. 256 KiB): packed in order into fusion buffers of at most 64 MiB, one allreduce
  each.
- direct (>= 256 KiB): one allreduce each, on the caller's memory; from 2 MiB cut into one slice per
  lane (at least 1 MiB each).
- lanes (2): the allreduces of a step run on that many backends at once. They share one link, so
  the bandwidth terms add up, while the latency terms of concurrent messages overlap: the model
  divides the summed latency by the number of lanes.
Without fusion every tensor is its own allreduce (no inline path, no buffers): the per-tensor
baseline of an unfused library.

Compression is modelled by its bytes on the wire: fp16/bf16 halves every float32 tensor on every
path; top-k at density d sends (index, value) pairs, 8 bytes per kept element, by an allgather (one
per fusion buffer, or one per tensor without fusion): (n-1) * 8 d N bytes reach each rank.

Hosts (Layout): n = H x L ranks, L per host sharing the host's one link (B, alpha), and an
intra-host fabric between them (shared memory here, NVLink on a GPU server). Placement decides what
a flat ring puts on the link: in blocks (rank k on host k // L, the launchers' default) one ring
hop per host crosses it, so the link carries what one rank's would, 2(n-1)/n S; cyclically (rank k
on host k % H) every hop crosses, so it carries L times that. The inline star's remote ranks are
n - L. Hierarchical (CONCORD_HIERARCHICAL, hosts with L > 1, allreduces of at least its threshold):
an allreduce within the host over the intra-host fabric (reduce-scatter + allgather, ring formula
on L ranks) and L concurrent allreduces of S/L across the H hosts, which share the link:
L(H) alpha + 2(H-1)/H S / B. In blocks that moves as many bytes over the link as the flat ring
(within (n-1)/n against (H-1)/H): what it saves is latency, L(n) against L(H), and the cyclic
placement's factor L. The intra-host time overlaps the other lane's like a latency (divided by the
lanes).

Scaling efficiency with compute time Tc per step: E = Tc / (Tc + T) without overlap; with the
communication overlapping the backward pass (about two thirds of Tc): E = Tc / max(Tc, Tc/3 + T).
"""

import math
from dataclasses import dataclass

DTYPE_BYTES = {"uint8": 1, "int8": 1, "float16": 2, "bfloat16": 2, "int32": 4, "float32": 4,
               "int64": 8, "float64": 8}

# Concord's defaults (README configuration table; core/engine.h kMinSliceBytes).
INLINE_THRESHOLD = 32 * 1024
DIRECT_THRESHOLD = 256 * 1024
FUSION_THRESHOLD = 64 * 1024 * 1024
MIN_SLICE_BYTES = 1024 * 1024
# From this size Concord's Gloo backend runs the function-style ring allreduce above 2 ranks
# (backends/gloo/gloo_backend.cc AutoAlgorithm); below it, halving-doubling.
GLOO_RING_BYTES = 1024 * 1024
LANES = 2
HIERARCHICAL_THRESHOLD = 256 * 1024


@dataclass(frozen=True)
class Fabric:
    """A link: busbw in bytes/s (what a large allreduce achieves), alpha in seconds per message."""
    name: str
    busbw: float
    alpha: float
    source: str


# Published or derived per-link figures. Ethernet: TCP goodput of a 1500-byte-MTU link is about 94%
# of line rate (1 GbE measures 941 Mbit/s in iperf; the emulated 1gbe profile here gives 956 Mbit/s,
# measured on the build machines), alpha 50 us for a kernel TCP message through a switch.
# InfiniBand: one EDR 100 Gb/s NIC gives 12.2 GB/s allreduce busbw and an 8-byte allreduce across
# 2 HDR nodes takes about 20 us, i.e. alpha = 10 us at n = 2 (REFERENCE.md, nccl-tests); HDR is
# scaled from EDR by line rate with EDR's 97.6% efficiency (an assumption, not a measurement);
# NDR uses NCCL's published 46-48 GB/s busbw per 400 Gb NIC (the middle, 47 GB/s: 94% of line
# rate, not 97.6%).
FABRICS = {
    "1gbe": Fabric("1 GbE", 0.94 * 1e9 / 8, 50e-6, "94% of line rate (TCP goodput), alpha 50 us"),
    "10gbe": Fabric("10 GbE", 0.94 * 10e9 / 8, 30e-6, "94% of line rate, alpha 30 us"),
    "25gbe": Fabric("25 GbE", 0.94 * 25e9 / 8, 25e-6, "94% of line rate, alpha 25 us"),
    "100gbe": Fabric("100 GbE", 0.94 * 100e9 / 8, 20e-6, "94% of line rate, alpha 20 us"),
    "ib100": Fabric("100 Gb IB (EDR)", 12.2e9, 10e-6,
                    "nccl-tests: 12.2 GB/s busbw; 20 us 8-byte allreduce on 2 nodes"),
    "ib200": Fabric("200 Gb IB (HDR)", 2 * 12.2e9, 10e-6, "EDR figures scaled by line rate"),
    "ib400": Fabric("400 Gb IB (NDR)", 47e9, 10e-6,
                    "NCCL: 46-48 GB/s busbw per NDR NIC; alpha as EDR"),
}


# Within a host. NVLink: 8 H100, NCCL ring busbw 370 GB/s (REFERENCE.md); its alpha is an
# assumption (a few microseconds per NCCL step), not a measurement. Shared memory: Concord's shm
# backend on this 2-core VM, replaced by a fit of the run when the report has one.
INTRA_FABRICS = {
    "nvlink": Fabric("NVLink (8 H100)", 370e9, 5e-6, "NCCL ring busbw 370 GB/s; alpha assumed"),
    "shm": Fabric("shared memory", 2.5e9, 20e-6, "Concord shm, 2 ranks, 64 MiB, this VM"),
}


@dataclass(frozen=True)
class Layout:
    """L ranks per host, how ranks are placed, whether allreduces go hierarchical, and the fabric
    within a host. Layout() is one rank per host, flat: the model without hosts."""
    ranks_per_host: int = 1
    placement: str = "block"
    hierarchical: bool = False
    intra: Fabric = INTRA_FABRICS["shm"]
    threshold: int = HIERARCHICAL_THRESHOLD

    def hosts(self, n):
        if self.placement not in ("block", "cyclic"):
            raise ValueError(f"unknown placement '{self.placement}'")
        if self.ranks_per_host < 1 or n % self.ranks_per_host:
            raise ValueError(f"{n} ranks do not fill hosts of {self.ranks_per_host}")
        return n // self.ranks_per_host

    def link_factor(self, n):
        """How many flat ring hops cross each host's link."""
        if self.placement == "cyclic" and self.hosts(n) > 1:
            return self.ranks_per_host
        return 1

    def goes_hierarchical(self, n, size):
        return (self.hierarchical and self.ranks_per_host > 1 and self.hosts(n) > 1
                and size >= self.threshold)


@dataclass(frozen=True)
class ComputeDefault:
    seconds: float
    source: str


# Compute time per step on one GPU. ResNet-50: NVIDIA DeepLearningExamples (PyTorch ResNet-50 v1.5,
# per-GPU batch 256): V100 fp32 367 img/s, AMP 1200 img/s; A100 TF32 938 img/s, AMP 2470 img/s.
# VGG-16 and BERT-large are derived from those measured FLOP rates (an estimate, override it with
# --compute): a training step is about 3x the forward FLOPs; ResNet-50 3.8 and VGG-16 15.3 G
# multiply-adds per image forward (He et al. 2015, table 1), so VGG-16 costs 4.03x ResNet-50 per
# image; BERT-large, 6 x 340 M parameters x 4096 tokens (batch 32, sequence 128) = 8.4 TFLOP a step
# (Kaplan et al. 2020), against ResNet-50's 22.8 GFLOP per image (8.4 TFLOP/s on V100 fp32).
COMPUTE_DEFAULTS = {
    ("resnet50", "v100"): ComputeDefault(256 / 367, "DLE: V100 fp32 367 img/s, batch 256"),
    ("resnet50", "v100-amp"): ComputeDefault(256 / 1200, "DLE: V100 AMP 1200 img/s, batch 256"),
    ("resnet50", "a100"): ComputeDefault(256 / 938, "DLE: A100 TF32 938 img/s, batch 256"),
    ("resnet50", "a100-amp"): ComputeDefault(256 / 2470, "DLE: A100 AMP 2470 img/s, batch 256"),
    ("vgg16", "v100"): ComputeDefault(64 * 4.03 / 367, "derived: 4.03x ResNet-50 FLOPs, batch 64"),
    ("vgg16", "a100"): ComputeDefault(64 * 4.03 / 938, "derived: 4.03x ResNet-50 FLOPs, batch 64"),
    ("bert_large", "v100"): ComputeDefault(8.36e12 / (367 * 22.8e9),
                                           "derived: 8.4 TFLOP/step at V100 fp32's 8.4 TFLOP/s"),
    ("bert_large", "a100"): ComputeDefault(8.36e12 / (938 * 22.8e9),
                                           "derived: 8.4 TFLOP/step at A100 TF32's 21 TFLOP/s"),
}


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    elements: int

    @property
    def bytes(self):
        return self.elements * DTYPE_BYTES[self.dtype]


def load_workload(path):
    """Reads a perf/workloads file: one 'name dtype shape' line per tensor, '#' comments."""
    tensors = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 3 or parts[1] not in DTYPE_BYTES:
                raise ValueError(f"{path}:{number}: expected 'name dtype shape', got '{line}'")
            elements = 1
            for dim in parts[2].split("x"):
                elements *= int(dim)
            tensors.append(Tensor(parts[0], parts[1], elements))
    if not tensors:
        raise ValueError(f"{path}: no tensors")
    return tensors


def latency_messages(n, algorithm):
    if n <= 1:
        return 0
    if algorithm == "ring":
        return 2 * (n - 1)
    if algorithm == "halving_doubling":
        return 2 * math.ceil(math.log2(n))
    raise ValueError(f"unknown algorithm '{algorithm}'")


def allreduce_time(size, n, fabric, algorithm="ring"):
    """Seconds for one allreduce of `size` bytes on n ranks."""
    if n <= 1:
        return 0.0
    return latency_messages(n, algorithm) * fabric.alpha + 2 * (n - 1) / n * size / fabric.busbw


@dataclass
class StepCost:
    latency: float = 0.0    # summed latency terms of backend collectives (before lane overlap)
    local: float = 0.0      # summed intra-host phases of hierarchical allreduces (likewise)
    bandwidth: float = 0.0  # summed bandwidth terms (one shared link)
    inline: float = 0.0     # the coordinator's star for inline tensors
    messages: int = 0
    wire_bytes: float = 0.0  # bytes each rank sends per step

    def total(self, lanes):
        return self.inline + self.bandwidth + (self.latency + self.local) / max(1, lanes)


def wire_size(tensor, compression):
    """Bytes of one tensor as the collective sees them (before top-k, which changes the op)."""
    if compression in ("fp16", "bf16") and tensor.dtype == "float32":
        return tensor.elements * 2
    return tensor.bytes


def concord_algorithm(n, size):
    """The allreduce algorithm Concord's Gloo backend runs for one message of `size` bytes on n
    ranks (float32; see GLOO_RING_BYTES)."""
    return "ring" if n <= 2 or size >= GLOO_RING_BYTES else "halving_doubling"


def _intra_algorithm(local):
    # The intra-host fabric's collective, approximated as a ring at 2 ranks and halving-doubling
    # above (its latency term only).
    return "ring" if local <= 2 else "halving_doubling"


def _add_allreduce(cost, size, n, fabric, algorithm, slices=1, layout=Layout()):
    """algorithm: None for Concord's choice by the size of each message (concord_algorithm)."""
    cost.messages += slices
    if layout.goes_hierarchical(n, size):
        hosts, local = layout.hosts(n), layout.ranks_per_host
        cost.local += slices * allreduce_time(size / slices, local, layout.intra,
                                              _intra_algorithm(local))
        across = algorithm or concord_algorithm(hosts, size / slices / local)
        cost.latency += slices * latency_messages(hosts, across) * fabric.alpha
        cost.bandwidth += 2 * (hosts - 1) / hosts * size / fabric.busbw
        cost.wire_bytes += 2 * (hosts - 1) / hosts * size
        return
    if layout.hosts(n) == 1:
        fabric = layout.intra  # every rank on one host: shared memory
    moved = layout.link_factor(n) * 2 * (n - 1) / n * size
    flat = algorithm or concord_algorithm(n, size / slices)
    cost.latency += slices * latency_messages(n, flat) * fabric.alpha
    cost.bandwidth += moved / fabric.busbw
    cost.wire_bytes += moved


def _add_allgather(cost, contribution, n, fabric):
    cost.latency += (n - 1) * fabric.alpha
    cost.bandwidth += (n - 1) * contribution / fabric.busbw
    cost.messages += 1
    cost.wire_bytes += (n - 1) * contribution


def step_cost(tensors, n, fabric, fusion=True, compression="none", density=0.001,
              algorithm=None, lanes=LANES, inline_threshold=INLINE_THRESHOLD, layout=Layout()):
    """Communication cost of one step of `tensors` on n ranks (see the module comment).

    inline_threshold is CONCORD_INLINE_THRESHOLD (0 turns the coordinator's path off); layout the
    hosts (Layout; top-k's allgathers are modelled as if each rank had its own link).
    """
    if compression not in ("none", "fp16", "bf16", "topk"):
        raise ValueError(f"unknown compression '{compression}'")
    if compression == "topk" and not 0 < density <= 1:
        raise ValueError("top-k density must be in (0, 1]")
    layout.hosts(n)  # checks the layout
    cost = StepCost()
    if n <= 1:
        return cost
    if compression == "topk":
        kept = [8 * math.ceil(density * t.elements) for t in tensors]
        if not fusion:
            for size in kept:
                _add_allgather(cost, size, n, fabric)
            return cost
        buffer = 0
        for size in kept:
            if buffer and buffer + size > FUSION_THRESHOLD:
                _add_allgather(cost, buffer, n, fabric)
                buffer = 0
            buffer += size
        if buffer:
            _add_allgather(cost, buffer, n, fabric)
        return cost
    sizes = [wire_size(t, compression) for t in tensors]
    if not fusion:
        for size in sizes:
            _add_allreduce(cost, size, n, fabric, algorithm, layout=layout)
        return cost
    inline = sum(s for s in sizes if s <= inline_threshold)
    remote = n - layout.ranks_per_host if layout.hosts(n) > 1 else n - 1
    if inline:
        cost.inline = 2 * fabric.alpha + 2 * remote * inline / fabric.busbw
        cost.wire_bytes += remote * inline  # rank 0's share, the busiest link
    buffer = 0
    for size in sizes:
        if size <= inline_threshold:
            continue
        if size >= DIRECT_THRESHOLD:
            slices = min(lanes, size // MIN_SLICE_BYTES)
            _add_allreduce(cost, size, n, fabric, algorithm, slices if slices >= 2 else 1, layout)
            continue
        if buffer and buffer + size > FUSION_THRESHOLD:
            _add_allreduce(cost, buffer, n, fabric, algorithm, layout=layout)
            buffer = 0
        buffer += size
    if buffer:
        _add_allreduce(cost, buffer, n, fabric, algorithm, layout=layout)
    return cost


def step_time(tensors, n, fabric, lanes=LANES, **kwargs):
    """Seconds of communication per step (step_cost's arguments)."""
    return step_cost(tensors, n, fabric, lanes=lanes, **kwargs).total(lanes)


def efficiency(compute, comm, overlap=False):
    """Scaling efficiency of a step of `compute` seconds of compute and `comm` of communication."""
    if compute <= 0:
        raise ValueError("compute time must be positive")
    if overlap:
        return compute / max(compute, compute / 3 + comm)
    return compute / (compute + comm)


def fit_alpha_beta(rows, min_bytes=INLINE_THRESHOLD + 1):
    """Fits alpha (s) and busbw (bytes/s) to concord-perf allreduce rows of one rank count.

    rows: dicts with 'bytes', 'time_us', 'ranks' (concord-perf --json, implementation 'concord').
    Sizes up to the inline threshold are left out (the coordinator, not the backend, reduces them).
    Least squares of t = L(n, S) alpha + b S, each point weighted by 1/t: between plain least
    squares (which only sees the largest sizes) and relative error (which a noisy small size can
    pull away from the bandwidth); L(n, S) the messages of the algorithm Concord runs for S
    (concord_algorithm: a sweep's sizes from 2 MiB are 2 slices on 2 lanes, each a message of at
    least 1 MiB whose latencies overlap), b = 2(n-1)/n / B.
    """
    points = [(r["bytes"], r["time_us"] * 1e-6) for r in rows
              if r["bytes"] >= min_bytes and r["time_us"] > 0]
    if len({s for s, _ in points}) < 2:
        raise ValueError("need rows of at least two sizes above the inline threshold to fit")
    ranks = {r["ranks"] for r in rows}
    if len(ranks) != 1 or min(ranks) < 2:
        raise ValueError(f"rows must come from one run of at least 2 ranks (got ranks {ranks})")
    n = ranks.pop()
    smm = sms = sss = smt = sst = 0.0
    for size, t in points:
        w = 1.0 / t
        m = latency_messages(n, concord_algorithm(n, size))
        smm += w * m * m
        sms += w * m * size
        sss += w * size * size
        smt += w * m * t
        sst += w * size * t
    det = smm * sss - sms * sms
    alpha = (smt * sss - sst * sms) / det
    b = (smm * sst - sms * smt) / det
    if b <= 0:
        raise ValueError("fitted bandwidth term is not positive: the sweep is noise")
    alpha = max(alpha, 0.0)
    busbw = 2 * (n - 1) / n / b
    return alpha, busbw, n
