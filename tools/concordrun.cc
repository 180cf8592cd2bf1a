// concordrun: starts an N-rank Concord job on this host (fork/exec) and on remote hosts (ssh).
//
//   concordrun -np N [-H host:slots,...] [--iface IF] [--backend NAME] [--timeout S] [--no-prefix]
//              prog args...
//
// It runs the job's TCP store server (authenticated with a random token), gives every rank its
// CONCORD_* environment, forwards each rank's stdout/stderr line by line with a "[R] " prefix, and
// supervises: when a rank fails (non-zero exit, signal) or concordrun itself gets SIGINT/SIGTERM,
// the other ranks get SIGTERM, then SIGKILL after a grace period. It signals only the processes it
// started (each local rank leads its own process group, so its children are stopped with it).
// Exit status: 0 when every rank exits 0; 1 when a rank exited non-zero; 128+S when a rank was
// killed by signal S or concordrun received signal S; 2 for usage errors.
//
// With --backend mpi, concordrun does none of that itself: it execs mpirun (CONCORD_MPIRUN, else
// the mpirun found at build time, else "mpirun" on PATH) with -np, the hosts of -H,
// --oversubscribe when there are more ranks than CPUs here, --tag-output unless --no-prefix, and
// CONCORD_BACKEND=mpi (plus CONCORD_TIMEOUT_S and CONCORD_IFACE when given) exported to every
// rank; mpirun then starts, supervises and stops the ranks, and its exit status is concordrun's.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "rendezvous/net.h"
#include "rendezvous/tcp_store.h"

extern char** environ;

namespace concord {
namespace {

constexpr auto kGracePeriod = std::chrono::seconds(5);
// After the last rank exits, how long to keep reading output that its children may still write.
constexpr auto kDrainPeriod = std::chrono::seconds(1);
// A line longer than this is forwarded in pieces.
constexpr size_t kMaxLine = 1 << 20;

const char kUsage[] =
    "usage: concordrun -np N [-H host:slots,...] [--iface IF] [--backend NAME] [--timeout S]\n"
    "                  [--no-prefix] prog [args...]\n"
    "  -np N            number of ranks (>= 1)\n"
    "  -H LIST          hosts and their slots, e.g. node1:4,node2:4 (default: N local ranks);\n"
    "                   ranks fill the hosts in order; remote hosts are reached with ssh\n"
    "  --iface IF       network interface for Concord traffic (passed as CONCORD_IFACE; also the\n"
    "                   address the store is advertised on when some ranks are remote)\n"
    "  --backend NAME   passed as CONCORD_BACKEND; with mpi, concordrun execs mpirun instead\n"
    "                   of starting the ranks itself (CONCORD_MPIRUN overrides which mpirun)\n"
    "  --timeout S      passed as CONCORD_TIMEOUT_S (seconds)\n"
    "  --no-prefix      do not prefix output lines with \"[rank] \"\n";

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
  bool prefix = true;
  std::vector<std::string> command;
};

// One rank's output stream (stdout or stderr) on its way to ours.
struct Stream {
  int fd = -1;  // read end of the pipe; -1 once closed
  int to = -1;  // STDOUT_FILENO or STDERR_FILENO
  std::string partial;
};

struct Rank {
  int rank = 0;
  std::string host;
  bool local = true;
  int local_rank = 0;
  int local_size = 1;
  pid_t pid = -1;
  bool running = false;
  Stream out;
  Stream err;
};

[[noreturn]] void UsageError(const std::string& message) {
  std::fprintf(stderr, "concordrun: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

bool ParsePositiveInt(const std::string& text, int* value) {
  int64_t v = 0;
  if (text.empty() || text[0] == '+' || text[0] == '-' || !net::ParseInt64(text, &v) || v < 1 ||
      v > 1000000) {
    return false;
  }
  *value = static_cast<int>(v);
  return true;
}

std::vector<HostSlots> ParseHosts(const std::string& list) {
  std::vector<HostSlots> hosts;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string item = list.substr(start, comma - start);
    HostSlots h;
    const size_t colon = item.rfind(':');
    h.host = colon == std::string::npos ? item : item.substr(0, colon);
    if (h.host.empty()) UsageError("-H: empty host name in '" + list + "'");
    if (colon != std::string::npos && !ParsePositiveInt(item.substr(colon + 1), &h.slots)) {
      UsageError("-H: slots must be an integer >= 1 in '" + item + "'");
    }
    hosts.push_back(h);
    start = comma + 1;
  }
  return hosts;
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  bool have_np = false;
  int i = 1;
  auto value = [&](const std::string& flag) -> std::string {
    if (i + 1 >= argc) UsageError(flag + " needs a value");
    return argv[++i];
  };
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.empty() || a[0] != '-') break;
    if (a == "-np" || a == "-n") {
      const std::string v = value(a);
      if (!ParsePositiveInt(v, &o.np)) UsageError("-np must be an integer >= 1, not '" + v + "'");
      have_np = true;
    } else if (a == "-H" || a == "--host") {
      o.hosts = ParseHosts(value(a));
    } else if (a == "--iface") {
      o.iface = value(a);
      if (o.iface.empty()) UsageError("--iface must not be empty");
    } else if (a == "--backend") {
      o.backend = value(a);
      if (o.backend.empty()) UsageError("--backend must not be empty");
    } else if (a == "--timeout") {
      o.timeout = value(a);
      char* end = nullptr;
      const double s = std::strtod(o.timeout.c_str(), &end);
      if (o.timeout.empty() || *end != '\0' || !(s > 0)) {
        UsageError("--timeout must be a positive number of seconds, not '" + o.timeout + "'");
      }
    } else if (a == "--no-prefix") {
      o.prefix = false;
    } else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      UsageError("unknown option '" + a + "'");
    }
  }
  for (; i < argc; ++i) o.command.push_back(argv[i]);
  if (!have_np) UsageError("-np is required");
  if (o.command.empty()) UsageError("no program to run");
  if (!o.hosts.empty()) {
    int64_t total = 0;
    for (const HostSlots& h : o.hosts) total += h.slots;
    if (total < o.np) {
      UsageError("-H offers " + std::to_string(total) + " slots, fewer than -np " +
                 std::to_string(o.np));
    }
  }
  return o;
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

