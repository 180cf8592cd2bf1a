#include "compression/topk.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>

#include "base/c_locale.h"
#include "base/dtype.h"

#if defined(__x86_64__) || defined(__i386__)
#define CONCORD_TOPK_X86 1
#include <immintrin.h>
#endif

namespace concord {
namespace compression {
namespace {

constexpr size_t kSampleHits = 64;   // sampled elements expected above the true threshold
constexpr size_t kMinSample = 1024;  // smallest sample
constexpr int kMaxRescans = 3;       // corrections before falling back to exact selection
constexpr size_t kBlock = 16;        // elements tested together in the collecting pass
constexpr int kHistogramShift = 20;  // 2^31 keys >> 20: 2048 buckets (exponent + 3 mantissa bits)
constexpr size_t kBuckets = size_t{1} << (31 - kHistogramShift);

size_t CandidateCap(size_t k) {
  return 2 * k + 64;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The portable collecting pass over [begin, end); `count` continues from earlier blocks.
// The per-block test keeps the common path (nothing passes) free of branches per element.
size_t CollectPortable(const float* __restrict grad, float scale, float* __restrict acc,
                       size_t begin, size_t end, uint32_t threshold, uint32_t* __restrict cand,
                       size_t cap, size_t count) {
  const auto t = static_cast<int32_t>(threshold);  // keys are below 2^31: signed compare is exact
  auto take = [&](size_t i) {
    if (count < cap) cand[count] = static_cast<uint32_t>(i);
    ++count;
  };
  size_t i = begin;
  for (; i + kBlock <= end; i += kBlock) {
    if (grad != nullptr) {
      for (size_t j = 0; j < kBlock; ++j) acc[i + j] += scale * grad[i + j];
    }
    int any = 0;
    for (size_t j = 0; j < kBlock; ++j) {
      any |= static_cast<int32_t>(MagnitudeKey(acc[i + j])) >= t;
    }
    if (any) {
      for (size_t j = 0; j < kBlock; ++j) {
        if (MagnitudeKey(acc[i + j]) >= threshold) take(i + j);
      }
    }
  }
  for (; i < end; ++i) {
    if (grad != nullptr) acc[i] += scale * grad[i];
    if (MagnitudeKey(acc[i]) >= threshold) take(i);
  }
  return count;
}

#ifdef CONCORD_TOPK_X86
// AVX-512F: a compare mask per 16 elements, passing indices written with one compress-store.
__attribute__((target("avx512f"))) size_t CollectAvx512(const float* grad, float scale, float* acc,
                                                        size_t n, uint32_t threshold,
                                                        uint32_t* cand, size_t cap) {
  const __m512 s = _mm512_set1_ps(scale);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i nan_key = _mm512_set1_epi32(static_cast<int32_t>(kNanKey));
  const __m512i t = _mm512_set1_epi32(static_cast<int32_t>(threshold));
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  size_t count = 0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(acc + i);
    if (grad != nullptr) {
      __m512 product = _mm512_mul_ps(s, _mm512_loadu_ps(grad + i));
      __asm__("" : "+v"(product));  // no fused multiply-add: round as the portable loop does
      v = _mm512_add_ps(v, product);
      _mm512_storeu_ps(acc + i, v);
    }
    // The zero-masking form of min: the plain one starts from an "undefined" vector that GCC 12
    // reports as uninitialised (GCC bug 105593); with every lane kept, both are the same.
    const __m512i key =
        _mm512_maskz_min_epu32(static_cast<__mmask16>(0xffff),
                               _mm512_and_si512(_mm512_castps_si512(v), abs_mask), nan_key);
    const __mmask16 pass = _mm512_cmpge_epi32_mask(key, t);
    if (pass == 0) continue;
    if (count + 16 <= cap) {
      const __m512i idx = _mm512_add_epi32(lanes, _mm512_set1_epi32(static_cast<int32_t>(i)));
      _mm512_mask_compressstoreu_epi32(cand + count, pass, idx);
      count += static_cast<size_t>(__builtin_popcount(pass));
    } else {
      count = CollectPortable(nullptr, 1.0f, acc, i, i + 16, threshold, cand, cap, count);
    }
  }
  return CollectPortable(grad, scale, acc, i, n, threshold, cand, cap, count);
}
#endif

}  // namespace

size_t AccumulateAndCollect(const float* grad, float scale, float* acc, size_t n,
                            uint32_t threshold, uint32_t* cand, size_t cap, CastPath path) {
#ifdef CONCORD_TOPK_X86
  if (path == CastPath::kAvx512 && __builtin_cpu_supports("avx512f")) {
    return CollectAvx512(grad, scale, acc, n, threshold, cand, cap);
  }
#else
  (void)path;
#endif
  return CollectPortable(grad, scale, acc, 0, n, threshold, cand, cap, 0);
}

namespace {

CastPath CollectPath() {
  return CastPathAvailable(HalfFormat::kFloat16, CastPath::kAvx512) ? CastPath::kAvx512
                                                                    : CastPath::kPortable;
}

// When grad is non-null, acc[i] += scale * grad[i]; counts keys per bucket into hist. Four
// interleaved sub-histograms keep runs of equal buckets from waiting on each other's increments.
void AccumulateHistogram(const float* __restrict grad, float scale, float* __restrict acc, size_t n,
                         uint32_t* hist) {
  static_assert(kBuckets == 2048, "the sub-histograms below are sized for 2048 buckets");
  uint32_t sub[4][kBuckets] = {};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    if (grad != nullptr) {
      for (size_t j = 0; j < 4; ++j) acc[i + j] += scale * grad[i + j];
    }
    for (size_t j = 0; j < 4; ++j) ++sub[j][MagnitudeKey(acc[i + j]) >> kHistogramShift];
  }
  for (; i < n; ++i) {
    if (grad != nullptr) acc[i] += scale * grad[i];
    ++sub[0][MagnitudeKey(acc[i]) >> kHistogramShift];
  }
  for (size_t b = 0; b < kBuckets; ++b) hist[b] = sub[0][b] + sub[1][b] + sub[2][b] + sub[3][b];
}

// From c >= k candidate indices (increasing, a superset of the top k), writes the top k to
// selected in increasing order: keys above the k-th largest, then the lowest indices holding it.
// keys holds the candidates' keys in candidate order; order is a copy nth_element may reorder.
void TrimToK(const float* acc, const uint32_t* cand, size_t c, size_t k,
             std::vector<uint32_t>* keys, std::vector<uint32_t>* order, uint32_t* selected,
             TopkStats* stats) {
  keys->resize(c);
  for (size_t j = 0; j < c; ++j) (*keys)[j] = MagnitudeKey(acc[cand[j]]);
  order->assign(keys->begin(), keys->end());
  const auto kth_it = order->begin() + static_cast<ptrdiff_t>(k - 1);
  std::nth_element(order->begin(), kth_it, order->end(), std::greater<uint32_t>());
  const uint32_t kth = *kth_it;
  // Everything after the k-th position is <= kth, so the larger keys are all before it.
  const size_t greater = static_cast<size_t>(
      std::count_if(order->begin(), kth_it, [&](uint32_t x) { return x > kth; }));
  size_t equal_wanted = k - greater;
  size_t out = 0;
  for (size_t j = 0; j < c && out < k; ++j) {
    const uint32_t key = (*keys)[j];
    if (key > kth || (key == kth && equal_wanted > 0)) {
      if (key == kth) --equal_wanted;
      selected[out++] = cand[j];
    }
  }
  stats->kth_key = kth;
}

// The k-th largest key of acc (1 <= k <= n), when it lies in `bucket` of the first histogram
// (keys >> kHistogramShift) with `above` keys in the buckets over it: each pass histograms the next
// 10 bits of the keys that share the prefix found so far. Sets *greater to the count of larger
// keys, *equal to the count of keys equal to it.
uint32_t RefineKthKey(const float* acc, size_t n, size_t k, uint32_t bucket, size_t above,
                      size_t* greater, size_t* equal) {
  constexpr int kRefineBits = 10;
  uint32_t prefix = bucket;
  int shift = kHistogramShift;
  size_t in_prefix = 0;
  while (shift > 0) {
    const int bits = std::min(shift, kRefineBits);
    const int low = shift - bits;
    uint32_t hist[size_t{1} << kRefineBits] = {};
    for (size_t i = 0; i < n; ++i) {
      const uint32_t key = MagnitudeKey(acc[i]);
      if ((key >> shift) == prefix) ++hist[(key >> low) & ((1u << bits) - 1)];
    }
    uint32_t b = (1u << bits) - 1;
    while (above + hist[b] < k) above += hist[b--];
    in_prefix = hist[b];
    prefix = (prefix << bits) | b;
    shift = low;
  }
  *greater = above;
  *equal = in_prefix;
  return prefix;
}

// Exact selection over acc once hist describes it: the bucket of the k-th key, then its elements.
// When that bucket holds many more than k keys (zeros, when fewer than k elements are not; a run
// of equal values), the k-th key is found by refining instead, and the selection taken in one pass
// with no scratch: no collecting and trimming of most of the tensor.
void SelectFromHistogram(float* acc, size_t n, size_t k, const uint32_t* hist,
                         CompressionState* scratch, uint32_t* selected, TopkStats* stats) {
  size_t above = 0;
  size_t bucket = kBuckets - 1;
  while (above + hist[bucket] < k) above += hist[bucket--];
  const size_t count = above + hist[bucket];
  if (count > CandidateCap(k)) {
    size_t greater = 0, equal = 0;
    const uint32_t kth =
        RefineKthKey(acc, n, k, static_cast<uint32_t>(bucket), above, &greater, &equal);
    // Keys above the k-th, then the lowest indices holding it, as TrimToK takes them.
    size_t equal_wanted = k - greater;
    size_t out = 0;
    for (size_t i = 0; i < n && out < k; ++i) {
      const uint32_t key = MagnitudeKey(acc[i]);
      if (key > kth || (key == kth && equal_wanted > 0)) {
        if (key == kth) --equal_wanted;
        selected[out++] = static_cast<uint32_t>(i);
      }
    }
    stats->candidates = greater + equal;
    stats->kth_key = kth;
    return;
  }
  std::vector<uint32_t>& cand = scratch->index_scratch();
  if (cand.size() < count) cand.resize(count);
  AccumulateAndCollect(nullptr, 1.0f, acc, n, static_cast<uint32_t>(bucket << kHistogramShift),
                       cand.data(), count, CollectPath());
  stats->candidates = count;
  TrimToK(acc, cand.data(), count, k, &scratch->key_scratch(), &scratch->order_scratch(), selected,
          stats);
}

void SelectExact(const float* grad, float scale, float* acc, size_t n, size_t k,
                 CompressionState* scratch, uint32_t* selected, TopkStats* stats) {
  uint32_t hist[kBuckets];
  AccumulateHistogram(grad, scale, acc, n, hist);
  SelectFromHistogram(acc, n, k, hist, scratch, selected, stats);
}

// The key of rank `rank` (1 = largest) among the sample keys.
uint32_t SampleKeyAtRank(std::vector<uint32_t>* keys, size_t rank) {
  std::nth_element(keys->begin(), keys->begin() + static_cast<ptrdiff_t>(rank - 1), keys->end(),
                   std::greater<uint32_t>());
  return (*keys)[rank - 1];
}

void SelectSampled(const float* grad, float scale, float* acc, size_t n, size_t k,
                   CompressionState* scratch, uint32_t* selected, TopkStats* stats) {
  const size_t sample = std::max(kMinSample, (kSampleHits * n + k - 1) / k);
  if (sample > n / 2) {
    stats->exact_fallback = true;
    return SelectExact(grad, scale, acc, n, k, scratch, selected, stats);
  }
  // The sample sees acc as it will be after the accumulating pass.
  std::vector<uint32_t>& keys = scratch->key_scratch();
  keys.resize(sample);
  for (size_t j = 0; j < sample; ++j) {
    const size_t pos = static_cast<size_t>(((SplitMix64(j) >> 32) * n) >> 32);
    keys[j] = MagnitudeKey(grad != nullptr ? acc[pos] + scale * grad[pos] : acc[pos]);
  }
  // Aim above k by three standard deviations of the sample's count, so one pass usually suffices.
  const double hits = static_cast<double>(sample) * static_cast<double>(k) / static_cast<double>(n);
  size_t rank = std::min(sample, static_cast<size_t>(std::ceil(hits + 3.0 * std::sqrt(hits))) + 1);
  uint32_t threshold = SampleKeyAtRank(&keys, rank);
  stats->estimated_key = threshold;
  // A threshold of 0 passes every element (the sample holds fewer nonzeros than it aims at: a
  // sparse or zero gradient), and so would every correction: select exactly at once.
  if (threshold == 0) {
    stats->exact_fallback = true;
    return SelectExact(grad, scale, acc, n, k, scratch, selected, stats);
  }

  const size_t cap = CandidateCap(k);
  std::vector<uint32_t>& cand = scratch->index_scratch();
  if (cand.size() < cap) cand.resize(cap);
  const CastPath path = CollectPath();
  size_t count = AccumulateAndCollect(grad, scale, acc, n, threshold, cand.data(), cap, path);
  while (count < k || count > cap) {
    const size_t next = count < k ? std::min(sample, 2 * rank) : std::max<size_t>(1, rank / 2);
    const uint32_t next_threshold = SampleKeyAtRank(&keys, next);
    if (stats->rescans == kMaxRescans || next == rank || next_threshold == 0) {
      stats->exact_fallback = true;
      uint32_t hist[kBuckets];
      AccumulateHistogram(nullptr, 1.0f, acc, n, hist);
      return SelectFromHistogram(acc, n, k, hist, scratch, selected, stats);
    }
    rank = next;
    threshold = next_threshold;
    count = AccumulateAndCollect(nullptr, 1.0f, acc, n, threshold, cand.data(), cap, path);
    ++stats->rescans;
  }
  stats->candidates = count;
  TrimToK(acc, cand.data(), count, k, &keys, &scratch->order_scratch(), selected, stats);
}

// The shortest decimal that reads back as `density`, in the C locale's format ("0.001").
std::string FormatDensity(double density) {
  const ScopedCLocale c_locale;
  char buf[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, density);
    if (std::strtod(buf, nullptr) == density) break;
  }
  return buf;
}

class TopkCompressor final : public Compressor {
 public:
  explicit TopkCompressor(const TopkOptions& options)
      : options_(options),
        spec_("topk:density=" + FormatDensity(options_.density) +
              ",method=" + TopkMethodName(options_.method) +
              ",values=" + (options_.fp16_values ? "fp16" : "fp32")) {}

