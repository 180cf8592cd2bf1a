#include <algorithm>
#include <climits>
#include <deque>
#include <functional>
#include <list>
#include <thread>
#include <vector>

#include "backends/mpi/mpi_backend.h"
#include "base/clock.h"
#include "base/mutex.h"

namespace concord {
namespace {

constexpr int kTagData = 1;
constexpr int kTagHeartbeat = 2;
// An abandoned plane's last message to its star peers, empty: this rank failed and its plane is
// closing (as a TCP plane's closed connection says).
constexpr int kTagClosing = 3;
// Receive() first polls without sleeping for kSpin, busily for the first kBusy and then yielding
// the CPU between polls: a reply in a negotiation round trip usually comes within that, and a
// sleeping thread's wake-up costs tens of microseconds here (a yield costs a system call). Then it
// sleeps between polls, from kFirstNap doubling to kMaxNap, unless woken.
constexpr auto kBusy = std::chrono::microseconds(20);
constexpr auto kSpin = std::chrono::microseconds(200);
constexpr auto kFirstNap = std::chrono::microseconds(20);
constexpr auto kMaxNap = std::chrono::microseconds(1000);
// How long the destructor waits for queued sends to peers not failed before abandoning them.
constexpr auto kCloseGrace = std::chrono::seconds(1);
// The liveness thread takes at most this many messages per round, so a flood cannot keep it (and
// mu_) busy indefinitely; the rest wait for the next round or for Receive().
constexpr int kMaxTakenPerRound = 1024;
// MPI records no arrival times: a message is seen to arrive when a probe finds it. While nobody
// is in Receive() the liveness thread probes every 1/kProbesPerTimeout of the liveness timeout.
constexpr int kProbesPerTimeout = 16;

// Contract: the ControlPlane contract (backends/control_plane.h) over a private duplicate of
// MPI_COMM_WORLD: messages are tagged MPI_Isend/MPI_Mrecv of whole byte strings (MPI keeps each
// pair's messages in order). The caller uses it from one thread at a time (the stepping thread);
// Wake() may come from any thread and never touches MPI. Send() never blocks: the bytes are
// copied and the send completes in the background (checked at each later call). Receive() polls
// MPI_Improbe and sleeps between polls on a condition variable that Wake() notifies, napping 20 us
// at first and up to 1 ms when nothing arrives, so an idle engine costs little CPU.
//
// Liveness is the plane's own liveness thread's (there is one when there are peers), whatever the
// caller does: it sends a heartbeat (tag 2, empty) to each star peer every quarter of the liveness
// timeout, probes for messages every sixteenth of it (taking data messages into the inbox that
// Receive() empties first, in order), and fails a peer (kPeerFailure, sticky) when no message from
// it has been seen for the timeout, or at once when it says it failed (an abandoned plane's notice
// on tag 3). A message is seen when a probe (the thread's or Receive()'s) takes it, at most a
// sixteenth of the timeout after it arrived, so a frozen peer is failed between 3/4 and 1 1/16
// timeouts after it froze, and a rank busy elsewhere (a long collective, a slow callback) is never
// silent: its thread keeps beating. A failure the thread finds wakes a napping Receive() and calls
// the failure listener (the engine's: it interrupts the backend's collective, which would otherwise
// wait for the dead peer until its own deadline).
//
// MPI and threads. The liveness thread calls MPI (MPI_Isend, MPI_Test, MPI_Improbe, MPI_Mrecv) on
// this plane's communicator while the engine's threads call it on others (the backend's
// collective). MpiEnvironment guarantees MPI_THREAD_SERIALIZED or better: under MULTIPLE the MPI
// standard allows any thread to call MPI at any time, and matched probes (MPI_Improbe with
// MPI_Mrecv) are its thread-safe way to receive; under SERIALIZED calls must never overlap, which
// every Concord MPI call ensures by holding the environment's lock, and since the backend waits for
// a collective by polling MPI_Test with that lock held only per call, the liveness thread's calls
// fit between its polls: it never waits for a collective to finish. MPI does not promise progress
// without calls: with Open MPI a message may move only while some thread of the sending and of the
// receiving process is inside MPI, which the liveness thread's rounds provide (and a frozen
// process, making no calls, sends nothing). MPI does not report a frozen or dead peer itself;
// under mpirun a dead rank usually ends the whole job first.
//
// Locks: mu_ guards the MPI traffic's state (sends, inbox, times, failure) and is held around this
// plane's MPI calls, so the two threads' probes and receives are serialised and messages enter
// the inbox in MPI's order; the environment's lock is taken inside it. wake_mu_ (the wake-up
// flags) is taken alone (the liveness thread notifies after releasing mu_), and nothing is taken
// inside it; mu_ is declared before it should they ever nest.
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
        // As if beaten a timeout ago: the first round sends every heartbeat at once.
        last_beat_(size, Clock::now() - liveness_timeout),
        failed_(size, false),
        closed_(size, false) {
    if (size_ > 1) liveness_thread_ = std::thread([this] { LivenessLoop(); });
  }

