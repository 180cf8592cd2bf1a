// GPU tests of the batched pack/unpack kernels (backends/cuda/cuda_packer.h), checked byte for byte
// against the CPU reference (base/dtype.h CopyScaled). Without a usable device every test that
// needs one is skipped with the CUDA error and the NCCL version; the probe test runs everywhere.
#include "backends/cuda/cuda_packer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cuda_device.h"
#include "base/dtype.h"
#include "tests/common/tensors.h"
#include "tests/gpu/stream_gate.h"

namespace concord {
namespace cuda {
namespace {

using harness::kAllDTypes;

constexpr DType kFloatDTypes[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                                  DType::kFloat64};
constexpr uint8_t kBufferSentinel = 0xA5;
constexpr uint8_t kTensorSentinel = 0x5A;

struct TensorSpec {
  DType dtype;
  size_t count;
  size_t misalign = 0;  // bytes past a 256-byte boundary (a multiple of the element size)
};

TEST(CudaDeviceTest, ProbeSaysWhyThereIsNoDeviceAndNcclVersionIsKnown) {
  const StatusOr<int> count = DeviceCount();
  if (count.ok()) {
    EXPECT_GT(count.value(), 0);
  } else {
    EXPECT_EQ(count.status().code(), Code::kUnavailable) << count.status().ToString();
    EXPECT_NE(count.status().message().find("cudaGetDeviceCount"), std::string::npos)
        << count.status().message();
  }
#ifdef CONCORD_TEST_EXPECT_NCCL
  int major = 0, minor = 0, patch = 0;
  char extra = 0;
  EXPECT_EQ(std::sscanf(NcclVersion().c_str(), "%d.%d.%d%c", &major, &minor, &patch, &extra), 3)
      << NcclVersion();
  EXPECT_GE(major, 2) << NcclVersion();
#endif
}

class CudaPackerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const StatusOr<int> count = DeviceCount();
    if (!count.ok()) {
      GTEST_SKIP() << "no usable CUDA device: " << count.status().message() << "; NCCL "
                   << NcclVersion();
    }
    auto packer = CudaPacker::Create(0);
    ASSERT_TRUE(packer.ok()) << packer.status().ToString();
    packer_ = std::move(packer.value());
  }

  // A set of tensors living in one device allocation, each at a 256-byte boundary plus its
  // misalignment, with random host contents and the gaps between them filled with a sentinel.
  struct Tensors {
    DeviceBuffer device;
    std::vector<uint8_t> host;  // the image of `device`
    std::vector<size_t> offsets;
    std::vector<PackTensor> pack;
  };

  Tensors MakeTensors(const std::vector<TensorSpec>& specs, uint32_t seed) {
    Tensors t;
    size_t size = 0;
    for (const TensorSpec& s : specs) {
      t.offsets.push_back(size + s.misalign);
      size += (s.misalign + s.count * DTypeSize(s.dtype) + 255) / 256 * 256 + 256;
    }
    t.host.assign(size, kTensorSentinel);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> value(-1000.0, 1000.0);
    for (size_t i = 0; i < specs.size(); ++i) {
      uint8_t* data = t.host.data() + t.offsets[i];
      if (IsFloatingPoint(specs[i].dtype)) {
        for (size_t k = 0; k < specs[i].count; ++k) {
          harness::StoreElement(specs[i].dtype, data, k, value(rng));
        }
      } else {
        for (size_t k = 0; k < specs[i].count * DTypeSize(specs[i].dtype); ++k) data[k] = rng();
      }
    }
    auto device = DeviceBuffer::Allocate(0, size);
    EXPECT_TRUE(device.ok()) << device.status().ToString();
    t.device = std::move(device.value());
    EXPECT_TRUE(t.device.CopyFromHost(0, t.host.data(), size).ok());
    for (size_t i = 0; i < specs.size(); ++i) {
      t.pack.push_back(
          {static_cast<char*>(t.device.data()) + t.offsets[i], specs[i].dtype, specs[i].count});
    }
    return t;
  }

