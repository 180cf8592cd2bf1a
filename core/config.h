// Everything configurable about a communicator, read once at init into this struct and passed
// down (no getenv anywhere else). The README's configuration table documents each field.
//
// Validation: FromEnvironment refuses a variable that does not parse (naming it and its text);
// Finalize checks every setting's range, the compression spec (with the compression layer's own
// parser), the backend and Gloo algorithm names, so that a bad value fails init rather than the
// first operation. Each refusal is INVALID_ARGUMENT reading "<where> = <value>: <what is
// accepted>", where <where> is the setting's source (see `sources`).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "base/status.h"

namespace concord {

struct Config {
  // Who we are. -1 means "not given": FromEnvironment fills them from the launchers' variables.
  int rank = -1;
  int size = -1;
  int local_rank = -1;
  int local_size = -1;
  // The local rank whose GPU the device plane uses (it modulo the usable CUDA devices); -1:
  // local_rank. A sub-communicator keeps its parent's (core/comm_split.cc): its own local_rank
  // counts only its members on this host, and would pick another GPU than the parent's tensors'.
  int device_local_rank = -1;

  // Rendezvous.
  std::string store;        // "tcp://host:port" or "file:///dir"; "" = derived (see Bootstrap)
  std::string token;        // secret the TCP store checks
  std::string job_id;       // separates jobs that share a store
  std::string master_addr;  // torchrun's MASTER_ADDR / MASTER_PORT: rank 0 serves the store
  int master_port = -1;     // on MASTER_PORT + 1
  std::string iface;        // data-traffic interface
  std::string host;         // address to bind and advertise

