#include "backends/tcp_control_plane.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/clock.h"
#include "rendezvous/store.h"

namespace concord {

namespace {

constexpr size_t kHeaderSize = 8;
constexpr size_t kReadChunk = 64 * 1024;
// One Receive() reads at most this much from one peer per poll round, so others are not starved.
constexpr size_t kMaxReadPerRound = 64u << 20;
// ReceiveBusy polls without yielding this long before it yields between polls.
constexpr auto kSpinBeforeYield = std::chrono::microseconds(10);

// Refusal reasons in rank 0's answer to a HELLO.
enum HelloResult : uint32_t {
  kAccepted = 0,
  kBadVersion = 1,
  kBadNonce = 2,
  kBadRank = 3,
  kDuplicateRank = 4,
};

// "30 s", "0.25 s" (a decimal point whatever the application's locale: FormatSeconds).
std::string Seconds(std::chrono::milliseconds ms) {
  if (ms.count() % 1000 == 0) return std::to_string(ms.count() / 1000) + " s";
  return FormatSeconds(static_cast<double>(ms.count()) / 1000.0);
}

std::string RankName(int rank) {
  return "rank " + std::to_string(rank);
}

Status Closed(int rank) {
  return Status(Code::kPeerFailure, RankName(rank) + " closed its connection");
}

// How long ago this host's kernel last received data on the connected TCP socket fd: TCP_INFO's
// tcpi_last_data_recv, which the kernel keeps whether or not anybody has read the data since.
// The connection's setup counts as data received.
StatusOr<std::chrono::milliseconds> SinceLastArrival(int fd) {
  tcp_info info{};
  socklen_t length = sizeof(info);
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0) {
    return ErrnoError("getsockopt(TCP_INFO)", errno);
  }
  return std::chrono::milliseconds(info.tcpi_last_data_recv);
}

// Adds one to an eventfd, waking whoever polls it.
void SignalEvent(const net::Fd& event) {
  const uint64_t one = 1;
  ssize_t ignored = ::write(event.get(), &one, sizeof(one));
  (void)ignored;
}

// Resets an eventfd that poll() found readable.
void ClearEvent(const net::Fd& event) {
  uint64_t count = 0;
  ssize_t ignored = ::read(event.get(), &count, sizeof(count));
  (void)ignored;
}

StatusOr<net::Fd> EventFd() {
  net::Fd fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!fd.valid()) return ErrnoError("control plane: eventfd", errno);
  return fd;
}

}  // namespace

// One connection to one peer rank.
struct TcpControlPlane::Peer {
  int rank = -1;
  net::Fd fd;
  std::deque<std::string> out;  // whole frames queued for sending; out_done bytes of the first sent
  size_t out_done = 0;
  unsigned char header[kHeaderSize];  // the frame being received: header, then body
  size_t header_got = 0;
  bool in_body = false;
  std::string body;
  size_t body_got = 0;
  Clock::time_point last_send;  // when bytes last left for the peer
  Status failed;                // OK while the peer is alive
};

TcpControlPlane::TcpControlPlane(int rank, int size, std::chrono::milliseconds liveness_timeout,
                                 net::Fd wake, net::Fd notify, net::Fd stop,
                                 std::vector<std::unique_ptr<Peer>> peers)
    : rank_(rank),
      size_(size),
      liveness_timeout_(liveness_timeout),
      wake_(std::move(wake)),
      notify_(std::move(notify)),
      stop_(std::move(stop)),
      peers_(std::move(peers)) {
  // As if the last bytes had left a timeout ago: the first round sends every heartbeat at once (a
  // rank that connected early must hear from rank 0 before its timeout).
  const auto long_ago = Clock::now() - liveness_timeout_;
  for (auto& p : peers_) p->last_send = long_ago;
  if (!peers_.empty()) liveness_ = std::thread([this] { LivenessLoop(); });
}

