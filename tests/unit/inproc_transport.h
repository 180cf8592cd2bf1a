// In-process transports for engine tests: ranks are threads of one process. An InProcWorld is the
// hub that N ranks share; it hands each rank a ControlPlane (a mailbox per rank) and a Backend (a
// generation-counted rendezvous), both honouring the contracts of backends/control_plane.h and
// backends/backend.h, and lets a test make a rank die.
//
// Ownership: the world must outlive every transport it made (hold it in a shared_ptr and pass that
// as the engine's keep_alive). All methods are thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/control_plane.h"

namespace concord {

class InProcWorld {
 public:
  // `timeout` bounds every backend collective (kTimeout when a rank does not arrive in time).
  InProcWorld(int size, std::chrono::milliseconds timeout);

  int size() const { return size_; }
  // The transports of `rank`. Destroying a control plane closes it: the rank counts as dead.
  // Backends of different lanes are independent channels (their collectives match separately).
  std::unique_ptr<ControlPlane> MakeControlPlane(int rank);
  std::unique_ptr<Backend> MakeBackend(int rank, int lane = 0);

  // Makes `rank` die: its own transport calls fail, and its peers' calls fail with kPeerFailure
  // naming it (messages it sent before dying are still delivered first).
  void Kill(int rank);

  // Collectives completed so far on `lane`'s channel.
  uint64_t CollectivesOn(int lane);

  // Control messages from `from` that `to` has received so far. A test waits for this to grow to
  // know that rank 0, the coordinator, holds a rank's request (a rank sends one when it has new
  // requests, and nothing while idle: core/coordinator.h).
  uint64_t Received(int to, int from);

 private:
  friend class InProcControlPlane;
  friend class InProcBackend;

  // One collective call's arguments, deposited by each rank.
  struct Slot {
    int kind = -1;  // which collective (the backend's private numbering)
    const void* in = nullptr;
    size_t bytes = 0;  // bytes at `in`
    size_t count = 0;
    DType dtype = DType::kUint8;
    ReduceOp op = ReduceOp::kSum;
    int root = 0;
    const std::vector<size_t>* counts = nullptr;  // reduce-scatter's counts, alltoall's sends
  };

  // The first dead rank other than `self` that `self` can see (rank 0 sees every rank, the others
  // only rank 0 on the control plane; the backend sees everyone), or -1. Needs mu_.
  int DeadPeer(int self, bool star) const;
  // One lane's collective channel: the ranks' deposited arguments and the arrival count.
  struct Channel {
    std::vector<Slot> slots;
    int arrived = 0;
    uint64_t generation = 0;
  };

  // The channel of `lane` (created on first use). Needs mu_.
  Channel& ChannelOf(int lane);
  // Waits (holding `lock`) until all ranks arrived at `channel`'s current generation.
  Status Rendezvous(std::unique_lock<std::mutex>& lock, Channel& channel, int rank);

  const int size_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;  // any change: a message, a wake, an arrival, a death
  std::vector<bool> dead_;
  std::vector<std::deque<ControlMessage>> mailbox_;
  std::vector<std::vector<uint64_t>> received_;  // [to][from]
  std::vector<bool> woken_;
  std::map<int, Channel> channels_;  // by lane
  Status broken_;  // set once a collective failed: the backend is unusable afterwards
};

}  // namespace concord
