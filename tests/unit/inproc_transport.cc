#include "tests/unit/inproc_transport.h"

#include <cstring>
#include <functional>

namespace concord {
namespace {

Status PeerFailure(const std::string& message) {
  return Status(Code::kPeerFailure, message);
}

}  // namespace

class InProcControlPlane : public ControlPlane {
 public:
  InProcControlPlane(InProcWorld* world, int rank) : world_(world), rank_(rank) {}
  ~InProcControlPlane() override { world_->Kill(rank_); }

  int rank() const override { return rank_; }
  int size() const override { return world_->size_; }

  Status Send(int to, std::string bytes) override {
    if (to < 0 || to >= world_->size_ || to == rank_ || (rank_ != 0 && to != 0)) {
      return InvalidArgument("rank " + std::to_string(rank_) + " cannot send to rank " +
                             std::to_string(to));
    }
    std::lock_guard<std::mutex> lock(world_->mu_);
    if (world_->dead_[rank_]) return PeerFailure("this rank's control plane is closed");
    if (world_->dead_[to]) return PeerFailure("rank " + std::to_string(to) + " failed");
    world_->mailbox_[to].push_back(ControlMessage{rank_, bytes});
    world_->cv_.notify_all();
    return Status::Ok();
  }

  // Send() delivers into the peer's mailbox at once: nothing is ever queued here.
  Status Drain(Deadline /*deadline*/) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    if (world_->dead_[rank_]) return PeerFailure("this rank's control plane is closed");
    return Status::Ok();
  }

  StatusOr<bool> Receive(ControlMessage* out, Deadline deadline) override {
    std::unique_lock<std::mutex> lock(world_->mu_);
    while (true) {
      if (world_->dead_[rank_]) return PeerFailure("this rank's control plane is closed");
      auto& box = world_->mailbox_[rank_];
      if (!box.empty()) {
        *out = std::move(box.front());
        box.pop_front();
        ++world_->received_[rank_][out->from];
        return true;
      }
      if (world_->woken_[rank_]) {
        world_->woken_[rank_] = false;
        return false;
      }
      const int dead = world_->DeadPeer(rank_, /*star=*/true);
      if (dead >= 0) return PeerFailure("rank " + std::to_string(dead) + " failed");
      if (deadline.passed()) return false;
      if (deadline.infinite()) {
        world_->cv_.wait(lock);
      } else {
        world_->cv_.wait_until(lock, deadline.at());
      }
    }
  }

  void Wake() override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    world_->woken_[rank_] = true;
    world_->cv_.notify_all();
  }

 private:
  InProcWorld* const world_;
  const int rank_;
};

class InProcBackend : public Backend {
 public:
  InProcBackend(InProcWorld* world, int rank, int lane) : world_(world), rank_(rank), lane_(lane) {}

  const char* name() const override { return "inproc"; }
  int rank() const override { return rank_; }
  int size() const override { return world_->size_; }
  // Every collective: each rank posts its slot, one computes every rank's result.
  const char* LastAlgorithm() const override { return "rendezvous"; }

