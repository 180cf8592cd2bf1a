// The gradient-compressor interface, the per-communicator state compressors keep across steps, and
// the helpers the engine needs to move compressed tensors through a collective.
//
// How the engine uses a Compressor (one request, or one tensor inside a fused message):
//   1. CheckDType(dtype), then EncodedBytes(dtype, count) lays the tensor out in the fused buffer:
//      the size is exact and depends only on (dtype, count), so every rank computes the same layout
//      without talking. Place each encoded tensor at a multiple of kEncodedAlignment bytes.
//   2. Encode(input, out, state) writes exactly EncodedBytes bytes at `out` (no allocation per call
//      except a residual the first time a name is seen).
//   3. exchange() == kAllreduce: the encoded buffer is an array of `count` elements of
//      reduce_dtype(dtype) that can be summed element-wise by an ordinary allreduce (sum), then
//      Decode turns the reduced buffer into the dense result.
//      exchange() == kAllgather: every rank's encoded bytes are allgathered and DecodeSum (or
//      DecodeAccumulate per rank) adds them into the dense result.
// An average is a sum with scale = 1/world_size passed to Encode (the prescale before any cast, so
// half-precision sums stay in range); the engine applies any postscale to the dense result.
// All ranks must use compressors with the same spec() for a tensor (negotiation compares it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"

namespace concord {
namespace compression {

// How an encoded tensor travels.
enum class Exchange : int {
  kAllreduce = 0,  // element-wise summable: allreduce the encoded buffer
  kAllgather = 1,  // not summable: allgather every rank's bytes, decode and add locally
};
const char* ExchangeName(Exchange exchange);

// Encoded buffers start at multiples of this many bytes (dense buffers at multiples of their
// element size). Encode/Decode refuse misaligned buffers with InvalidArgument.
constexpr size_t kEncodedAlignment = 8;

// Per-tensor state of compressors, kept by tensor name across steps: the error-feedback residual
// (float32, one per element) and selection scratch space shared by all tensors. One object per
// communicator, owned by its engine; never a process global. Not thread-safe: one thread at a time
// (the engine holds a lock around it, since lanes encode concurrently).
//
// Memory is bounded by name: at most `max_residuals` names keep a residual. A new name beyond that
// evicts the least recently used one (its error feedback starts again from zero if it returns), so
// names used once (unnamed operations, a name per call) cannot make the state grow without end;
// evictions() counts them. Erase/Clear release memory too.
class CompressionState {
 public:
  static constexpr size_t kDefaultMaxResiduals = 1024;
  explicit CompressionState(size_t max_residuals = kDefaultMaxResiduals)
      : max_residuals_(max_residuals < 1 ? 1 : max_residuals) {}

  // The residual of `name`, zero-filled the first time (evicting the least recently used name
  // when max_residuals names hold one); it stays valid until the next Residual call for another
  // name, Erase or Clear. A later call with a different count starts the name again from zeros
  // (the old residual belongs to another shape, and would be meaningless): resets() counts those.
  float* Residual(std::string_view name, size_t count);
  // The residual of `name`, or nullptr if none is kept (for inspection and tests).
  const std::vector<float>* FindResidual(std::string_view name) const;
  void Erase(std::string_view name);
  void Clear();
  size_t num_tensors() const { return residuals_.size(); }
  size_t residual_bytes() const;
  size_t max_residuals() const { return max_residuals_; }
  // Residuals evicted to make room for a new name, since construction.
  uint64_t evictions() const { return evictions_; }
  // The name whose residual was evicted last ("" if none was).
  const std::string& last_evicted() const { return last_evicted_; }
  // Residuals started again because their name came with another element count, and the last
  // such name ("" if none).
  uint64_t resets() const { return resets_; }
  const std::string& last_reset() const { return last_reset_; }

  // Scratch for top-k selection, reused across calls (grows to the largest need, never shrinks
  // until Clear).
  std::vector<uint32_t>& index_scratch() { return index_scratch_; }
  std::vector<uint32_t>& key_scratch() { return key_scratch_; }
  std::vector<uint32_t>& order_scratch() { return order_scratch_; }

 private:
  struct Kept {
    std::vector<float> values;
    uint64_t last_use = 0;  // use_clock_ at the last Residual call for this name
  };
  void EvictLeastRecentlyUsed();

