// concordrun's command line: what the job is (ranks, hosts, program) and how it is run; and the
// --backend mpi path, which hands the job to mpirun.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace concord {

struct HostSlots {
  std::string host;
  int slots = 1;
};

struct Options {
  int np = 0;
  std::vector<HostSlots> hosts;
  std::string iface;
  std::string backend;
  std::string timeout;
  // After a rank fails, how long the others may run on (to see the error and exit by themselves)
  // before SIGTERM; after a signal concordrun forwards, how long before SIGKILL.
  double grace_s = 5;
  bool prefix = true;
  // Print the job summary at the end (tools/run_summary.h); --no-summary turns it off.
  bool summary = true;
  // -x NAME or -x NAME=VALUE: more variables for remote ranks (which get the CONCORD_* ones of
  // concordrun's environment anyway; local ranks inherit all of it).
  std::vector<std::string> exports;
  std::vector<std::string> command;
};

// Parses the command line (and CONCORD_GRACE_S, the default of --grace). On a usage error prints
// the error and the usage to stderr and exits 2 (among them an option given twice: only -x
// repeats, and only for another variable); on --help prints the usage and exits 0.
Options ParseArgs(int argc, char** argv);

// Exits 2 (a usage error naming the program) when o.command's program cannot be executed here,
// looked up as the ranks' execvp does: a name without '/' that no executable file in PATH's
// directories has, or a path that is not an executable file. Called before anything starts when
// some rank runs on this host: else every rank here failed to start with the same error.
void CheckProgram(const Options& o);

// Exits 2 (a usage error saying the limit and how to raise it) when a job of o.np ranks needs more
// descriptors than concordrun may open, `limit` (its RLIMIT_NOFILE, once raised): 3 per rank (its
// stdout and stderr pipes, its store connection; remote ranks' ssh too) besides `open_now`, those
// concordrun has open when it checks, and a margin for its own. Called before anything starts:
// else the job failed at the rank whose pipe found no descriptor, after starting all before it.
void CheckDescriptorLimit(const Options& o, int64_t open_now, int64_t limit);

// The job's settings in `environ` that ranks on other hosts must get too: its CONCORD_*
// variables (job-wide settings must agree on every rank), except those that describe this host or
// this launcher (CONCORD_HOST, CONCORD_HOST_ID, CONCORD_IFACE, CONCORD_METRICS_PORT, ...), as
// NAME=VALUE.
std::vector<std::string> JobSettings(char** environ);

// --backend mpi: replaces this process with mpirun (concordrun_mpi.cc), which gets the job's
// settings (JobSettings) as -x NAME, as remote ranks do over ssh. Returns only if exec fails,
// with the exit status to return.
int ExecMpirun(const Options& o);

}  // namespace concord