// Writes all bytes, retrying on EINTR; output errors (a closed terminal) are ignored on purpose:
// supervising the ranks matters more than their output.
void WriteOut(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
    } else {
      return;
    }
  }
}

void Message(const std::string& text) {
  WriteOut(STDERR_FILENO, "concordrun: " + text + "\n");
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

class Launcher {
 public:
  explicit Launcher(Options options) : o_(std::move(options)) {}
  int Run();

 private:
  Status Setup();
  Status Spawn(Rank* r, const std::vector<std::string>& job_env, const sigset_t& child_mask);
  void Emit(const Rank& r, Stream* s, bool final);
  void ReadStream(const Rank& r, Stream* s);
  void Reap();
  void StopAll(int sig, bool kill_now);
  void Signal(Rank* r, int sig);
  bool AnyRunning() const;
  bool AnyStreamOpen() const;

  Options o_;
  std::vector<Rank> ranks_;
  std::unique_ptr<TcpStoreServer> server_;
  std::string store_url_;
  std::string token_;
  std::string job_id_;
  bool stopping_ = false;
  Clock::time_point kill_at_;
  bool killed_ = false;
  int exit_code_ = 0;
};

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
  return Status::Ok();
}

Status Launcher::Spawn(Rank* r, const std::vector<std::string>& job_env,
                       const sigset_t& child_mask) {
  // Per-rank variables, overriding any inherited ones of the same name.
  std::vector<std::string> vars = job_env;
  vars.push_back("CONCORD_RANK=" + std::to_string(r->rank));
  vars.push_back("CONCORD_LOCAL_RANK=" + std::to_string(r->local_rank));
  vars.push_back("CONCORD_LOCAL_SIZE=" + std::to_string(r->local_size));

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
    // ssh joins its arguments with spaces for the remote shell, so every word is quoted.
    for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
    args = {"ssh", "-T", "-o", "BatchMode=yes", r->host, "env"};
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
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Child: only async-signal-safe calls from here to exec.
    ::setpgid(0, 0);
    if (devnull.valid()) ::dup2(devnull.get(), STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    ::signal(SIGPIPE, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &child_mask, nullptr);
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
  r->pid = pid;
  r->running = true;
  r->out = Stream{out[0], STDOUT_FILENO, std::string()};
  r->err = Stream{err[0], STDERR_FILENO, std::string()};
  return Status::Ok();
}

void Launcher::Emit(const Rank& r, Stream* s, bool final) {
  const std::string prefix = o_.prefix ? "[" + std::to_string(r.rank) + "] " : std::string();
  std::string lines;
  size_t start = 0;
  for (;;) {
    const size_t nl = s->partial.find('\n', start);
    if (nl == std::string::npos) break;
    lines += prefix;
    lines.append(s->partial, start, nl + 1 - start);
    start = nl + 1;
  }
  s->partial.erase(0, start);
  if (!s->partial.empty() && (final || s->partial.size() >= kMaxLine)) {
    lines += prefix + s->partial + "\n";
    s->partial.clear();
  }
  if (!lines.empty()) WriteOut(s->to, lines);
}

void Launcher::ReadStream(const Rank& r, Stream* s) {
  char buf[65536];
  const ssize_t n = ::read(s->fd, buf, sizeof(buf));
  if (n > 0) {
    s->partial.append(buf, static_cast<size_t>(n));
    Emit(r, s, false);
    return;
  }
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  Emit(r, s, true);  // EOF (or a broken pipe): flush the partial last line
  ::close(s->fd);
  s->fd = -1;
}

void Launcher::Signal(Rank* r, int sig) {
  // Only ranks not yet reaped: their pid (and the group they lead) is still ours.
  if (!r->running) return;
  if (::kill(-r->pid, sig) != 0) ::kill(r->pid, sig);
}

void Launcher::StopAll(int sig, bool kill_now) {
  if (!stopping_) {
    stopping_ = true;
    kill_at_ = Clock::now() + kGracePeriod;
    for (Rank& r : ranks_) Signal(&r, sig);
  }
  if (kill_now && !killed_) {
    killed_ = true;
    for (Rank& r : ranks_) Signal(&r, SIGKILL);
  }
}

void Launcher::Reap() {
  for (Rank& r : ranks_) {
    if (!r.running) continue;
    int status = 0;
    const pid_t got = ::waitpid(r.pid, &status, WNOHANG);
    if (got != r.pid) continue;
    r.running = false;
    const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (!failed || stopping_) continue;
    std::string what;
    if (WIFSIGNALED(status)) {
      what = "was killed by signal " + std::to_string(WTERMSIG(status));
      exit_code_ = 128 + WTERMSIG(status);
    } else {
      what = "exited with code " + std::to_string(WEXITSTATUS(status));
      exit_code_ = 1;
    }
    const bool others = AnyRunning();
    Message("rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ") " + what +
            (others ? "; stopping the other ranks" : ""));
    StopAll(SIGTERM, false);
  }
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

int Launcher::Run() {
  // Signals arrive through a signalfd; they are blocked in every thread, including the store
  // server's, which is why this happens before Setup() starts it.
  sigset_t handled;
  sigset_t original;
  sigemptyset(&handled);
  sigaddset(&handled, SIGCHLD);
  sigaddset(&handled, SIGINT);
  sigaddset(&handled, SIGTERM);
  sigaddset(&handled, SIGHUP);
  ::sigprocmask(SIG_BLOCK, &handled, &original);
  ::signal(SIGPIPE, SIG_IGN);
  net::Fd sigfd(::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!sigfd.valid()) {
    Message(ErrnoError("signalfd", errno).message());
    return 1;
  }
  Status s = Setup();
  if (!s.ok()) {
    Message("cannot start the job: " + s.ToString());
    return 1;
  }
  std::vector<std::string> job_env = {"CONCORD_SIZE=" + std::to_string(o_.np),
                                      "CONCORD_STORE=" + store_url_, "CONCORD_TOKEN=" + token_,
                                      "CONCORD_JOB_ID=" + job_id_};
  if (!o_.iface.empty()) job_env.push_back("CONCORD_IFACE=" + o_.iface);
  if (!o_.backend.empty()) job_env.push_back("CONCORD_BACKEND=" + o_.backend);
  if (!o_.timeout.empty()) job_env.push_back("CONCORD_TIMEOUT_S=" + o_.timeout);
  for (Rank& r : ranks_) {
    s = Spawn(&r, job_env, original);
    if (!s.ok()) {
      Message("cannot start rank " + std::to_string(r.rank) + ": " + s.ToString() +
              "; stopping the other ranks");
      exit_code_ = 1;
      StopAll(SIGTERM, false);
      break;
    }
  }

  Clock::time_point drain_until = Clock::time_point::max();
  std::vector<pollfd> fds;
  std::vector<Stream*> streams;
  std::vector<const Rank*> owners;
  for (;;) {
    Reap();
    if (!AnyRunning()) {
      if (drain_until == Clock::time_point::max()) drain_until = Clock::now() + kDrainPeriod;
      if (!AnyStreamOpen() || Clock::now() >= drain_until) break;
    }
    if (stopping_ && !killed_ && Clock::now() >= kill_at_) StopAll(SIGKILL, true);

    fds.clear();
    streams.clear();
    owners.clear();
    fds.push_back({sigfd.get(), POLLIN, 0});
    for (Rank& r : ranks_) {
      for (Stream* st : {&r.out, &r.err}) {
        if (st->fd < 0) continue;
        fds.push_back({st->fd, POLLIN, 0});
        streams.push_back(st);
        owners.push_back(&r);
      }
    }
    Deadline wake = Deadline::Infinite();
    if (stopping_ && !killed_) wake = Until(kill_at_);
    if (drain_until != Clock::time_point::max()) wake = wake.Earlier(Until(drain_until));
    const int rc = ::poll(fds.data(), fds.size(), wake.PollTimeoutMs());
    if (rc < 0 && errno != EINTR) {
      Message(ErrnoError("poll", errno).message());
      StopAll(SIGKILL, true);
      exit_code_ = 1;
      continue;
    }
    if (rc <= 0) continue;
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) ReadStream(*owners[i - 1], streams[i - 1]);
    }
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info;
      while (::read(sigfd.get(), &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
        const int sig = static_cast<int>(info.ssi_signo);
        if (sig == SIGCHLD) continue;  // reaped at the top of the loop
        if (!stopping_) {
          const char* abbrev = ::sigabbrev_np(sig);
          Message(
              "received " +
              (abbrev != nullptr ? "SIG" + std::string(abbrev) : "signal " + std::to_string(sig)) +
              "; stopping the ranks");
          if (exit_code_ == 0) exit_code_ = 128 + sig;
          StopAll(sig == SIGHUP ? SIGTERM : sig, false);
        } else {
          StopAll(SIGKILL, true);  // a second signal: no more grace
        }
      }
    }
  }
  // Flush whatever is left of partial lines from streams still open after the drain period.
  for (Rank& r : ranks_) {
    for (Stream* st : {&r.out, &r.err}) {
      if (st->fd < 0) continue;
      Emit(r, st, true);
      ::close(st->fd);
      st->fd = -1;
    }
  }
  return exit_code_;
}

}  // namespace
}  // namespace concord

