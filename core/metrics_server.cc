#include "core/metrics_server.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace concord {
namespace {

// Connections the kernel completes before accept() takes them: a burst as large as the server's
// table, so that none of it waits for a SYN retry.
constexpr int kBacklog = static_cast<int>(MetricsServer::kMaxConnections);
// After accept() ran out of descriptors or memory, how long before the next try.
constexpr std::chrono::milliseconds kResourcePause{100};
// After a response: how long, and how many of the bytes the client still sends (a request body, a
// pipelined request, the rest of an oversized head), the server reads and drops before it closes,
// so that the kernel does not answer them with a reset that destroys the response's tail still in
// its send buffer. A client that closes when the response is in (Connection: close) ends it at
// once.
constexpr std::chrono::milliseconds kLinger{200};
constexpr size_t kLingerBytes = 64 * 1024;

struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList() {
    if (head != nullptr) ::freeaddrinfo(head);
  }
};

// "what: strerror(errnum)" with the given code.
Status OsError(Code code, const std::string& what, int errnum) {
  return Status(code, ErrnoError(what, errnum).message());
}

int BoundPort(int fd) {
  sockaddr_storage addr;
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
}

// Errors of one pending connection (reset before it was taken; Linux also passes on the network
// errors pending on it), not of the listening socket.
bool ConnectionError(int e) {
  return e == EAGAIN || e == EWOULDBLOCK || e == EINTR || e == ECONNABORTED || e == EPROTO ||
         e == EPERM || e == ENETDOWN || e == ENOPROTOOPT || e == EHOSTDOWN || e == ENONET ||
         e == EHOSTUNREACH || e == EOPNOTSUPP || e == ENETUNREACH || e == ETIMEDOUT;
}

bool ResourceError(int e) {
  return e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM;
}

// Where the request line starts: past the empty lines ("\r\n" or a bare "\n", any number) that
// RFC 9112 2.2 says a server should ignore before it. head.size() when it holds nothing else yet.
size_t RequestLineStart(const std::string& head) {
  size_t start = 0;
  while (start < head.size()) {
    if (head[start] == '\n') {
      start += 1;
    } else if (head.compare(start, 2, "\r\n") == 0) {
      start += 2;
    } else {
      break;
    }
  }
  return start;
}

// Where the request head that starts at `start` ends (just past the empty line that ends it), or
// npos. Lines end in CRLF or in a bare LF (RFC 9112 2.2 lets a server take one, and a CR before
// it): the empty line is "\r\n" or "\n" right after a line's LF, in any mix ("\n\r\n" too).
size_t HeadEnd(const std::string& head, size_t start) {
  for (size_t lf = head.find('\n', start); lf != std::string::npos; lf = head.find('\n', lf + 1)) {
    if (head.compare(lf + 1, 1, "\n") == 0) return lf + 2;
    if (head.compare(lf + 1, 2, "\r\n") == 0) return lf + 3;
  }
  return std::string::npos;
}

std::string Response(const char* status, const std::string& content_type, const std::string& body,
                     bool with_body, const char* extra_header = "") {
  std::string r = std::string("HTTP/1.1 ") + status + "\r\nContent-Type: " + content_type +
                  "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" + extra_header +
                  "Connection: close\r\n\r\n";
  if (with_body) r += body;
  return r;
}

std::string Plain(const char* status, const std::string& text, bool with_body,
                  const char* extra_header = "") {
  return Response(status, "text/plain; charset=utf-8", text + "\n", with_body, extra_header);
}

bool IsToken(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c <= ' ' || c >= 127) return false;
  }
  return true;
}

// The path of a request target: origin-form ("/metrics?x") less its query; absolute-form
// ("http://host:port/metrics?x", RFC 9112 3.2.2) also less its scheme and authority, an empty path
// there being "/". Any other form comes back as it is, less its query.
std::string TargetPath(const std::string& target) {
  std::string path = target.substr(0, target.find('?'));
  const size_t scheme_end = path.find("://");
  if (path.empty() || path.front() == '/' || scheme_end == std::string::npos) return path;
  const size_t path_start = path.find('/', scheme_end + 3);
  return path_start == std::string::npos ? "/" : path.substr(path_start);
}