  // Packs with `prescale` and checks every slot and the untouched padding; then unpacks into
  // sentinel-filled tensors with `postscale` and checks them and the untouched gaps.
  void RoundTrip(const std::vector<TensorSpec>& specs, double prescale, double postscale,
                 const PackOptions& options = {}) {
    Tensors t = MakeTensors(specs, static_cast<uint32_t>(specs.size() * 7 + 1));
    auto plan = PlanPack(t.pack, options);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    auto buffer = DeviceBuffer::Allocate(0, plan->total_bytes + 256);
    ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
    ASSERT_TRUE(buffer->Fill(kBufferSentinel).ok());

    ASSERT_TRUE(packer_->Pack(*plan, buffer->data(), buffer->size(), prescale, nullptr).ok());
    ASSERT_TRUE(SynchronizeStream(nullptr).ok());
    std::vector<uint8_t> packed(buffer->size());
    ASSERT_TRUE(buffer->CopyToHost(packed.data(), 0, packed.size()).ok());
    std::vector<uint8_t> expected(buffer->size(), kBufferSentinel);
    for (size_t i = 0; i < specs.size(); ++i) {
      CopyScaled(expected.data() + plan->entries[i].offset, t.host.data() + t.offsets[i],
                 specs[i].count, specs[i].dtype, prescale);
    }
    ASSERT_EQ(FirstDifference(packed, expected), packed.size()) << "pack differs";

    ASSERT_TRUE(t.device.Fill(kTensorSentinel).ok());
    ASSERT_TRUE(packer_->Unpack(*plan, buffer->data(), buffer->size(), postscale, nullptr).ok());
    ASSERT_TRUE(SynchronizeStream(nullptr).ok());
    std::vector<uint8_t> unpacked(t.host.size());
    ASSERT_TRUE(t.device.CopyToHost(unpacked.data(), 0, unpacked.size()).ok());
    std::vector<uint8_t> expected_tensors(t.host.size(), kTensorSentinel);
    for (size_t i = 0; i < specs.size(); ++i) {
      CopyScaled(expected_tensors.data() + t.offsets[i], expected.data() + plan->entries[i].offset,
                 specs[i].count, specs[i].dtype, postscale);
    }
    ASSERT_EQ(FirstDifference(unpacked, expected_tensors), unpacked.size()) << "unpack differs";
  }

  // Checks every slot of `buffer` against `t`'s tensors packed by `plan` with `scale`.
  void ExpectSlots(const PackPlan& plan, const Tensors& t, const DeviceBuffer& buffer, double scale,
                   const std::string& what) {
    std::vector<uint8_t> packed(buffer.size()), expected(buffer.size());
    ASSERT_TRUE(buffer.CopyToHost(packed.data(), 0, packed.size()).ok());
    for (size_t i = 0; i < plan.entries.size(); ++i) {
      const PackEntry& e = plan.entries[i];
      CopyScaled(expected.data() + e.offset, t.host.data() + t.offsets[i], t.pack[i].count,
                 t.pack[i].dtype, scale);
      EXPECT_EQ(std::memcmp(packed.data() + e.offset, expected.data() + e.offset, e.bytes), 0)
          << what << "tensor " << i;
    }
  }

  static size_t FirstDifference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    return i;
  }

  std::unique_ptr<CudaPacker> packer_;
};

TEST_F(CudaPackerTest, EveryDtypeAndSizeRoundTripsUnscaled) {
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(DTypeName(d));
    RoundTrip({{d, 0}, {d, 1}, {d, 3}, {d, 1000}, {d, 100003}}, 1.0, 1.0);
  }
}

TEST_F(CudaPackerTest, FloatingDtypesArePrescaledAndPostscaled) {
  for (DType d : kFloatDTypes) {
    SCOPED_TRACE(DTypeName(d));
    RoundTrip({{d, 1}, {d, 7}, {d, 4096}, {d, 65537}}, 0.5, 1.0 / 3.0);
    RoundTrip({{d, 33}, {d, 1000}}, 3.0, 1.0);  // a scale on one side only
  }
}

TEST_F(CudaPackerTest, MisalignedTensorsUseNarrowerLoads) {
  std::vector<TensorSpec> ints, floats;
  for (DType d : kAllDTypes) {
    for (size_t misalign = DTypeSize(d); misalign < 16; misalign += DTypeSize(d)) {
      (IsFloatingPoint(d) ? floats : ints).push_back({d, 1001, misalign});
    }
  }
  RoundTrip(ints, 1.0, 1.0);
  RoundTrip(floats, 1.0, 1.0);
  RoundTrip(floats, 0.25, 7.0);
}

TEST_F(CudaPackerTest, ThousandsOfTensorsInOneLaunch) {
  std::vector<TensorSpec> mixed, floats;
  for (size_t i = 0; i < 1500; ++i) {
    mixed.push_back({kAllDTypes[i % 8], (i * 37) % 3001});
    floats.push_back({kFloatDTypes[i % 4], (i * 53) % 2003});
  }
  RoundTrip(mixed, 1.0, 1.0);
  PackOptions small_chunks;
  small_chunks.chunk_bytes = 256;
  RoundTrip(floats, 0.125, 2.0, small_chunks);
}

TEST_F(CudaPackerTest, LargeTensorSpansManyBlocks) {
  RoundTrip({{DType::kFloat32, (size_t{5} << 20) + 1}, {DType::kBFloat16, (size_t{3} << 20) + 5}},
            0.5, 2.0);
}

TEST_F(CudaPackerTest, WiderAlignmentKeepsSlotsApart) {
  PackOptions options;
  options.alignment = 512;
  RoundTrip({{DType::kFloat16, 3}, {DType::kFloat64, 65}, {DType::kInt8, 1}}, 1.0, 1.0, options);
}