  std::string spec() const override { return spec_; }
  Exchange exchange() const override { return Exchange::kAllgather; }
  Status CheckDType(DType dtype) const override {
    if (dtype == DType::kFloat32) return Status::Ok();
    return InvalidArgument(
        std::string("topk compression takes float32 tensors only, not ") +
        (IsValidDType(static_cast<int>(dtype)) ? DTypeName(dtype) : "an invalid dtype"));
  }
  DType reduce_dtype(DType dtype) const override { return dtype; }  // not summable; unused
  size_t EncodedBytes(DType, size_t count) const override {
    return TopkCount(options_.density, count) * (4 + value_bytes());
  }
  bool uses_state() const override { return true; }

  Status Encode(const EncodeInput& in, void* out, CompressionState* state) const override {
    CONCORD_RETURN_IF_ERROR(CheckDType(in.dtype));
    if (state == nullptr) return InvalidArgument("topk compression needs a CompressionState");
    CONCORD_RETURN_IF_ERROR(CheckCount(in.count));
    CONCORD_RETURN_IF_ERROR(CheckDenseBuffer(in.data, in.dtype, in.count, "topk: input"));
    CONCORD_RETURN_IF_ERROR(
        CheckEncodedBuffer(out, EncodedBytes(in.dtype, in.count), "topk: output"));
    float* residual = state->Residual(in.name, in.count);
    const size_t k = TopkCount(options_.density, in.count);
    auto* indices = static_cast<uint32_t*>(out);
    CONCORD_RETURN_IF_ERROR(SelectTopk(static_cast<const float*>(in.data),
                                       static_cast<float>(in.scale), residual, in.count, k,
                                       options_.method, state, indices, nullptr));
    void* values = static_cast<uint8_t*>(out) + 4 * k;
    for (size_t j = 0; j < k; ++j) {
      float& r = residual[indices[j]];
      if (options_.fp16_values) {
        const uint16_t h = FloatToHalf(r);
        static_cast<uint16_t*>(values)[j] = h;
        const float sent = HalfToFloat(h);
        r = std::isfinite(sent) ? r - sent : 0.0f;
      } else {
        static_cast<float*>(values)[j] = r;
        r = 0.0f;
      }
    }
    return Status::Ok();
  }

