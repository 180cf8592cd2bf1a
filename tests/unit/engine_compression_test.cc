// Compressed allreduces through the engine: every compressor at 1-4 ranks, fused batches,
// averages and scaling, top-k's selection, mismatches, refused specs and the bytes on the wire.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tests/unit/engine_test_util.h"
#include "tests/unit/timeline_events.h"

namespace concord {
namespace {

using engine_testing::Await;
using engine_testing::Entry;
using engine_testing::Job;
using engine_testing::Request;
using engine_testing::Submit;
using harness::RunRanks;
using timeline_testing::Named;
using timeline_testing::ReadSlices;
using timeline_testing::SliceEvent;

// An allreduce of `n` float32 named `name` with compression `spec`.
TensorRequest Compressed(const std::string& name, size_t n, const std::string& spec,
                         DType dtype = DType::kFloat32) {
  TensorRequest r = Request(name, OpType::kAllreduce, dtype, {static_cast<int64_t>(n)});
  r.compression = spec;
  return r;
}

// Rank r's element i: small values that fp16 and bf16 hold exactly.
float Value(int rank, size_t i) {
  return static_cast<float>(static_cast<int>(i % 13) - 6 + rank);
}

struct CompressionCase {
  const char* spec;
  DType dtype;       // casts take float32 and float64, top-k float32
  double tolerance;  // absolute, on results of magnitude <= ~40
  double relative;   // and relative, for products (up to 9^4): one rounding per rank
};

bool IsTopk(const char* spec) {
  return std::string(spec).rfind("topk", 0) == 0;
}

// The reduction of Value(r, i) over `size` ranks, in double.
double Reduced(ReduceOp op, int size, size_t i) {
  double want = op == ReduceOp::kMin       ? HUGE_VAL
                : op == ReduceOp::kMax     ? -HUGE_VAL
                : op == ReduceOp::kProduct ? 1.0
                                           : 0.0;
  for (int r = 0; r < size; ++r) {
    const double v = Value(r, i);
    switch (op) {
      case ReduceOp::kMin:
        want = std::min(want, v);
        break;
      case ReduceOp::kMax:
        want = std::max(want, v);
        break;
      case ReduceOp::kProduct:
        want *= v;
        break;
      default:
        want += v;
    }
  }
  return op == ReduceOp::kAverage ? want / size : want;
}

class EngineCompressionTest : public ::testing::TestWithParam<std::tuple<int, CompressionCase>> {};

// Sizes 0, 1, 7, 4099 and 100003 in one group (fused), sum and average with a postscale, in
// place and out of place; the casts also min, max and product (reduced in 16 bits with that
// operation: they used to come back as sums). Casts and top-k at density 1 (every element sent)
// give the dense result up to their rounding.
TEST_P(EngineCompressionTest, GroupOfSizesMatchesTheDenseResult) {
  // Plain variables, not a structured binding: clang 14 (the tsan pass) cannot capture those.
  const int size = std::get<0>(GetParam());
  const CompressionCase c = std::get<1>(GetParam());
  const DType dtype = c.dtype;
  const std::vector<size_t> sizes = {0, 1, 7, 4099, 100003};
  Job job(size);
  std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kAverage};
  if (!IsTopk(c.spec)) ops.insert(ops.end(), {ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct});
  for (ReduceOp op : ops) {
    RunRanks(size, [&](int rank) {
      Engine& e = job[rank];
      std::vector<std::vector<double>> in64(sizes.size()), out64(sizes.size());
      std::vector<std::vector<float>> in32(sizes.size()), out32(sizes.size());
      std::vector<std::shared_ptr<RequestState>> states;
      ASSERT_TRUE(e.GroupStart().ok());
      for (size_t k = 0; k < sizes.size(); ++k) {
        const size_t n = sizes[k];
        TensorRequest r = Compressed("c." + std::to_string(k) + ReduceOpName(op), n, c.spec, dtype);
        r.reduce_op = op;
        r.postscale = op == ReduceOp::kAverage ? 2.0 : 1.0;
        void* in;
        void* out;
        if (dtype == DType::kFloat64) {
          for (size_t i = 0; i < n; ++i) in64[k].push_back(Value(rank, i));
          out64[k].assign(n, -1);
          in = in64[k].data();
          out = k % 2 ? out64[k].data() : in64[k].data();
        } else {
          for (size_t i = 0; i < n; ++i) in32[k].push_back(Value(rank, i));
          out32[k].assign(n, -1);
          in = in32[k].data();
          out = k % 2 ? out32[k].data() : in32[k].data();
        }
        states.push_back(Submit(e, Entry(r, in, out)));
      }
      ASSERT_TRUE(e.GroupEnd().ok());
      for (size_t k = 0; k < sizes.size(); ++k) {
        Status s = Await(states[k]);
        ASSERT_TRUE(s.ok()) << s.ToString();
        size_t wrong = 0;
        for (size_t i = 0; i < sizes[k] && wrong < 3; ++i) {
          double want = Reduced(op, size, i);
          if (op == ReduceOp::kAverage) want *= 2.0;
          const double got = dtype == DType::kFloat64 ? (k % 2 ? out64[k][i] : in64[k][i])
                                                      : (k % 2 ? out32[k][i] : in32[k][i]);
          if (std::fabs(got - want) > c.tolerance + c.relative * std::fabs(want)) {
            ++wrong;
            ADD_FAILURE() << c.spec << " " << ReduceOpName(op) << " rank " << rank << " size "
                          << sizes[k] << " element " << i << ": " << got << " != " << want;
          }
        }
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(
    RanksSpecsDTypes, EngineCompressionTest,
    ::testing::Combine(
        ::testing::Values(1, 2, 3, 4),
        ::testing::Values(CompressionCase{"fp16", DType::kFloat32, 0.02, 0.002},
                          CompressionCase{"fp16", DType::kFloat64, 0.02, 0.002},
                          CompressionCase{"bf16", DType::kFloat32, 0.3, 0.016},
                          CompressionCase{"bf16", DType::kFloat64, 0.3, 0.016},
                          CompressionCase{"topk:density=1,method=exact", DType::kFloat32, 1e-5, 0},
                          CompressionCase{"topk:density=1,values=fp16", DType::kFloat32, 0.02, 0})),
    [](const ::testing::TestParamInfo<std::tuple<int, CompressionCase>>& info) {
      const CompressionCase& c = std::get<1>(info.param);
      std::string spec = c.spec;
      for (char& ch : spec) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return std::to_string(std::get<0>(info.param)) + "ranks_" + spec + "_" + DTypeName(c.dtype);
    });

// With the timeline on (core/timeline.h), what compression costs shows inside each batch's slice
// on its lane: "encode" and "decode" with the tensors' bytes and the encoded bytes, around the
// backend's collective (which says its algorithm): fused fp16 allreduces, fused top-k (decoded from
// an allgather of every rank's share), and a fused fp16 reduce-scatter; an uncompressed fused
// reduce-scatter packs and unpacks instead.
TEST(EngineCompressionTimeline, EncodeAndDecodeInsideTheBatch) {
  const int size = 2;
  const std::string base =
      ::testing::TempDir() + "/compression_timeline_" + std::to_string(::getpid());
  Job job(size);
  RunRanks(size, [&](int rank) {
    Engine& e = job[rank];
    ASSERT_TRUE(e.StartTimeline(base).ok());
    std::vector<std::vector<float>> bufs;
    std::vector<TensorRequest> requests;
    for (const char* spec : {"fp16", "topk:density=0.5"}) {
      for (size_t n : {7, 4099})
        requests.push_back(Compressed(std::string(spec) + "." + std::to_string(n), n, spec));
    }
    for (const char* spec : {"fp16", ""}) {
      for (int64_t rows : {2000, 3000}) {  // past the inline threshold (engine_inline.cc)
        TensorRequest r = Request(std::string("rs.") + spec + std::to_string(rows),
                                  OpType::kReducescatter, DType::kFloat32, {rows, 8});
        r.compression = spec;
        requests.push_back(r);
      }
    }
    ASSERT_TRUE(e.GroupStart().ok());
    std::vector<std::shared_ptr<RequestState>> states;
    bufs.reserve(requests.size() * 2);
    for (const TensorRequest& r : requests) {
      bufs.emplace_back(static_cast<size_t>(r.NumElements()), 1.0f);
      float* in = bufs.back().data();
      bufs.emplace_back(static_cast<size_t>(r.NumElements()), 0.0f);
      states.push_back(Submit(e, Entry(r, in, bufs.back().data(), r.NumBytes())));
    }
    ASSERT_TRUE(e.GroupEnd().ok());
    for (const auto& state : states) {
      Status s = Await(state);
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
    // A lane records a batch's last slices after completing its tensors: a barrier, executed
    // once every lane is done with the batches before it, lets them be written.
    TensorRequest barrier = Request(e.NextBarrierName(), OpType::kBarrier, DType::kUint8, {});
    ASSERT_TRUE(Await(Submit(e, Entry(barrier, nullptr, nullptr))).ok());
    e.StopTimeline();
  });
  for (int rank = 0; rank < size; ++rank) {
    const std::string path = base + ".rank" + std::to_string(rank);
    const std::vector<SliceEvent> all = ReadSlices(path);
    std::remove(path.c_str());
    // Each coding slice lies inside a batch's slice on the same lane track; returns that batch.
    auto batch_of = [&](const SliceEvent& s) -> const SliceEvent* {
      for (const SliceEvent& b : all) {
        if (b.track == s.track && b.name.rfind("fused ", 0) == 0 && s.Inside(b)) return &b;
      }
      ADD_FAILURE() << "rank " << rank << ": " << s.name << " at " << s.begin_us
                    << " us is inside no batch slice on its lane";
      return nullptr;
    };
    const std::vector<SliceEvent> encodes = Named(all, "encode"), decodes = Named(all, "decode");
    // fp16 and top-k allreduces, the fp16 reduce-scatter: three compressed batches.
    ASSERT_EQ(encodes.size(), 3u) << path;
    ASSERT_EQ(decodes.size(), 3u) << path;
    size_t fp16_batches = 0;
    for (const SliceEvent& encode : encodes) {
      const SliceEvent* batch = batch_of(encode);
      ASSERT_NE(batch, nullptr);
      const SliceEvent* decode = nullptr;
      for (const SliceEvent& d : decodes) {
        if (d.track == encode.track && d.Inside(*batch)) decode = &d;
      }
      ASSERT_NE(decode, nullptr) << "rank " << rank << ": an encode without its decode";
      EXPECT_LE(encode.end_us, decode->begin_us + 0.2);
      EXPECT_NE(batch->args.find("\"compression\":"), std::string::npos) << batch->args;
      for (const SliceEvent* c : {&encode, decode}) {
        EXPECT_NE(c->args.find("\"bytes\":"), std::string::npos) << c->args;
        EXPECT_NE(c->args.find("\"encoded\":"), std::string::npos) << c->args;
      }
      // fp16 halves the 7 + 4099 floats (each tensor aligned): the encode says so.
      const std::string fp16 = "\"bytes\":" + std::to_string((4099 + 7) * 4) + ",\"encoded\":";
      if (encode.args.rfind("{" + fp16, 0) == 0 && batch->args.find("fp16") != std::string::npos) {
        const size_t encoded = std::stoul(encode.args.substr(fp16.size() + 1));
        EXPECT_GE(encoded, (4099 + 7) * 2u) << encode.args;
        EXPECT_LT(encoded, (4099 + 7) * 2u + 512) << encode.args;
        ++fp16_batches;
      }
      // The backend's collective between them, with its algorithm.
      bool collective = false;
      for (const SliceEvent& s : all) {
        collective = collective ||
                     (s.track == encode.track && s.Inside(*batch) &&
                      s.begin_us + 0.2 >= encode.end_us && s.end_us <= decode->begin_us + 0.2 &&
                      s.args.find("\"backend\":\"inproc\"") != std::string::npos &&
                      s.args.find("\"algorithm\":\"rendezvous\"") != std::string::npos);
      }
      EXPECT_TRUE(collective) << "rank " << rank << ": no collective between encode and decode";
    }
    EXPECT_EQ(fp16_batches, 1u);
    const std::vector<SliceEvent> packs = Named(all, "pack"), unpacks = Named(all, "unpack");
    ASSERT_EQ(packs.size(), 1u) << path;
    ASSERT_EQ(unpacks.size(), 1u) << path;
    EXPECT_EQ(batch_of(packs[0]), batch_of(unpacks[0]));
    EXPECT_EQ(batch_of(packs[0])->name, "fused reducescatter");
  }
}

// Top-k at density 0.01 sends each rank's 1% largest magnitudes: with 100 spikes per rank at
// known places and small noise elsewhere, the result is the spikes' sum there and 0 elsewhere,
// and the noise stays behind as each rank's residual (error feedback) for the next step.
TEST(EngineCompressionTopk, SendsTheLargestAndKeepsTheRest) {
  constexpr size_t kN = 10000, kSpikes = 100;  // k = ceil(0.01 * 10000) = 100
  Job job(3);
  RunRanks(3, [&](int rank) {
    std::vector<float> g(kN);
    for (size_t i = 0; i < kN; ++i) g[i] = (i % 100 == 7) ? 10.0f + rank : 1e-3f;
    Status s = Await(
        Submit(job[rank], Entry(Compressed("spiky", kN, "topk:density=0.01"), g.data(), g.data())));
    ASSERT_TRUE(s.ok()) << s.ToString();
    size_t spikes = 0;
    for (size_t i = 0; i < kN; ++i) {
      if (i % 100 == 7) {
        EXPECT_EQ(g[i], 33.0f) << i;  // 10 + 11 + 12
        ++spikes;
      } else {
        EXPECT_EQ(g[i], 0.0f) << i;
      }
    }
    EXPECT_EQ(spikes, kSpikes);
  });
}

// A top-k name that comes back with another element count (a reshaped or re-bucketed tensor)
// starts its residual again from zero; it used to fail the communicator at execution, every later
// operation with it. A tensor of 2^32 elements, too many for top-k's indices, is refused at enqueue
// and the communicator goes on.
TEST(EngineCompressionTopk, ANameThatChangesItsShapeStartsAgainAndTheCommunicatorLives) {
  Job job(2);
  RunRanks(2, [&](int rank) {
    for (size_t n : {size_t{100}, size_t{200}, size_t{100}}) {
      std::vector<float> g(n);
      for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>(i) + rank;
      Status s =
          Await(Submit(job[rank], Entry(Compressed("g", n, "topk:density=1"), g.data(), g.data())));
      ASSERT_TRUE(s.ok()) << n << ": " << s.ToString();
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(g[i], 2.0f * i + 1) << n << " " << i;
    }
    // 2^32 float32 elements: address space only (never touched, as the refusal comes first).
    const size_t huge = size_t{1} << 32;
    void* big = mmap(nullptr, huge * sizeof(float), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    ASSERT_NE(big, MAP_FAILED);
    Status s = job[rank].Enqueue(Entry(Compressed("huge", huge, "topk:density=0.01"), big, big));
    munmap(big, huge * sizeof(float));
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("2^32 - 1 elements"), std::string::npos) << s.message();
    std::vector<float> after(5, 1.0f);
    s = Await(Submit(job[rank], Entry(Request("after", OpType::kAllreduce, DType::kFloat32, {5}),
                                      after.data(), after.data())));
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(after[0], 2.0f);
  });
}

TEST(EngineCompressionErrors, DifferentCompressionOnRanksIsAMismatch) {
  Job job(2);
  RunRanks(2, [&](int rank) {
    std::vector<float> v(64, 1.0f);
    Status s = Await(Submit(
        job[rank], Entry(Compressed("m", 64, rank == 0 ? "fp16" : "bf16"), v.data(), v.data())));
    EXPECT_EQ(s.code(), Code::kMismatch) << s.ToString();
    EXPECT_NE(s.message().find("compression"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("fp16"), std::string::npos) << s.message();
  });
}

TEST(EngineCompressionErrors, BadSpecsAndDTypesAreRefusedAtEnqueue) {
  Job job(1);
  std::vector<int32_t> ints(8, 1);
  std::vector<float> floats(8, 1.0f);
  struct Case {
    TensorRequest request;
    const void* data;
    const char* says;
  };
  const std::vector<Case> cases = {
      {Compressed("a", 8, "zip"), floats.data(), "zip"},
      {Compressed("b", 8, "topk:density=2"), floats.data(), "density"},
      {Compressed("c", 8, "topk"), floats.data(), "density"},
      {Compressed("d", 8, "fp16", DType::kInt32), ints.data(), "'d'"},
  };
  // Top-k adds the ranks' shares: a min, max or product would come back as a sum.
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    TensorRequest r = Compressed("g", 8, "topk:density=0.5");
    r.reduce_op = op;
    Status s = job[0].Enqueue(Entry(r, floats.data(), floats.data()));
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << ReduceOpName(op) << ": " << s.ToString();
    EXPECT_NE(s.message().find(std::string("sum and average only, not ") + ReduceOpName(op)),
              std::string::npos)
        << s.message();
  }
  for (const Case& c : cases) {
    Status s = job[0].Enqueue(Entry(c.request, c.data, const_cast<void*>(c.data)));
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << c.request.compression << ": " << s.ToString();
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s.message();
  }
  // A misaligned buffer is refused at enqueue (compressors take whole elements); at execution it
  // would have failed the communicator, and the next operation below would fail too.
  std::vector<float> backing(9, 1.0f);
  auto* odd = reinterpret_cast<float*>(reinterpret_cast<char*>(backing.data()) + 2);
  for (const char* spec : {"fp16", "topk:density=0.5"}) {
    Status s = job[0].Enqueue(Entry(Compressed("f", 8, spec), odd, odd));
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << spec << ": " << s.ToString();
    EXPECT_NE(s.message().find("aligned to its element size"), std::string::npos) << s.message();
    s = job[0].Enqueue(Entry(Compressed("f", 8, spec), floats.data(), odd));
    EXPECT_NE(s.message().find("its output aligned"), std::string::npos) << s.message();
  }
  // "none" is no compression at all, and works for any dtype.
  Status s = Await(
      Submit(job[0], Entry(Compressed("e", 8, "none", DType::kInt32), ints.data(), ints.data())));
  EXPECT_TRUE(s.ok()) << s.ToString();
}

// The communicator's default compression (CONCORD_COMPRESSION, concord_config_t.compression)
// applies where its compressor can: a float32 allreduce whose buffers are not aligned to 4 bytes
// travels uncompressed, as it would without the default, and gives the exact sum. It used to be
// refused at enqueue ("needs its input aligned"), although the caller asked for no compression.
TEST(EngineCompressionDefault, AMisalignedBufferTravelsUncompressed) {
  Job job(2);
  RunRanks(2, [&](int rank) {
    for (const char* spec : {"fp16", "bf16", "topk:density=0.01"}) {
      std::vector<float> backing(17, 0.0f);
      auto* odd = reinterpret_cast<char*>(backing.data()) + 2;
      for (int i = 0; i < 16; ++i) {
        const float v = 1.0f / 3.0f + static_cast<float>(i + rank);  // not exact in 16 bits
        std::memcpy(odd + 4 * i, &v, 4);
      }
      QueueEntry e = Entry(Compressed(std::string("mis.") + spec, 16, spec), odd, odd);
      e.compression_by_default = true;
      Status s = Await(Submit(job[rank], std::move(e)));
      ASSERT_TRUE(s.ok()) << spec << ": " << s.ToString();
      for (int i = 0; i < 16; ++i) {
        float got;
        std::memcpy(&got, odd + 4 * i, 4);
        const float want =
            (1.0f / 3.0f + static_cast<float>(i)) + (1.0f / 3.0f + static_cast<float>(i + 1));
        EXPECT_EQ(got, want) << spec << " element " << i;
      }
    }
    // Alignment is each rank's own: a default that one rank can apply and another cannot is a
    // MISMATCH on compression on every rank (not a refusal on one and a wait on the other).
    std::vector<float> backing(17, 1.0f);
    void* data = rank == 0 ? static_cast<void*>(reinterpret_cast<char*>(backing.data()) + 2)
                           : static_cast<void*>(backing.data());
    QueueEntry e = Entry(Compressed("mixed", 16, "fp16"), data, data);
    e.compression_by_default = true;
    Status s = Await(Submit(job[rank], std::move(e)));
    EXPECT_EQ(s.code(), Code::kMismatch) << s.ToString();
    EXPECT_NE(s.message().find("compression"), std::string::npos) << s.message();
  });
}

// The bytes on the wire of one 100000-element float32 allreduce at 4 ranks: fp16 sends half of
// the uncompressed allreduce, top-k at density 0.01 (fp32 values) more than ten times less.
TEST(EngineCompressionWire, BytesOnTheWireShrinkAsPromised) {
  constexpr size_t kN = 100000;
  Job job(4);
  std::vector<std::vector<uint64_t>> wire(4);
  RunRanks(4, [&](int rank) {
    for (const char* spec : {"", "fp16", "topk:density=0.01"}) {
      std::vector<float> v(kN, 1.0f + rank);
      auto state = Submit(
          job[rank], Entry(Compressed(std::string("w.") + spec, kN, spec), v.data(), v.data()));
      Status s = Await(state);
      ASSERT_TRUE(s.ok()) << s.ToString();
      wire[rank].push_back(state->wire_bytes());
    }
  });
  for (int rank = 0; rank < 4; ++rank) {
    const uint64_t none = wire[rank][0], fp16 = wire[rank][1], topk = wire[rank][2];
    EXPECT_EQ(none, 2 * 3 * kN * 4 / 4) << "rank " << rank;  // 2 (n-1)/n of 400000 bytes
    EXPECT_EQ(fp16 * 2, none) << "rank " << rank;
    EXPECT_GE(none, 10 * topk) << "rank " << rank << ": top-k sent " << topk;
    EXPECT_GT(topk, 0u);
  }
}

// A spec that changes every step (an annealed top-k density) does not grow the engine's cache of
// compressors without end: it keeps the kMaxCachedCompressors used last, and a spec it forgot
// works again (a new compressor is made).
TEST(EngineCompressionTopk, AChangingSpecKeepsTheCompressorCacheBounded) {
  constexpr size_t kN = 1000;
  constexpr int kSteps = 3 * static_cast<int>(Engine::kMaxCachedCompressors);
  Job job(2);
  RunRanks(2, [&](int rank) {
    for (int step = 0; step <= kSteps; ++step) {
      // The last step comes back to the first spec, which the cache forgot long ago.
      const int density = 100 + (step == kSteps ? 0 : step);
      const std::string spec = "topk:density=0." + std::to_string(density);
      std::vector<float> v(kN, 1.0f);
      auto state = Submit(job[rank], Entry(Compressed("annealed", kN, spec), v.data(), v.data()));
      Status s = Await(state);
      ASSERT_TRUE(s.ok()) << spec << ": " << s.ToString();
      EXPECT_LE(job[rank].CachedCompressors(), Engine::kMaxCachedCompressors);
    }
    EXPECT_EQ(job[rank].CachedCompressors(), Engine::kMaxCachedCompressors);
  });
}

}  // namespace
}  // namespace concord
