// concordrun: starts an N-rank Concord job on this host (fork/exec) and on remote hosts (ssh).
//
//   concordrun -np N [-H host:slots,...] [--iface IF] [--backend NAME] [--timeout S] [--grace S]
//              [--no-prefix] [--no-summary] prog args...
//
// It runs the job's TCP store server (authenticated with a random token), gives every rank its
// CONCORD_* environment and torchrun's (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT: an unmodified torch.distributed script's env:// rendezvous; rank 0's
// address and a free port of it, or the launcher's own MASTER_ADDR and MASTER_PORT), forwards each
// rank's stdout/stderr line by line with a "[R] " prefix, and supervises. When a rank fails
// (non-zero exit, signal), concordrun names it at once, with how it ended and its last words on
// stderr (the last error the Concord library logged, the last line); the other ranks then have the
// grace period (--grace, CONCORD_GRACE_S, 5 s) to see the error in their own calls and exit by
// themselves (to log it, to save a checkpoint); those still running then get SIGTERM (and SIGCONT,
// for a stopped one), and SIGKILL 3 s later. At the end, one line lists the ranks that failed
// after the first by themselves (not by concordrun's signal). A SIGINT/SIGTERM/SIGHUP to concordrun
// goes to the ranks at once (SIGHUP as SIGTERM, unless concordrun started with SIGHUP ignored, as
// under nohup: then it stays ignored), SIGKILL following after the grace period, or at a second
// signal. It signals only the processes it started (each local rank leads its own process group, so
// its children are stopped with it). Ranks die with concordrun even when it is SIGKILLed: each has
// PR_SET_PDEATHSIG, and the lifeline (lifeline.h) kills their process groups. Exit status: 0 when
// every rank exits 0; 1 when the first rank to fail exited non-zero; 128+S when it was killed by
// signal S, or when concordrun received signal S; 2 for usage errors. Once every rank has ended
// (failed or not), concordrun prints the job summary to stderr unless
// --no-summary: each local rank gets CONCORD_SUMMARY_DIR, a private directory concordrun makes,
// where its engine writes rank-<R>.txt at finalize (tools/run_summary.h); the directory is
// removed after. Nothing is printed when no rank wrote one.
//
// A stalled reader of concordrun's output never stalls the supervision: concordrun's stdout and
// stderr are OutputSinks (output_sink.h), which never block; a rank whose sink has over 4 MiB
// queued is not read until it drains (its own writes then wait), so no output is lost. After the
// job, concordrun waits for its readers to take the rest (after a stop signal, kDrainPeriod at
// most). SIGTSTP (Ctrl-Z), SIGTTIN and SIGTTOU stop the whole job: SIGSTOP to the ranks' process
// groups, then concordrun itself; continued, it continues them.
//
// With --backend mpi, concordrun does none of that itself: it execs mpirun (CONCORD_MPIRUN, else
// the mpirun found at build time, else "mpirun" on PATH) with -np, the hosts of -H,
// --oversubscribe when there are more ranks than CPUs here, --tag-output unless --no-prefix, the
// grace period as Open MPI's odls_base_sigkill_timeout (whole seconds), and CONCORD_BACKEND=mpi
// (plus CONCORD_TIMEOUT_S and CONCORD_IFACE when given) exported to every rank; mpirun then
// starts, supervises and stops the ranks, and its exit status is concordrun's.
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/net.h"
#include "rendezvous/tcp_store.h"
#include "tools/concordrun_options.h"
#include "tools/lifeline.h"
#include "tools/output_sink.h"
#include "tools/run_summary.h"
#include "tools/shm_leftovers.h"

extern char** environ;

namespace concord {
namespace {

// After SIGTERM, how long ranks that a failure stopped get before SIGKILL.
constexpr auto kKillDelay = std::chrono::seconds(3);
// After the last rank exits, how long to keep reading output that its children may still write.
constexpr auto kDrainPeriod = std::chrono::seconds(1);
// A line longer than this is forwarded in pieces.
constexpr size_t kMaxLine = 1 << 20;
// How much of a rank's last stderr lines concordrun quotes when it fails.
constexpr size_t kMaxQuoted = 300;
// Reads that forward a reaped rank's output before concordrun reports on it (64 KiB each): a
// bound, since its children may go on writing.
constexpr int kMaxDrainReads = 16;
// The ranks that failed after the first one that the last line names; the rest are counted.
constexpr size_t kMaxListedFailures = 16;

// What a rank last wrote to stderr, for the report when it fails.
struct LastWords {
  std::string line;           // the last line that is not blank
  std::string concord_error;  // the last error the library logged: "[concord rank R] ERROR ..."

  void Note(std::string_view text) {
    while (!text.empty() && (text.back() == '\r' || text.back() == ' ' || text.back() == '\t')) {
      text.remove_suffix(1);
    }
    if (text.find_first_not_of(" \t") == std::string_view::npos) return;
    line = text.size() > kMaxQuoted ? std::string(text.substr(0, kMaxQuoted)) + "..."
                                    : std::string(text);
    if (text.rfind("[concord rank ", 0) == 0 && text.find("] ERROR ") != std::string_view::npos) {
      concord_error = line;
    }
  }

