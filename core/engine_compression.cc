// The engine's compressed allreduces: a fused batch of tensors that share one compressor.
//
// Layout: each tensor's encoded bytes start at a multiple of compression::kEncodedAlignment in
// the lane's fusion buffer; every rank computes the same layout from (dtype, count) alone. A
// summable encoding (fp16, bf16) is allreduced as its reduce dtype and decoded; any other (top-k)
// is allgathered, every rank's share decoded and summed into the output. An average divides by
// the world size before encoding (so half-precision sums stay in range); the postscale is applied
// to the decoded result.
//
// On the timeline, the batch's slice holds an "encode" and a "decode" slice (args: bytes, the
// tensors' own; encoded, what was encoded or decoded), around the backend's collective.
//
// Like engine_host_ops.cc, it completes the entries it finishes and returns an error without
// completing any; compressor lookups and encoding hold compression_mu_ (lanes run concurrently).
#include <cstdint>
#include <cstring>

#include "compression/registry.h"
#include "core/engine.h"

namespace concord {
namespace {

size_t AlignUp(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

// Which of the entry's CPU buffers ("input", then "output") is not aligned to its element size,
// or nullptr when both are (or absent, or the tensor is empty).
const char* MisalignedBuffer(const QueueEntry& entry) {
  const size_t esize = DTypeSize(entry.request.dtype);
  if (entry.request.NumElements() == 0) return nullptr;
  if (entry.input != nullptr && reinterpret_cast<uintptr_t>(entry.input) % esize != 0) {
    return "input";
  }
  if (entry.output != nullptr && reinterpret_cast<uintptr_t>(entry.output) % esize != 0) {
    return "output";
  }
  return nullptr;
}

}  // namespace

void Engine::NoteResidualEvictions(uint64_t* counted) {
  if (compression_state_.resets() > 0 && !residual_reset_logged_) {
    residual_reset_logged_ = true;
    Log(LogLevel::kWarning, "top-k: tensor '" + compression_state_.last_reset() +
                                "' came with another element count than before under the same "
                                "name, so its error-feedback residual started again from zero. "
                                "Said once per communicator");
  }
  const uint64_t now = compression_state_.evictions();
  if (now == *counted) return;
  stats_.topk_residual_evictions.fetch_add(now - *counted, std::memory_order_relaxed);
  *counted = now;
  if (residual_eviction_logged_) return;
  residual_eviction_logged_ = true;
  Log(LogLevel::kWarning,
      "top-k: " + std::to_string(compression_state_.max_residuals()) +
          " tensor names already kept an error-feedback residual, so the least recently "
          "compressed one ('" +
          compression_state_.last_evicted() +
          "') was dropped, and it starts from zero if it comes back. Names used once "
          "(allreduces without a name, a new name per call) cannot keep error feedback: give "
          "repeating tensors fixed names, or raise CONCORD_TOPK_RESIDUALS (each eviction is "
          "counted: concord_comm_stats' topk_residual_evictions). Said once per communicator");
}

StatusOr<std::shared_ptr<const compression::Compressor>> Engine::CompressorFor(
    const std::string& spec) {
  MutexLock lock(compression_mu_);
  const uint64_t now = ++compressor_clock_;
  auto it = compressors_.find(spec);
  if (it != compressors_.end()) {
    it->second.last_use = now;
    return it->second.compressor;
  }
  CONCORD_ASSIGN_OR_RETURN(std::unique_ptr<compression::Compressor> made,
                           compression::CreateCompressor(spec));
  std::shared_ptr<const compression::Compressor> shared(std::move(made));
  if (compressors_.size() >= kMaxCachedCompressors) {
    // Forget the least recently used: the entries that hold it keep it alive.
    auto oldest = compressors_.begin();
    for (auto c = compressors_.begin(); c != compressors_.end(); ++c) {
      if (c->second.last_use < oldest->second.last_use) oldest = c;
    }
    compressors_.erase(oldest);
  }
  compressors_.emplace(spec, CachedCompressor{shared, now});
  return shared;
}

size_t Engine::CachedCompressors() const {
  MutexLock lock(compression_mu_);
  return compressors_.size();
}

Status Engine::AttachCompressor(QueueEntry& entry) {
  TensorRequest& r = entry.request;
  // "none" (the default) is no compression at all; other specs go through their compressor.
  const bool reducescatter = r.op == OpType::kReducescatter;
  if ((r.op != OpType::kAllreduce && !reducescatter) || r.compression.empty() ||
      r.compression == "none") {
    r.compression.clear();
    return Status::Ok();
  }
  auto compressor = CompressorFor(r.compression);
  if (!compressor.ok()) return compressor.status().WithContext("tensor '" + r.name + "'");
  // Every rank decides alike: the dtype is negotiated (a difference is a mismatch anyway).
  if ((*compressor)->passes_through(r.dtype)) {
    r.compression.clear();
    return Status::Ok();
  }
  const Status dtype_taken = (*compressor)->CheckDType(r.dtype);
  // The communicator's default applies where its compressor can: not to an integer allreduce
  // under CONCORD_COMPRESSION=fp16, a CUDA tensor (compressors run on the CPU), a tensor top-k
  // cannot index (2^32 elements or more), nor a buffer not aligned to its element size (which
  // the uncompressed path takes). Given explicitly, each of those is refused below.
  if (entry.compression_by_default &&
      (!dtype_taken.ok() || r.device != -1 ||
       !(*compressor)->CheckCount(static_cast<size_t>(r.NumElements())).ok() ||
       MisalignedBuffer(entry) != nullptr)) {
    r.compression.clear();
    return Status::Ok();
  }
  if (!dtype_taken.ok()) return dtype_taken.WithContext("tensor '" + r.name + "'");
  // Ranks compare the canonical spec (an alias of "none" is no compression too).
  r.compression = (*compressor)->spec();
  if (r.compression == "none") {
    r.compression.clear();
    return Status::Ok();
  }
  // A reduce-scatter reduces the encoded blocks on the wire: only a summable encoding fits.
  const bool summable = (*compressor)->exchange() == compression::Exchange::kAllreduce;
  if (reducescatter && !summable) {
    return InvalidArgument("tensor '" + r.name + "': reducescatter takes a summable compression " +
                           "(fp16, bf16), not '" + r.compression + "'");
  }
  // The casts reduce their 16-bit values with the tensor's own operation; top-k adds every rank's
  // share, so a min, max or product would come back as a sum.
  if (!summable && r.reduce_op != ReduceOp::kSum && r.reduce_op != ReduceOp::kAverage) {
    return InvalidArgument("tensor '" + r.name + "': compression '" + r.compression +
                           "' adds the ranks' shares, so it takes sum and average only, not " +
                           ReduceOpName(r.reduce_op) + " (fp16 and bf16 take every reduction)");
  }
  if (Status s = (*compressor)->CheckCount(static_cast<size_t>(r.NumElements())); !s.ok()) {
    return s.WithContext("tensor '" + r.name + "'");
  }
  if (r.device != -1) {
    return Status(Code::kUnavailable, "tensor '" + r.name + "': compression '" + r.compression +
                                          "' runs on CPU tensors only in this version");
  }
  // Compressors read and write whole elements and refuse a misaligned buffer: refuse it here,
  // where nothing has happened yet, not at execution, where it would fail the communicator.
  if (const char* misaligned = MisalignedBuffer(entry); misaligned != nullptr) {
    return InvalidArgument("tensor '" + r.name + "': compression '" + r.compression +
                           "' needs its " + misaligned + " aligned to its element size (" +
                           std::to_string(DTypeSize(r.dtype)) + " bytes, " + DTypeName(r.dtype) +
                           ")");
  }
  entry.compressor = std::move(*compressor);
  return Status::Ok();
}

Status Engine::RunCompressed(Lane& lane, const FusionBatch& batch, const Responses& responses,
                             Entries& entries) {
  const TensorRequest& q = responses[batch.members.front()]->request;
  // Every member must carry the compressor the coordinator agreed on.
  for (size_t i : batch.members) {
    const QueueEntry& e = *entries[i];
    if (!e.compressor || e.compressor->spec() != q.compression) {
      return Internal("tensor '" + e.request.name + "' has no compressor for '" + q.compression +
                      "'");
    }
  }
  const compression::Compressor& compressor = *entries[batch.members.front()]->compressor;
  const int track = Timeline::kLaneTrack + LaneIndex(lane);
  const bool traced = timeline_->on();
  const Clock::time_point start = traced ? Clock::now() : Clock::time_point();
  std::vector<size_t> offsets, encoded;
  size_t total = 0;
  for (size_t i : batch.members) {
    const size_t n = static_cast<size_t>(entries[i]->request.NumElements());
    total = AlignUp(total, compression::kEncodedAlignment);
    offsets.push_back(total);
    encoded.push_back(compressor.EncodedBytes(q.dtype, n));
    total += encoded.back();
  }
  const compression::Exchange exchange = compressor.exchange();
  const bool summed = exchange == compression::Exchange::kAllreduce;
  const size_t unit =
      summed ? DTypeSize(compressor.reduce_dtype(q.dtype)) : compression::kEncodedAlignment;
  total = AlignUp(std::max<size_t>(total, 1), unit);
  uint8_t* buffer = lane.fusion.Get(total, fusion_.threshold);
  // The gaps between encoded tensors are reduced or gathered (never decoded): zero them.
  size_t end = 0;
  for (size_t k = 0; k <= offsets.size(); ++k) {
    const size_t next = k < offsets.size() ? offsets[k] : total;
    if (next > end) std::memset(buffer + end, 0, next - end);
    if (k < offsets.size()) end = offsets[k] + encoded[k];
  }

  double scale = q.prescale;
  if (q.reduce_op == ReduceOp::kAverage) {
    scale /= responses[batch.members.front()]->Contributors(config_.size);
  }
  {
    // One CompressionState per communicator: its residuals and scratch are not thread-safe.
    MutexLock lock(compression_mu_);
    if (!summed) {
      // Selection needs up to an index, a key and an order entry per element of a tensor.
      const size_t scratch = TopkScratchBytes();
      for (size_t i : batch.members) {
        topk_scratch_trim_.Use(
            3 * sizeof(uint32_t) * static_cast<size_t>(entries[i]->request.NumElements()), scratch);
      }
    }
    uint64_t evictions = compression_state_.evictions();
    for (size_t k = 0; k < batch.members.size(); ++k) {
      const QueueEntry& e = *entries[batch.members[k]];
      compression::EncodeInput in;
      in.name = e.request.name;
      in.dtype = q.dtype;
      in.count = static_cast<size_t>(e.request.NumElements());
      in.data = e.input;
      in.scale = scale;
      // A joined rank's stand-in sends the identity (zeros): not the residual its name keeps,
      // which is its own gradients' and would land in an average that divides by the others.
      compression::CompressionState stand_in_state(1);
      Status s = compressor.Encode(in, buffer + offsets[k],
                                   e.stand_in ? &stand_in_state : &compression_state_);
      NoteResidualEvictions(&evictions);
      if (!s.ok()) return s.WithContext("encoding tensor '" + e.request.name + "'");
    }
  }
  if (traced) {
    timeline_->Slice(track, "encode", start, Clock::now(), batch.bytes, nullptr,
                     "\"encoded\":" + std::to_string(total));
  }

  const uint8_t* shares = buffer;
  Status s;
  if (summed) {
    const DType rd = compressor.reduce_dtype(q.dtype);
    s = Reductions(lane).Allreduce(buffer, total / DTypeSize(rd), rd, WireReduceOp(q.reduce_op));
  } else {
    uint8_t* gathered = lane.gather.Get(total * config_.size,
                                        fusion_.threshold * static_cast<size_t>(config_.size));
    s = lane.backend->Allgatherv(buffer, gathered, std::vector<size_t>(config_.size, total));
    shares = gathered;
  }
  CONCORD_RETURN_IF_ERROR(s);
  metrics_->RecordCompression(batch.bytes, total);
  const Clock::time_point exchanged = traced ? Clock::now() : Clock::time_point();

  for (size_t k = 0; k < batch.members.size(); ++k) {
    QueueEntry& e = *entries[batch.members[k]];
    const size_t n = static_cast<size_t>(e.request.NumElements());
    Status d = summed ? compressor.Decode(shares + offsets[k], q.dtype, n, e.output)
                      : compression::DecodeSum(compressor, shares + offsets[k], total, config_.size,
                                               q.dtype, n, e.output);
    if (!d.ok()) return d.WithContext("decoding tensor '" + e.request.name + "'");
    if (q.postscale != 1.0) ScaleElements(e.output, n, q.dtype, q.postscale);
    e.state->AddWireBytes(compression::WireBytesPerRank(exchange, encoded[k], config_.size));
    Finish(entries[batch.members[k]], Status::Ok());
  }
  if (traced) {  // every rank's shares when gathered
    const size_t decoded = summed ? total : total * static_cast<size_t>(config_.size);
    timeline_->Slice(track, "decode", exchanged, Clock::now(), batch.bytes, nullptr,
                     "\"encoded\":" + std::to_string(decoded));
  }
  return Status::Ok();
}

}  // namespace concord
