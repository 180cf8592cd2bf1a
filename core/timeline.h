// A communicator's timeline: where the time of its operations goes, written as a Chrome Trace
// Event JSON file (Perfetto and chrome://tracing open it) while the engine runs.
//
// Started by CONCORD_TIMELINE=path (a world communicator, from init to finalize) or
// concord_timeline_start(comm, path) (any communicator, until concord_timeline_stop); each rank
// writes a complete trace of its own (pid = the rank): `path.rank<R>` on a world communicator,
// `path.comm<H>.rank<R>` on a sub-communicator (TimelineFileName). `perf/concord-timeline merge`
// puts one communicator's files into one, aligning their clocks.
//
// What is recorded (tracks are the trace's threads, within the rank's process):
//  - per tensor (a track named after it): "negotiate" (enqueue until the coordinator's response
//    reached this rank and the engine took it out of its queue; args last_rank and last_wait_us
//    when another rank's submission reached the coordinator last: the rank this one waited for in
//    the end, and how long the coordinator waited for it after the one before), "queued" (until
//    its batch started: behind the batches before it in the response list), "execute" (until it
//    completed; args: op and bytes, on the tensor's first execute and whenever they change, which
//    keeps the file small), "callback" (when it took kShortestCallbackNs or more: almost every
//    callback takes well under a microsecond, invisible in a viewer, and writing them would add a
//    quarter to the file);
//  - per lane (track "lane N"): each fused batch as one slice ("fused allreduce", "fused
//    reducescatter"; args: members, bytes) with "pack" and "unpack" inside, or for a compressed
//    batch "encode" and "decode" (args: bytes, the tensors' own; encoded, the encoded size), and
//    each backend collective (args: bytes, backend, and the algorithm it ran where the backend
//    says: Backend::LastAlgorithm); a reducescatter alone that copies its input shows "pack";
//  - the device path: track "device launches", each device batch's "launch" (the host's time in
//    DeviceBackend::Launch; args: op, bytes, members), and track "device", each device collective
//    named after its op (args: backend, bytes, members) from its launch, or the previous one's
//    completion when that came later (the device runs them in launch order), to its completion,
//    recorded by the device backend's completion thread;
//  - the engine (track "engine"): each response list it executed ("cycle", args: responses).
// Timestamps are microseconds since the timeline started on the steady clock; the process_name
// metadata event of the rank carries that start on the system clock (args.concord_start_us), the
// rank and size, which the merge uses, and on a sub-communicator its Config::membership
// (args.concord_communicator), by which the merge refuses files of different communicators. A
// timeline started at init (CONCORD_TIMELINE) on more than one rank also carries this rank's system
// clock minus rank 0's, measured then (core/clock_sync.h), and the bound on its error
// (args.concord_clock_offset_us and concord_clock_error_us): the merge aligns the ranks on rank 0's
// clock with them. Without them (one rank, no point-to-point transport, a failed measurement, a
// timeline started at run time: concord_timeline_start is not collective) the merge trusts the
// system clocks.
//
// Cost: off, each hook is one relaxed atomic load. On, a hook appends a small event under a
// mutex; a writer thread formats and writes them every 100 ms. A write that fails logs one
// warning and turns the timeline off: training continues, and another timeline can be started.
//
// Contract: owned by the engine, shared (shared_ptr) with its lanes' backends and the requests it
// records, which may complete after the engine is gone. Every method is thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/clock.h"
#include "base/mutex.h"
#include "base/status.h"
#include "core/clock_sync.h"