  ~MpiControlPlane() override {
    if (liveness_thread_.joinable()) {
      {
        MutexLock lock(mu_);
        stopping_ = true;
      }
      stop_cv_.NotifyAll();
      liveness_thread_.join();
    }
    MutexLock lock(mu_);  // uncontended now
    if (abandoned_) TellClosing();
    // Sends to failed peers are not waited for: a dead one never takes them.
    const auto waited_for = [this]() REQUIRES(mu_) {
      return std::any_of(sends_.begin(), sends_.end(),
                         [this](const Outgoing& s) REQUIRES(mu_) { return !failed_[s.to]; });
    };
    const Deadline grace = Deadline::After(kCloseGrace);
    while (waited_for() && !grace.passed()) {
      Reap();
      if (!sends_.empty()) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (!sends_.empty()) {
      // MPI still owns the pending sends' buffers: leak them (moving a list keeps its nodes).
      env_->MarkAbandoned();
      new std::list<Outgoing>(std::move(sends_));
    }
    // The communicator is never freed. Peers' heartbeats (and a data message the caller never
    // received) may still be on their way: Open MPI keeps a message for a context id it does not
    // know for the next communicator that takes that id, where it consumes a sequence number
    // and a real message is lost (MpiControlPlaneTest.PlanesDestroyedAtOnceLeaveNothingToTheNext
    // lost one in most runs). A plane's communicator is one per Concord communicator, which a
    // job creates a handful of; MPI_Finalize releases them.
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status Send(int to, std::string bytes) override EXCLUDES(mu_) {
    if (to < 0 || to >= size_ || to == rank_ || (rank_ != 0 && to != 0)) {
      return InvalidArgument("mpi control plane: rank " + std::to_string(rank_) +
                             " cannot send to rank " + std::to_string(to));
    }
    if (bytes.size() > static_cast<size_t>(INT_MAX)) {
      return InvalidArgument("mpi control plane: a message of " + std::to_string(bytes.size()) +
                             " bytes is larger than MPI's int count allows");
    }
    MutexLock lock(mu_);
    // A failed peer's failure is returned, but the bytes still go, best effort: rank 0's abort
    // reaches every rank, and one declared silent that was only frozen learns it when it wakes.
    // (A send to a dead peer that never completes is abandoned by the destructor.) Nothing goes to
    // a peer that said it closes: it may have exited, and Open MPI's TCP transport, reconnecting
    // to a process that is gone, can stall the calling thread for good (its error report waits on
    // the event loop that the same MPI call runs).
    // A failure waits for the messages that peer sent before it (the contract): they explain it.
    if (closed_[to]) return MessageWaitingFrom(inbox_, to) ? Status::Ok() : failure_;
    CONCORD_RETURN_IF_ERROR(Post(to, kTagData, std::move(bytes)));
    Reap();
    return failed_[to] && !MessageWaitingFrom(inbox_, to) ? failure_ : Status::Ok();
  }

  // Open MPI progresses pending MPI_Isends during any MPI call, including the backend's
  // MPI_Test polling inside a collective, so nothing here can be starved: nothing to wait for. A
  // failure once the messages taken before it are received (the contract).
  Status Drain(Deadline /*deadline*/) override EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return inbox_.empty() ? failure_ : Status::Ok();
  }

  StatusOr<bool> Receive(ControlMessage* out, Deadline deadline) override EXCLUDES(mu_) {
    const auto now = Clock::now();
    auto nap = std::chrono::duration_cast<Clock::duration>(kFirstNap);
    const auto spin_until = now + kSpin;
    const auto busy_until = now + kBusy;
    for (;;) {
      bool heard = false;
      {
        MutexLock lock(mu_);
        // Messages already taken (by the liveness thread too) come first, then a failure.
        if (inbox_.empty()) {
          StatusOr<bool> taken = TakeOne();
          if (!taken.ok()) return taken.status();
          heard = *taken;
          Reap();
        }
        if (!inbox_.empty()) {
          *out = std::move(inbox_.front());
          inbox_.pop_front();
          return true;
        }
        if (!failure_.ok()) return failure_;
      }
      if (heard) {
        nap = std::chrono::duration_cast<Clock::duration>(kFirstNap);
        continue;
      }
      // One clock read per poll: the spin's granularity is the reply's latency.
      const auto t = Clock::now();
      switch (TakeWake(t, deadline)) {
        case WakeReason::kNone:
          break;
        case WakeReason::kReturn:
          return false;
        case WakeReason::kLookAgain:
          continue;
      }
      if (t < spin_until) {
        if (t > busy_until) std::this_thread::yield();
        continue;
      }
      Nap(std::min(deadline.at(), Clock::now() + nap));
      nap = std::min(nap * 2, std::chrono::duration_cast<Clock::duration>(kMaxNap));
    }
  }

  // Open MPI's MPI_Finalize waits for every process (a PMIx fence): with a peer dead or cut off
  // it would never return, so after a failure the process neither finalizes MPI nor frees
  // communicators.
  // Marks the process as not to finalize MPI and the plane as failed: the destructor then tells
  // the star peers (see TellClosing). No MPI call here.
  void Abandon() override EXCLUDES(mu_) {
    env_->MarkAbandoned();
    MutexLock lock(mu_);
    abandoned_ = true;
  }

  void SetFailureListener(std::function<void()> listener) override EXCLUDES(mu_) {
    {
      MutexLock lock(mu_);
      if (failure_.ok()) {
        failure_listener_ = std::move(listener);
        return;
      }
    }
    if (listener) listener();
  }

  void Wake() override EXCLUDES(wake_mu_) {
    {
      MutexLock lock(wake_mu_);
      woken_ = true;
    }
    wake_cv_.NotifyOne();
  }

 private:
  enum class WakeReason { kNone, kReturn, kLookAgain };

  // Whether Receive() must return now (woken, or at `now` the deadline passed), or look at the
  // inbox again (the liveness thread took a message or found a failure); consumes either.
  WakeReason TakeWake(Clock::time_point now, const Deadline& deadline) EXCLUDES(wake_mu_) {
    MutexLock lock(wake_mu_);
    if (notified_) {
      notified_ = false;
      return WakeReason::kLookAgain;
    }
    if (!woken_ && now < deadline.at()) return WakeReason::kNone;
    woken_ = false;
    return WakeReason::kReturn;
  }
  // Sleeps until `until`, a Wake() or the liveness thread's notice.
  void Nap(Clock::time_point until) EXCLUDES(wake_mu_) {
    MutexLock lock(wake_mu_);
    while (!woken_ && !notified_) {
      if (!wake_cv_.WaitUntil(wake_mu_, until)) return;
    }
  }
  // The liveness thread's word to a napping Receive(): look at the inbox and the failure again.
  void Notify() EXCLUDES(wake_mu_) {
    {
      MutexLock lock(wake_mu_);
      notified_ = true;
    }
    wake_cv_.NotifyOne();
  }

  struct Outgoing {
    int to = -1;
    std::string bytes;  // owned until MPI completes the send
    MPI_Request request = MPI_REQUEST_NULL;
  };

  Status Post(int to, int tag, std::string bytes) REQUIRES(mu_) {
    sends_.emplace_back();
    Outgoing& s = sends_.back();
    s.to = to;
    s.bytes = std::move(bytes);
    auto lock = env_->Lock();
    if (!lock) {
      sends_.pop_back();
      return env_->StalledError();
    }
    const int rc = MPI_Isend(s.bytes.data(), static_cast<int>(s.bytes.size()), MPI_BYTE, to, tag,
                             comm_, &s.request);
    if (rc != MPI_SUCCESS) {
      sends_.pop_back();
      return FailPeer(to, MpiError(rc, "MPI_Isend", __FILE__, __LINE__));
    }
    return Status::Ok();
  }

  // The abandoned plane's last message to each star peer (kTagClosing), after whatever the caller
  // sent: each fails this rank at its next probe and calls its failure listener, so a peer inside
  // a collective with this rank learns now, not at its deadline or a timeout of silence later, as
  // the closed connections of a TCP plane tell their peers. Failed peers too: one that was only
  // frozen learns it when it resumes, although the messages it then takes make this rank look
  // alive (the destructor does not wait for sends to failed peers). Not peers that said they
  // close: see Send().
  void TellClosing() REQUIRES(mu_) {
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || (rank_ != 0 && r != 0) || closed_[r]) continue;
      (void)Post(r, kTagClosing, std::string());
    }
  }

