#include "rendezvous/tcp_store.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace concord {

namespace {

using store_wire::kAdd;
using store_wire::kGet;
using store_wire::kGetFirst;
using store_wire::kHeaderSize;
using store_wire::kHello;
using store_wire::kNoTimeout;
using store_wire::kReply;
using store_wire::kSet;
using store_wire::kWait;

constexpr auto kAuthTimeout = std::chrono::seconds(10);
// How long accepting pauses when the server cannot take a connection (or take one more).
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
// The most an unauthenticated client may have sent and the server not yet handled: one HELLO.
constexpr size_t kMaxUnauthenticatedInput = kHeaderSize + kTcpStoreMaxToken;
// How long a client waits for a GET/WAIT reply beyond the deadline it sent (the server answers
// kTimeout at that deadline; this covers the trip back).
constexpr auto kReplyGrace = std::chrono::seconds(5);
uint64_t TimeoutMs(Deadline deadline) {
  const int ms = deadline.PollTimeoutMs();
  return ms < 0 ? kNoTimeout : static_cast<uint64_t>(ms);
}

Deadline DeadlineFromMs(uint64_t ms) {
  // Beyond a year is as good as never; this also keeps the time_point arithmetic from overflowing.
  if (ms >= uint64_t{365} * 24 * 3600 * 1000) return Deadline::Infinite();
  return Deadline::After(std::chrono::milliseconds(static_cast<int64_t>(ms)));
}

// The server answers a GET/WAIT by the deadline it was sent; allow for the trip back.
Deadline ReplyDeadline(Deadline deadline) {
  if (deadline.infinite()) return deadline;
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline.at() - Clock::now());
  return Deadline::After(std::max(left, std::chrono::milliseconds(0)) + kReplyGrace);
}

}  // namespace

// One connection, as the server thread sees it.
struct TcpStoreServer::Client {
  net::Fd fd;
  std::string in;   // bytes received and not yet handled
  std::string out;  // bytes to send; out_done of them already sent
  size_t out_done = 0;
  bool authed = false;
  bool closing = false;  // drop once `out` is flushed
  bool dead = false;     // dropped: reaped at the end of this round of events
  uint32_t watched = 0;  // the epoll events registered for it
  Clock::time_point accepted_at;
  bool parked = false;  // a GET, WAIT or GET_FIRST waits for keys
  uint8_t parked_type = 0;
  std::vector<std::string> parked_keys;
  Deadline parked_deadline = Deadline::Infinite();
  bool filed = false;  // in waiting_ (and, with a deadline, in expiries_ at `expiry`)
  std::multimap<Clock::time_point, Client*>::iterator expiry;
};

namespace {

// What an epoll event's data holds for the two descriptors that are not clients (a client's is
// its Client*, never these).
constexpr uint64_t kWakeEvent = 0;
constexpr uint64_t kListenerEvent = 1;

// Milliseconds until `at`, rounded up, at least 0.
int MsUntil(Clock::time_point at) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(at - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 24 * 3600 * 1000));
}

// The earlier of two epoll timeouts (-1: none).
int EarlierTimeout(int a, int b) {
  if (a < 0) return b;
  if (b < 0) return a;
  return std::min(a, b);
}

}  // namespace

TcpStoreServer::TcpStoreServer(net::Fd listen_fd, net::Fd wake_fd, net::Fd epoll_fd, int port,
                               std::string address, std::string token)
    : listen_fd_(std::move(listen_fd)),
      wake_fd_(std::move(wake_fd)),
      epoll_fd_(std::move(epoll_fd)),
      port_(port),
      address_(std::move(address)),
      token_(std::move(token)) {}

StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const std::string& bind_host,
                                                                int port,
                                                                const std::string& token) {
  if (port < 0 || port > 65535) return InvalidArgument("store server: port out of range");
  if (token.empty()) return InvalidArgument("store server: the token must not be empty");
  if (token.size() > kTcpStoreMaxToken) {
    return InvalidArgument("store server: the token is " + std::to_string(token.size()) +
                           " bytes, more than the limit of " + std::to_string(kTcpStoreMaxToken));
  }
  int bound = 0;
  CONCORD_ASSIGN_OR_RETURN(net::Fd listen_fd, net::Listen(bind_host, port, &bound));
  net::Fd wake(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake.valid()) return ErrnoError("store server: eventfd", errno);
  net::Fd epoll(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll.valid()) return ErrnoError("store server: epoll_create1", errno);
  // data.u64: kWakeEvent, kListenerEvent, or (data.ptr) a client.
  for (const int fd : {wake.get(), listen_fd.get()}) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.u64 = fd == wake.get() ? kWakeEvent : kListenerEvent;
    if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd, &e) != 0) {
      return ErrnoError("store server: epoll_ctl", errno);
    }
  }
  const std::string host = bind_host.empty() ? "127.0.0.1" : bind_host;
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer(std::move(listen_fd), std::move(wake),
                                                            std::move(epoll), bound,
                                                            net::JoinHostPort(host, bound), token));
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

TcpStoreServer::~TcpStoreServer() {
  stop_.store(true);
  const uint64_t one = 1;
  ssize_t ignored = ::write(wake_fd_.get(), &one, sizeof(one));
  (void)ignored;
  if (thread_.joinable()) thread_.join();
}

void TcpStoreServer::Loop() {
  constexpr int kEvents = 256;
  epoll_event events[kEvents];
  while (!stop_.load()) {
    const int timeout =
        EarlierTimeout(EarlierTimeout(ResumeAccepting(), ExpireParked()), DropSilentClients());
    Reap();
    const int n = ::epoll_wait(epoll_fd_.get(), events, kEvents, timeout);
    if (n < 0 && errno != EINTR) {
      // Nothing sensible is left to do for a failure on valid descriptors; back off briefly.
      ::usleep(10000);
      continue;
    }
    if (stop_.load()) break;
    for (int i = 0; i < n; ++i) {
      const epoll_event& e = events[i];
      if (e.data.u64 == kListenerEvent) {
        AcceptAll();
        continue;
      }
      if (e.data.u64 == kWakeEvent) continue;
      Client* c = static_cast<Client*>(e.data.ptr);
      if (c->dead) continue;  // dropped earlier in this round (as another's wake-up, say)
      if (e.events & EPOLLOUT) Flush(c);
      if (c->dead || !(e.events & (EPOLLIN | EPOLLHUP | EPOLLERR))) continue;
      if (c->closing) {
        Drop(c);  // it hung up or errored while we only wanted to finish writing
      } else if (ReadFrom(c)) {
        HandleFrames(c);
      } else {
        Drop(c);
      }
    }
  }
  clients_.clear();
}
void TcpStoreServer::AcceptAll() {
  for (;;) {
    const auto now = Clock::now();
    if (unauthenticated_count_ >= kMaxUnauthenticated) {
      while (unauthenticated_.front()->authed || unauthenticated_.front()->dead) {
        unauthenticated_.pop_front();
      }
      Client* oldest = unauthenticated_.front();
      if (now - oldest->accepted_at < kUnauthenticatedGrace) return PauseAccepting();
      Drop(oldest);
    }
    StatusOr<net::Fd> fd = net::Accept(listen_fd_.get());
    // An error here is the listener's (EMFILE, ENFILE, ENOBUFS): the connection stays queued.
    if (!fd.ok()) return PauseAccepting();
    if (!fd->valid()) return;
    auto owned = std::make_unique<Client>();
    Client* c = owned.get();
    c->fd = std::move(*fd);
    c->accepted_at = now;
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.ptr = c;
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, c->fd.get(), &e) != 0) {
      return PauseAccepting();  // out of memory for epoll: the connection closes, unserved
    }
    c->watched = EPOLLIN;
    clients_.emplace(c, std::move(owned));
    unauthenticated_.push_back(c);
    ++unauthenticated_count_;
  }
}

void TcpStoreServer::PauseAccepting() {
  accept_paused_until_ = Clock::now() + kAcceptPause;
  if (!accepting_) return;
  epoll_event e{};
  e.events = 0;  // stays registered, reports nothing
  e.data.u64 = kListenerEvent;
  accepting_ = ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, listen_fd_.get(), &e) != 0;
}

