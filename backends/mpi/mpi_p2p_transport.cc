// The point-to-point transport of MPI jobs (CreateMpiP2pTransport): a duplicate of
// MPI_COMM_WORLD of its own, so its messages never match the backend's or the control plane's.
// A message starts with its header on MPI tag 2t (u64 dtype | u64 ndim | u64 bytes | kP2pMaxDims
// x i64 shape | u64 id: the sender's number for a large message, 0 for an eager one). A payload of
// at most kEagerBytes follows the header in the same MPI message (eager: one message, and the
// receiver copies it out of its header buffer); a larger one goes on tag 2t + 1 in pieces of at
// most kPieceBytes. MPI's non-overtaking rule per (source, tag, communicator) keeps them in order.
// A recv posts its header's MPI_Irecv (room for an eager payload) only when it is the first of its
// (peer, tag), and its payload's once the header said where it goes; a refused payload is received
// one piece at a time into a buffer of one piece and dropped (an MPI receive takes a whole message,
// so the pieces bound what a drop needs). A rank whose communicator finalizes sends every peer an
// empty goodbye on tag 2 max_tag + 2 (Finish): Open MPI matches one peer's messages on a
// communicator in the order they were sent, so a goodbye is seen after everything that rank sent
// before it. Then, for each large message its drain drops, it sends the message's sender a drop
// notice on that tag (8 bytes: the message's id) before it receives the payload, so that the notice
// is there when the sender's MPI completes the send (which the payload's receipt does; Open MPI
// delivers one rank's messages to another in the order sent): the send then fails saying that the
// rank finalized, instead of completing as if the message had been received.
#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "backends/mpi/mpi_backend.h"
#include "backends/p2p_transport.h"

namespace concord {
namespace {

constexpr size_t kHeadWords = 4 + kP2pMaxDims;
constexpr size_t kHeadBytes = kHeadWords * sizeof(uint64_t);
constexpr size_t kIdWord = kHeadWords - 1;  // a large message's id (drop notices name it)
// Payloads up to this size travel inside their header's message: with the header, 4 KiB, Open
// MPI's default eager limit over shared memory (btl_vader_eager_limit; a larger message waits for
// the receiver's handshake, which made a 4 KiB send/recv twice as slow as two eager messages).
// Concord raises that limit to 32 KiB when it initialises MPI itself (mpi_environment.cc), but an
// application that initialised MPI keeps its own; and with 32 KiB, payloads of 4-32 KiB in one
// message measured no faster than in two (the copy out of the header buffer costs what the second
// message saves).
constexpr uint64_t kEagerBytes = 4096 - kHeadBytes;
// The most bytes of a larger payload one MPI message carries: a refused payload, dropped piece by
// piece, needs a buffer of this size, not of its own (which may be more than this rank can
// allocate). A piece this large takes milliseconds to move; its MPI message costs microseconds.
constexpr uint64_t kPieceBytes = uint64_t{16} << 20;
static_assert(kPieceBytes <= kMpiMaxMessageBytes, "a piece is one MPI message");
// How often a round (or a send) looks for goodbyes, and how long after one a recv from its sender
// that no message matched waits before it fails (a margin: what the sender sent before is matched
// or queued by MPI before its goodbye). A finalizing rank's drain starts kGoodbyeGrace after its
// goodbyes too: a peer with a send to it in flight runs rounds, so it has taken the goodbye before
// the drain drops that send's message, and looks for the drop notice when the send completes.
constexpr std::chrono::milliseconds kGoodbyeCheck{1};
constexpr std::chrono::milliseconds kGoodbyeGrace{10};
// How long the progress thread leaves new work to a waiter that may come to drive it.
constexpr std::chrono::microseconds kDriverGrace{200};
// How long the progress thread stands by for waiters once nothing is left to do, before it sleeps
// until woken: a job between steps costs it no wake-ups.
constexpr std::chrono::milliseconds kParkAfter{20};
// How long it stands by while a waiter drives (whose rounds complete everything pending, driven or
// not). Each of its wake-ups takes mu_ from the driver: every 200 us, one 64 KiB send/recv in ten
// took 25-30 us instead of 9-12 us.
constexpr std::chrono::milliseconds kDrivenStandby{2};
constexpr size_t kWireWords = kHeadWords + (kEagerBytes + 7) / sizeof(uint64_t);
// Finished sends and emptied recv queues kept for reuse, each: a steady stream of messages
// allocates nothing here (a recv queue's header buffer alone is 4 KiB).
constexpr size_t kSpares = 16;

// An operation's completion (its Done), linked in its transport's Tickets from the call that
// starts the operation until whoever completes it claims it, exactly once: a round, a driver or a
// failure (under mu_), or Abandon() (without mu_, which a thread stuck inside MPI may hold for
// good). Moved only while unlinked.
struct Ticket {
  Ticket() = default;
  Ticket(Ticket&& other) noexcept : done(std::move(other.done)) {}
  Ticket& operator=(Ticket&&) = delete;
  P2pTransport::Done done;
  Ticket* prev = nullptr;  // null: not linked (not yet, or claimed)
  Ticket* next = nullptr;
};

// Claimed Dones with their status, run once mu_ is released (an empty one, claimed by Abandon()
// meanwhile, is skipped).
using Completions = std::vector<std::pair<P2pTransport::Done, Status>>;

void RunCompletions(Completions& out) {
  for (auto& [done, s] : out) {
    if (done) done(s);
  }
  out.clear();
}

// The completions of the operations in flight: each operation's ticket, and the completions that
// a round or a failure decided (Complete) but no thread has run yet (TakeCompleted). Both stay
// here, reachable without mu_, until a thread runs them: a thread that decided a completion and
// then stuck inside MPI (later in the same round) would otherwise keep it for good. Thread-safe,
// under a spin lock of its own (held for a few pointer writes; no Done runs under it): Link() and
// Claim() or Complete() run for every operation, where a std::mutex cost 2-3% of a small send/recv
// over MPI.
class Tickets {
 public:
  Tickets() { head_.prev = head_.next = &head_; }
  Tickets(const Tickets&) = delete;
  Tickets& operator=(const Tickets&) = delete;

  void Link(Ticket& t, P2pTransport::Done done) {
    SpinLock lock(busy_);
    t.done = std::move(done);
    t.prev = head_.prev;
    t.next = &head_;
    head_.prev->next = &t;
    head_.prev = &t;
  }
  // The ticket's Done, for a completion its caller runs itself before it calls into MPI again; an
  // empty one when Abandon() claimed it already.
  P2pTransport::Done Claim(Ticket& t) {
    SpinLock lock(busy_);
    if (t.next == nullptr) return nullptr;
    Unlink(t);
    return std::move(t.done);
  }
  // The ticket's operation completes with `status`: kept with it until TakeCompleted() (nothing,
  // when Abandon() claimed it already).
  void Complete(Ticket& t, Status status) {
    SpinLock lock(busy_);
    if (t.next == nullptr) return;
    Unlink(t);
    completed_.emplace_back(std::move(t.done), std::move(status));
    has_completed_.store(true, std::memory_order_release);
  }
  bool HasCompleted() const { return has_completed_.load(std::memory_order_acquire); }
  // The completions decided so far, into `out` (empty), for the caller to run, in order.
  void TakeCompleted(Completions& out) {
    if (!HasCompleted()) return;
    SpinLock lock(busy_);
    out.swap(completed_);  // completed_ keeps out's memory for the next ones
    has_completed_.store(false, std::memory_order_release);
  }
  // Abandon(): the completions decided so far, then every operation in flight with `status`.
  Completions ClaimAll(const Status& status) {
    SpinLock lock(busy_);
    Completions all;
    all.swap(completed_);
    has_completed_.store(false, std::memory_order_release);
    while (head_.next != &head_) {
      Ticket& t = *head_.next;
      Unlink(t);
      all.emplace_back(std::move(t.done), status);
    }
    return all;
  }

