// The point-to-point transport of Gloo jobs (CreateTcpP2pTransport): one TCP connection per pair of
// ranks, driven by one progress thread (see P2pTransport in backends/p2p_transport.h for what
// every transport promises). The connections' setup and the stream's frames are in
// backends/tcp_p2p_wire.h. Messages for which no recv is posted yet are kept whole (unexpected
// messages) until one is (one this rank has no memory for fails the link with kSystemError
// naming its size); a posted recv's payload is read straight into its destination. A large
// payload (kHoldBytes) whose recv is not posted yet first waits in the socket for it, a few
// milliseconds at most (HoldFor), so that a recv posted a moment late still takes it without a
// copy; what follows it on the link waits that long. A recv posted while its payload is arriving
// into an unexpected buffer takes over the rest (Adopt). Between ranks of one host whose memory
// each can read (probed at setup), a payload of at least P2pDirectReads::min_bytes does not travel
// the socket: the receiver reads it from the sender's buffer and sends a receipt, which completes
// the send (tcp_p2p_wire.h); a loopback socket moved about 1.3 GB/s here.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "backends/p2p_transport.h"
#include "backends/shm/shm_direct.h"
#include "backends/tcp_p2p_wire.h"
#include "base/mutex.h"
#include "rendezvous/net.h"
#include "rendezvous/store.h"