TcpControlPlane::~TcpControlPlane() {
  if (liveness_.joinable()) {
    SignalEvent(stop_);
    liveness_.join();
  }
  // Best effort: give queued frames (a last message before shutdown) up to a second to leave.
  // The lock is uncontended now; it is taken for the analysis's sake.
  MutexLock lock(mu_);
  const Deadline deadline = Deadline::After(std::chrono::seconds(1));
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Peer*> polled;
    for (auto& p : peers_) {
      if (p->failed.ok() && !p->out.empty()) {
        fds.push_back({p->fd.get(), POLLOUT, 0});
        polled.push_back(p.get());
      }
    }
    if (fds.empty() || deadline.passed()) break;
    if (::poll(fds.data(), fds.size(), deadline.PollTimeoutMs()) < 0 && errno != EINTR) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents != 0) Flush(polled[i]);
    }
  }
}

TcpControlPlane::Peer* TcpControlPlane::PeerFor(int rank) {
  for (auto& p : peers_) {
    if (p->rank == rank) return p.get();
  }
  return nullptr;
}

void TcpControlPlane::MarkFailed(Peer* p, Status status) {
  if (!p->failed.ok()) return;
  p->failed = std::move(status);
  // Shut down (the peer sees the connection end), not closed: the other thread may be inside a
  // poll() on this descriptor, and a closed number could be reused for an unrelated file before
  // it looks. The destructor closes it.
  ::shutdown(p->fd.get(), SHUT_RDWR);
  p->out.clear();
  if (failure_.ok()) failure_ = p->failed;
}

void TcpControlPlane::Enqueue(Peer* p, uint32_t type, const std::string& bytes) {
  std::string frame;
  frame.reserve(kHeaderSize + bytes.size());
  net::PutU32(&frame, type);
  net::PutU32(&frame, static_cast<uint32_t>(bytes.size()));
  frame.append(bytes);
  p->out.push_back(std::move(frame));
}

void TcpControlPlane::Flush(Peer* p) {
  while (p->failed.ok() && !p->out.empty()) {
    const std::string& front = p->out.front();
    const ssize_t n =
        ::send(p->fd.get(), front.data() + p->out_done, front.size() - p->out_done, MSG_NOSIGNAL);
    if (n > 0) {
      p->last_send = Clock::now();
      p->out_done += static_cast<size_t>(n);
      if (p->out_done == front.size()) {
        p->out.pop_front();
        p->out_done = 0;
      }
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      // What the peer sent before it closed may still wait in the socket (its close reset the
      // connection, which a send finds first): it is read first, so its last message (rank 0's
      // abort) reaches the caller before the failure.
      ReadFrom(p);
      MarkFailed(p, Closed(p->rank));
    } else {
      MarkFailed(p, Status(Code::kPeerFailure, RankName(p->rank) + ": sending failed: " +
                                                   ErrnoError("send", errno).message()));
    }
  }
}

void TcpControlPlane::Consume(Peer* p, const char* data, size_t n) {
  while (n > 0 && p->failed.ok()) {
    if (!p->in_body) {
      const size_t take = std::min(kHeaderSize - p->header_got, n);
      std::memcpy(p->header + p->header_got, data, take);
      p->header_got += take;
      data += take;
      n -= take;
      if (p->header_got < kHeaderSize) return;
      p->header_got = 0;
      const uint32_t type = net::LoadU32(p->header);
      const uint32_t length = net::LoadU32(p->header + 4);
      if (type == kControlFrameHeartbeat) {
        if (length != 0) {
          MarkFailed(p, ProtocolError(RankName(p->rank) + " sent a heartbeat with a body of " +
                                      std::to_string(length) + " bytes"));
        }
        continue;
      }
      if (type != kControlFrameData) {
        MarkFailed(p, ProtocolError(RankName(p->rank) + " sent an unknown frame type " +
                                    std::to_string(type)));
        return;
      }
      if (length > kControlPlaneMaxFrame) {
        MarkFailed(
            p, ProtocolError(RankName(p->rank) + " sent a frame of " + std::to_string(length) +
                             " bytes, over the limit of " + std::to_string(kControlPlaneMaxFrame)));
        return;
      }
      if (length == 0) {
        inbox_.push_back(ControlMessage{p->rank, std::string()});
        continue;
      }
      p->in_body = true;
      p->body.assign(length, '\0');
      p->body_got = 0;
      continue;
    }
    const size_t take = std::min(p->body.size() - p->body_got, n);
    std::memcpy(&p->body[p->body_got], data, take);
    p->body_got += take;
    data += take;
    n -= take;
    if (p->body_got == p->body.size()) {
      inbox_.push_back(ControlMessage{p->rank, std::move(p->body)});
      p->body = std::string();
      p->in_body = false;
    }
  }
}

