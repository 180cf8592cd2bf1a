#include "compression/topk.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>

#include "base/dtype.h"

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

// When grad is non-null, acc[i] += scale * grad[i]. Stores the indices (in order) of the elements
// whose key is at least `threshold` into cand while fewer than cap are stored; returns how many
// pass. The per-block test keeps the common path (nothing passes) free of branches per element.
size_t AccumulateAndCollect(const float* grad, float scale, float* acc, size_t n,
                            uint32_t threshold, uint32_t* cand, size_t cap) {
  const auto t = static_cast<int32_t>(threshold);  // keys are below 2^31: signed compare is exact
  size_t count = 0;
  auto take = [&](size_t i) {
    if (count < cap) cand[count] = static_cast<uint32_t>(i);
    ++count;
  };
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    int any = 0;
    if (grad != nullptr) {
      for (size_t j = 0; j < kBlock; ++j) {
        const float v = acc[i + j] + scale * grad[i + j];
        acc[i + j] = v;
        any |= static_cast<int32_t>(MagnitudeKey(v)) >= t;
      }
    } else {
      for (size_t j = 0; j < kBlock; ++j)
        any |= static_cast<int32_t>(MagnitudeKey(acc[i + j])) >= t;
    }
    if (any) {
      for (size_t j = 0; j < kBlock; ++j) {
        if (MagnitudeKey(acc[i + j]) >= threshold) take(i + j);
      }
    }
  }
  for (; i < n; ++i) {
    if (grad != nullptr) acc[i] += scale * grad[i];
    if (MagnitudeKey(acc[i]) >= threshold) take(i);
  }
  return count;
}

// When grad is non-null, acc[i] += scale * grad[i]; counts keys per bucket into hist.
void AccumulateHistogram(const float* grad, float scale, float* acc, size_t n, uint32_t* hist) {
  std::fill(hist, hist + kBuckets, 0u);
  if (grad != nullptr) {
    for (size_t i = 0; i < n; ++i) {
      const float v = acc[i] + scale * grad[i];
      acc[i] = v;
      ++hist[MagnitudeKey(v) >> kHistogramShift];
    }
  } else {
    for (size_t i = 0; i < n; ++i) ++hist[MagnitudeKey(acc[i]) >> kHistogramShift];
  }
}

// From c >= k candidate indices (increasing, a superset of the top k), writes the top k to
// selected in increasing order: keys above the k-th largest, then the lowest indices holding it.
void TrimToK(const float* acc, const uint32_t* cand, size_t c, size_t k,
             std::vector<uint32_t>* keys, uint32_t* selected, TopkStats* stats) {
  keys->resize(c);
  for (size_t j = 0; j < c; ++j) (*keys)[j] = MagnitudeKey(acc[cand[j]]);
  std::nth_element(keys->begin(), keys->begin() + static_cast<ptrdiff_t>(k - 1), keys->end(),
                   std::greater<uint32_t>());
  const uint32_t kth = (*keys)[k - 1];
  size_t greater = 0;
  for (size_t j = 0; j < c; ++j) greater += MagnitudeKey(acc[cand[j]]) > kth;
  size_t equal_wanted = k - greater;
  size_t out = 0;
  for (size_t j = 0; j < c && out < k; ++j) {
    const uint32_t key = MagnitudeKey(acc[cand[j]]);
    if (key > kth || (key == kth && equal_wanted > 0)) {
      if (key == kth) --equal_wanted;
      selected[out++] = cand[j];
    }
  }
  stats->kth_key = kth;
}

// Exact selection over acc once hist describes it: the bucket of the k-th key, then its elements.
void SelectFromHistogram(float* acc, size_t n, size_t k, const uint32_t* hist,
                         CompressionState* scratch, uint32_t* selected, TopkStats* stats) {
  size_t above = 0;
  size_t bucket = kBuckets - 1;
  while (above + hist[bucket] < k) above += hist[bucket--];
  const size_t count = above + hist[bucket];
  std::vector<uint32_t>& cand = scratch->index_scratch();
  if (cand.size() < count) cand.resize(count);
  AccumulateAndCollect(nullptr, 1.0f, acc, n, static_cast<uint32_t>(bucket << kHistogramShift),
                       cand.data(), count);
  stats->candidates = count;
  TrimToK(acc, cand.data(), count, k, &scratch->key_scratch(), selected, stats);
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

  const size_t cap = CandidateCap(k);
  std::vector<uint32_t>& cand = scratch->index_scratch();
  if (cand.size() < cap) cand.resize(cap);
  size_t count = AccumulateAndCollect(grad, scale, acc, n, threshold, cand.data(), cap);
  while (count < k || count > cap) {
    const size_t next = count < k ? std::min(sample, 2 * rank) : std::max<size_t>(1, rank / 2);
    if (stats->rescans == kMaxRescans || next == rank) {
      stats->exact_fallback = true;
      uint32_t hist[kBuckets];
      AccumulateHistogram(nullptr, 1.0f, acc, n, hist);
      return SelectFromHistogram(acc, n, k, hist, scratch, selected, stats);
    }
    rank = next;
    threshold = SampleKeyAtRank(&keys, rank);
    count = AccumulateAndCollect(nullptr, 1.0f, acc, n, threshold, cand.data(), cap);
    ++stats->rescans;
  }
  stats->candidates = count;
  TrimToK(acc, cand.data(), count, k, &keys, selected, stats);
}

std::string FormatDensity(double density) {
  char buf[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, density);
    if (std::strtod(buf, nullptr) == density) break;
  }
  return buf;
}

class TopkCompressor final : public Compressor {
 public:
  explicit TopkCompressor(const TopkOptions& options) : options_(options) {}

  std::string spec() const override {
    return "topk:density=" + FormatDensity(options_.density) +
           ",method=" + TopkMethodName(options_.method) +
           ",values=" + (options_.fp16_values ? "fp16" : "fp32");
  }
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
    CONCORD_ASSIGN_OR_RETURN(float* residual, state->Residual(in.name, in.count));
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

  static Status CheckCount(size_t count) {
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
};

}  // namespace

const char* TopkMethodName(TopkMethod method) {
  return method == TopkMethod::kExact ? "exact" : "sampled";
}

size_t TopkCount(double density, size_t n) {
  if (n == 0) return 0;
  const double k = std::ceil(density * static_cast<double>(n));
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
