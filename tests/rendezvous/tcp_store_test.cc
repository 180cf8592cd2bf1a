// TcpStoreServer / TcpStore: authentication, hostile bytes, server loss, parked requests.
#include "rendezvous/tcp_store.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/net.h"

namespace concord {
namespace {

using std::chrono::milliseconds;

Deadline Soon() {
  return Deadline::After(milliseconds(3000));
}

std::string Header(uint32_t magic, uint8_t version, uint8_t type, uint32_t length) {
  std::string h;
  net::PutU32(&h, magic);
  net::PutU8(&h, version);
  net::PutU8(&h, type);
  net::PutU16(&h, 0);
  net::PutU32(&h, length);
  return h;
}

constexpr uint32_t kMagic = 0x52545343;

// The status code of the next reply on fd, read by `deadline`; kInternal when none came whole.
Code ReplyCode(int fd, Deadline deadline) {
  unsigned char header[store_wire::kHeaderSize];
  if (!net::ReadFull(fd, header, sizeof(header), deadline, "server").ok()) return Code::kInternal;
  uint8_t type = 0;
  uint32_t length = 0;
  if (!store_wire::ParseHeader(header, &type, &length).ok()) return Code::kInternal;
  std::string body(length, '\0');
  if (!net::ReadFull(fd, &body[0], length, deadline, "server").ok()) return Code::kInternal;
  Status carried;
  std::string payload;
  if (!store_wire::ParseReply(body.data(), body.size(), &carried, &payload).ok()) {
    return Code::kInternal;
  }
  return carried.code();
}

class TcpStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = TcpStoreServer::Start("127.0.0.1", 0, "the-token");
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s.value());
  }

  std::unique_ptr<TcpStore> Client(const std::string& token = "the-token") {
    auto s = TcpStore::Connect("127.0.0.1", server_->port(), token, Soon());
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s.value()) : nullptr;
  }

  net::Fd Raw() {
    auto fd = net::Connect("127.0.0.1", server_->port(), Soon());
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    return std::move(fd.value());
  }

  // Reads until the server closes the connection (true) or a second passes (false).
  static bool ServerCloses(int fd) {
    const Deadline d = Deadline::After(milliseconds(2000));
    char buf[4096];
    for (;;) {
      Status s = net::ReadFull(fd, buf, 1, d, "server");
      if (s.code() == Code::kPeerFailure) return true;
      if (!s.ok()) return false;
    }
  }

  // The server still answers a well-behaved client.
  void ExpectServing() {
    auto c = Client();
    ASSERT_NE(c, nullptr);
    ASSERT_TRUE(c->Set("alive", "yes").ok());
    EXPECT_EQ(*c->Get("alive", Soon()), "yes");
  }

  std::unique_ptr<TcpStoreServer> server_;
};

TEST_F(TcpStoreTest, AddressAndPort) {
  EXPECT_GT(server_->port(), 0);
  EXPECT_EQ(server_->address(), "127.0.0.1:" + std::to_string(server_->port()));
}

TEST_F(TcpStoreTest, RightTokenWorks) {
  ExpectServing();
}

TEST_F(TcpStoreTest, WrongTokenIsRefused) {
  for (const std::string& token : {std::string("the-tokeN"), std::string("the-token2"),
                                   std::string("x"), std::string(100, 'a')}) {
    auto s = TcpStore::Connect("127.0.0.1", server_->port(), token, Soon());
    EXPECT_EQ(s.status().code(), Code::kAuthFailed) << s.status().ToString();
    EXPECT_NE(s.status().message().find("token"), std::string::npos) << s.status().message();
  }
  ExpectServing();
}