namespace concord {
namespace {

#ifndef CONCORD_MPIRUN_PATH
#define CONCORD_MPIRUN_PATH "mpirun"
#endif

// --backend mpi: replaces this process with mpirun. Returns only if exec fails.
int ExecMpirun(const Options& o) {
  const char* env_mpirun = std::getenv("CONCORD_MPIRUN");
  const std::string mpirun = env_mpirun && *env_mpirun ? env_mpirun : CONCORD_MPIRUN_PATH;
  std::vector<std::string> args = {mpirun, "-np", std::to_string(o.np)};
  if (!o.hosts.empty()) {
    std::string list;
    for (const HostSlots& h : o.hosts) {
      list += (list.empty() ? "" : ",") + h.host + ":" + std::to_string(h.slots);
    }
    args.insert(args.end(), {"--host", list});
  }
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  if (cpus > 0 && o.np > cpus) args.push_back("--oversubscribe");
  if (o.prefix) args.push_back("--tag-output");
  args.insert(args.end(), {"-x", "CONCORD_BACKEND=mpi"});
  if (!o.timeout.empty()) args.insert(args.end(), {"-x", "CONCORD_TIMEOUT_S=" + o.timeout});
  if (!o.iface.empty()) {
    args.insert(args.end(), {"-x", "CONCORD_IFACE=" + o.iface, "--mca", "btl_tcp_if_include",
                             o.iface, "--mca", "oob_tcp_if_include", o.iface});
  }
  args.insert(args.end(), o.command.begin(), o.command.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  std::fprintf(stderr, "concordrun: cannot run %s for --backend mpi: %s (set CONCORD_MPIRUN)\n",
               mpirun.c_str(), std::strerror(errno));
  return 127;
}

}  // namespace
}  // namespace concord

int main(int argc, char** argv) {
  concord::Options options = concord::ParseArgs(argc, argv);
  if (options.backend == "mpi") return concord::ExecMpirun(options);
  concord::Launcher launcher(std::move(options));
  return launcher.Run();
}