  Status Decode(const void* encoded, DType dtype, size_t count, void* dense) const override {
    CONCORD_RETURN_IF_ERROR(CheckDecodeArgs(encoded, dtype, count, dense));
    if (count > 0) std::fill_n(static_cast<float*>(dense), count, 0.0f);
    return DecodeAccumulate(encoded, dtype, count, dense);
  }

  Status DecodeAccumulate(const void* encoded, DType dtype, size_t count,
                          void* dense) const override {
    CONCORD_RETURN_IF_ERROR(CheckDecodeArgs(encoded, dtype, count, dense));
    const size_t k = TopkCount(options_.density, count);
    const auto* indices = static_cast<const uint32_t*>(encoded);
    // Bytes from the network: check every index before touching dense.
    for (size_t j = 0; j < k; ++j) {
      if (indices[j] >= count || (j > 0 && indices[j] <= indices[j - 1])) {
        return ProtocolError("topk: encoded index " + std::to_string(indices[j]) + " at position " +
                             std::to_string(j) + " is out of range or not increasing (tensor of " +
                             std::to_string(count) + " elements)");
      }
    }
    const void* values = static_cast<const uint8_t*>(encoded) + 4 * k;
    auto* out = static_cast<float*>(dense);
    if (options_.fp16_values) {
      const auto* v = static_cast<const uint16_t*>(values);
      for (size_t j = 0; j < k; ++j) out[indices[j]] += HalfToFloat(v[j]);
    } else {
      const auto* v = static_cast<const float*>(values);
      for (size_t j = 0; j < k; ++j) out[indices[j]] += v[j];
    }
    return Status::Ok();
  }