int TcpStoreServer::ResumeAccepting() {
  if (accepting_) return -1;
  if (Clock::now() < accept_paused_until_) return MsUntil(accept_paused_until_);
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.u64 = kListenerEvent;
  accepting_ = ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, listen_fd_.get(), &e) == 0;
  return accepting_ ? -1 : static_cast<int>(kAcceptPause.count());
}

int TcpStoreServer::DropSilentClients() {
  // In accept order: the first still unauthenticated is the oldest.
  while (!unauthenticated_.empty()) {
    Client* c = unauthenticated_.front();
    if (c->authed || c->dead) {
      unauthenticated_.pop_front();
      continue;
    }
    // Refused ones too, whose refusal it has not read in all that time.
    if (Clock::now() - c->accepted_at < kAuthTimeout) return MsUntil(c->accepted_at + kAuthTimeout);
    Drop(c);
  }
  return -1;
}

int TcpStoreServer::ExpireParked() {
  while (!expiries_.empty() && expiries_.begin()->first <= Clock::now()) {
    Client* c = expiries_.begin()->second;
    TryAnswerParked(c, /*expired=*/true);  // unparks it, so takes it out of expiries_
    HandleFrames(c);
  }
  return expiries_.empty() ? -1 : MsUntil(expiries_.begin()->first);
}

