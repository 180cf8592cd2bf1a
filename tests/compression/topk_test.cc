// Top-k selection (exact and sampled against a brute-force reference), the sampled method's
// threshold and candidate count, and the topk compressor: encoded layout, error feedback that
// conserves the gradient over many steps, decoding checks, refused inputs.
#include "compression/topk.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "compression/registry.h"
#include "tests/compression/compression_test_util.h"

namespace concord {
namespace compression {
namespace {

// Reference: sort all indices by (magnitude key descending, index ascending), keep k, sort by
// index.
std::vector<uint32_t> BruteTopk(const std::vector<float>& v, size_t k) {
  std::vector<uint32_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](uint32_t a, uint32_t b) { return MagnitudeKey(v[a]) > MagnitudeKey(v[b]); });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<float> Gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

std::vector<uint32_t> Select(std::vector<float> v, size_t k, TopkMethod m, TopkStats* stats) {
  CompressionState state;
  std::vector<uint32_t> out(k);
  const Status s = SelectTopk(nullptr, 1.0f, v.data(), v.size(), k, m, &state, out.data(), stats);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

TEST(TopkTest, CountIsCeilingAtLeastOne) {
  EXPECT_EQ(TopkCount(0.01, 0), 0u);
  EXPECT_EQ(TopkCount(0.01, 1), 1u);
  EXPECT_EQ(TopkCount(0.01, 100), 1u);
  EXPECT_EQ(TopkCount(0.01, 101), 2u);
  EXPECT_EQ(TopkCount(0.001, 25557032), 25558u);
  EXPECT_EQ(TopkCount(1.0, 17), 17u);
  EXPECT_EQ(TopkCount(1e-12, 17), 1u);
  // k = ceil(D n) of the decimal D: 0.07 * 100 is 7.000000000000001 in doubles, and still k = 7.
  EXPECT_EQ(TopkCount(0.07, 100), 7u);
  EXPECT_EQ(TopkCount(0.14, 100), 14u);
  EXPECT_EQ(TopkCount(0.17, 10000), 1700u);
  EXPECT_EQ(TopkCount(0.55, 100), 55u);
  EXPECT_EQ(TopkCount(0.0700001, 100), 8u);
}

TEST(TopkTest, BothMethodsMatchTheReference) {
  struct Case {
    size_t n;
    size_t k;
  };
  for (Case c : {Case{1, 1}, Case{2, 1}, Case{17, 3}, Case{1000, 10}, Case{4097, 4097},
                 Case{100003, 1001}, Case{100003, 101}, Case{1 << 20, 10486}, Case{300007, 1}}) {
    const std::vector<float> v = Gaussian(c.n, static_cast<uint32_t>(c.n + c.k));
    const std::vector<uint32_t> want = BruteTopk(v, c.k);
    for (TopkMethod m : {TopkMethod::kExact, TopkMethod::kSampled}) {
      TopkStats stats;
      EXPECT_EQ(Select(v, c.k, m, &stats), want) << c.n << " " << c.k << " " << TopkMethodName(m);
      uint32_t kth = std::numeric_limits<uint32_t>::max();
      for (uint32_t i : want) kth = std::min(kth, MagnitudeKey(v[i]));
      EXPECT_EQ(stats.kth_key, kth);
    }
  }
}

TEST(TopkTest, TiesSpecialsAndZerosAreDeterministic) {
  std::vector<float> v(50000, 0.5f);  // all equal: the lowest indices win
  for (size_t i = 0; i < v.size(); i += 7) v[i] = -0.5f;
  v[123] = std::numeric_limits<float>::infinity();
  v[4567] = -std::numeric_limits<float>::quiet_NaN();  // nan ranks above inf
  v[40000] = -3.0f;
  for (size_t k : {size_t{1}, size_t{2}, size_t{3}, size_t{500}}) {
    const std::vector<uint32_t> want = BruteTopk(v, k);
    EXPECT_EQ(Select(v, k, TopkMethod::kExact, nullptr), want) << k;
    TopkStats stats;
    EXPECT_EQ(Select(v, k, TopkMethod::kSampled, &stats), want) << k;
  }
  EXPECT_EQ(Select(v, 1, TopkMethod::kSampled, nullptr), std::vector<uint32_t>{4567});
  // Mostly zeros, fewer nonzeros than k: the nonzeros then the first zeros.
  std::vector<float> sparse(200000, 0.0f);
  sparse[199999] = 1.0f;
  sparse[5] = -2.0f;
  const std::vector<uint32_t> want = BruteTopk(sparse, 2000);
  EXPECT_EQ(Select(sparse, 2000, TopkMethod::kExact, nullptr), want);
  TopkStats stats;
  EXPECT_EQ(Select(sparse, 2000, TopkMethod::kSampled, &stats), want);
  EXPECT_TRUE(stats.exact_fallback);  // every sampled threshold passes too many zeros
  // ... so it goes exact at once: no corrective pass that takes every element (4 passes cost a
  // 32M-element zero gradient 2 s against 0.3 s now).
  EXPECT_EQ(stats.rescans, 0);
}

// When the k-th key's bucket holds most of the tensor (zeros when fewer than k elements are not;
// values that differ only in low mantissa bits), the selection still matches the reference and
// keeps its scratch near k, not near n (it used to collect and trim the whole bucket: 3-4 times
// the tensor's memory, and 20 times slower).
TEST(TopkTest, CrowdedKthBucketMatchesTheReferenceWithScratchNearK) {
  const size_t n = 1 << 20;
  std::vector<float> zeros(n, 0.0f);
  for (size_t i = 0; i < n; i += 4099) zeros[i] = static_cast<float>(i % 7) - 3.0f;
  std::vector<float> close(n);  // one first-level bucket: 1 + a few ulps apart
  for (size_t i = 0; i < n; ++i) {
    close[i] = 1.0f + static_cast<float>((i * 2654435761u) % 1000) * 1e-7f;
  }
  for (const std::vector<float>* v : {&zeros, &close}) {
    for (size_t k : {size_t{1}, size_t{1000}, size_t{50000}}) {
      const std::vector<uint32_t> want = BruteTopk(*v, k);
      for (TopkMethod m : {TopkMethod::kExact, TopkMethod::kSampled}) {
        CompressionState state;
        std::vector<float> acc = *v;
        std::vector<uint32_t> got(k);
        TopkStats stats;
        ASSERT_TRUE(
            SelectTopk(nullptr, 1.0f, acc.data(), n, k, m, &state, got.data(), &stats).ok());
        EXPECT_EQ(got, want) << k << " " << TopkMethodName(m);
        uint32_t kth = std::numeric_limits<uint32_t>::max();
        for (uint32_t i : want) kth = std::min(kth, MagnitudeKey((*v)[i]));
        EXPECT_EQ(stats.kth_key, kth) << k << " " << TopkMethodName(m);
        EXPECT_GE(stats.candidates, k);
        EXPECT_LE(state.index_scratch().capacity(), 2 * k + 64) << k << " " << TopkMethodName(m);
        EXPECT_LE(state.order_scratch().capacity(), 2 * k + 64) << k << " " << TopkMethodName(m);
      }
    }
  }
}

TEST(TopkTest, SampledThresholdIsCloseAndCandidatesBounded) {
  for (double density : {0.01, 0.001}) {
    const size_t n = 4 << 20;
    const size_t k = TopkCount(density, n);
    std::vector<float> v = Gaussian(n, 99);
    for (size_t i = 0; i < n; i += 3) v[i] *= 10.0f;  // a mixture, not one clean distribution
    TopkStats exact, sampled;
    const auto want = Select(v, k, TopkMethod::kExact, &exact);
    const auto got = Select(v, k, TopkMethod::kSampled, &sampled);
    EXPECT_EQ(got, want);
    EXPECT_EQ(got.size(), k);
    EXPECT_FALSE(sampled.exact_fallback);
    EXPECT_EQ(sampled.rescans, 0);
    EXPECT_GE(sampled.candidates, k);
    EXPECT_LE(sampled.candidates, 2 * k + 64);
    EXPECT_EQ(sampled.kth_key, exact.kth_key);
    float estimated, kth;
    std::memcpy(&estimated, &sampled.estimated_key, 4);
    std::memcpy(&kth, &exact.kth_key, 4);
    EXPECT_LE(std::fabs(estimated - kth), 0.15f * kth) << "density " << density;
    EXPECT_LE(estimated, kth) << "the estimate aims at a few more than k";
  }
}

// Scales 0.5 (exact products) and 1/3 (an average over three ranks: the product rounds, so a
// fused multiply-add, which a compiler may contract `acc += scale * grad` into when the target
// has FMA, e.g. -march=native, would give other bits than the AVX-512 path's multiply then add).
TEST(TopkTest, CollectingPassesAgreeOnEveryPath) {
  const size_t n = 100003;
  const std::vector<float> grad = Gaussian(n, 21);
  for (float scale : {0.5f, 1.0f / 3.0f})
    for (uint32_t threshold : {MagnitudeKey(2.0f), MagnitudeKey(0.5f), 0u}) {
      for (size_t cap : {size_t{0}, size_t{17}, size_t{5000}, n}) {
        std::vector<float> acc_p = Gaussian(n, 22), acc_v = acc_p;
        std::vector<uint32_t> cand_p(cap + 1, 7), cand_v(cap + 1, 7);
        const size_t count_p = AccumulateAndCollect(grad.data(), scale, acc_p.data(), n, threshold,
                                                    cand_p.data(), cap, CastPath::kPortable);
        const size_t count_v = AccumulateAndCollect(grad.data(), scale, acc_v.data(), n, threshold,
                                                    cand_v.data(), cap, CastPath::kAvx512);
        EXPECT_EQ(count_p, count_v);
        EXPECT_EQ(cand_p, cand_v) << "threshold " << threshold << " cap " << cap;
        size_t expected = 0;
        for (size_t i = 0; i < n; ++i) expected += MagnitudeKey(acc_p[i]) >= threshold;
        EXPECT_EQ(count_p, expected);
        EXPECT_EQ(acc_p, acc_v);
      }
    }
}

// Both methods accumulate the same bits into the residual (the sampled one through the collecting
// pass, the exact one through the histogram pass), with a scale whose products round.
TEST(TopkTest, BothMethodsAccumulateTheSameBits) {
  const size_t n = 300007;
  const std::vector<float> grad = Gaussian(n, 31), start = Gaussian(n, 32);
  const float scale = 1.0f / 3.0f;
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i) {
    volatile float product = scale * grad[i];  // rounded on its own, then added
    want[i] = start[i] + product;
  }
  for (TopkMethod m : {TopkMethod::kExact, TopkMethod::kSampled}) {
    CompressionState state;
    std::vector<float> acc = start;
    std::vector<uint32_t> out(300);
    ASSERT_TRUE(
        SelectTopk(grad.data(), scale, acc.data(), n, 300, m, &state, out.data(), nullptr).ok());
    EXPECT_EQ(0, std::memcmp(acc.data(), want.data(), n * sizeof(float))) << TopkMethodName(m);
    EXPECT_EQ(out, BruteTopk(want, 300)) << TopkMethodName(m);
  }
}

// More nans than k, in the residual and in the gradient, with payloads that order them one way in
// the residual and the other way in the gradient. Which payload survives nan + nan depends on the
// path (the AVX-512 pass keeps the residual's, the portable loop may keep the gradient's, a GPU
// neither), so nans must tie: both methods select the lowest-indexed nans. They used to order
// nans by payload: the sampled method took the highest indices, the exact one the lowest.
TEST(TopkTest, NansTieWhateverTheirPayloads) {
  const size_t n = 1 << 20, k = 1000;
  std::vector<float> grad = Gaussian(n, 41), start = Gaussian(n, 42);
  std::vector<uint32_t> nans;
  for (size_t i = 7; i < n && nans.size() < 3 * k; i += 331) nans.push_back(i);
  for (size_t j = 0; j < nans.size(); ++j) {
    const uint32_t residual_bits = 0x7fc00000u | static_cast<uint32_t>(j + 1);
    const uint32_t grad_bits = 0xffc00000u | static_cast<uint32_t>(nans.size() - j);
    std::memcpy(&start[nans[j]], &residual_bits, 4);
    std::memcpy(&grad[nans[j]], &grad_bits, 4);
  }
  const std::vector<uint32_t> want(nans.begin(), nans.begin() + k);
  for (TopkMethod m : {TopkMethod::kExact, TopkMethod::kSampled}) {
    CompressionState state;
    std::vector<float> acc = start;
    std::vector<uint32_t> out(k);
    TopkStats stats;
    ASSERT_TRUE(
        SelectTopk(grad.data(), 1.0f / 3.0f, acc.data(), n, k, m, &state, out.data(), &stats).ok());
    EXPECT_EQ(out, want) << TopkMethodName(m);
    EXPECT_EQ(stats.kth_key, kNanKey) << TopkMethodName(m);
    for (uint32_t i : nans) ASSERT_TRUE(std::isnan(acc[i])) << i;
  }
  float nan_a, nan_b;
  const uint32_t a = 0x7f800001u, b = 0xffffffffu;
  std::memcpy(&nan_a, &a, 4);
  std::memcpy(&nan_b, &b, 4);
  EXPECT_EQ(MagnitudeKey(nan_a), kNanKey);
  EXPECT_EQ(MagnitudeKey(nan_b), kNanKey);
  EXPECT_LT(MagnitudeKey(std::numeric_limits<float>::infinity()), kNanKey);
}

TEST(TopkTest, SelectionAddsTheScaledGradientFirst) {
  std::vector<float> acc = {1.0f, -1.0f, 0.0f, 0.0f, 0.5f};
  const std::vector<float> grad = {0.0f, 4.0f, -6.0f, 1.0f, 0.0f};
  CompressionState state;
  std::vector<uint32_t> out(2);
  ASSERT_TRUE(SelectTopk(grad.data(), 0.5f, acc.data(), 5, 2, TopkMethod::kExact, &state,
                         out.data(), nullptr)
                  .ok());
  EXPECT_EQ(acc, (std::vector<float>{1.0f, 1.0f, -3.0f, 0.5f, 0.5f}));
  EXPECT_EQ(out, (std::vector<uint32_t>{0, 2}));
}

TEST(TopkTest, SelectionRefusesBadArguments) {
  CompressionState state;
  std::vector<float> v(4);
  std::vector<uint32_t> out(5);
  EXPECT_FALSE(
      SelectTopk(nullptr, 1.0f, v.data(), 4, 5, TopkMethod::kExact, &state, out.data(), nullptr)
          .ok());
  EXPECT_FALSE(
      SelectTopk(nullptr, 1.0f, v.data(), 4, 2, TopkMethod::kExact, nullptr, out.data(), nullptr)
          .ok());
  EXPECT_FALSE(
      SelectTopk(nullptr, 1.0f, nullptr, 4, 2, TopkMethod::kExact, &state, out.data(), nullptr)
          .ok());
  EXPECT_TRUE(
      SelectTopk(nullptr, 1.0f, nullptr, 0, 0, TopkMethod::kSampled, &state, nullptr, nullptr)
          .ok());
}

using testing_util::Buffer;
using testing_util::Make;

TEST(TopkCompressorTest, EncodedLayoutIsIndicesThenValues) {
  auto c = Make("topk:density=0.25,method=exact");
  const std::vector<float> g = {0.1f, -5.0f, 0.2f, 3.0f, 0.0f, 0.3f, -0.4f, 1.0f, 0.05f};
  ASSERT_EQ(TopkCount(0.25, 9), 3u);
  ASSERT_EQ(c->EncodedBytes(DType::kFloat32, 9), 3u * 8);
  Buffer buf(24);
  CompressionState state;
  ASSERT_TRUE(c->Encode({"t", DType::kFloat32, 9, g.data(), 1.0}, buf.data(), &state).ok());
  uint32_t idx[3];
  float val[3];
  std::memcpy(idx, buf.data(), 12);
  std::memcpy(val, buf.data() + 12, 12);
  EXPECT_EQ(std::vector<uint32_t>(idx, idx + 3), (std::vector<uint32_t>{1, 3, 7}));
  EXPECT_EQ(std::vector<float>(val, val + 3), (std::vector<float>{-5.0f, 3.0f, 1.0f}));
  const std::vector<float>& residual = *state.FindResidual("t");
  EXPECT_EQ(residual[1], 0.0f);
  EXPECT_EQ(residual[6], -0.4f);
  std::vector<float> dense(9, 7.0f);
  ASSERT_TRUE(c->Decode(buf.data(), DType::kFloat32, 9, dense.data()).ok());
  EXPECT_EQ(dense, (std::vector<float>{0, -5.0f, 0, 3.0f, 0, 0, 0, 1.0f, 0}));
  auto half = Make("topk:density=0.25,values=fp16");
  EXPECT_EQ(half->EncodedBytes(DType::kFloat32, 9), 3u * 6);
}

// Over many steps: sum of everything sent + final residual == sum of scaled gradients.
TEST(TopkCompressorTest, ErrorFeedbackConservesTheGradient) {
  for (const char* spec : {"topk:density=0.01,method=exact", "topk:density=0.01,method=sampled",
                           "topk:density=0.001,method=sampled,values=fp16",
                           "topk:density=0.05,method=exact,values=fp16"}) {
    SCOPED_TRACE(spec);
    auto c = Make(spec);
    const size_t n = 200003;
    const double scale = 0.25;
    Buffer buf(c->EncodedBytes(DType::kFloat32, n));
    CompressionState state;
    std::vector<double> grad_sum(n, 0.0);
    std::vector<float> sent(n, 0.0f);
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> g(n);
    for (int step = 0; step < 40; ++step) {
      for (size_t i = 0; i < n; ++i) {
        g[i] = normal(rng) * (i % 10 == 0 ? 5.0f : 1.0f);
        grad_sum[i] += scale * g[i];
      }
      ASSERT_TRUE(c->Encode({"w", DType::kFloat32, n, g.data(), scale}, buf.data(), &state).ok());
      ASSERT_TRUE(c->DecodeAccumulate(buf.data(), DType::kFloat32, n, sent.data()).ok());
    }
    const std::vector<float>& residual = *state.FindResidual("w");
    double max_err = 0.0;
    size_t nonzero_sent = 0;
    for (size_t i = 0; i < n; ++i) {
      const double err = std::fabs(static_cast<double>(sent[i]) + residual[i] - grad_sum[i]);
      max_err = std::max(max_err, err / (1.0 + std::fabs(grad_sum[i])));
      nonzero_sent += sent[i] != 0.0f;
    }
    EXPECT_LT(max_err, 1e-4);
    EXPECT_GT(nonzero_sent, 0u);
  }
}

TEST(TopkCompressorTest, SizesZeroOneAndOdd) {
  auto c = Make("topk:density=0.01");
  CompressionState state;
  Buffer buf(64);
  EXPECT_EQ(c->EncodedBytes(DType::kFloat32, 0), 0u);
  ASSERT_TRUE(c->Encode({"empty", DType::kFloat32, 0, nullptr, 1.0}, nullptr, &state).ok());
  ASSERT_TRUE(c->Decode(nullptr, DType::kFloat32, 0, nullptr).ok());
  const float one = -2.5f;
  ASSERT_TRUE(c->Encode({"one", DType::kFloat32, 1, &one, 1.0}, buf.data(), &state).ok());
  float out = 0.0f;
  ASSERT_TRUE(c->Decode(buf.data(), DType::kFloat32, 1, &out).ok());
  EXPECT_EQ(out, -2.5f);
  const std::vector<float> odd = Gaussian(301, 1);
  ASSERT_EQ(c->EncodedBytes(DType::kFloat32, 301), 4u * 8);
  ASSERT_TRUE(c->Encode({"odd", DType::kFloat32, 301, odd.data(), 1.0}, buf.data(), &state).ok());
  std::vector<float> dense(301);
  ASSERT_TRUE(c->Decode(buf.data(), DType::kFloat32, 301, dense.data()).ok());
  for (uint32_t i : BruteTopk(odd, 4)) EXPECT_EQ(dense[i], odd[i]);
}

TEST(TopkCompressorTest, DeterministicGivenTheSameInput) {
  auto c = Make("topk:density=0.001,values=fp16");
  const std::vector<float> g = Gaussian(1 << 20, 11);
  const size_t bytes = c->EncodedBytes(DType::kFloat32, g.size());
  Buffer a(bytes), b(bytes);
  CompressionState sa, sb;
  ASSERT_TRUE(c->Encode({"x", DType::kFloat32, g.size(), g.data(), 1.0}, a.data(), &sa).ok());
  ASSERT_TRUE(c->Encode({"x", DType::kFloat32, g.size(), g.data(), 1.0}, b.data(), &sb).ok());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), bytes));
}

