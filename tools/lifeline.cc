#include "tools/lifeline.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tools/run_summary.h"
#include "tools/shm_leftovers.h"

namespace concord {
namespace {

// What goes through the pipe: a process group to watch, its negation to forget it, or kReleased.
using Record = int32_t;
constexpr Record kReleased = 0;

void WriteRecord(int fd, Record record) {
  // 4 bytes: one atomic write to a pipe. A lifeline that is gone (EPIPE) has nothing left to do.
  while (::write(fd, &record, sizeof(record)) < 0 && errno == EINTR) {
  }
}

// The lifeline's life: reads records until the job is released or the pipe's write end closes.
[[noreturn]] void RunLifeline(int from_launcher, pid_t launcher, const std::string& summary_dir) {
  ::setpgid(0, 0);
  std::vector<pid_t> groups;
  std::string bytes;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(from_launcher, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // end of file: concordrun is gone without releasing us
    bytes.append(buf, static_cast<size_t>(n));
    size_t used = 0;
    for (; bytes.size() - used >= sizeof(Record); used += sizeof(Record)) {
      Record record;
      std::memcpy(&record, bytes.data() + used, sizeof(record));
      if (record == kReleased) ::_exit(0);
      if (record > 0) {
        groups.push_back(record);
      } else {
        groups.erase(std::remove(groups.begin(), groups.end(), -record), groups.end());
      }
    }
    bytes.erase(0, used);
  }
  for (pid_t group : groups) ::kill(-group, SIGKILL);
  // A rank leads its group (the group's number is its pid): the shared-memory segments it created
  // and had not unlinked yet go too.
  for (pid_t group : groups) RemoveSegmentsOf(group);
  // What the ranks wrote for the summary nobody will print (SIGKILLed, they write nothing more).
  if (!summary_dir.empty()) (void)RemoveSummaryDir(summary_dir);
  if (!groups.empty()) {
    const std::string message = "concordrun: the launcher (pid " + std::to_string(launcher) +
                                ") died; its lifeline SIGKILLed the ranks' process groups\n";
    ssize_t ignored = ::write(STDERR_FILENO, message.data(), message.size());
    (void)ignored;
  }
  ::_exit(0);
}

}  // namespace

StatusOr<std::unique_ptr<Lifeline>> Lifeline::Start(const std::string& summary_dir) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ErrnoError("pipe", errno);
  net::Fd from_launcher(fds[0]);
  net::Fd to_lifeline(fds[1]);
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return ErrnoError("fork", errno);
  if (pid == 0) {
    to_lifeline.Reset();  // else the lifeline would hold its own pipe open
    RunLifeline(from_launcher.get(), launcher, summary_dir);
  }
  return std::unique_ptr<Lifeline>(new Lifeline(std::move(to_lifeline), pid));
}

void Lifeline::Watch(pid_t group) {
  if (to_lifeline_.valid()) WriteRecord(to_lifeline_.get(), static_cast<Record>(group));
}

void Lifeline::Forget(pid_t group) {
  if (to_lifeline_.valid()) WriteRecord(to_lifeline_.get(), -static_cast<Record>(group));
}

void Lifeline::Release() {
  if (!to_lifeline_.valid()) return;
  WriteRecord(to_lifeline_.get(), kReleased);
  to_lifeline_.Reset();
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace concord
