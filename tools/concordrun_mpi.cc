// concordrun --backend mpi: concordrun becomes mpirun (see concordrun.cc's file comment).
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tools/concordrun_options.h"

namespace concord {

#ifndef CONCORD_MPIRUN_PATH
#define CONCORD_MPIRUN_PATH "mpirun"
#endif

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
  // When a rank fails, Open MPI (4.x) waits this long before SIGTERM to the others, and again
  // before SIGKILL: the nearest it has to the grace period.
  args.insert(args.end(), {"--mca", "odls_base_sigkill_timeout",
                           std::to_string(static_cast<int>(std::ceil(o.grace_s)))});
  args.insert(args.end(), {"-x", "CONCORD_BACKEND=mpi"});
  if (!o.timeout.empty()) args.insert(args.end(), {"-x", "CONCORD_TIMEOUT_S=" + o.timeout});
  if (!o.iface.empty()) {
    args.insert(args.end(), {"-x", "CONCORD_IFACE=" + o.iface, "--mca", "btl_tcp_if_include",
                             o.iface, "--mca", "oob_tcp_if_include", o.iface});
  }
  // The job's settings reach every rank, on any host, as they do over ssh; those set above win.
  for (const std::string& v : JobSettings(environ)) {
    const std::string name = v.substr(0, v.find('='));
    if (name == "CONCORD_BACKEND" || (name == "CONCORD_TIMEOUT_S" && !o.timeout.empty())) continue;
    args.insert(args.end(), {"-x", name});
  }
  for (const std::string& x : o.exports) args.insert(args.end(), {"-x", x});  // as mpirun's -x
  args.insert(args.end(), o.command.begin(), o.command.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  std::fprintf(stderr, "concordrun: cannot run %s for --backend mpi: %s (set CONCORD_MPIRUN)\n",
               mpirun.c_str(), std::strerror(errno));
  return 127;
}

}  // namespace concord
