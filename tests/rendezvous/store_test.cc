// Store contract tests, run against every implementation: HashStore, FileStore, TcpStore (over a
// TcpStoreServer on 127.0.0.1), plus the URL factory.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/file_store.h"
#include "rendezvous/hash_store.h"
#include "rendezvous/store_factory.h"
#include "rendezvous/tcp_store.h"
#include "tests/rendezvous/hello_only_server.h"

namespace concord {
namespace {

using std::chrono::milliseconds;

std::string MakeTempDir() {
  std::string tmpl = "/tmp/concord_store_test.XXXXXX";
  char* dir = ::mkdtemp(&tmpl[0]);
  EXPECT_NE(dir, nullptr);
  return tmpl;
}

// Builds stores of one kind; every store from one fixture shares the same backing state.
class StoreFixture {
 public:
  virtual ~StoreFixture() = default;
  virtual std::unique_ptr<Store> Open() = 0;
};

class HashFixture : public StoreFixture {
 public:
  // Each "open" returns a view that forwards to the one shared HashStore.
  class View : public Store {
   public:
    explicit View(HashStore* s) : s_(s) {}
    Status Set(const std::string& k, const std::string& v) override { return s_->Set(k, v); }
    StatusOr<std::string> Get(const std::string& k, Deadline d) override { return s_->Get(k, d); }
    Status Wait(const std::vector<std::string>& k, Deadline d) override { return s_->Wait(k, d); }
    StatusOr<FoundKey> GetFirst(const std::vector<std::string>& k, Deadline d) override {
      return s_->GetFirst(k, d);
    }
    StatusOr<int64_t> Add(const std::string& k, int64_t d) override { return s_->Add(k, d); }

   private:
    HashStore* s_;
  };
  std::unique_ptr<Store> Open() override { return std::make_unique<View>(&store_); }

 private:
  HashStore store_;
};

class FileFixture : public StoreFixture {
 public:
  FileFixture() : dir_(MakeTempDir()) {}
  ~FileFixture() override {
    const std::string cmd = "rm -rf '" + dir_ + "'";
    EXPECT_EQ(::system(cmd.c_str()), 0);
  }
  std::unique_ptr<Store> Open() override {
    auto s = FileStore::Create(dir_);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return std::move(s.value());
  }

 private:
  std::string dir_;
};

class TcpFixture : public StoreFixture {
 public:
  TcpFixture() {
    auto s = TcpStoreServer::Start("127.0.0.1", 0, "secret");
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s.value());
  }
  std::unique_ptr<Store> Open() override {
    auto s = TcpStore::Connect("127.0.0.1", server_->port(), "secret",
                               Deadline::After(milliseconds(5000)));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return std::move(s.value());
  }

 private:
  std::unique_ptr<TcpStoreServer> server_;
};

class StoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "hash") fixture_ = std::make_unique<HashFixture>();
    if (GetParam() == "file") fixture_ = std::make_unique<FileFixture>();
    if (GetParam() == "tcp") fixture_ = std::make_unique<TcpFixture>();
    store_ = fixture_->Open();
    ASSERT_NE(store_, nullptr);
  }
  std::unique_ptr<StoreFixture> fixture_;
  std::unique_ptr<Store> store_;
};

TEST_P(StoreTest, SetThenGet) {
  ASSERT_TRUE(store_->Set("a", "1").ok());
  auto v = store_->Get("a", Deadline::After(milliseconds(1000)));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, "1");
  ASSERT_TRUE(store_->Set("a", "2").ok());  // overwrite
  EXPECT_EQ(*store_->Get("a", Deadline::Infinite()), "2");
}

