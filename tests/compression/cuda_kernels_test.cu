// The GPU kernels against the CPU ones: bit-identical casts and the same top-k selection where a
// device exists; where none does (the build machines), every call fails cleanly with Unavailable
// naming the CUDA call, its file and line.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "compression/cast_kernels.h"
#include "compression/cuda/cuda_kernels.h"
#include "compression/topk.h"

namespace concord {
namespace compression {
namespace {

// What the runtime reports: a usable device, none (no device or no driver), or an error that is
// neither (e.g. the runtime failing to start under AddressSanitizer without
// protect_shadow_gap=0), in which case both kinds of test are skipped with that error.
enum class Devices { kPresent, kNone, kUnknown };
Devices Probe(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess && count > 0) return Devices::kPresent;
  if (e == cudaSuccess || e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
    return Devices::kNone;
  }
  *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e);
  return Devices::kUnknown;
}

// Why a test that needs `wanted` cannot run here ("" when it can).
std::string SkipReason(Devices wanted) {
  std::string why;
  const Devices found = Probe(&why);
  if (found == wanted) return "";
  if (found == Devices::kUnknown) return why;
  return found == Devices::kPresent ? "a device is present" : "no CUDA device";
}

// Device memory freed at scope exit.
template <typename T>
struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) { EXPECT_EQ(cudaMalloc(&ptr, n * sizeof(T) + 1), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr); }
  T* get() { return static_cast<T*>(ptr); }
  void* ptr = nullptr;
};

template <typename T>
void ToDevice(T* dst, const std::vector<T>& src) {
  ASSERT_EQ(cudaMemcpy(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
}

template <typename T>
std::vector<T> FromDevice(const T* src, size_t n) {
  std::vector<T> out(n);
  EXPECT_EQ(cudaMemcpy(out.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

std::vector<float> RandomBits(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) {
    const uint32_t bits = rng();
    std::memcpy(&x, &bits, 4);
  }
  return v;
}

TEST(CudaKernelsTest, WithoutADeviceCallsFailCleanly) {
  const std::string skip = SkipReason(Devices::kNone);
  if (!skip.empty()) GTEST_SKIP() << skip;
  // Aligned stand-ins for device pointers: nothing is launched without a device.
  alignas(8) static float floats[16];
  alignas(8) static uint32_t words[16];
  const Status s = CudaEncodeFloats(HalfFormat::kFloat16, floats, 16, 1.0f, words, nullptr);
  EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("cast_kernels.cu:"), std::string::npos) << s.message();
  const Status d = CudaAccumulateFloats(HalfFormat::kBFloat16, words, 16, floats, nullptr);
  EXPECT_EQ(d.code(), Code::kUnavailable) << d.ToString();
  const Status t =
      CudaSelectTopk(nullptr, 1.0f, floats, 1000, 10, words, words, size_t{1} << 30, nullptr);
  EXPECT_FALSE(t.ok());
  EXPECT_NE(t.message().find("topk_select.cu:"), std::string::npos) << t.message();
  EXPECT_TRUE(CudaEncodeFloats(HalfFormat::kFloat16, nullptr, 0, 1.0f, nullptr, nullptr).ok());
}

// With a device or without: a null or misaligned buffer is refused before any launch (in a kernel
// it would fault and leave the CUDA context unusable; the calls used to launch regardless).
TEST(CudaKernelsTest, BadBuffersAreRefusedBeforeAnyLaunch) {
  alignas(8) static float floats[16];
  alignas(8) static uint32_t words[16];
  const auto* odd = reinterpret_cast<const uint8_t*>(floats) + 1;
  auto* odd_out = reinterpret_cast<uint8_t*>(words) + 1;
  auto* two = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(floats) + 2);
  for (HalfFormat f : {HalfFormat::kFloat16, HalfFormat::kBFloat16}) {
    for (const Status& s :
         {CudaEncodeFloats(f, nullptr, 16, 1.0f, words, nullptr),
          CudaEncodeFloats(f, floats, 16, 1.0f, nullptr, nullptr),
          CudaEncodeFloats(f, reinterpret_cast<const float*>(odd), 16, 1.0f, words, nullptr),
          CudaEncodeFloats(f, floats, 16, 1.0f, odd_out, nullptr),
          CudaDecodeToFloats(f, nullptr, 16, floats, nullptr),
          CudaDecodeToFloats(f, odd, 16, floats, nullptr),
          CudaDecodeToFloats(f, words, 16, two, nullptr),
          CudaAccumulateFloats(f, words, 16, nullptr, nullptr)}) {
      EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
      EXPECT_NE(s.message().find("GPU cast"), std::string::npos) << s.message();
    }
  }
  for (const Status& s :
       {CudaSelectTopk(nullptr, 1.0f, nullptr, 100, 10, words, words, size_t{1} << 30, nullptr),
        CudaSelectTopk(nullptr, 1.0f, floats, 100, 10, nullptr, words, size_t{1} << 30, nullptr),
        CudaSelectTopk(nullptr, 1.0f, two, 100, 10, words, words, size_t{1} << 30, nullptr),
        CudaSelectTopk(two, 1.0f, floats, 100, 10, words, words, size_t{1} << 30, nullptr),
        CudaSelectTopk(nullptr, 1.0f, floats, 100, 100, nullptr, nullptr, 0, nullptr),
        CudaSelectTopk(nullptr, 1.0f, floats, 100, 10, words, odd_out, size_t{1} << 30, nullptr)}) {
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  }
}

TEST(CudaKernelsTest, CastsMatchTheCpuBitForBit) {
  const std::string skip = SkipReason(Devices::kPresent);
  if (!skip.empty()) GTEST_SKIP() << skip;
  for (HalfFormat f : {HalfFormat::kFloat16, HalfFormat::kBFloat16}) {
    for (size_t n : {size_t{1}, size_t{1001}, size_t{1} << 22}) {
      const std::vector<float> in = RandomBits(n, static_cast<uint32_t>(n));
      DeviceBuffer<float> d_in(n), d_out(n);
      DeviceBuffer<uint16_t> d_enc(n);
      ToDevice(d_in.get(), in);
      for (float scale : {1.0f, 0.25f}) {
        std::vector<uint16_t> want(n);
        EncodeFloats(f, in.data(), n, scale, want.data(), CastPath::kPortable);
        ASSERT_TRUE(CudaEncodeFloats(f, d_in.get(), n, scale, d_enc.get(), nullptr).ok());
        ASSERT_EQ(FromDevice(d_enc.get(), n), want) << HalfFormatName(f) << " n " << n;
      }
      std::vector<uint16_t> enc(n);
      EncodeFloats(f, in.data(), n, 1.0f, enc.data(), CastPath::kPortable);
      std::vector<float> want(n), acc(n, 0.5f);
      DecodeToFloats(f, enc.data(), n, want.data(), CastPath::kPortable);
      ASSERT_TRUE(CudaDecodeToFloats(f, d_enc.get(), n, d_out.get(), nullptr).ok());
      const std::vector<float> got = FromDevice(d_out.get(), n);
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), n * 4));
      ToDevice(d_out.get(), acc);
      AccumulateFloats(f, enc.data(), n, acc.data(), CastPath::kPortable);
      ASSERT_TRUE(CudaAccumulateFloats(f, d_enc.get(), n, d_out.get(), nullptr).ok());
      const std::vector<float> got_acc = FromDevice(d_out.get(), n);
      ASSERT_EQ(0, std::memcmp(got_acc.data(), acc.data(), n * 4));
    }
  }
}

