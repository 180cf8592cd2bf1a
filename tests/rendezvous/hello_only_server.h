// A fake TCP store server for tests of request timeouts: it accepts every connection's HELLO and
// then answers nothing more. Single-threaded: the test calls Serve() now and then.
#pragma once

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <string>
#include <vector>

#include "rendezvous/net.h"
#include "rendezvous/tcp_store_wire.h"

namespace concord::harness {

// Contract: listens on 127.0.0.1 (an ephemeral port); Serve() accepts what is pending, answers
// each complete HELLO with OK, reads and ignores everything else, and returns without blocking.
// A Set or Add sent to it waits until the client's own timeout. Not thread-safe.
class HelloOnlyServer {
 public:
  HelloOnlyServer() {
    int bound = 0;
    auto fd = net::Listen("127.0.0.1", 0, &bound);
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    if (fd.ok()) listener_ = std::move(*fd);
    port_ = bound;
  }
  int port() const { return port_; }

  void Serve() {
    for (;;) {
      auto fd = net::Accept(listener_.get());
      if (!fd.ok() || !fd->valid()) break;
      connections_.push_back({std::move(*fd), "", false});
    }
    for (Connection& c : connections_) {
      char buf[4096];
      ssize_t n;
      while ((n = ::recv(c.fd.get(), buf, sizeof(buf), 0)) > 0) c.in.append(buf, n);
      if (c.hello_answered || c.in.size() < store_wire::kHeaderSize) continue;
      uint8_t type = 0;
      uint32_t length = 0;
      if (!store_wire::ParseHeader(reinterpret_cast<const unsigned char*>(c.in.data()), &type,
                                   &length)
               .ok() ||
          c.in.size() < store_wire::kHeaderSize + length) {
        continue;
      }
      const std::string ok =
          store_wire::Frame(store_wire::kReply, store_wire::EncodeReply(Code::kOk, ""));
      EXPECT_TRUE(net::WriteAll(c.fd.get(), ok.data(), ok.size(),
                                Deadline::After(std::chrono::milliseconds(1000)), "client")
                      .ok());
      c.hello_answered = true;
    }
  }

 private:
  struct Connection {
    net::Fd fd;
    std::string in;
    bool hello_answered;
  };
  net::Fd listener_;
  int port_ = 0;
  std::vector<Connection> connections_;
};

}  // namespace concord::harness