namespace concord {

// A rank's timeline file, opened (created or truncated) but not yet written; a regular file is
// locked (flock) until it is closed.
struct TimelineFile {
  std::string path;
  std::unique_ptr<FILE, int (*)(FILE*)> file{nullptr, &std::fclose};
  std::string membership;  // the sub-communicator's Config::membership; empty for a world one
};
// The file rank `rank` of a communicator writes for `path`: "path.rank<R>" on a world communicator
// (`membership` empty); on a sub-communicator "path.comm<H>.rank<R>", H being 8 hex digits of a
// digest of its Config::membership, which its members share and which names its split, color and
// parent ranks: the members of one sub-communicator share a prefix, and the processes of a job
// get names of their own (sub-ranks repeat the world's ranks and the other sub-communicators').
std::string TimelineFileName(const std::string& path, int rank, const std::string& membership);
// Opens TimelineFileName(path, rank, membership); kInvalidArgument naming `source` (what gave the
// path), the file and the system's reason when it cannot be opened for writing (a FIFO that no
// process reads is refused at once, not waited for), or when another timeline (of this process or
// another) is writing it: the second opener fails, the first file is left alone.
StatusOr<TimelineFile> OpenTimelineFile(const std::string& path, int rank,
                                        const std::string& source,
                                        const std::string& membership = {});

// One operation's phase boundaries on its tensor, as its RequestState saw them.
struct TensorPhases {
  Clock::time_point enqueued, negotiated, started, completed, called_back;
  int32_t last_rank = -1;  // the rank the coordinator waited for last (ResponseItem::last_rank)
  uint32_t last_wait_us = 0;
};

class Timeline {
 public:
  using Warn = std::function<void(const std::string&)>;
  // Tracks: the engine's, lane L's (kLaneTrack + L); tensors get their own from kTensorTrack on.
  static constexpr int kEngineTrack = 0;
  static constexpr int kLaneTrack = 1;
  // The device path's (past every lane's, Config::kMaxLanes): its launches, and its collectives
  // from launch to completion.
  static constexpr int kDeviceLaunchTrack = 98;
  static constexpr int kDeviceTrack = 99;
  static constexpr int kTensorTrack = 100;
  // What an event carries when it has no bytes.
  static constexpr uint64_t kNoBytes = ~uint64_t{0};
  // Events waiting for the writer beyond this (by default) are dropped (a stalled file costs
  // memory no more), and counted in a warning. A track whose name was dropped is named again with
  // its next event, and an execute whose op and bytes were dropped has them written on the next.
  static constexpr size_t kMaxPending = size_t{1} << 20;
  // Shorter callbacks are not written (see the file comment).
  static constexpr int64_t kShortestCallbackNs = 1000;
  // Tensors whose track is remembered beyond this (by default): the one recorded least recently is
  // forgotten, so that a job whose tensor names change every step ("grad.step123") costs memory no
  // more. A forgotten name that comes back gets a new track, named again with its next event: a
  // track's number is never given to another name, so every track keeps one name in the trace.
  static constexpr size_t kMaxTensors = size_t{1} << 16;

