// Tests of the batched-pack planner (backends/cuda/pack_plan.h). Plain C++: runs everywhere, GPU or
// not. Addresses are synthetic (the planner never dereferences them).
#include "backends/cuda/pack_plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "tests/common/comma_locale.h"
#include "tests/common/tensors.h"

namespace concord {
namespace cuda {
namespace {

using harness::kAllDTypes;

const void* Address(uint64_t a) {
  return reinterpret_cast<const void*>(static_cast<uintptr_t>(a));
}

// Every property a plan must have whatever its input: slots in order, aligned, not overlapping,
// sized to their tensors, inside total_bytes; chunks covering each tensor exactly once, in order,
// each at most chunk_bytes and starting on a 16-byte boundary; widths that divide both addresses.
void ExpectValidPlan(const PackPlan& plan, const std::vector<PackTensor>& tensors,
                     const PackOptions& options) {
  ASSERT_EQ(plan.entries.size(), tensors.size());
  EXPECT_EQ(plan.alignment, options.alignment);
  size_t end_of_previous = 0;
  size_t payload = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const PackEntry& e = plan.entries[i];
    SCOPED_TRACE("tensor " + std::to_string(i));
    EXPECT_EQ(e.user, reinterpret_cast<uintptr_t>(tensors[i].data));
    EXPECT_EQ(e.dtype, static_cast<uint32_t>(tensors[i].dtype));
    EXPECT_EQ(e.bytes, tensors[i].count * DTypeSize(tensors[i].dtype));
    EXPECT_EQ(e.offset % options.alignment, 0u);
    EXPECT_GE(e.offset, end_of_previous);
    EXPECT_LT(e.offset - end_of_previous, options.alignment);  // padding only, never a gap
    EXPECT_EQ(e.user % e.vector_bytes, 0u);
    EXPECT_EQ(options.alignment % e.vector_bytes, 0u);
    EXPECT_GE(e.vector_bytes, DTypeSize(tensors[i].dtype));
    end_of_previous = e.offset + e.bytes;
    payload += e.bytes;
  }
  EXPECT_GE(plan.total_bytes, end_of_previous);
  EXPECT_EQ(plan.total_bytes % options.alignment, 0u);
  EXPECT_LT(plan.total_bytes - end_of_previous, options.alignment);
  EXPECT_EQ(plan.payload_bytes, payload);

  std::vector<uint64_t> covered(tensors.size(), 0);
  uint32_t last_entry = 0;
  for (const PackChunk& c : plan.chunks) {
    ASSERT_LT(c.entry, tensors.size());
    EXPECT_GE(c.entry, last_entry);
    last_entry = c.entry;
    EXPECT_EQ(c.begin, covered[c.entry]);  // contiguous, no overlap, no hole
    EXPECT_LT(c.begin, c.end);
    EXPECT_LE(c.end - c.begin, options.chunk_bytes);
    EXPECT_EQ(c.begin % 16, 0u);
    covered[c.entry] = c.end;
  }
  for (size_t i = 0; i < tensors.size(); ++i) EXPECT_EQ(covered[i], plan.entries[i].bytes) << i;
}

PackPlan PlanOrDie(const std::vector<PackTensor>& tensors, const PackOptions& options = {}) {
  StatusOr<PackPlan> plan = PlanPack(tensors, options);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  if (plan.ok()) ExpectValidPlan(plan.value(), tensors, options);
  return plan.ok() ? plan.value() : PackPlan{};
}

TEST(PackPlanTest, EmptyListIsAnEmptyPlan) {
  const PackPlan plan = PlanOrDie({});
  EXPECT_EQ(plan.total_bytes, 0u);
  EXPECT_TRUE(plan.entries.empty());
  EXPECT_TRUE(plan.chunks.empty());
}

TEST(PackPlanTest, ZeroElementTensorsTakeNoBytesAndNoChunks) {
  const std::vector<PackTensor> tensors = {{nullptr, DType::kFloat32, 0},
                                           {Address(0x1000), DType::kFloat16, 3},
                                           {nullptr, DType::kInt8, 0}};
  const PackPlan plan = PlanOrDie(tensors);
  EXPECT_EQ(plan.entries[0].offset, 0u);
  EXPECT_EQ(plan.entries[1].offset, 0u);
  EXPECT_EQ(plan.entries[2].offset, 16u);
  EXPECT_EQ(plan.total_bytes, 16u);
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].entry, 1u);
}

TEST(PackPlanTest, OneElementOfEveryDtypeGetsItsOwnAlignedSlot) {
  std::vector<PackTensor> tensors;
  for (DType d : kAllDTypes) tensors.push_back({Address(0x10000 + 256 * tensors.size()), d, 1});
  const PackPlan plan = PlanOrDie(tensors);
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(plan.entries[i].offset, 16 * i);
    EXPECT_EQ(plan.entries[i].vector_bytes, 16u);
  }
  EXPECT_EQ(plan.total_bytes, 16 * tensors.size());
  EXPECT_EQ(plan.chunks.size(), tensors.size());
}