TEST_F(TcpStoreTest, RequestBeforeHelloIsRefused) {
  net::Fd fd = Raw();
  std::string body;
  net::PutBytes(&body, "k");
  net::PutBytes(&body, "v");
  const std::string frame = Header(kMagic, 1, /*SET*/ 2, body.size()) + body;
  ASSERT_TRUE(net::WriteAll(fd.get(), frame.data(), frame.size(), Soon(), "server").ok());
  unsigned char reply[13];
  ASSERT_TRUE(net::ReadFull(fd.get(), reply, sizeof(reply), Soon(), "server").ok());
  EXPECT_EQ(reply[12], static_cast<unsigned char>(Code::kAuthFailed));
  EXPECT_TRUE(ServerCloses(fd.get()));
  auto c = Client();
  EXPECT_EQ(c->Get("k", Deadline::After(milliseconds(50))).status().code(), Code::kTimeout);
}

TEST_F(TcpStoreTest, GarbageIsDisconnected) {
  net::Fd fd = Raw();
  const std::string garbage = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_TRUE(net::WriteAll(fd.get(), garbage.data(), garbage.size(), Soon(), "server").ok());
  EXPECT_TRUE(ServerCloses(fd.get()));
  ExpectServing();
}

TEST_F(TcpStoreTest, BadVersionAndUnknownTypeAreDisconnected) {
  {
    net::Fd fd = Raw();
    const std::string frame = Header(kMagic, 99, 1, 0);
    ASSERT_TRUE(net::WriteAll(fd.get(), frame.data(), frame.size(), Soon(), "server").ok());
    EXPECT_TRUE(ServerCloses(fd.get()));
  }
  {
    net::Fd fd = Raw();
    const std::string hello = Header(kMagic, 1, 1, 9) + "the-token";
    const std::string unknown = Header(kMagic, 1, 77, 0);
    const std::string both = hello + unknown;
    ASSERT_TRUE(net::WriteAll(fd.get(), both.data(), both.size(), Soon(), "server").ok());
    EXPECT_TRUE(ServerCloses(fd.get()));
  }
  ExpectServing();
}

TEST_F(TcpStoreTest, OversizedFrameIsDisconnected) {
  net::Fd fd = Raw();
  const std::string hello = Header(kMagic, 1, 1, 9) + "the-token";
  const std::string huge = Header(kMagic, 1, 2, kTcpStoreMaxFrame + 1);
  const std::string both = hello + huge;
  ASSERT_TRUE(net::WriteAll(fd.get(), both.data(), both.size(), Soon(), "server").ok());
  EXPECT_TRUE(ServerCloses(fd.get()));
  ExpectServing();
}

TEST_F(TcpStoreTest, MalformedBodyIsDisconnected) {
  net::Fd fd = Raw();
  const std::string hello = Header(kMagic, 1, 1, 9) + "the-token";
  // A SET whose key length claims more bytes than the body holds.
  std::string body;
  net::PutU32(&body, 1000);
  body += "short";
  const std::string bad = Header(kMagic, 1, 2, body.size()) + body;
  const std::string both = hello + bad;
  ASSERT_TRUE(net::WriteAll(fd.get(), both.data(), both.size(), Soon(), "server").ok());
  EXPECT_TRUE(ServerCloses(fd.get()));
  ExpectServing();
}

TEST_F(TcpStoreTest, TruncatedFrameThenCloseDoesNotHurtOthers) {
  auto waiter = Client();
  std::thread t([&] { EXPECT_EQ(*waiter->Get("later", Soon()), "v"); });
  {
    net::Fd fd = Raw();
    const std::string partial = Header(kMagic, 1, 1, 9) + "the-t";
    ASSERT_TRUE(net::WriteAll(fd.get(), partial.data(), partial.size(), Soon(), "server").ok());
  }  // closed mid-frame
  auto c = Client();
  ASSERT_TRUE(c->Set("later", "v").ok());
  t.join();
}

TEST_F(TcpStoreTest, ParkedGetsAreAnsweredWithoutPolling) {
  constexpr int kWaiters = 8;
  std::vector<std::unique_ptr<TcpStore>> clients;
  for (int i = 0; i < kWaiters; ++i) clients.push_back(Client());
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&, i] {
      if (i % 2 == 0) {
        EXPECT_EQ(*clients[i]->Get("go", Soon()), "now");
      } else {
        EXPECT_TRUE(clients[i]->Wait({"go", "go2"}, Soon()).ok());
      }
    });
  }
  // Lets the requests reach the server and park there first. The server shows no count of parked
  // requests to wait for, and a Set that came first would answer them too, so the result does not
  // depend on this order: it only makes the parked path the one usually exercised.
  std::this_thread::sleep_for(milliseconds(50));
  auto setter = Client();
  ASSERT_TRUE(setter->Set("go", "now").ok());
  ASSERT_TRUE(setter->Add("go2", 1).ok());
  for (auto& t : threads) t.join();
}