  Status Allreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    InProcWorld::Slot slot{kAllreduce, data,   count * DTypeSize(dtype), count, dtype, op,
                           0,          nullptr};
    std::vector<uint8_t> result(slot.bytes);
    return Collective(
        slot,
        [&](const std::vector<InProcWorld::Slot>& all) {
          if (count == 0) return;
          std::memcpy(result.data(), all[0].in, slot.bytes);
          for (size_t r = 1; r < all.size(); ++r) {
            ReduceElements(result.data(), result.data(), all[r].in, count, dtype, op);
          }
        },
        [&] {
          if (count > 0) std::memcpy(data, result.data(), slot.bytes);
        });
  }

  Status Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes_per_rank) override {
    if (bytes_per_rank.size() != static_cast<size_t>(world_->size_)) {
      return InvalidArgument("allgatherv needs one byte count per rank");
    }
    size_t total = 0;
    for (size_t b : bytes_per_rank) total += b;
    InProcWorld::Slot slot{
        kAllgather, in, bytes_per_rank[rank_], total, DType::kUint8, ReduceOp::kSum, 0, nullptr};
    std::vector<uint8_t> result(total);
    return Collective(
        slot,
        [&](const std::vector<InProcWorld::Slot>& all) {
          size_t offset = 0;
          for (const auto& s : all) {
            if (s.bytes > 0) std::memcpy(result.data() + offset, s.in, s.bytes);
            offset += s.bytes;
          }
        },
        [&] {
          if (total > 0) std::memcpy(out, result.data(), total);
        });
  }

  Status Broadcast(void* data, size_t bytes, int root) override {
    InProcWorld::Slot slot{kBroadcast,    data,           bytes, bytes,
                           DType::kUint8, ReduceOp::kSum, root,  nullptr};
    std::vector<uint8_t> result(bytes);
    return Collective(
        slot,
        [&](const std::vector<InProcWorld::Slot>& all) {
          if (bytes > 0) std::memcpy(result.data(), all[root].in, bytes);
        },
        [&] {
          if (bytes > 0 && rank_ != root) std::memcpy(data, result.data(), bytes);
        });
  }

  Status Barrier() override {
    InProcWorld::Slot slot{kBarrier, nullptr, 0, 0, DType::kUint8, ReduceOp::kSum, 0, nullptr};
    return Collective(
        slot, [](const std::vector<InProcWorld::Slot>&) {}, [] {});
  }

  Status ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                       ReduceOp op) override {
    if (counts.size() != static_cast<size_t>(world_->size_)) {
      return InvalidArgument("reduce-scatter needs one count per rank");
    }
    size_t total = 0, offset = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      if (static_cast<int>(r) < rank_) offset += counts[r];
      total += counts[r];
    }
    const size_t esize = DTypeSize(dtype);
    // backend.h: in and out do not overlap (real backends read the input while writing out).
    const auto* in_at = static_cast<const uint8_t*>(in);
    const auto* out_at = static_cast<const uint8_t*>(out);
    if (total > 0 && counts[rank_] > 0 && in_at < out_at + counts[rank_] * esize &&
        out_at < in_at + total * esize) {
      return InvalidArgument("reduce-scatter: in and out overlap");
    }
    InProcWorld::Slot slot{kReduceScatter, in, total * esize, total, dtype, op, 0, &counts};
    std::vector<uint8_t> result(counts[rank_] * esize);
    return Collective(
        slot,
        [&](const std::vector<InProcWorld::Slot>& all) {
          if (result.empty()) return;
          const size_t n = counts[rank_];
          std::memcpy(result.data(), static_cast<const uint8_t*>(all[0].in) + offset * esize,
                      n * esize);
          for (size_t r = 1; r < all.size(); ++r) {
            ReduceElements(result.data(), result.data(),
                           static_cast<const uint8_t*>(all[r].in) + offset * esize, n, dtype, op);
          }
        },
        [&] {
          if (!result.empty()) std::memcpy(out, result.data(), result.size());
        });
  }

  Status Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes) override {
    const auto n = static_cast<size_t>(world_->size_);
    if (send_bytes.size() != n || recv_bytes.size() != n) {
      return InvalidArgument("alltoallv needs one size per rank");
    }
    InProcWorld::Slot slot{kAlltoall, in, 0, 0, DType::kUint8, ReduceOp::kSum, 0, &send_bytes};
    size_t total = 0;
    for (size_t b : recv_bytes) total += b;
    std::vector<uint8_t> result(total);
    Status mismatch = Status::Ok();
    Status s = Collective(
        slot,
        [&](const std::vector<InProcWorld::Slot>& all) {
          size_t at = 0;
          for (size_t src = 0; src < n; ++src) {
            const std::vector<size_t>& theirs = *all[src].counts;
            if (theirs[rank_] != recv_bytes[src]) {
              mismatch = Status(Code::kBackendError, "alltoallv sizes disagree");
              return;
            }
            size_t from = 0;
            for (int d = 0; d < rank_; ++d) from += theirs[d];
            if (recv_bytes[src] > 0) {
              std::memcpy(result.data() + at, static_cast<const uint8_t*>(all[src].in) + from,
                          recv_bytes[src]);
            }
            at += recv_bytes[src];
          }
        },
        [&] {
          if (total > 0) std::memcpy(out, result.data(), total);
        });
    return s.ok() ? mismatch : s;
  }

 private:
  enum Kind { kAllreduce, kAllgather, kBroadcast, kBarrier, kReduceScatter, kAlltoall };

  // Deposits `slot`, waits for every rank, checks that all ranks called the same collective,
  // runs compute(all slots) (other ranks' inputs stay valid: they wait at the second rendezvous),
  // waits again so no rank's input is overwritten while being read, then runs copy_out().
  Status Collective(const InProcWorld::Slot& slot,
                    const std::function<void(const std::vector<InProcWorld::Slot>&)>& compute,
                    const std::function<void()>& copy_out) {
    std::unique_lock<std::mutex> lock(world_->mu_);
    InProcWorld::Channel& channel = world_->ChannelOf(lane_);
    channel.slots[rank_] = slot;
    CONCORD_RETURN_IF_ERROR(world_->Rendezvous(lock, channel, rank_));
    const std::vector<InProcWorld::Slot> all = channel.slots;
    for (const auto& s : all) {
      if (s.kind != slot.kind || s.count != slot.count || s.dtype != slot.dtype ||
          s.op != slot.op || s.root != slot.root ||
          (slot.kind == kReduceScatter && *s.counts != *slot.counts)) {
        world_->broken_ = Status(Code::kBackendError, "ranks called different collectives");
        world_->cv_.notify_all();
        return world_->broken_;
      }
    }
    lock.unlock();
    compute(all);
    lock.lock();
    CONCORD_RETURN_IF_ERROR(world_->Rendezvous(lock, channel, rank_));
    lock.unlock();
    copy_out();
    return Status::Ok();
  }

  InProcWorld* const world_;
  const int rank_;
  const int lane_;
};

