#include "core/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <locale>
#include <sstream>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "base/c_locale.h"
#include "compression/registry.h"

namespace concord {
namespace {

// The first of `names` that is set, with its name.
bool FirstSet(std::initializer_list<const char*> names, std::string* value, std::string* which) {
  for (const char* n : names) {
    const char* v = std::getenv(n);
    if (v != nullptr && *v != '\0') {
      *value = v;
      *which = n;
      return true;
    }
  }
  return false;
}

// Reads variables into one Config, noting in its `sources` which variable gave each member.
class EnvironmentReader {
 public:
  explicit EnvironmentReader(Config* config) : config_(config) {}

  // The first of `names` that is set, as a whole decimal integer, into *out.
  Status Int(std::initializer_list<const char*> names, const char* member, int64_t* out) {
    std::string v, which;
    if (!FirstSet(names, &v, &which)) return Status::Ok();
    errno = 0;
    char* end = nullptr;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    // strtoll skips leading blanks: " 5" is refused as "5 " is.
    if (end == v.c_str() || *end != '\0' || std::isspace(static_cast<unsigned char>(v[0]))) {
      return InvalidArgument("environment variable " + which + "='" + v + "' is not an integer");
    }
    if (errno == ERANGE) {
      return InvalidArgument("environment variable " + which + "='" + v +
                             "' is out of range for a 64-bit integer");
    }
    *out = x;
    config_->sources[member] = which;
    return Status::Ok();
  }

  // The same, for an int member: beyond 32 bits is an error naming the variable.
  Status Int(std::initializer_list<const char*> names, const char* member, int* out) {
    int64_t x = *out;
    CONCORD_RETURN_IF_ERROR(Int(names, member, &x));
    if (x < INT32_MIN || x > INT32_MAX) {
      return InvalidArgument("environment variable " + config_->sources[member] + "='" +
                             std::to_string(x) + "' is out of range for a 32-bit integer");
    }
    *out = static_cast<int>(x);
    return Status::Ok();
  }

  // The same, for rank, size, local rank and local size, whose -1 means "not given" (a launcher's
  // variable may then fill it): a negative value is refused here, naming the variable, instead of
  // reading as unset. `accepted` says what is ("the rank must be >= 0").
  Status Identity(std::initializer_list<const char*> names, const char* member, int* out,
                  const char* accepted) {
    CONCORD_RETURN_IF_ERROR(Int(names, member, out));
    if (*out < 0 && config_->sources.count(member) != 0) {
      return InvalidArgument(config_->sources[member] + " = " + std::to_string(*out) + ": " +
                             accepted);
    }
    return Status::Ok();
  }

  // A finite decimal number (strtod's decimal syntax: no hexadecimal, no blanks).
  Status Double(const char* name, const char* member, double* out) {
    std::string v, which;
    if (!FirstSet({name}, &v, &which)) return Status::Ok();
    errno = 0;
    char* end = nullptr;
    double x = 0.0;
    {
      const ScopedCLocale c_locale;  // "2.5" whatever the application's LC_NUMERIC
      x = std::strtod(v.c_str(), &end);
    }
    if (end == v.c_str() || *end != '\0' || std::isspace(static_cast<unsigned char>(v[0])) ||
        v.find_first_of("xX") != std::string::npos) {
      return InvalidArgument("environment variable " + which + "='" + v +
                             "' is not a finite number (decimal, without blanks)");
    }
    if (errno == ERANGE || !std::isfinite(x)) {
      return InvalidArgument("environment variable " + which + "='" + v +
                             "' is not a finite number in a double's range");
    }
    *out = x;
    config_->sources[member] = which;
    return Status::Ok();
  }

  void String(std::initializer_list<const char*> names, const char* member, std::string* out) {
    std::string v, which;
    if (!FirstSet(names, &v, &which)) return;
    *out = v;
    config_->sources[member] = which;
  }