namespace concord {
namespace {

using tcp_p2p::CheckShape;
using tcp_p2p::DecodeDirect;
using tcp_p2p::DecodeFixed;
using tcp_p2p::DecodeGoodbye;
using tcp_p2p::DecodeReceipt;
using tcp_p2p::DirectSource;
using tcp_p2p::EncodeHead;
using tcp_p2p::EncodeReceipt;
using tcp_p2p::kDirectRead;
using tcp_p2p::kFixedHead;
using tcp_p2p::kGoodbyeMagic;
using tcp_p2p::kReceiptMagic;

constexpr size_t kStaging = 256 * 1024;        // reads land here unless a payload is larger
constexpr uint64_t kMaxSendBuffer = 32 << 20;  // SO_SNDBUF grows up to this (as Gloo's)
// A payload this large waits for its recv (Place). A smaller one mostly fits in the sockets'
// buffers: reading it ahead into an unexpected buffer and copying it costs about what reading it
// once its recv is posted does.
constexpr uint64_t kHoldBytes = 4 << 20;
// How long Finish() waits at most, in all: for what is still queued to be written and for the
// receipts of direct sends (half of it at most: Drain), for its sockets to take the goodbyes and
// for the peers to end the links it said goodbye on (Leave). A peer whose progress thread runs
// reads what fills the socket and takes a goodbye within milliseconds (HoldFor, then what was
// still in the sockets).
constexpr std::chrono::seconds kLinger{2};

// How long a payload of `bytes` without its recv stays in the socket (Place): about the time
// copying it out of an unexpected buffer would take (4 GB/s), from 1 to 20 ms.
std::chrono::milliseconds HoldFor(uint64_t bytes) {
  return std::chrono::milliseconds(std::clamp<uint64_t>(bytes >> 22, 1, 20));
}

void Signal(int fd) {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof(one));
}

struct SendOp {
  std::string head;
  const char* data = nullptr;
  uint64_t bytes = 0;  // of payload on the socket (none when the receiver reads it directly)
  size_t written = 0;  // of head and payload together
  Deadline deadline;
  P2pTransport::Done done;
  bool direct = false;  // the receiver reads the payload: done once its receipt is back
};

struct RecvOp {
  Deadline deadline = Deadline::Infinite();
  P2pTransport::Place place;
  P2pTransport::Done done;
};

// A message that arrived before its recv: kept whole until one is posted.
struct Unexpected {
  P2pMeta meta;
  std::unique_ptr<char[]> payload;  // meta.bytes of it (left uninitialised: read() fills it)
  size_t capacity = 0;
  bool complete = false;
};

// One peer's connection and everything in flight with it.
struct Link {
  int peer = -1;
  net::Fd fd;
  Status failure;
  // The send side, under *send_mu (taken after the transport's mu_): a thread writes a large
  // message without holding up the progress thread's reads.
  std::unique_ptr<Mutex> send_mu = std::make_unique<Mutex>();
  Status send_failure;  // = failure, for senders
  Status broken;        // a write failed on a calling thread: the progress thread fails the link
  Status finished;      // Finish() began: later sends are refused with it (the queue still drains)
  int send_buffer = 0;  // SO_SNDBUF asked for so far (GrowSendBuffer)
  std::deque<SendOp> sends;
  std::deque<SendOp> awaiting_receipt;  // direct sends written, in order, until their receipts
  // Direct reads (same host): whether the peer reads this rank's large payloads (send side), its
  // process (receive side: whether this rank reads its payloads), and this rank's state word for
  // the link, which the peer reads after a payload: `open` until the link fails or closes, so
  // that a payload whose send completed (with an error) while it was read is not taken as intact.
  // `open` is random per link (ProbeDirectReads), so that the word of a later link at the same
  // address, once this link's is freed, does not pass for this one's.
  bool peer_reads = false;
  pid_t read_from = 0;  // 0: this rank does not read the peer's memory
  uint64_t open = 0;
  std::unique_ptr<std::atomic<uint64_t>> state = std::make_unique<std::atomic<uint64_t>>(0);
  std::map<int64_t, std::deque<RecvOp>> posted;
  std::map<int64_t, std::deque<Unexpected>> unexpected;
  // The largest unexpected payload buffer given back, for the next one (no allocation, no page
  // faults for a stream of late recvs).
  std::unique_ptr<char[]> spare;
  size_t spare_capacity = 0;
  // Reading: the staging buffer, then the message being received.
  std::vector<unsigned char> in = std::vector<unsigned char>(kStaging);
  size_t in_begin = 0, in_end = 0;
  bool in_payload = false;  // a payload is arriving (else a header is)
  bool placed = false;      // its destination is decided (else it is held in the socket)
  Deadline hold_until = Deadline::Infinite();  // until when it may stay held
  int64_t tag = 0;
  P2pMeta meta;
  bool direct = false;  // the payload is read from the sender's memory, from `source`
  DirectSource source;
  char* dest = nullptr;  // where it goes; null: dropped
  uint64_t left = 0;
  std::optional<RecvOp> matched;  // the recv it completes, when one was posted
  Unexpected* stash = nullptr;    // else the unexpected message it fills
  std::string drop;               // a refused payload's bytes land here
};

using Completions = std::vector<std::pair<P2pTransport::Done, Status>>;

// Contract: see P2pTransport (backends/p2p_transport.h) and the top of this file. Owns one socket
// per peer, an eventfd and the progress thread. mu_ guards each link's receive side (posted
// recvs, unexpected messages, the failure, the parsing state); a link's send_mu its send side
// (queue, socket writes), taken after mu_ when both are needed. Neither is held while `done`
// runs, nor across poll() or read(). The progress thread alone reads (read() itself runs without
// mu_) and closes sockets until Close() or Finish() has stopped it; a submitting thread writes its
// send itself when nothing is queued before it on that link, and leaves the rest to the progress
// thread. From the start of Finish() new sends and recvs are refused with its status, while the
// progress thread still drives what is in flight and writes what is queued (Drain).
class TcpP2pTransport : public P2pTransport {
 public:
  // `direct_min_bytes`: the smallest payload a peer that reads this rank's memory (Link::
  // peer_reads) reads directly.
  TcpP2pTransport(int rank, int size, std::vector<Link> links, net::Fd wake,
                  uint64_t direct_min_bytes)
      : rank_(rank),
        size_(size),
        direct_min_bytes_(direct_min_bytes),
        peer_finalized_(static_cast<size_t>(size)),
        links_(std::move(links)),
        wake_(std::move(wake)) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~TcpP2pTransport() override {
    Close(Status(Code::kNotInitialized, "the communicator was finalized"));
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int64_t max_tag() const override { return INT64_MAX; }
  bool OnProgressThread() const override { return std::this_thread::get_id() == thread_id_; }
  bool ReadsDirectly(int peer) const override {
    return peer >= 0 && peer < size_ && peer != rank_ && links_[peer].read_from != 0;
  }
  bool PeerFinalized(int peer) const override {
    return peer >= 0 && peer < size_ && peer_finalized_[peer].load();
  }

  void Send(int peer, int64_t tag, const P2pMeta& meta, const void* data, Deadline deadline,
            Done done) override EXCLUDES(mu_) {
    Completions out;
    {
      Link& l = links_[peer];
      MutexLock lock(*l.send_mu);
      if (!l.finished.ok()) {
        out.emplace_back(std::move(done), l.finished);
      } else if (!l.send_failure.ok()) {
        out.emplace_back(std::move(done), l.send_failure);
      } else if (l.peer_reads && meta.bytes >= direct_min_bytes_) {
        const DirectSource source{reinterpret_cast<uint64_t>(data),
                                  reinterpret_cast<uint64_t>(l.state.get()), l.open};
        Queue(l,
              SendOp{EncodeHead(tag, meta, &source), static_cast<const char*>(data), 0, 0, deadline,
                     std::move(done), /*direct=*/true},
              out);
      } else {
        GrowSendBuffer(l, meta.bytes);
        Queue(l,
              SendOp{EncodeHead(tag, meta), static_cast<const char*>(data), meta.bytes, 0, deadline,
                     std::move(done)},
              out);
      }
    }
    Run(out);
  }

  void Recv(int peer, int64_t tag, Deadline deadline, Place place, Done done) override
      EXCLUDES(mu_) {
    Completions out;
    {
      MutexLock lock(mu_);
      Link& l = links_[peer];
      if (!finished_.ok()) {
        out.emplace_back(std::move(done), finished_);
      } else {
        l.posted[tag].push_back(RecvOp{deadline, std::move(place), std::move(done)});
        MatchUnexpected(l, tag, out);
        if (!l.failure.ok()) FailPosted(l, out);
        const bool held = l.in_payload && !l.placed && l.tag == tag;  // Place takes it now
        if (held || deadline.at() < sleep_until_.at()) Signal(wake_.get());
      }
    }
    Run(out);
  }

  // Refuses new sends and recvs with `status` from here on (Refuse), lets the progress thread
  // write what is queued and waits for the receipts of direct sends (Drain), then closes, saying
  // goodbye on each link that has nothing left queued: kLinger in all at most. Blocks the caller
  // meanwhile; not from `done` or `place`.
  bool Finish(const Status& status) override EXCLUDES(mu_) {
    const Deadline until = Deadline::After(kLinger);
    Refuse(status);
    Drain(Deadline::After(kLinger / 2));
    CloseWith(status, until);
    return true;
  }

  void Close(const Status& status) override EXCLUDES(mu_) { CloseWith(status, std::nullopt); }

 private:
  static void Run(Completions& out) {
    for (auto& [done, status] : out) done(status);
    out.clear();
  }

  std::string Who(int peer) const { return "rank " + std::to_string(peer); }

  // Finish(): from here on Send() and Recv() complete at once with `status` (each link's
  // `finished`, and finished_), on the calling thread; what is in flight goes on. Nothing after
  // Close().
  void Refuse(const Status& status) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (stop_ || !finished_.ok()) return;
    finished_ = status;
    for (Link& l : links_) {
      MutexLock send_lock(*l.send_mu);
      l.finished = status;
    }
  }