InProcWorld::InProcWorld(int size, std::chrono::milliseconds timeout)
    : size_(size),
      timeout_(timeout),
      dead_(size, false),
      mailbox_(size),
      received_(size, std::vector<uint64_t>(size, 0)),
      woken_(size, false) {}

std::unique_ptr<ControlPlane> InProcWorld::MakeControlPlane(int rank) {
  return std::make_unique<InProcControlPlane>(this, rank);
}

std::unique_ptr<Backend> InProcWorld::MakeBackend(int rank, int lane) {
  return std::make_unique<InProcBackend>(this, rank, lane);
}

uint64_t InProcWorld::CollectivesOn(int lane) {
  std::lock_guard<std::mutex> lock(mu_);
  return ChannelOf(lane).generation / 2;  // two rendezvous per collective
}

uint64_t InProcWorld::Received(int to, int from) {
  std::lock_guard<std::mutex> lock(mu_);
  return received_[to][from];
}

InProcWorld::Channel& InProcWorld::ChannelOf(int lane) {
  Channel& channel = channels_[lane];
  if (channel.slots.empty()) channel.slots.resize(size_);
  return channel;
}

void InProcWorld::Kill(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  dead_[rank] = true;
  cv_.notify_all();
}

int InProcWorld::DeadPeer(int self, bool star) const {
  for (int r = 0; r < size_; ++r) {
    if (r == self || !dead_[r]) continue;
    if (!star || self == 0 || r == 0) return r;
  }
  return -1;
}

Status InProcWorld::Rendezvous(std::unique_lock<std::mutex>& lock, Channel& channel, int rank) {
  if (!broken_.ok()) return broken_;
  if (dead_[rank]) return PeerFailure("this rank's backend is closed");
  const uint64_t generation = channel.generation;
  if (++channel.arrived == size_) {
    channel.arrived = 0;
    ++channel.generation;
    cv_.notify_all();
    return Status::Ok();
  }
  const auto deadline = Clock::now() + timeout_;
  while (channel.generation == generation) {
    if (!broken_.ok()) return broken_;
    const int dead = DeadPeer(rank, /*star=*/false);
    if (dead >= 0 || dead_[rank]) {
      broken_ = PeerFailure("rank " + std::to_string(dead >= 0 ? dead : rank) + " failed");
      cv_.notify_all();
      return broken_;
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout &&
        channel.generation == generation) {
      broken_ = TimeoutError("backend collective: not every rank arrived within " +
                             std::to_string(timeout_.count()) + " ms");
      cv_.notify_all();
      return broken_;
    }
  }
  return Status::Ok();
}

}  // namespace concord