 private:
  static void Unlink(Ticket& t) {
    t.prev->next = t.next;
    t.next->prev = t.prev;
    t.prev = t.next = nullptr;
  }
  // Taken for the length of one call.
  class SpinLock {
   public:
    explicit SpinLock(std::atomic_flag& busy) : busy_(busy) {
      while (busy_.test_and_set(std::memory_order_acquire)) std::this_thread::yield();
    }
    ~SpinLock() { busy_.clear(std::memory_order_release); }
    SpinLock(const SpinLock&) = delete;
    SpinLock& operator=(const SpinLock&) = delete;

   private:
    std::atomic_flag& busy_;
  };
  std::atomic_flag busy_ = ATOMIC_FLAG_INIT;
  Ticket head_;
  Completions completed_;
  std::atomic<bool> has_completed_{false};
};

struct SendOp {
  std::vector<uint64_t> wire;  // the header, then an eager payload
  std::vector<MPI_Request> requests;
  Deadline deadline = Deadline::Infinite();
  Ticket ticket;
  int peer = -1;
  int64_t tag = 0;
  uint64_t id = 0;       // a large message's (its payload goes apart), else 0
  bool dropped = false;  // its receiver finalized and dropped it (a drop notice said so)
};

// A drop notice on its way (its request is MPI's until it completes): the dropped message's id.
struct DropNotice {
  uint64_t id = 0;
  int peer = -1;
  MPI_Request request = MPI_REQUEST_NULL;
};

// Why a timed-out message closes the transport (every operation fails with that error): MPI
// cannot withdraw a message it has started to send or receive, and would still read or write the
// caller's buffer, which the error gives back; so MPI is left alone from then on.
constexpr const char* kClosedByTimeout =
    " (MPI cannot withdraw a message it started, so point-to-point on this communicator is "
    "closed: every pending and later send and recv fails with this error)";

struct RecvOp {
  Deadline deadline = Deadline::Infinite();
  P2pTransport::Place place;
  Ticket ticket;
};

// The recvs of one (peer, tag), in order; only the first has MPI requests.
struct RecvQueue {
  std::deque<RecvOp> ops;
  bool head_posted = false;
  std::vector<uint64_t> head = std::vector<uint64_t>(kWireWords);  // the header, eager payload
  MPI_Request head_request = MPI_REQUEST_NULL;
  std::vector<MPI_Request> payload;  // posted once the header arrived
  std::vector<char> drop;            // a refused payload's pieces land here, one at a time
  uint64_t drop_left = 0;            // bytes of a refused payload whose receive is not posted yet
};

// Contract: see P2pTransport. Owns its communicator and its progress thread, which tests every
// pending MPI request (each call under the MpiEnvironment's lock, so SERIALIZED suffices) and
// completes what finished: it spins while work is pending (yielding the CPU), sleeps on cv_ when
// there is none, and stands aside while a waiter drives (Drive(): the waiting thread tests the
// requests itself, so a blocking send or recv costs no hand-off between threads). Once waiters
// drive, it stands by with timed waits and takes up work that no waiter came for after
// kDriverGrace, or up to kDrivenStandby later when a waiter drove at its last look (Send() and
// Recv() wake it only while it sleeps: WakeIfNeeded). Send() and
// Recv() post their first MPI calls on the calling thread; a send MPI completes at once (an eager
// one, usually) completes there. mu_ guards the operations; it is taken before the environment's
// lock and never held while `done` runs. Finish() sends the goodbyes and refuses later sends and
// recvs, but leaves the transport open (a peer may still take a message MPI started) until
// Close(); until then (or a failure, after which MPI is left alone) the progress thread receives
// and drops, from kGoodbyeGrace on, each message that no recv in flight will take, so that a
// peer's send that started before that peer saw the goodbye completes (telling the sender of each
// large one first: a drop notice). A peer's goodbye fails, with kPeerFailure saying it finalized,
// this rank's recvs from it that no message matched within kGoodbyeGrace, and later sends to it
// at once (a send looks for goodbyes itself when no round has for kGoodbyeCheck: an idle rank's
// rounds do not run); a send to it in flight fails when MPI completes it if a drop notice for it
// came first (else the peer's recv took it, or MPI sent it eagerly: it completes), or at its
// deadline alone if the peer never takes it (it closed first): MPI keeps such a send, as it
// cannot withdraw it (orphans_), and the rest of the transport goes on.
//
// A thread stuck for good inside MPI (Open MPI 4 over TCP, after a peer's link went down, kept the
// thread that met the error waiting for its help message to be shown: seconds, or for ever) may
// hold mu_. Close() waits for mu_ and for the progress thread at most kStuckWait in all, then
// abandons the transport (Abandon): it completes every operation through its ticket (Tickets),
// which needs no mu_; later calls are refused without waiting for mu_, and the stuck thread, if
// it comes back, places no message (StartPayload) and leaves MPI alone. The progress thread holds
// this object (created by Create(), shared with the handle CreateMpiP2pTransport returns), so an
// abandoned one may outlive the handle.
class MpiP2pTransport : public P2pTransport {
 public:
  // How long Close() waits for a thread that holds mu_ or for the progress thread to end before
  // it takes them for stuck inside MPI. A round holds mu_ for microseconds.
  static constexpr std::chrono::seconds kStuckWait{1};

