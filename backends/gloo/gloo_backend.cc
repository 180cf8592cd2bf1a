#include "backends/gloo/gloo_backend.h"

#include <gloo/types.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "backends/gloo/allreduce_cache.h"
#include "backends/gloo/gloo_allreduce.h"
#include "backends/gloo/gloo_context.h"
#include "backends/gloo/in_flight.h"
#include "backends/gloo/ordered_reductions.h"
#include "backends/gloo/ring_reduce_scatter.h"
#include "backends/gloo/span_allreduce.h"

namespace concord {
namespace {

using gloo_internal::AllreduceAlgorithm;

// How errors name rank r: as the job knows it (BackendOptions::rank_names), else by its number
// here.
std::string RankName(const std::vector<int>& rank_names, int r) {
  const bool named = r >= 0 && static_cast<size_t>(r) < rank_names.size();
  return "rank " + std::to_string(named ? rank_names[r] : r);
}

// Cache bounds, per lane: enough for the fusion buffer's size classes plus the large tensors of a
// big model (each reduced on its own, in place, every step). The bytes are what the algorithm
// objects hold (ObjectEntryBytes: about 2x the data under auto, which builds objects below 1 MiB
// only): 128 tensors of 1 MiB, or 256 of 512 KiB. RSS runs about 1.4x the bytes counted (the
// allocator's share): allreduces of 300 sizes of 800 KB at 3 ranks, shared memory off (one lane's
// cache), held 625 MiB of RSS while the bytes counted only the data (256 entries), 410 MiB now.
constexpr size_t kMaxCachedAllreduces = 256;
constexpr size_t kMaxCachedBytes = size_t{256} << 20;

// AllreduceSpans' messages: a slot of its own on the function-style context (Gloo's collectives
// use prefixes 0x01-0x08 there).
const uint64_t kSpanSlot = gloo::Slot::build(0x43, 0);
// The segments of the span ring and the ring reduce-scatter (RingSegmentBytes).
constexpr size_t kRingSegmentMinBytes = size_t{256} << 10;
constexpr size_t kRingSegmentMaxBytes = size_t{4} << 20;
// The ordered reductions' largest segment, and the bound on their scratch (OrderedSetup).
constexpr size_t kOrderedSegmentBytes = size_t{4} << 20;
constexpr size_t kOrderedScratchBytes = size_t{32} << 20;

// The segment of a ring step that passes blocks of `block_bytes`: half a block, as Gloo's own ring
// cuts them (two segments per block, one on the wire while the other is reduced), within
// [kRingSegmentMinBytes, kRingSegmentMaxBytes]. Over TCP a segment is sent only once its receiver
// has posted it, so each one costs a notification's round trip: fixed 256 KiB segments made 4-64
// MiB reduce-scatters 28-44% slower with ranks bound to cores, and a 4-rank allreduce of four
// 2 MiB tensors 18% slower (docs/performance.md). The bound keeps the scratch (two segments) at
// 8 MiB.
size_t RingSegmentBytes(size_t block_bytes) {
  return std::clamp(block_bytes / 2, kRingSegmentMinBytes, kRingSegmentMaxBytes);
}

// ReduceScatter's messages, on a slot of their own on the same context.
const uint64_t kReduceScatterSlot = gloo::Slot::build(0x44, 0);
// Alltoallv's, Allgatherv's, Broadcast's and Barrier's, likewise.
const uint64_t kAlltoallvSlot = gloo::Slot::build(0x45, 0);
const uint64_t kAllgathervSlot = gloo::Slot::build(0x46, 0);
const uint64_t kBroadcastSlot = gloo::Slot::build(0x47, 0);
const uint64_t kBarrierSlot = gloo::Slot::build(0x48, 0);
// Below this many input bytes a reduce-scatter is latency-bound: it runs as an allreduce (Gloo's
// algorithm for the size, see AutoAlgorithm) of a copy of the input, of which this rank keeps its
// block. The ring's size - 1 dependent steps cost more there than the extra bytes: at 4 KiB and 2
// ranks the ring's wake-ups took 0.09 ms, or a scheduler slice (4 ms) in about half the calls on a
// loaded 2-core machine, while an allreduce is one exchange.
constexpr size_t kSmallReduceScatterBytes = size_t{256} << 10;

// Algorithm choice for "auto", by message bytes. Measured with perf/gloo_algos (raw Gloo: object
// or options built once over a persistent buffer; float32 sum; ranks as threads over loopback on
// the project's 2-core build machine, which other builds were loading: expect +-30%). Median ms:
//
//   2 ranks      ring   ring_chunked  halving_doubling  bcube  allreduce (function-style)
//   4 KiB       0.096      0.136          0.152         0.204      0.168
//   64 KiB      0.108      0.251          0.175         0.186      0.328
//   256 KiB     0.289      0.311          0.275         0.353      0.416
//   1 MiB       0.895      0.787          0.696         0.604      0.581
//   4 MiB       3.68       7.19           2.60          3.75       2.23
//   16 MiB     20.6       24.6           11.6          18.6       10.9
//   64 MiB     67.7       64.0           64.6          55.9       48.8
//   4 ranks
//   4 KiB       0.305      4.35           2.79          0.389      1.27
//   64 KiB      0.591      5.00           0.627         0.390      2.54
//   256 KiB     1.43       4.33           0.849         0.945      2.20
//   1 MiB       5.12       6.94           3.10          3.68       3.00
//   4 MiB      17.1        8.70           (failed)      6.37       5.17
//
// Remeasured on a quiet machine with concord-perf (2 ranks, medians of 30 back-to-back runs, us):
//   bytes      ring  ring_chunked  halving_doubling  allreduce
//   4 KiB        85       188            140            234
//   64 KiB       78       197            204            217
//   256 KiB     213       347            308            220
//   1 MiB       773       684            717            451
// Hence, with 2 ranks: ring below 256 KiB, the function-style allreduce above (ring and it are
// level at 256 KiB, and in Concord ring pays a copy each way: a 384 KiB allreduce took 447-460 us
// with ring, 248-294 us with the function-style allreduce; raw Gloo 240-290 us). With more ranks:
// ring (integers) or halving-doubling (floats, see below) below 128 KiB, halving-doubling up to
// 1 MiB, the function-style allreduce above.
// The function-style allreduce also reduces the caller's buffer in place, while object algorithms
// run over the cache's own buffer and add a copy each way (see allreduce_cache.h), which widens its
// lead at large sizes. Contrary to an earlier measurement with a new gloo::allreduce per call,
// a function-style allreduce whose options are reused beats ring_chunked at 64 MiB here.
//
// Replicas must stay bit-identical: Gloo's plain ring lets every rank accumulate the others'
// contributions in its own order, so above 2 ranks its floating-point sums differ between ranks
// (GlooBitIdenticalTest). There small messages take halving-doubling, which reduces each element
// once and distributes the result. bcube, fastest at 4 ranks in the table, is never used: it gave
// wrong sums intermittently (see CreateGlooBackend).
AllreduceAlgorithm AutoAlgorithm(size_t bytes, int size, DType dtype) {
  if (size <= 2) {
    return bytes < (size_t{256} << 10) ? AllreduceAlgorithm::kRing : AllreduceAlgorithm::kFunction;
  }
  if (bytes < (size_t{128} << 10)) {
    return IsFloatingPoint(dtype) ? AllreduceAlgorithm::kHalvingDoubling
                                  : AllreduceAlgorithm::kRing;
  }
  if (bytes < (size_t{1} << 20)) return AllreduceAlgorithm::kHalvingDoubling;
  return AllreduceAlgorithm::kFunction;
}

// A small reduce-scatter's algorithm (kSmallReduceScatterBytes): the allreduce's, so named.
const char* SmallReduceScatterName(AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllreduceAlgorithm::kRing:
      return "allreduce:ring";
    case AllreduceAlgorithm::kRingChunked:
      return "allreduce:ring_chunked";
    case AllreduceAlgorithm::kHalvingDoubling:
      return "allreduce:halving_doubling";
    case AllreduceAlgorithm::kBcube:
      return "allreduce:bcube";
    case AllreduceAlgorithm::kFunction:
      return "allreduce:allreduce";
  }
  return "allreduce";
}

// Gloo over TCP. Owns two Gloo contexts (each with its pairs and device event-loop thread): one
// for the cached algorithm objects, one for everything function-style (allreduce, allgatherv,
// broadcast, barrier), which must not share pairs with the objects (see allreduce_cache.h), and a
// cache of built allreduces. Follows backend.h: one thread calls it, every call is collective and
// blocking with the configured timeout, and after the first failure every call returns that
// failure. size == 1 has no context at all: collectives are local copies or nothing. Errors name
// ranks by BackendOptions::rank_names when given (a hierarchical backend's one across hosts).
// Shutdown: a collective may return while Gloo still flushes its last bytes to a slower peer, so
// ranks should pass a Barrier() before destroying their backends (a peer cut off early sees
// "connection closed" on that collective).
class GlooBackend : public Backend {
 public:
  GlooBackend(const BackendOptions& options,
              std::shared_ptr<gloo_internal::GlooContext> object_context,
              std::shared_ptr<gloo_internal::GlooContext> context, bool auto_algorithm,
              AllreduceAlgorithm forced)
      : rank_(options.rank),
        size_(options.size),
        rank_names_(options.rank_names),
        object_context_(std::move(object_context)),
        context_(std::move(context)),
        auto_algorithm_(auto_algorithm),
        forced_(forced) {
    if (context_) {
      cache_ = std::make_unique<gloo_internal::AllreduceCache>(
          object_context_, context_, kMaxCachedAllreduces, kMaxCachedBytes);
    }
  }