 private:
  size_t value_bytes() const { return options_.fp16_values ? 2 : 4; }

  Status CheckCount(size_t count) const override {
    if (count > std::numeric_limits<uint32_t>::max()) {
      return InvalidArgument("topk compression takes tensors of at most 2^32 - 1 elements, not " +
                             std::to_string(count));
    }
    return Status::Ok();
  }

  Status CheckDecodeArgs(const void* encoded, DType dtype, size_t count, const void* dense) const {
    CONCORD_RETURN_IF_ERROR(CheckDType(dtype));
    CONCORD_RETURN_IF_ERROR(CheckCount(count));
    CONCORD_RETURN_IF_ERROR(
        CheckEncodedBuffer(encoded, EncodedBytes(dtype, count), "topk: encoded"));
    return CheckDenseBuffer(dense, dtype, count, "topk: output");
  }

  const TopkOptions options_;
  const std::string spec_;  // made once: the engine compares it for every tensor it encodes
};

}  // namespace

const char* TopkMethodName(TopkMethod method) {
  return method == TopkMethod::kExact ? "exact" : "sampled";
}

size_t TopkCount(double density, size_t n) {
  if (n == 0) return 0;
  // density * n is rounded: 0.07 * 100 is 7.000000000000001. A product that close above an
  // integer (within a few units in the last place) stands for that integer.
  const double exact = density * static_cast<double>(n);
  double k = std::ceil(exact);
  if (k - 1.0 >= exact * (1.0 - 4 * std::numeric_limits<double>::epsilon())) k -= 1.0;
  if (!(k >= 1.0)) return 1;
  if (k >= static_cast<double>(n)) return n;
  return static_cast<size_t>(k);
}

