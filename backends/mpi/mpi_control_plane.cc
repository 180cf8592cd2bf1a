#include <algorithm>
#include <climits>
#include <list>
#include <thread>
#include <vector>

#include "backends/mpi/mpi_backend.h"
#include "base/mutex.h"

namespace concord {
namespace {

constexpr int kTagData = 1;
constexpr int kTagHeartbeat = 2;
// Receive() first polls without sleeping for kSpin, busily for the first kBusy and then yielding
// the CPU between polls: a reply in a negotiation round trip usually comes within that, and a
// sleeping thread's wake-up costs tens of microseconds here (a yield costs a system call). Then it
// sleeps between polls, from kFirstNap doubling to kMaxNap, unless woken.
constexpr auto kBusy = std::chrono::microseconds(20);
constexpr auto kSpin = std::chrono::microseconds(200);
constexpr auto kFirstNap = std::chrono::microseconds(20);
constexpr auto kMaxNap = std::chrono::microseconds(1000);
// How long the destructor waits for queued sends before abandoning them.
constexpr auto kCloseGrace = std::chrono::seconds(1);

// Contract: the ControlPlane contract (backends/control_plane.h) over a private duplicate of
// MPI_COMM_WORLD: messages are tagged MPI_Isend/MPI_Mrecv of whole byte strings (MPI keeps each
// pair's messages in order). Used by one thread (the engine's), except Wake(), which any thread
// may call and which never touches MPI. Send() never blocks: the bytes are copied and the send
// completes in the background (checked at each later call). Receive() polls MPI_Improbe and
// sleeps between polls on a condition variable that Wake() notifies, napping 20 us at first and
// up to 1 ms when nothing arrives, so an idle engine costs little CPU. Liveness as in the TCP
// plane: while Receive() runs it sends a heartbeat to each star peer every quarter of the
// liveness timeout, and a peer unheard for that long while this rank listened is failed
// (kPeerFailure, sticky). Under mpirun a dead rank usually ends the whole job first.
class MpiControlPlane : public ControlPlane {
 public:
  MpiControlPlane(std::shared_ptr<MpiEnvironment> env, MPI_Comm comm, int rank, int size,
                  std::chrono::milliseconds liveness_timeout)
      : env_(std::move(env)),
        comm_(comm),
        rank_(rank),
        size_(size),
        liveness_(liveness_timeout),
        last_heard_(size, Clock::now()),
        last_beat_(size, Clock::now()) {}