bool Transient(int e) {
  return e == EINTR || e == EAGAIN || e == EWOULDBLOCK;
}

}  // namespace

// One accepted client, through its phases: its request head arriving (up to kMaxRequestHead),
// the response leaving, and a short linger that drops what the client still sends.
// Each phase has its own deadline; the server closes the connection when it passes. Owned and
// used by the server thread alone.
class MetricsServer::Connection {
 public:
  enum class Phase { kReading, kSending, kLingering, kClosed };
  // What a read in kReading found.
  enum class Head { kIncomplete, kComplete, kTooLarge };

  Connection(net::Fd fd, Deadline deadline) : fd_(std::move(fd)), deadline_(deadline) {}

  int fd() const { return fd_.get(); }
  Phase phase() const { return phase_; }
  // Still waiting for its request head: what makes room when the server is full.
  bool waiting() const { return phase_ == Phase::kReading; }
  bool closed() const { return phase_ == Phase::kClosed; }
  Deadline deadline() const { return deadline_; }
  // What poll() waits for in this phase.
  short events() const { return phase_ == Phase::kSending ? POLLOUT : POLLIN; }
  // The complete request head, once ReadHead() said kComplete.
  const std::string& head() const { return head_; }

  // Closes the socket without a word more; the server drops the connection.
  void Close() {
    fd_.Reset();
    phase_ = Phase::kClosed;
  }

  // Reads what arrived of the request head (kReading); closes when the client hung up.
  Head ReadHead() {
    char buf[4096];
    const ssize_t n = ::recv(fd_.get(), buf, sizeof(buf), 0);
    if (n < 0 && Transient(errno)) return Head::kIncomplete;
    if (n <= 0) {  // the client hung up before a whole request, or the connection broke
      Close();
      return Head::kIncomplete;
    }
    head_.append(buf, static_cast<size_t>(n));
    // Empty lines before the request line are skipped, but count towards kMaxRequestHead, so a
    // client that sends nothing else is still refused (431) or closed at its deadline.
    const size_t start = RequestLineStart(head_);
    const size_t end = HeadEnd(head_, start);
    if (end != std::string::npos && end <= kMaxRequestHead) {
      head_ = head_.substr(start, end - start);
      return Head::kComplete;
    }
    return head_.size() > kMaxRequestHead ? Head::kTooLarge : Head::kIncomplete;
  }

  // Starts sending `response`, abandoned at `deadline`; what the client still sends afterwards is
  // read and dropped briefly before the connection closes.
  void StartResponse(std::string response, Deadline deadline) {
    head_.clear();
    response_ = std::move(response);
    deadline_ = deadline;
    phase_ = Phase::kSending;
    SendMore();  // most responses fit the socket's buffer at once
  }

  // Sends what the socket takes (kSending); once all is out, half-closes and lingers.
  void SendMore() {
    while (sent_ < response_.size()) {
      const ssize_t n =
          ::send(fd_.get(), response_.data() + sent_, response_.size() - sent_, MSG_NOSIGNAL);
      if (n < 0 && Transient(errno)) {
        if (errno == EINTR) continue;
        return;  // poll() says when the socket takes more
      }
      if (n <= 0) {  // the client went away: nothing to tell anyone
        Close();
        return;
      }
      sent_ += static_cast<size_t>(n);
    }
    ::shutdown(fd_.get(), SHUT_WR);
    response_.clear();
    deadline_ = Deadline::After(kLinger);
    phase_ = Phase::kLingering;
  }

  // Reads and drops what the client still sends (kLingering), up to kLingerBytes.
  void Drain() {
    char buf[4096];
    const ssize_t n = ::recv(fd_.get(), buf, sizeof(buf), 0);
    if (n < 0 && Transient(errno)) return;
    if (n > 0) lingered_ += static_cast<size_t>(n);
    if (n <= 0 || lingered_ >= kLingerBytes) Close();
  }