  ~GlooBackend() override {
    // Algorithm objects unregister from the pairs, so they go before the context.
    cache_.reset();
  }

  const char* name() const override { return "gloo"; }

  // Aborts the waits of Concord's own collectives (span allreduce, reduce-scatter, ordered
  // reductions, all-to-all, allgather, broadcast, barrier); Gloo's own ones (allreduces of one
  // buffer) keep to their errors and timeout (their buffers are out of reach): a dead peer's
  // connections resetting fails them promptly (mp_kill_rank1_noshm_allreduce_np3).
  std::function<void()> Interrupter() override {
    return [in_flight = in_flight_] { in_flight->Interrupt(); };
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Allreduces: the Gloo algorithm's name (AllreduceAlgorithmName: "allreduce" is the
  // function-style one), "span_ring" for several buffers; allgathers "ring", broadcasts "tree",
  // reduce-scatters "ring" or, when small, "allreduce:" and the allreduce's; reductions folded in
  // rank order (OrderedAllreduce, OrderedReduceScatter) "ordered"; all-to-alls "pairwise"; "local"
  // with one rank or no data. Barriers: nullptr.
  const char* LastAlgorithm() const override { return last_algorithm_; }

  Status Allreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    CONCORD_RETURN_IF_ERROR(CheckAllreduce(data, count, dtype, op));
    if (count == 0 || size_ == 1) return Status::Ok();
    const AllreduceAlgorithm algorithm = Choose(count, dtype);
    last_algorithm_ = gloo_internal::AllreduceAlgorithmName(algorithm);
    try {
      cache_->Run(algorithm, data, count, dtype, op);
      return Status::Ok();
    } catch (...) {
      return Fail("allreduce (" + std::to_string(count) + " x " + DTypeName(dtype) + ", " +
                  ReduceOpName(op) + ", " + gloo_internal::AllreduceAlgorithmName(algorithm) + ")");
    }
  }

