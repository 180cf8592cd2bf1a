// The lifeline: a small process that ends the job's ranks when concordrun dies without ending
// them itself (kill -9, a crash, the OOM killer).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "base/status.h"
#include "rendezvous/net.h"

namespace concord {

// Contract: Start() forks the lifeline, which holds the read end of a pipe whose only write end
// is this object's (close-on-exec, so no rank holds it). Watch() tells it a rank's process group,
// Forget() that the group is gone.
// When the write end closes without Release() — concordrun exited, however it died — the
// lifeline's read sees end of file: it SIGKILLs every group it was told of (the ranks and whatever
// they started in their groups: a wrapper script's children too), removes the shared-memory
// segments the ranks left (shm_leftovers.h) and the job's summary directory if Start() was given
// one, says so on stderr and exits.
// Release() (also the destructor) tells it the job ended normally: it exits and is reaped, killing
// nothing. The lifeline leads its own process group, so a terminal's Ctrl-C does not reach it.
// Ranks also get PR_SET_PDEATHSIG (concordrun.cc), which covers the rank process alone even if
// the lifeline was killed too; a process that leaves its group (setsid) is not covered.
class Lifeline {
 public:
  // Forks the lifeline. Call while this process runs one thread: the child goes on running this
  // program (no exec) and allocates. `summary_dir` (run_summary.h's directory of plain files, or
  // "" for none) is removed by the lifeline if concordrun dies; after Release() it is the caller's.
  static StatusOr<std::unique_ptr<Lifeline>> Start(const std::string& summary_dir);
  ~Lifeline() { Release(); }
  Lifeline(const Lifeline&) = delete;
  Lifeline& operator=(const Lifeline&) = delete;

  // Adds a process group (a rank's, which it leads) to those killed if concordrun dies.
  void Watch(pid_t group);
  // Removes a group that has no process left: its number may be reused.
  void Forget(pid_t group);
  // The job is over: the lifeline exits without killing; waits for it. Idempotent.
  void Release();

 private:
  Lifeline(net::Fd to_lifeline, pid_t pid) : to_lifeline_(std::move(to_lifeline)), pid_(pid) {}

  net::Fd to_lifeline_;  // the pipe's write end
  pid_t pid_;
};

}  // namespace concord
