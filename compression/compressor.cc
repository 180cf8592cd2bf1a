#include "compression/compressor.h"

#include <cstring>

namespace concord {
namespace compression {

const char* ExchangeName(Exchange exchange) {
  return exchange == Exchange::kAllreduce ? "allreduce" : "allgather";
}

float* CompressionState::Residual(std::string_view name, size_t count) {
  auto it = residuals_.find(name);
  if (it == residuals_.end()) {
    if (residuals_.size() >= max_residuals_) EvictLeastRecentlyUsed();
    it = residuals_.emplace(std::string(name), Kept{std::vector<float>(count, 0.0f), 0}).first;
  } else if (it->second.values.size() != count) {
    it->second.values.assign(count, 0.0f);
    it->second.values.shrink_to_fit();
    last_reset_ = it->first;
    ++resets_;
  }
  it->second.last_use = ++use_clock_;
  return it->second.values.data();
}

// A scan: evictions happen once per new name beyond the bound, next to a top-k selection over the
// tensor, which costs far more than visiting max_residuals entries.
void CompressionState::EvictLeastRecentlyUsed() {
  auto oldest = residuals_.begin();
  for (auto it = residuals_.begin(); it != residuals_.end(); ++it) {
    if (it->second.last_use < oldest->second.last_use) oldest = it;
  }
  if (oldest == residuals_.end()) return;
  last_evicted_ = oldest->first;
  residuals_.erase(oldest);
  ++evictions_;
}

const std::vector<float>* CompressionState::FindResidual(std::string_view name) const {
  auto it = residuals_.find(name);
  return it == residuals_.end() ? nullptr : &it->second.values;
}

void CompressionState::Erase(std::string_view name) {
  auto it = residuals_.find(name);
  if (it != residuals_.end()) residuals_.erase(it);
}

void CompressionState::Clear() {
  residuals_.clear();
  // Swapped out: assigning {} (or clear()) would keep the capacity.
  std::vector<uint32_t>().swap(index_scratch_);
  std::vector<uint32_t>().swap(key_scratch_);
  std::vector<uint32_t>().swap(order_scratch_);
}

size_t CompressionState::residual_bytes() const {
  size_t total = 0;
  for (const auto& [name, kept] : residuals_) total += kept.values.size() * sizeof(float);
  return total;
}

Status CheckEncodedBuffer(const void* encoded, size_t bytes, const char* what) {
  if (bytes == 0) return Status::Ok();
  if (encoded == nullptr) return InvalidArgument(std::string(what) + " buffer is null");
  if (reinterpret_cast<uintptr_t>(encoded) % kEncodedAlignment != 0) {
    return InvalidArgument(std::string(what) + " buffer is not aligned to " +
                           std::to_string(kEncodedAlignment) + " bytes");
  }
  return Status::Ok();
}

Status CheckDenseBuffer(const void* dense, DType dtype, size_t count, const char* what) {
  if (count == 0) return Status::Ok();
  if (dense == nullptr) return InvalidArgument(std::string(what) + " buffer is null");
  if (reinterpret_cast<uintptr_t>(dense) % DTypeSize(dtype) != 0) {
    return InvalidArgument(std::string(what) + " buffer is not aligned to its element size (" +
                           DTypeName(dtype) + ")");
  }
  return Status::Ok();
}

Status DecodeSum(const Compressor& compressor, const void* gathered, size_t stride_bytes,
                 int num_ranks, DType dtype, size_t count, void* dense) {
  CONCORD_RETURN_IF_ERROR(compressor.CheckDType(dtype));
  if (num_ranks < 1) return InvalidArgument("DecodeSum needs at least one rank");
  const size_t bytes = compressor.EncodedBytes(dtype, count);
  if (num_ranks > 1 && (stride_bytes < bytes || stride_bytes % kEncodedAlignment != 0)) {
    return InvalidArgument("DecodeSum stride of " + std::to_string(stride_bytes) +
                           " bytes is smaller than the encoded tensor (" + std::to_string(bytes) +
                           ") or not a multiple of " + std::to_string(kEncodedAlignment));
  }
  CONCORD_RETURN_IF_ERROR(CheckDenseBuffer(dense, dtype, count, "dense"));
  if (count > 0) std::memset(dense, 0, count * DTypeSize(dtype));
  const auto* base = static_cast<const uint8_t*>(gathered);
  for (int r = 0; r < num_ranks; ++r) {
    CONCORD_RETURN_IF_ERROR(
        compressor
            .DecodeAccumulate(base + static_cast<size_t>(r) * stride_bytes, dtype, count, dense)
            .WithContext("rank " + std::to_string(r) + "'s share"));
  }
  return Status::Ok();
}

uint64_t WireBytesPerRank(Exchange exchange, size_t encoded_bytes, int world_size) {
  if (world_size <= 1) return 0;
  const uint64_t n = static_cast<uint64_t>(world_size);
  const uint64_t b = encoded_bytes;
  if (exchange == Exchange::kAllgather) return (n - 1) * b;
  return (2 * (n - 1) * b + n - 1) / n;  // rounded up
}

}  // namespace compression
}  // namespace concord
