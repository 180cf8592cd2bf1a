// The tensor queue: operations the application enqueued, keyed by name, from enqueue until the
// engine completes them. A name can be in flight once at a time.
//
// Thread-safety: Push() from any thread; everything else from the thread running the engine's step
// (core/progress_driver.h). Push() calls the
// wake function (outside the lock) so the engine notices new work at once.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "compression/compressor.h"
#include "core/request.h"
#include "core/request_state.h"

namespace concord {

// One enqueued operation: what to negotiate, where the data is, and whom to tell.
struct QueueEntry {
  TensorRequest request;
  const void* input = nullptr;
  void* output = nullptr;  // allreduce/broadcast: == input when in place
  // allgather, alltoall: bytes available at output (output may be null: the request owns the
  // result); reducescatter: bytes at output (which must hold this rank's share)
  size_t output_capacity = 0;
  // Device tensors only: what the operation waits for before it reads the input (void*: a
  // cudaStream_t whose queued work must finish, a cudaEvent_t); null when nothing. Once enqueued
  // (Engine::CheckDevice), ready_event is `ready`'s, which captured the caller's stream and event
  // then (DeviceBackend::CaptureReady), and ready_stream is null.
  void* ready_stream = nullptr;
  void* ready_event = nullptr;
  std::shared_ptr<void> ready;
  std::shared_ptr<RequestState> state;
  // The application's step when it was enqueued (Engine::EndStep); negotiated, never cached.
  uint64_t step = 0;
  // request.compression's compressor (set by Engine::Enqueue; null when uncompressed).
  std::shared_ptr<const compression::Compressor> compressor;
  // request.compression is the communicator's default (CONCORD_COMPRESSION), not the caller's:
  // a dtype its compressor does not take travels uncompressed instead of being refused.
  bool compression_by_default = false;
  // A joined rank's stand-in (Engine::JoinedEntry): it contributes the identity, so its compressor
  // encodes without the rank's state (no residual of its own goes into the others' reduction).
  bool stand_in = false;
};

class TensorQueue {
 public:
  explicit TensorQueue(std::function<void()> wake) : wake_(std::move(wake)) {}

  // Adds all entries or none: kInvalidArgument when a name is already in flight or repeats in
  // `entries`; `closed` status once the queue was closed. Calls the wake function unless `wake`
  // is false (the caller makes sure the engine steps). A barrier without a name gets the next
  // NextBarrierName() once it is accepted, so a refused push (or a refused group) takes no
  // number: barrier numbers are the ranks' only way to match barriers, so they must advance
  // alike on every rank. Entries with a group_size and no group are one group, named then by its
  // first member's name and its size.
  Status Push(std::vector<QueueEntry> entries, bool wake = true);
  // "__concord.barrier.<N>", N counting from 0 for this queue (named barriers and Push's alike).
  std::string NextBarrierName();

  // A request pushed since the last PopNew(), with its input (valid while it is in flight).
  struct Fresh {
    TensorRequest request;
    const void* input = nullptr;
    uint64_t step = 0;
  };
  // Requests pushed since the last call, in push order (their entries stay in flight).
  std::vector<Fresh> PopNew();
  // Whether PopNew() would return something, and when the oldest of those was pushed.
  std::optional<Clock::time_point> OldestNew() const;

  // Makes PopNew() return these in-flight entries again (their requests must be sent again);
  // names no longer in flight, or that PopNew() returns already, are skipped. Calls the wake
  // function.
  void Resubmit(const std::vector<std::string>& names);

  // Removes and returns the in-flight entry for name; PopNew() does not return it (a response
  // may run an entry resubmitted in the same step, before its request was sent again).
  std::optional<QueueEntry> Take(const std::string& name);

  // Refuses later pushes with `status` and returns every entry in flight, for the engine to fail.
  std::vector<QueueEntry> Close(const Status& status);

  size_t in_flight() const;

 private:
  mutable Mutex mu_;
  const std::function<void()> wake_;  // called without mu_
  // An entry in flight, and whether its name is in fresh_.
  struct Slot {
    QueueEntry entry;
    bool fresh = false;
  };
  std::unordered_map<std::string, Slot> table_ GUARDED_BY(mu_);
  std::vector<std::string> fresh_ GUARDED_BY(mu_);  // what PopNew() returns, each name once
  std::optional<Clock::time_point> oldest_fresh_ GUARDED_BY(mu_);
  Status closed_ GUARDED_BY(mu_);
  uint64_t barrier_seq_ GUARDED_BY(mu_) = 0;
};

}  // namespace concord