void TcpControlPlane::ReadFrom(Peer* p) {
  char chunk[kReadChunk];
  size_t total = 0;
  while (p->failed.ok() && total < kMaxReadPerRound) {
    // Large bodies are read straight into place; everything else goes through the chunk.
    const bool direct = p->in_body && p->body.size() - p->body_got >= kReadChunk;
    char* dst = direct ? &p->body[p->body_got] : chunk;
    const size_t want = direct ? p->body.size() - p->body_got : kReadChunk;
    const ssize_t n = ::recv(p->fd.get(), dst, want, 0);
    if (n > 0) {
      total += static_cast<size_t>(n);
      if (direct) {
        p->body_got += static_cast<size_t>(n);
        if (p->body_got == p->body.size()) {
          inbox_.push_back(ControlMessage{p->rank, std::move(p->body)});
          p->body = std::string();
          p->in_body = false;
        }
      } else {
        Consume(p, chunk, static_cast<size_t>(n));
      }
    } else if (n == 0) {
      MarkFailed(p, Closed(p->rank));
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return;
    } else if (errno == ECONNRESET) {
      MarkFailed(p, Closed(p->rank));
    } else {
      MarkFailed(p, Status(Code::kPeerFailure, RankName(p->rank) + ": receiving failed: " +
                                                   ErrnoError("recv", errno).message()));
    }
  }
}

Clock::time_point TcpControlPlane::Beat() {
  const auto now = Clock::now();
  const auto period = liveness_timeout_ / 4;
  Clock::time_point next = now + period;
  for (auto& owned : peers_) {
    Peer* p = owned.get();
    if (!p->failed.ok()) continue;
    ReadFrom(p);  // first: a peer that closed is reported as closed, not as silent
    Flush(p);
    if (!p->failed.ok()) continue;
    const auto asked = Clock::now();  // reading may have taken a while since `now`
    StatusOr<std::chrono::milliseconds> silent = SinceLastArrival(p->fd.get());
    if (!silent.ok()) {
      MarkFailed(p,
                 Status(Code::kPeerFailure, RankName(p->rank) + ": " + silent.status().message()));
      continue;
    }
    if (*silent > liveness_timeout_) {
      MarkFailed(p, Status(Code::kPeerFailure,
                           RankName(p->rank) + " silent for " + Seconds(liveness_timeout_)));
      continue;
    }
    // Just past the moment the peer would have been silent too long.
    next = std::min(next, asked - *silent + liveness_timeout_ + std::chrono::milliseconds(1));
    // A heartbeat only when nothing is queued: queued bytes are a sign of life already, and
    // one behind them would arrive no sooner.
    if (p->out.empty() && now - p->last_send >= period) {
      Enqueue(p, kControlFrameHeartbeat, std::string());
      Flush(p);
    }
    if (p->failed.ok() && p->out.empty()) next = std::min(next, p->last_send + period);
  }
  return next;
}

void TcpControlPlane::SetFailureListener(std::function<void()> listener) {
  {
    MutexLock lock(mu_);
    if (failure_.ok()) {
      failure_listener_ = std::move(listener);
      return;
    }
  }
  if (listener) listener();
}

Status TcpControlPlane::PeerFailure() {
  MutexLock lock(mu_);
  return failure_;
}

void TcpControlPlane::LivenessLoop() {
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({stop_.get(), POLLIN, 0});
    Clock::time_point next;
    std::function<void()> failed_now;
    {
      MutexLock lock(mu_);
      const size_t inbox_before = inbox_.size();
      const bool failed_before = !failure_.ok();
      next = Beat();
      if (inbox_.size() != inbox_before || failed_before != !failure_.ok()) SignalEvent(notify_);
      if (!failed_before && !failure_.ok()) failed_now = std::move(failure_listener_);
      // POLLRDHUP alone: a peer closing wakes this thread, data arriving does not.
      for (auto& p : peers_) {
        if (p->failed.ok()) fds.push_back({p->fd.get(), POLLRDHUP, 0});
      }
    }
    // Outside the lock: the listener interrupts the caller's collective, which may then call in.
    if (failed_now) failed_now();
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(
        next - Clock::now() + std::chrono::microseconds(999));
    const int rc =
        ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(0, wait.count())));
    if (rc > 0 && (fds[0].revents & POLLIN)) return;
  }
}