// GetFirst waiters park in the server, one request each for the whole wait (requests() counts
// them), and a Set of any of their keys answers them with its index and value. A GET_FIRST of no
// keys is refused, and the connection still serves.
TEST_F(TcpStoreTest, ParkedGetFirstIsAnsweredByAnyOfItsKeysInOneRequest) {
  constexpr int kWaiters = 4;
  std::vector<std::unique_ptr<TcpStore>> clients;
  for (int i = 0; i < kWaiters; ++i) clients.push_back(Client());
  const uint64_t before = server_->requests();
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&, i] {
      auto found = clients[i]->GetFirst({"first-a", "first-b"}, Soon());
      ASSERT_TRUE(found.ok()) << found.status().ToString();
      EXPECT_EQ(found->index, 1u);
      EXPECT_EQ(found->value, "b");
    });
  }
  // Lets the requests park first (as ParkedGetsAreAnsweredWithoutPolling: either order passes).
  std::this_thread::sleep_for(milliseconds(300));
  auto setter = Client();
  ASSERT_TRUE(setter->Set("first-b", "b").ok());
  for (auto& t : threads) t.join();
  EXPECT_EQ(server_->requests() - before, kWaiters + 1u);  // one per waiter, and the Set

  net::Fd fd = Raw();
  std::string body;
  net::PutU64(&body, 0);
  net::PutU32(&body, 0);
  const std::string frames =
      Header(kMagic, 1, 1, 9) + "the-token" + Header(kMagic, 1, 6, body.size()) + body;
  ASSERT_TRUE(net::WriteAll(fd.get(), frames.data(), frames.size(), Soon(), "server").ok());
  EXPECT_EQ(ReplyCode(fd.get(), Soon()), Code::kOk);  // the HELLO
  EXPECT_EQ(ReplyCode(fd.get(), Soon()), Code::kInvalidArgument);
  ExpectServing();
}

// A server from before GET_FIRST refuses it as an unknown request type (and closes the
// connection): the client's error says that the server is older than the ranks, and how to fix it.
TEST(TcpStoreClientTest, GetFirstAgainstAServerWithoutItSaysSo) {
  int port = 0;
  auto listener = net::Listen("127.0.0.1", 0, &port);
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  std::thread old_server([&] {
    // Answers the HELLO, then the next request as a server of protocol version 1 without
    // GET_FIRST answers a type it does not know.
    net::Fd fd;
    for (const Deadline d = Soon(); !fd.valid() && !d.passed();) {
      auto accepted = net::Accept(listener->get());
      ASSERT_TRUE(accepted.ok()) << accepted.status().ToString();
      if (!accepted->valid()) std::this_thread::sleep_for(milliseconds(5));
      fd = std::move(*accepted);
    }
    ASSERT_TRUE(fd.valid());
    for (const char* answer : {"", "unknown request type 6"}) {
      unsigned char header[store_wire::kHeaderSize];
      ASSERT_TRUE(net::ReadFull(fd.get(), header, sizeof(header), Soon(), "client").ok());
      uint8_t type = 0;
      uint32_t length = 0;
      ASSERT_TRUE(store_wire::ParseHeader(header, &type, &length).ok());
      std::string body(length, '\0');
      ASSERT_TRUE(net::ReadFull(fd.get(), &body[0], length, Soon(), "client").ok());
      const Code code = *answer == '\0' ? Code::kOk : Code::kProtocolError;
      const std::string reply =
          store_wire::Frame(store_wire::kReply, store_wire::EncodeReply(code, answer));
      ASSERT_TRUE(net::WriteAll(fd.get(), reply.data(), reply.size(), Soon(), "client").ok());
    }
  });
  auto client = TcpStore::Connect("127.0.0.1", port, "the-token", Soon());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto found = (*client)->GetFirst({"a", "b"}, Soon());
  old_server.join();
  EXPECT_EQ(found.status().code(), Code::kProtocolError);
  EXPECT_NE(found.status().message().find("unknown request type 6"), std::string::npos)
      << found.status().ToString();
  EXPECT_NE(found.status().message().find("older Concord, without GET_FIRST"), std::string::npos)
      << found.status().ToString();
}

