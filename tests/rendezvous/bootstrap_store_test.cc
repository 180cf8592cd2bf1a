// How concord_init opens its rendezvous store: the store's Set and Add follow CONCORD_TIMEOUT_S,
// and the one-host file store refuses a directory at its predictable path that is not private to
// this user. Each init runs in a forked child (it reads the environment and may wait), watched
// by the parent, which is killed after 15 s so that no test hangs.
#include <concord/concord.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "rendezvous/net.h"
#include "tests/rendezvous/hello_only_server.h"

namespace concord {
namespace {

using std::chrono::milliseconds;

// What a forked concord_init returned, and how long it took.
struct InitResult {
  int code = -1;  // the concord_status_t, or -1 when the child did not exit normally in time
  std::string error;
  milliseconds elapsed{0};
};

// Runs concord_init in a child whose environment is exactly `env`; while it runs, the parent calls
// serve() every 20 ms or so (it must not block). The child is killed after 15 s.
InitResult InitInChild(const std::map<std::string, std::string>& env,
                       const std::function<void()>& serve) {
  int pipe_fds[2];
  EXPECT_EQ(::pipe(pipe_fds), 0);
  const auto start = Clock::now();
  const pid_t pid = ::fork();  // this process runs no other thread now
  EXPECT_GE(pid, 0);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    ::clearenv();
    for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
    concord_comm_t comm;
    const concord_status_t s = concord_init(&comm);
    const std::string error = s == CONCORD_SUCCESS ? "" : concord_comm_last_error(nullptr);
    ssize_t ignored = ::write(pipe_fds[1], error.data(), error.size());
    (void)ignored;
    ::_exit(static_cast<int>(s));
  }
  ::close(pipe_fds[1]);
  InitResult result;
  int status = 0;
  const Deadline deadline = Deadline::After(milliseconds(15000));
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (deadline.passed()) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ::close(pipe_fds[0]);
      ADD_FAILURE() << "concord_init did not return within 15 s";
      return result;
    }
    serve();
    std::this_thread::sleep_for(milliseconds(20));
  }
  result.elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0) result.error.append(buf, n);
  ::close(pipe_fds[0]);
  if (WIFEXITED(status)) result.code = WEXITSTATUS(status);
  return result;
}

// The store's Set (rank 1's first request) gives up after CONCORD_TIMEOUT_S, not after a fixed
// minute.
TEST(BootstrapStoreTest, StoreRequestsFollowConcordTimeout) {
  harness::HelloOnlyServer server;
  const InitResult r =
      InitInChild({{"CONCORD_STORE", "tcp://127.0.0.1:" + std::to_string(server.port())},
                   {"CONCORD_TOKEN", "x"},
                   {"CONCORD_RANK", "1"},
                   {"CONCORD_SIZE", "2"},
                   {"CONCORD_TIMEOUT_S", "1"}},
                  [&] { server.Serve(); });
  EXPECT_EQ(r.code, CONCORD_ERR_TIMEOUT) << r.error;
  EXPECT_LT(r.elapsed, milliseconds(6000)) << r.error;
}

// Under torchrun's variables, rank 1 connects to MASTER_PORT+1. When something else answers there
// (here a server that answers every connection as an HTTP server would), that will not change:
// init fails at once saying so, not by retrying until CONCORD_TIMEOUT_S.
TEST(BootstrapStoreTest, AnotherServiceOnTheStorePortFailsAtOnce) {
  int port = 0;
  auto listener = net::Listen("127.0.0.1", 0, &port);
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  std::vector<net::Fd> answered;
  const std::string http = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
  const InitResult r =
      InitInChild({{"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", std::to_string(port - 1)},
                   {"RANK", "1"},
                   {"WORLD_SIZE", "2"},
                   {"CONCORD_TIMEOUT_S", "10"}},
                  [&] {
                    for (;;) {
                      auto fd = net::Accept(listener->get());
                      if (!fd.ok() || !fd->valid()) break;
                      ssize_t ignored = ::send(fd->get(), http.data(), http.size(), MSG_NOSIGNAL);
                      (void)ignored;
                      answered.push_back(std::move(*fd));
                    }
                  });
  EXPECT_EQ(r.code, CONCORD_ERR_PROTOCOL) << r.error;
  EXPECT_NE(r.error.find("not as Concord's rendezvous store"), std::string::npos) << r.error;
  EXPECT_LT(r.elapsed, milliseconds(5000)) << r.error;
}

// The settings of a one-host job started by a launcher that gives no store (as mpirun): its
// ranks meet in a file store at /tmp/concord-UID-JOBID. Rank 1 never comes: init ends with
// TIMEOUT after a second unless the store itself is refused.
std::map<std::string, std::string> OneHostJob(const std::string& job_id) {
  return {{"CONCORD_RANK", "0"},
          {"CONCORD_SIZE", "2"},
          {"CONCORD_LOCAL_SIZE", "2"},
          {"CONCORD_JOB_ID", job_id},
          {"CONCORD_TIMEOUT_S", "1"}};
}

std::string OneHostStoreDir(const std::string& job_id) {
  return "/tmp/concord-" + std::to_string(::getuid()) + "-" + job_id;
}

void RemoveTree(const std::string& path) {
  const std::string cmd = "rm -rf '" + path + "'";
  EXPECT_EQ(::system(cmd.c_str()), 0);
}