Status TcpControlPlane::Send(int to, std::string bytes) {
  if (to < 0 || to >= size_) {
    return InvalidArgument("control plane: destination rank " + std::to_string(to) +
                           " is outside [0, " + std::to_string(size_) + ")");
  }
  if (to == rank_) return InvalidArgument("control plane: rank cannot send to itself");
  if (rank_ != 0 && to != 0) {
    return InvalidArgument("control plane: rank " + std::to_string(rank_) +
                           " may only send to rank 0 (a star)");
  }
  if (bytes.size() > kControlPlaneMaxFrame) {
    return InvalidArgument("control plane: message of " + std::to_string(bytes.size()) +
                           " bytes exceeds the limit of " + std::to_string(kControlPlaneMaxFrame));
  }
  MutexLock lock(mu_);
  Peer* p = PeerFor(to);
  if (p == nullptr) return Internal("control plane: no connection to rank " + std::to_string(to));
  // A failure is returned once the messages the peer sent before it are received (the contract).
  if (!p->failed.ok()) return MessageWaitingFrom(inbox_, to) ? Status::Ok() : p->failed;
  Enqueue(p, kControlFrameData, bytes);
  Flush(p);
  return p->failed.ok() || MessageWaitingFrom(inbox_, to) ? Status::Ok() : p->failed;
}

StatusOr<bool> TcpControlPlane::ReceiveBusy(ControlMessage* out, Deadline deadline,
                                            std::chrono::microseconds busy) {
  const auto entered = Clock::now();
  std::vector<pollfd> fds;
  std::vector<Peer*> polled;
  const auto busy_until = entered + busy;
  for (;;) {
    fds.clear();
    polled.clear();
    fds.push_back({wake_.get(), POLLIN, 0});
    fds.push_back({notify_.get(), POLLIN, 0});
    {
      MutexLock lock(mu_);
      if (!inbox_.empty()) {
        *out = std::move(inbox_.front());
        inbox_.pop_front();
        return true;
      }
      if (!failure_.ok()) return failure_;
      for (auto& p : peers_) {
        if (!p->failed.ok()) continue;
        fds.push_back(
            {p->fd.get(), static_cast<short>(POLLIN | (p->out.empty() ? 0 : POLLOUT)), 0});
        polled.push_back(p.get());
      }
    }
    // The lock is not held in poll(): the liveness thread runs its rounds meanwhile, and signals
    // notify_ when one of them took a message or found a failure.
    const auto now = Clock::now();
    const bool polling = busy.count() > 0 && now < busy_until;
    const int rc = ::poll(fds.data(), fds.size(), polling ? 0 : deadline.PollTimeoutMs());
    // Past the first kSpinBeforeYield, a busy poll that found nothing yields the core: when the
    // scheduler has put two ranks' polling threads on one core, each would otherwise spin out its
    // time slice while the other holds the message it waits for (4 KiB allreduces then took
    // 130-160 us instead of 18 us). Yielding from the start cost 5-10 us on every operation.
    if (polling && rc == 0 && now - entered > kSpinBeforeYield) std::this_thread::yield();
    if (rc < 0 && errno != EINTR) return ErrnoError("control plane: poll", errno);
    bool woken = false;
    if (rc > 0) {
      if (fds[0].revents & POLLIN) {
        ClearEvent(wake_);
        woken = true;
      }
      if (fds[1].revents & POLLIN) ClearEvent(notify_);
      MutexLock lock(mu_);
      for (size_t i = 0; i < polled.size(); ++i) {
        const short revents = fds[i + 2].revents;
        if (revents & POLLOUT) Flush(polled[i]);
        if (revents & (POLLIN | POLLHUP | POLLERR)) ReadFrom(polled[i]);
      }
    }
    // Messages already received are delivered before a failure is reported.
    if (woken) return false;
    if (deadline.passed()) {
      MutexLock lock(mu_);
      if (inbox_.empty() && failure_.ok()) return false;
    }
  }
}

