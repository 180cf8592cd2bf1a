// A TCP port on 127.0.0.1 that the test holds, so that whatever else tries to listen on it (a
// rank's CONCORD_METRICS_PORT, say) finds it in use.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace concord {
namespace harness {

// Contract: the constructor listens on 127.0.0.1 on a port the kernel picks; port() is that port,
// or 0 if that failed (check it with ASSERT_NE(taken.port(), 0)). Forked children inherit the
// socket, so the port stays taken in them too. The destructor closes it. Not copyable.
class TakenPort {
 public:
  TakenPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(fd_, 1) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return;
    }
    port_ = ntohs(addr.sin_port);
  }
  ~TakenPort() {
    if (fd_ >= 0) ::close(fd_);
  }
  TakenPort(const TakenPort&) = delete;
  TakenPort& operator=(const TakenPort&) = delete;

  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace harness
}  // namespace concord