  // "; its last Concord error: "..."; its last stderr line: "..."", the parts it has.
  std::string Describe() const {
    std::string out;
    if (!concord_error.empty() && concord_error != line) {
      out += "; its last Concord error: \"" + concord_error + "\"";
    }
    if (!line.empty()) out += "; its last stderr line: \"" + line + "\"";
    return out;
  }
};

// One rank's output stream (stdout or stderr) on its way to ours.
struct Stream {
  int fd = -1;  // read end of the pipe (non-blocking); -1 once closed
  int to = -1;  // STDOUT_FILENO or STDERR_FILENO
  std::string partial;
  LastWords last;  // stderr only
};

struct Rank {
  int rank = 0;
  std::string host;
  bool local = true;
  int local_rank = 0;
  int local_size = 1;
  pid_t pid = -1;
  bool running = false;
  // Reaped while processes it started were left in its group (which keeps the group's number
  // from being reused): StopLeftovers ends them.
  bool left_group = false;
  // concordrun sent it SIGTERM, SIGKILL or a signal it got: how it then ends is no news.
  bool told_to_end = false;
  Stream out;
  Stream err;
};

// How a job that must end gets there.
enum class Ending {
  kNone,        // nothing has gone wrong
  kGrace,       // a rank failed: the others may exit by themselves until next_step_at_
  kTerminated,  // SIGTERM (or the signal concordrun got) sent: SIGKILL at next_step_at_
  kKilled,      // SIGKILL sent
};

std::string SignalName(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? "SIG" + std::string(abbrev) : "signal " + std::to_string(sig);
}

// "exited with code 3", "was killed by signal 9 (SIGKILL)".
std::string HowItEnded(int status) {
  if (WIFSIGNALED(status)) {
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           SignalName(WTERMSIG(status)) + ")";
  }
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", s);
  return buf;
}

std::string HostName() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

bool IsLocalHost(const std::string& host) {
  if (host == "localhost" || host == "127.0.0.1" || host == "::1") return true;
  const std::string me = HostName();
  return host == me || host == me.substr(0, me.find('.'));
}

// Whether some rank of the job runs on this host: -H's hosts take the ranks in order, as
// Launcher::Setup places them (and mpirun, with --backend mpi).
bool SomeRankRunsHere(const Options& o) {
  if (o.hosts.empty()) return true;
  int64_t placed = 0;
  for (const HostSlots& h : o.hosts) {
    if (placed >= o.np) break;
    if (IsLocalHost(h.host)) return true;
    placed += h.slots;
  }
  return false;
}

// The IPv4 address of an interface, for remote ranks to reach the store.
StatusOr<std::string> InterfaceAddress(const std::string& iface) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return ErrnoError("getifaddrs", errno);
  std::string found;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || iface != a->ifa_name) {
      continue;
    }
    char buf[INET_ADDRSTRLEN];
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf)) != nullptr) {
      found = buf;
      break;
    }
  }
  ::freeifaddrs(list);
  if (found.empty()) return InvalidArgument("interface '" + iface + "' has no IPv4 address");
  return found;
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out.push_back(c);
    }
  }
  return out + "'";
}

Deadline Until(Clock::time_point t) {
  return Deadline::After(std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()) +
                         std::chrono::milliseconds(1));
}

// Builds the NULL-terminated pointer array that exec wants; the strings must outlive it.
std::vector<char*> CArray(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(&s[0]);
  out.push_back(nullptr);
  return out;
}

// Runs the job: starts the store server and the ranks, forwards their output, supervises them
// and ends the job as the file comment says. Run() returns concordrun's exit status once every
// rank has ended. One per process, on the main thread (which the ranks' PR_SET_PDEATHSIG needs).
class Launcher {
 public:
  // `ranks_nofile`: the limit on open files that the ranks get (RaiseDescriptorLimit), if not
  // concordrun's own.
  Launcher(Options options, std::optional<rlimit> ranks_nofile);
  int Run();

 private:
  Status Setup();
  Status TorchMaster(bool all_local, const std::string& advertise);
  std::vector<std::string> JobEnvironment() const;
  Status Spawn(Rank* r, const std::vector<std::string>& job_env, const sigset_t& child_mask);
  // concordrun's output: a line of its own on stderr; the sink of STDOUT_FILENO or STDERR_FILENO.
  void Message(const std::string& text);
  OutputSink& Sink(int fd) { return fd == STDERR_FILENO && stderr_ ? *stderr_ : *stdout_; }
  std::vector<OutputSink*> PendingSinks() const;
  bool Throttled(const Stream& s) { return Sink(s.to).full(); }
  void Emit(Rank& r, Stream* s, bool final);
  bool ReadStream(Rank& r, Stream* s);
  void Supervise(int sigfd);
  void FlushOutput(int sigfd);
  int StartFailed(const std::string& why, int sigfd);
  void Reap();
  void StopLeftovers();
  // Unlinks the shared-memory segments the local ranks created and left (shm_leftovers.h).
  void RemoveLeftSegments();
  void RankFailed(Rank& r, int status);
  void Escalate();
  void Signalled(int sig);
  void Suspend(int sig);
  void Stop(int sig, Clock::duration kill_after);
  Clock::duration Grace() const {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.grace_s));
  }
  void Kill();
  // Signals the ranks still running; returns them, as "rank 2" or "ranks 0, 3" ("" if none).
  std::string SignalRunning(int sig);
  std::string Terminate(int sig);
  bool AnyRunning() const;
  bool AnyStreamOpen() const;
  void CloseStreams();
  void Summarize();

  Options o_;
  std::unique_ptr<OutputSink> stdout_;
  std::unique_ptr<OutputSink> stderr_;  // null when stderr goes where stdout goes (2>&1)
  std::vector<Rank> ranks_;
  std::unique_ptr<Lifeline> lifeline_;
  std::unique_ptr<TcpStoreServer> server_;
  std::string store_url_;
  std::string token_;
  std::string job_id_;
  std::string summary_dir_;                // "" when there is no summary
  std::string master_addr_, master_port_;  // torchrun's MASTER_ADDR, MASTER_PORT (TorchMaster)
  Ending ending_ = Ending::kNone;
  Clock::time_point next_step_at_;
  std::string first_failure_;   // "rank 1 (pid 42) exited with code 3", once one failed
  std::string first_words_;     // its LastWords::Describe()
  bool others_ran_on_ = false;  // some ranks still ran when the first failed
  // "rank R exited with code C" for each rank that failed after the first without a signal from
  // concordrun.
  std::vector<std::string> later_failures_;
  bool stop_requested_ = false;  // concordrun got SIGINT, SIGTERM or SIGHUP

  const std::optional<rlimit> ranks_nofile_;  // the ranks' limit on open files, if not ours
  int exit_code_ = 0;
};

