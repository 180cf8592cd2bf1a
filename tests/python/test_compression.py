"""Compression through the Python binding: the spec goes to the library unchanged. fp16 and bf16
allreduces give the sums within their rounding; top-k sends the k largest magnitudes and keeps the
rest as a residual for the next step (error feedback); fp16 halves the bytes on the wire; a spec
the library cannot take raises InvalidArgumentError naming the problem, at enqueue (and from
check_compression, ahead of time). A reducescatter
takes fp16 and bf16 too (not top-k)."""
import numpy as np
import pytest

import concord
from concord import Status


def values(comm, n):
    """Small integers, different on each rank, exact in every half-precision format."""
    return (np.arange(n) % 64 + comm.rank + 1).astype(np.float32)


def expected_sum(comm, n):
    return sum((np.arange(n) % 64 + r + 1) for r in range(comm.size)).astype(np.float32)


def test_library_takes_compression():
    assert concord.compression_supported()


@pytest.mark.parametrize("spec", ["fp16", "bf16", "none"])
@pytest.mark.parametrize("n", [7, 4099, 100000])
def test_cast_allreduce(comm, spec, n):
    x = values(comm, n)
    out = comm.allreduce(x, name="cast.%s.%d" % (spec, n), compression=spec)
    np.testing.assert_array_equal(out, expected_sum(comm, n))
    avg = comm.allreduce(x, name="cast.avg.%s.%d" % (spec, n), op="average", compression=spec)
    np.testing.assert_allclose(avg, expected_sum(comm, n) / comm.size, rtol=2.0**-8)


def test_fp16_halves_the_wire_bytes(comm):
    if comm.size < 2:
        pytest.skip("needs two ranks")
    n = 1 << 16  # 256 KiB of float32: neither inline nor fused by size
    plain = comm.allreduce_async(values(comm, n), name="wire.none", compression="none")
    half = comm.allreduce_async(values(comm, n), name="wire.fp16", compression="fp16")
    # A ring allreduce sends 2 (n - 1) / n of the encoded bytes per rank.
    ring = lambda encoded: 2 * (comm.size - 1) * encoded // comm.size  # noqa: E731
    assert plain.wire_bytes() == ring(4 * n)
    assert half.wire_bytes() == ring(2 * n)


def test_topk_error_feedback(comm):
    n, k = 64, 16
    x = np.ones(n, np.float32)
    x[:k] = 100 + np.arange(k) + comm.rank  # the k largest magnitudes, on every rank
    spec = "topk:density=0.25,method=exact"
    out = comm.allreduce(x, name="topk.grad", compression=spec)
    want = np.zeros(n, np.float32)
    want[:k] = sum(100 + np.arange(k) + r for r in range(comm.size))
    np.testing.assert_array_equal(out, want)
    # Next step, a zero gradient: the residual (the ones not sent) is sent now, k of them, ties
    # going to the lower index.
    out = comm.allreduce(np.zeros(n, np.float32), name="topk.grad", compression=spec)
    want = np.zeros(n, np.float32)
    want[k:2 * k] = comm.size
    np.testing.assert_array_equal(out, want)


def test_topk_without_a_name_is_refused(comm):
    # Its residual would sit under a name never used again: error feedback lost, memory kept.
    with pytest.raises(concord.InvalidArgumentError, match="without a name: top-k keeps"):
        comm.allreduce(np.ones(8, np.float32), compression="topk:density=0.5")
    comm.allreduce(np.ones(8, np.float32), compression="fp16")  # casts keep no state


