#include "rendezvous/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>

namespace concord {
namespace net {

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    Reset();
    fd_ = other.Release();
  }
  return *this;
}

int Fd::Release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void Fd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status SplitHostPort(const std::string& text, std::string* host, int* port) {
  std::string h;
  std::string p;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return InvalidArgument("malformed address '" + text + "' (expected [v6addr]:port)");
    }
    h = text.substr(1, close - 1);
    p = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos) {
      return InvalidArgument("malformed address '" + text + "' (expected host:port)");
    }
    h = text.substr(0, colon);
    p = text.substr(colon + 1);
  }
  if (h.empty()) return InvalidArgument("address '" + text + "' has no host");
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) {
    return InvalidArgument("address '" + text + "' has an invalid port");
  }
  const int value = std::stoi(p);
  if (value < 1 || value > 65535) {
    return InvalidArgument("address '" + text + "' has a port outside 1-65535");
  }
  *host = h;
  *port = value;
  return Status::Ok();
}

std::string JoinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

namespace {

struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList() {
    if (head != nullptr) freeaddrinfo(head);
  }
};

Status Resolve(const std::string& host, int port, bool passive, AddrInfoList* list) {
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &list->head);
  if (rc != 0) {
    return Status(Code::kSystemError, "cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  return Status::Ok();
}

int BoundPort(int fd) {
  sockaddr_storage addr;
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
}

// Waits for events on one fd until the deadline; returns the revents, 0 on timeout.
StatusOr<short> PollOne(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, deadline.PollTimeoutMs());
    if (rc > 0) return p.revents;
    if (rc == 0) return static_cast<short>(0);
    if (errno != EINTR) return ErrnoError("poll", errno);
  }
}

}  // namespace

StatusOr<Fd> Listen(const std::string& host, int port, int* bound_port) {
  const std::string h = host.empty() ? "127.0.0.1" : host;
  AddrInfoList list;
  CONCORD_RETURN_IF_ERROR(Resolve(h, port, /*passive=*/true, &list));
  Status last = SystemError("no address to listen on for '" + h + "'");
  for (addrinfo* ai = list.head; ai != nullptr; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      last = ErrnoError("socket", errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last = ErrnoError("bind " + JoinHostPort(h, port), errno);
      continue;
    }
    if (::listen(fd.get(), SOMAXCONN) != 0) {
      last = ErrnoError("listen", errno);
      continue;
    }
    *bound_port = BoundPort(fd.get());
    if (*bound_port <= 0) return ErrnoError("getsockname", errno);
    return fd;
  }
  return last;
}

Status SetNonBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return ErrnoError("fcntl(O_NONBLOCK)", errno);
  }
  return Status::Ok();
}

Status SetNoDelay(int fd) {
  const int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    return ErrnoError("setsockopt(TCP_NODELAY)", errno);
  }
  return Status::Ok();
}

StatusOr<Fd> Connect(const std::string& host, int port, Deadline deadline) {
  AddrInfoList list;
  CONCORD_RETURN_IF_ERROR(Resolve(host, port, /*passive=*/false, &list));
  const std::string where = JoinHostPort(host, port);
  Status last = SystemError("no address to connect to for '" + where + "'");
  for (addrinfo* ai = list.head; ai != nullptr; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      last = ErrnoError("socket", errno);
      continue;
    }
    if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last = ErrnoError("connect to " + where, errno);
        continue;
      }
      CONCORD_ASSIGN_OR_RETURN(short revents, PollOne(fd.get(), POLLOUT, deadline));
      if (revents == 0) return TimeoutError("connect to " + where + " timed out");
      int err = 0;
      socklen_t len = sizeof(err);
      if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err != 0) {
        last = ErrnoError("connect to " + where, err);
        continue;
      }
    }
    CONCORD_RETURN_IF_ERROR(SetNoDelay(fd.get()));
    return fd;
  }
  return last;
}