Status SelectTopk(const float* grad, float scale, float* acc, size_t n, size_t k, TopkMethod method,
                  CompressionState* scratch, uint32_t* selected, TopkStats* stats) {
  if (n > std::numeric_limits<uint32_t>::max()) {
    return InvalidArgument("top-k selection over more than 2^32 - 1 elements");
  }
  if (k > n) {
    return InvalidArgument("top-k selection of " + std::to_string(k) + " out of " +
                           std::to_string(n) + " elements");
  }
  if (scratch == nullptr) return InvalidArgument("top-k selection needs a CompressionState");
  if (n > 0 && (acc == nullptr || (k > 0 && selected == nullptr))) {
    return InvalidArgument("top-k selection given a null buffer");
  }
  TopkStats local;
  if (stats == nullptr) stats = &local;
  *stats = TopkStats();
  if (k == 0 || k == n) {
    if (grad != nullptr) {
      for (size_t i = 0; i < n; ++i) acc[i] += scale * grad[i];
    }
    for (size_t i = 0; i < k; ++i) selected[i] = static_cast<uint32_t>(i);
    stats->candidates = k;
    if (k > 0)
      stats->kth_key = MagnitudeKey(*std::min_element(
          acc, acc + n, [](float a, float b) { return MagnitudeKey(a) < MagnitudeKey(b); }));
    return Status::Ok();
  }
  if (method == TopkMethod::kExact) {
    SelectExact(grad, scale, acc, n, k, scratch, selected, stats);
  } else {
    SelectSampled(grad, scale, acc, n, k, scratch, selected, stats);
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<Compressor>> MakeTopkCompressor(const TopkOptions& options) {
  if (!(options.density > 0.0 && options.density <= 1.0)) {
    return InvalidArgument("topk density must be in (0, 1], not " + FormatDensity(options.density));
  }
  if (options.method != TopkMethod::kExact && options.method != TopkMethod::kSampled) {
    return InvalidArgument("topk: unknown selection method");
  }
  return std::unique_ptr<Compressor>(std::make_unique<TopkCompressor>(options));
}

}  // namespace compression
}  // namespace concord
