// Google Benchmark of the compressors' hot loops against memcpy over the same data:
//   fp16 / bf16 encode of n floats (each SIMD path this CPU runs) beside a memcpy of the same n
//   floats; bytes/s counts the bytes read (4 per element) on both sides, so the rates compare
//   directly. The acceptance bar: fp16 encode at least 0.8x memcpy's rate.
//   top-k (density 0.01, sampled and exact, error feedback included) over ResNet-50's 25,557,032
//   gradients as one buffer, and tensor by tensor from the workload file, beside a memcpy of all of
//   them. The bar: sampled within 4x memcpy's time.
// The workload file: $CONCORD_WORKLOAD, else perf/workloads/resnet50.txt in the checkout.
// Run: compression_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "compression/cast_kernels.h"
#include "compression/registry.h"
#include "compression/topk.h"
#include "perf/workload.h"

namespace concord {
namespace compression {
namespace {

constexpr size_t kResNet50Elements = 25557032;

std::vector<float> Gradient(size_t n) {
  std::vector<float> v(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (float& x : v) x = normal(rng);
  return v;
}

void BM_Memcpy(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const std::vector<float> src = Gradient(n);
  std::vector<float> dst(n, 0.0f);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * sizeof(float)));
}

void BM_Encode(benchmark::State& state, HalfFormat format, CastPath path) {
  if (!CastPathAvailable(format, path)) {
    state.SkipWithError("path not available on this CPU");
    return;
  }
  const size_t n = static_cast<size_t>(state.range(0));
  const std::vector<float> src = Gradient(n);
  std::vector<uint16_t> dst(n, 0);
  for (auto _ : state) {
    EncodeFloats(format, src.data(), n, 0.25f, dst.data(), path);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * sizeof(float)));
}

void BM_DecodeAccumulate(benchmark::State& state, HalfFormat format) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<uint16_t> src(n, 0x3c00);
  std::vector<float> dst(n, 0.0f);
  for (auto _ : state) {
    AccumulateFloats(format, src.data(), n, dst.data(), BestCastPath(format));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * sizeof(float)));
}

// One compressor encoding ResNet-50's gradients, as one buffer or tensor by tensor.
void BM_EncodeResNet50(benchmark::State& state, const char* spec, bool per_tensor) {
  std::vector<size_t> tensors = {kResNet50Elements};
  if (per_tensor) {
    const char* env = std::getenv("CONCORD_WORKLOAD");
    auto workload = LoadWorkload(env != nullptr ? env : CONCORD_DEFAULT_WORKLOAD);
    if (!workload.ok()) {
      state.SkipWithError(workload.status().ToString().c_str());
      return;
    }
    tensors.clear();
    for (const WorkloadTensor& t : workload->tensors)
      tensors.push_back(static_cast<size_t>(t.elements));
  }
  auto made = CreateCompressor(spec);
  if (!made.ok()) {
    state.SkipWithError(made.status().ToString().c_str());
    return;
  }
  const Compressor& c = **made;
  size_t total = 0, encoded = 0;
  std::vector<size_t> offsets;
  for (size_t n : tensors) {
    offsets.push_back(encoded);
    encoded += (c.EncodedBytes(DType::kFloat32, n) + 7) / 8 * 8;
    total += n;
  }
  const std::vector<float> grad = Gradient(total);
  std::vector<uint64_t> out(encoded / 8 + 1);
  std::vector<std::string> names;
  for (size_t t = 0; t < tensors.size(); ++t) names.push_back("t" + std::to_string(t));
  CompressionState cs;
  auto step = [&]() {
    size_t first = 0;
    for (size_t t = 0; t < tensors.size(); ++t) {
      const Status s = c.Encode({names[t], DType::kFloat32, tensors[t], grad.data() + first, 0.25},
                                reinterpret_cast<uint8_t*>(out.data()) + offsets[t], &cs);
      if (!s.ok()) state.SkipWithError(s.ToString().c_str());
      first += tensors[t];
    }
    benchmark::ClobberMemory();
  };
  step();  // untimed: creates the residuals and scratch (first-touch page faults)
  for (auto _ : state) step();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * total * sizeof(float)));
  state.counters["tensors"] = static_cast<double>(tensors.size());
  state.counters["encoded_MB"] = static_cast<double>(encoded) / 1e6;
  state.counters["wire_MB_4ranks"] =
      static_cast<double>(WireBytesPerRank(c.exchange(), encoded, 4)) / 1e6;
}

constexpr int64_t kSmall = 1 << 18;  // 1 MiB of floats: in cache
constexpr int64_t kLarge = 1 << 24;  // 64 MiB of floats: from memory

BENCHMARK(BM_Memcpy)->Arg(kSmall)->Arg(kLarge)->Arg(kResNet50Elements)->UseRealTime();
BENCHMARK_CAPTURE(BM_Encode, fp16_portable, HalfFormat::kFloat16, CastPath::kPortable)
    ->Arg(kSmall)
    ->Arg(kLarge)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Encode, fp16_avx2, HalfFormat::kFloat16, CastPath::kAvx2)
    ->Arg(kSmall)
    ->Arg(kLarge)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Encode, fp16_avx512, HalfFormat::kFloat16, CastPath::kAvx512)
    ->Arg(kSmall)
    ->Arg(kLarge)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Encode, bf16_portable, HalfFormat::kBFloat16, CastPath::kPortable)
    ->Arg(kSmall)
    ->Arg(kLarge)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Encode, bf16_avx2, HalfFormat::kBFloat16, CastPath::kAvx2)
    ->Arg(kSmall)
    ->Arg(kLarge)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Encode, bf16_avx512, HalfFormat::kBFloat16, CastPath::kAvx512)
    ->Arg(kSmall)
    ->Arg(kLarge)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_DecodeAccumulate, fp16, HalfFormat::kFloat16)->Arg(kLarge)->UseRealTime();
BENCHMARK_CAPTURE(BM_DecodeAccumulate, bf16, HalfFormat::kBFloat16)->Arg(kLarge)->UseRealTime();
BENCHMARK_CAPTURE(BM_EncodeResNet50, sampled_one_buffer, "topk:density=0.01,method=sampled", false)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_EncodeResNet50, exact_one_buffer, "topk:density=0.01,method=exact", false)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_EncodeResNet50, sampled_per_tensor, "topk:density=0.01,method=sampled", true)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_EncodeResNet50, exact_per_tensor, "topk:density=0.01,method=exact", true)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_EncodeResNet50, none_per_tensor, "none", true)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_EncodeResNet50, fp16_per_tensor, "fp16", true)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace compression
}  // namespace concord

BENCHMARK_MAIN();