  Status AllreduceSpans(const std::vector<AllreduceSpan>& spans, DType dtype,
                        ReduceOp op) override {
    if (!IsValidDType(static_cast<int>(dtype)) || !IsValidReduceOp(static_cast<int>(op))) {
      return InvalidArgument("gloo allreduce: invalid dtype or reduce op");
    }
    size_t total = 0;
    const AllreduceSpan* only = nullptr;  // the one non-empty span, if there is just one
    for (const AllreduceSpan& s : spans) {
      if (s.count > 0 && s.data == nullptr) return InvalidArgument("gloo allreduce: data is null");
      if (s.count > 0) only = total == 0 ? &s : nullptr;
      total += s.count;
    }
    if (!failed_.ok()) return failed_;
    last_algorithm_ = "local";
    if (total == 0 || size_ == 1) return Status::Ok();
    // One buffer takes Gloo's own algorithms, chosen by size (see AutoAlgorithm).
    if (only != nullptr) return Allreduce(only->data, only->count, dtype, op);
    last_algorithm_ = "span_ring";
    try {
      const size_t block_bytes = total / static_cast<size_t>(size_) * DTypeSize(dtype);
      gloo_internal::SpanRingAllreduce(context_, spans, dtype, op, kSpanSlot,
                                       RingSegmentBytes(block_bytes), &span_scratch_,
                                       in_flight_.get());
      return Status::Ok();
    } catch (...) {
      return Fail("allreduce of " + std::to_string(spans.size()) + " buffers (" +
                  std::to_string(total) + " x " + DTypeName(dtype) + ", " + ReduceOpName(op) +
                  ", span ring)");
    }
  }