// Whether two descriptors write to the same pipe, terminal or file.
bool SameDestination(int a, int b) {
  struct stat sa, sb;
  return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// One sink for stdout and stderr when they are one destination, so that what concordrun writes
// there keeps its order.
Launcher::Launcher(Options options, std::optional<rlimit> ranks_nofile)
    : o_(std::move(options)),
      stdout_(std::make_unique<OutputSink>(STDOUT_FILENO)),
      ranks_nofile_(ranks_nofile) {
  if (!SameDestination(STDOUT_FILENO, STDERR_FILENO)) {
    stderr_ = std::make_unique<OutputSink>(STDERR_FILENO);
  }
}

void Launcher::Message(const std::string& text) {
  Sink(STDERR_FILENO).Write("concordrun: " + text + "\n");
}

std::vector<OutputSink*> Launcher::PendingSinks() const {
  std::vector<OutputSink*> pending;
  for (OutputSink* sink : {stdout_.get(), stderr_.get()}) {
    if (sink != nullptr && sink->pending()) pending.push_back(sink);
  }
  return pending;
}

Status Launcher::Setup() {
  if (o_.hosts.empty()) o_.hosts.push_back({"localhost", o_.np});
  std::map<std::string, int> per_host;
  int rank = 0;
  for (const HostSlots& h : o_.hosts) {
    const bool local = IsLocalHost(h.host);
    const std::string key = local ? std::string() : h.host;
    for (int s = 0; s < h.slots && rank < o_.np; ++s, ++rank) {
      Rank r;
      r.rank = rank;
      r.host = h.host;
      r.local = local;
      r.local_rank = per_host[key]++;
      ranks_.push_back(std::move(r));
    }
  }
  bool all_local = true;
  for (Rank& r : ranks_) {
    r.local_size = per_host[r.local ? std::string() : r.host];
    all_local = all_local && r.local;
  }
  CONCORD_ASSIGN_OR_RETURN(token_, net::RandomHex(32));
  CONCORD_ASSIGN_OR_RETURN(job_id_, net::RandomHex(8));
  std::string advertise = "127.0.0.1";
  if (!all_local) {
    if (o_.iface.empty()) {
      advertise = HostName();
    } else {
      CONCORD_ASSIGN_OR_RETURN(advertise, InterfaceAddress(o_.iface));
    }
  }
  CONCORD_ASSIGN_OR_RETURN(server_,
                           TcpStoreServer::Start(all_local ? "127.0.0.1" : "0.0.0.0", 0, token_));
  store_url_ = "tcp://" + net::JoinHostPort(advertise, server_->port());
  CONCORD_RETURN_IF_ERROR(TorchMaster(all_local, advertise));
  return Status::Ok();
}

// torch.distributed's env:// rendezvous (torch's TCPStore, served by rank 0): the launcher's own
// MASTER_ADDR and MASTER_PORT when both are set; else rank 0's address (what the others reach
// this host by when rank 0 runs here) and, on this host, a port free now; a remote rank 0 gets
// torchrun's default port, 29500. Concord itself rendezvouses through CONCORD_STORE, which wins.
Status Launcher::TorchMaster(bool all_local, const std::string& advertise) {
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  if (addr != nullptr && *addr != '\0' && port != nullptr && *port != '\0') {
    master_addr_ = addr;
    master_port_ = port;
    return Status::Ok();
  }
  if (!ranks_.front().local) {
    master_addr_ = ranks_.front().host;
    master_port_ = "29500";
    return Status::Ok();
  }
  master_addr_ = advertise;
  int free_port = 0;
  StatusOr<net::Fd> probe = net::Listen(all_local ? "127.0.0.1" : "0.0.0.0", 0, &free_port);
  if (!probe.ok()) return probe.status().WithContext("finding a free port for MASTER_PORT");
  master_port_ = std::to_string(free_port);
  return Status::Ok();
}

std::vector<std::string> Launcher::JobEnvironment() const {
  std::vector<std::string> env = {"CONCORD_SIZE=" + std::to_string(o_.np),
                                  "CONCORD_STORE=" + store_url_,
                                  "CONCORD_TOKEN=" + token_,
                                  "CONCORD_JOB_ID=" + job_id_,
                                  "WORLD_SIZE=" + std::to_string(o_.np),
                                  "MASTER_ADDR=" + master_addr_,
                                  "MASTER_PORT=" + master_port_};
  if (!o_.iface.empty()) env.push_back("CONCORD_IFACE=" + o_.iface);
  if (!o_.backend.empty()) env.push_back("CONCORD_BACKEND=" + o_.backend);
  if (!o_.timeout.empty()) env.push_back("CONCORD_TIMEOUT_S=" + o_.timeout);
  return env;
}

Status Launcher::Spawn(Rank* r, const std::vector<std::string>& job_env,
                       const sigset_t& child_mask) {
  // Per-rank variables, overriding any inherited ones of the same name.
  std::vector<std::string> vars = job_env;
  vars.push_back("CONCORD_RANK=" + std::to_string(r->rank));
  vars.push_back("CONCORD_LOCAL_RANK=" + std::to_string(r->local_rank));
  vars.push_back("CONCORD_LOCAL_SIZE=" + std::to_string(r->local_size));
  vars.push_back("RANK=" + std::to_string(r->rank));
  vars.push_back("LOCAL_RANK=" + std::to_string(r->local_rank));
  vars.push_back("LOCAL_WORLD_SIZE=" + std::to_string(r->local_size));
  if (r->local && !summary_dir_.empty()) vars.push_back("CONCORD_SUMMARY_DIR=" + summary_dir_);

  // -x NAME=VALUE goes to every rank (local ones inherit NAME anyway), unless it names one of
  // the job's variables, which win (an environment with a name twice is read either way).
  std::set<std::string> job_names;
  for (const std::string& v : vars) job_names.insert(v.substr(0, v.find('=')));
  for (const std::string& x : o_.exports) {
    const size_t eq = x.find('=');
    if (eq != std::string::npos && job_names.insert(x.substr(0, eq)).second) vars.push_back(x);
  }
  std::vector<std::string> args;
  std::vector<std::string> env;
  if (r->local) {
    std::set<std::string> names;
    for (const std::string& v : vars) names.insert(v.substr(0, v.find('=')));
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string v = *e;
      if (names.count(v.substr(0, v.find('='))) == 0) env.push_back(v);
    }
    env.insert(env.end(), vars.begin(), vars.end());
    args = o_.command;
  } else {
    // ssh joins its arguments with spaces for the remote shell, so every word is quoted. The
    // remote shell starts from sshd's environment: the job's settings (CONCORD_*, which must
    // agree across ranks; not those that describe this host or this launcher) and -x NAME's go
    // along, then the job's own variables (they win).
    for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
    std::vector<std::string> remote = JobSettings(environ);
    for (const std::string& x : o_.exports) {
      if (x.find('=') != std::string::npos) continue;  // in vars already
      if (const char* value = std::getenv(x.c_str()); value != nullptr) {
        remote.push_back(x + "=" + value);
      }
    }
    args = {"ssh", "-T", "-o", "BatchMode=yes", r->host, "env"};
    for (const std::string& v : remote) args.push_back(ShellQuote(v));
    for (const std::string& v : vars) args.push_back(ShellQuote(v));
    for (const std::string& a : o_.command) args.push_back(ShellQuote(a));
  }
  std::vector<char*> argv = CArray(args);
  std::vector<char*> envp = CArray(env);

  int out[2];
  int err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return ErrnoError("pipe", errno);
  if (::pipe2(err, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(out[0]);
    ::close(out[1]);
    return ErrnoError("pipe", e);
  }
  net::Fd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  const std::string exec_failed = "concordrun: cannot execute '" + args[0] + "': ";
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Child: only async-signal-safe calls from here to exec.
    // Die with concordrun, even when it is SIGKILLed. The signal comes when the forking thread
    // ends: this is the main thread, which lives as long as concordrun. Had concordrun died
    // before prctl, the parent would already be another process.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) ::_exit(128 + SIGKILL);
    ::setpgid(0, 0);
    if (devnull.valid()) ::dup2(devnull.get(), STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    ::signal(SIGPIPE, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &child_mask, nullptr);
    if (ranks_nofile_) ::setrlimit(RLIMIT_NOFILE, &*ranks_nofile_);
    ::execvpe(argv[0], argv.data(), envp.data());
    const int e = errno;
    ssize_t ignored = ::write(STDERR_FILENO, exec_failed.data(), exec_failed.size());
    const char* text = ::strerror(e);
    ignored = ::write(STDERR_FILENO, text, std::strlen(text));
    ignored = ::write(STDERR_FILENO, "\n", 1);
    (void)ignored;
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(out[1]);
  ::close(err[1]);
  if (pid < 0) {
    ::close(out[0]);
    ::close(err[0]);
    return ErrnoError("fork", fork_errno);
  }
  ::setpgid(pid, pid);  // also here, so that the group exists before we might signal it
  lifeline_->Watch(pid);
  // Non-blocking, so that a reaped rank's output can be read to the end (Reap); the write ends,
  // the rank's, stay blocking.
  ::fcntl(out[0], F_SETFL, O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, O_NONBLOCK);
  r->pid = pid;
  r->running = true;
  r->out = Stream{out[0], STDOUT_FILENO, std::string(), LastWords()};
  r->err = Stream{err[0], STDERR_FILENO, std::string(), LastWords()};
  return Status::Ok();
}

// Writes the complete lines of `partial` with the rank's prefix (and an unfinished one at the end
// or when too long). With --no-prefix ReadStream already wrote the bytes as they came (none added,
// none held back for a newline), and what `partial` keeps only feeds stderr's last words.
void Launcher::Emit(Rank& r, Stream* s, bool final) {
  const std::string prefix = "[" + std::to_string(r.rank) + "] ";
  const bool note = s->to == STDERR_FILENO;
  std::string lines;
  size_t start = 0;
  for (;;) {
    const size_t nl = s->partial.find('\n', start);
    if (nl == std::string::npos) break;
    if (note) s->last.Note(std::string_view(s->partial).substr(start, nl - start));
    if (o_.prefix) {
      lines += prefix;
      lines.append(s->partial, start, nl + 1 - start);
    }
    start = nl + 1;
  }
  s->partial.erase(0, start);
  if (!s->partial.empty() && (final || s->partial.size() >= kMaxLine)) {
    if (note) s->last.Note(s->partial);
    if (o_.prefix) lines += prefix + s->partial + "\n";
    s->partial.clear();
  }
  if (!lines.empty()) Sink(s->to).Write(lines);
}

// Forwards what one read gets; returns whether it got anything.
bool Launcher::ReadStream(Rank& r, Stream* s) {
  char buf[65536];
  const ssize_t n = ::read(s->fd, buf, sizeof(buf));
  if (n > 0) {
    if (!o_.prefix) Sink(s->to).Write(std::string_view(buf, static_cast<size_t>(n)));
    if (o_.prefix || s->to == STDERR_FILENO) s->partial.append(buf, static_cast<size_t>(n));
    Emit(r, s, false);
    return true;
  }
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return false;
  Emit(r, s, true);  // EOF (or a broken pipe): flush the partial last line
  ::close(s->fd);
  s->fd = -1;
  return false;
}

std::string Launcher::SignalRunning(int sig) {
  std::vector<int> signalled;
  for (Rank& r : ranks_) {
    // Only ranks not yet reaped: their pid (and the group they lead) is still ours.
    if (!r.running) continue;
    if (::kill(-r.pid, sig) != 0) ::kill(r.pid, sig);
    if (sig != SIGSTOP && sig != SIGCONT) r.told_to_end = true;
    signalled.push_back(r.rank);
  }
  std::string list;
  for (size_t i = 0; i < signalled.size(); ++i) {
    list += (i == 0 ? (signalled.size() == 1 ? "rank " : "ranks ") : ", ") +
            std::to_string(signalled[i]);
  }
  return list;
}

// Signals the ranks still running (SIGTERM, or the signal concordrun got) and continues them, so
// that a stopped rank (SIGSTOP) acts on it; returns them as SignalRunning() does.
std::string Launcher::Terminate(int sig) {
  const std::string who = SignalRunning(sig);
  SignalRunning(SIGCONT);
  return who;
}

// Terminate(sig)s the ranks, SIGKILL to follow after kill_after.
void Launcher::Stop(int sig, Clock::duration kill_after) {
  Terminate(sig);
  ending_ = Ending::kTerminated;
  next_step_at_ = Clock::now() + kill_after;
}

void Launcher::Kill() {
  SignalRunning(SIGKILL);
  ending_ = Ending::kKilled;
}

// The job is over, every rank reaped: what they started in their process groups and left running
// (a background `cmd &`) is killed, as the lifeline would if concordrun died, and said.
void Launcher::StopLeftovers() {
  std::string left;
  for (Rank& r : ranks_) {
    // Never started (pid -1: kill(1, ...)), or its group was empty when it was reaped (its
    // number may belong to another group by now).
    if (r.running || r.pid <= 0 || !r.left_group) continue;
    if (::kill(-r.pid, SIGKILL) == 0) left += (left.empty() ? "" : ", ") + std::to_string(r.rank);
  }
  if (!left.empty()) {
    Message("killed what rank(s) " + left +
            " left running in their process groups after the job ended (start a process that "
            "must outlive the job with setsid)");
  }
}

void Launcher::RemoveLeftSegments() {
  int removed = 0;
  for (const Rank& r : ranks_) {
    if (r.local && r.pid > 0 && !r.running) removed += RemoveSegmentsOf(r.pid);
  }
  if (removed > 0) {
    Message("removed " + std::to_string(removed) +
            " shared-memory segment(s) the ranks left in /dev/shm (ranks that ended during its "
            "set-up)");
  }
}

void Launcher::Reap() {
  for (Rank& r : ranks_) {
    if (!r.running) continue;
    int status = 0;
    if (::waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
    r.running = false;
    // A group with no process left is forgotten, since its number may be reused.
    if (::kill(-r.pid, 0) != 0 && errno == ESRCH) {
      lifeline_->Forget(r.pid);
    } else {
      r.left_group = true;
    }
    // Its output is in the pipes now (unless its children still write): forwarded first, it
    // comes before what concordrun says about the rank, and its last words are known.
    for (Stream* st : {&r.out, &r.err}) {
      for (int i = 0; i < kMaxDrainReads && st->fd >= 0 && ReadStream(r, st); ++i) {
      }
    }
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) RankFailed(r, status);
  }
}

// A rank exited non-zero or was killed. The first failure, before anything else went wrong,
// decides the job's exit status and starts its ending. Later ones that concordrun did not cause
// (by a signal) are listed in one line at the end: a rank that fails by itself after a peer's
// failure (crashes while handling it, fails its checks at exit, a sanitizer's report at exit)
// must not pass unnoticed behind the first failure's status.
void Launcher::RankFailed(Rank& r, int status) {
  if (ending_ != Ending::kNone || stop_requested_) {
    if (!r.told_to_end) {
      later_failures_.push_back("rank " + std::to_string(r.rank) + " " + HowItEnded(status));
    }
    return;
  }
  exit_code_ = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
  first_failure_ = "rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ") " +
                   HowItEnded(status);
  LastWords last = r.err.last;
  if (!r.err.partial.empty()) last.Note(r.err.partial);  // a last line without its newline
  first_words_ = last.Describe();
  others_ran_on_ = AnyRunning();
  Message(first_failure_ + (others_ran_on_ ? ", the first rank to fail" : "") + first_words_);
  if (!others_ran_on_) return;
  if (o_.grace_s <= 0) {
    Message("stopping the other ranks (--grace 0): SIGTERM, SIGKILL in " +
            std::to_string(kKillDelay.count()) + " s");
    Stop(SIGTERM, kKillDelay);
    return;
  }
  Message("the other ranks have " + Seconds(o_.grace_s) +
          " to exit by themselves (--grace), then get SIGTERM");
  ending_ = Ending::kGrace;
  next_step_at_ = Clock::now() + Grace();
}

// Moves the ending on when its time has come: grace over, SIGTERM; SIGTERM ignored, SIGKILL.
void Launcher::Escalate() {
  if (!AnyRunning() || Clock::now() < next_step_at_) return;
  if (ending_ == Ending::kGrace) {
    const std::string who = Terminate(SIGTERM);
    Message(who + " still running " + Seconds(o_.grace_s) + " after " +
            first_failure_.substr(0, first_failure_.find(" (")) + " failed: sent SIGTERM, " +
            "SIGKILL in " + std::to_string(kKillDelay.count()) + " s");
    ending_ = Ending::kTerminated;
    next_step_at_ = Clock::now() + kKillDelay;
  } else if (ending_ == Ending::kTerminated) {
    Message(SignalRunning(SIGKILL) + " still running: sent SIGKILL");
    ending_ = Ending::kKilled;
  }
}

// SIGINT, SIGTERM or SIGHUP to concordrun: forwarded (SIGHUP as SIGTERM), SIGKILL after the grace
// period; a second one: SIGKILL now. Output nobody reads is then waited for only briefly.
void Launcher::Signalled(int sig) {
  stop_requested_ = true;
  if (ending_ == Ending::kNone || ending_ == Ending::kGrace) {
    Message("received " + SignalName(sig) + "; stopping the ranks");
    if (exit_code_ == 0) exit_code_ = 128 + sig;
    Stop(sig == SIGHUP ? SIGTERM : sig, Grace());
  } else if (ending_ == Ending::kTerminated) {
    Message("received " + SignalName(sig) + " again; killing the ranks");
    Kill();
  }
}

// Stops this process with `sig`, one of the signals concordrun blocks and reads from its signalfd
// (whose default action is to stop): raised, then unblocked for a moment, which delivers it.
// Returns once the process is continued (SIGCONT), or at once when the kernel discards the signal
// (an orphaned process group is not stopped by SIGTSTP, SIGTTIN or SIGTTOU).
void StopThisProcess(int sig) {
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  ::raise(sig);
  ::pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  ::pthread_sigmask(SIG_BLOCK, &one, nullptr);
}

// SIGTSTP (Ctrl-Z), SIGTTIN or SIGTTOU: the job stops as a whole, as under mpirun. The ranks lead
// process groups of their own, which the terminal's Ctrl-Z does not reach: they get SIGSTOP, then
// concordrun stops itself with `sig`; continued (fg, bg, SIGCONT), it continues them. The pending
// step of a failed job's ending (SIGTERM after the grace period, SIGKILL) moves on by the time
// the job was stopped, so that the ranks lose none of their time.
void Launcher::Suspend(int sig) {
  SignalRunning(SIGSTOP);
  const Clock::time_point stopped_at = Clock::now();
  StopThisProcess(sig);
  if (ending_ == Ending::kGrace || ending_ == Ending::kTerminated) {
    next_step_at_ += Clock::now() - stopped_at;
  }
  SignalRunning(SIGCONT);
}

bool Launcher::AnyRunning() const {
  for (const Rank& r : ranks_) {
    if (r.running) return true;
  }
  return false;
}

bool Launcher::AnyStreamOpen() const {
  for (const Rank& r : ranks_) {
    if (r.out.fd >= 0 || r.err.fd >= 0) return true;
  }
  return false;
}

// Flushes whatever is left of partial lines from streams still open after the drain period.
void Launcher::CloseStreams() {
  for (Rank& r : ranks_) {
    for (Stream* st : {&r.out, &r.err}) {
      if (st->fd < 0) continue;
      Emit(r, st, true);
      ::close(st->fd);
      st->fd = -1;
    }
  }
}

// Prints the job summary from the ranks' files and removes their directory.
void Launcher::Summarize() {
  if (summary_dir_.empty()) return;
  std::vector<std::string> remote_hosts;
  for (const Rank& r : ranks_) remote_hosts.push_back(r.local ? std::string() : r.host);
  Sink(STDERR_FILENO).Write(SummarizeJob(summary_dir_, remote_hosts));
  const Status removed = RemoveSummaryDir(summary_dir_);
  if (!removed.ok()) Message("cannot remove the summary directory: " + removed.message());
}

// The signals waiting on the signalfd, SIGCHLD left out (children are reaped by polling waitpid).
std::vector<int> ReadSignals(int sigfd) {
  std::vector<int> signals;
  signalfd_siginfo info;
  while (::read(sigfd, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
    if (info.ssi_signo != SIGCHLD) signals.push_back(static_cast<int>(info.ssi_signo));
  }
  return signals;
}

bool IsJobControl(int sig) {
  return sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU;
}

// Forwards output, reaps ranks and handles signals until every rank has ended and its output is
// drained. Nothing here waits for concordrun's own readers: its output goes out through
// OutputSinks, written when poll() says they have room. A rank whose output finds its sink full
// (a reader that stalls) is not read until the sink has room again, which holds the rank up in its
// own writes; the supervision goes on. After the last rank has ended, the pipes are read for
// kDrainPeriod more (for what the ranks' children write), a period that starts over while a sink
// is full, unless concordrun was told to stop.
void Launcher::Supervise(int sigfd) {
  Clock::time_point drain_until = Clock::time_point::max();
  std::vector<pollfd> fds;
  std::vector<OutputSink*> sinks;
  std::vector<Stream*> streams;
  std::vector<Rank*> owners;
  for (;;) {
    Reap();
    fds.clear();
    sinks.clear();
    streams.clear();
    owners.clear();
    fds.push_back({sigfd, POLLIN, 0});
    for (OutputSink* sink : PendingSinks()) {
      fds.push_back({sink->fd(), POLLOUT, 0});
      sinks.push_back(sink);
    }
    bool throttled = false;
    for (Rank& r : ranks_) {
      for (Stream* st : {&r.out, &r.err}) {
        if (st->fd < 0) continue;
        if (Throttled(*st)) {
          throttled = true;
          continue;
        }
        fds.push_back({st->fd, POLLIN, 0});
        streams.push_back(st);
        owners.push_back(&r);
      }
    }
    if (!AnyRunning()) {
      if (drain_until == Clock::time_point::max() || (throttled && !stop_requested_)) {
        drain_until = Clock::now() + kDrainPeriod;
      }
      if (!AnyStreamOpen() || Clock::now() >= drain_until) return;
    }
    Escalate();

    Deadline wake = Deadline::Infinite();
    if (AnyRunning() && (ending_ == Ending::kGrace || ending_ == Ending::kTerminated)) {
      wake = Until(next_step_at_);
    }
    if (drain_until != Clock::time_point::max()) wake = wake.Earlier(Until(drain_until));
    const int rc = ::poll(fds.data(), fds.size(), wake.PollTimeoutMs());
    if (rc < 0 && errno != EINTR) {
      Message(ErrnoError("poll", errno).message());
      Kill();
      exit_code_ = 1;
      continue;
    }
    if (rc <= 0) continue;
    for (size_t i = 0; i < sinks.size(); ++i) {
      if (fds[1 + i].revents != 0) sinks[i]->Flush();
    }
    for (size_t i = 0; i < streams.size(); ++i) {
      if (fds[1 + sinks.size() + i].revents != 0) ReadStream(*owners[i], streams[i]);
    }
    if (fds[0].revents & POLLIN) {
      for (int sig : ReadSignals(sigfd)) {
        if (IsJobControl(sig)) {
          Suspend(sig);
        } else {
          Signalled(sig);
        }
      }
    }
  }
}

// After the job: waits until concordrun's output is written, for as long as its readers take
// their time (as any program writing to a pipe would); once concordrun was told to stop, for
// kDrainPeriod at most. A SIGINT, SIGTERM or SIGHUP now gives up at once (exit status 128 + the
// signal if the job had succeeded). What is given up is said on stderr, when stderr still takes it.
void Launcher::FlushOutput(int sigfd) {
  const Deadline give_up = stop_requested_ ? Deadline::After(kDrainPeriod) : Deadline::Infinite();
  std::vector<pollfd> fds;
  for (std::vector<OutputSink*> sinks = PendingSinks(); !sinks.empty(); sinks = PendingSinks()) {
    fds.assign(1, {sigfd, POLLIN, 0});
    for (OutputSink* sink : sinks) fds.push_back({sink->fd(), POLLOUT, 0});
    const int rc = ::poll(fds.data(), fds.size(), give_up.PollTimeoutMs());
    bool stop = (rc < 0 && errno != EINTR) || give_up.passed();
    for (size_t i = 0; rc > 0 && i < sinks.size(); ++i) {
      if (fds[1 + i].revents != 0) sinks[i]->Flush();
    }
    std::vector<int> signals;
    if (rc > 0 && (fds[0].revents & POLLIN)) signals = ReadSignals(sigfd);
    for (int sig : signals) {
      if (IsJobControl(sig)) {
        Suspend(sig);
      } else {
        if (exit_code_ == 0) exit_code_ = 128 + sig;
        stop = true;
      }
    }
    if (!stop) continue;
    size_t dropped = 0;
    for (OutputSink* sink : PendingSinks()) dropped += sink->Abandon();
    if (dropped > 0) {
      Message("gave up on " + std::to_string(dropped) + " bytes of output that were not read");
    }
    return;
  }
}

int Launcher::Run() {
  if (o_.summary) {
    StatusOr<std::string> dir = MakeSummaryDir();
    if (!dir.ok()) Message("no job summary: " + dir.status().message());
    summary_dir_ = dir.ok() ? dir.value() : std::string();
  }
  // First, while this process has one thread: the lifeline is a fork that goes on running. It
  // removes the summary directory if concordrun is killed (kill -9 left one in $TMPDIR per job).
  StatusOr<std::unique_ptr<Lifeline>> lifeline = Lifeline::Start(summary_dir_);
  if (!lifeline.ok()) {
    return StartFailed("cannot start the job: " + lifeline.status().ToString(), -1);
  }
  lifeline_ = std::move(lifeline.value());
  // Signals arrive through a signalfd; they are blocked in every thread, including the store
  // server's, which is why this happens before Setup() starts it.
  sigset_t handled;
  sigset_t original;
  sigemptyset(&handled);
  sigaddset(&handled, SIGCHLD);
  sigaddset(&handled, SIGINT);
  sigaddset(&handled, SIGTERM);
  // SIGHUP stops the job, and Ctrl-Z and its kin stop it for a while (Suspend), unless they were
  // ignored when concordrun started (`nohup concordrun ...`): then they stay ignored, here and in
  // the ranks. (A blocked signal is queued even when ignored, so the signalfd would read it.)
  for (int sig : {SIGHUP, SIGTSTP, SIGTTIN, SIGTTOU}) {
    struct sigaction current;
    if (::sigaction(sig, nullptr, &current) == 0 && current.sa_handler != SIG_IGN) {
      sigaddset(&handled, sig);
    }
  }
  ::sigprocmask(SIG_BLOCK, &handled, &original);
  ::signal(SIGPIPE, SIG_IGN);
  net::Fd sigfd(::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!sigfd.valid()) return StartFailed(ErrnoError("signalfd", errno).message(), -1);
  Status s = Setup();
  if (!s.ok()) return StartFailed("cannot start the job: " + s.ToString(), sigfd.get());
  const std::vector<std::string> job_env = JobEnvironment();
  for (Rank& r : ranks_) {
    s = Spawn(&r, job_env, original);
    if (!s.ok()) {
      Message("cannot start rank " + std::to_string(r.rank) + ": " + s.ToString() +
              "; stopping the other ranks");
      exit_code_ = 1;
      Stop(SIGTERM, kKillDelay);
      break;
    }
  }
  Supervise(sigfd.get());
  CloseStreams();
  StopLeftovers();
  RemoveLeftSegments();
  lifeline_->Release();
  Summarize();
  // The first failure again, below what the other ranks said after it.
  if (others_ran_on_) Message("the job failed: " + first_failure_ + " first" + first_words_);
  if (!later_failures_.empty()) {
    std::string list;
    for (size_t i = 0; i < later_failures_.size() && i < kMaxListedFailures; ++i) {
      list += (i == 0 ? "" : ", ") + later_failures_[i];
    }
    if (later_failures_.size() > kMaxListedFailures) {
      list += " and " + std::to_string(later_failures_.size() - kMaxListedFailures) + " more";
    }
    Message("also failed after it, by themselves: " + list);
  }
  FlushOutput(sigfd.get());
  return exit_code_;
}

// The store server holds a descriptor for each connection of each rank: concordrun raises its own
// soft limit on open files to the hard one (best effort). Returns the limit it started with, which
// the ranks get, when it raised it.
std::optional<rlimit> RaiseDescriptorLimit() {
  rlimit started;
  if (::getrlimit(RLIMIT_NOFILE, &started) != 0 || started.rlim_cur >= started.rlim_max) {
    return std::nullopt;
  }
  rlimit raised = started;
  raised.rlim_cur = raised.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &raised) != 0) return std::nullopt;
  return started;
}

