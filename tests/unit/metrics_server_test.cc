#include "core/metrics_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"

namespace concord {
namespace {

using std::chrono::milliseconds;

// A blocking client socket connected to 127.0.0.1:port, reads giving up after 5 s.
net::Fd Connect(int port) {
  net::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_TRUE(fd.valid());
  timeval tv{5, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return net::Fd();
  return fd;
}

// Everything the server sends until it closes ("" when the connection failed).
std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

// Sends `request` as it is and returns the whole response.
std::string Exchange(int port, const std::string& request) {
  net::Fd fd = Connect(port);
  if (!fd.valid()) return "";
  EXPECT_EQ(::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  return ReadAll(fd.get());
}

// True when the server closed fd within `limit` without sending anything.
bool ClosedWithoutAnswer(int fd, milliseconds limit) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(limit.count())) != 1) return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) == 0;
}

// True when fd is open with nothing to read: the server neither answered nor closed it.
bool StillOpen(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

std::string StatusLine(const std::string& response) {
  return response.substr(0, response.find("\r\n"));
}

std::string Body(const std::string& response) {
  const size_t end = response.find("\r\n\r\n");
  return end == std::string::npos ? "<no head end>" : response.substr(end + 4);
}

std::unique_ptr<MetricsServer> StartOrDie(std::function<std::string()> render,
                                          milliseconds deadline = milliseconds(2000),
                                          std::function<void(const std::string&)> warn = nullptr) {
  auto server = MetricsServer::Start("127.0.0.1", 0, std::move(render), std::move(warn), deadline);
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  return server.ok() ? std::move(server.value()) : nullptr;
}

TEST(MetricsServerTest, ServesTheRenderedTextOnMetricsAndRoot) {
  auto server = StartOrDie([] { return std::string("concord_ops_total 7\n"); });
  ASSERT_NE(server, nullptr);
  EXPECT_GT(server->port(), 0);
  EXPECT_EQ(server->address(), "127.0.0.1:" + std::to_string(server->port()));
  for (const char* target : {"/metrics", "/", "/metrics?name=x"}) {
    const std::string r =
        Exchange(server->port(), std::string("GET ") + target + " HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_EQ(StatusLine(r), "HTTP/1.1 200 OK") << target;
    EXPECT_NE(r.find("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
              std::string::npos);
    EXPECT_NE(r.find("\r\nContent-Length: 20\r\n"), std::string::npos) << r;
    EXPECT_EQ(Body(r), "concord_ops_total 7\n");
  }
  // An HTTP/1.0 client, bare line endings.
  EXPECT_EQ(Body(Exchange(server->port(), "GET /metrics HTTP/1.0\n\n")), "concord_ops_total 7\n");
}

TEST(MetricsServerTest, RendersForEveryRequest) {
  std::atomic<int> calls{0};
  auto server = StartOrDie([&] { return "calls " + std::to_string(++calls) + "\n"; });
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Body(Exchange(server->port(), "GET /metrics HTTP/1.1\r\n\r\n")), "calls 1\n");
  EXPECT_EQ(Body(Exchange(server->port(), "GET /metrics HTTP/1.1\r\n\r\n")), "calls 2\n");
}

TEST(MetricsServerTest, HeadHasTheHeadersWithoutTheBody) {
  auto server = StartOrDie([] { return std::string("abc\n"); });
  ASSERT_NE(server, nullptr);
  const std::string r = Exchange(server->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(StatusLine(r), "HTTP/1.1 200 OK");
  EXPECT_NE(r.find("\r\nContent-Length: 4\r\n"), std::string::npos) << r;
  EXPECT_EQ(Body(r), "");
}

TEST(MetricsServerTest, AnswersWhatItDoesNotServeWithAnError) {
  std::atomic<int> calls{0};
  auto server = StartOrDie([&] {
    ++calls;
    return std::string("x\n");
  });
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  EXPECT_EQ(StatusLine(Exchange(port, "GET /other HTTP/1.1\r\n\r\n")), "HTTP/1.1 404 Not Found");
  const std::string post = Exchange(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(StatusLine(post), "HTTP/1.1 405 Method Not Allowed");
  EXPECT_NE(post.find("\r\nAllow: GET, HEAD\r\n"), std::string::npos);
  for (const char* bad : {"garbage\r\n\r\n", "GET /metrics\r\n\r\n",
                          "GET  /metrics HTTP/1.1\r\n\r\n", "GET /metrics SPDY/3\r\n\r\n"}) {
    EXPECT_EQ(StatusLine(Exchange(port, bad)), "HTTP/1.1 400 Bad Request") << bad;
  }
  const std::string huge = "GET /metrics HTTP/1.1\r\nX: " + std::string(9000, 'a') + "\r\n\r\n";
  EXPECT_EQ(StatusLine(Exchange(port, huge)), "HTTP/1.1 431 Request Header Fields Too Large");
  EXPECT_EQ(calls.load(), 0);
  // Still serving.
  EXPECT_EQ(Body(Exchange(port, "GET /metrics HTTP/1.1\r\n\r\n")), "x\n");
}

TEST(MetricsServerTest, TakesABareLineFeedBeforeTheEmptyLineInAnyMix) {
  auto server = StartOrDie([] { return std::string("ok\n"); }, milliseconds(5000));
  ASSERT_NE(server, nullptr);
  for (const char* request :
       {"GET /metrics HTTP/1.1\n\r\n", "GET /metrics HTTP/1.1\r\nHost: x\n\r\n",
        "GET /metrics HTTP/1.1\nHost: x\r\n\n"}) {
    const auto t0 = Clock::now();
    EXPECT_EQ(Body(Exchange(server->port(), request)), "ok\n") << request;
    EXPECT_LT(Clock::now() - t0, milliseconds(1000)) << request;
  }
}

// RFC 9112 2.2: empty lines before the request line are ignored (before: 400 Bad Request), but
// count towards the head's 8 KiB, so a client that sends nothing else is still refused.
TEST(MetricsServerTest, IgnoresEmptyLinesBeforeTheRequestLine) {
  std::atomic<int> calls{0};
  auto server = StartOrDie(
      [&] {
        ++calls;
        return std::string("ok\n");
      },
      milliseconds(5000));
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  for (const char* request : {"\r\nGET /metrics HTTP/1.1\r\n\r\n", "\nGET /metrics HTTP/1.1\n\n",
                              "\r\n\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"}) {
    const auto t0 = Clock::now();
    const std::string r = Exchange(port, request);
    EXPECT_EQ(StatusLine(r), "HTTP/1.1 200 OK") << request;
    EXPECT_EQ(Body(r), "ok\n") << request;
    EXPECT_LT(Clock::now() - t0, milliseconds(1000)) << request;
  }
  // Empty lines alone are no request yet: no answer until the request line follows.
  net::Fd fd = Connect(port);
  ASSERT_TRUE(fd.valid());
  ASSERT_EQ(::send(fd.get(), "\r\n\r\n", 4, MSG_NOSIGNAL), 4);
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_TRUE(StillOpen(fd.get()));
  const std::string request = "GET /metrics HTTP/1.1\r\n\r\n";
  ASSERT_EQ(::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  EXPECT_EQ(Body(ReadAll(fd.get())), "ok\n");
  // Endless empty lines: refused once they pass the head's limit.
  std::string blank;
  while (blank.size() <= MetricsServer::kMaxRequestHead) blank += "\r\n";
  EXPECT_EQ(StatusLine(Exchange(port, blank)), "HTTP/1.1 431 Request Header Fields Too Large");
  EXPECT_EQ(StatusLine(Exchange(port, blank + request)),
            "HTTP/1.1 431 Request Header Fields Too Large");
  EXPECT_EQ(calls.load(), 4);
}

TEST(MetricsServerTest, BytesAfterTheRequestHeadDoNotCutTheResponseShort) {
  // A client that sends more than its request head (a body, a pipelined request, a stray CRLF)
  // while a response larger than the socket buffers is on its way: closing with those bytes unread
  // would make the kernel reset the connection and drop the response's tail.
  const std::string big(16 << 20, 'x');
  auto server = StartOrDie([&] { return big; }, milliseconds(5000));
  ASSERT_NE(server, nullptr);
  for (const std::string& extra : {std::string("\r\n"), std::string(60000, 'y')}) {
    net::Fd fd = Connect(server->port());
    ASSERT_TRUE(fd.valid());
    const std::string request = "GET /metrics HTTP/1.1\r\n\r\n";
    ASSERT_EQ(::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(request.size()));
    std::this_thread::sleep_for(milliseconds(100));  // the server has read the head and sends
    std::thread more([&] {
      // Blocks while the server reads nothing; the server's close ends it (or the reads below).
      (void)::send(fd.get(), extra.data(), extra.size(), MSG_NOSIGNAL);
    });
    std::this_thread::sleep_for(milliseconds(100));
    const std::string response = ReadAll(fd.get());
    more.join();
    EXPECT_EQ(StatusLine(response), "HTTP/1.1 200 OK");
    EXPECT_EQ(Body(response).size(), big.size()) << extra.size() << " bytes after the head";
  }
}

TEST(MetricsServerTest, AcceptsAbsoluteFormTargets) {
  auto server = StartOrDie([] { return std::string("ok\n"); });
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  const std::string authority = "127.0.0.1:" + std::to_string(port);
  const std::vector<std::string> targets = {"http://" + authority + "/metrics",
                                            "http://" + authority + "/", "http://" + authority,
                                            "http://x/metrics?name=y"};
  for (const std::string& target : targets) {
    const std::string r = Exchange(port, "GET " + target + " HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_EQ(StatusLine(r), "HTTP/1.1 200 OK") << target;
    EXPECT_EQ(Body(r), "ok\n") << target;
  }
  EXPECT_EQ(StatusLine(Exchange(port, "GET http://" + authority + "/other HTTP/1.1\r\n\r\n")),
            "HTTP/1.1 404 Not Found");
}

TEST(MetricsServerTest, IdleClientsDoNotDelayAScrape) {
  auto server = StartOrDie([] { return std::string("ok\n"); }, milliseconds(2000));
  ASSERT_NE(server, nullptr);
  std::vector<net::Fd> idle;
  for (int i = 0; i < 4; ++i) {
    idle.push_back(Connect(server->port()));
    ASSERT_TRUE(idle.back().valid());
  }
  ASSERT_EQ(::send(idle[0].get(), "GET /met", 8, MSG_NOSIGNAL), 8);  // one of them half a request
  const auto t0 = Clock::now();
  EXPECT_EQ(Body(Exchange(server->port(), "GET /metrics HTTP/1.1\r\n\r\n")), "ok\n");
  EXPECT_LT(Clock::now() - t0, milliseconds(1000));
  for (const net::Fd& fd : idle) EXPECT_TRUE(StillOpen(fd.get()));
}

TEST(MetricsServerTest, AClientWithoutAWholeRequestIsClosedAtItsDeadline) {
  auto server = StartOrDie([] { return std::string("ok\n"); }, milliseconds(300));
  ASSERT_NE(server, nullptr);
  const auto t0 = Clock::now();
  net::Fd idle = Connect(server->port());
  ASSERT_TRUE(idle.valid());
  net::Fd partial = Connect(server->port());
  ASSERT_TRUE(partial.valid());
  ASSERT_EQ(::send(partial.get(), "GET /met", 8, MSG_NOSIGNAL), 8);
  EXPECT_TRUE(ClosedWithoutAnswer(idle.get(), milliseconds(2000)));
  EXPECT_TRUE(ClosedWithoutAnswer(partial.get(), milliseconds(2000)));
  const auto elapsed = Clock::now() - t0;
  EXPECT_GE(elapsed, milliseconds(250));
  EXPECT_LT(elapsed, milliseconds(1500));
}

TEST(MetricsServerTest, ASlowReaderIsAbandonedAtItsDeadlineWithoutDelayingOthers) {
  const std::string big(16 << 20, 'x');  // more than the loopback socket buffers hold
  const milliseconds deadline(1500);
  auto server = StartOrDie([&] { return big; }, deadline);
  ASSERT_NE(server, nullptr);
  net::Fd slow = Connect(server->port());
  ASSERT_TRUE(slow.valid());
  const std::string request = "GET /metrics HTTP/1.1\r\n\r\n";
  ASSERT_EQ(::send(slow.get(), request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(milliseconds(50));  // the server now waits for slow to take more
  EXPECT_EQ(Body(Exchange(server->port(), request)).size(), big.size());
  EXPECT_LT(Clock::now() - t0, milliseconds(1000));
  std::this_thread::sleep_until(t0 + deadline + milliseconds(300));  // past slow's deadline
  const std::string cut = ReadAll(slow.get());
  EXPECT_EQ(StatusLine(cut), "HTTP/1.1 200 OK");
  EXPECT_LT(cut.size(), big.size());
}

TEST(MetricsServerTest, WhenFullTheOldestWaitingConnectionMakesRoom) {
  auto server = StartOrDie([] { return std::string("ok\n"); }, milliseconds(10000));
  ASSERT_NE(server, nullptr);
  std::vector<net::Fd> idle;
  for (size_t i = 0; i < MetricsServer::kMaxConnections; ++i) {
    idle.push_back(Connect(server->port()));
    ASSERT_TRUE(idle.back().valid()) << i;
  }
  const auto t0 = Clock::now();
  EXPECT_EQ(Body(Exchange(server->port(), "GET /metrics HTTP/1.1\r\n\r\n")), "ok\n");
  EXPECT_LT(Clock::now() - t0, milliseconds(1000));
  // The scrape's connection closed the oldest idle one; the others are still open.
  EXPECT_TRUE(ClosedWithoutAnswer(idle[0].get(), milliseconds(1000)));
  for (size_t i = 1; i < idle.size(); ++i) EXPECT_TRUE(StillOpen(idle[i].get())) << i;
}

TEST(MetricsServerTest, DestructionIsPromptWhileAClientIsConnected) {
  auto server = StartOrDie([] { return std::string("ok\n"); }, milliseconds(10000));
  ASSERT_NE(server, nullptr);
  net::Fd idle = Connect(server->port());
  ASSERT_TRUE(idle.valid());
  std::this_thread::sleep_for(milliseconds(50));  // the server now waits for its request
  const auto t0 = Clock::now();
  server.reset();
  EXPECT_LT(Clock::now() - t0, milliseconds(1000));
  EXPECT_EQ(ReadAll(idle.get()), "");
}

TEST(MetricsServerTest, APortInUseIsAnErrorNamingIt) {
  auto first = StartOrDie([] { return std::string(); });
  ASSERT_NE(first, nullptr);
  auto second = MetricsServer::Start(
      "127.0.0.1", first->port(), [] { return std::string(); }, nullptr);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Code::kUnavailable);
  EXPECT_EQ(
      second.status().message(),
      "cannot listen on 127.0.0.1:" + std::to_string(first->port()) + ": Address already in use");
}

TEST(MetricsServerTest, ABadAddressOrPortIsAnInvalidArgument) {
  auto render = [] { return std::string(); };
  auto empty = MetricsServer::Start("[]", 0, render, nullptr);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), Code::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("'[]'"), std::string::npos);
  auto port = MetricsServer::Start("127.0.0.1", 65536, render, nullptr);
  ASSERT_FALSE(port.ok());
  EXPECT_EQ(port.status().code(), Code::kInvalidArgument);
  EXPECT_NE(port.status().message().find("65536"), std::string::npos);
}

TEST(MetricsServerTest, BindsAHostNameAndBracketedLiterals) {
  auto render = [] { return std::string("ok\n"); };
  auto named = MetricsServer::Start("localhost", 0, render, nullptr);
  ASSERT_TRUE(named.ok()) << named.status().ToString();
  EXPECT_EQ(named.value()->address().rfind("localhost:", 0), 0u);
  auto bracketed = MetricsServer::Start("[127.0.0.1]", 0, render, nullptr);
  ASSERT_TRUE(bracketed.ok()) << bracketed.status().ToString();
  EXPECT_EQ(Body(Exchange(bracketed.value()->port(), "GET / HTTP/1.1\r\n\r\n")), "ok\n");
}

// Finds the server's listening socket among this process's descriptors.
int ListeningFd(int port) {
  for (int fd = 0; fd < 1024; ++fd) {
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_in addr{};
    socklen_t addr_len = sizeof(addr);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &addr_len) == 0 &&
        addr.sin_family == AF_INET && ntohs(addr.sin_port) == port) {
      return fd;
    }
  }
  return -1;
}

TEST(MetricsServerTest, ASocketFailureWarnsOnceAndTurnsTheEndpointOff) {
  Mutex mu;
  std::vector<std::string> warnings;
  auto server = StartOrDie([] { return std::string("ok\n"); }, milliseconds(2000),
                           [&](const std::string& w) {
                             MutexLock lock(mu);
                             warnings.push_back(w);
                           });
  ASSERT_NE(server, nullptr);
  const int fd = ListeningFd(server->port());
  ASSERT_GE(fd, 0);
  // A listening socket shut down: poll() reports it, accept() fails with EINVAL.
  ASSERT_EQ(::shutdown(fd, SHUT_RDWR), 0);
  const auto until = Clock::now() + milliseconds(2000);
  for (;;) {
    {
      MutexLock lock(mu);
      if (!warnings.empty() || Clock::now() > until) break;
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  std::this_thread::sleep_for(milliseconds(50));
  MutexLock lock(mu);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "metrics endpoint 127.0.0.1:" + std::to_string(server->port()) +
                             ": accept: Invalid argument; the metrics endpoint is off");
}

}  // namespace
}  // namespace concord
