// libFuzzer target for decoding compressed tensors (compression/): what one rank decodes is
// another rank's bytes from the network, so top-k's indices may be out of range, repeated or out
// of order, and must give kProtocolError before anything is written, never a wild access. The
// input is a compressor spec (through CreateCompressor, so the spec parser is fuzzed too), a
// dtype, a count and the encoded bytes:
//   spec '\n' | u8 dtype | u8 flags | u32 count | payload
// count is taken modulo 65537; flags & 3 is the number of ranks minus one (DecodeSum over an
// allgathered buffer, each share at a kEncodedAlignment stride); flags & 4 encodes the payload
// read as a dense tensor (with error feedback, twice) and decodes that, which must succeed;
// flags & 8 asks a top-k compressor to decode 2^32 + count elements, which it must refuse. The
// encoded buffers are allocated at exactly EncodedBytes (the engine's layout), so AddressSanitizer
// sees any read beyond them. The commands are in tests/fuzz/README.md.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "compression/registry.h"

namespace {

using namespace concord;
using namespace concord::compression;

constexpr size_t kMaxCount = 65536;

void Check(bool ok) {
  if (!ok) std::abort();
}

// Exactly `bytes` bytes (at least one, so the pointer is never null), 16-aligned by operator new.
std::unique_ptr<uint8_t[]> Buffer(size_t bytes, const uint8_t* fill, size_t fill_size) {
  std::unique_ptr<uint8_t[]> b(new uint8_t[std::max<size_t>(bytes, 1)]());
  if (fill != nullptr) std::memcpy(b.get(), fill, std::min(bytes, fill_size));
  return b;
}

// Encodes count elements read from payload, then decodes them: both must succeed.
void RoundTrip(const Compressor& c, DType dtype, size_t count, const uint8_t* payload,
               size_t payload_size) {
  const size_t dense_bytes = count * DTypeSize(dtype);
  auto dense = Buffer(dense_bytes, payload, payload_size);
  auto encoded = Buffer(c.EncodedBytes(dtype, count), nullptr, 0);
  auto decoded = Buffer(dense_bytes, nullptr, 0);
  CompressionState state;
  for (int step = 0; step < 2; ++step) {  // the second step adds the first's residual
    EncodeInput in;
    in.name = "t";
    in.dtype = dtype;
    in.count = count;
    in.data = dense.get();
    Check(c.Encode(in, encoded.get(), &state).ok());
    Check(c.Decode(encoded.get(), dtype, count, decoded.get()).ok());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* newline = static_cast<const uint8_t*>(std::memchr(data, '\n', size));
  if (newline == nullptr) return 0;
  const std::string_view spec(reinterpret_cast<const char*>(data), newline - data);
  const uint8_t* p = newline + 1;
  size_t left = size - (p - data);
  if (left < 6) return 0;
  const int dtype_value = p[0] % (kNumDTypes + 1);  // one invalid value
  const uint8_t flags = p[1];
  uint32_t raw_count;
  std::memcpy(&raw_count, p + 2, 4);
  p += 6;
  left -= 6;

  auto created = CreateCompressor(spec);
  if (!created.ok()) {
    Check(created.status().code() == Code::kInvalidArgument);
    return 0;
  }
  const Compressor& c = **created;
  Check(CreateCompressor(c.spec()).ok());
  const auto dtype = static_cast<DType>(dtype_value);
  if (!c.CheckDType(dtype).ok()) return 0;
  const size_t count = raw_count % (kMaxCount + 1);
  const size_t dense_bytes = count * DTypeSize(dtype);

  if ((flags & 8) && c.spec().rfind("topk", 0) == 0) {
    // Refused on the count alone: the buffers are never read.
    uint64_t scratch = 0;
    const size_t huge = (size_t{1} << 32) + count;
    Check(c.Decode(&scratch, dtype, huge, &scratch).code() == Code::kInvalidArgument);
    Check(c.DecodeAccumulate(&scratch, dtype, huge, &scratch).code() == Code::kInvalidArgument);
  }

  // One rank's share, as Decode sees it.
  const size_t bytes = c.EncodedBytes(dtype, count);
  auto encoded = Buffer(bytes, p, left);
  auto dense = Buffer(dense_bytes, nullptr, 0);
  const Status one = c.Decode(encoded.get(), dtype, count, dense.get());
  Check(one.ok() || one.code() == Code::kProtocolError);

  // Every rank's share after an allgather.
  const int ranks = 1 + (flags & 3);
  const size_t stride = (bytes + kEncodedAlignment - 1) / kEncodedAlignment * kEncodedAlignment;
  auto gathered = Buffer(stride * ranks, p, left);
  const Status sum = DecodeSum(c, gathered.get(), stride, ranks, dtype, count, dense.get());
  Check(sum.ok() || sum.code() == Code::kProtocolError);
  if (ranks == 1) Check(sum.code() == one.code());

  if (flags & 4) RoundTrip(c, dtype, count, p, left);
  return 0;
}