TEST_P(StoreTest, BinaryKeysAndValues) {
  const std::string key = std::string("we/ird\0key %2F..\n", 17);
  const std::string value = std::string("\0\1\2\xff", 4);
  ASSERT_TRUE(store_->Set(key, value).ok());
  ASSERT_TRUE(store_->Set("", "empty key").ok());
  ASSERT_TRUE(store_->Set("empty value", "").ok());
  EXPECT_EQ(*store_->Get(key, Deadline::After(milliseconds(1000))), value);
  EXPECT_EQ(*store_->Get("", Deadline::After(milliseconds(1000))), "empty key");
  EXPECT_EQ(*store_->Get("empty value", Deadline::After(milliseconds(1000))), "");
  // A similar key is a different key.
  auto other = store_->Get(std::string("we/ird"), Deadline::After(milliseconds(10)));
  EXPECT_EQ(other.status().code(), Code::kTimeout);
}

TEST_P(StoreTest, LongKeysAreDistinct) {
  const std::string a(700, 'x');
  const std::string b = a + "y";
  const std::string c(400, '/');
  ASSERT_TRUE(store_->Set(a, "a").ok());
  ASSERT_TRUE(store_->Set(b, "b").ok());
  ASSERT_TRUE(store_->Set(c, "c").ok());
  EXPECT_EQ(*store_->Get(a, Deadline::After(milliseconds(1000))), "a");
  EXPECT_EQ(*store_->Get(b, Deadline::After(milliseconds(1000))), "b");
  EXPECT_EQ(*store_->Get(c, Deadline::After(milliseconds(1000))), "c");
}

TEST_P(StoreTest, LargeValue) {
  std::string big(4 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131);
  ASSERT_TRUE(store_->Set("big", big).ok());
  EXPECT_EQ(*store_->Get("big", Deadline::After(milliseconds(5000))), big);
}

TEST_P(StoreTest, GetTimesOutNamingTheKey) {
  const auto start = std::chrono::steady_clock::now();
  auto v = store_->Get("missing", Deadline::After(milliseconds(150)));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(v.status().code(), Code::kTimeout);
  EXPECT_NE(v.status().message().find("missing"), std::string::npos) << v.status().message();
  EXPECT_GE(took, milliseconds(140));
  EXPECT_LT(took, milliseconds(2000));
  // The store still works after a timeout.
  ASSERT_TRUE(store_->Set("after", "x").ok());
  EXPECT_EQ(*store_->Get("after", Deadline::After(milliseconds(1000))), "x");
}

TEST_P(StoreTest, ExpiredDeadlineStillSeesExistingKey) {
  ASSERT_TRUE(store_->Set("there", "v").ok());
  auto v = store_->Get("there", Deadline::After(milliseconds(0)));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, "v");
}

TEST_P(StoreTest, GetBlocksUntilAnotherClientSets) {
  auto writer = fixture_->Open();
  std::thread t([&] {
    // Lets the Get block first. No store shows that a Get is waiting, and a Set that came first
    // would satisfy it too: the result does not depend on this order.
    std::this_thread::sleep_for(milliseconds(100));
    EXPECT_TRUE(writer->Set("late", "value").ok());
  });
  auto v = store_->Get("late", Deadline::After(milliseconds(5000)));
  t.join();
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, "value");
}

TEST_P(StoreTest, WaitForSeveralKeys) {
  auto writer = fixture_->Open();
  std::thread t([&] {
    for (const char* k : {"w1", "w2", "w3"}) {
      std::this_thread::sleep_for(milliseconds(30));  // keys that arrive over time, on purpose
      EXPECT_TRUE(writer->Set(k, "x").ok());
    }
  });
  EXPECT_TRUE(store_->Wait({"w1", "w2", "w3"}, Deadline::After(milliseconds(5000))).ok());
  t.join();
  const Status s = store_->Wait({"w1", "nope"}, Deadline::After(milliseconds(100)));
  EXPECT_EQ(s.code(), Code::kTimeout);
  EXPECT_NE(s.message().find("nope"), std::string::npos);
  EXPECT_TRUE(store_->Wait({}, Deadline::After(milliseconds(0))).ok());
}

