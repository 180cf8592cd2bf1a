#include "core/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <initializer_list>

#include "backends/backend.h"

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

Status ReadInt(std::initializer_list<const char*> names, int64_t* out) {
  std::string v, which;
  if (!FirstSet(names, &v, &which)) return Status::Ok();
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || end == v.c_str() || *end != '\0') {
    return InvalidArgument("environment variable " + which + "='" + v + "' is not an integer");
  }
  *out = x;
  return Status::Ok();
}

Status ReadInt(std::initializer_list<const char*> names, int* out) {
  int64_t x = *out;
  CONCORD_RETURN_IF_ERROR(ReadInt(names, &x));
  if (x < INT32_MIN || x > INT32_MAX) return InvalidArgument("integer out of range in environment");
  *out = static_cast<int>(x);
  return Status::Ok();
}

Status ReadDouble(const char* name, double* out) {
  std::string v, which;
  if (!FirstSet({name}, &v, &which)) return Status::Ok();
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (errno != 0 || end == v.c_str() || *end != '\0' || !std::isfinite(x)) {
    return InvalidArgument("environment variable " + which + "='" + v + "' is not a number");
  }
  *out = x;
  return Status::Ok();
}

void ReadString(std::initializer_list<const char*> names, std::string* out) {
  std::string v, which;
  if (FirstSet(names, &v, &which)) *out = v;
}

}  // namespace

StatusOr<Config> Config::FromEnvironment() {
  Config c;
  // Concord's own names first, then torchrun, Open MPI, PMI (MPICH, Slurm's PMI) and Slurm.
  CONCORD_RETURN_IF_ERROR(ReadInt(
      {"CONCORD_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}, &c.rank));
  CONCORD_RETURN_IF_ERROR(ReadInt(
      {"CONCORD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}, &c.size));
  CONCORD_RETURN_IF_ERROR(ReadInt({"CONCORD_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                   "MPI_LOCALRANKID", "SLURM_LOCALID"},
                                  &c.local_rank));
  CONCORD_RETURN_IF_ERROR(ReadInt(
      {"CONCORD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"},
      &c.local_size));
  ReadString({"CONCORD_STORE"}, &c.store);
  ReadString({"CONCORD_TOKEN"}, &c.token);
  ReadString({"CONCORD_JOB_ID", "TORCHELASTIC_RUN_ID", "OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID"},
             &c.job_id);
  ReadString({"MASTER_ADDR"}, &c.master_addr);
  CONCORD_RETURN_IF_ERROR(ReadInt({"MASTER_PORT"}, &c.master_port));
  ReadString({"CONCORD_IFACE"}, &c.iface);
  ReadString({"CONCORD_HOST"}, &c.host);
  ReadString({"CONCORD_BACKEND"}, &c.backend);
  std::string launcher, which;
  c.mpi_launched = FirstSet({"OMPI_COMM_WORLD_SIZE", "PMIX_RANK"}, &launcher, &which);
  ReadString({"CONCORD_GLOO_ALGORITHM"}, &c.gloo_algorithm);
  CONCORD_RETURN_IF_ERROR(ReadInt({"CONCORD_FUSION_THRESHOLD"}, &c.fusion_threshold_bytes));
  ReadString({"CONCORD_COMPRESSION"}, &c.compression);
  CONCORD_RETURN_IF_ERROR(ReadInt({"CONCORD_INLINE_THRESHOLD"}, &c.inline_threshold_bytes));
  CONCORD_RETURN_IF_ERROR(ReadInt({"CONCORD_DIRECT_THRESHOLD"}, &c.direct_threshold_bytes));
  CONCORD_RETURN_IF_ERROR(ReadDouble("CONCORD_CYCLE_TIME_MS", &c.cycle_time_ms));
  CONCORD_RETURN_IF_ERROR(ReadDouble("CONCORD_TIMEOUT_S", &c.timeout_s));
  CONCORD_RETURN_IF_ERROR(ReadInt({"CONCORD_CACHE_CAPACITY"}, &c.cache_capacity));
  CONCORD_RETURN_IF_ERROR(ReadInt({"CONCORD_LANES"}, &c.lanes));
  int waiter_progress = c.waiter_progress ? 1 : 0;
  CONCORD_RETURN_IF_ERROR(ReadInt({"CONCORD_WAITER_PROGRESS"}, &waiter_progress));
  if (waiter_progress != 0 && waiter_progress != 1) {
    return InvalidArgument("CONCORD_WAITER_PROGRESS must be 0 or 1");
  }
  c.waiter_progress = waiter_progress == 1;
  CONCORD_RETURN_IF_ERROR(ReadInt({"CONCORD_LOG_LEVEL"}, &c.log_level));
  CONCORD_RETURN_IF_ERROR(ReadDouble("CONCORD_STALL_WARNING_S", &c.stall_warning_s));
  CONCORD_RETURN_IF_ERROR(ReadDouble("CONCORD_STALL_SHUTDOWN_S", &c.stall_shutdown_s));
  return c;
}

Status Config::Finalize() {
  if (size == -1 && rank == -1) {
    size = 1;
    rank = 0;
  }
  if (size < 1)
    return InvalidArgument("size must be at least 1 (got " + std::to_string(size) + ")");
  if (rank < 0 || rank >= size) {
    return InvalidArgument("rank " + std::to_string(rank) + " is outside [0, " +
                           std::to_string(size) + ")");
  }
  if (local_rank == -1) local_rank = (local_size == -1 || local_size == size) ? rank : 0;
  if (local_size == -1) local_size = size;
  if (local_size < 1 || local_rank < 0 || local_rank >= local_size) {
    return InvalidArgument("local rank " + std::to_string(local_rank) + " is outside [0, " +
                           std::to_string(local_size) + ")");
  }
  if (job_id.empty()) job_id = "default";
  if (backend != "gloo" && backend != "gloo-ibverbs" && backend != "mpi" && backend != "nccl" &&
      backend != "auto") {
    return InvalidArgument("CONCORD_BACKEND must be gloo, gloo-ibverbs, mpi, nccl or auto, not '" +
                           backend + "'");
  }
  if (fusion_threshold_bytes < 0) return InvalidArgument("the fusion threshold must be >= 0");
  if (direct_threshold_bytes < 0) return InvalidArgument("the direct threshold must be >= 0");
  if (inline_threshold_bytes < 0 || inline_threshold_bytes > kMaxInlineBytes) {
    return InvalidArgument("CONCORD_INLINE_THRESHOLD must be in [0, " +
                           std::to_string(kMaxInlineBytes) + "] bytes");
  }
  if (!(cycle_time_ms >= 0.0) || cycle_time_ms > 60000.0) {
    return InvalidArgument("the cycle time must be in [0, 60000] ms");
  }
  if (!(timeout_s > 0.0) || timeout_s > 86400.0) {
    return InvalidArgument("the timeout must be in (0, 86400] s");
  }
  if (cache_capacity < 0) return InvalidArgument("the response cache capacity must be >= 0");
  if (lanes < 1 || lanes > kMaxLanes) {
    return InvalidArgument("CONCORD_LANES must be in [1, " + std::to_string(kMaxLanes) + "]");
  }
  if (log_level < 0 || log_level > 3) return InvalidArgument("the log level must be 0 to 3");
  if (!(stall_warning_s > 0.0)) return InvalidArgument("the stall warning time must be > 0");
  if (!(stall_shutdown_s >= 0.0)) return InvalidArgument("the stall shutdown time must be >= 0");
  if (master_port != -1 && (master_port < 1 || master_port > 65534)) {
    return InvalidArgument("MASTER_PORT must be in [1, 65534]");
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