Status TcpControlPlane::Drain(Deadline deadline) {
  std::vector<pollfd> fds;
  std::vector<Peer*> polled;
  for (;;) {
    fds.clear();
    polled.clear();
    fds.push_back({notify_.get(), POLLIN, 0});
    {
      MutexLock lock(mu_);
      // As Receive(): a failure once the messages received before it are (the contract).
      if (!failure_.ok() && inbox_.empty()) return failure_;
      std::string waiting;
      for (auto& p : peers_) {
        if (p->failed.ok() && !p->out.empty())
          waiting += (waiting.empty() ? "" : ", ") + RankName(p->rank);
      }
      if (waiting.empty()) return Status::Ok();
      if (deadline.passed()) {
        return TimeoutError("control plane: queued messages to " + waiting +
                            " could not be sent before the deadline (the peer does not read)");
      }
      for (auto& p : peers_) {
        if (!p->failed.ok()) continue;
        fds.push_back(
            {p->fd.get(), static_cast<short>(POLLIN | (p->out.empty() ? 0 : POLLOUT)), 0});
        polled.push_back(p.get());
      }
    }
    const int rc = ::poll(fds.data(), fds.size(), deadline.PollTimeoutMs());
    if (rc < 0 && errno != EINTR) return ErrnoError("control plane: poll", errno);
    if (rc <= 0) continue;
    if (fds[0].revents & POLLIN) ClearEvent(notify_);
    MutexLock lock(mu_);
    for (size_t i = 0; i < polled.size(); ++i) {
      if (fds[i + 1].revents & POLLOUT) Flush(polled[i]);
      if (fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) ReadFrom(polled[i]);
    }
  }
}

void TcpControlPlane::Wake() {
  SignalEvent(wake_);
}