  static std::shared_ptr<MpiP2pTransport> Create(std::shared_ptr<MpiEnvironment> env, MPI_Comm comm,
                                                 int rank, int size, int64_t max_tag) {
    std::shared_ptr<MpiP2pTransport> t(
        new MpiP2pTransport(std::move(env), comm, rank, size, max_tag));
    t->thread_ = std::thread([self = t] { self->Loop(); });
    return t;
  }
  // The communicator is never freed: a peer's send this rank never received would be kept by Open
  // MPI for the next communicator that takes its context id, and lose that one's message (as the
  // control plane's heartbeats did: backends/mpi/mpi_control_plane.cc). MPI_Finalize releases it.
  ~MpiP2pTransport() override {
    Close(Status(Code::kNotInitialized, "the communicator was finalized"));
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int64_t max_tag() const override { return max_tag_; }
  bool OnProgressThread() const override { return std::this_thread::get_id() == thread_id_; }
  bool PeerFinalized(int peer) const override {
    return peer >= 0 && peer < size_ && peer_finalized_[peer].load();
  }

  void Send(int peer, int64_t tag, const P2pMeta& meta, const void* data, Deadline deadline,
            Done done) override {
    std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
    if (!LockUnlessAbandoned(lock) || RefusedLocked()) {
      const Status refused = lock.owns_lock() ? RefusalLocked() : Abandoned();
      if (lock.owns_lock()) lock.unlock();
      done(refused);
      return;
    }
    // The rounds look for goodbyes only while there is work: one that came while this rank was
    // idle is taken here, or this send would complete for a message the peer drops.
    const auto now = Clock::now();
    if (now - goodbyes_checked_ >= kGoodbyeCheck) {
      goodbyes_checked_ = now;
      Status s = TakeGoodbyes(MPI_ANY_SOURCE, now);
      if (!s.ok()) {
        FailAllLocked(s);
        WakeIfNeeded();
        lock.unlock();
        done(s);
        return;
      }
    }
    if (peer_finalized_[peer].load()) {
      lock.unlock();
      done(Status(Code::kPeerFailure, Finalized(peer)));
      return;
    }
    const bool eager = meta.bytes <= kEagerBytes;
    const auto it = NewSend();
    SendOp& op = *it;
    op.peer = peer;
    op.tag = tag;
    op.deadline = deadline;
    tickets_.Link(op.ticket, std::move(done));
    op.id = eager ? 0 : ++last_id_;
    op.dropped = false;
    // Only the header is zeroed: an eager payload is copied over the rest.
    op.wire.resize(kHeadWords + (eager ? (meta.bytes + 7) / 8 : 0));
    std::fill(op.wire.begin(), op.wire.begin() + kHeadWords, 0);
    op.wire[0] = static_cast<uint64_t>(meta.dtype);
    op.wire[1] = meta.shape.size();
    op.wire[2] = meta.bytes;
    std::copy(meta.shape.begin(), meta.shape.end(), op.wire.begin() + 3);
    op.wire[kIdWord] = op.id;
    if (eager && meta.bytes > 0) std::memcpy(op.wire.data() + kHeadWords, data, meta.bytes);
    Status s = Post(op, peer, tag, eager ? nullptr : data, meta.bytes);
    bool sent = false;
    if (s.ok()) s = TestAll(op.requests, &sent);
    if (!s.ok()) {
      FailAllLocked(s);
    } else if (sent) {
      Done finished = tickets_.Claim(op.ticket);
      RetireSend(it);
      lock.unlock();
      if (finished) finished(Status::Ok());
      return;
    }
    WakeIfNeeded();
  }

  void Recv(int peer, int64_t tag, Deadline deadline, Place place, Done done) override {
    std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
    if (!LockUnlessAbandoned(lock) || RefusedLocked()) {
      const Status refused = lock.owns_lock() ? RefusalLocked() : Abandoned();
      if (lock.owns_lock()) lock.unlock();
      done(refused);
      return;
    }
    RecvQueue& q = RecvQueueOf(peer, tag);
    RecvOp& op = q.ops.emplace_back();
    op.deadline = deadline;
    op.place = std::move(place);
    tickets_.Link(op.ticket, std::move(done));
    if (!q.head_posted) {
      Status s = PostHead(q, peer, tag);
      if (!s.ok()) FailAllLocked(s);
    }
    WakeIfNeeded();
  }

  void Drive(const std::function<bool()>& finished, Deadline deadline,
             std::chrono::microseconds busy_poll) override {
    // Bounded by the deadline too: a thread stuck inside MPI may hold mu_ (the waiter then waits
    // for its request plainly, which Close() completes).
    std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
    if (!LockUnlessAbandoned(lock, deadline) || stop_) return;
    ++drivers_;
    driven_ = true;
    Completions out;
    auto idle_since = Clock::now();
    // One clock read per round serves the deadlines and the polling: at 4 KiB, reading it for
    // each check took 13% of a send/recv.
    for (auto now = idle_since; !stop_ && now < deadline.at(); now = Clock::now()) {
      const bool progressed = Round(now);
      const bool idle = sends_.empty() && recvs_.empty();
      lock.unlock();
      tickets_.TakeCompleted(out);
      RunCompletions(out);
      const bool leave = finished() || idle;
      const auto quiet = now - idle_since;
      if (!leave && progressed) {
        idle_since = now;
      } else if (!leave && quiet >= busy_poll) {
        // Below busy_poll it polls on: a thread that yields waits a time slice for the core on a
        // busy host.
        if (quiet < std::chrono::milliseconds(2)) {
          std::this_thread::yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
      }
      if (leave || !LockUnlessAbandoned(lock, deadline)) {
        // drivers_ is atomic: this waiter leaves even when mu_ stays held.
        --drivers_;
        // try_lock first: the usual case, without the clock read of a deadline.
        if (lock.owns_lock() || lock.try_lock() ||
            LockUnlessAbandoned(lock, Deadline::After(kAbandonedCheck))) {
          WakeIfNeeded();
        }
        return;
      }
    }
    --drivers_;
    WakeIfNeeded();
  }

  bool Finish(const Status& status) override {
    if (abandoned_.load()) return true;
    // A thread stuck inside MPI may hold mu_: then nothing can be told, and the transport is
    // abandoned (closed) as Close() would.
    std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
    if (!LockBy(lock, Deadline::After(kStuckWait))) {
      Abandon(status, "a thread held the transport's lock");
      return true;
    }
    if (stop_ || RefusedLocked()) return false;
    finished_ = status;
    finished_at_ = Clock::now();
    Status s = SendGoodbyes();
    if (!s.ok()) FailAllLocked(s);
    WakeIfNeeded();
    return false;  // open until Close(): a peer may still take a message MPI started
  }

  void Close(const Status& status) override {
    if (abandoned_.load()) return;
    const Deadline stuck_by = Deadline::After(kStuckWait);
    {
      std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
      if (!LockBy(lock, stuck_by)) return Abandon(status, "a thread held the transport's lock");
      if (stop_) return;
      stop_ = true;
      cv_.notify_one();
    }
    if (thread_.joinable()) {
      std::unique_lock<std::mutex> lock(exit_mu_);
      if (!exit_cv_.wait_until(lock, stuck_by.at(), [this] { return exited_; })) {
        lock.unlock();
        return Abandon(status, "its progress thread did not return");
      }
      lock.unlock();
      thread_.join();
    }
    Completions out;
    {
      // A driving waiter may have entered MPI meanwhile.
      std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
      if (!LockBy(lock, stuck_by)) return Abandon(status, "a thread held the transport's lock");
      if (closed_.ok()) closed_ = status;
      Fail(status);
    }
    tickets_.TakeCompleted(out);
    RunCompletions(out);
  }

 private:
  // How often a call waiting for mu_ looks whether the transport was abandoned meanwhile.
  static constexpr std::chrono::milliseconds kAbandonedCheck{20};
  // How long Abandon() waits at most for a thread that is placing a message (StartPayload).
  static constexpr std::chrono::milliseconds kPlacingWait{100};

  // placing_ set for the length of a scope (under mu_: one thread at a time). Sequentially
  // consistent, as abandoned_: a placing thread sees abandoned_ set, or Abandon() sees placing_.
  class PlacingGuard {
   public:
    explicit PlacingGuard(std::atomic<bool>& placing) : placing_(placing) { placing_.store(true); }
    ~PlacingGuard() { placing_.store(false); }
    PlacingGuard(const PlacingGuard&) = delete;
    PlacingGuard& operator=(const PlacingGuard&) = delete;

   private:
    std::atomic<bool>& placing_;
  };

  MpiP2pTransport(std::shared_ptr<MpiEnvironment> env, MPI_Comm comm, int rank, int size,
                  int64_t max_tag)
      : env_(std::move(env)),
        comm_(comm),
        rank_(rank),
        size_(size),
        max_tag_(max_tag),
        peer_finalized_(static_cast<size_t>(size)),
        finalized_at_(static_cast<size_t>(size)) {}

  // Takes mu_ (`lock` is deferred on it) by the deadline, unless the transport is abandoned
  // meanwhile (its holder is stuck inside MPI): then returns false, without it.
  bool LockUnlessAbandoned(std::unique_lock<std::mutex>& lock,
                           Deadline deadline = Deadline::Infinite()) {
    if (lock.try_lock()) return true;
    while (!abandoned_.load()) {
      if (LockBy(lock, deadline.Earlier(Deadline::After(kAbandonedCheck)))) return true;
      if (deadline.passed()) return false;
    }
    return false;
  }

  // Takes mu_ by the deadline (a finite one), or returns false without it.
  bool LockBy(std::unique_lock<std::mutex>& lock, Deadline deadline) {
    if (lock.try_lock()) return true;
    // pthread_mutex_timedlock reads CLOCK_REALTIME: the time left, from now on that clock.
    const auto left = std::max(deadline.at() - Clock::now(), Clock::duration::zero());
    timespec at{};
    ::clock_gettime(CLOCK_REALTIME, &at);
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count() +
                       static_cast<int64_t>(at.tv_nsec);
    at.tv_sec += static_cast<time_t>(ns / 1000000000);
    at.tv_nsec = static_cast<long>(ns % 1000000000);
    if (::pthread_mutex_timedlock(mu_.native_handle(), &at) != 0) return false;
    lock = std::unique_lock<std::mutex>(mu_, std::adopt_lock);
    return true;
  }

  // Whether a new operation is refused (under mu_): the transport was abandoned, closed or
  // finished; and why.
  bool RefusedLocked() const { return abandoned_.load() || !closed_.ok() || !finished_.ok(); }
  Status RefusalLocked() {
    if (abandoned_.load()) return Abandoned();
    if (!closed_.ok()) return closed_;
    return finished_;
  }

  Status Abandoned() {
    std::lock_guard<std::mutex> lock(abandon_mu_);
    return abandoned_status_;
  }

  // Close() when a thread held mu_, or the progress thread did not end, for kStuckWait: they are
  // taken for stuck inside MPI. Completes every operation in flight through its ticket, and
  // refuses later ones, with `status` (saying so); leaves MPI to that thread (the environment is
  // marked abandoned: MPI keeps the buffers of what it started, and is not finalized) and the
  // progress thread to itself (detached: it holds this object, and ends at its next look at
  // stop_ if MPI ever returns).
  void Abandon(const Status& status, const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(abandon_mu_);
      if (abandoned_.load()) return;
      abandoned_status_ =
          Status(status.code(), status.message() + " (point-to-point gave up on MPI: " + why +
                                    " for " + std::to_string(kStuckWait.count()) +
                                    " s, stuck inside MPI; MPI keeps what it started)");
      abandoned_.store(true);
    }
    // A thread placing a message (StartPayload) saw abandoned_ false: it writes that operation's
    // memory only until it returns, microseconds; a place that does not return (as a stuck one in
    // the tests) is given up on too.
    const Deadline placed_by = Deadline::After(kPlacingWait);
    while (placing_.load() && !placed_by.passed()) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    stop_.store(true);
    cv_.notify_all();
    env_->MarkAbandoned();
    if (thread_.joinable()) thread_.detach();
    Completions all = tickets_.ClaimAll(Abandoned());
    RunCompletions(all);
  }

  std::string Finalized(int peer) const {
    return "rank " + std::to_string(peer) +
           " finalized its communicator (concord_finalize): it sends and receives nothing more";
  }

  int GoodbyeTag() const { return static_cast<int>(2 * max_tag_ + 2); }

  // An empty message to every peer on the goodbye tag, behind what this rank sent it. The
  // requests are freed at once: MPI completes such a send by itself.
  Status SendGoodbyes() {
    CONCORD_MPI_LOCK_OR_RETURN(lock, *env_);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      MPI_Request request = MPI_REQUEST_NULL;
      CONCORD_MPI_CHECK(MPI_Isend(nullptr, 0, MPI_BYTE, peer, GoodbyeTag(), comm_, &request));
      CONCORD_MPI_CHECK(MPI_Request_free(&request));
    }
    return Status::Ok();
  }