TEST(BootstrapStoreTest, OneHostFileStoreIsCreatedPrivate) {
  const std::string job_id = "bootstrap-store-test-" + std::to_string(::getpid()) + "-fresh";
  const std::string dir = OneHostStoreDir(job_id);
  RemoveTree(dir);
  const InitResult r = InitInChild(OneHostJob(job_id), [] {});
  EXPECT_EQ(r.code, CONCORD_ERR_TIMEOUT) << r.error;
  struct stat st;
  ASSERT_EQ(::lstat(dir.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  RemoveTree(dir);
}

// Someone else could have made the directory first, at the predictable path: init refuses it,
// naming it, rather than meeting the other ranks (and trusting their keys) there.
TEST(BootstrapStoreTest, OneHostFileStoreRefusesADirectoryOthersCanWrite) {
  const std::string job_id = "bootstrap-store-test-" + std::to_string(::getpid()) + "-open";
  const std::string dir = OneHostStoreDir(job_id);
  RemoveTree(dir);
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  const InitResult r = InitInChild(OneHostJob(job_id), [] {});
  EXPECT_EQ(r.code, CONCORD_ERR_INVALID_ARGUMENT) << r.error;
  EXPECT_NE(r.error.find(dir), std::string::npos) << r.error;
  RemoveTree(dir);
}

TEST(BootstrapStoreTest, OneHostFileStoreRefusesASymlink) {
  const std::string job_id = "bootstrap-store-test-" + std::to_string(::getpid()) + "-link";
  const std::string dir = OneHostStoreDir(job_id);
  const std::string target = dir + "-target";
  RemoveTree(dir);
  RemoveTree(target);
  ASSERT_EQ(::mkdir(target.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(target.c_str(), dir.c_str()), 0);
  const InitResult r = InitInChild(OneHostJob(job_id), [] {});
  EXPECT_EQ(r.code, CONCORD_ERR_INVALID_ARGUMENT) << r.error;
  EXPECT_NE(r.error.find(dir), std::string::npos) << r.error;
  RemoveTree(dir);
  RemoveTree(target);
}

// A job id is one path component: a '/' (or "..") in it neither makes directories elsewhere nor
// escapes /tmp/concord-UID-*; a job id too long for a file name is refused, saying so.
TEST(BootstrapStoreTest, OneHostFileStoreNamesItsDirectoryWithTheJobIdEncoded) {
  const std::string pid = std::to_string(::getpid());
  const std::string prefix = "bootstrap-store-test-" + pid + "-slash";
  const std::string escaped = "/tmp/bootstrap-store-test-" + pid + "-escaped";
  const std::string job_id = prefix + "/../../bootstrap-store-test-" + pid + "-escaped";
  const std::string dir = "/tmp/concord-" + std::to_string(::getuid()) + "-" + prefix +
                          "%2F..%2F..%2Fbootstrap-store-test-" + pid + "-escaped";
  RemoveTree(dir);
  const InitResult r = InitInChild(OneHostJob(job_id), [] {});
  EXPECT_EQ(r.code, CONCORD_ERR_TIMEOUT) << r.error;
  struct stat st;
  ASSERT_EQ(::lstat(dir.c_str(), &st), 0) << dir;
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_NE(::lstat(OneHostStoreDir(prefix).c_str(), &st), 0) << "made " << OneHostStoreDir(prefix);
  EXPECT_NE(::lstat(escaped.c_str(), &st), 0) << "made " << escaped;
  RemoveTree(dir);
  RemoveTree(OneHostStoreDir(prefix));
  RemoveTree(escaped);

  const InitResult long_id = InitInChild(OneHostJob(std::string(201, 'j')), [] {});
  EXPECT_EQ(long_id.code, CONCORD_ERR_INVALID_ARGUMENT) << long_id.error;
  EXPECT_NE(long_id.error.find("too long"), std::string::npos) << long_id.error;
  EXPECT_LT(long_id.elapsed, milliseconds(1000)) << long_id.error;
}

// srun across two nodes, no store given: each node's share of the step's tasks is its local size,
// so the job is not taken for a one-host one (whose /tmp file store each node would make for
// itself, its ranks then waiting for the other node's until the timeout): init fails at once,
// saying how to meet.
TEST(BootstrapStoreTest, SlurmStepAcrossNodesIsNotAOneHostJob) {
  const std::string job_id = "bootstrap-store-test-" + std::to_string(::getpid()) + "-slurm";
  const InitResult r = InitInChild({{"SLURM_PROCID", "1"},
                                    {"SLURM_NTASKS", "4"},
                                    {"SLURM_STEP_NUM_TASKS", "4"},
                                    {"SLURM_LOCALID", "1"},
                                    {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
                                    {"SLURM_NODEID", "0"},
                                    {"SLURM_JOB_ID", job_id},
                                    {"CONCORD_TIMEOUT_S", "3"}},
                                   [] {});
  EXPECT_EQ(r.code, CONCORD_ERR_INVALID_ARGUMENT) << r.error;
  EXPECT_NE(r.error.find("no rendezvous for 4 ranks"), std::string::npos) << r.error;
  EXPECT_LT(r.elapsed, milliseconds(1000)) << r.error;
  RemoveTree(OneHostStoreDir(job_id));
}

}  // namespace
}  // namespace concord