// This process's limit on open files now (its soft RLIMIT_NOFILE).
int64_t DescriptorLimit() {
  rlimit now;
  if (::getrlimit(RLIMIT_NOFILE, &now) != 0 || now.rlim_cur == RLIM_INFINITY ||
      now.rlim_cur > static_cast<rlim_t>(INT64_MAX)) {
    return INT64_MAX;
  }
  return static_cast<int64_t>(now.rlim_cur);
}

// The descriptors this process has open: /proc/self/fd's entries but the one reading it (3, for
// stdin, stdout and stderr, where /proc cannot tell).
int64_t OpenDescriptors() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return 3;
  int64_t n = 0;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(dir);
  return n - 1;
}

// Says why the job could not start, once stderr takes it; returns the exit status, 1. `sigfd` is
// the signalfd, or -1 before there is one.
int Launcher::StartFailed(const std::string& why, int sigfd) {
  Message(why);
  if (!summary_dir_.empty()) (void)RemoveSummaryDir(summary_dir_);
  FlushOutput(sigfd);
  return 1;
}

}  // namespace
}  // namespace concord

int main(int argc, char** argv) {
  concord::Options options = concord::ParseArgs(argc, argv);
  // Before anything starts: a program the ranks here cannot execute is a usage error (exit 2).
  if (concord::SomeRankRunsHere(options)) concord::CheckProgram(options);
  if (options.backend == "mpi") return concord::ExecMpirun(options);
  // Before anything starts: a job too large for the descriptors is a usage error (exit 2).
  const std::optional<rlimit> ranks_nofile = concord::RaiseDescriptorLimit();
  concord::CheckDescriptorLimit(options, concord::OpenDescriptors(), concord::DescriptorLimit());
  concord::Launcher launcher(std::move(options), ranks_nofile);
  return launcher.Run();
}