  // Takes what came on the goodbye tag from `source` (MPI_ANY_SOURCE: from every peer): a goodbye
  // says that its sender finalized at `now`, a drop notice that the finalized sender dropped one
  // of this rank's large messages (the send fails once MPI completes it). Probed, not received by
  // a posted receive: after a failure nothing is left posted for MPI to fill. A probe that finds
  // nothing makes MPI progress, which may bring in more (after a stall, the goodbye with a drop
  // notice and the payload's receipt): it ends at the second such probe in a row.
  Status TakeGoodbyes(int source, Clock::time_point now) {
    CONCORD_MPI_LOCK_OR_RETURN(lock, *env_);
    for (int misses = 0; misses < 2;) {
      int flag = 0;
      MPI_Message message = MPI_MESSAGE_NULL;
      MPI_Status st;
      CONCORD_MPI_CHECK(MPI_Improbe(source, GoodbyeTag(), comm_, &flag, &message, &st));
      if (flag == 0) {
        ++misses;
        continue;
      }
      misses = 0;
      int bytes = 0;
      CONCORD_MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &bytes));
      const int peer = st.MPI_SOURCE;
      uint64_t id = 0;
      if (bytes != 0 && bytes != static_cast<int>(sizeof(id))) {
        return ProtocolError("a " + std::to_string(bytes) +
                             "-byte message on the point-to-point goodbye tag from rank " +
                             std::to_string(peer) + " (a goodbye is empty, a drop notice 8 bytes)");
      }
      CONCORD_MPI_CHECK(MPI_Mrecv(&id, bytes, MPI_BYTE, &message, MPI_STATUS_IGNORE));
      if (peer < 0 || peer >= size_ || peer == rank_) continue;
      if (bytes == 0) {
        finalized_at_[peer] = now;
        peer_finalized_[peer].store(true);
        continue;
      }
      for (SendOp& op : sends_) {
        if (op.peer == peer && op.id == id) {
          op.dropped = true;
          break;
        }
      }
    }
    return Status::Ok();
  }

