#include "tools/concordrun_options.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "rendezvous/net.h"

namespace concord {
namespace {

// The longest --grace (a day, as CONCORD_TIMEOUT_S).
constexpr double kMaxSeconds = 86400;
// The most ranks of a job (-np), and slots of a host (-H).
constexpr int kMaxRanks = 1000000;
// Descriptors concordrun holds per rank while the job runs: the read ends of the rank's stdout
// and stderr pipes, and the rank's connection to the store concordrun serves.
constexpr int64_t kDescriptorsPerRank = 3;
// Concordrun's own beyond those it has when it checks: the signalfd, the store's listening socket
// and wake-up eventfd, the lifeline's pipe, its reopened stdout and stderr, the summary directory
// while it is read, and the pipes and /dev/null of the rank being started.
constexpr int64_t kOwnDescriptors = 16;

const char kUsage[] =
    "usage: concordrun -np N [-H host:slots,...] [--iface IF] [--backend NAME] [--timeout S]\n"
    "                  [--grace S] [--no-prefix] [--no-summary] [-x NAME[=VALUE]]...\n"
    "                  prog [args...]\n"
    "  -np N            number of ranks (1 to 1000000; concordrun needs 3 open files\n"
    "                   per rank: see ulimit -n)\n"
    "  -H LIST          hosts and their slots, e.g. node1:4,node2:4 (default: N local ranks);\n"
    "                   ranks fill the hosts in order; remote hosts are reached with ssh\n"
    "  --iface IF       network interface for Concord traffic (passed as CONCORD_IFACE; also the\n"
    "                   address the store is advertised on when some ranks are remote)\n"
    "  --backend NAME   passed as CONCORD_BACKEND; with mpi, concordrun execs mpirun instead\n"
    "                   of starting the ranks itself (CONCORD_MPIRUN overrides which mpirun)\n"
    "  --timeout S      passed as CONCORD_TIMEOUT_S (seconds)\n"
    "  --grace S        when a rank fails, the others have S seconds to see the error and exit\n"
    "                   by themselves, then get SIGTERM, and SIGKILL 3 s later; a SIGINT or\n"
    "                   SIGTERM to concordrun goes to the ranks at once, SIGKILL S seconds later\n"
    "                   (default: CONCORD_GRACE_S, else 5; with mpi, mpirun's kill timeout)\n"
    "  --no-prefix      pass the ranks' output through as it is (no \"[rank] \" prefixes)\n"
    "  -x NAME[=VALUE]  NAME=VALUE for every rank; NAME: this environment's NAME for remote\n"
    "                   ranks too (local ranks inherit this environment; remote ones get its\n"
    "                   CONCORD_* variables but those of this host: HOST, HOST_ID, IFACE, ...)\n"
    "  --no-summary     do not print the job summary at the end (per rank: time in\n"
    "                   collectives, bytes, slowest phase, straggler share; ranks on this\n"
    "                   host write it at finalize into CONCORD_SUMMARY_DIR; not with mpi)\n";

[[noreturn]] void UsageError(const std::string& message) {
  std::fprintf(stderr, "concordrun: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

bool ParsePositiveInt(const std::string& text, int* value) {
  int64_t v = 0;
  if (text.empty() || text[0] == '+' || text[0] == '-' || !net::ParseInt64(text, &v) || v < 1 ||
      v > kMaxRanks) {
    return false;
  }
  *value = static_cast<int>(v);
  return true;
}

// A number of seconds as the library reads CONCORD_TIMEOUT_S (core/config.cc), so that concordrun
// refuses what every rank would: strtod's decimal syntax, without hexadecimal or leading blanks,
// finite and in a double's range; > 0 (or >= 0 when zero is allowed), at most `max`.
bool ParseSeconds(const std::string& text, bool zero_ok, double max, double* seconds) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) ||
      text.find_first_of("xX") != std::string::npos) {
    return false;
  }
  errno = 0;
  char* end = nullptr;
  const double s = std::strtod(text.c_str(), &end);
  if (*end != '\0' || errno == ERANGE || !(zero_ok ? s >= 0 : s > 0) || !(s <= max)) return false;
  *seconds = s;
  return true;
}

double ParseGrace(const std::string& where, const std::string& text) {
  double s = 0;
  if (!ParseSeconds(text, true, kMaxSeconds, &s)) {
    UsageError(where + " must be a number of seconds from 0 to 86400, not '" + text + "'");
  }
  return s;
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
    // ssh would take it for an option.
    if (h.host[0] == '-') UsageError("-H: '" + h.host + "' is not a host name");
    if (colon != std::string::npos && !ParsePositiveInt(item.substr(colon + 1), &h.slots)) {
      UsageError("-H: slots must be an integer from 1 to " + std::to_string(kMaxRanks) + " in '" +
                 item + "'");
    }
    hosts.push_back(h);
    start = comma + 1;
  }
  return hosts;
}

}  // namespace