// The server's books of parked requests (by key, by deadline): 300 connections parked on one key
// are all answered by its SET; a parked connection that leaves is forgotten (the SET of its key
// later finds nobody to answer, and the server still serves); parked deadlines expire in their
// order, whatever the order they came in, while a request without a deadline stays parked.
TEST_F(TcpStoreTest, ParkedRequestsAreAnsweredByKeyAndExpireByDeadline) {
  const auto park = [&](const std::string& key, uint64_t timeout_ms) {
    net::Fd fd = Raw();
    store_wire::Request get;
    get.type = store_wire::kGet;
    get.key = key;
    get.timeout_ms = timeout_ms;
    const std::string frames = store_wire::Frame(store_wire::kHello, "the-token") +
                               store_wire::Frame(store_wire::kGet, store_wire::EncodeRequest(get));
    EXPECT_TRUE(net::WriteAll(fd.get(), frames.data(), frames.size(), Soon(), "server").ok());
    return fd;
  };

  std::vector<net::Fd> many;
  for (int i = 0; i < 300; ++i) many.push_back(park("many", 60000));
  { net::Fd leaving = park("left", 60000); }
  net::Fd late = park("never-late", 600);
  net::Fd early = park("never-early", 200);
  net::Fd forever = park("never", store_wire::kNoTimeout);
  for (net::Fd& fd : many) ASSERT_EQ(ReplyCode(fd.get(), Soon()), Code::kOk);  // the HELLOs
  for (net::Fd* fd : {&late, &early, &forever}) ASSERT_EQ(ReplyCode(fd->get(), Soon()), Code::kOk);
  std::this_thread::sleep_for(milliseconds(50));  // lets them park (either order passes)
  auto setter = Client();
  ASSERT_TRUE(setter->Set("many", "v").ok());
  ASSERT_TRUE(setter->Set("left", "v").ok());
  for (net::Fd& fd : many) EXPECT_EQ(ReplyCode(fd.get(), Soon()), Code::kOk);
  EXPECT_EQ(ReplyCode(early.get(), Soon()), Code::kTimeout);
  // The later deadline (400 ms after) has not passed yet: its reply is not there.
  EXPECT_EQ(ReplyCode(late.get(), Deadline::After(milliseconds(0))), Code::kInternal);
  EXPECT_EQ(ReplyCode(late.get(), Soon()), Code::kTimeout);
  EXPECT_EQ(ReplyCode(forever.get(), Deadline::After(milliseconds(200))), Code::kInternal)
      << "a request without a deadline was answered";
  ExpectServing();
}

// One client, two threads: a Get that waits in the server for a key does not hold up the other
// thread's calls (each call has a connection of its own; an idle one is reused).
TEST_F(TcpStoreTest, AWaitingGetDoesNotDelayOtherThreads) {
  auto c = Client();
  std::thread waiter(
      [&] { EXPECT_EQ(*c->Get("late", Deadline::After(milliseconds(10000))), "v"); });
  std::this_thread::sleep_for(milliseconds(50));  // lets the Get park first (either order passes)
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(c->Set("k" + std::to_string(i), "x").ok());
    EXPECT_EQ(*c->Get("k" + std::to_string(i), Soon()), "x");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(2000));
  EXPECT_EQ(c->connections(), 2);  // the waiting Get's and one reused by the ten calls
  ASSERT_TRUE(c->Set("late", "v").ok());
  waiter.join();
  EXPECT_EQ(c->connections(), 2);
}