  // After Finish(): receives and drops the messages that no recv of this rank will take (this
  // rank posts no new ones), so that a peer's send that started before it saw the goodbye
  // completes instead of waiting out its deadline. Peer by peer, each peer's in the order they
  // came: they wait behind the first that a recv in flight may still take (a header or a payload
  // of its (peer, tag), whose receive a later round posts) or a goodbye (the next look takes it),
  // and the other peers' do not (a probe of any source stopped at the first such message, and the
  // others' waited until its recv completed). One probe of any source finds most often that
  // nothing is there; one per peer follows only when something is. A dropped large message's
  // sender gets a drop notice before the payload is received (a peer's next messages wait until
  // the notice has left: they may be that payload).
  Status DropUnexpected(bool* progressed) {
    CONCORD_MPI_LOCK_OR_RETURN(lock, *env_);
    int any = 0;
    MPI_Status st;
    CONCORD_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &any, &st));
    for (int source = 0; any != 0 && source < size_; ++source) {
      const bool noticing = std::any_of(notices_.begin(), notices_.end(),
                                        [source](const DropNotice& n) { return n.peer == source; });
      for (int flag = 0; source != rank_ && !noticing;) {
        CONCORD_MPI_CHECK(MPI_Iprobe(source, MPI_ANY_TAG, comm_, &flag, &st));
        if (flag == 0 || st.MPI_TAG == GoodbyeTag() ||
            recvs_.count({source, st.MPI_TAG / 2}) != 0) {
          break;
        }
        // The first message from that source with that tag is the one just probed.
        MPI_Message message = MPI_MESSAGE_NULL;
        CONCORD_MPI_CHECK(MPI_Improbe(source, st.MPI_TAG, comm_, &flag, &message, &st));
        if (flag == 0) break;
        int bytes = 0;
        CONCORD_MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &bytes));
        if (dropped_.size() < static_cast<size_t>(bytes)) dropped_.resize(bytes);
        CONCORD_MPI_CHECK(MPI_Mrecv(dropped_.data(), bytes, MPI_BYTE, &message, MPI_STATUS_IGNORE));
        *progressed = true;
        // A large message's header: its payload follows on tag 2t + 1.
        uint64_t head[kHeadWords];
        if (st.MPI_TAG % 2 != 0 || bytes != static_cast<int>(kHeadBytes)) continue;
        std::memcpy(head, dropped_.data(), kHeadBytes);
        if (head[2] <= kEagerBytes || head[kIdWord] == 0) continue;
        DropNotice& notice = notices_.emplace_back();
        notice.id = head[kIdWord];
        notice.peer = source;
        CONCORD_MPI_CHECK(MPI_Isend(&notice.id, sizeof(notice.id), MPI_BYTE, source, GoodbyeTag(),
                                    comm_, &notice.request));
        CONCORD_MPI_CHECK(MPI_Test(&notice.request, &flag, MPI_STATUS_IGNORE));
        if (flag == 0) break;
        notices_.pop_back();
      }
    }
    return Status::Ok();
  }

  // Tests what was left to MPI while this rank runs: the sends answered before MPI completed
  // them, and the drop notices not sent at once; forgets what completed.
  Status TestLeftToMpi() {
    for (auto it = orphans_.begin(); it != orphans_.end();) {
      bool done = false;
      CONCORD_RETURN_IF_ERROR(TestAll(it->requests, &done));
      it = done ? orphans_.erase(it) : std::next(it);
    }
    CONCORD_MPI_LOCK_OR_RETURN(lock, *env_);
    for (auto it = notices_.begin(); it != notices_.end();) {
      int done = 0;
      CONCORD_MPI_CHECK(MPI_Test(&it->request, &done, MPI_STATUS_IGNORE));
      it = done != 0 ? notices_.erase(it) : std::next(it);
    }
    return Status::Ok();
  }

  // Whether `peer`'s goodbye came at least kGoodbyeGrace before `now`.
  bool GoneBy(int peer, Clock::time_point now) const {
    return peer_finalized_[peer].load() && now - finalized_at_[peer] >= kGoodbyeGrace;
  }

  // Sends the op's wire (header, eager payload) and, when `data` is given, its payload after it.
  Status Post(SendOp& op, int peer, int64_t tag, const void* data, uint64_t bytes) {
    CONCORD_MPI_LOCK_OR_RETURN(lock, *env_);
    op.requests.emplace_back();
    const int wire_bytes = static_cast<int>(data == nullptr ? kHeadBytes + bytes : kHeadBytes);
    CONCORD_MPI_CHECK(MPI_Isend(op.wire.data(), wire_bytes, MPI_BYTE, peer,
                                static_cast<int>(2 * tag), comm_, &op.requests.back()));
    for (uint64_t at = 0; data != nullptr && at < bytes; at += kPieceBytes) {
      const int n = static_cast<int>(std::min<uint64_t>(kPieceBytes, bytes - at));
      op.requests.emplace_back();
      CONCORD_MPI_CHECK(MPI_Isend(static_cast<const char*>(data) + at, n, MPI_BYTE, peer,
                                  static_cast<int>(2 * tag + 1), comm_, &op.requests.back()));
    }
    return Status::Ok();
  }

  Status PostHead(RecvQueue& q, int peer, int64_t tag) {
    CONCORD_MPI_LOCK_OR_RETURN(lock, *env_);
    q.head_posted = true;
    CONCORD_MPI_CHECK(MPI_Irecv(q.head.data(), static_cast<int>(kWireWords * sizeof(uint64_t)),
                                MPI_BYTE, peer, static_cast<int>(2 * tag), comm_, &q.head_request));
    return Status::Ok();
  }

  // Tests requests; *all_done says whether every one completed.
  Status TestAll(std::vector<MPI_Request>& requests, bool* all_done) {
    CONCORD_MPI_LOCK_OR_RETURN(lock, *env_);
    int flag = 0;
    CONCORD_MPI_CHECK(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag,
                                  MPI_STATUSES_IGNORE));
    *all_done = flag != 0;
    return Status::Ok();
  }

  // Tests the header's receive; on arrival *received is the size of its message.
  Status TestHead(RecvQueue& q, bool* arrived, int* received) {
    CONCORD_MPI_LOCK_OR_RETURN(lock, *env_);
    int flag = 0;
    MPI_Status st;
    CONCORD_MPI_CHECK(MPI_Test(&q.head_request, &flag, &st));
    *arrived = flag != 0;
    if (*arrived) CONCORD_MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, received));
    return Status::Ok();
  }

  // A header of `received` bytes (with an eager payload) arrived: check it, ask where the payload
  // goes, copy an eager one there or post the payload's receives (a refused one's first piece,
  // into a buffer of one piece: one that cannot be allocated fails the transport, as the pieces
  // cannot be skipped).
  Status StartPayload(RecvQueue& q, int peer, int64_t tag, int received) {
    // Built only for an error: this runs for every message.
    auto malformed = [&](const char* why) {
      return ProtocolError("malformed point-to-point header from rank " + std::to_string(peer) +
                           " (tag " + std::to_string(tag) + ")" + why);
    };
    P2pMeta meta;
    const uint64_t dtype = q.head[0], ndim = q.head[1];
    if (received < static_cast<int>(kHeadBytes) || !IsValidDType(static_cast<int>(dtype)) ||
        ndim > kP2pMaxDims) {
      return malformed("");
    }
    meta.dtype = static_cast<DType>(dtype);
    meta.bytes = q.head[2];
    uint64_t elements = 1;
    for (uint64_t i = 0; i < ndim; ++i) {
      const auto d = static_cast<int64_t>(q.head[3 + i]);
      if (d < 0 || __builtin_mul_overflow(elements, static_cast<uint64_t>(d), &elements)) {
        return malformed(": a bad dimension");
      }
      meta.shape.push_back(d);
    }
    for (uint64_t i = ndim; i < kP2pMaxDims; ++i) {
      if (q.head[3 + i] != 0) return malformed(": a dimension past its rank");
    }
    // An eager header carries its whole payload, a larger one's none.
    const uint64_t eager = static_cast<uint64_t>(received) - kHeadBytes;
    if (__builtin_mul_overflow(elements, DTypeSize(meta.dtype), &elements) ||
        elements != meta.bytes || eager != (meta.bytes <= kEagerBytes ? meta.bytes : 0)) {
      return malformed(": its size does not match its shape or its message");
    }
    // From here until its payload's receives are posted the operation's memory is written (its
    // place, its destination): not once Abandon() completed it (this thread may come back from a
    // call that kept it inside MPI past that). Abandon() waits for a thread past this check.
    PlacingGuard placing(placing_);
    if (abandoned_.load()) return Abandoned();
    char* dest = static_cast<char*>(q.ops.front().place(meta));
    if (meta.bytes <= kEagerBytes) {
      if (dest != nullptr && meta.bytes > 0)
        std::memcpy(dest, q.head.data() + kHeadWords, meta.bytes);
      return Status::Ok();
    }
    if (dest == nullptr) {
      const uint64_t piece = std::min(meta.bytes, kPieceBytes);
      try {
        q.drop.resize(piece);
      } catch (const std::bad_alloc&) {
        return Status(Code::kSystemError,
                      "recv from rank " + std::to_string(peer) + " with tag " +
                          std::to_string(tag) + ": no memory for a " + std::to_string(piece) +
                          "-byte buffer to drop the refused " + std::to_string(meta.bytes) +
                          "-byte message (MPI cannot skip it, so point-to-point on this "
                          "communicator is closed: every pending and later send and recv fails "
                          "with this error)");
      }
      q.drop_left = meta.bytes;
      return PostDropPiece(q, peer, tag);
    }
    CONCORD_MPI_LOCK_OR_RETURN(lock, *env_);
    for (uint64_t at = 0; at < meta.bytes; at += kPieceBytes) {
      const int n = static_cast<int>(std::min<uint64_t>(kPieceBytes, meta.bytes - at));
      q.payload.emplace_back();
      CONCORD_MPI_CHECK(MPI_Irecv(dest + at, n, MPI_BYTE, peer, static_cast<int>(2 * tag + 1),
                                  comm_, &q.payload.back()));
    }
    return Status::Ok();
  }

  // Receives the next piece of a refused payload into q.drop (its previous piece, if any, has
  // arrived: one receive into it at a time).
  Status PostDropPiece(RecvQueue& q, int peer, int64_t tag) {
    CONCORD_MPI_LOCK_OR_RETURN(lock, *env_);
    const uint64_t n = std::min(q.drop_left, kPieceBytes);
    q.drop_left -= n;
    q.payload.assign(1, MPI_REQUEST_NULL);
    CONCORD_MPI_CHECK(MPI_Irecv(q.drop.data(), static_cast<int>(n), MPI_BYTE, peer,
                                static_cast<int>(2 * tag + 1), comm_, &q.payload.back()));
    return Status::Ok();
  }

  // Cancels the unmatched header receive: *cancelled says whether it was (else it matched
  // meanwhile, and *received is the size of its message). Fails only when MPI is stalled: the
  // receive is then left to MPI.
  Status CancelHead(RecvQueue& q, bool* cancelled, int* received) {
    CONCORD_MPI_LOCK_OR_RETURN(lock, *env_);
    MPI_Cancel(&q.head_request);
    MPI_Status st;
    MPI_Wait(&q.head_request, &st);
    int flag = 0;
    MPI_Test_cancelled(&st, &flag);
    *cancelled = flag != 0;
    if (!*cancelled) MPI_Get_count(&st, MPI_BYTE, received);
    return Status::Ok();
  }

  // One pass over everything pending, its deadlines read against `now`; returns whether anything
  // completed (in tickets_, for the caller to run once it released mu_).
  bool Round(Clock::time_point now) {
    bool progressed = false;
    // A failed transport leaves MPI alone: no goodbye taken, nothing drained.
    const bool look = closed_.ok() && now - goodbyes_checked_ >= kGoodbyeCheck;
    if (look) {
      goodbyes_checked_ = now;
      Status s = TakeGoodbyes(MPI_ANY_SOURCE, now);
      if (s.ok()) s = TestLeftToMpi();
      if (!s.ok()) {
        FailAllLocked(s);
        return true;
      }
    }
    for (auto it = sends_.begin(); it != sends_.end();) {
      bool done = false;
      Status s = TestAll(it->requests, &done);
      // A large message's drop notice comes before its payload's receipt, which completes it: for
      // a peer known to have finalized (the drain drops nothing before its peers have taken its
      // goodbye), taken before the send says how it went.
      if (s.ok() && done && it->id != 0 && peer_finalized_[it->peer].load()) {
        s = TakeGoodbyes(it->peer, now);
      }
      if (!s.ok()) {
        FailAllLocked(s);
        return true;
      }
      if (done) {
        tickets_.Complete(it->ticket,
                          it->dropped ? Status(Code::kPeerFailure,
                                               Finalized(it->peer) + " (it dropped this message)")
                                      : Status::Ok());
        RetireSend(it++);
        progressed = true;
      } else if (now >= it->deadline.at() && peer_finalized_[it->peer].load()) {
        // The peer finalized and has not taken it: it takes messages until it closes, so it
        // never will. The send fails alone; MPI keeps it, as MPI cannot withdraw it.
        tickets_.Complete(
            it->ticket,
            Status(Code::kPeerFailure,
                   Finalized(it->peer) + " (it did not take this message within the timeout)"));
        orphans_.splice(orphans_.end(), sends_, it++);
        progressed = true;
      } else if (now >= it->deadline.at()) {
        FailAllLocked(TimeoutError("send to rank " + std::to_string(it->peer) + " with tag " +
                                   std::to_string(it->tag) + ": not received within the timeout" +
                                   kClosedByTimeout));
        return true;
      } else {
        ++it;
      }
    }
    for (auto it = recvs_.begin(); it != recvs_.end();) {
      const auto [peer, tag] = it->first;
      RecvQueue& q = it->second;
      Status s = Status::Ok();
      if (q.payload.empty() && q.head_request != MPI_REQUEST_NULL) {
        bool done = false;
        int received = 0;
        s = TestHead(q, &done, &received);
        if (s.ok() && done) {
          s = StartPayload(q, peer, tag, received);
          progressed = true;
        } else if (s.ok() && GoneBy(peer, now)) {
          // The peer finalized: no message will come for this recv or those behind it.
          bool cancelled = false;
          s = CancelHead(q, &cancelled, &received);
          if (s.ok() && cancelled) {
            for (RecvOp& op : q.ops) {
              tickets_.Complete(op.ticket, Status(Code::kPeerFailure, Finalized(peer)));
            }
            q.ops.clear();
            q.head_posted = false;
            progressed = true;
          } else if (s.ok()) {
            s = StartPayload(q, peer, tag, received);
          }
        } else if (s.ok() && now >= q.ops.front().deadline.at()) {
          bool cancelled = false;
          s = CancelHead(q, &cancelled, &received);
          if (s.ok() && cancelled) {
            tickets_.Complete(
                q.ops.front().ticket,
                TimeoutError("recv from rank " + std::to_string(peer) + " with tag " +
                             std::to_string(tag) + ": no message arrived within the timeout"));
            q.ops.pop_front();
            q.head_posted = false;
            progressed = true;
          } else if (s.ok()) {
            s = StartPayload(q, peer, tag, received);
          }
        }
      }
      if (s.ok() && q.head_posted && q.head_request == MPI_REQUEST_NULL) {
        bool done = true;
        if (!q.payload.empty()) s = TestAll(q.payload, &done);
        if (s.ok() && done && q.drop_left > 0) {
          s = PostDropPiece(q, peer, tag);
          done = false;
          progressed = true;
        }
        if (s.ok() && done) {
          tickets_.Complete(q.ops.front().ticket, Status::Ok());
          q.ops.pop_front();
          q.payload.clear();
          q.drop.clear();
          q.head_posted = false;
          progressed = true;
        } else if (s.ok() && now >= q.ops.front().deadline.at()) {
          s = TimeoutError("recv from rank " + std::to_string(peer) + " with tag " +
                           std::to_string(tag) + ": a message was still in transit at the timeout" +
                           kClosedByTimeout);
        }
      }
      if (s.ok() && !q.head_posted && !q.ops.empty()) s = PostHead(q, peer, tag);
      if (!s.ok()) {
        FailAllLocked(s);
        return true;
      }
      if (q.ops.empty()) {
        RetireRecvQueue(it++);
      } else {
        ++it;
      }
    }
    // Last: the recvs above have posted what they will take.
    if (look && !finished_.ok() && now - finished_at_ >= kGoodbyeGrace) {
      Status s = DropUnexpected(&progressed);
      if (!s.ok()) {
        FailAllLocked(s);
        return true;
      }
    }
    return progressed;
  }

  // A send op at the end of sends_: a spare one (its buffers' memory kept) or a new one.
  std::list<SendOp>::iterator NewSend() {
    if (spare_sends_.empty()) return sends_.emplace(sends_.end());
    sends_.splice(sends_.end(), spare_sends_, spare_sends_.begin());
    return std::prev(sends_.end());
  }

  // A send whose requests all completed (and whose `done` was taken) leaves sends_.
  void RetireSend(std::list<SendOp>::iterator it) {
    if (spare_sends_.size() >= kSpares) {
      sends_.erase(it);
      return;
    }
    it->requests.clear();
    spare_sends_.splice(spare_sends_.end(), sends_, it);
  }

  // The recv queue of (peer, tag), made (or taken from the spares) when it has none.
  RecvQueue& RecvQueueOf(int peer, int64_t tag) {
    const std::pair<int, int64_t> key{peer, tag};
    auto it = recvs_.find(key);
    if (it != recvs_.end()) return it->second;
    if (spare_recvs_.empty()) return recvs_.try_emplace(key).first->second;
    auto node = std::move(spare_recvs_.back());
    spare_recvs_.pop_back();
    node.key() = key;
    return recvs_.insert(std::move(node)).position->second;
  }

  // An emptied recv queue (no op, no MPI request) leaves recvs_.
  void RetireRecvQueue(std::map<std::pair<int, int64_t>, RecvQueue>::iterator it) {
    RecvQueue& q = it->second;
    if (spare_recvs_.size() >= kSpares || q.head_posted || !q.payload.empty()) {
      recvs_.erase(it);
      return;
    }
    std::vector<char>().swap(q.drop);  // a refused large payload's memory is not kept
    spare_recvs_.push_back(recvs_.extract(it));
  }

  // New work, or completions that a failure on a calling thread left, reach the progress thread at
  // once only while it sleeps. While it stands by for waiters it finds them itself, within
  // kDriverGrace (kDrivenStandby while a waiter drives): a wake-up per operation cost two context
  // switches on a rank bound to one core, and a progress thread woken to compete with the waiter
  // for mu_ made one 1 KiB send/recv in ten take 30-45 us instead of 3-4 us.
  void WakeIfNeeded() {
    if (sleeping_ || tickets_.HasCompleted()) cv_.notify_one();
  }

  void FailAllLocked(const Status& status) {
    if (closed_.ok()) closed_ = status;
    Fail(status);
  }

  // Completes everything with status. MPI requests still pending are left to MPI: the
  // environment is marked abandoned (MPI could still write into their buffers).
  void Fail(const Status& status) {
    // A thread back from MPI after the abandonment: everything is completed already, and MPI is
    // left alone (no cancel).
    if (abandoned_.load()) return;
    bool leaked = !sends_.empty();
    for (SendOp& op : sends_) tickets_.Complete(op.ticket, status);
    sends_.clear();
    for (auto& [key, q] : recvs_) {
      if (q.head_request != MPI_REQUEST_NULL && q.payload.empty()) {
        int received = 0;
        bool cancelled = false;
        if (!CancelHead(q, &cancelled, &received).ok() || !cancelled) leaked = true;
      } else if (!q.payload.empty()) {
        leaked = true;
      }
      for (RecvOp& op : q.ops) tickets_.Complete(op.ticket, status);
    }
    recvs_.clear();
    // What MPI still holds of what was left to it (TestLeftToMpi) stays MPI's.
    if (!orphans_.empty() || !notices_.empty()) {
      leaked = leaked || !TestLeftToMpi().ok() || !orphans_.empty() || !notices_.empty();
      orphans_.clear();
      notices_.clear();
    }
    if (leaked) env_->MarkAbandoned();
  }

  void Loop() {
    thread_id_ = std::this_thread::get_id();
    Completions out;
    auto idle_since = Clock::now();
    bool fresh = false;  // woken since it last parked or idled
    std::unique_lock<std::mutex> lock(mu_);
    auto active_at = Clock::now();  // when work or a driver was last seen
    while (!stop_) {
      // After Finish(), messages to drop may come at any time until Close() or a failure: a
      // round each kGoodbyeCheck.
      const bool draining = !finished_.ok() && closed_.ok();
      const bool work = !sends_.empty() || !recvs_.empty() || tickets_.HasCompleted() || draining;
      if (drivers_ > 0 || !work) {
        // Once waiters drive, stand by with timed waits that Send() and Recv() do not cut short,
        // until nothing happened for kParkAfter; then sleep until woken.
        const auto now = Clock::now();
        if (drivers_ > 0 || work) active_at = now;
        if (driven_ && now - active_at < kParkAfter) {
          cv_.wait_for(lock, drivers_ > 0 ? kDrivenStandby : kDriverGrace);
        } else {
          sleeping_ = true;
          cv_.wait(lock);
          sleeping_ = false;
        }
        idle_since = Clock::now();
        fresh = true;
        continue;
      }
      if (fresh && driven_) {
        // Waiters drive here: give one kDriverGrace to come for this work. Polling at once would
        // compete with it for mu_ and the CPU (a progress thread preempted holding mu_ stalls the
        // waiter for a time slice: 4 KiB send/recv 23-31 us against 9 us on a loaded host).
        fresh = false;
        cv_.wait_for(lock, kDriverGrace);
        continue;
      }
      fresh = false;
      const bool progressed = Round(Clock::now());
      if (tickets_.HasCompleted()) {
        lock.unlock();
        tickets_.TakeCompleted(out);
        RunCompletions(out);
        lock.lock();
      }
      const bool only_draining = sends_.empty() && recvs_.empty() && !tickets_.HasCompleted();
      if (progressed) {
        idle_since = Clock::now();
      } else if (only_draining) {
        sleeping_ = true;
        cv_.wait_for(lock, kGoodbyeCheck);
        sleeping_ = false;
      } else if (Clock::now() - idle_since < std::chrono::milliseconds(2)) {
        lock.unlock();
        std::this_thread::yield();
        lock.lock();
      } else {
        sleeping_ = true;
        cv_.wait_for(lock, std::chrono::microseconds(100));
        sleeping_ = false;
      }
    }
    lock.unlock();
    std::lock_guard<std::mutex> exit_lock(exit_mu_);
    exited_ = true;
    exit_cv_.notify_all();
  }

  std::shared_ptr<MpiEnvironment> env_;
  MPI_Comm comm_;
  const int rank_;
  const int size_;
  const int64_t max_tag_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> stop_{false};  // set under mu_, except by Abandon()
  std::atomic<int> drivers_{0};    // threads inside Drive()
  bool driven_ = false;            // whether a waiter has ever driven
  bool sleeping_ = false;  // the progress thread waits for a wake-up (it is not standing by)
  Status closed_;
  std::list<SendOp> sends_;        // stable addresses: MPI holds their headers
  std::list<SendOp> spare_sends_;  // at most kSpares, no request pending
  std::map<std::pair<int, int64_t>, RecvQueue> recvs_;
  std::vector<std::map<std::pair<int, int64_t>, RecvQueue>::node_type> spare_recvs_;  // kSpares
  Status finished_;  // Finish() ran: later sends and recvs are refused with it
  Clock::time_point finished_at_{};
  // Goodbyes: when the last look was, and per peer whether its goodbye came (read by anyone:
  // PeerFinalized) and when (under mu_).
  Clock::time_point goodbyes_checked_{};
  std::vector<std::atomic<bool>> peer_finalized_;
  std::vector<Clock::time_point> finalized_at_;
  std::vector<char> dropped_;  // after Finish(): where unexpected messages land (DropUnexpected)
  uint64_t last_id_ = 0;       // the last large message's id
  // Left to MPI (TestLeftToMpi): sends answered before MPI completed them (their peer finalized
  // without taking them) and drop notices on their way.
  std::list<SendOp> orphans_;
  std::list<DropNotice> notices_;
  std::atomic<std::thread::id> thread_id_{};
  std::thread thread_;  // detached by Abandon()
  // The progress thread's end, which Close() waits for at most kStuckWait.
  std::mutex exit_mu_;
  std::condition_variable exit_cv_;
  bool exited_ = false;  // under exit_mu_
  Tickets tickets_;
  // Abandon() ran: the transport is closed with abandoned_status_ (under abandon_mu_).
  std::atomic<bool> abandoned_{false};
  std::atomic<bool> placing_{false};  // a thread writes an operation's memory (StartPayload)
  std::mutex abandon_mu_;
  Status abandoned_status_;
};