TEST(TopkCompressorTest, Fp16ValuesOverflowToInfAndResidualStaysFinite) {
  auto c = Make("topk:density=0.5,values=fp16");
  const std::vector<float> g = {1e6f, 1.0f, 0.0f, 0.5f};
  Buffer buf(c->EncodedBytes(DType::kFloat32, 4));
  CompressionState state;
  ASSERT_TRUE(c->Encode({"x", DType::kFloat32, 4, g.data(), 1.0}, buf.data(), &state).ok());
  std::vector<float> dense(4);
  ASSERT_TRUE(c->Decode(buf.data(), DType::kFloat32, 4, dense.data()).ok());
  EXPECT_EQ(dense[0], std::numeric_limits<float>::infinity());
  for (float r : *state.FindResidual("x")) EXPECT_TRUE(std::isfinite(r));
}

TEST(TopkCompressorTest, DecodeRefusesCorruptIndicesWithoutTouchingTheOutput) {
  auto c = Make("topk:density=0.5,method=exact");
  const std::vector<float> g = {4.0f, 1.0f, 3.0f, 2.0f};
  Buffer buf(16);
  CompressionState state;
  ASSERT_TRUE(c->Encode({"x", DType::kFloat32, 4, g.data(), 1.0}, buf.data(), &state).ok());
  for (uint32_t bad : {4u, 1000000u, 0u}) {  // out of range; 0 after 0 is not increasing
    Buffer copy = buf;
    std::memcpy(copy.data() + 4, &bad, 4);
    std::vector<float> dense(4, 9.0f);
    const Status s = c->DecodeAccumulate(copy.data(), DType::kFloat32, 4, dense.data());
    EXPECT_EQ(s.code(), Code::kProtocolError) << bad;
    EXPECT_EQ(dense, std::vector<float>(4, 9.0f));
  }
}