  // Finish(): waits, the progress thread still running (it reads, completes recvs in flight, and
  // writes what the sockets take), until no link has anything queued to write and no direct send
  // waits for its receipt (each written or completed, or failed with its link), or `until` passes.
  // What is queued is what a goodbye may not overtake: the receipts this rank owes for messages
  // it read from its peers' memory (a peer's send completes only with its receipt: without it,
  // that send failed though this rank's recv completed) and messages behind a full socket. A
  // peer may have read a direct send's message already, its receipt on the way: failing the send
  // (its message withdrawn, see Link::state) would then report a message that arrived as failed.
  // A peer reads what reaches it within milliseconds (HoldFor, then the payload at memory speed),
  // and one that finalizes too reads on and sends its receipts before its goodbye; `until` (half
  // of kLinger) leaves the goodbyes time when a peer reads nothing or sends no receipt.
  void Drain(Deadline until) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    for (;;) {
      bool draining = false;
      for (Link& l : links_) {
        MutexLock send_lock(*l.send_mu);
        draining = draining || !l.sends.empty() || !l.awaiting_receipt.empty();
      }
      if (!draining || stop_ || until.passed()) return;
      drained_.WaitUntil(mu_, until);
    }
  }

  // Close() and Finish(): stops the progress thread, then fails every link with `status`.
  // `goodbye` (Finish: by when): the links that take one (TakesGoodbye) first hand their sockets
  // to Leave(), which ends them with a goodbye by then.
  void CloseWith(const Status& status, std::optional<Deadline> goodbye) EXCLUDES(mu_) {
    {
      MutexLock lock(mu_);
      if (stop_) return;
      stop_ = true;
      Signal(wake_.get());
    }
    if (thread_.joinable()) thread_.join();
    Completions out;
    std::vector<net::Fd> leaving;
    {
      MutexLock lock(mu_);
      for (Link& l : links_) {
        if (goodbye && TakesGoodbye(l, out)) leaving.push_back(std::move(l.fd));
        FailLink(l, status, out);
      }
    }
    Run(out);
    if (goodbye) Leave(leaving, *goodbye);
  }

  // Whether the link ends with a goodbye: it is open and nothing is queued on it, so no message is
  // half written. What Drain() left queued (a receipt the progress thread queued since) is written
  // first as far as the socket takes it at once (sends written whole complete). A link with
  // something still queued gets none: its peer sees the connection close, as after a failure.
  // After the progress thread has stopped.
  bool TakesGoodbye(Link& l, Completions& out) REQUIRES(mu_) {
    MutexLock send_lock(*l.send_mu);
    if (l.fd.valid()) Flush(l, out);
    return l.fd.valid() && l.send_failure.ok() && l.broken.ok() && l.sends.empty();
  }