namespace {

std::string Hello(int rank, int size, const std::string& nonce) {
  std::string out;
  net::PutU32(&out, kControlHelloMagic);
  net::PutU16(&out, kControlPlaneVersion);
  net::PutU16(&out, 0);
  net::PutU32(&out, static_cast<uint32_t>(rank));
  net::PutU32(&out, static_cast<uint32_t>(size));
  out.append(nonce);
  return out;
}

std::string Ack(uint32_t result) {
  std::string out;
  net::PutU32(&out, kControlAckMagic);
  net::PutU32(&out, result);
  return out;
}

// A connection to rank 0 whose HELLO has not fully arrived yet.
struct Pending {
  net::Fd fd;
  std::string hello;
};

// Rank 0's side of the handshake: returns the HelloResult and, when accepted, the peer's rank.
// *size: the job size the peer gave, once its nonce proved it a member of this communicator.
uint32_t CheckHello(const std::string& hello, int size, const std::string& nonce,
                    const std::vector<std::unique_ptr<TcpControlPlane::Peer>>& peers, int* rank,
                    int* claimed_size) {
  const auto* p = reinterpret_cast<const unsigned char*>(hello.data());
  if (net::LoadU32(p) != kControlHelloMagic || net::LoadU16(p + 4) != kControlPlaneVersion ||
      net::LoadU16(p + 6) != 0) {
    return kBadVersion;
  }
  if (!net::ConstantTimeEquals(hello.substr(16), nonce)) return kBadNonce;
  const int r = static_cast<int32_t>(net::LoadU32(p + 8));
  const int s = static_cast<int32_t>(net::LoadU32(p + 12));
  *rank = r;
  *claimed_size = s;
  if (s != size || r < 1 || r >= size) return kBadRank;
  if (peers[r] != nullptr) return kDuplicateRank;
  return kAccepted;
}

StatusOr<std::vector<std::unique_ptr<TcpControlPlane::Peer>>> AcceptRanks(
    const TcpControlPlaneOptions& o, Store* store, Deadline deadline) {
  CONCORD_ASSIGN_OR_RETURN(const std::string nonce, net::RandomHex(kControlNonceSize / 2));
  const std::string host = o.host.empty() ? "127.0.0.1" : o.host;
  int port = 0;
  CONCORD_ASSIGN_OR_RETURN(net::Fd listener, net::Listen(host, 0, &port));
  CONCORD_RETURN_IF_ERROR(store->Set(o.prefix + "/cp/nonce", nonce));
  CONCORD_RETURN_IF_ERROR(store->Set(o.prefix + "/cp/addr", net::JoinHostPort(host, port)));

  // Indexed by rank; slot 0 stays empty.
  std::vector<std::unique_ptr<TcpControlPlane::Peer>> by_rank(o.size);
  std::vector<Pending> pending;
  int accepted = 0;
  while (accepted < o.size - 1) {
    if (deadline.passed()) {
      std::string missing;
      for (int r = 1; r < o.size; ++r) {
        if (by_rank[r] == nullptr) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      return TimeoutError("control plane: only " + std::to_string(accepted) + " of " +
                          std::to_string(o.size - 1) + " ranks connected to rank 0 within " +
                          Seconds(o.connect_timeout) + " (missing: " + missing + ")");
    }
    if (o.give_up) CONCORD_RETURN_IF_ERROR(o.give_up());
    std::vector<pollfd> fds;
    fds.push_back({listener.get(), POLLIN, 0});
    for (const Pending& p : pending) fds.push_back({p.fd.get(), POLLIN, 0});
    const Deadline slice =
        o.give_up ? deadline.Earlier(Deadline::After(TcpControlPlaneOptions::kGiveUpCheck))
                  : deadline;
    const int rc = ::poll(fds.data(), fds.size(), slice.PollTimeoutMs());
    if (rc < 0 && errno != EINTR) return ErrnoError("control plane: poll", errno);
    if (rc <= 0) continue;
    for (size_t i = 0; i < pending.size(); ++i) {
      if (fds[i + 1].revents == 0) continue;
      Pending& p = pending[i];
      char buf[kControlHelloSize];
      const ssize_t n = ::recv(p.fd.get(), buf, kControlHelloSize - p.hello.size(), 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (n <= 0) {
        p.fd.Reset();  // gone before saying hello
        continue;
      }
      p.hello.append(buf, static_cast<size_t>(n));
      if (p.hello.size() < kControlHelloSize) continue;
      int rank = -1;
      int claimed_size = o.size;
      const uint32_t result = CheckHello(p.hello, o.size, nonce, by_rank, &rank, &claimed_size);
      const std::string ack = Ack(result);
      const Status sent =
          net::WriteAll(p.fd.get(), ack.data(), ack.size(),
                        deadline.Earlier(Deadline::After(std::chrono::seconds(1))), "a new peer");
      if (claimed_size != o.size) {
        // A member of this communicator (it knows the nonce) that counts another number of
        // ranks: the job is misconfigured, and waiting would only end in a timeout that calls
        // the rank missing.
        return InvalidArgument("control plane: rank " + std::to_string(rank) +
                               " connected to rank 0 for a job of " + std::to_string(claimed_size) +
                               " ranks, but rank 0's has " + std::to_string(o.size) +
                               ": the number of ranks (CONCORD_SIZE, WORLD_SIZE) must be the same "
                               "on every rank");
      }
      if (result == kAccepted && sent.ok()) {
        auto peer = std::make_unique<TcpControlPlane::Peer>();
        peer->rank = rank;
        peer->fd = std::move(p.fd);
        by_rank[rank] = std::move(peer);
        ++accepted;
      }
      p.fd.Reset();
    }
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [](const Pending& p) { return !p.fd.valid(); }),
                  pending.end());
    if (fds[0].revents & POLLIN) {
      for (;;) {
        CONCORD_ASSIGN_OR_RETURN(net::Fd fd, net::Accept(listener.get()));
        if (!fd.valid()) break;
        pending.push_back(Pending{std::move(fd), std::string()});
      }
    }
  }
  std::vector<std::unique_ptr<TcpControlPlane::Peer>> peers;
  for (auto& p : by_rank) {
    if (p != nullptr) peers.push_back(std::move(p));
  }
  return peers;
}

StatusOr<std::unique_ptr<TcpControlPlane::Peer>> ConnectToRoot(const TcpControlPlaneOptions& o,
                                                               Store* store, Deadline deadline) {
  CONCORD_ASSIGN_OR_RETURN(const std::string addr, store->Get(o.prefix + "/cp/addr", deadline));
  CONCORD_ASSIGN_OR_RETURN(const std::string nonce, store->Get(o.prefix + "/cp/nonce", deadline));
  if (nonce.size() != kControlNonceSize) {
    return ProtocolError("control plane: the store holds a malformed nonce under '" + o.prefix +
                         "/cp/nonce'");
  }
  std::string host;
  int port = 0;
  Status s = net::SplitHostPort(addr, &host, &port);
  if (!s.ok()) return s.WithContext("control plane: rank 0's address in the store");
  StatusOr<net::Fd> fd = net::Connect(host, port, deadline);
  if (!fd.ok()) return fd.status().WithContext("control plane: connecting to rank 0");
  const std::string hello = Hello(o.rank, o.size, nonce);
  CONCORD_RETURN_IF_ERROR(net::WriteAll(fd->get(), hello.data(), hello.size(), deadline, "rank 0"));
  unsigned char ack[8];
  CONCORD_RETURN_IF_ERROR(net::ReadFull(fd->get(), ack, sizeof(ack), deadline, "rank 0"));
  if (net::LoadU32(ack) != kControlAckMagic) {
    return ProtocolError("control plane: " + addr + " is not a Concord control plane");
  }
  const std::string who = "control plane: rank 0 refused " + RankName(o.rank) + ": ";
  switch (net::LoadU32(ack + 4)) {
    case kAccepted:
      break;
    case kBadVersion:
      return Status(Code::kVersionMismatch, who + "protocol version mismatch");
    case kBadNonce:
      return Status(Code::kAuthFailed, who + "wrong job nonce (a stale address in the store?)");
    case kBadRank:
      return InvalidArgument(who + "rank or size (" + std::to_string(o.size) +
                             ") disagrees with rank 0's");
    case kDuplicateRank:
      return InvalidArgument(who + "another process already connected as this rank");
    default:
      return ProtocolError(who + "unknown reason");
  }
  auto peer = std::make_unique<TcpControlPlane::Peer>();
  peer->rank = 0;
  peer->fd = std::move(*fd);
  return peer;
}

}  // namespace

