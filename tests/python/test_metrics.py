"""Metrics (concord_comm_metrics, CONCORD_METRICS_PORT, CONCORD_SUMMARY_DIR) on a communicator of
its own, so that a known sequence of operations gives known counts. Every rank runs the same
session (concordrun), so the collective calls match."""
import math
import os
import re
import socket
import tempfile
import urllib.error
import urllib.request

import numpy as np
import pytest

import concord
from concord import Status

from envutil import with_env

BIG = 100_000  # float32 elements: past the direct threshold, run in place on the lanes
SMALL = 10_000  # float32 elements: fused, above the inline threshold
OWNED = 16_384  # float32 elements: an allgather result large enough to be kept once freed


@pytest.fixture(scope="module")
def run():
    """A fresh communicator serving metrics on a port of the kernel's choosing, after a known
    sequence of operations; yields (communicator, its metrics, its Prometheus page)."""
    c = with_env({"CONCORD_METRICS_PORT": "0"}, concord.Communicator)
    for _ in range(5):  # one negotiated in full, four as cache bits
        c.allreduce(np.ones(BIG, np.float32), name="metrics.big")
    for _ in range(3):
        c.allgather(np.arange(7, dtype=np.int32), name="metrics.gather")
    c.allgather(np.ones(OWNED, np.float32), name="metrics.owned")  # its result, dropped, is kept
    with c.group():
        handles = [c.allreduce_async(np.ones(SMALL, np.float32), name="metrics.fused%d" % k)
                   for k in range(4)]
    for h in handles:
        h.wait()
    if concord.compression_supported():
        c.allreduce(np.ones(SMALL, np.float32), name="metrics.fp16", compression="fp16")
    if c.size > 1 and c.rank < 2:
        # Point to point: an expected recv on rank 1, one of any shape on rank 0.
        if c.rank == 0:
            c.send(np.ones(5, np.float32), peer=1, tag=7)
            got = c.recv(peer=1, tag=8)
            assert got.dtype == np.int64 and got.shape == (3,)
        else:
            c.recv(peer=0, tag=7, like=np.zeros(5, np.float32))
            c.send(np.arange(3, dtype=np.int64), peer=0, tag=8)
    if c.size > 1:
        with pytest.raises(concord.ConcordError) as e:
            c.allreduce(np.zeros(4 + c.rank, np.float32), name="metrics.mismatched")
        assert e.value.status == Status.ERR_MISMATCH
    c.barrier()
    m = c.metrics()
    page = urllib.request.urlopen("http://%s/metrics" % m["endpoint"], timeout=10).read()
    yield c, m, page.decode("utf-8")
    c.finalize()


def op(m, name, dtype):
    found = [o for o in m["operations"] if o["op"] == name and o["dtype"] == dtype]
    assert len(found) == 1, m["operations"]
    return found[0]


def test_operations_add_up(run):
    c, m, _ = run
    assert m["rank"] == c.rank and m["size"] == c.size and m["version"] == 1
    big = op(m, "allreduce", "float32")
    fused = 4 + (1 if concord.compression_supported() else 0)
    assert big["count"] == 5 + fused + (1 if c.size > 1 else 0)
    assert big["bytes"] == 5 * BIG * 4 + fused * SMALL * 4 + (4 + c.rank) * 4 * (c.size > 1)
    assert big["errors"] == (1 if c.size > 1 else 0)
    gather = op(m, "allgather", "int32")
    assert (gather["count"], gather["bytes"], gather["errors"]) == (3, 3 * 7 * 4, 0)
    barrier = op(m, "barrier", "uint8")
    assert barrier["count"] == 1 and barrier["bytes"] == 0
    if c.size > 1:
        assert m["errors"] == {"MISMATCH": 1}
        assert big["wire_bytes"] > 0
    for o in m["operations"]:
        assert o["negotiation_s"] >= 0 and o["execution_s"] > 0 and o["callback_s"] >= 0


def test_sends_and_recvs_are_counted(run):
    c, m, _ = run
    if c.size == 1:
        return
    send = op(m, "send", "float32" if c.rank == 0 else "int64")
    recv = op(m, "recv", "int64" if c.rank == 0 else "float32")
    assert (send["count"], send["bytes"]) == ((1, 20) if c.rank == 0 else (1, 24))
    assert send["wire_bytes"] == send["bytes"]
    # Rank 0's recv took the sender's shape: its bytes and dtype are known at completion.
    assert (recv["count"], recv["bytes"]) == ((1, 24) if c.rank == 0 else (1, 20))