  Status Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes_per_rank) override {
    if (bytes_per_rank.size() != static_cast<size_t>(size_)) {
      return InvalidArgument("gloo allgatherv: " + std::to_string(bytes_per_rank.size()) +
                             " sizes for " + std::to_string(size_) + " ranks");
    }
    const size_t total = std::accumulate(bytes_per_rank.begin(), bytes_per_rank.end(), size_t{0});
    const size_t mine = bytes_per_rank[rank_];
    if ((mine > 0 && in == nullptr) || (total > 0 && out == nullptr)) {
      return InvalidArgument("gloo allgatherv: null buffer");
    }
    if (!failed_.ok()) return failed_;
    last_algorithm_ = "local";
    if (total == 0) return Status::Ok();
    if (size_ == 1) {
      std::memmove(out, in, mine);
      return Status::Ok();
    }
    last_algorithm_ = "ring";  // every block passes around the ring, as in gloo::allgatherv
    try {
      gloo_internal::InterruptibleAllgatherv(context_, in, out, bytes_per_rank, kAllgathervSlot,
                                             in_flight_.get());
      return Status::Ok();
    } catch (...) {
      return Fail("allgatherv (" + std::to_string(total) + " bytes)");
    }
  }

  Status Broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size_) {
      return InvalidArgument("gloo broadcast: root " + std::to_string(root) + " out of range");
    }
    if (bytes > 0 && data == nullptr) return InvalidArgument("gloo broadcast: data is null");
    if (!failed_.ok()) return failed_;
    last_algorithm_ = "local";
    if (bytes == 0 || size_ == 1) return Status::Ok();
    last_algorithm_ = "tree";  // a binomial tree from the root, as gloo::broadcast's
    try {
      gloo_internal::InterruptibleBroadcast(context_, data, bytes, root, kBroadcastSlot,
                                            in_flight_.get());
      return Status::Ok();
    } catch (...) {
      return Fail("broadcast (" + std::to_string(bytes) + " bytes from " +
                  RankName(rank_names_, root) + ")");
    }
  }

  Status Barrier() override {
    if (!failed_.ok()) return failed_;
    last_algorithm_ = nullptr;
    if (size_ == 1) return Status::Ok();
    try {
      gloo_internal::InterruptibleBarrier(context_, kBarrierSlot, in_flight_.get());
      return Status::Ok();
    } catch (...) {
      return Fail("barrier");
    }
  }

  Status ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                       ReduceOp op) override {
    CONCORD_RETURN_IF_ERROR(CheckReduceScatter(in, out, counts, dtype, op));
    if (size_ == 1) return Status::Ok();
    const size_t total = Total(counts);
    const size_t esize = DTypeSize(dtype);
    if (total * esize < kSmallReduceScatterBytes) {
      if (total == 0) return Status::Ok();
      small_scratch_.resize(std::max(small_scratch_.size(), total * esize));
      std::memcpy(small_scratch_.data(), in, total * esize);
      CONCORD_RETURN_IF_ERROR(Allreduce(small_scratch_.data(), total, dtype, op));
      last_algorithm_ = SmallReduceScatterName(Choose(total, dtype));
      size_t first = 0;
      for (int r = 0; r < rank_; ++r) first += counts[r];
      if (counts[rank_] > 0) {
        std::memcpy(out, small_scratch_.data() + first * esize, counts[rank_] * esize);
      }
      return Status::Ok();
    }
    last_algorithm_ = "ring";
    try {
      const size_t largest = *std::max_element(counts.begin(), counts.end());
      gloo_internal::RingReduceScatter(context_, in, out, counts, dtype, op, kReduceScatterSlot,
                                       RingSegmentBytes(largest * esize), &span_scratch_,
                                       in_flight_.get());
      return Status::Ok();
    } catch (...) {
      return Fail("reduce-scatter (" + std::to_string(total) + " x " + DTypeName(dtype) + ", " +
                  ReduceOpName(op) + ")");
    }
  }

  bool HasOrderedReductions() const override { return true; }

  Status OrderedReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                              DType dtype, ReduceOp op) override {
    CONCORD_RETURN_IF_ERROR(CheckReduceScatter(in, out, counts, dtype, op));
    if (size_ == 1 || Total(counts) == 0) return Status::Ok();
    last_algorithm_ = "ordered";
    try {
      gloo_internal::OrderedReduceScatter(context_, in, out, counts, dtype, op, OrderedSetup());
      return Status::Ok();
    } catch (...) {
      return Fail("ordered reduce-scatter (" + std::to_string(Total(counts)) + " x " +
                  DTypeName(dtype) + ", " + ReduceOpName(op) + ")");
    }
  }

  Status OrderedAllreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    CONCORD_RETURN_IF_ERROR(CheckAllreduce(data, count, dtype, op));
    if (count == 0 || size_ == 1) return Status::Ok();
    last_algorithm_ = "ordered";
    try {
      gloo_internal::OrderedAllreduce(context_, data, count, dtype, op, OrderedSetup());
      return Status::Ok();
    } catch (...) {
      return Fail("ordered allreduce (" + std::to_string(count) + " x " + DTypeName(dtype) + ", " +
                  ReduceOpName(op) + ")");
    }
  }

  Status Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes) override {
    if (send_bytes.size() != static_cast<size_t>(size_) ||
        recv_bytes.size() != static_cast<size_t>(size_)) {
      return InvalidArgument("gloo alltoallv: sizes for " + std::to_string(send_bytes.size()) +
                             " and " + std::to_string(recv_bytes.size()) + " ranks, not " +
                             std::to_string(size_));
    }
    const size_t sent = std::accumulate(send_bytes.begin(), send_bytes.end(), size_t{0});
    const size_t received = std::accumulate(recv_bytes.begin(), recv_bytes.end(), size_t{0});
    if ((sent > 0 && in == nullptr) || (received > 0 && out == nullptr)) {
      return InvalidArgument("gloo alltoallv: null buffer");
    }
    if (!failed_.ok()) return failed_;
    last_algorithm_ = "local";
    if (size_ == 1) {
      if (sent > 0) std::memmove(out, in, sent);
      return Status::Ok();
    }
    last_algorithm_ = "pairwise";
    try {
      // Gloo's alltoallv, in bytes, on buffers that Interrupter() can reach.
      gloo_internal::InterruptibleAlltoallv(context_, in, send_bytes, out, recv_bytes,
                                            kAlltoallvSlot, in_flight_.get());
      return Status::Ok();
    } catch (...) {
      return Fail("alltoallv (" + std::to_string(sent) + " bytes out, " + std::to_string(received) +
                  " in)");
    }
  }

 private:
  // The forced or automatic choice, replaced where Gloo cannot run it (see AlgorithmSupports) by
  // halving-doubling, else by the function-style allreduce (both bit-identical on every rank).
  AllreduceAlgorithm Choose(size_t count, DType dtype) const {
    const AllreduceAlgorithm wanted =
        auto_algorithm_ ? AutoAlgorithm(count * DTypeSize(dtype), size_, dtype) : forced_;
    const size_t element_bytes = DTypeSize(dtype);
    if (gloo_internal::AlgorithmSupports(wanted, size_, count, element_bytes)) return wanted;
    if (gloo_internal::AlgorithmSupports(AllreduceAlgorithm::kHalvingDoubling, size_, count,
                                         element_bytes)) {
      return AllreduceAlgorithm::kHalvingDoubling;
    }
    return AllreduceAlgorithm::kFunction;
  }

  // The ordered reductions' slots, segments (as the span ring's) and scratch.
  gloo_internal::OrderedRun OrderedSetup() {
    gloo_internal::OrderedRun run;
    run.fold_slot = kReduceScatterSlot;
    run.gather_slot = kAllgathervSlot;
    // Large segments, as Gloo's own allreduce (1 MiB there): over TCP each segment waits for its
    // receiver, and 256 KiB ones cost deterministic mode 15-25% over the default at 3 and 4 ranks
    // (4 MiB: 0-15%; docs/performance.md). The scratch, two segments per peer, stays <= 32 MiB.
    run.segment_bytes = std::clamp(kOrderedScratchBytes / (2 * static_cast<size_t>(size_ - 1)),
                                   kRingSegmentMinBytes, kOrderedSegmentBytes);
    run.scratch = &span_scratch_;
    run.in_flight = in_flight_.get();
    return run;
  }

  static size_t Total(const std::vector<size_t>& counts) {
    return std::accumulate(counts.begin(), counts.end(), size_t{0});
  }

  // An allreduce's arguments, and the failure of an earlier call. Sets last_algorithm_ "local".
  Status CheckAllreduce(const void* data, size_t count, DType dtype, ReduceOp op) {
    if (!IsValidDType(static_cast<int>(dtype)) || !IsValidReduceOp(static_cast<int>(op))) {
      return InvalidArgument("gloo allreduce: invalid dtype or reduce op");
    }
    if (count > 0 && data == nullptr) return InvalidArgument("gloo allreduce: data is null");
    if (!failed_.ok()) return failed_;
    last_algorithm_ = "local";
    return Status::Ok();
  }

  // A reduce-scatter's arguments, and the failure of an earlier call; with one rank (no context)
  // the reduce-scatter itself: the block is the input. Sets last_algorithm_ "local".
  Status CheckReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                            DType dtype, ReduceOp op) {
    if (!IsValidDType(static_cast<int>(dtype)) || !IsValidReduceOp(static_cast<int>(op))) {
      return InvalidArgument("gloo reduce-scatter: invalid dtype or reduce op");
    }
    if (counts.size() != static_cast<size_t>(size_)) {
      return InvalidArgument("gloo reduce-scatter: " + std::to_string(counts.size()) +
                             " counts for " + std::to_string(size_) + " ranks");
    }
    const size_t total = Total(counts);
    if ((total > 0 && in == nullptr) || (counts[rank_] > 0 && out == nullptr)) {
      return InvalidArgument("gloo reduce-scatter: null buffer");
    }
    if (!failed_.ok()) return failed_;
    last_algorithm_ = "local";
    if (size_ == 1 && total > 0) std::memcpy(out, in, total * DTypeSize(dtype));
    return Status::Ok();
  }

  // Records the exception in flight as this backend's permanent failure and returns it.
  Status Fail(const std::string& operation) {
    failed_ =
        gloo_internal::CurrentExceptionToStatus(operation + " on " + RankName(rank_names_, rank_));
    return failed_;
  }

  const int rank_;
  const int size_;
  const std::vector<int> rank_names_;  // BackendOptions::rank_names
  const std::shared_ptr<gloo_internal::GlooContext> object_context_;
  const std::shared_ptr<gloo_internal::GlooContext> context_;
  std::unique_ptr<gloo_internal::AllreduceCache> cache_;
  const bool auto_algorithm_;
  const AllreduceAlgorithm forced_;
  std::vector<uint8_t> span_scratch_;   // SpanRingAllreduce's and RingReduceScatter's scratch
  std::vector<uint8_t> small_scratch_;  // a small reduce-scatter's input, allreduced
  // The buffers of the span allreduce, reduce-scatter, all-to-all, allgather or broadcast running,
  // for Interrupter().
  const std::shared_ptr<gloo_internal::InFlight> in_flight_ =
      std::make_shared<gloo_internal::InFlight>();
  Status failed_;
  const char* last_algorithm_ = nullptr;  // LastAlgorithm()
};

}  // namespace