// What CreateMpiP2pTransport returns: a handle on the transport, which its progress thread holds
// too (an abandoned transport's thread may outlive the handle: MpiP2pTransport::Abandon). Drive()
// holds the transport for its own length, so that a waiter stuck inside MPI never finds it gone
// (the other calls run within the communicator's, which its owner does not end meanwhile).
class MpiP2pTransportHandle final : public P2pTransport {
 public:
  explicit MpiP2pTransportHandle(std::shared_ptr<MpiP2pTransport> t) : t_(std::move(t)) {}
  ~MpiP2pTransportHandle() override {
    t_->Close(Status(Code::kNotInitialized, "the communicator was finalized"));
  }
  MpiP2pTransportHandle(const MpiP2pTransportHandle&) = delete;
  MpiP2pTransportHandle& operator=(const MpiP2pTransportHandle&) = delete;

  int rank() const override { return t_->rank(); }
  int size() const override { return t_->size(); }
  int64_t max_tag() const override { return t_->max_tag(); }
  bool OnProgressThread() const override { return t_->OnProgressThread(); }
  bool PeerFinalized(int peer) const override { return t_->PeerFinalized(peer); }
  void Send(int peer, int64_t tag, const P2pMeta& meta, const void* data, Deadline deadline,
            Done done) override {
    t_->Send(peer, tag, meta, data, deadline, std::move(done));
  }
  void Recv(int peer, int64_t tag, Deadline deadline, Place place, Done done) override {
    t_->Recv(peer, tag, deadline, std::move(place), std::move(done));
  }
  void Drive(const std::function<bool()>& finished, Deadline deadline,
             std::chrono::microseconds busy_poll) override {
    std::shared_ptr<MpiP2pTransport> t = t_;
    t->Drive(finished, deadline, busy_poll);
  }
  bool Finish(const Status& status) override { return t_->Finish(status); }
  void Close(const Status& status) override { t_->Close(status); }