TEST_F(TcpStoreTest, ServerGoneGivesAnError) {
  auto c = Client();
  std::thread t([&] {
    auto v = c->Get("never", Deadline::After(milliseconds(5000)));
    EXPECT_TRUE(v.status().code() == Code::kPeerFailure || v.status().code() == Code::kSystemError)
        << v.status().ToString();
  });
  // Lets the Get park in the server first; a server gone before it arrived fails it with an
  // accepted code too, so the result does not depend on this order.
  std::this_thread::sleep_for(milliseconds(100));
  const int port = server_->port();
  server_.reset();
  t.join();
  // The connection is now unusable, and a new one is refused.
  EXPECT_FALSE(c->Set("a", "b").ok());
  auto again = TcpStore::Connect("127.0.0.1", port, "the-token", Soon());
  EXPECT_EQ(again.status().code(), Code::kSystemError) << again.status().ToString();
}

TEST_F(TcpStoreTest, SilentUnauthenticatedClientDoesNotBlockOthers) {
  net::Fd silent = Raw();  // connects and says nothing
  ExpectServing();
}

// Before it has presented the token a client may send one HELLO no longer than a token, and the
// server refuses anything else from its header alone, without waiting for (and buffering) a body.
TEST_F(TcpStoreTest, UnauthenticatedLargeFramesAreRefusedAtTheirHeader) {
  {
    net::Fd fd = Raw();
    const std::string hello = Header(kMagic, 1, /*HELLO*/ 1, kTcpStoreMaxFrame);
    const std::string some_body(64 << 10, 'x');
    ASSERT_TRUE(net::WriteAll(fd.get(), hello.data(), hello.size(), Soon(), "server").ok());
    // The server may close while this is in flight: only its closing matters.
    (void)net::WriteAll(fd.get(), some_body.data(), some_body.size(), Soon(), "server");
    EXPECT_TRUE(ServerCloses(fd.get()));
  }
  {
    net::Fd fd = Raw();
    const std::string set = Header(kMagic, 1, /*SET*/ 2, 1 << 20);
    ASSERT_TRUE(net::WriteAll(fd.get(), set.data(), set.size(), Soon(), "server").ok());
    EXPECT_TRUE(ServerCloses(fd.get()));
  }
  ExpectServing();
}

// Silent connections are capped: when they fill the cap, a new client waits until the oldest has
// had its grace period, then the oldest is dropped and the new client is served.
TEST_F(TcpStoreTest, UnauthenticatedConnectionsAreCapped) {
  std::vector<net::Fd> silent;
  for (size_t i = 0; i < TcpStoreServer::kMaxUnauthenticated; ++i) silent.push_back(Raw());
  ExpectServing();
  EXPECT_TRUE(ServerCloses(silent.front().get()));
  char byte;
  EXPECT_EQ(::recv(silent.back().get(), &byte, 1, MSG_DONTWAIT), -1) << "the newest was dropped";
  EXPECT_EQ(errno, EAGAIN);
}

// CPU time this process has used.
std::chrono::milliseconds ProcessCpuTime() {
  timespec t;
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return milliseconds(t.tv_sec * 1000 + t.tv_nsec / 1000000);
}

// Exit codes of the child in AcceptResumesAfterRunningOutOfDescriptors.
enum DescriptorChildExit {
  kChildOk = 0,
  kChildSetupFailed = 1,
  kChildSpun = 2,
  kChildNotServed = 3
};

