#include "core/metrics_server.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <utility>

namespace concord {
namespace {

constexpr int kBacklog = 16;
// After accept() ran out of descriptors or memory, how long before the next try.
constexpr std::chrono::milliseconds kResourcePause{100};
// After refusing an oversized request: how long, and how many of the bytes the client still
// sends, the server reads and drops before it closes, so that the kernel does not answer them
// with a reset that could destroy the response on its way.
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

// Where the request head ends (just past its blank line), or npos.
size_t HeadEnd(const std::string& head) {
  const size_t crlf = head.find("\r\n\r\n");
  const size_t lf = head.find("\n\n");
  if (crlf == std::string::npos && lf == std::string::npos) return std::string::npos;
  if (lf == std::string::npos || (crlf != std::string::npos && crlf < lf)) return crlf + 4;
  return lf + 2;
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

}  // namespace

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

MetricsServer::Wait MetricsServer::WaitFor(int fd, short events, Deadline deadline) {
  for (;;) {
    if (stop_.load()) return Wait::kStop;
    pollfd fds[2] = {{wake_fd_.get(), POLLIN, 0}, {fd, events, 0}};
    const int rc = ::poll(fds, 2, deadline.PollTimeoutMs());
    if (stop_.load()) return Wait::kStop;
    if (rc > 0 && fds[1].revents != 0) return Wait::kReady;
    if (rc == 0 || deadline.passed()) return Wait::kTimeout;
    // rc < 0 (EINTR; any other error shows again in the read or write that follows) or only
    // the eventfd fired, which stop_ answers.
    if (rc < 0 && errno != EINTR) return Wait::kReady;
  }
}

void MetricsServer::Loop() {
  while (!stop_.load()) {
    pollfd fds[2] = {{wake_fd_.get(), POLLIN, 0}, {listen_fd_.get(), POLLIN, 0}};
    const int rc = ::poll(fds, 2, -1);
    if (stop_.load()) return;
    if (rc < 0) {
      if (errno == EINTR) continue;
      Off(ErrnoError("poll", errno).message());
      return;
    }
    if (fds[1].revents & POLLNVAL) {
      Off("the listening socket is gone");
      return;
    }
    if (fds[1].revents == 0) continue;
    net::Fd client(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (client.valid()) {
      Serve(std::move(client));
      continue;
    }
    const int e = errno;
    // A listening socket in error (POLLERR, POLLHUP) would wake poll() at once forever: whatever
    // accept() said, that is the end.
    const bool broken = (fds[1].revents & (POLLERR | POLLHUP)) != 0;
    if (!broken && ConnectionError(e)) continue;
    if (!broken && ResourceError(e)) {
      // Not the listening socket's fault: try again after a pause, which the destructor cuts.
      pollfd wake{wake_fd_.get(), POLLIN, 0};
      ::poll(&wake, 1, static_cast<int>(kResourcePause.count()));
      continue;
    }
    Off(ErrnoError("accept", e).message());
    return;
  }
}

void MetricsServer::Serve(net::Fd client) {
  const Deadline deadline = Deadline::After(client_deadline_);
  std::string head;
  char buf[4096];
  size_t end = std::string::npos;
  for (;;) {
    if (WaitFor(client.get(), POLLIN, deadline) != Wait::kReady) return;
    const ssize_t n = ::recv(client.get(), buf, sizeof(buf), 0);
    if (n == 0) return;  // the client hung up before a whole request
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return;
    }
    head.append(buf, static_cast<size_t>(n));
    end = HeadEnd(head);
    if (end != std::string::npos && end <= kMaxRequestHead) break;
    if (head.size() > kMaxRequestHead) {
      Send(client.get(),
           Plain("431 Request Header Fields Too Large", "request head over 8 KiB", true), deadline);
      Linger(client.get());
      return;
    }
  }
  head.resize(end);
  Send(client.get(), Respond(head), Deadline::After(client_deadline_));
}

void MetricsServer::Linger(int fd) {
  const Deadline deadline = Deadline::After(kLinger);
  char buf[4096];
  for (size_t taken = 0; taken < kLingerBytes;) {
    if (WaitFor(fd, POLLIN, deadline) != Wait::kReady) return;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0) return;
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return;
    }
    taken += static_cast<size_t>(n);
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
  const std::string path = target.substr(0, target.find('?'));
  if (path != "/metrics" && path != "/") {
    return Plain("404 Not Found", "not found: the metrics are at /metrics", !head_only);
  }
  return Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", render_(), !head_only);
}

void MetricsServer::Send(int fd, const std::string& response, Deadline deadline) {
  size_t done = 0;
  while (done < response.size()) {
    const ssize_t n = ::send(fd, response.data() + done, response.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (WaitFor(fd, POLLOUT, deadline) != Wait::kReady) return;
    } else {
      return;  // the client went away: nothing to tell anyone
    }
  }
  ::shutdown(fd, SHUT_WR);
}

}  // namespace concord