TEST(TopkCompressorTest, RefusesWhatItCannotEncode) {
  auto c = Make("topk:density=0.1");
  CompressionState state;
  Buffer buf(64);
  const double d[4] = {1, 2, 3, 4};
  for (DType t : {DType::kUint8, DType::kInt8, DType::kInt32, DType::kInt64, DType::kFloat16,
                  DType::kBFloat16, DType::kFloat64}) {
    const Status s = c->Encode({"x", t, 4, d, 1.0}, buf.data(), &state);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << DTypeName(t);
    EXPECT_NE(s.message().find("float32"), std::string::npos);
    EXPECT_FALSE(c->CheckDType(t).ok());
  }
  const float f[4] = {1, 2, 3, 4};
  EXPECT_NE(c->Encode({"x", DType::kFloat32, 4, f, 1.0}, buf.data(), nullptr)
                .message()
                .find("CompressionState"),
            std::string::npos);
  EXPECT_FALSE(c->Encode({"x", DType::kFloat32, 4, f, 1.0}, buf.data() + 4, &state).ok());
  EXPECT_FALSE(c->Encode({"x", DType::kFloat32, size_t{1} << 32, f, 1.0}, buf.data(), &state).ok());
  // The same name with another size starts its residual again (counted, for the engine's
  // warning): a reshaped tensor must not fail the communicator.
  ASSERT_TRUE(c->Encode({"y", DType::kFloat32, 4, f, 1.0}, buf.data(), &state).ok());
  EXPECT_TRUE(c->Encode({"y", DType::kFloat32, 3, f, 1.0}, buf.data(), &state).ok());
  EXPECT_EQ(state.resets(), 1u);
  EXPECT_EQ(state.FindResidual("y")->size(), 3u);
}

}  // namespace
}  // namespace compression
}  // namespace concord