StatusOr<Fd> Accept(int listen_fd) {
  for (;;) {
    Fd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd.valid()) {
      // Not fatal: a socket without TCP_NODELAY still works, only slower.
      (void)SetNoDelay(fd.get());
      return fd;
    }
    if (errno == EINTR) continue;
    // Errors of the accepted connection itself (it was reset before we took it) are not errors of
    // the listening socket: report "nothing pending".
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED || errno == EPROTO ||
        errno == EPERM) {
      return Fd();
    }
    return ErrnoError("accept", errno);
  }
}

Status WriteAll(int fd, const void* data, size_t size, Deadline deadline, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      CONCORD_ASSIGN_OR_RETURN(short revents, PollOne(fd, POLLOUT, deadline));
      if (revents == 0) return TimeoutError("writing to " + what + " timed out");
      continue;
    }
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      return Status(Code::kPeerFailure, what + " closed the connection");
    }
    return ErrnoError("writing to " + what, errno);
  }
  return Status::Ok();
}

Status ReadFull(int fd, void* data, size_t size, Deadline deadline, const std::string& what) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::recv(fd, p, size, 0);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return Status(Code::kPeerFailure, what + " closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      CONCORD_ASSIGN_OR_RETURN(short revents, PollOne(fd, POLLIN, deadline));
      if (revents == 0) return TimeoutError("reading from " + what + " timed out");
      continue;
    }
    if (errno == ECONNRESET) return Status(Code::kPeerFailure, what + " reset the connection");
    return ErrnoError("reading from " + what, errno);
  }
  return Status::Ok();
}

void PutU8(std::string* out, uint8_t v) {
  out->push_back(static_cast<char>(v));
}

void PutU16(std::string* out, uint16_t v) {
  for (int i = 0; i < 2; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutBytes(std::string* out, const std::string& bytes) {
  PutU32(out, static_cast<uint32_t>(bytes.size()));
  out->append(bytes);
}

uint32_t LoadU32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

uint16_t LoadU16(const unsigned char* p) {
  return static_cast<uint16_t>(p[0] | static_cast<uint16_t>(p[1]) << 8);
}

bool Reader::Take(void* out, size_t n) {
  if (n > left_) {
    left_ = 0;
    p_ = nullptr;
    return false;
  }
  if (n > 0) std::memcpy(out, p_, n);
  p_ += n;
  left_ -= n;
  return true;
}

bool Reader::U8(uint8_t* v) {
  return Take(v, 1);
}

bool Reader::U32(uint32_t* v) {
  unsigned char b[4];
  if (!Take(b, 4)) return false;
  *v = LoadU32(b);
  return true;
}

bool Reader::U64(uint64_t* v) {
  unsigned char b[8];
  if (!Take(b, 8)) return false;
  *v = static_cast<uint64_t>(LoadU32(b)) | static_cast<uint64_t>(LoadU32(b + 4)) << 32;
  return true;
}

bool Reader::Bytes(std::string* v, size_t max_size) {
  uint32_t n = 0;
  if (!U32(&n)) return false;
  if (n > max_size || n > left_) {
    left_ = 0;
    return false;
  }
  v->assign(p_, n);
  p_ += n;
  left_ -= n;
  return true;
}

bool ParseInt64(const std::string& text, int64_t* value) {
  if (text.empty() || text.size() > 20) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size() ||
      std::isspace(static_cast<unsigned char>(text[0]))) {
    return false;
  }
  *value = static_cast<int64_t>(v);
  return true;
}

StatusOr<std::string> RandomHex(size_t n) {
  Fd fd(::open("/dev/urandom", O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoError("open /dev/urandom", errno);
  std::string raw(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd.get(), &raw[got], n - got);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r < 0 && errno == EINTR) {
      continue;
    } else {
      return ErrnoError("read /dev/urandom", r < 0 ? errno : EIO);
    }
  }
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * n);
  for (unsigned char c : raw) {
    hex.push_back(kHex[c >> 4]);
    hex.push_back(kHex[c & 15]);
  }
  return hex;
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  // Walk the longer length so that the time does not reveal the common prefix.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

}  // namespace net
}  // namespace concord