 private:
  net::Fd fd_;
  Phase phase_ = Phase::kReading;
  Deadline deadline_;
  std::string head_;      // kReading: the request head so far
  std::string response_;  // kSending: the whole response, of which sent_ bytes are out
  size_t sent_ = 0;
  size_t lingered_ = 0;  // kLingering: bytes read and dropped
};

MetricsServer::MetricsServer(net::Fd listen_fd, net::Fd wake_fd, int port, std::string address,
                             std::function<std::string()> render,
                             std::function<void(const std::string&)> warn,
                             std::chrono::milliseconds client_deadline)
    : listen_fd_(std::move(listen_fd)),
      wake_fd_(std::move(wake_fd)),
      port_(port),
      address_(std::move(address)),
      render_(std::move(render)),
      warn_(std::move(warn)),
      client_deadline_(client_deadline) {}

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& bind_address, int port, std::function<std::string()> render,
    std::function<void(const std::string&)> warn, std::chrono::milliseconds client_deadline) {
  if (port < 0 || port > 65535) {
    return InvalidArgument("port " + std::to_string(port) + " is outside 0-65535");
  }
  if (!render) return InvalidArgument("metrics server: no render function");
  std::string host = bind_address.empty() ? "127.0.0.1" : bind_address;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) return InvalidArgument("bad bind address '" + bind_address + "'");
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  AddrInfoList list;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list.head);
  if (rc != 0) {
    return InvalidArgument("bad bind address '" + bind_address + "': " + ::gai_strerror(rc));
  }
  const std::string where = net::JoinHostPort(host, port);
  Status last = Status(Code::kUnavailable, "cannot listen on " + where + ": no address");
  net::Fd listen_fd;
  for (addrinfo* ai = list.head; ai != nullptr && !listen_fd.valid(); ai = ai->ai_next) {
    net::Fd fd(
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      last = OsError(Code::kSystemError, "metrics server: socket", errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.get(), kBacklog) != 0) {
      const int e = errno;
      last = OsError(Code::kUnavailable, "cannot listen on " + where, e);
      // Taken on one of the name's addresses is taken: another address of it (localhost's ::1
      // after 127.0.0.1) would leave scrapers of the first talking to someone else.
      if (e == EADDRINUSE) return last;
      continue;
    }
    listen_fd = std::move(fd);
  }
  if (!listen_fd.valid()) return last;
  const int bound = BoundPort(listen_fd.get());
  if (bound <= 0) return OsError(Code::kSystemError, "metrics server: getsockname", errno);
  net::Fd wake(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake.valid()) return OsError(Code::kSystemError, "metrics server: eventfd", errno);
  std::unique_ptr<MetricsServer> server(new MetricsServer(
      std::move(listen_fd), std::move(wake), bound, net::JoinHostPort(host, bound),
      std::move(render), std::move(warn), client_deadline));
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

MetricsServer::~MetricsServer() {
  stop_.store(true);
  const uint64_t one = 1;
  ssize_t ignored = ::write(wake_fd_.get(), &one, sizeof(one));
  (void)ignored;
  if (thread_.joinable()) thread_.join();
}

void MetricsServer::Off(const std::string& why) {
  listen_fd_.Reset();
  if (warn_) warn_("metrics endpoint " + address_ + ": " + why + "; the metrics endpoint is off");
}