bool TcpStoreServer::ReadFrom(Client* c) {
  char buf[65536];
  for (;;) {
    size_t room = sizeof(buf);
    if (!c->authed) {
      // HandleFrames authenticates (or refuses) a full buffer before anything more is read.
      room = std::min(room, kMaxUnauthenticatedInput - c->in.size());
      if (room == 0) return true;
    }
    const ssize_t n = ::recv(c->fd.get(), buf, room, 0);
    if (n > 0) {
      c->in.append(buf, static_cast<size_t>(n));
      // A parked client may pipeline, but never more than one maximal frame beyond what we hold.
      if (c->in.size() > 2 * (kHeaderSize + kTcpStoreMaxFrame)) return false;
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

void TcpStoreServer::HandleFrames(Client* c) {
  size_t pos = 0;
  while (!c->parked && !c->closing && !c->dead) {
    uint8_t type = 0;
    const char* body = nullptr;
    uint32_t length = 0;
    size_t consumed = 0;
    const Status frame = store_wire::NextFrame(c->in.data() + pos, c->in.size() - pos, &type, &body,
                                               &length, &consumed);
    if (!frame.ok()) {
      Fail(c, frame.code(), frame.message());
      break;
    }
    const bool have_header = c->in.size() - pos >= kHeaderSize;  // then type and length are set
    if (!c->authed && have_header && (type != kHello || length > kTcpStoreMaxToken)) {
      // Refused from the header alone, so an unauthenticated client never makes us buffer a body.
      Fail(c, Code::kAuthFailed,
           type != kHello
               ? "the first request must present the job's token"
               : "the token presented is " + std::to_string(length) +
                     " bytes, more than the limit of " + std::to_string(kTcpStoreMaxToken));
      break;
    }
    if (consumed == 0) break;  // the rest has not arrived yet
    HandleRequest(c, type, body, length);
    pos += consumed;
  }
  c->in.erase(0, pos);
}

void TcpStoreServer::HandleRequest(Client* c, uint8_t type, const char* body, size_t size) {
  if (!c->authed) {  // HandleFrames passes only a HELLO here
    if (!net::ConstantTimeEquals(std::string(body, size), token_)) {
      Fail(c, Code::kAuthFailed, "wrong token (this store belongs to another job)");
    } else {
      c->authed = true;
      --unauthenticated_count_;
      Reply(c, Code::kOk, "");
    }
    return;
  }
  requests_.fetch_add(1, std::memory_order_relaxed);
  store_wire::Request request;
  const Status parsed = store_wire::ParseRequest(type, body, size, &request);
  if (!parsed.ok()) return Fail(c, parsed.code(), parsed.message());
  const std::string& key = request.key;
  switch (type) {
    case kSet:
      values_[key] = std::move(request.value);
      Reply(c, Code::kOk, "");
      break;
    case kAdd: {
      int64_t value = 0;
      auto it = values_.find(key);
      if (it != values_.end() && !net::ParseInt64(it->second, &value)) {
        return Reply(c, Code::kInvalidArgument,
                     "store: Add on key '" + key + "', which does not hold an integer");
      }
      if (__builtin_add_overflow(value, static_cast<int64_t>(request.delta), &value)) {
        return Reply(c, Code::kInvalidArgument, "store: Add on key '" + key + "' overflows int64");
      }
      values_[key] = std::to_string(value);
      std::string payload;
      net::PutU64(&payload, static_cast<uint64_t>(value));
      Reply(c, Code::kOk, payload);
      break;
    }
    default: {  // GET, WAIT or GET_FIRST
      if (type == kGetFirst && request.keys.empty()) {
        return Reply(c, Code::kInvalidArgument, "store: GET_FIRST of no keys");
      }
      c->parked = true;
      c->parked_type = type;
      c->parked_keys = type == kGet ? std::vector<std::string>{key} : std::move(request.keys);
      c->parked_deadline = DeadlineFromMs(request.timeout_ms);
      // Answered now, or when its keys appear (WakeWaitersOf) or its deadline passes.
      if (!TryAnswerParked(c, /*expired=*/false)) Park(c);
      return;
    }
  }
  WakeWaitersOf(key);  // a SET or ADD changed the map
}

void TcpStoreServer::WakeWaitersOf(const std::string& key) {
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return;
  // Answering one takes it out of waiting_ (and may handle its next requests, which may park or
  // wake others): work on a copy.
  const std::vector<Client*> waiters(it->second.begin(), it->second.end());
  for (Client* other : waiters) {
    if (other->parked && !other->dead && TryAnswerParked(other, /*expired=*/false)) {
      HandleFrames(other);
    }
  }
}

void TcpStoreServer::Park(Client* c) {
  for (const std::string& key : c->parked_keys) waiting_[key].insert(c);
  c->expiry = c->parked_deadline.infinite() ? expiries_.end()
                                            : expiries_.emplace(c->parked_deadline.at(), c);
  c->filed = true;
}

void TcpStoreServer::Unpark(Client* c) {
  if (c->filed) {
    for (const std::string& key : c->parked_keys) {
      auto it = waiting_.find(key);
      if (it == waiting_.end()) continue;
      it->second.erase(c);
      if (it->second.empty()) waiting_.erase(it);
    }
    if (c->expiry != expiries_.end()) expiries_.erase(c->expiry);
    c->filed = false;
  }
  c->parked = false;
  c->parked_keys.clear();
}

bool TcpStoreServer::TryAnswerParked(Client* c, bool expired) {
  if (c->parked_type == kGetFirst) {
    for (size_t i = 0; i < c->parked_keys.size(); ++i) {
      auto it = values_.find(c->parked_keys[i]);
      if (it == values_.end()) continue;
      const std::string payload =
          store_wire::EncodeFirstPayload(static_cast<uint32_t>(i), it->second);
      Unpark(c);
      Reply(c, Code::kOk, payload);
      return true;
    }
    if (!expired) return false;
    const std::string message = NoKeyAppearedMessage(c->parked_keys);
    Unpark(c);
    Reply(c, Code::kTimeout, message);
    return true;
  }
  for (const std::string& key : c->parked_keys) {
    if (values_.count(key) == 0) {
      if (!expired) return false;
      const std::string message = NoKeyAppearedMessage({key});
      Unpark(c);
      Reply(c, Code::kTimeout, message);
      return true;
    }
  }
  const std::string payload = c->parked_type == kGet ? values_[c->parked_keys[0]] : "";
  Unpark(c);
  Reply(c, Code::kOk, payload);
  return true;
}

void TcpStoreServer::Reply(Client* c, Code code, const std::string& payload) {
  c->out.append(store_wire::Frame(kReply, store_wire::EncodeReply(code, payload)));
  Flush(c);
}

void TcpStoreServer::Fail(Client* c, Code code, const std::string& message) {
  c->closing = true;
  if (c->parked) Unpark(c);
  Reply(c, code, message);
}

void TcpStoreServer::Flush(Client* c) {
  while (!c->dead && c->out_done < c->out.size()) {
    const ssize_t n =
        ::send(c->fd.get(), c->out.data() + c->out_done, c->out.size() - c->out_done, MSG_NOSIGNAL);
    if (n > 0) {
      c->out_done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return Watch(c);
    } else {
      return Drop(c);
    }
  }
  if (c->dead) return;
  c->out.clear();
  c->out_done = 0;
  if (c->closing) return Drop(c);
  Watch(c);
}

void TcpStoreServer::Watch(Client* c) {
  const uint32_t want =
      (c->closing ? 0u : uint32_t{EPOLLIN}) | (c->out_done < c->out.size() ? EPOLLOUT : 0u);
  if (want == c->watched) return;
  epoll_event e{};
  e.events = want;
  e.data.ptr = c;
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, c->fd.get(), &e) != 0) return Drop(c);
  c->watched = want;
}

void TcpStoreServer::Drop(Client* c) {
  if (c->dead) return;
  c->dead = true;
  if (!c->authed) --unauthenticated_count_;
  if (c->parked) Unpark(c);
  dropped_.push_back(c);
}

void TcpStoreServer::Reap() {
  if (dropped_.empty()) return;
  // unauthenticated_ keeps no pointer to a client it frees (it is read from its front only).
  unauthenticated_.erase(std::remove_if(unauthenticated_.begin(), unauthenticated_.end(),
                                        [](const Client* c) { return c->dead; }),
                         unauthenticated_.end());
  // Closing a descriptor takes it out of the epoll set.
  for (Client* c : dropped_) clients_.erase(c);
  dropped_.clear();
}

// ---- client ----

TcpStore::TcpStore(std::string host, int port, std::string token,
                   std::chrono::milliseconds op_timeout)
    : host_(std::move(host)),
      port_(port),
      token_(std::move(token)),
      where_("TCP store at " + net::JoinHostPort(host_, port_)),
      op_timeout_(op_timeout) {}

StatusOr<std::unique_ptr<TcpStore>> TcpStore::Connect(const std::string& host, int port,
                                                      const std::string& token, Deadline deadline,
                                                      std::chrono::milliseconds op_timeout) {
  if (token.size() > kTcpStoreMaxToken) {
    return InvalidArgument("store: the token (CONCORD_TOKEN) is " + std::to_string(token.size()) +
                           " bytes, more than the limit of " + std::to_string(kTcpStoreMaxToken));
  }
  std::unique_ptr<TcpStore> store(new TcpStore(host, port, token, op_timeout));
  CONCORD_ASSIGN_OR_RETURN(net::Fd fd, store->Open(deadline));
  MutexLock lock(store->mu_);
  store->idle_.push_back(std::move(fd));
  store->open_ = 1;
  return store;
}

StatusOr<net::Fd> TcpStore::Open(Deadline deadline) const {
  StatusOr<net::Fd> fd = net::Connect(host_, port_, deadline);
  if (!fd.ok()) return fd.status().WithContext(where_);
  std::string payload;
  bool in_sync = false;
  const Status hello = Exchange(fd->get(), kHello, token_, deadline, deadline, &payload, &in_sync);
  if (hello.code() == Code::kAuthFailed) {
    return Status(Code::kAuthFailed, where_ + " refused this job's token: " + hello.message() +
                                         " (is CONCORD_TOKEN from the same launcher?)");
  }
  if (!hello.ok()) return hello;
  return std::move(*fd);
}

int TcpStore::connections() const {
  MutexLock lock(mu_);
  return open_;
}

StatusOr<std::string> TcpStore::Call(uint8_t type, const std::string& body, Deadline write_deadline,
                                     Deadline reply_deadline) {
  if (body.size() > kTcpStoreMaxFrame) {
    return InvalidArgument("store: request of " + std::to_string(body.size()) +
                           " bytes exceeds the limit of " + std::to_string(kTcpStoreMaxFrame));
  }
  net::Fd fd;
  {
    MutexLock lock(mu_);
    if (!idle_.empty()) {
      fd = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  if (!fd.valid()) {
    CONCORD_ASSIGN_OR_RETURN(fd, Open(write_deadline));
    MutexLock lock(mu_);
    ++open_;
  }
  std::string payload;
  bool in_sync = false;
  Status s = Exchange(fd.get(), type, body, write_deadline, reply_deadline, &payload, &in_sync);
  {
    MutexLock lock(mu_);
    if (in_sync) {
      idle_.push_back(std::move(fd));
    } else {
      // The stream position is unknown (partial write, lost reply): the connection is closed.
      --open_;
    }
  }
  if (!s.ok()) return s;
  return payload;
}

Status TcpStore::Exchange(int fd, uint8_t type, const std::string& body, Deadline write_deadline,
                          Deadline reply_deadline, std::string* payload, bool* in_sync) const {
  *in_sync = false;
  const std::string request = store_wire::Frame(type, body);
  Status s = net::WriteAll(fd, request.data(), request.size(), write_deadline, where_);
  if (!s.ok()) return s;
  unsigned char header[kHeaderSize];
  s = net::ReadFull(fd, header, sizeof(header), reply_deadline, where_);
  if (!s.ok()) return s;
  uint8_t reply_type = 0;
  uint32_t length = 0;
  s = store_wire::ParseHeader(header, &reply_type, &length);
  if (!s.ok()) return s.WithContext(where_);
  if (reply_type != kReply || length < 1) {
    return ProtocolError(where_ + ": unexpected reply type " + std::to_string(reply_type));
  }
  std::string reply(length, '\0');
  s = net::ReadFull(fd, &reply[0], length, reply_deadline, where_);
  if (!s.ok()) return s;
  Status carried;
  s = store_wire::ParseReply(reply.data(), reply.size(), &carried, payload);
  if (!s.ok()) return s.WithContext(where_);
  *in_sync = true;
  return carried;
}

Status TcpStore::Set(const std::string& key, const std::string& value) {
  store_wire::Request r;
  r.type = kSet;
  r.key = key;
  r.value = value;
  const Deadline d = Deadline::After(op_timeout_);
  return Call(kSet, store_wire::EncodeRequest(r), d, d).status();
}

StatusOr<std::string> TcpStore::Get(const std::string& key, Deadline deadline) {
  store_wire::Request r;
  r.type = kGet;
  r.timeout_ms = TimeoutMs(deadline);
  r.key = key;
  return Call(kGet, store_wire::EncodeRequest(r), Deadline::After(op_timeout_),
              ReplyDeadline(deadline));
}

Status TcpStore::Wait(const std::vector<std::string>& keys, Deadline deadline) {
  store_wire::Request r;
  r.type = kWait;
  r.timeout_ms = TimeoutMs(deadline);
  r.keys = keys;
  return Call(kWait, store_wire::EncodeRequest(r), Deadline::After(op_timeout_),
              ReplyDeadline(deadline))
      .status();
}

StatusOr<FoundKey> TcpStore::GetFirst(const std::vector<std::string>& keys, Deadline deadline) {
  if (keys.empty()) return InvalidArgument("store: GetFirst of no keys");
  store_wire::Request r;
  r.type = kGetFirst;
  r.timeout_ms = TimeoutMs(deadline);
  r.keys = keys;
  StatusOr<std::string> payload = Call(kGetFirst, store_wire::EncodeRequest(r),
                                       Deadline::After(op_timeout_), ReplyDeadline(deadline));
  if (!payload.ok()) {
    if (payload.status().code() == Code::kProtocolError &&
        payload.status().message().find("unknown request type") != std::string::npos) {
      return payload.status().WithContext(
          where_ +
          " (its server is from an older Concord, without GET_FIRST: start the job with "
          "the concordrun of the same Concord as the ranks)");
    }
    return payload.status();
  }
  FoundKey found;
  const Status s = store_wire::ParseFirstPayload(*payload, keys.size(), &found);
  if (!s.ok()) return s.WithContext(where_);
  return found;
}

StatusOr<int64_t> TcpStore::Add(const std::string& key, int64_t delta) {
  store_wire::Request r;
  r.type = kAdd;
  r.key = key;
  r.delta = static_cast<uint64_t>(delta);
  const Deadline d = Deadline::After(op_timeout_);
  CONCORD_ASSIGN_OR_RETURN(const std::string payload,
                           Call(kAdd, store_wire::EncodeRequest(r), d, d));
  int64_t value = 0;
  const Status s = store_wire::ParseAddPayload(payload, &value);
  if (!s.ok()) return s.WithContext(where_);
  return value;
}

}  // namespace concord