  // "gloo", "gloo-ibverbs" (Gloo over InfiniBand/RoCE), "mpi" (negotiation and data over MPI;
  // needs mpirun), "nccl" (CPU tensors on Gloo, CUDA tensors on NCCL) or "auto" (mpi when started
  // by mpirun and built, else gloo; NCCL for CUDA tensors where it can start). ResolvedBackend()
  // gives the one that runs.
  std::string backend = "gloo";
  bool mpi_launched = false;  // OMPI_COMM_WORLD_SIZE or PMIX_RANK is set: mpirun started us
  std::string gloo_algorithm = "auto";
  // Collectives among ranks on one host: "auto" (through shared memory when every rank of the
  // communicator is on this host, else the backend), "on" (the same, but an error when shared
  // memory cannot be used), "off" (always the backend). Store-based backends only (not mpi, which
  // has its own).
  std::string shm = "auto";
  // Which ranks share a host: "" = this host's boot id and namespaces (backends/shm).
  std::string host_id;
  // Each rank's share of a lane's shared-memory segment (two halves, each a chunk of a collective).
  int64_t shm_buffer_bytes = int64_t{4} << 20;
  // Allreduces at least this large read the peers' memory directly (cross-memory attach, where
  // the system allows it) instead of copying through the segment; negative: never.
  int64_t shm_direct_threshold_bytes = int64_t{256} << 10;
  // Several hosts with the same number (> 1) of ranks each: "auto"/"on" run allreduces,
  // allgathers and broadcasts of at least hierarchical_threshold_bytes in two levels (shared
  // memory within the host, the backend across hosts; core/lane_backends.h); "on" fails init when
  // the layout does not allow it; "off" keeps every collective flat.
  std::string hierarchical = "auto";
  int64_t hierarchical_threshold_bytes = int64_t{256} << 10;
  // The compressor of allreduces that do not name one ("none", "fp16", "topk:density=0.01", ...).
  std::string compression = "none";
  // Top-k's error feedback keeps a residual per tensor name, for at most this many names (the
  // least recently compressed one makes room for a new one): names used once cannot grow memory.
  int topk_residuals = 1024;
  int64_t fusion_threshold_bytes = int64_t{64} << 20;
  // Allreduces at least this large are not fused: they run in place, saving two copies.
  int64_t direct_threshold_bytes = int64_t{256} << 10;
  // Allreduces up to this many bytes travel with their negotiation and are reduced by the
  // coordinator (no backend call); 0 turns this off. At most kMaxInlineBytes.
  int64_t inline_threshold_bytes = int64_t{32} << 10;
  static constexpr int64_t kMaxInlineBytes = int64_t{256} << 10;
  double cycle_time_ms = 0.0;
  double timeout_s = 30.0;  // (0, kMaxSeconds]
  int cache_capacity = 1024;
  // Data-plane lanes: backends with their own connections whose collectives run concurrently.
  int lanes = 2;
  static constexpr int kMaxLanes = 8;
  // A thread waiting for a request runs the engine's steps itself (Engine's class comment).
  bool waiter_progress = true;
  // Every element of an allreduce and a reducescatter is combined in rank order (a left fold over
  // ranks 0, 1, ..., size-1), so results are bitwise identical for a world size whatever the
  // fusion, lanes, thresholds and arrival order (core/ordered_reduction.h). CPU tensors only.
  bool deterministic = false;
  int log_level = 1;
  double stall_warning_s = 60.0;  // (0, kMaxSeconds]
  // [0, kMaxSeconds]; 0: never. 600 s, torch.distributed's default collective timeout for NCCL:
  // long enough for a rank that pauses to write a checkpoint, short enough that a job missing a
  // tensor ends within the hour instead of holding its machines.
  double stall_shutdown_s = 600.0;
  // [0, kMaxSeconds]; 0: never. How often rank 0 may log which rank the others wait for
  // (core/straggler.h), when that is worth a line.
  double straggler_report_s = 60.0;
  // A sub-communicator's (core/comm_split.h) description and its ranks' ranks in the parent,
  // which its failures name ("split 0 of the parent, color 1: ranks 0, 1 here are parent ranks
  // 2, 3"); empty for a communicator started by init.
  std::string membership;
  // The metrics endpoint (CONCORD_METRICS_PORT, "[address:]port"): Prometheus text over HTTP,
  // each rank on metrics_port + local_rank (0: a port the kernel picks), bound to
  // metrics_address; -1: none. A world communicator's only.
  int metrics_port = -1;
  std::string metrics_address = "127.0.0.1";
  // Where each rank of a world communicator writes its end-of-job summary at finalize
  // (CONCORD_SUMMARY_DIR; concordrun sets it); empty: nowhere.
  std::string summary_dir;
  // Where each rank of a world communicator writes its timeline from init to finalize
  // (CONCORD_TIMELINE; core/timeline.h): `timeline`.rank<R>; empty: no timeline.
  std::string timeline;
  // The longest timeout or stall time: a day (durations stay far from overflowing a clock).
  static constexpr double kMaxSeconds = 86400.0;

  // Reads CONCORD_* variables, then, for rank, size, local rank and local size still unset, those
  // of one launcher: the first of torchrun, Open MPI, PMI and Slurm (srun: the step's tasks and
  // this node's share of them) that gives a rank or size, and none whose rank or size contradicts
  // CONCORD_RANK or CONCORD_SIZE (it describes another job). The job id is CONCORD_JOB_ID, else
  // the launcher's (under torchrun, "/restartN" appended after its Nth restart). Notes each
  // member's variable in `sources`. An empty variable counts as unset. Malformed values (a
  // rank that is not a number, an integer beyond 32 bits, ...) are errors naming the variable and
  // its text; ranges are Finalize's.
  static StatusOr<Config> FromEnvironment();
  // Where settings came from, by member name, for error messages: the environment variable
  // FromEnvironment read ("timeout_s" -> "CONCORD_TIMEOUT_S"; "rank" -> "RANK" under torchrun), or
  // the concord_config_t field the C API copied ("concord_config_t.timeout_s"). A setting with no
  // entry (a default, or one set directly in C++) is named by its member.
  std::map<std::string, std::string> sources;
  // The name errors give a setting: its entry in `sources`, else `member` itself.
  std::string SourceOf(const std::string& member) const;

  // Checks every setting (see the comment at the top) and fills the remaining defaults (a lone
  // process is rank 0 of 1).
  Status Finalize();
  // The backend `backend` names, with "auto" resolved against what was built and the launcher.
  std::string ResolvedBackend() const;
};

}  // namespace concord