def test_cache_hits_after_warm_up(run):
    c, m, _ = run
    counters = m["counters"]
    # Every completed collective was negotiated once: in full or as a cache bit.
    ops = sum(o["count"] for o in m["operations"] if o["op"] not in ("send", "recv"))
    assert counters["responses_cached"] + counters["responses_full"] == ops
    # The repeats of metrics.big and metrics.gather were cache bits.
    assert counters["responses_cached"] >= 4 + 2
    assert m["cache_hit_rate"] == pytest.approx(
        counters["responses_cached"] / (counters["responses_cached"] + counters["responses_full"]))


def test_latency_histograms_count_every_successful_operation(run):
    _, m, _ = run
    by_op = {}
    for h in m["latency"]:
        bounds = [b for b, _ in h["buckets"]]
        counts = [n for _, n in h["buckets"]]
        assert bounds[-1] == "+Inf" and bounds[:-1] == sorted(bounds[:-1])
        assert counts == sorted(counts) and counts[-1] == h["count"]
        assert h["sum_s"] > 0
        by_op[h["op"]] = by_op.get(h["op"], 0) + h["count"]
    for o in m["operations"]:
        assert by_op.get(o["op"], 0) >= o["count"] - o["errors"]
    # metrics.big (400 KB) lands in the 1 MiB bucket, five times.
    big = [h for h in m["latency"] if h["op"] == "allreduce" and h["size_le"] == "1048576"]
    assert len(big) == 1 and big[0]["count"] == 5


def test_collectives_carry_the_bytes(run):
    c, m, _ = run
    if c.size == 1:
        assert m["collectives"] == [] or all(x["count"] > 0 for x in m["collectives"])
        return
    allreduce = [x for x in m["collectives"] if x["op"] == "allreduce"]
    assert allreduce, m["collectives"]
    # Five in-place allreduces of BIG, split over the lanes; the fused batch; the fp16 batch.
    assert sum(x["bytes"] for x in allreduce) >= 5 * BIG * 4 + 4 * SMALL * 4
    assert all(x["seconds"] > 0 and x["errors"] == 0 for x in m["collectives"])
    assert sum(h["count"] for h in m["collective_latency"]) == sum(
        x["count"] - x["errors"] for x in m["collectives"])
    assert m["fusion"]["batches"] >= 1 and 0 < m["fusion"]["mean_fill"] <= 1
    if concord.compression_supported():
        assert m["compression"]["ratio"] == pytest.approx(2.0, rel=0.05)


def test_rank0_attributes_every_operation_to_a_straggler(run):
    c, m, _ = run
    s = m["stragglers"]
    if c.rank != 0 or c.size == 1:
        assert s["ranks"] == [] or c.size == 1
        return
    assert len(s["ranks"]) == c.size
    assert sum(r["last"] for r in s["ranks"]) == s["operations"] > 0
    assert all(0 <= r["share"] <= 1 and r["waited_s"] >= 0 for r in s["ranks"])


# ---- Prometheus text format (exposition format 0.0.4), checked strictly ----
NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*"'
SAMPLE = re.compile(r"^(%s)(?:\{(%s(?:,%s)*)?\})? (\S+)$" % (NAME, LABEL, LABEL))


def parse_prometheus(text):
    """{family: (type, [(name, {label: value}, float)])}; raises AssertionError on a bad line."""
    assert text.endswith("\n")
    families, current = {}, None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            assert re.match(r"^# HELP %s \S" % NAME, line), line
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped"), line
            assert name not in families, "family %s declared twice" % name
            families[name] = (kind, [])
            current = name
            continue
        assert not line.startswith("#") and line, repr(line)
        match = SAMPLE.match(line)
        assert match, "not a sample line: %r" % line
        name, labels, value = match.group(1), match.group(2) or "", match.group(3)
        kind = families[current][0]
        allowed = {current} if kind != "histogram" else {current + s for s in
                                                          ("_bucket", "_sum", "_count")}
        assert name in allowed, "%s outside its family %s" % (name, current)
        parsed = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels))
        families[current][1].append((name, parsed, float(value)))
        if kind == "counter":
            assert float(value) >= 0, line
    return families


def check_histograms(families):
    for family, (kind, samples) in families.items():
        if kind != "histogram":
            continue
        series = {}
        for name, labels, value in samples:
            key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
            series.setdefault(key, {"buckets": []})
            if name.endswith("_bucket"):
                series[key]["buckets"].append((float(labels["le"]), value))
            else:
                series[key][name[len(family):]] = value
        for key, s in series.items():
            bounds = [b for b, _ in s["buckets"]]
            counts = [n for _, n in s["buckets"]]
            assert bounds == sorted(bounds) and math.isinf(bounds[-1]), (family, key)
            assert counts == sorted(counts) and counts[-1] == s["_count"], (family, key)
            assert "_sum" in s, (family, key)