// In a forked child (RLIMIT_NOFILE is per process): with no descriptor left, a connection waits in
// the listen queue while the server neither spins nor gives up; once descriptors are free again it
// is accepted and served.
DescriptorChildExit RunOutOfDescriptors() {
  auto server = TcpStoreServer::Start("127.0.0.1", 0, "the-token");
  if (!server.ok()) return kChildSetupFailed;
  // The client's socket exists before the limit; connect() takes no new descriptor.
  net::Fd client(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  rlimit saved;
  if (!client.valid() || ::getrlimit(RLIMIT_NOFILE, &saved) != 0) return kChildSetupFailed;
  const int lowest_free = ::dup(0);
  if (lowest_free < 0) return kChildSetupFailed;
  ::close(lowest_free);
  rlimit none_left = saved;
  none_left.rlim_cur = static_cast<rlim_t>(lowest_free);
  if (::setrlimit(RLIMIT_NOFILE, &none_left) != 0) return kChildSetupFailed;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>((*server)->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(client.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return kChildSetupFailed;
  }
  const auto cpu_before = ProcessCpuTime();
  std::this_thread::sleep_for(milliseconds(1000));
  // A server polling a listener it cannot accept from burns a whole core; one that waits, little.
  if (ProcessCpuTime() - cpu_before > milliseconds(200)) return kChildSpun;
  if (::setrlimit(RLIMIT_NOFILE, &saved) != 0) return kChildSetupFailed;
  if (!net::SetNonBlocking(client.get()).ok()) return kChildSetupFailed;
  const std::string hello = Header(kMagic, 1, /*HELLO*/ 1, 9) + "the-token";
  unsigned char reply[13];
  if (!net::WriteAll(client.get(), hello.data(), hello.size(), Soon(), "server").ok() ||
      !net::ReadFull(client.get(), reply, sizeof(reply), Soon(), "server").ok() ||
      reply[12] != static_cast<unsigned char>(Code::kOk)) {
    return kChildNotServed;
  }
  return kChildOk;
}

TEST(TcpStoreServerTest, AcceptResumesAfterRunningOutOfDescriptors) {
  const pid_t pid = ::fork();  // this process runs no other thread now
  ASSERT_GE(pid, 0);
  if (pid == 0) ::_exit(RunOutOfDescriptors());
  int status = 0;
  const Deadline deadline = Deadline::After(milliseconds(15000));
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (deadline.passed()) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      FAIL() << "the child did not finish within 15 s";
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), kChildOk)
      << "1: setup failed, 2: the server spun, 3: the waiting connection was not served";
}

TEST(TcpStoreServerTest, RejectsEmptyToken) {
  EXPECT_EQ(TcpStoreServer::Start("127.0.0.1", 0, "").status().code(), Code::kInvalidArgument);
}

// A token fits in the one HELLO an unauthenticated client may send.
TEST(TcpStoreServerTest, TokensAreLimitedInLength) {
  const std::string longest(kTcpStoreMaxToken, 't');
  const std::string too_long(kTcpStoreMaxToken + 1, 't');
  EXPECT_EQ(TcpStoreServer::Start("127.0.0.1", 0, too_long).status().code(),
            Code::kInvalidArgument);
  auto server = TcpStoreServer::Start("127.0.0.1", 0, longest);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto store = TcpStore::Connect("127.0.0.1", (*server)->port(), longest, Soon());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_TRUE((*store)->Set("k", "v").ok());
  EXPECT_EQ(TcpStore::Connect("127.0.0.1", (*server)->port(), too_long, Soon()).status().code(),
            Code::kInvalidArgument);
}

TEST(NetTest, ConstantTimeEquals) {
  EXPECT_TRUE(net::ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(net::ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(net::ConstantTimeEquals("abc", "abcd"));
  EXPECT_FALSE(net::ConstantTimeEquals("", "a"));
  EXPECT_TRUE(net::ConstantTimeEquals("", ""));
}

TEST(NetTest, SplitHostPort) {
  std::string host;
  int port = 0;
  ASSERT_TRUE(net::SplitHostPort("h:12", &host, &port).ok());
  EXPECT_EQ(host, "h");
  EXPECT_EQ(port, 12);
  ASSERT_TRUE(net::SplitHostPort("[::1]:80", &host, &port).ok());
  EXPECT_EQ(host, "::1");
  for (const char* bad : {"h", "h:", ":1", "h:0", "h:65536", "h:1x", "[::1]80", "h:-1"}) {
    EXPECT_FALSE(net::SplitHostPort(bad, &host, &port).ok()) << bad;
  }
}

}  // namespace
}  // namespace concord