TEST_F(CudaPackerTest, ConsecutiveLaunchesReuseTableSlotsSafely) {
  // More launches in flight than the packer has table slots, each with its own plan and buffer.
  constexpr int kLaunches = 9;
  std::vector<Tensors> tensors;
  std::vector<PackPlan> plans;
  std::vector<DeviceBuffer> buffers;
  for (int l = 0; l < kLaunches; ++l) {
    tensors.push_back(MakeTensors({{DType::kFloat32, 1000u + l}, {DType::kFloat16, 77u * l}}, l));
    auto plan = PlanPack(tensors.back().pack);
    ASSERT_TRUE(plan.ok());
    plans.push_back(plan.value());
    auto buffer = DeviceBuffer::Allocate(0, plans.back().total_bytes);
    ASSERT_TRUE(buffer.ok());
    buffers.push_back(std::move(buffer.value()));
  }
  for (int l = 0; l < kLaunches; ++l) {
    ASSERT_TRUE(packer_->Pack(plans[l], buffers[l].data(), buffers[l].size(), 0.5, nullptr).ok());
  }
  ASSERT_TRUE(SynchronizeStream(nullptr).ok());
  for (int l = 0; l < kLaunches; ++l) {
    ExpectSlots(plans[l], tensors[l], buffers[l], 0.5, "launch " + std::to_string(l) + " ");
  }
}

// A launch whose table slot still holds an unfinished launch (the stream is held, as behind a
// collective stuck on a peer that never comes) calls the caller's wait between its polls, and an
// error from it ends the wait with nothing enqueued: the NCCL backend releases its lock there, so
// that the stuck collective can be aborted (the packer used to wait in cudaEventSynchronize,
// holding it). Once the stream runs again, the same launch goes through without waiting.
TEST_F(CudaPackerTest, AWaitForABusyTableSlotEndsOnTheCallersError) {
  Tensors t = MakeTensors({{DType::kFloat32, 1000}, {DType::kFloat16, 77}}, 5);
  auto plan = PlanPack(t.pack);
  ASSERT_TRUE(plan.ok());
  auto buffer = DeviceBuffer::Allocate(0, plan->total_bytes);
  ASSERT_TRUE(buffer.ok());
  int waits = 0;
  const SlotWait counted = [&] {
    ++waits;
    return Status::Ok();
  };
  // Every slot made large enough first, so that no launch below allocates behind the gate.
  constexpr int kMoreThanTheRing = 32;
  for (int l = 0; l < kMoreThanTheRing; ++l) {
    ASSERT_TRUE(packer_->Pack(*plan, buffer->data(), buffer->size(), 1.0, nullptr, counted).ok());
    ASSERT_TRUE(SynchronizeStream(nullptr).ok());
  }
  EXPECT_EQ(waits, 0);

  auto gate = StreamGate::Close(0, nullptr);
  ASSERT_TRUE(gate.ok()) << gate.status().ToString();
  const SlotWait refuse = [&] {
    ++waits;
    return waits < 3 ? Status::Ok() : TimeoutError("the test gave up");
  };
  int launched = 0;
  Status refused;
  while (launched < kMoreThanTheRing && refused.ok()) {
    refused = packer_->Pack(*plan, buffer->data(), buffer->size(), 0.5, nullptr, refuse);
    if (refused.ok()) ++launched;
  }
  EXPECT_GT(launched, 0);
  EXPECT_LT(launched, kMoreThanTheRing);
  EXPECT_EQ(refused.code(), Code::kTimeout) << refused.ToString();
  EXPECT_NE(refused.message().find("the test gave up"), std::string::npos) << refused.ToString();
  EXPECT_EQ(waits, 3);

  (*gate)->Open();
  ASSERT_TRUE(SynchronizeStream(nullptr).ok());
  waits = 0;
  ASSERT_TRUE(packer_->Pack(*plan, buffer->data(), buffer->size(), 2.0, nullptr, counted).ok());
  ASSERT_TRUE(SynchronizeStream(nullptr).ok());
  EXPECT_EQ(waits, 0);
  ExpectSlots(*plan, t, *buffer, 2.0, "");
}

TEST_F(CudaPackerTest, RefusedLaunchLeavesTheBufferUntouched) {
  Tensors t = MakeTensors({{DType::kFloat32, 10}, {DType::kInt32, 10}}, 3);
  auto plan = PlanPack(t.pack);
  ASSERT_TRUE(plan.ok());
  auto buffer = DeviceBuffer::Allocate(0, plan->total_bytes);
  ASSERT_TRUE(buffer.ok());
  ASSERT_TRUE(buffer->Fill(kBufferSentinel).ok());
  const Status scaled_int = packer_->Pack(*plan, buffer->data(), buffer->size(), 2.0, nullptr);
  EXPECT_EQ(scaled_int.code(), Code::kInvalidArgument) << scaled_int.ToString();
  const Status too_small =
      packer_->Unpack(*plan, buffer->data(), plan->total_bytes - 16, 1.0, nullptr);
  EXPECT_EQ(too_small.code(), Code::kInvalidArgument) << too_small.ToString();
  ASSERT_TRUE(SynchronizeStream(nullptr).ok());
  std::vector<uint8_t> bytes(buffer->size());
  ASSERT_TRUE(buffer->CopyToHost(bytes.data(), 0, bytes.size()).ok());
  EXPECT_EQ(bytes, std::vector<uint8_t>(bytes.size(), kBufferSentinel));
}

}  // namespace
}  // namespace cuda
}  // namespace concord