def test_topk_residuals_are_bounded_by_name(comm):
    # CONCORD_TOPK_RESIDUALS (1024) names keep a residual; each new one beyond evicts the least
    # recently compressed. "topk.kept" is used between the one-off names, so it stays.
    spec = "topk:density=0.125,method=exact"  # one element of 8 sent per call
    before = comm.stats()["topk_residual_evictions"]
    sent = np.zeros(8, np.float32)
    sent[7] = 8 * comm.size
    out = comm.allreduce(np.arange(1, 9, dtype=np.float32), name="topk.kept", compression=spec)
    np.testing.assert_array_equal(out, sent)
    for i in range(1100):
        comm.allreduce(np.ones(8, np.float32), name="topk.once.%d" % i, compression=spec)
        if i % 500 == 0:  # a zero gradient: the largest residual left goes (7, then 6, then 5)
            out = comm.allreduce(np.zeros(8, np.float32), name="topk.kept", compression=spec)
            sent[:] = 0
            sent[6 - i // 500] = (7 - i // 500) * comm.size
            np.testing.assert_array_equal(out, sent)
    out = comm.allreduce(np.zeros(8, np.float32), name="topk.kept", compression=spec)
    sent[:] = 0
    sent[3] = 4 * comm.size  # its residual survived 1100 other names
    np.testing.assert_array_equal(out, sent)
    # 1101 new names: at least 77 evictions, more by the names earlier tests left.
    evicted = comm.stats()["topk_residual_evictions"] - before
    assert 1101 - 1024 <= evicted <= 1101 - 1024 + 16


def test_topk_full_density_is_exact(comm):
    x = values(comm, 1000)
    out = comm.allreduce(x, name="topk.full", compression="topk:density=1")
    np.testing.assert_array_equal(out, expected_sum(comm, 1000))


@pytest.mark.parametrize("spec, words", [
    ("zstd", ["unknown compressor 'zstd'"]),
    ("topk:density=2", ["density"]),
    ("topk", ["needs a density"]),
    ("fp16:level=3", ["takes no parameters"]),
])
def test_bad_spec_names_the_problem(comm, spec, words):
    with pytest.raises(concord.InvalidArgumentError) as e:
        comm.allreduce(np.ones(8, np.float32), name="bad.spec", compression=spec)
    assert e.value.status == Status.ERR_INVALID_ARGUMENT
    assert "bad.spec" in e.value.message
    for w in words:
        assert w in e.value.message
    # Refused at enqueue: nothing was negotiated, and the name is free again.
    comm.allreduce(np.ones(8, np.float32), name="bad.spec")
    # check_compression says the same ahead of time, naming the spec.
    with pytest.raises(concord.InvalidArgumentError) as e:
        concord.check_compression(spec)
    assert "compression '%s': " % spec in e.value.message
    for w in words:
        assert w in e.value.message


def test_check_compression_ahead():
    concord.check_compression(None)
    concord.check_compression("none", "int32")
    concord.check_compression("topk:density=0.1", np.dtype("float32"))
    with pytest.raises(concord.InvalidArgumentError, match="'topk:density=0.1'.*float32"):
        concord.check_compression("topk:density=0.1", "float64")
    with pytest.raises(concord.InvalidArgumentError, match="dtype bool: Concord takes"):
        concord.check_compression("fp16", "bool")


def test_dtype_the_compressor_refuses(comm):
    with pytest.raises(concord.InvalidArgumentError, match="fp16"):
        comm.allreduce(np.ones(8, np.int32), name="int.fp16", compression="fp16")


@pytest.mark.parametrize("spec", ["fp16", "bf16"])
def test_half_tensors_travel_as_they_are_under_a_cast(comm, spec):
    # Nothing to gain (2 bytes an element already), and a cast to the other 16-bit format would
    # only lose range or precision: DistributedOptimizer(compression="fp16") on a float16 model.
    concord.check_compression(spec, "float16")
    x = (np.arange(5) + 2048 + comm.rank).astype(np.float16)  # exact in float16, not in bfloat16
    out = comm.allreduce(x, name="half.%s" % spec, op="max", compression=spec)
    np.testing.assert_array_equal(out, (np.arange(5) + 2048 + comm.size - 1).astype(np.float16))


def test_default_compression_passes_what_it_cannot_take(comm):
    # CONCORD_COMPRESSION=fp16 compresses the float gradients; a step counter's int32 allreduce
    # travels uncompressed (asked for explicitly, as above, it is refused).
    with concord.Communicator(compression="fp16") as c:
        out = c.allreduce(np.full(3, 7 + c.rank, np.int32), name="default.int")
        assert out.tolist() == [sum(7 + r for r in range(c.size))] * 3
        third = c.allreduce(np.full(3, 1 / 3, np.float32), name="default.float")
        assert third[0] != np.float32(c.size / 3)  # compressed: rounded to fp16 on the way
        np.testing.assert_allclose(third, c.size / 3, rtol=2.0**-10)


def test_spec_must_be_a_string(comm):
    with pytest.raises(concord.InvalidArgumentError, match="spec string"):
        comm.allreduce(np.ones(8, np.float32), name="bad.type", compression=16)


@pytest.mark.parametrize("spec", ["fp16", "bf16"])
def test_cast_reducescatter(comm, spec):
    n = 4 * comm.size + 1  # uneven: rank 0 gets one more row
    x = values(comm, n)
    out = comm.reducescatter(x, name="rs.cast.%s" % spec, compression=spec)
    first = sum(n // comm.size + (1 if r < n % comm.size else 0) for r in range(comm.rank))
    np.testing.assert_array_equal(out, expected_sum(comm, n)[first:first + len(out)])
    with pytest.raises(concord.InvalidArgumentError, match="summable"):
        comm.reducescatter(x, name="rs.topk", compression="topk:density=0.5")


def rank_values(r):
    """Rank r's input to the reductions below: 1/3 + r is exact in no half-precision format."""
    return np.array([1 + r, -2 * (r + 1), 3, 0.5 * (r + 1), 1 / 3 + r], np.float32)


def test_default_compression_leaves_min_max_and_product_exact(comm):
    # A communicator's default (CONCORD_COMPRESSION, concord_config_t.compression) compresses
    # gradients: sums and averages. A max of the loss or a min of a flag keeps its exact values
    # (top-k used to return the sum instead).
    with concord.Communicator(compression="topk:density=0.5") as c:
        every = np.stack([rank_values(r) for r in range(c.size)])
        x = rank_values(c.rank)
        np.testing.assert_array_equal(c.allreduce(x, name="default.max", op="max"), every.max(0))
        np.testing.assert_array_equal(c.allreduce(x, name="default.min", op="min"), every.min(0))
        np.testing.assert_allclose(c.allreduce(x, name="default.product", op="product"),
                                   every.prod(0, dtype=np.float64), rtol=1e-6)
        # A sum does take the default: density 0.5 of 5 elements sends 3, the rest stays behind.
        summed = c.allreduce(x, name="default.sum")
        assert np.count_nonzero(summed) == 3


@pytest.mark.parametrize("spec", ["fp16", "bf16"])
def test_casts_reduce_with_the_operation(comm, spec):
    every = np.stack([rank_values(r) for r in range(comm.size)])[:, :4]  # exact in 16 bits
    x = rank_values(comm.rank)[:4]
    for op, want in (("max", every.max(0)), ("min", every.min(0)), ("product", every.prod(0))):
        out = comm.allreduce(x, name="cast.%s.%s" % (op, spec), op=op, compression=spec)
        np.testing.assert_array_equal(out, want.astype(np.float32))
        out = comm.reducescatter(np.tile(x, (comm.size, 1)), name="rs.%s.%s" % (op, spec), op=op,
                                 compression=spec)
        np.testing.assert_array_equal(out, want.astype(np.float32)[None, :])


@pytest.mark.parametrize("op", ["min", "max", "product"])
def test_topk_takes_sum_and_average_only(comm, op):
    with pytest.raises(concord.InvalidArgumentError, match="sum and average only, not " + op):
        comm.allreduce(np.ones(8, np.float32), name="topk." + op, op=op,
                       compression="topk:density=0.5")