TEST(PackPlanTest, OddSizesArePaddedToTheAlignment) {
  const std::vector<PackTensor> tensors = {{Address(0x1000), DType::kFloat16, 7},
                                           {Address(0x2000), DType::kUint8, 1001},
                                           {Address(0x3000), DType::kFloat64, 3},
                                           {Address(0x4000), DType::kBFloat16, 9}};
  const PackPlan plan = PlanOrDie(tensors);
  EXPECT_EQ(plan.entries[1].offset, 16u);    // 14 bytes -> 16
  EXPECT_EQ(plan.entries[2].offset, 1024u);  // 16 + 1001 -> 1024
  EXPECT_EQ(plan.entries[3].offset, 1056u);  // 1024 + 24 -> 1056
  EXPECT_EQ(plan.total_bytes, 1088u);        // 1056 + 18 -> 1088
  EXPECT_EQ(plan.payload_bytes, 14u + 1001u + 24u + 18u);
}

TEST(PackPlanTest, LargeTensorIsCutIntoChunks) {
  const size_t count = (size_t{1} << 28) + 3;  // 1 GiB + 12 bytes of float32
  const PackOptions options;
  const PackPlan plan = PlanOrDie({{Address(0x100000), DType::kFloat32, count}}, options);
  const size_t bytes = count * 4;
  EXPECT_EQ(plan.chunks.size(), (bytes + options.chunk_bytes - 1) / options.chunk_bytes);
  EXPECT_EQ(plan.chunks.back().end - plan.chunks.back().begin, 12u);
  EXPECT_EQ(plan.total_bytes, bytes + 4);
}

TEST(PackPlanTest, TenThousandTensorsOfEveryDtypeInOnePlan) {
  std::vector<PackTensor> tensors;
  uint64_t address = 0x7f0000000000;
  for (size_t i = 0; i < 10000; ++i) {
    const DType d = kAllDTypes[i % 8];
    const size_t count = (i * 7919) % 5000;  // includes 0 and odd counts
    tensors.push_back({Address(address), d, count});
    address += (count * DTypeSize(d) + 255) / 256 * 256 + 256;
  }
  PackOptions options;
  options.chunk_bytes = 4096;
  const PackPlan plan = PlanOrDie(tensors, options);
  EXPECT_GT(plan.chunks.size(), 10000u);
}

TEST(PackPlanTest, MisalignedAddressesChooseNarrowerWidths) {
  struct Case {
    DType dtype;
    uint64_t misalign;
    uint32_t width;
  };
  const Case cases[] = {
      {DType::kUint8, 0, 16},  {DType::kUint8, 8, 8},    {DType::kUint8, 4, 4},
      {DType::kUint8, 2, 2},   {DType::kUint8, 1, 1},    {DType::kInt8, 3, 1},
      {DType::kFloat16, 2, 2}, {DType::kBFloat16, 6, 2}, {DType::kFloat16, 4, 4},
      {DType::kFloat32, 4, 4}, {DType::kFloat32, 8, 8},  {DType::kInt32, 12, 4},
      {DType::kFloat64, 8, 8}, {DType::kInt64, 24, 8},   {DType::kFloat64, 32, 16}};
  std::vector<PackTensor> tensors;
  for (const Case& c : cases)
    tensors.push_back({Address(0x10000 * (tensors.size() + 1) + c.misalign), c.dtype, 5});
  const PackPlan plan = PlanOrDie(tensors);
  for (size_t i = 0; i < std::size(cases); ++i) {
    EXPECT_EQ(plan.entries[i].vector_bytes, cases[i].width) << "case " << i;
  }
}

TEST(PackPlanTest, VectorBytesTakesTheNarrowerOfAddressAndAlignment) {
  EXPECT_EQ(VectorBytes(0x1000, 16), 16u);
  EXPECT_EQ(VectorBytes(0x1000, 8), 8u);
  EXPECT_EQ(VectorBytes(0x1000, 4096), 16u);
  EXPECT_EQ(VectorBytes(0x1004, 16), 4u);
  EXPECT_EQ(VectorBytes(0x1001, 64), 1u);
  EXPECT_EQ(VectorBytes(0, 16), 16u);
}

TEST(PackPlanTest, ConfigurableAlignment) {
  std::vector<PackTensor> tensors;
  for (size_t i = 0; i < 50; ++i)
    tensors.push_back({Address(0x100000 + 4096 * i), DType::kFloat32, i});
  for (size_t alignment : {8, 16, 64, 256, 4096}) {
    PackOptions options;
    options.alignment = alignment;
    const PackPlan plan = PlanOrDie(tensors, options);
    for (const PackEntry& e : plan.entries) EXPECT_LE(e.vector_bytes, alignment);
  }
}