  // `max_pending`, `max_tensors` (at least 1): kMaxPending and kMaxTensors but in tests.
  Timeline(int rank, int size, Warn warn, size_t max_pending = kMaxPending,
           size_t max_tensors = kMaxTensors);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Starts writing into `file`; kInvalidArgument when a timeline is already on (one that turned
  // itself off after a failed write is not). `clock`: this rank's clock offset from rank 0's,
  // recorded in the process_name metadata (none, or one not finite: not recorded).
  Status Start(TimelineFile file, std::optional<ClockOffset> clock = std::nullopt)
      EXCLUDES(control_mu_, write_mu_, mu_);
  // Writes what is left and closes the file (nothing when off). A failed write or close only warns,
  // as one while running does: a timeline never stops training.
  void Stop() EXCLUDES(control_mu_, write_mu_, mu_);
  bool on() const { return on_.load(std::memory_order_relaxed); }
  // The file being written; empty when off.
  std::string path() const EXCLUDES(mu_);
  // How many tensors' tracks are remembered now (at most max_tensors); for tests.
  size_t tensor_count() const EXCLUDES(mu_);

  // A tensor's phases (see the file comment); nothing when off.
  void Tensor(const std::string& name, const char* op, uint64_t bytes, const TensorPhases& phases)
      EXCLUDES(mu_);
  // A slice on `track`: `name` (a string literal), its bytes (kNoBytes: none), `detail` (a string
  // literal shown as args.backend, or nullptr) and `args` (more JSON members, "" for none).
  void Slice(int track, const char* name, Clock::time_point begin, Clock::time_point end,
             uint64_t bytes = kNoBytes, const char* detail = nullptr, std::string args = {})
      EXCLUDES(mu_);

 private:
  // Per tensor: its track, whether the track's name is in the file (pending or written), the op and
  // bytes its last execute event carried, and its place in tensor_recency_.
  struct TensorInfo {
    int64_t track = 0;
    bool named = false;
    const char* op = nullptr;
    uint64_t bytes = kNoBytes;
    std::list<const std::string*>::iterator recency;
  };
  struct Event {
    const char* name = nullptr;  // nullptr: a track name (args holds it)
    const char* detail = nullptr;
    const char* detail_key = "backend";
    int64_t track = 0;  // a tensor's grows with every new name: past int's range in a long job
    int64_t begin_ns = 0, end_ns = 0;
    uint64_t bytes = kNoBytes;
    int32_t last_rank = -1;  // a negotiation's (TensorPhases), written with its wait when >= 0
    uint32_t last_wait_us = 0;
    std::string args;
  };
  // Tensor `name`'s record, naming its track in the trace until that is not dropped; a new one
  // makes the least recently recorded tensor forgotten when max_tensors_ are remembered.
  TensorInfo& TensorTrack(const std::string& name) REQUIRES(mu_);
  // Names track `track` (the engine's or a lane's) in the trace until that is not dropped.
  void NameTrack(int track) REQUIRES(mu_);
  int64_t Since(Clock::time_point t) const REQUIRES(mu_) { return (t - start_).count(); }
  // Queues `e` for the writer; false when it was dropped (max_pending_ reached).
  bool Append(Event e) REQUIRES(mu_);
  void WriterLoop() EXCLUDES(mu_);
  // Writes `events` (formatted by hand: printf's float formatting was most of the writer's time,
  // which it takes from the ranks' cores); false (and errno set) when the file refused them.
  bool Write(FILE* file, const std::vector<Event>& events);
  // Writes the pending events, then the end of the trace and closes the file when `last`; a failed
  // write turns the timeline off with a warning and is returned (OK when there is no file).
  Status Flush(bool last) EXCLUDES(mu_, write_mu_);

  const int rank_, size_;
  const Warn warn_;
  const size_t max_pending_;
  const size_t max_tensors_;
  std::atomic<bool> on_{false};
  mutable Mutex mu_;
  CondVar wake_;
  // Serialises Start() and Stop(); the writer thread's and Stop()'s writes to the file.
  Mutex control_mu_ ACQUIRED_BEFORE(write_mu_);
  Mutex write_mu_ ACQUIRED_BEFORE(mu_);
  TimelineFile file_ GUARDED_BY(write_mu_);
  std::string path_ GUARDED_BY(mu_);
  Clock::time_point start_ GUARDED_BY(mu_);
  std::vector<Event> pending_ GUARDED_BY(mu_);
  std::unordered_map<std::string, TensorInfo> tensors_ GUARDED_BY(mu_);
  // tensors_' names (its keys, which never move), the least recently recorded first.
  std::list<const std::string*> tensor_recency_ GUARDED_BY(mu_);
  int64_t next_tensor_track_ GUARDED_BY(mu_) = kTensorTrack;
  std::vector<bool> named_tracks_ GUARDED_BY(mu_);
  uint64_t dropped_ GUARDED_BY(mu_) = 0;  // events beyond max_pending_, not written
  bool stopping_ GUARDED_BY(mu_) = false;
  // Joinable from Start() to Stop(), also once it has returned after a failed write.
  std::thread writer_ GUARDED_BY(control_mu_);
};

}  // namespace concord