def test_prometheus_page_parses_and_agrees_with_the_json(run):
    c, m, page = run
    families = parse_prometheus(page)
    check_histograms(families)
    for _, labels, _ in (x for f in families.values() for x in f[1]):
        assert labels["rank"] == str(c.rank)
    ops = {(l["op"], l["dtype"]): v for _, l, v in families["concord_operations_total"][1]}
    # The page was rendered after c.metrics(): later counts are at least the JSON's.
    for o in m["operations"]:
        assert ops[(o["op"], o["dtype"])] >= o["count"]
    assert families["concord_operation_latency_seconds"][0] == "histogram"
    assert families["concord_engine_responses_cached_total"][1][0][2] >= m["counters"]["responses_cached"]


def test_scratch_memory_is_in_the_json_and_the_page(run):
    c, m, page = run
    counters = m["counters"]
    # The fused group packed into a lane's fusion buffer; metrics.owned's result, freed, is kept
    # for reuse.
    assert counters["scratch_bytes"] >= 4 * SMALL * 4, counters
    assert counters["scratch_reallocations"] >= 1, counters
    assert counters["kept_result_bytes"] >= OWNED * 4 * c.size, counters
    families = parse_prometheus(page)
    # Bytes held now are gauges (no _total); the reallocations a counter.
    for name in ("scratch_bytes", "kept_result_bytes"):
        kind, samples = families["concord_engine_" + name]
        assert kind == "gauge" and samples[0][2] > 0, (name, kind, samples)
        assert "concord_engine_%s_total" % name not in families
    kind, samples = families["concord_engine_scratch_reallocations_total"]
    assert kind == "counter" and samples[0][2] >= counters["scratch_reallocations"]


def test_metrics_endpoint_answers_only_its_page(run):
    _, m, _ = run
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen("http://%s/nothing" % m["endpoint"], timeout=10)
    assert e.value.code == 404


# ---- bad input: refused at init, before any peer is involved ----
def test_a_metrics_port_in_use_is_an_error_naming_it():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    local_rank = int(os.environ.get("CONCORD_LOCAL_RANK", "0"))
    if port - local_rank < 1:
        pytest.skip("the kernel's port is below this rank's local rank")
    try:
        with pytest.raises(concord.ConcordError) as e:
            with_env({"CONCORD_METRICS_PORT": str(port - local_rank)}, concord.Communicator)
    finally:
        taken.close()
    assert e.value.status == Status.ERR_UNAVAILABLE
    assert "CONCORD_METRICS_PORT" in e.value.message and str(port) in e.value.message
    assert "in use" in e.value.message


@pytest.mark.parametrize("value", ["70000", "http", "127.0.0.1:", ":9400", "-1", "-0", "+9400",
                                   " 9400", "::1:0"])
def test_a_malformed_metrics_port_is_an_invalid_argument(value):
    with pytest.raises(concord.ConcordError) as e:
        with_env({"CONCORD_METRICS_PORT": value}, concord.Communicator)
    assert e.value.status == Status.ERR_INVALID_ARGUMENT
    assert "CONCORD_METRICS_PORT" in e.value.message and value in e.value.message


# ---- the end-of-job summary ----
def test_finalize_writes_the_summary_concordrun_reads():
    with tempfile.TemporaryDirectory() as d:
        c = with_env({"CONCORD_SUMMARY_DIR": d}, concord.Communicator)
        c.allreduce(np.ones(BIG, np.float32), name="summary.big")
        c.finalize()
        lines = open(os.path.join(d, "rank-%d.txt" % c.rank)).read().splitlines()
    values = {}
    for line in lines:
        if line and not line.startswith("#"):
            key, _, rest = line.partition(" ")
            values.setdefault(key, []).append(rest)
    assert values["rank"] == [str(c.rank)]
    assert values["ops"] == ["1"]  # the finalize barrier is the engine's own, not counted
    assert int(values["bytes"][0]) == BIG * 4
    assert float(values["wall_s"][0]) > 0 and float(values["collective_s"][0]) >= 0
    assert {p.split(" ")[0] for p in values["phase"]} == {"negotiation", "execution", "callback"}
    assert ("straggler" in values) == (c.rank == 0 and c.size > 1)


def test_an_unwritable_summary_dir_warns_and_finalize_succeeds():
    c = with_env({"CONCORD_SUMMARY_DIR": "/proc/no-such-dir"}, concord.Communicator)
    c.barrier()
    c.finalize()  # raises on failure