TEST(PackPlanTest, RefusesBadOptions) {
  const std::vector<PackTensor> tensors = {{Address(0x1000), DType::kFloat32, 4}};
  for (size_t alignment : {0, 4, 12, 24, 8192}) {
    PackOptions options;
    options.alignment = alignment;
    const auto plan = PlanPack(tensors, options);
    EXPECT_EQ(plan.status().code(), Code::kInvalidArgument) << alignment;
  }
  for (size_t chunk : {0, 8, 24, 1000}) {
    PackOptions options;
    options.chunk_bytes = chunk;
    const auto plan = PlanPack(tensors, options);
    EXPECT_EQ(plan.status().code(), Code::kInvalidArgument) << chunk;
  }
}

TEST(PackPlanTest, RefusesBadTensorsNamingThem) {
  const PackTensor good = {Address(0x1000), DType::kFloat32, 4};
  const std::vector<PackTensor> bad = {
      {Address(0x2000), static_cast<DType>(42), 4},  // unknown dtype
      {nullptr, DType::kFloat32, 1},                 // null with data
      {Address(0x2002), DType::kFloat32, 4},         // not element-aligned
      {Address(0x2001), DType::kFloat16, 4},         // not element-aligned
      {Address(0x2000), DType::kFloat64, std::numeric_limits<size_t>::max() / 4},  // bytes overflow
      {Address(0x2000), DType::kUint8,
       std::numeric_limits<size_t>::max() - 3},  // padding overflows
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    const auto plan = PlanPack({good, bad[i]});
    EXPECT_EQ(plan.status().code(), Code::kInvalidArgument) << i;
    EXPECT_NE(plan.status().message().find("pack tensor 1"), std::string::npos)
        << plan.status().message();
  }
}

TEST(PackPlanTest, CheckLaunchAcceptsAValidLaunch) {
  const PackPlan plan =
      PlanOrDie({{Address(0x1000), DType::kFloat16, 5}, {Address(0x2000), DType::kInt32, 3}});
  EXPECT_TRUE(CheckLaunch(plan, Address(0x40000), plan.total_bytes, 1.0).ok());
  EXPECT_TRUE(CheckLaunch(plan, Address(0x40000), plan.total_bytes + 100, 1.0).ok());
  const PackPlan floats = PlanOrDie({{Address(0x1000), DType::kFloat16, 5}});
  EXPECT_TRUE(CheckLaunch(floats, Address(0x40000), floats.total_bytes, 0.125).ok());
  EXPECT_TRUE(CheckLaunch(floats, Address(0x40000), floats.total_bytes, 0.0).ok());
  const PackPlan empty = PlanOrDie({});
  EXPECT_TRUE(CheckLaunch(empty, nullptr, 0, 1.0).ok());
}

TEST(PackPlanTest, CheckLaunchRefusesBadBuffersAndScales) {
  const PackPlan plan =
      PlanOrDie({{Address(0x1000), DType::kFloat32, 5}, {Address(0x2000), DType::kInt64, 3}});
  const void* buffer = Address(0x40000);
  EXPECT_EQ(CheckLaunch(plan, nullptr, plan.total_bytes, 1.0).code(), Code::kInvalidArgument);
  EXPECT_EQ(CheckLaunch(plan, Address(0x40008), plan.total_bytes, 1.0).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(CheckLaunch(plan, buffer, plan.total_bytes - 1, 1.0).code(), Code::kInvalidArgument);
  EXPECT_EQ(CheckLaunch(PackPlan{}, buffer, 64, 1.0).code(), Code::kInvalidArgument);
  const PackPlan floats = PlanOrDie({{Address(0x1000), DType::kFloat32, 5}});
  for (double scale : {std::nan(""), std::numeric_limits<double>::infinity(),
                       -std::numeric_limits<double>::infinity()}) {
    EXPECT_EQ(CheckLaunch(floats, buffer, floats.total_bytes, scale).code(),
              Code::kInvalidArgument);
  }
  // Integer tensors are copied, never scaled: the error names the tensor and its dtype.
  const Status s = CheckLaunch(plan, buffer, plan.total_bytes, 0.5);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("pack tensor 1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("int64"), std::string::npos) << s.message();
  for (DType d : kAllDTypes) {
    const PackPlan one = PlanOrDie({{Address(0x1000), d, 8}});
    EXPECT_EQ(CheckLaunch(one, buffer, one.total_bytes, 2.0).ok(), IsFloatingPoint(d))
        << DTypeName(d);
    EXPECT_TRUE(CheckLaunch(one, buffer, one.total_bytes, 1.0).ok()) << DTypeName(d);
  }
}

// The scale factor in CheckLaunch's errors has a decimal point whatever LC_NUMERIC the application
// set (under de_DE it read "(factor 0,500000)").
TEST(PackPlanTest, CheckLaunchWritesTheScaleInTheCLocaleWhateverTheApplicationSet) {
  const harness::CommaLocale comma;
  if (!comma.active()) GTEST_SKIP() << comma.why();
  const PackPlan ints = PlanOrDie({{Address(0x1000), DType::kInt32, 4}});
  const Status s = CheckLaunch(ints, Address(0x40000), ints.total_bytes, 0.5);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("(factor 0.500000)"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace cuda
}  // namespace concord