  size_t max_residuals_;
  uint64_t use_clock_ = 0;
  uint64_t evictions_ = 0;
  std::string last_evicted_;
  uint64_t resets_ = 0;
  std::string last_reset_;
  std::map<std::string, Kept, std::less<>> residuals_;  // lookup without a copy
  std::vector<uint32_t> index_scratch_;
  std::vector<uint32_t> key_scratch_;
  std::vector<uint32_t> order_scratch_;
};

// One tensor to encode. `data` holds `count` elements of `dtype`, aligned to the element size.
struct EncodeInput {
  std::string_view name;  // key of the per-tensor state (residuals); any string
  DType dtype = DType::kFloat32;
  size_t count = 0;
  const void* data = nullptr;
  double scale = 1.0;  // multiplies every element before encoding (1/world_size for an average)
};

// A compression method with fixed parameters. Immutable after creation: every method is const and
// thread-safe; what changes across steps lives in the CompressionState the caller passes.
// Errors are returned, never thrown: InvalidArgument for a refused dtype, a misaligned or null
// buffer, a missing state; ProtocolError for encoded bytes that cannot have come from Encode.
class Compressor {
 public:
  virtual ~Compressor() = default;

  // Canonical description, name and every parameter: "none", "fp16",
  // "topk:density=0.01,method=sampled,values=fp32". CreateCompressor(spec()) gives an equal one.
  virtual std::string spec() const = 0;
  virtual Exchange exchange() const = 0;
  // OK when this compressor accepts tensors of `dtype`; else InvalidArgument saying which it takes.
  virtual Status CheckDType(DType dtype) const = 0;
  // Whether a tensor of `dtype` travels as it is, uncompressed: nothing to gain (a cast given a
  // tensor already 16-bit floating point). CheckDType need not accept such a dtype.
  virtual bool passes_through(DType dtype) const {
    (void)dtype;
    return false;
  }
  // OK when this compressor takes a tensor of `count` elements (any count, unless it says so).
  virtual Status CheckCount(size_t count) const {
    (void)count;
    return Status::Ok();
  }
  // kAllreduce only: the element type the encoded buffer is summed as (it holds `count` of them).
  virtual DType reduce_dtype(DType dtype) const = 0;
  // Exact encoded size of `count` elements of `dtype` (a CheckDType-accepted dtype).
  virtual size_t EncodedBytes(DType dtype, size_t count) const = 0;
  // Whether Encode needs a CompressionState (it may be null otherwise).
  virtual bool uses_state() const = 0;

  // Writes EncodedBytes(in.dtype, in.count) bytes at `out`.
  virtual Status Encode(const EncodeInput& in, void* out, CompressionState* state) const = 0;
  // dense = the tensor `encoded` stands for (after an allreduce: the sum over ranks).
  virtual Status Decode(const void* encoded, DType dtype, size_t count, void* dense) const = 0;
  // dense += the tensor `encoded` stands for, added in dense's dtype.
  virtual Status DecodeAccumulate(const void* encoded, DType dtype, size_t count,
                                  void* dense) const = 0;
};

// After an allgather: dense = sum over r < num_ranks of the tensor encoded at
// gathered + r * stride_bytes (stride: one rank's share of the gathered buffer, a multiple of
// kEncodedAlignment). Works for both kinds of exchange.
Status DecodeSum(const Compressor& compressor, const void* gathered, size_t stride_bytes,
                 int num_ranks, DType dtype, size_t count, void* dense);

// Honest accounting: the bytes one rank sends for one tensor of `encoded_bytes` among `world_size`
// ranks with bandwidth-optimal ring algorithms: allreduce 2 (n-1)/n B (reduce-scatter then
// allgather), allgather (n-1) B. Zero for one rank.
uint64_t WireBytesPerRank(Exchange exchange, size_t encoded_bytes, int world_size);

// Shared argument checks (used by the compressors): non-null and aligned buffers.
Status CheckEncodedBuffer(const void* encoded, size_t bytes, const char* what);
Status CheckDenseBuffer(const void* dense, DType dtype, size_t count, const char* what);

}  // namespace compression
}  // namespace concord
