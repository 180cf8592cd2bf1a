// A bounded LRU cache of built Gloo allreduces, so that steady-state calls (the engine's persistent
// fusion buffer, a tensor reduced every step) reuse one algorithm instead of building one per call.
#pragma once

#include <cstddef>
#include <list>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "backends/gloo/gloo_allreduce.h"
#include "backends/gloo/gloo_context.h"
#include "base/dtype.h"

namespace concord {
namespace gloo_internal {

// The memory an object entry of `count` elements of `dtype` holds, as the cache counts it: its own
// buffer of the data's bytes plus the scratch Gloo 0.5's object allocates for the algorithm (from
// its headers): ring an inbox and an outbox of the data's size (3x the data in all), ring_chunked
// two inboxes of the data's size (3x), halving_doubling one receive buffer of the data's size
// rounded up to whole chunks (about 2x), bcube per-step receive buffers of about the data's size
// (about 2x). kFunction entries hold no memory of their own (0). Every rank computes the same value
// from the same key, so evictions stay in step.
size_t ObjectEntryBytes(AllreduceAlgorithm algorithm, size_t count, DType dtype);

// Why entries are keyed by (algorithm, count, dtype, op) and not by the caller's pointer: Gloo's
// algorithm objects take slots from the context's counter when they are built, and a message is
// delivered to whatever buffer is registered under its slot at the time it arrives. Ranks must
// therefore build, in the same order, objects of the same shape, and a slot must never be bound to
// a second object while a peer may still write to it. Whether a caller's pointer changed is known
// only locally, so it cannot drive builds. Hence:
//   - every rank performs the same sequence of lookups, builds and evictions (keys are values all
//     ranks agree on), so the slot counter advances identically everywhere and every build gets
//     fresh slots (the counter wraps only after 2^30 slots, long after the old objects are gone);
//   - an object algorithm runs over a buffer the entry owns (allocated and first touched once):
//     Run copies the caller's data in and the result out, which costs about a memcpy each way;
//   - the function-style gloo::allreduce uses no slots (it matches messages by tag), so it is kept
//     apart, in its own LRU keyed by the caller's pointer as well: each tensor keeps its own
//     options bound to its memory (rebinding cost about 1 ms per call at 4 MiB, measured), and
//     since those entries own no slots, ranks may build and evict them at different times;
//   - the two kinds run on separate contexts (separate TCP pairs): on one shared pair, a large
//     function-style allreduce after any object algorithm had been built stalled for about a
//     second per call (measured: 16 M floats, 2 ranks, 1.0 s instead of 55 ms).
//
// Bounds: at most max_entries object entries and max_bytes bytes of memory they hold
// (ObjectEntryBytes: the entry's own buffer plus Gloo's scratch, not just the caller's data: with
// only the data counted, 256 entries of 800 KB held about 600 MiB per lane), and at most
// max_entries function-style entries (they own no memory); the least recently used entries are
// destroyed first. One object entry larger than max_bytes is kept alone.
// Not thread-safe: owned and used by the backend's one thread. Run() throws Gloo's exceptions.
class AllreduceCache {
 public:
  // object_context runs the algorithm objects, function_context the function-style allreduce
  // (they may be the same context where only one kind is used).
  AllreduceCache(std::shared_ptr<GlooContext> object_context,
                 std::shared_ptr<GlooContext> function_context, size_t max_entries,
                 size_t max_bytes);
  AllreduceCache(const AllreduceCache&) = delete;
  AllreduceCache& operator=(const AllreduceCache&) = delete;

  // In-place allreduce of data[0, count) with the given algorithm, building it if needed. count > 0
  // (and fits AlgorithmObjectFits(count, DTypeSize(dtype)) unless algorithm is kFunction). Blocks;
  // collective.
  void Run(AllreduceAlgorithm algorithm, void* data, size_t count, DType dtype, ReduceOp op);

  size_t entries() const { return lru_.size() + function_lru_.size(); }
  size_t bytes() const { return bytes_; }    // the object entries' ObjectEntryBytes, summed
  size_t builds() const { return builds_; }  // how many allreduces were built so far

 private:
  using Key = std::tuple<AllreduceAlgorithm, size_t, DType, ReduceOp>;
  struct Entry {
    Key key;
    size_t bytes = 0;       // ObjectEntryBytes
    void* bound = nullptr;  // the buffer the allreduce runs over (owned below, or the caller's)
    std::vector<unsigned char> owned;
    std::unique_ptr<BoundAllreduce> allreduce;
  };

  using FunctionKey = std::tuple<void*, size_t, DType, ReduceOp>;
  struct FunctionEntry {
    FunctionKey key;
    std::unique_ptr<BoundAllreduce> allreduce;
  };

  Entry& Lookup(const Key& key, size_t bytes);
  void RunFunction(void* data, size_t count, DType dtype, ReduceOp op);
  void Build(Entry& entry, void* data);
  void EvictUntilFits(size_t incoming_bytes);

  const std::shared_ptr<GlooContext> object_context_;
  const std::shared_ptr<GlooContext> function_context_;
  const size_t max_entries_;
  const size_t max_bytes_;
  std::list<Entry> lru_;  // most recently used first
  std::map<Key, std::list<Entry>::iterator> index_;
  size_t bytes_ = 0;
  size_t builds_ = 0;
  std::list<FunctionEntry> function_lru_;  // most recently used first
  std::map<FunctionKey, std::list<FunctionEntry>::iterator> function_index_;
};

}  // namespace gloo_internal
}  // namespace concord