 private:
  Config* config_;
};

// A double as a person would write it ("30", "0.5", "-1e+300", "nan"), in the C locale's format
// whatever the application made the global C++ locale ("86400", not "86.400").
std::string Number(double x) {
  std::ostringstream out;
  out.imbue(std::locale::classic());
  out << x;
  return out.str();
}

// CONCORD_METRICS_PORT: "port" or "address:port" (an IPv6 address in brackets).
Status ParseMetricsEndpoint(const std::string& text, Config* c) {
  const size_t colon = text.rfind(':');
  std::string address = colon == std::string::npos ? "" : text.substr(0, colon);
  const std::string port = colon == std::string::npos ? text : text.substr(colon + 1);
  // An IPv6 address needs its brackets ("::1:0" would read as address "::1", port 0).
  const bool bracketed = address.size() >= 2 && address.front() == '[' && address.back() == ']';
  if (bracketed) address = address.substr(1, address.size() - 2);
  char* end = nullptr;
  errno = 0;
  const long value = port.empty() ? -1 : std::strtol(port.c_str(), &end, 10);
  // Digits only: strtol would take "-0", "+9400" and " 9400".
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos || *end != '\0' ||
      errno != 0 || value < 0 || value > 65535 || (colon != std::string::npos && address.empty()) ||
      (!bracketed && address.find(':') != std::string::npos)) {
    return InvalidArgument("CONCORD_METRICS_PORT = '" + text +
                           "': expected a port in [0, 65535], optionally after an address to "
                           "bind (\"9400\", \"0.0.0.0:9400\")");
  }
  c->metrics_port = static_cast<int>(value);
  if (!address.empty()) c->metrics_address = address;
  return Status::Ok();
}

// The variables a launcher gives each rank its place by.
struct Launcher {
  const char* rank;
  const char* size;
  const char* size_fallback;  // read where `size` is not set; null: none
  const char* local_rank;
  const char* local_size;  // null: Slurm, which has none (SlurmLocalSize)
};
constexpr Launcher kLaunchers[] = {
    {"RANK", "WORLD_SIZE", nullptr, "LOCAL_RANK", "LOCAL_WORLD_SIZE"},  // torchrun
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", nullptr, "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},                                           // Open MPI
    {"PMI_RANK", "PMI_SIZE", nullptr, "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},  // MPICH, Slurm's PMI
    // srun: the step's tasks (a heterogeneous step's, all components). SLURM_NTASKS, the job's,
    // only where it is 1: without a step of its own (srun sets SLURM_STEP_NUM_TASKS for every
    // task it starts) this is an sbatch or salloc script's own process (SlurmStepMissing).
    {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
};

// The tasks of this node in a Slurm job step: SLURM_STEP_TASKS_PER_NODE (else
// SLURM_TASKS_PER_NODE) lists them per node ("2(x3),1"), SLURM_NODEID is this node's index in
// it. -1 when they are not set; an error when they do not parse or do not name this node.
StatusOr<int> SlurmLocalSize() {
  std::string list, which, node_text, node_name;
  if (!FirstSet({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}, &list, &which)) return -1;
  std::vector<int> per_node;
  const auto bad = [&] {
    return InvalidArgument("environment variable " + which + "='" + list +
                           "' is not Slurm's tasks per node (\"2(x3),1\")");
  };
  for (size_t at = 0; at <= list.size();) {
    size_t end = list.find(',', at);
    if (end == std::string::npos) end = list.size();
    // "N" or "N(xR)", as Slurm writes them.
    const std::string item = list.substr(at, end - at);
    if (item.empty() || !std::isdigit(static_cast<unsigned char>(item[0]))) return bad();
    char* rest = nullptr;
    const long tasks = std::strtol(item.c_str(), &rest, 10);
    const bool repeated = *rest == '(';
    // "N(" ends at the '(': the count after "(x" is read only when the 'x' is there.
    const long repeat = !repeated ? 1 : rest[1] == 'x' ? std::strtol(rest + 2, nullptr, 10) : 0;
    const std::string canonical =
        std::to_string(tasks) + (repeated ? "(x" + std::to_string(repeat) + ")" : "");
    if (item != canonical || tasks > INT32_MAX || repeat < 1 ||
        per_node.size() + static_cast<size_t>(repeat) > 1000000) {
      return bad();
    }
    per_node.insert(per_node.end(), static_cast<size_t>(repeat), static_cast<int>(tasks));
    at = end + 1;
  }
  if (per_node.size() == 1) return per_node[0];
  if (std::all_of(per_node.begin(), per_node.end(), [&](int n) { return n == per_node[0]; })) {
    return per_node[0];
  }
  if (!FirstSet({"SLURM_NODEID"}, &node_text, &node_name)) {
    return InvalidArgument("environment variable " + which + "='" + list +
                           "' gives nodes different numbers of tasks, and SLURM_NODEID (which "
                           "one is this node) is not set: set CONCORD_LOCAL_SIZE");
  }
  char* end = nullptr;
  const long node = std::strtol(node_text.c_str(), &end, 10);
  // Digits only: strtol would take " 1" and "+1".
  if (!std::isdigit(static_cast<unsigned char>(node_text[0])) || *end != '\0' || node < 0 ||
      node >= static_cast<long>(per_node.size())) {
    return InvalidArgument("environment variable SLURM_NODEID='" + node_text +
                           "' is not a node of " + which + "='" + list + "'");
  }
  return per_node[static_cast<size_t>(node)];
}

// What Identity accepts for each member read from a variable.
constexpr char kRankAccepted[] = "the rank must be >= 0";
constexpr char kSizeAccepted[] = "the number of ranks must be >= 1";
constexpr char kLocalRankAccepted[] = "the rank on this host must be >= 0";
constexpr char kLocalSizeAccepted[] = "the number of ranks on this host must be >= 1";

// A process of a Slurm job that srun did not start (no SLURM_STEP_NUM_TASKS): an sbatch script's
// own process (SLURM_PROCID=0) or one started from an salloc shell, where SLURM_NTASKS (`ntasks`)
// counts the job's tasks. As rank 0 of them it would wait out the timeout for ranks that no one
// starts: an error at once instead, which says how to start them.
Status SlurmStepMissing(int ntasks) {
  return InvalidArgument(
      "SLURM_NTASKS = " + std::to_string(ntasks) +
      " (the Slurm job's tasks), but this process was not started by srun (no "
      "SLURM_STEP_NUM_TASKS): an sbatch script's own process, or one started from an salloc "
      "shell, would wait for " +
      std::to_string(ntasks - 1) +
      " ranks that nothing starts. Start every rank with srun (`srun python train.py`), or set "
      "CONCORD_SIZE=1 for a single process");
}

// Who this rank is: each of rank, size, local rank and local size from its CONCORD_* variable,
// else from the launcher that started the job: the first of kLaunchers whose rank or size variable
// is set, and only that one (a launcher's variables describe its own job: under an sbatch script,
// say, the batch step's SLURM_LOCALID would make every rank started by hand local rank 0). A
// launcher whose rank or size differs from CONCORD_RANK or CONCORD_SIZE describes another job: none
// of its variables are read.
Status ReadIdentity(EnvironmentReader* env, Config* c) {
  CONCORD_RETURN_IF_ERROR(env->Identity({"CONCORD_RANK"}, "rank", &c->rank, kRankAccepted));
  CONCORD_RETURN_IF_ERROR(env->Identity({"CONCORD_SIZE"}, "size", &c->size, kSizeAccepted));
  CONCORD_RETURN_IF_ERROR(
      env->Identity({"CONCORD_LOCAL_RANK"}, "local_rank", &c->local_rank, kLocalRankAccepted));
  CONCORD_RETURN_IF_ERROR(
      env->Identity({"CONCORD_LOCAL_SIZE"}, "local_size", &c->local_size, kLocalSizeAccepted));
  std::string value, which;
  for (const Launcher& l : kLaunchers) {
    if (!FirstSet({l.rank, l.size}, &value, &which) &&
        !(l.size_fallback != nullptr && FirstSet({l.size_fallback}, &value, &which))) {
      continue;
    }
    Config theirs;
    EnvironmentReader their_env(&theirs);
    CONCORD_RETURN_IF_ERROR(their_env.Identity({l.rank}, "rank", &theirs.rank, kRankAccepted));
    if (l.size_fallback != nullptr) {
      CONCORD_RETURN_IF_ERROR(
          their_env.Identity({l.size, l.size_fallback}, "size", &theirs.size, kSizeAccepted));
    } else {
      CONCORD_RETURN_IF_ERROR(their_env.Identity({l.size}, "size", &theirs.size, kSizeAccepted));
    }
    CONCORD_RETURN_IF_ERROR(
        their_env.Identity({l.local_rank}, "local_rank", &theirs.local_rank, kLocalRankAccepted));
    if (l.local_size != nullptr) {
      CONCORD_RETURN_IF_ERROR(
          their_env.Identity({l.local_size}, "local_size", &theirs.local_size, kLocalSizeAccepted));
    } else {
      CONCORD_ASSIGN_OR_RETURN(theirs.local_size, SlurmLocalSize());
      if (theirs.local_size != -1) {
        FirstSet({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}, &value, &which);
        theirs.sources["local_size"] = which;
      }
    }
    if ((c->rank != -1 && c->rank != theirs.rank) ||
        (c->size != -1 && theirs.size != -1 && c->size != theirs.size)) {
      return Status::Ok();
    }
    if (c->size == -1 && l.size_fallback != nullptr && theirs.size > 1 &&
        theirs.SourceOf("size") == l.size_fallback) {
      return SlurmStepMissing(theirs.size);
    }
    for (const auto& [member, field] :
         {std::pair<const char*, int Config::*>{"rank", &Config::rank},
          {"size", &Config::size},
          {"local_rank", &Config::local_rank},
          {"local_size", &Config::local_size}}) {
      if (c->*field != -1 || theirs.*field == -1) continue;
      c->*field = theirs.*field;
      c->sources[member] = theirs.sources[member];
    }
    return Status::Ok();
  }
  return Status::Ok();
}

}  // namespace

StatusOr<Config> Config::FromEnvironment() {
  Config c;
  EnvironmentReader env(&c);
  CONCORD_RETURN_IF_ERROR(ReadIdentity(&env, &c));
  env.String({"CONCORD_STORE"}, "store", &c.store);
  env.String({"CONCORD_TOKEN"}, "token", &c.token);
  env.String({"CONCORD_JOB_ID", "TORCHELASTIC_RUN_ID", "OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID"},
             "job_id", &c.job_id);
  // torchrun restarts a failed job's workers with the same run id: each round is a job of its own
  // (its own keys in a shared store, its own token), or a round's ranks could meet the keys of
  // the round before (another rank's communicator numbers, dead addresses).
  std::string restart, restart_name;
  if (c.SourceOf("job_id") == "TORCHELASTIC_RUN_ID" &&
      FirstSet({"TORCHELASTIC_RESTART_COUNT"}, &restart, &restart_name) && restart != "0") {
    c.job_id += "/restart" + restart;
  }
  // torchrun's rendezvous, read only where it would make the store: under concordrun (which sets
  // CONCORD_STORE) they are torch's business, whatever they hold.
  if (c.store.empty()) {
    env.String({"MASTER_ADDR"}, "master_addr", &c.master_addr);
    CONCORD_RETURN_IF_ERROR(env.Int({"MASTER_PORT"}, "master_port", &c.master_port));
  }
  env.String({"CONCORD_IFACE"}, "iface", &c.iface);
  env.String({"CONCORD_HOST"}, "host", &c.host);
  env.String({"CONCORD_BACKEND"}, "backend", &c.backend);
  std::string launcher, which;
  c.mpi_launched = FirstSet({"OMPI_COMM_WORLD_SIZE", "PMIX_RANK"}, &launcher, &which);
  env.String({"CONCORD_GLOO_ALGORITHM"}, "gloo_algorithm", &c.gloo_algorithm);
  env.String({"CONCORD_SHM"}, "shm", &c.shm);
  env.String({"CONCORD_HOST_ID"}, "host_id", &c.host_id);
  CONCORD_RETURN_IF_ERROR(env.Int({"CONCORD_SHM_BYTES"}, "shm_buffer_bytes", &c.shm_buffer_bytes));
  CONCORD_RETURN_IF_ERROR(env.Int({"CONCORD_SHM_DIRECT_THRESHOLD"}, "shm_direct_threshold_bytes",
                                  &c.shm_direct_threshold_bytes));
  env.String({"CONCORD_HIERARCHICAL"}, "hierarchical", &c.hierarchical);
  CONCORD_RETURN_IF_ERROR(env.Int({"CONCORD_HIERARCHICAL_THRESHOLD"},
                                  "hierarchical_threshold_bytes", &c.hierarchical_threshold_bytes));
  CONCORD_RETURN_IF_ERROR(
      env.Int({"CONCORD_FUSION_THRESHOLD"}, "fusion_threshold_bytes", &c.fusion_threshold_bytes));
  env.String({"CONCORD_COMPRESSION"}, "compression", &c.compression);
  CONCORD_RETURN_IF_ERROR(
      env.Int({"CONCORD_INLINE_THRESHOLD"}, "inline_threshold_bytes", &c.inline_threshold_bytes));
  CONCORD_RETURN_IF_ERROR(
      env.Int({"CONCORD_DIRECT_THRESHOLD"}, "direct_threshold_bytes", &c.direct_threshold_bytes));
  CONCORD_RETURN_IF_ERROR(env.Double("CONCORD_CYCLE_TIME_MS", "cycle_time_ms", &c.cycle_time_ms));
  CONCORD_RETURN_IF_ERROR(env.Double("CONCORD_TIMEOUT_S", "timeout_s", &c.timeout_s));
  CONCORD_RETURN_IF_ERROR(env.Int({"CONCORD_CACHE_CAPACITY"}, "cache_capacity", &c.cache_capacity));
  CONCORD_RETURN_IF_ERROR(env.Int({"CONCORD_TOPK_RESIDUALS"}, "topk_residuals", &c.topk_residuals));
  CONCORD_RETURN_IF_ERROR(env.Int({"CONCORD_LANES"}, "lanes", &c.lanes));
  int waiter_progress = c.waiter_progress ? 1 : 0;
  CONCORD_RETURN_IF_ERROR(
      env.Int({"CONCORD_WAITER_PROGRESS"}, "waiter_progress", &waiter_progress));
  if (waiter_progress != 0 && waiter_progress != 1) {
    return InvalidArgument("CONCORD_WAITER_PROGRESS = " + std::to_string(waiter_progress) +
                           ": must be 0 or 1");
  }
  c.waiter_progress = waiter_progress == 1;
  int deterministic = c.deterministic ? 1 : 0;
  CONCORD_RETURN_IF_ERROR(env.Int({"CONCORD_DETERMINISTIC"}, "deterministic", &deterministic));
  if (deterministic != 0 && deterministic != 1) {
    return InvalidArgument("CONCORD_DETERMINISTIC = " + std::to_string(deterministic) +
                           ": must be 0 or 1");
  }
  c.deterministic = deterministic == 1;
  CONCORD_RETURN_IF_ERROR(env.Int({"CONCORD_LOG_LEVEL"}, "log_level", &c.log_level));
  CONCORD_RETURN_IF_ERROR(
      env.Double("CONCORD_STALL_WARNING_S", "stall_warning_s", &c.stall_warning_s));
  CONCORD_RETURN_IF_ERROR(
      env.Double("CONCORD_STALL_SHUTDOWN_S", "stall_shutdown_s", &c.stall_shutdown_s));
  CONCORD_RETURN_IF_ERROR(
      env.Double("CONCORD_STRAGGLER_REPORT_S", "straggler_report_s", &c.straggler_report_s));
  std::string endpoint;
  env.String({"CONCORD_METRICS_PORT"}, "metrics_port", &endpoint);
  if (!endpoint.empty()) CONCORD_RETURN_IF_ERROR(ParseMetricsEndpoint(endpoint, &c));
  env.String({"CONCORD_SUMMARY_DIR"}, "summary_dir", &c.summary_dir);
  env.String({"CONCORD_TIMELINE"}, "timeline", &c.timeline);
  return c;
}

std::string Config::SourceOf(const std::string& member) const {
  const auto it = sources.find(member);
  return it == sources.end() ? member : it->second;
}

Status Config::Finalize() {
  // "<where> = <value>: <what is accepted>".
  const auto refuse = [this](const char* member, const std::string& value,
                             const std::string& accepted) {
    return InvalidArgument(SourceOf(member) + " = " + value + ": " + accepted);
  };
  const auto quoted = [](const std::string& text) { return "'" + text + "'"; };

  if (size == -1 && rank == -1) {
    size = 1;
    rank = 0;
  }
  if (size == 1 && rank == -1) rank = 0;  // the only one (CONCORD_SIZE=1 alone, say)
  if (size == -1) {
    return refuse("rank", std::to_string(rank),
                  "a rank is given but not the number of ranks (CONCORD_SIZE, or WORLD_SIZE, "
                  "OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_STEP_NUM_TASKS, or "
                  "concord_config_t.size)");
  }
  if (size < 1) return refuse("size", std::to_string(size), "the number of ranks must be >= 1");
  if (rank == -1) {
    return refuse("size", std::to_string(size),
                  "the number of ranks is given but not this rank (CONCORD_RANK, or RANK, "
                  "OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID, or concord_config_t.rank)");
  }
  if (rank < 0 || rank >= size) {
    return refuse("rank", std::to_string(rank),
                  "the rank must be in [0, " + std::to_string(size) + ") (the size, from " +
                      SourceOf("size") + ")");
  }
  if (local_rank == -1) local_rank = (local_size == -1 || local_size == size) ? rank : 0;
  if (local_size == -1) local_size = size;
  if (local_size < 1) {
    return refuse("local_size", std::to_string(local_size),
                  "the number of ranks on this host must be >= 1");
  }
  if (local_size > size) {
    return refuse("local_size", std::to_string(local_size),
                  "the number of ranks on this host must be at most the number of ranks, " +
                      std::to_string(size) + " (from " + SourceOf("size") + ")");
  }
  if (local_rank < 0 || local_rank >= local_size) {
    return refuse("local_rank", std::to_string(local_rank),
                  "the rank on this host must be in [0, " + std::to_string(local_size) +
                      ") (the local size, from " + SourceOf("local_size") + ")");
  }
  // Only used without a store (bootstrap.cc): under concordrun torchrun's variables are unused.
  // MASTER_PORT=-1 is refused too: -1 only means "not given" when no variable gave it.
  if ((master_port != -1 || sources.count("master_port") != 0) && store.empty() &&
      (master_port < 1 || master_port > 65534)) {
    return refuse("master_port", std::to_string(master_port),
                  "must be in [1, 65534] (Concord's store is served on MASTER_PORT + 1)");
  }
  if (job_id.empty()) job_id = "default";
  if (backend != "gloo" && backend != "gloo-ibverbs" && backend != "mpi" && backend != "nccl" &&
      backend != "auto") {
    return refuse("backend", quoted(backend),
                  "not a backend; use gloo, gloo-ibverbs, mpi, nccl or auto");
  }
  // backends/gloo parses the name again (gloo_allreduce.cc); bcube is refused there too.
  if (gloo_algorithm != "auto" && gloo_algorithm != "ring" && gloo_algorithm != "ring_chunked" &&
      gloo_algorithm != "halving_doubling" && gloo_algorithm != "allreduce") {
    return refuse("gloo_algorithm", quoted(gloo_algorithm),
                  "not an allreduce algorithm Concord offers; use auto, ring, ring_chunked, "
                  "halving_doubling or allreduce (bcube is not offered: it gave wrong sums with "
                  "Gloo 0.5.0)");
  }
  if (shm != "auto" && shm != "on" && shm != "off") {
    return refuse("shm", quoted(shm), "use auto, on or off");
  }
  if (hierarchical != "auto" && hierarchical != "on" && hierarchical != "off") {
    return refuse("hierarchical", quoted(hierarchical), "use auto, on or off");
  }
  if (hierarchical_threshold_bytes < 0) {
    return refuse("hierarchical_threshold_bytes", std::to_string(hierarchical_threshold_bytes),
                  "the hierarchical threshold must be >= 0 bytes");
  }
  if (shm_buffer_bytes < (int64_t{64} << 10) || shm_buffer_bytes > (int64_t{1} << 30)) {
    return refuse("shm_buffer_bytes", std::to_string(shm_buffer_bytes),
                  "each rank's shared-memory buffer must be in [64 KiB, 1 GiB]");
  }
  if (!compression.empty()) {  // "" is "none"
    const auto compressor = compression::CreateCompressor(compression);
    if (!compressor.ok()) {
      return refuse("compression", quoted(compression), compressor.status().message());
    }
  }
  if (fusion_threshold_bytes < 0) {
    return refuse("fusion_threshold_bytes", std::to_string(fusion_threshold_bytes),
                  "the fusion threshold must be >= 0 bytes (0 disables fusion)");
  }
  if (direct_threshold_bytes < 0) {
    return refuse("direct_threshold_bytes", std::to_string(direct_threshold_bytes),
                  "the direct threshold must be >= 0 bytes");
  }
  if (inline_threshold_bytes < 0 || inline_threshold_bytes > kMaxInlineBytes) {
    return refuse("inline_threshold_bytes", std::to_string(inline_threshold_bytes),
                  "the inline threshold must be in [0, " + std::to_string(kMaxInlineBytes) +
                      "] bytes (0 turns inline allreduces off)");
  }
  if (!(cycle_time_ms >= 0.0 && cycle_time_ms <= 60000.0)) {  // NaN fails too
    return refuse("cycle_time_ms", Number(cycle_time_ms),
                  "the cycle time must be in [0, 60000] ms");
  }
  if (!(timeout_s > 0.0 && timeout_s <= kMaxSeconds)) {
    return refuse("timeout_s", Number(timeout_s),
                  "the timeout must be in (0, " + Number(kMaxSeconds) + "] seconds");
  }
  if (cache_capacity < 0) {
    return refuse("cache_capacity", std::to_string(cache_capacity),
                  "the response cache capacity must be >= 0 entries (0 disables the cache)");
  }
  if (topk_residuals < 1) {
    return refuse("topk_residuals", std::to_string(topk_residuals),
                  "top-k keeps the residuals of at least 1 tensor name");
  }
  if (lanes < 1 || lanes > kMaxLanes) {
    return refuse("lanes", std::to_string(lanes),
                  "the number of lanes must be in [1, " + std::to_string(kMaxLanes) + "]");
  }
  if (log_level < 0 || log_level > 3) {
    return refuse("log_level", std::to_string(log_level),
                  "the log level must be 0 (errors), 1 (warnings), 2 (info) or 3 (debug)");
  }
  if (!(stall_warning_s > 0.0 && stall_warning_s <= kMaxSeconds)) {
    return refuse("stall_warning_s", Number(stall_warning_s),
                  "the stall warning time must be in (0, " + Number(kMaxSeconds) + "] seconds");
  }
  if (!(stall_shutdown_s >= 0.0 && stall_shutdown_s <= kMaxSeconds)) {
    return refuse(
        "stall_shutdown_s", Number(stall_shutdown_s),
        "the stall shutdown time must be in [0, " + Number(kMaxSeconds) + "] seconds (0: never)");
  }
  if (metrics_port > 0 && metrics_port + std::max(local_size, 1) - 1 > 65535) {
    return refuse("metrics_port", std::to_string(metrics_port),
                  "each rank serves metrics on the port plus its local rank, and " +
                      std::to_string(metrics_port) + " + " + std::to_string(local_size - 1) +
                      " is beyond 65535");
  }
  if (!(straggler_report_s >= 0.0 && straggler_report_s <= kMaxSeconds)) {
    return refuse("straggler_report_s", Number(straggler_report_s),
                  "the straggler report period must be in [0, " + Number(kMaxSeconds) +
                      "] seconds (0: never)");
  }
  return Status::Ok();
}

std::string Config::ResolvedBackend() const {
  if (backend != "auto") return backend;
  const auto built = BuiltBackends();
  const bool have_mpi = std::find(built.begin(), built.end(), "mpi") != built.end();
  return mpi_launched && have_mpi ? "mpi" : "gloo";
}

}  // namespace concord