// GetFirst returns the first key of its list that exists, whichever was set first, with its
// value; it waits for any of them to appear (another client's Set ends it); it times out naming
// every key, and refuses an empty list.
TEST_P(StoreTest, GetFirstReturnsTheFirstListedKeyThatExists) {
  ASSERT_TRUE(store_->Set("f2", "two").ok());
  ASSERT_TRUE(store_->Set("f1", "one").ok());
  auto found = store_->GetFirst({"f0", "f1", "f2"}, Deadline::After(milliseconds(1000)));
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->index, 1u);
  EXPECT_EQ(found->value, "one");
  found = store_->GetFirst({"f2"}, Deadline::After(milliseconds(0)));
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->index, 0u);
  EXPECT_EQ(found->value, "two");

  auto writer = fixture_->Open();
  std::thread t([&] {
    std::this_thread::sleep_for(milliseconds(100));  // lets the GetFirst wait first (as above)
    EXPECT_TRUE(writer->Set("g1", std::string("\0v", 2)).ok());
  });
  found = store_->GetFirst({"g0", "g1"}, Deadline::After(milliseconds(5000)));
  t.join();
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->index, 1u);
  EXPECT_EQ(found->value, std::string("\0v", 2));

  const auto start = std::chrono::steady_clock::now();
  found = store_->GetFirst({"h0", "h1"}, Deadline::After(milliseconds(150)));
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(140));
  EXPECT_EQ(found.status().code(), Code::kTimeout);
  EXPECT_EQ(found.status().message(),
            "store: none of the keys 'h0', 'h1' appeared before the deadline");
  EXPECT_EQ(store_->GetFirst({}, Deadline::After(milliseconds(0))).status().code(),
            Code::kInvalidArgument);
  // The store still works after both.
  found = store_->GetFirst({"h1", "f1"}, Deadline::After(milliseconds(1000)));
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->index, 1u);
}

TEST_P(StoreTest, AddCounts) {
  auto v = store_->Add("n", 5);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 5);
  EXPECT_EQ(*store_->Add("n", -7), -2);
  EXPECT_EQ(*store_->Get("n", Deadline::After(milliseconds(1000))), "-2");
  ASSERT_TRUE(store_->Set("text", "abc").ok());
  EXPECT_EQ(store_->Add("text", 1).status().code(), Code::kInvalidArgument);
  ASSERT_TRUE(store_->Set("huge", "9223372036854775807").ok());
  EXPECT_EQ(store_->Add("huge", 1).status().code(), Code::kInvalidArgument);
}