StatusOr<std::unique_ptr<TcpControlPlane>> StartTcpControlPlane(
    const TcpControlPlaneOptions& options, Store* store) {
  const TcpControlPlaneOptions& o = options;
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    return InvalidArgument("control plane: rank " + std::to_string(o.rank) + " and size " +
                           std::to_string(o.size) + " are inconsistent");
  }
  if (o.liveness_timeout.count() <= 0 || o.connect_timeout.count() <= 0) {
    return InvalidArgument("control plane: timeouts must be positive");
  }
  if (o.size > 1 && store == nullptr) return InvalidArgument("control plane: no store given");
  CONCORD_ASSIGN_OR_RETURN(net::Fd wake, EventFd());
  CONCORD_ASSIGN_OR_RETURN(net::Fd notify, EventFd());
  CONCORD_ASSIGN_OR_RETURN(net::Fd stop, EventFd());
  std::vector<std::unique_ptr<TcpControlPlane::Peer>> peers;
  const Deadline deadline = Deadline::After(o.connect_timeout);
  if (o.size > 1 && o.rank == 0) {
    CONCORD_ASSIGN_OR_RETURN(peers, AcceptRanks(o, store, deadline));
  } else if (o.size > 1) {
    CONCORD_ASSIGN_OR_RETURN(std::unique_ptr<TcpControlPlane::Peer> root,
                             ConnectToRoot(o, store, deadline));
    peers.push_back(std::move(root));
  }
  return std::unique_ptr<TcpControlPlane>(new TcpControlPlane(o.rank, o.size, o.liveness_timeout,
                                                              std::move(wake), std::move(notify),
                                                              std::move(stop), std::move(peers)));
}

StatusOr<std::unique_ptr<ControlPlane>> CreateTcpControlPlane(const TcpControlPlaneOptions& options,
                                                              Store* store) {
  CONCORD_ASSIGN_OR_RETURN(std::unique_ptr<TcpControlPlane> plane,
                           StartTcpControlPlane(options, store));
  return std::unique_ptr<ControlPlane>(std::move(plane));
}

}  // namespace concord