Options ParseArgs(int argc, char** argv) {
  Options o;
  // The options given so far, by the name their usage error gives. Each is refused a second time:
  // the last would win silently (-x repeats, for other variables).
  std::set<std::string> given;
  const std::string np_option = "-np (or -n)";
  auto once = [&given](const std::string& name) {
    if (!given.insert(name).second) UsageError(name + " given more than once");
  };
  std::set<std::string> exported;  // -x's variable names
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
      once(np_option);
      const std::string v = value(a);
      if (!ParsePositiveInt(v, &o.np)) {
        UsageError("-np must be an integer from 1 to " + std::to_string(kMaxRanks) + ", not '" + v +
                   "'");
      }
    } else if (a == "-H" || a == "--host") {
      once("-H (or --host)");
      o.hosts = ParseHosts(value(a));
    } else if (a == "--iface") {
      once(a);
      o.iface = value(a);
      if (o.iface.empty()) UsageError("--iface must not be empty");
    } else if (a == "--backend") {
      once(a);
      o.backend = value(a);
      if (o.backend != "gloo" && o.backend != "gloo-ibverbs" && o.backend != "mpi" &&
          o.backend != "nccl" && o.backend != "auto") {
        UsageError("--backend must be gloo, gloo-ibverbs, mpi, nccl or auto, not '" + o.backend +
                   "'");
      }
    } else if (a == "--timeout") {
      once(a);
      o.timeout = value(a);
      double ignored = 0;
      // The library's range (CONCORD_TIMEOUT_S): refused here, not by every rank after launch.
      if (!ParseSeconds(o.timeout, false, kMaxSeconds, &ignored)) {
        UsageError("--timeout must be a number of seconds above 0 and at most 86400, not '" +
                   o.timeout + "'");
      }
    } else if (a == "--grace") {
      once(a);
      o.grace_s = ParseGrace("--grace", value(a));
    } else if (a == "-x") {
      const std::string v = value(a);
      const std::string name = v.substr(0, v.find('='));
      // A shell's variable name: letters, digits and '_', not starting with a digit.
      if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0])) ||
          name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                 "0123456789_") != std::string::npos) {
        UsageError("-x takes NAME or NAME=VALUE with a variable name, not '" + v + "'");
      }
      if (!exported.insert(name).second) UsageError("-x " + name + " given more than once");
      o.exports.push_back(v);
    } else if (a == "--no-prefix") {
      once(a);
      o.prefix = false;
    } else if (a == "--no-summary") {
      once(a);
      o.summary = false;
    } else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      UsageError("unknown option '" + a + "'");
    }
  }
  for (; i < argc; ++i) o.command.push_back(argv[i]);
  // --grace wins over the variable, which is then not even read.
  if (const char* grace = std::getenv("CONCORD_GRACE_S");
      given.count("--grace") == 0 && grace != nullptr && *grace != '\0') {
    o.grace_s = ParseGrace("CONCORD_GRACE_S", grace);
  }
  if (given.count(np_option) == 0) UsageError("-np is required");
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

void CheckProgram(const Options& o) {
  const std::string& program = o.command.front();
  auto executable = [](const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
           ::access(path.c_str(), X_OK) == 0;
  };
  if (program.find('/') != std::string::npos) {
    if (executable(program)) return;
    const bool exists = ::access(program.c_str(), F_OK) == 0;
    UsageError("cannot run '" + program +
               "': " + (exists ? "not an executable file" : "no such file"));
  }
  // execvp's search: PATH's directories in order (an empty one is the current directory), or,
  // without PATH, its default.
  const char* path = std::getenv("PATH");
  const std::string dirs = path != nullptr ? path : "/bin:/usr/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t colon = std::min(dirs.find(':', start), dirs.size());
    const std::string dir = dirs.substr(start, colon - start);
    if (executable((dir.empty() ? "." : dir) + "/" + program)) return;
    start = colon + 1;
  }
  UsageError("cannot run '" + program + "': no executable file of that name in PATH");
}

void CheckDescriptorLimit(const Options& o, int64_t open_now, int64_t limit) {
  const int64_t needed = kDescriptorsPerRank * o.np + open_now + kOwnDescriptors;
  if (needed <= limit) return;
  const std::string n = std::to_string(needed);
  UsageError("-np " + std::to_string(o.np) + " needs about " + n + " open files in concordrun (" +
             std::to_string(kDescriptorsPerRank) +
             " per rank: its stdout and stderr pipes and its store connection; " +
             std::to_string(open_now + kOwnDescriptors) + " of its own), more than its limit of " +
             std::to_string(limit) +
             " (RLIMIT_NOFILE, raised to the hard limit): raise the limit in the shell that starts "
             "concordrun (ulimit -n " +
             n +
             "; above ulimit -Hn that needs root, or nofile in /etc/security/limits.conf) or "
             "run fewer ranks");
}

std::vector<std::string> JobSettings(char** environ) {
  static const std::set<std::string> kThisHostOnly = {
      "CONCORD_HOST",         "CONCORD_HOST_ID", "CONCORD_IFACE",
      "CONCORD_METRICS_PORT", "CONCORD_LIBRARY", "CONCORD_BUILD_DIR",
      "CONCORD_MPIRUN",       "CONCORD_GRACE_S", "CONCORD_SUMMARY_DIR"};
  std::vector<std::string> settings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string v = *e;
    if (v.rfind("CONCORD_", 0) == 0 && kThisHostOnly.count(v.substr(0, v.find('='))) == 0) {
      settings.push_back(v);
    }
  }
  return settings;
}

}  // namespace concord