StatusOr<std::unique_ptr<Backend>> CreateGlooBackend(const BackendOptions& options, Store* store,
                                                     gloo_internal::GlooTransport transport) {
  CONCORD_RETURN_IF_ERROR(gloo_internal::CheckTransportAvailable(transport));
  bool auto_algorithm = options.algorithm == "auto" || options.algorithm.empty();
  AllreduceAlgorithm forced = AllreduceAlgorithm::kRing;
  if (!auto_algorithm) {
    CONCORD_ASSIGN_OR_RETURN(forced, gloo_internal::ParseAllreduceAlgorithm(options.algorithm));
    if (forced == AllreduceAlgorithm::kBcube) {
      // Kept for raw benchmarks (perf/gloo_raw) only: with 4 ranks and many cached objects,
      // Debian's Gloo 0.5.0 AllreduceBcube intermittently returned wrong sums (odd counts, e.g.
      // 4099 float16 elements; tests/mp conformance at 4 ranks).
      return InvalidArgument(
          "gloo: the bcube allreduce is not offered (it gave wrong results intermittently with "
          "Gloo 0.5.0 at 4 ranks); use ring, ring_chunked, halving_doubling or allreduce");
    }
  }
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return InvalidArgument("gloo: rank " + std::to_string(options.rank) +
                           " out of range for size " + std::to_string(options.size));
  }
  std::shared_ptr<gloo_internal::GlooContext> object_context, context;
  if (options.size > 1) {
    gloo_internal::GlooConnectOptions connect;
    connect.transport = transport;
    connect.rank = options.rank;
    connect.size = options.size;
    connect.iface = options.iface;
    connect.host = options.host;
    connect.timeout = options.timeout;
    // Gloo's connect errors number the ranks its own way: with rank_names, they say whose.
    std::string named;
    for (size_t r = 0; r < options.rank_names.size(); ++r) {
      named += (r == 0 ? "" : ", ") + std::to_string(options.rank_names[r]);
    }
    auto connect_named = [&](const std::string& prefix) {
      connect.prefix = options.prefix + prefix;
      auto connected = gloo_internal::ConnectGloo(connect, store);
      if (connected.ok() || named.empty()) return connected;
      return StatusOr<std::shared_ptr<gloo_internal::GlooContext>>(connected.status().WithContext(
          RankName(options.rank_names, options.rank) + ", as rank " + std::to_string(options.rank) +
          " of gloo among ranks " + named));
    };
    CONCORD_ASSIGN_OR_RETURN(object_context, connect_named("/objects"));
    CONCORD_ASSIGN_OR_RETURN(context, connect_named("/functions"));
  }
  return std::unique_ptr<Backend>(std::make_unique<GlooBackend>(
      options, std::move(object_context), std::move(context), auto_algorithm, forced));
}

}  // namespace concord