  // Completes finished sends; a failed one fails its peer (failure_, which callers read).
  void Reap() REQUIRES(mu_) {
    for (auto it = sends_.begin(); it != sends_.end();) {
      int done = 0;
      int rc;
      {
        auto lock = env_->Lock();
        if (!lock) return;  // left pending, as MPI keeps them
        rc = MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
      }
      if (rc != MPI_SUCCESS) {
        (void)FailPeer(it->to, MpiError(rc, "MPI_Test (send)", __FILE__, __LINE__));
        done = 1;
      }
      it = done ? sends_.erase(it) : std::next(it);
    }
  }

  // Takes at most one incoming message: returns whether there was one. A data message goes to the
  // inbox; any message refreshes its sender's liveness.
  StatusOr<bool> TakeOne() REQUIRES(mu_) {
    int flag = 0;
    MPI_Message message;
    MPI_Status status;
    CONCORD_MPI_LOCK_OR_RETURN(lock, *env_);
    CONCORD_MPI_CHECK(MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, &message, &status));
    if (!flag) return false;
    int count = 0;
    CONCORD_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &count));
    std::string bytes(static_cast<size_t>(count), '\0');
    CONCORD_MPI_CHECK(MPI_Mrecv(bytes.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE));
    const int from = status.MPI_SOURCE;
    last_heard_[from] = Clock::now();
    if (status.MPI_TAG == kTagData) inbox_.push_back(ControlMessage{from, std::move(bytes)});
    if (status.MPI_TAG == kTagClosing) {
      closed_[from] = true;
      (void)FailPeer(from, Status(Code::kPeerFailure, "rank " + std::to_string(from) +
                                                          " failed and closed its control plane "
                                                          "(MPI control plane)"));
    }
    return true;
  }

  // One round of the liveness thread: takes what arrived, completes sends, fails peers silent for
  // the timeout and sends due heartbeats. Returns when the next round is due.
  Clock::time_point Beat() REQUIRES(mu_) {
    // Until two probes in a row find nothing: Open MPI's MPI_Improbe may pull a message that
    // arrived while nobody called MPI into its queues and still answer "none", leaving it to the
    // next probe (a round later, without the second look: a notice that came 0.3 s before a round
    // was taken a round after it).
    for (int taken = 0, empty = 0; taken < kMaxTakenPerRound && empty < 2; ++taken) {
      StatusOr<bool> got = TakeOne();
      if (!got.ok()) {
        if (failure_.ok()) failure_ = got.status();
        break;
      }
      empty = *got ? 0 : empty + 1;
    }
    Reap();
    const auto now = Clock::now();
    const auto period = liveness_ / 4;
    Clock::time_point next = now + liveness_ / kProbesPerTimeout;
    for (int r = 0; r < size_ && failure_.ok(); ++r) {
      if (r == rank_ || (rank_ != 0 && r != 0)) continue;
      if (now - last_heard_[r] > liveness_) {
        const std::string seconds = FormatSeconds(static_cast<double>(liveness_.count()) / 1000.0);
        (void)FailPeer(r, Status(Code::kPeerFailure, "rank " + std::to_string(r) + " silent for " +
                                                         seconds + " (MPI control plane)"));
        break;
      }
      if (now - last_beat_[r] >= period) {
        last_beat_[r] = now;
        if (!Post(r, kTagHeartbeat, std::string()).ok()) break;
      }
      next = std::min({next, last_beat_[r] + period, last_heard_[r] + liveness_});
    }
    return next;
  }

  // The liveness thread's body: a round, then a sleep until the next one is due or the
  // destructor stops it.
  void LivenessLoop() EXCLUDES(mu_) {
    for (;;) {
      bool news = false;
      Clock::time_point next;
      std::function<void()> failed_now;
      {
        MutexLock lock(mu_);
        if (stopping_) return;
        const size_t inbox_before = inbox_.size();
        const bool failed_before = !failure_.ok();
        next = Beat();
        news = inbox_.size() != inbox_before || failed_before != !failure_.ok();
        if (!failed_before && !failure_.ok()) failed_now = std::move(failure_listener_);
      }
      if (news) Notify();
      // Outside the lock: the listener interrupts the caller's collective, which may then call in.
      if (failed_now) failed_now();
      MutexLock lock(mu_);
      if (stopping_) return;
      // Just past the moment due, so that the round finds it due.
      stop_cv_.WaitUntil(mu_, next + std::chrono::microseconds(100));
    }
  }

  Status FailPeer(int peer, Status status) REQUIRES(mu_) {
    failed_[peer] = true;
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

  Mutex mu_ ACQUIRED_BEFORE(wake_mu_);
  CondVar stop_cv_;  // with mu_: the liveness thread's sleep, ended by the destructor
  std::vector<Clock::time_point> last_heard_ GUARDED_BY(mu_);  // when a probe last took one
  std::vector<Clock::time_point> last_beat_ GUARDED_BY(mu_);
  std::list<Outgoing> sends_ GUARDED_BY(mu_);  // a list: MPI holds pointers into the bytes
  std::deque<ControlMessage> inbox_ GUARDED_BY(mu_);
  Status failure_ GUARDED_BY(mu_);  // the first failure: Receive() returns it
  // SetFailureListener's: called (once) by the liveness thread when it finds the first failure.
  std::function<void()> failure_listener_ GUARDED_BY(mu_);
  std::vector<bool> failed_ GUARDED_BY(mu_);  // per rank: Send() returns the failure
  std::vector<bool> closed_ GUARDED_BY(mu_);  // per rank: said it closes (kTagClosing)
  bool stopping_ GUARDED_BY(mu_) = false;
  bool abandoned_ GUARDED_BY(mu_) = false;  // Abandon(): the destructor tells the peers

  Mutex wake_mu_;
  CondVar wake_cv_;
  bool woken_ GUARDED_BY(wake_mu_) = false;     // Wake(): Receive() returns false
  bool notified_ GUARDED_BY(wake_mu_) = false;  // Notify(): Receive() looks again

  std::thread liveness_thread_;  // last: it starts once every member above exists
};

}  // namespace

StatusOr<std::unique_ptr<ControlPlane>> CreateMpiControlPlane(
    std::shared_ptr<MpiEnvironment> env, std::chrono::milliseconds liveness_timeout,
    MPI_Comm base) {
  CONCORD_ASSIGN_OR_RETURN(MPI_Comm comm, Duplicate(*env, base, Deadline::After(liveness_timeout)));
  int rank = 0, size = 0;
  {
    CONCORD_MPI_LOCK_OR_RETURN(lock, *env);
    CONCORD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    CONCORD_MPI_CHECK(MPI_Comm_size(comm, &size));
  }
  return std::unique_ptr<ControlPlane>(
      new MpiControlPlane(std::move(env), comm, rank, size, liveness_timeout));
}

}  // namespace concord