  ~MpiControlPlane() override {
    const Deadline grace = Deadline::After(kCloseGrace);
    while (!sends_.empty() && !grace.passed()) {
      Reap();
      if (!sends_.empty()) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (!sends_.empty()) {
      // MPI still owns the pending sends' buffers: leak them (moving a list keeps its nodes).
      env_->MarkAbandoned();
      new std::list<Outgoing>(std::move(sends_));
    }
    if (env_->abandoned()) return;  // freeing the communicator could wait on what is pending
    auto lock = env_->Lock();
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status Send(int to, std::string bytes) override {
    if (to < 0 || to >= size_ || to == rank_ || (rank_ != 0 && to != 0)) {
      return InvalidArgument("mpi control plane: rank " + std::to_string(rank_) +
                             " cannot send to rank " + std::to_string(to));
    }
    if (bytes.size() > static_cast<size_t>(INT_MAX)) {
      return InvalidArgument("mpi control plane: a message of " + std::to_string(bytes.size()) +
                             " bytes is larger than MPI's int count allows");
    }
    if (!failure_.ok()) return failure_;
    CONCORD_RETURN_IF_ERROR(Post(to, kTagData, std::move(bytes)));
    Reap();
    return failure_;
  }

  // Open MPI progresses pending MPI_Isends during any MPI call, including the backend's
  // MPI_Test polling inside a collective, so nothing here can be starved: nothing to wait for.
  Status Drain(Deadline /*deadline*/) override { return failure_; }

  StatusOr<bool> Receive(ControlMessage* out, Deadline deadline) override {
    if (!failure_.ok()) return failure_;
    const auto now = Clock::now();
    if (now - last_listen_ > liveness_ / 2) {
      // Away for a while (a long collective): peers get half the timeout to be heard again.
      for (auto& t : last_heard_) t = std::max(t, now - liveness_ / 2);
    }
    auto nap = std::chrono::duration_cast<Clock::duration>(kFirstNap);
    const auto spin_until = now + kSpin;
    const auto busy_until = now + kBusy;
    for (;;) {
      bool heard = false;
      StatusOr<bool> got = Poll(out, &heard);
      if (!got.ok() || *got) {
        last_listen_ = Clock::now();
        return got;
      }
      Reap();
      // One clock read per poll: the spin's granularity is the reply's latency.
      const auto t = Clock::now();
      Tick(t);
      if (!failure_.ok()) return failure_;
      if (heard) {
        nap = std::chrono::duration_cast<Clock::duration>(kFirstNap);
        continue;
      }
      if (TakeWake(t, deadline)) {
        last_listen_ = t;
        return false;
      }
      if (t < spin_until) {
        if (t > busy_until) std::this_thread::yield();
        continue;
      }
      Nap(std::min(deadline.at(), Clock::now() + nap));
      nap = std::min(nap * 2, std::chrono::duration_cast<Clock::duration>(kMaxNap));
    }
  }

  void Wake() override EXCLUDES(wake_mu_) {
    {
      MutexLock lock(wake_mu_);
      woken_ = true;
    }
    wake_cv_.NotifyOne();
  }

 private:
  // Whether Receive() must return now (woken, or at `now` the deadline passed); consumes a wake.
  bool TakeWake(Clock::time_point now, const Deadline& deadline) EXCLUDES(wake_mu_) {
    MutexLock lock(wake_mu_);
    if (!woken_ && now < deadline.at()) return false;
    woken_ = false;
    return true;
  }
  // Sleeps until `until` or a Wake().
  void Nap(Clock::time_point until) EXCLUDES(wake_mu_) {
    MutexLock lock(wake_mu_);
    while (!woken_) {
      if (!wake_cv_.WaitUntil(wake_mu_, until)) return;
    }
  }

  struct Outgoing {
    int to = -1;
    std::string bytes;  // owned until MPI completes the send
    MPI_Request request = MPI_REQUEST_NULL;
  };

  Status Post(int to, int tag, std::string bytes) {
    sends_.emplace_back();
    Outgoing& s = sends_.back();
    s.to = to;
    s.bytes = std::move(bytes);
    auto lock = env_->Lock();
    const int rc = MPI_Isend(s.bytes.data(), static_cast<int>(s.bytes.size()), MPI_BYTE, to, tag,
                             comm_, &s.request);
    if (rc != MPI_SUCCESS) {
      sends_.pop_back();
      return FailPeer(to, MpiError(rc, "MPI_Isend", __FILE__, __LINE__));
    }
    return Status::Ok();
  }

  // Completes finished sends; a failed one fails its peer (failure_, which callers read).
  void Reap() {
    for (auto it = sends_.begin(); it != sends_.end();) {
      int done = 0;
      int rc;
      {
        auto lock = env_->Lock();
        rc = MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
      }
      if (rc != MPI_SUCCESS) {
        (void)FailPeer(it->to, MpiError(rc, "MPI_Test (send)", __FILE__, __LINE__));
        done = 1;
      }
      it = done ? sends_.erase(it) : std::next(it);
    }
  }

  // Takes at most one incoming message. Heartbeats only refresh liveness (*heard = true).
  StatusOr<bool> Poll(ControlMessage* out, bool* heard) {
    int flag = 0;
    MPI_Message message;
    MPI_Status status;
    auto lock = env_->Lock();
    CONCORD_MPI_CHECK(MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, &message, &status));
    if (!flag) return false;
    int count = 0;
    CONCORD_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &count));
    std::string bytes(static_cast<size_t>(count), '\0');
    CONCORD_MPI_CHECK(MPI_Mrecv(bytes.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE));
    const int from = status.MPI_SOURCE;
    last_heard_[from] = Clock::now();
    *heard = true;
    if (status.MPI_TAG != kTagData) return false;
    out->from = from;
    out->bytes = std::move(bytes);
    return true;
  }

  // Sends due heartbeats and fails peers silent for the liveness timeout.
  void Tick(Clock::time_point now) {
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || (rank_ != 0 && r != 0)) continue;
      if (now - last_beat_[r] >= liveness_ / 4) {
        last_beat_[r] = now;
        if (!Post(r, kTagHeartbeat, std::string()).ok()) return;
      }
      if (now - last_heard_[r] > liveness_) {
        (void)FailPeer(r,
                       Status(Code::kPeerFailure, "rank " + std::to_string(r) +
                                                      " was silent on the MPI control plane for " +
                                                      std::to_string(liveness_.count()) + " ms"));
        return;
      }
    }
  }

  Status FailPeer(int peer, Status status) {
    if (failure_.ok()) {
      failure_ = status.code() == Code::kPeerFailure
                     ? status
                     : Status(Code::kPeerFailure,
                              "rank " + std::to_string(peer) + ": " + status.message());
    }
    return failure_;
  }

  std::shared_ptr<MpiEnvironment> env_;
  MPI_Comm comm_;
  const int rank_;
  const int size_;
  const std::chrono::milliseconds liveness_;
  std::vector<Clock::time_point> last_heard_;
  std::vector<Clock::time_point> last_beat_;
  Clock::time_point last_listen_ = Clock::now();
  std::list<Outgoing> sends_;  // a list: MPI holds pointers into each element's bytes
  Status failure_;

  Mutex wake_mu_;
  CondVar wake_cv_;
  bool woken_ GUARDED_BY(wake_mu_) = false;
};

}  // namespace

StatusOr<std::unique_ptr<ControlPlane>> CreateMpiControlPlane(
    std::shared_ptr<MpiEnvironment> env, std::chrono::milliseconds liveness_timeout) {
  CONCORD_ASSIGN_OR_RETURN(MPI_Comm comm, DuplicateWorld(*env, Deadline::After(liveness_timeout)));
  int rank = 0, size = 0;
  {
    auto lock = env->Lock();
    CONCORD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    CONCORD_MPI_CHECK(MPI_Comm_size(comm, &size));
  }
  return std::unique_ptr<ControlPlane>(
      new MpiControlPlane(std::move(env), comm, rank, size, liveness_timeout));
}

}  // namespace concord