void MetricsServer::Loop() {
  std::vector<Connection> connections;  // in the order they were accepted, the oldest first
  std::vector<pollfd> fds;
  while (!stop_.load()) {
    if (accept_paused_until_ && accept_paused_until_->passed()) accept_paused_until_.reset();
    const bool room =
        connections.size() < kMaxConnections ||
        std::any_of(connections.begin(), connections.end(), std::mem_fn(&Connection::waiting));
    const bool accepting = room && !accept_paused_until_;
    // poll() skips a negative descriptor: the listening socket while not accepting.
    fds.assign({{wake_fd_.get(), POLLIN, 0}, {accepting ? listen_fd_.get() : -1, POLLIN, 0}});
    Deadline wake_at = accept_paused_until_.value_or(Deadline::Infinite());
    for (const Connection& c : connections) {
      fds.push_back({c.fd(), c.events(), 0});
      wake_at = wake_at.Earlier(c.deadline());
    }
    const int rc = ::poll(fds.data(), fds.size(), wake_at.PollTimeoutMs());
    if (stop_.load()) return;
    if (rc < 0) {
      if (errno == EINTR) continue;
      Off(ErrnoError("poll", errno).message());
      return;
    }
    for (size_t i = 0; i < connections.size(); ++i) Serve(connections[i], fds[i + 2].revents);
    connections.erase(
        std::remove_if(connections.begin(), connections.end(), std::mem_fn(&Connection::closed)),
        connections.end());
    const short listen_events = fds[1].revents;
    if (listen_events & POLLNVAL) {
      Off("the listening socket is gone");
      return;
    }
    if (listen_events != 0 && !Accept(connections, listen_events)) return;
  }
}

bool MetricsServer::Accept(std::vector<Connection>& connections, short listen_events) {
  const bool full = connections.size() >= kMaxConnections;
  // When full, the oldest connection still waiting for its request makes room; without one (every
  // open connection is being answered) the new one waits in the kernel's backlog.
  const auto oldest_waiting =
      std::find_if(connections.begin(), connections.end(), std::mem_fn(&Connection::waiting));
  if (full && oldest_waiting == connections.end()) return true;
  net::Fd client(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
  if (client.valid()) {
    if (full) connections.erase(oldest_waiting);
    connections.emplace_back(std::move(client), Deadline::After(client_deadline_));
    return true;
  }
  const int e = errno;
  // A listening socket in error (POLLERR, POLLHUP) would wake poll() at once forever: whatever
  // accept() said, that is the end.
  const bool broken = (listen_events & (POLLERR | POLLHUP)) != 0;
  if (!broken && ConnectionError(e)) return true;
  if (!broken && ResourceError(e)) {
    // Not the listening socket's fault: try again after a pause, serving the others meanwhile.
    accept_paused_until_ = Deadline::After(kResourcePause);
    return true;
  }
  Off(ErrnoError("accept", e).message());
  return false;
}

void MetricsServer::Serve(Connection& connection, short revents) {
  if (revents != 0) {
    switch (connection.phase()) {
      case Connection::Phase::kReading:
        switch (connection.ReadHead()) {
          case Connection::Head::kComplete:
            connection.StartResponse(Respond(connection.head()), Deadline::After(client_deadline_));
            break;
          case Connection::Head::kTooLarge:
            connection.StartResponse(
                Plain("431 Request Header Fields Too Large", "request head over 8 KiB", true),
                Deadline::After(client_deadline_));
            break;
          case Connection::Head::kIncomplete:
            break;
        }
        break;
      case Connection::Phase::kSending:
        connection.SendMore();
        break;
      case Connection::Phase::kLingering:
        connection.Drain();
        break;
      case Connection::Phase::kClosed:
        break;
    }
  }
  // Past its deadline: a request never completed is closed without an answer, a response not
  // taken is abandoned, a linger ends.
  if (!connection.closed() && connection.deadline().passed()) {
    connection.Close();
  }
}

std::string MetricsServer::Respond(const std::string& head) {
  std::string line = head.substr(0, head.find('\n'));
  if (!line.empty() && line.back() == '\r') line.pop_back();
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos || line.find(' ', sp2 + 1) != std::string::npos) {
    return Plain("400 Bad Request", "malformed request line", true);
  }
  const std::string method = line.substr(0, sp1);
  const std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string version = line.substr(sp2 + 1);
  if (!IsToken(method) || !IsToken(target) || version.rfind("HTTP/1.", 0) != 0) {
    return Plain("400 Bad Request", "malformed request line", true);
  }
  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only) {
    return Plain("405 Method Not Allowed", "only GET and HEAD", true, "Allow: GET, HEAD\r\n");
  }
  const std::string path = TargetPath(target);
  if (path != "/metrics" && path != "/") {
    return Plain("404 Not Found", "not found: the metrics are at /metrics", !head_only);
  }
  return Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", render_(), !head_only);
}

}  // namespace concord