TEST_P(StoreTest, ConcurrentAddsFromManyClients) {
  constexpr int kThreads = 4;
  constexpr int kAdds = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      auto s = fixture_->Open();
      for (int i = 0; i < kAdds; ++i) EXPECT_TRUE(s->Add("counter", 1).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*store_->Add("counter", 0), kThreads * kAdds);
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreTest, ::testing::Values("hash", "file", "tcp"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(FileStoreTest, RejectsRelativePath) {
  EXPECT_EQ(FileStore::Create("relative/dir").status().code(), Code::kInvalidArgument);
}

TEST(FileStoreTest, TwoStoresOverOneDirectoryShareKeys) {
  const std::string dir = MakeTempDir();
  auto a = FileStore::Create(dir + "/nested/deeper");
  auto b = FileStore::Create(dir + "/nested/deeper/");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE((*a)->Set("k", "v").ok());
  EXPECT_EQ(*(*b)->Get("k", Deadline::After(milliseconds(100))), "v");
  const std::string cmd = "rm -rf '" + dir + "'";
  EXPECT_EQ(::system(cmd.c_str()), 0);
}

// Access::kPrivate (Concord's own /tmp/concord-UID-JOBID) takes only a directory of this user's
// that nobody else may write; kAsGiven (a directory the user named) takes it as it is.
TEST(FileStoreTest, PrivateAccessRefusesDirectoriesOthersControl) {
  const auto kPrivate = FileStore::Access::kPrivate;
  const milliseconds lock_timeout(1000);
  const std::string dir = MakeTempDir();
  const std::string fresh = dir + "/fresh";
  auto made = FileStore::Create(fresh, lock_timeout, kPrivate);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_TRUE(FileStore::Create(dir, lock_timeout, kPrivate).ok());
  EXPECT_TRUE(FileStore::Create(dir + "/", lock_timeout, kPrivate).ok());

  auto expect_refused = [&](const std::string& path, const std::string& why) {
    auto s = FileStore::Create(path, lock_timeout, kPrivate);
    EXPECT_EQ(s.status().code(), Code::kInvalidArgument) << path << ": " << s.status().ToString();
    EXPECT_NE(s.status().message().find("'" + path + "'"), std::string::npos)
        << s.status().message();
    EXPECT_NE(s.status().message().find(why), std::string::npos) << s.status().message();
    EXPECT_TRUE(FileStore::Create(path, lock_timeout, FileStore::Access::kAsGiven).ok()) << path;
  };
  ASSERT_EQ(::chmod(fresh.c_str(), 0777), 0);
  expect_refused(fresh, "mode 0777");
  ASSERT_EQ(::chmod(fresh.c_str(), 0720), 0);
  expect_refused(fresh, "mode 0720");
  ASSERT_EQ(::chmod(fresh.c_str(), 0700), 0);
  const std::string link = dir + "/link";
  ASSERT_EQ(::symlink(fresh.c_str(), link.c_str()), 0);
  expect_refused(link, "symbolic link");
  if (::geteuid() == 0) {  // only root can give a directory away
    const std::string foreign = dir + "/foreign";
    ASSERT_EQ(::mkdir(foreign.c_str(), 0700), 0);
    ASSERT_EQ(::chown(foreign.c_str(), 65534, 65534), 0);
    expect_refused(foreign, "belongs to user 65534");
  }
  const std::string cmd = "rm -rf '" + dir + "'";
  EXPECT_EQ(::system(cmd.c_str()), 0);
}

// OpenStore's op_timeout bounds a Set on a server that never answers it.
TEST(StoreFactoryTest, SetWaitsAtMostTheOpTimeout) {
  harness::HelloOnlyServer server;
  const int port = server.port();
  std::atomic<bool> stop{false};
  std::thread serving([&] {
    while (!stop.load()) {
      server.Serve();
      std::this_thread::sleep_for(milliseconds(10));
    }
  });
  auto store = OpenStore("tcp://127.0.0.1:" + std::to_string(port), "tok",
                         Deadline::After(milliseconds(3000)), milliseconds(300));
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  if (store.ok()) {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ((*store)->Set("k", "v").code(), Code::kTimeout);
    EXPECT_EQ((*store)->Add("n", 1).status().code(), Code::kTimeout);
    EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(3000));
  }
  stop.store(true);
  serving.join();
}

TEST(StoreFactoryTest, OpensTcpAndFileStores) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0, "tok");
  ASSERT_TRUE(server.ok());
  auto tcp = OpenStore("tcp://127.0.0.1:" + std::to_string((*server)->port()), "tok",
                       Deadline::After(milliseconds(2000)));
  ASSERT_TRUE(tcp.ok()) << tcp.status().ToString();
  EXPECT_TRUE((*tcp)->Set("x", "y").ok());

  const std::string dir = MakeTempDir();
  auto file = OpenStore("file://" + dir, "", Deadline::After(milliseconds(2000)));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_TRUE((*file)->Set("x", "y").ok());
  const std::string cmd = "rm -rf '" + dir + "'";
  EXPECT_EQ(::system(cmd.c_str()), 0);
}

TEST(StoreFactoryTest, RejectsUnknownUrls) {
  const Deadline d = Deadline::After(milliseconds(1000));
  for (const char* url : {"", "http://x:1", "tcp://nohost", "tcp://h:0", "tcp://h:99999",
                          "tcp://:5", "file://relative", "file://", "redis://a:1"}) {
    auto s = OpenStore(url, "t", d);
    EXPECT_EQ(s.status().code(), Code::kInvalidArgument) << url << ": " << s.status().ToString();
  }
}

}  // namespace
}  // namespace concord