  // Ends each connection in `fds` (links failed already: nothing else writes to them) with a
  // goodbye, by `until`: writes the goodbye frame as the socket takes it (a socket full of
  // messages whose sends completed takes it once the peer reads them), shuts the sending side
  // down, and keeps the connection open until the peer has ended its side (it closes the link once
  // it took the goodbye, or shuts it down in its own Finish). Meanwhile, the goodbye written or
  // not, it reads and drops what the peer still sends: a peer finalizing too writes its own
  // goodbye only as this side reads, and a socket closed with bytes still to read resets its
  // connection, which drops what this side had not transmitted yet (the end of a message whose
  // send completed, and the goodbye). A peer that ends its side before its goodbye is written
  // (it finalized, or failed) gets none. At `until` the rest close as they are: a goodbye not
  // written whole by then stays unwritten (or half written, which the peer reads as a closed
  // connection, as none).
  static void Leave(std::vector<net::Fd>& fds, Deadline until) {
    const std::string goodbye = tcp_p2p::EncodeGoodbye();
    std::vector<size_t> written(fds.size(), 0);  // of the goodbye, per socket
    std::vector<char> sink(kStaging);
    std::vector<pollfd> polled;
    while (!fds.empty() && !until.passed()) {
      polled.clear();
      for (size_t i = 0; i < fds.size(); ++i) {
        const bool writing = written[i] < goodbye.size();
        polled.push_back(
            pollfd{fds[i].get(), static_cast<short>(POLLIN | (writing ? POLLOUT : 0)), 0});
      }
      const int rc = ::poll(polled.data(), polled.size(), until.PollTimeoutMs());
      if (rc < 0 && errno == EINTR) continue;
      if (rc <= 0) return;  // the time passed (or poll failed): closed as they are
      for (size_t i = polled.size(); i-- > 0;) {
        const short revents = polled[i].revents;
        if (revents == 0) continue;
        const int fd = polled[i].fd;
        bool ended = false;  // the peer ended its side (or the connection failed)
        if (revents & (POLLIN | POLLHUP | POLLERR)) {
          const ssize_t r = ::read(fd, sink.data(), sink.size());
          ended = r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
        }
        if (!ended && written[i] < goodbye.size() && (revents & POLLOUT)) {
          const ssize_t w = ::send(fd, goodbye.data() + written[i], goodbye.size() - written[i],
                                   MSG_NOSIGNAL | MSG_DONTWAIT);
          if (w > 0) written[i] += static_cast<size_t>(w);
          ended = w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
          if (written[i] == goodbye.size()) ended = ::shutdown(fd, SHUT_WR) != 0;
        }
        if (!ended) continue;
        fds.erase(fds.begin() + static_cast<std::ptrdiff_t>(i));
        written.erase(written.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
  }

  // Sizes the socket's send buffer for a message of `bytes` (at most kMaxSendBuffer), as Gloo
  // does, so that the sending thread usually writes it whole and the progress thread, which
  // reads, does not also have to write it.
  static void GrowSendBuffer(Link& l, uint64_t bytes) {
    const int want = static_cast<int>(std::min<uint64_t>(bytes + kFixedHead, kMaxSendBuffer));
    if (want <= l.send_buffer || !l.fd.valid()) return;
    ::setsockopt(l.fd.get(), SOL_SOCKET, SO_SNDBUF, &want, sizeof(want));
    l.send_buffer = want;  // the kernel may give less (net.core.wmem_max): asked once per size
  }

  // Queues `op` on the link: written at once when nothing is queued before it, else (and for
  // what the socket did not take) by the progress thread, which is woken. Holding *l.send_mu.
  void Queue(Link& l, SendOp op, Completions& out) {
    l.sends.push_back(std::move(op));
    if (l.sends.size() == 1) Flush(l, out);
    if (!l.sends.empty()) Signal(wake_.get());
  }

  // Writes what the socket takes of the queued sends; completes those written. A write error
  // marks the link broken (the progress thread fails it: only it touches the read side).
  // Holding *l.send_mu.
  void Flush(Link& l, Completions& out) {
    while (!l.sends.empty() && l.send_failure.ok() && l.broken.ok()) {
      SendOp& s = l.sends.front();
      iovec iov[2];
      int n = 0;
      if (s.written < s.head.size()) {
        iov[n++] = {s.head.data() + s.written, s.head.size() - s.written};
        if (s.bytes > 0) iov[n++] = {const_cast<char*>(s.data), s.bytes};
      } else {
        const size_t at = s.written - s.head.size();
        iov[n++] = {const_cast<char*>(s.data) + at, s.bytes - at};
      }
      const ssize_t w = ::writev(l.fd.get(), iov, n);
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        l.broken = Status(Code::kPeerFailure, Who(l.peer) + ": point-to-point send failed (" +
                                                  std::strerror(errno) + "): the rank failed");
        return;
      }
      s.written += static_cast<size_t>(w);
      if (s.written < s.head.size() + s.bytes) return;
      if (s.direct) {
        l.awaiting_receipt.push_back(std::move(s));  // its payload is still the peer's to read
      } else {
        out.emplace_back(std::move(s.done), Status::Ok());
      }
      l.sends.pop_front();
    }
  }

  // Completes posted recvs of `tag` with the whole unexpected messages waiting for them.
  void MatchUnexpected(Link& l, int64_t tag, Completions& out) REQUIRES(mu_) {
    auto u = l.unexpected.find(tag);
    auto p = l.posted.find(tag);
    while (u != l.unexpected.end() && p != l.posted.end() && !u->second.empty() &&
           u->second.front().complete && !p->second.empty()) {
      Unexpected& m = u->second.front();
      RecvOp& r = p->second.front();
      void* dest = r.place(m.meta);
      if (dest != nullptr && m.meta.bytes > 0) std::memcpy(dest, m.payload.get(), m.meta.bytes);
      out.emplace_back(std::move(r.done), Status::Ok());
      if (m.capacity > l.spare_capacity) {
        l.spare = std::move(m.payload);
        l.spare_capacity = m.capacity;
      }
      u->second.pop_front();
      p->second.pop_front();
    }
    if (u != l.unexpected.end() && u->second.empty()) l.unexpected.erase(u);
    if (p != l.posted.end() && p->second.empty()) l.posted.erase(p);
  }

  void FailPosted(Link& l, Completions& out) REQUIRES(mu_) {
    for (auto& [tag, q] : l.posted) {
      for (RecvOp& r : q) out.emplace_back(std::move(r.done), l.failure);
    }
    l.posted.clear();
  }

  // The link's first failure: everything in flight with the peer fails; whole messages that
  // arrived before stay for the recvs that come for them. On the progress thread (or after it
  // has stopped): it owns the read side and the socket's lifetime.
  void FailLink(Link& l, const Status& status, Completions& out) REQUIRES(mu_) {
    if (!l.failure.ok()) return;
    l.failure = status;
    {
      MutexLock send_lock(*l.send_mu);
      // Before any send completes: a peer still reading one of them then finds it withdrawn.
      l.state->store(0);
      l.send_failure = status;
      l.fd.Reset();
      for (SendOp& s : l.sends) out.emplace_back(std::move(s.done), status);
      l.sends.clear();
      for (SendOp& s : l.awaiting_receipt) out.emplace_back(std::move(s.done), status);
      l.awaiting_receipt.clear();
    }
    drained_.NotifyAll();
    if (l.matched) out.emplace_back(std::move(l.matched->done), status);
    l.matched.reset();
    if (l.stash != nullptr) l.unexpected[l.tag].pop_back();
    l.stash = nullptr;
    FailPosted(l, out);
  }

  // Takes bytes from the staging buffer into the current payload; returns whether it is complete.
  bool TakePayload(Link& l) {
    const size_t n = std::min<uint64_t>(l.left, l.in_end - l.in_begin);
    if (l.dest != nullptr) std::memcpy(l.dest, l.in.data() + l.in_begin, n);
    if (l.dest != nullptr) l.dest += n;
    l.in_begin += n;
    l.left -= n;
    return l.left == 0;
  }

  void FinishPayload(Link& l, Completions& out) REQUIRES(mu_) {
    l.in_payload = false;
    if (l.matched) {
      out.emplace_back(std::move(l.matched->done), Status::Ok());
      l.matched.reset();
    } else {
      l.stash->complete = true;
      l.stash = nullptr;
      MatchUnexpected(l, l.tag, out);
    }
  }

  // A header arrived: its payload follows (Place decides where it goes), on the socket or, when
  // `direct`, in the sender's memory at `source`.
  void StartMessage(Link& l, int64_t tag, P2pMeta meta, bool direct, DirectSource source)
      REQUIRES(mu_) {
    l.direct = direct;
    l.source = source;
    l.tag = tag;
    l.left = meta.bytes;
    l.in_payload = true;
    l.placed = false;
    l.hold_until = meta.bytes >= kHoldBytes ? Deadline::After(HoldFor(meta.bytes))
                                            : Deadline::After(std::chrono::milliseconds(0));
    l.meta = std::move(meta);
  }

  // Decides where the arriving payload goes: its posted recv's destination (or the drop buffer
  // when it refuses it), else an unexpected buffer. A large payload without a recv is held in
  // the socket instead (false: nothing more is read from the link) until its recv is posted or
  // HoldFor() passes: a recv posted soon after its message arrived (a ping-pong, a pipeline
  // stage a moment behind) then takes the payload straight into its buffer, copied by no one;
  // what follows on the link waits that long at most. An unexpected buffer that cannot be
  // allocated fails the link (false).
  bool Place(Link& l, Completions& out) REQUIRES(mu_) {
    if (l.placed) return true;
    const int64_t tag = l.tag;
    const P2pMeta& meta = l.meta;
    auto p = l.posted.find(tag);
    const bool ready = p != l.posted.end() && l.unexpected.count(tag) == 0;
    if (!ready && !l.hold_until.passed()) return false;
    l.placed = true;
    if (ready) {
      l.matched = std::move(p->second.front());
      p->second.pop_front();
      if (p->second.empty()) l.posted.erase(p);
      l.dest = static_cast<char*>(l.matched->place(meta));
      if (l.dest == nullptr && meta.bytes > 0) {
        l.drop.resize(std::min<uint64_t>(meta.bytes, kStaging));
      }
      return true;
    }
    Unexpected m;
    m.meta = meta;
    if (l.spare_capacity >= meta.bytes && l.spare_capacity > 0) {
      m.payload = std::move(l.spare);
      m.capacity = l.spare_capacity;
      l.spare_capacity = 0;
    } else {
      m.payload.reset(new (std::nothrow) char[std::max<uint64_t>(meta.bytes, 1)]);
      m.capacity = meta.bytes;
      if (m.payload == nullptr) {
        FailLink(l,
                 Status(Code::kSystemError,
                        Who(l.peer) + " sent a point-to-point message of " +
                            std::to_string(meta.bytes) + " bytes with tag " + std::to_string(tag) +
                            " before its recv, and there is no memory to keep it"),
                 out);
        return false;
      }
    }
    auto& q = l.unexpected[tag];
    q.push_back(std::move(m));
    l.stash = &q.back();
    l.dest = l.stash->payload.get();
    return true;
  }

  // A recv posted while its message's payload is arriving into an unexpected buffer takes the
  // message over: what arrived so far is copied to its destination and the rest is read straight
  // there. Only for the tag's sole unexpected message (earlier ones would match first).
  void Adopt(Link& l) REQUIRES(mu_) {
    if (l.stash == nullptr) return;
    auto p = l.posted.find(l.tag);
    if (p == l.posted.end()) return;
    auto u = l.unexpected.find(l.tag);
    if (u->second.size() != 1) return;
    Unexpected& m = u->second.front();
    l.matched = std::move(p->second.front());
    p->second.pop_front();
    if (p->second.empty()) l.posted.erase(p);
    l.dest = static_cast<char*>(l.matched->place(m.meta));
    const uint64_t arrived = m.meta.bytes - l.left;
    if (l.dest != nullptr) {
      if (arrived > 0) std::memcpy(l.dest, m.payload.get(), arrived);
      l.dest += arrived;
    } else {
      l.drop.resize(std::min<uint64_t>(l.left, kStaging));
    }
    if (m.capacity > l.spare_capacity) {
      l.spare = std::move(m.payload);
      l.spare_capacity = m.capacity;
    }
    l.unexpected.erase(u);
    l.stash = nullptr;
  }

  // A receipt arrived: the oldest direct send to the peer is complete. False (the link failed)
  // when none waits for one.
  bool TakeReceipt(Link& l, Completions& out) REQUIRES(mu_) {
    {
      MutexLock send_lock(*l.send_mu);
      if (!l.awaiting_receipt.empty()) {
        out.emplace_back(std::move(l.awaiting_receipt.front().done), Status::Ok());
        l.awaiting_receipt.pop_front();
        if (l.awaiting_receipt.empty()) drained_.NotifyAll();
        return true;
      }
    }
    FailLink(l, ProtocolError("a receipt for no message, from " + Who(l.peer)), out);
    return false;
  }

  // Reads the placed direct payload from the sender's memory (into its destination; a refused
  // one is not read), then the sender's state word, and answers with a receipt. Progress thread,
  // without mu_ while it reads (the destination stays put: see ReadLink); false when the link
  // failed (the sender is gone). A message the sender withdrew while it was read (its state word
  // no longer holds the open value: the sender failed or closed the link, finalizing perhaps)
  // fails alone, without a receipt: it had no bytes on the socket, so the stream stays in sync,
  // and what the sender wrote behind it (a goodbye) is still read.
  bool ReadDirect(Link& l, Completions& out) EXCLUDES(mu_) {
    char* dest = nullptr;
    uint64_t at = 0, n = 0;
    DirectSource source;
    pid_t pid = 0;
    {
      MutexLock lock(mu_);
      dest = l.dest;
      at = l.meta.bytes - l.left;
      n = l.left;
      source = l.source;
      pid = l.read_from;
    }
    using shm_internal::ReadRemote;
    using shm_internal::RemoteSpan;
    Status s = Status::Ok();
    if (dest != nullptr) s = ReadRemote(l.peer, pid, {RemoteSpan{source.data + at, n}}, 0, n, dest);
    // Read after the payload (a payload read while the word held the open value is intact), and
    // after a payload that could not be read too (a withdrawn buffer may be gone).
    uint64_t state = 0;
    const Status word = ReadRemote(l.peer, pid, {RemoteSpan{source.state, sizeof(state)}}, 0,
                                   sizeof(state), &state);
    const bool withdrawn = word.ok() && state != source.open;
    if (s.ok()) s = word;
    MutexLock lock(mu_);
    if (withdrawn) {
      DropWithdrawn(
          l,
          Status(Code::kPeerFailure, Who(l.peer) + " withdrew a point-to-point message while "
                                                   "it was read: the rank failed or finalized"),
          out);
      return true;
    }
    if (!s.ok()) {
      FailLink(l, s.WithContext("reading a message from " + Who(l.peer)), out);
      return false;
    }
    if (l.dest != nullptr) l.dest += n;
    l.left = 0;
    FinishPayload(l, out);
    MutexLock send_lock(*l.send_mu);
    if (!l.send_failure.ok()) return true;
    Queue(l, SendOp{EncodeReceipt(), nullptr, 0, 0, Deadline::Infinite(), [](const Status&) {}},
          out);
    return true;
  }

  // Ends the direct message being read, which its sender withdrew: its recv fails with `status`
  // (or the unexpected message it was filling goes).
  void DropWithdrawn(Link& l, const Status& status, Completions& out) REQUIRES(mu_) {
    l.in_payload = false;
    l.left = 0;
    if (l.matched) out.emplace_back(std::move(l.matched->done), status);
    l.matched.reset();
    if (l.stash != nullptr) {
      auto u = l.unexpected.find(l.tag);
      u->second.pop_back();
      if (u->second.empty()) l.unexpected.erase(u);
    }
    l.stash = nullptr;
  }

  // Parses what the staging buffer holds; false when the link failed (a malformed header or
  // receipt, a receipt nothing waits for). Stops at a placed direct payload: ReadLink reads it.
  bool Parse(Link& l, Completions& out) REQUIRES(mu_) {
    for (;;) {
      if (l.in_payload) {
        if (!Place(l, out)) return l.failure.ok();
        if (l.direct && l.left != 0) return true;
        if (l.left != 0 && !TakePayload(l)) return true;
        FinishPayload(l, out);
        continue;
      }
      const size_t have = l.in_end - l.in_begin;
      if (have < kFixedHead) break;
      const unsigned char* p = l.in.data() + l.in_begin;
      if (net::LoadU32(p) == kGoodbyeMagic) {
        const Status goodbye = DecodeGoodbye(p);
        if (!goodbye.ok()) {
          FailLink(l, goodbye.WithContext("from " + Who(l.peer)), out);
          return false;
        }
        peer_finalized_[l.peer].store(true);  // before the failures it explains complete
        FailLink(l,
                 Status(Code::kPeerFailure, Who(l.peer) +
                                                " finalized its communicator (concord_finalize): "
                                                "it sends and receives nothing more"),
                 out);
        return false;
      }
      if (net::LoadU32(p) == kReceiptMagic) {
        Status receipt = DecodeReceipt(p);
        if (!receipt.ok()) {
          FailLink(l, receipt.WithContext("from " + Who(l.peer)), out);
          return false;
        }
        if (!TakeReceipt(l, out)) return false;
        l.in_begin += kFixedHead;
        continue;
      }
      int64_t tag = 0;
      P2pMeta meta;
      uint32_t flags = 0;
      size_t head = 0;
      Status s = DecodeFixed(p, &tag, &meta, &flags, &head);
      if (s.ok() && have < head) break;
      if (s.ok()) s = CheckShape(&meta, p + kFixedHead);
      const bool direct = (flags & kDirectRead) != 0;
      if (s.ok() && direct && (l.read_from == 0 || meta.bytes == 0)) {
        s = ProtocolError("a payload to read directly that this rank cannot read");
      }
      const DirectSource source =
          s.ok() && direct ? DecodeDirect(p, meta.shape.size()) : DirectSource{};
      // 0 is a closed link's word: a header giving it as the open value would pass any withdrawal.
      if (s.ok() && direct && source.open == 0) {
        s = ProtocolError("a payload to read directly without its link's open value");
      }
      if (!s.ok()) {
        FailLink(l, s.WithContext("from " + Who(l.peer)), out);
        return false;
      }
      l.in_begin += head;
      StartMessage(l, tag, meta, direct, source);
    }
    if (l.in_begin == l.in_end) l.in_begin = l.in_end = 0;
    return true;
  }

  // Reads what arrived on the link and processes every whole piece of it. Progress thread only:
  // the read side (staging buffer, the message being received) is its own, and read() runs
  // without mu_, so a large payload arriving never holds up a sender on another thread.
  // `hangup`: the socket reported an error or hang-up (a held payload is read now, to find out).
  void ReadLink(Link& l, bool hangup, Completions& out) EXCLUDES(mu_) {
    if (hangup) {
      MutexLock lock(mu_);
      l.hold_until = Deadline::After(std::chrono::milliseconds(0));
    }
    for (;;) {
      char* to = nullptr;
      size_t want = 0;
      bool direct = false;       // the payload's rest is read from the socket straight to its place
      bool read_remote = false;  // it is read from the sender's memory (ReadDirect)
      int fd = -1;
      {
        MutexLock lock(mu_);
        if (!l.fd.valid() || !Parse(l, out)) return;
        if (l.in_payload && !l.placed) return;  // held (Place)
        if (l.in_payload) Adopt(l);
        read_remote = l.in_payload && l.direct;
      }
      if (read_remote) {
        if (!ReadDirect(l, out)) return;
        continue;
      }
      {
        MutexLock lock(mu_);
        // A large payload's rest goes straight to its destination (or the drop buffer).
        direct = l.in_payload && l.in_begin == l.in_end && l.left >= kStaging / 4;
        if (direct) {
          to = l.dest != nullptr ? l.dest : l.drop.data();
          want = l.dest != nullptr ? l.left : std::min<uint64_t>(l.left, l.drop.size());
        } else {
          if (l.in_begin > 0 && l.in_end == l.in.size()) {
            std::memmove(l.in.data(), l.in.data() + l.in_begin, l.in_end - l.in_begin);
            l.in_end -= l.in_begin;
            l.in_begin = 0;
          }
          to = reinterpret_cast<char*>(l.in.data()) + l.in_end;
          want = l.in.size() - l.in_end;
        }
        fd = l.fd.get();
      }
      const ssize_t r = ::read(fd, to, want);
      const int err = errno;
      MutexLock lock(mu_);
      if (r > 0) {
        if (!direct) {
          l.in_end += static_cast<size_t>(r);
        } else {
          if (l.dest != nullptr) l.dest += r;
          l.left -= static_cast<uint64_t>(r);
        }
        continue;
      }
      if (r < 0 && (err == EAGAIN || err == EWOULDBLOCK || err == EINTR)) return;
      FailLink(l,
               Status(Code::kPeerFailure,
                      Who(l.peer) + " closed its point-to-point connection (" +
                          (r == 0 ? std::string("end of stream") : std::strerror(err)) +
                          "): the rank failed or finalized"),
               out);
      return;
    }
  }

  // Times out what passed its deadline; returns the next deadline.
  Deadline Expire(Link& l, Completions& out) REQUIRES(mu_) {
    Deadline next = Deadline::Infinite();
    if (!l.failure.ok()) return next;
    const std::string peer = Who(l.peer);
    bool stuck_send = false;
    {
      MutexLock send_lock(*l.send_mu);
      stuck_send =
          (!l.sends.empty() && l.sends.front().written > 0 && l.sends.front().deadline.passed()) ||
          (!l.awaiting_receipt.empty() && l.awaiting_receipt.front().deadline.passed());
    }
    if ((l.matched && l.matched->deadline.passed()) || stuck_send) {
      FailLink(l,
               TimeoutError(peer + ": a point-to-point message was still in transit at the "
                                   "timeout (the rank is stuck or the network is)"),
               out);
      return next;
    }
    if (l.matched) next = next.Earlier(l.matched->deadline);
    {
      MutexLock send_lock(*l.send_mu);
      if (!l.awaiting_receipt.empty()) next = next.Earlier(l.awaiting_receipt.front().deadline);
      for (auto it = l.sends.begin(); it != l.sends.end();) {
        if (it->written == 0 && it->deadline.passed()) {
          out.emplace_back(std::move(it->done),
                           TimeoutError("send to " + peer + ": not sent within the timeout"));
          it = l.sends.erase(it);
        } else {
          next = next.Earlier(it->deadline);
          ++it;
        }
      }
    }
    for (auto p = l.posted.begin(); p != l.posted.end();) {
      for (auto it = p->second.begin(); it != p->second.end();) {
        if (it->deadline.passed()) {
          out.emplace_back(
              std::move(it->done),
              TimeoutError("recv from " + peer + " with tag " + std::to_string(p->first) +
                           ": no message arrived within the timeout"));
          it = p->second.erase(it);
        } else {
          next = next.Earlier(it->deadline);
          ++it;
        }
      }
      p = p->second.empty() ? l.posted.erase(p) : std::next(p);
    }
    return next;
  }

  void Loop() EXCLUDES(mu_) {
    thread_id_ = std::this_thread::get_id();
    std::vector<pollfd> fds;
    std::vector<size_t> which;
    Completions out;
    for (;;) {
      Deadline next = Deadline::Infinite();
      fds.assign(1, pollfd{wake_.get(), POLLIN, 0});
      which.clear();
      {
        MutexLock lock(mu_);
        if (stop_) return;
        // Finish() drains: a queue may have emptied since (Flush runs without mu_).
        if (!finished_.ok()) drained_.NotifyAll();
        for (size_t i = 0; i < links_.size(); ++i) {
          Link& l = links_[i];
          Status broken;
          bool sending = false;
          {
            MutexLock send_lock(*l.send_mu);
            broken = l.broken;
            sending = !l.sends.empty();
          }
          if (!broken.ok()) FailLink(l, broken, out);
          next = next.Earlier(Expire(l, out));
          if (!l.fd.valid()) continue;
          const bool held = l.in_payload && !l.placed;
          if (held) next = next.Earlier(l.hold_until);
          const short events = static_cast<short>((held ? 0 : POLLIN) | (sending ? POLLOUT : 0));
          fds.push_back(pollfd{l.fd.get(), events, 0});
          which.push_back(i);
        }
        sleep_until_ = next;
      }
      Run(out);
      if (::poll(fds.data(), fds.size(), next.PollTimeoutMs()) < 0 && errno != EINTR) {
        MutexLock lock(mu_);
        const Status failed = ErrnoError("point-to-point: poll", errno);
        for (Link& l : links_) FailLink(l, failed, out);
        stop_ = true;
        break;
      }
      {
        MutexLock lock(mu_);
        sleep_until_ = Deadline::After(std::chrono::hours(24 * 365));
        if (stop_) return;
        if (fds[0].revents != 0) {
          uint64_t v;
          [[maybe_unused]] ssize_t n = ::read(wake_.get(), &v, sizeof(v));
        }
      }
      for (size_t k = 0; k < which.size(); ++k) {
        Link& l = links_[which[k]];
        if (fds[k + 1].revents & POLLOUT) {
          MutexLock send_lock(*l.send_mu);
          if (l.fd.valid()) Flush(l, out);
        }
      }
      for (size_t k = 0; k < which.size(); ++k) {
        // A held link reads once its recv is posted or its hold passes (ReadLink's Place).
        const bool hangup = (fds[k + 1].revents & (POLLHUP | POLLERR)) != 0;
        if (hangup || (fds[k + 1].revents & POLLIN) || !(fds[k + 1].events & POLLIN)) {
          ReadLink(links_[which[k]], hangup, out);
        }
      }
      Run(out);
    }
    Run(out);
  }

  const int rank_;
  const int size_;
  const uint64_t direct_min_bytes_;
  // Per peer: its goodbye arrived (PeerFinalized). Set by the progress thread, read by anyone.
  std::vector<std::atomic<bool>> peer_finalized_;
  Mutex mu_;
  // By peer rank (this rank's entry unused); fixed after construction. Each link's fields are
  // guarded by mu_ except its send side (Link::send_mu) and its read side (the progress thread's).
  std::vector<Link> links_;
  bool stop_ GUARDED_BY(mu_) = false;
  // Finish() began: later recvs are refused with it (sends: each link's `finished`).
  Status finished_ GUARDED_BY(mu_);
  // With mu_: a link's last direct send awaiting its receipt completed, a link failed, or the
  // progress thread went round while Finish() drains (Drain).
  CondVar drained_;
  // Until when the progress thread sleeps in poll(): a recv due earlier wakes it.
  Deadline sleep_until_ GUARDED_BY(mu_) = Deadline::Infinite();
  net::Fd wake_;
  std::atomic<std::thread::id> thread_id_{};
  std::thread thread_;
};

// Which peers on this host can read this process's memory, and which this rank can read
// (collective, after ConnectMesh): every rank publishes its host, pid and the address of a word
// holding a random value; each reads the word of every peer on its host (process_vm_readv, as
// shm_direct.h) and publishes whom it could read. Sets links[p].read_from (the pid of a peer this
// rank reads), links[p].peer_reads and, for the links whose peer reads, their random open values
// (Link::open, stored in their state words).
Status ProbeDirectReads(const BackendOptions& o, const P2pDirectReads& direct, Store* store,
                        std::vector<Link>& links) {
  const Deadline deadline = Deadline::After(o.timeout);
  CONCORD_ASSIGN_OR_RETURN(const std::string secret, net::RandomHex(8));
  const std::string word = secret.substr(0, 16);  // read by the peers, compared as text
  const std::string me = "/" + std::to_string(o.rank);
  CONCORD_RETURN_IF_ERROR(store->Set(
      o.prefix + "/direct" + me, direct.host_identity + "\n" + std::to_string(::getpid()) + " " +
                                     std::to_string(reinterpret_cast<uint64_t>(word.data())) + " " +
                                     word));
  std::string readable(static_cast<size_t>(o.size), '0');
  for (int r = 0; r < o.size; ++r) {
    if (r == o.rank) continue;
    CONCORD_ASSIGN_OR_RETURN(const std::string theirs,
                             store->Get(o.prefix + "/direct/" + std::to_string(r), deadline));
    const size_t nl = theirs.find('\n');
    long long pid = 0;
    unsigned long long address = 0;
    char value[17] = {0};
    if (nl == std::string::npos || theirs.compare(0, nl, direct.host_identity) != 0 ||
        std::sscanf(theirs.c_str() + nl + 1, "%lld %llu %16s", &pid, &address, value) != 3 ||
        pid <= 0) {
      continue;  // another host (or a malformed entry): the socket carries everything
    }
    char got[16];
    if (shm_internal::ReadRemote(r, static_cast<pid_t>(pid),
                                 {shm_internal::RemoteSpan{address, sizeof(got)}}, 0, sizeof(got),
                                 got)
            .ok() &&
        std::string(got, sizeof(got)) == value) {
      links[r].read_from = static_cast<pid_t>(pid);
      readable[r] = '1';
    }
  }
  CONCORD_RETURN_IF_ERROR(store->Set(o.prefix + "/readable" + me, readable));
  CONCORD_ASSIGN_OR_RETURN(const std::string opens,
                           net::RandomHex(8 * static_cast<size_t>(o.size)));
  for (int r = 0; r < o.size; ++r) {
    if (r == o.rank) continue;
    CONCORD_ASSIGN_OR_RETURN(const std::string theirs,
                             store->Get(o.prefix + "/readable/" + std::to_string(r), deadline));
    links[r].peer_reads = theirs.size() == static_cast<size_t>(o.size) && theirs[o.rank] == '1';
    if (links[r].peer_reads) {
      links[r].open = std::max<uint64_t>(std::stoull(opens.substr(16 * r, 16), nullptr, 16), 1);
      links[r].state->store(links[r].open);
    }
  }
  // Every peer has read `word` now (each published whom it read after reading): it may go.
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<P2pTransport>> CreateTcpP2pTransport(const BackendOptions& o, Store* store,
                                                              const P2pDirectReads& direct) {
  std::vector<Link> links(static_cast<size_t>(o.size));
  for (int r = 0; r < o.size; ++r) links[r].peer = r;
  net::Fd wake(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake.valid()) return ErrnoError("point-to-point: eventfd", errno);
  CONCORD_ASSIGN_OR_RETURN(std::vector<net::Fd> fds, tcp_p2p::ConnectMesh(o, store));
  for (int r = 0; r < o.size; ++r) links[r].fd = std::move(fds[r]);
  if (!direct.host_identity.empty() && o.size > 1) {
    CONCORD_RETURN_IF_ERROR(ProbeDirectReads(o, direct, store, links));
  }
  return std::unique_ptr<P2pTransport>(std::make_unique<TcpP2pTransport>(
      o.rank, o.size, std::move(links), std::move(wake), std::max<uint64_t>(direct.min_bytes, 1)));
}

}  // namespace concord