 private:
  const std::shared_ptr<MpiP2pTransport> t_;
};

}  // namespace

StatusOr<std::unique_ptr<P2pTransport>> CreateMpiP2pTransport(std::shared_ptr<MpiEnvironment> env,
                                                              std::chrono::milliseconds timeout,
                                                              MPI_Comm base) {
  CONCORD_ASSIGN_OR_RETURN(MPI_Comm comm, Duplicate(*env, base, Deadline::After(timeout)));
  int rank = 0, size = 0, flag = 0;
  int* tag_ub = nullptr;
  {
    CONCORD_MPI_LOCK_OR_RETURN(lock, *env);
    CONCORD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    CONCORD_MPI_CHECK(MPI_Comm_size(comm, &size));
    CONCORD_MPI_CHECK(MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_ub, &flag));
  }
  // Tags 2t and 2t + 1 carry a message; 2 max_tag + 2, at most MPI_TAG_UB, the goodbyes.
  const int64_t max_tag = flag && tag_ub != nullptr ? (int64_t{*tag_ub} - 2) / 2 : 16382;
  return std::unique_ptr<P2pTransport>(std::make_unique<MpiP2pTransportHandle>(
      MpiP2pTransport::Create(std::move(env), comm, rank, size, max_tag)));
}

}  // namespace concord