TEST(CudaKernelsTest, TopkMatchesTheCpuSelection) {
  const std::string skip = SkipReason(Devices::kPresent);
  if (!skip.empty()) GTEST_SKIP() << skip;
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t n : {size_t{1}, size_t{17}, size_t{100003}, size_t{1} << 22}) {
    for (double density : {0.01, 0.5, 1.0}) {
      const size_t k = TopkCount(density, n);
      std::vector<float> grad(n), acc(n);
      for (float& x : grad) x = normal(rng);
      for (size_t i = 0; i < n; ++i) acc[i] = i % 5 == 0 ? 0.25f : normal(rng);  // many ties
      DeviceBuffer<float> d_grad(n), d_acc(n);
      DeviceBuffer<uint32_t> d_sel(k);
      ToDevice(d_grad.get(), grad);
      ToDevice(d_acc.get(), acc);
      auto bytes = CudaTopkWorkspaceBytes(n);
      ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
      DeviceBuffer<uint8_t> ws(*bytes);
      ASSERT_TRUE(CudaSelectTopk(d_grad.get(), 0.5f, d_acc.get(), n, k, d_sel.get(), ws.get(),
                                 *bytes, nullptr)
                      .ok());
      CompressionState state;
      std::vector<uint32_t> want(k);
      ASSERT_TRUE(SelectTopk(grad.data(), 0.5f, acc.data(), n, k, TopkMethod::kExact, &state,
                             want.data(), nullptr)
                      .ok());
      EXPECT_EQ(FromDevice(d_sel.get(), k), want) << "n " << n << " k " << k;
      EXPECT_EQ(FromDevice(d_acc.get(), n), acc);
      if (k < n) {  // k == n needs no workspace
        const Status small =
            CudaSelectTopk(nullptr, 1.0f, d_acc.get(), n, k, d_sel.get(), ws.get(), 16, nullptr);
        EXPECT_EQ(small.code(), Code::kInvalidArgument) << small.ToString();
      }
    }
  }
}

// More nans than k in acc and grad, with payloads: a GPU addition gives the canonical nan where
// the CPU keeps an operand's payload, so the selection must not order nans by payload (every nan
// one key, ties to the lower index), and the GPU selects what the CPU selects.
TEST(CudaKernelsTest, NansSelectAsOnTheCpu) {
  const std::string skip = SkipReason(Devices::kPresent);
  if (!skip.empty()) GTEST_SKIP() << skip;
  const size_t n = 100003, k = 1000;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> grad(n), acc(n);
  for (size_t i = 0; i < n; ++i) {
    grad[i] = normal(rng);
    acc[i] = normal(rng);
  }
  for (uint32_t j = 0; j < 3 * k; ++j) {
    const size_t i = 11 + 31 * static_cast<size_t>(j);
    const uint32_t a = 0x7fc00000u | (j + 1), g = 0xffc00000u | (3 * k - j);
    std::memcpy(&acc[i], &a, 4);
    std::memcpy(&grad[i], &g, 4);
  }
  DeviceBuffer<float> d_grad(n), d_acc(n);
  DeviceBuffer<uint32_t> d_sel(k);
  ToDevice(d_grad.get(), grad);
  ToDevice(d_acc.get(), acc);
  auto bytes = CudaTopkWorkspaceBytes(n);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  DeviceBuffer<uint8_t> ws(*bytes);
  ASSERT_TRUE(CudaSelectTopk(d_grad.get(), 1.0f / 3.0f, d_acc.get(), n, k, d_sel.get(), ws.get(),
                             *bytes, nullptr)
                  .ok());
  CompressionState state;
  std::vector<uint32_t> want(k);
  ASSERT_TRUE(SelectTopk(grad.data(), 1.0f / 3.0f, acc.data(), n, k, TopkMethod::kExact, &state,
                         want.data(), nullptr)
                  .ok());
  EXPECT_EQ(FromDevice(d_sel.get(), k), want);
}

}  // namespace
}  // namespace compression
}  // namespace concord
