// The data plane for host memory: collectives over contiguous CPU buffers, implemented once per
// transport library (Gloo over TCP or ibverbs, and MPI). GPU memory has its own, asynchronous
// interface (backends/device_backend.h: NCCL). A backend sees only base types: no core headers.
//
// Contract: one Backend per lane of a communicator (core/lane.h), used by one thread at a time:
// the thread running the engine's step, or that lane's worker while the stepping thread waits for
// it. Every call is collective (all ranks call it in the same order with matching arguments, which
// the coordinator and the deterministic lane plan guarantee), blocks until done, and returns an
// error instead of hanging once the configured timeout passes or a peer fails. After an error the
// backend is unusable; the engine fails the job.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/control_plane.h"
#include "backends/p2p_transport.h"
#include "base/dtype.h"
#include "base/status.h"

namespace concord {

class Store;

// What every backend needs to start: who we are, where to rendezvous, how long to wait.
struct BackendOptions {
  int rank = 0;
  int size = 1;
  std::string iface;   // network interface to use ("" = pick by host or default)
  std::string host;    // address to bind and advertise ("" = from iface, else 127.0.0.1)
  std::string prefix;  // namespace for this communicator's keys in the store (job id + comm id)
  std::chrono::milliseconds timeout{30000};  // every blocking operation's deadline
  std::string algorithm = "auto";            // backend-specific algorithm override, for benchmarks
  // The number the job knows each of this backend's ranks by, for its errors, when the backend
  // spans a subset of the communicator (a hierarchical backend's local one, and its one across
  // hosts, whose rank h is the one on host h): rank_names[r] for rank r. Empty: its own numbers.
  // Shared memory and Gloo use it.
  std::vector<int> rank_names;
  // When set: a set-up that waits for peers to connect (the point-to-point mesh) calls it every
  // kGiveUpCheck, and a failure it returns ends the wait with that error (a sub-communicator
  // whose parent failed: a member died). Gloo's pair connections end through the store's
  // GiveUp() instead (rendezvous/store.h, backends/gloo/gloo_context.h).
  std::function<Status()> give_up;
  static constexpr std::chrono::milliseconds kGiveUpCheck = TcpControlPlaneOptions::kGiveUpCheck;
};

// One buffer of an allreduce over several (Backend::AllreduceSpans).
struct AllreduceSpan {
  void* data = nullptr;
  size_t count = 0;  // elements
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // A callable, for any thread and valid after the backend is gone, that makes the collectives
  // running on this backend now and later fail promptly, where the backend can interrupt them,
  // instead of waiting for a peer that is gone: the engine calls it when its control plane finds
  // a peer failed while a collective may be blocked. Empty (the default), and for what it cannot
  // interrupt: the backend's own failure detection and timeout apply.
  virtual std::function<void()> Interrupter() { return nullptr; }

  // The job failed, and no collective runs on this backend now or later (the engine's failure path
  // calls it before it tears the backend down and the process may exit): tells the peers that
  // wait, or will wait, for this rank in a collective that it gave up, where the backend can, so
  // that they fail at once and do not take this process's exit for the failure's cause (the shared
  // memory backend names a rank it finds gone). Never waits. The default does nothing: a closed
  // connection tells a TCP peer as much.
  virtual void Abandon() {}
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // The algorithm the last collective called on this backend ran, as the timeline shows it
  // (core/timeline.h): a string with static storage ("ring", "halving_doubling", "two_level", ...),
  // or nullptr where the backend does not say (the default). Read by the thread that made the call,
  // right after it returned successfully and before the next call (a backend is used by one thread
  // at a time); after a failed call its value is unspecified.
  virtual const char* LastAlgorithm() const { return nullptr; }

  // True when Allreduce, AllreduceSpans and ReduceScatter combine every element in rank order, as
  // a left fold of ReduceElements (base/dtype.h) over ranks 0, 1, ..., size-1, whatever the
  // counts, spans and chunking: their results then depend only on the inputs, bit for bit. The
  // engine's deterministic mode (CONCORD_DETERMINISTIC) calls such a backend's reductions
  // directly, and builds its own from Alltoallv and Allgatherv on the others.
  virtual bool ReducesInRankOrder() const { return false; }

  // In-place allreduce of count elements. kAverage is reduced as a sum (the caller divides).
  // Half types are combined in float. count may be 0.
  virtual Status Allreduce(void* data, size_t count, DType dtype, ReduceOp op) = 0;

  // In-place allreduce of several buffers of one dtype, as Allreduce on each (any count may be
  // 0). Every rank passes the same counts in the same order. The default runs them one by one; a
  // backend may run them as one collective.
  virtual Status AllreduceSpans(const std::vector<AllreduceSpan>& spans, DType dtype, ReduceOp op) {
    for (const AllreduceSpan& s : spans) {
      Status status = Allreduce(s.data, s.count, dtype, op);
      if (!status.ok()) return status;
    }
    return Status::Ok();
  }

  // Gathers bytes_per_rank[r] bytes from every rank r into out, in rank order. in holds this rank's
  // bytes_per_rank[rank()] bytes; out holds their sum. Any entry may be 0.
  virtual Status Allgatherv(const void* in, void* out,
                            const std::vector<size_t>& bytes_per_rank) = 0;

  // Broadcasts bytes from root's data into every other rank's data.
  virtual Status Broadcast(void* data, size_t bytes, int root) = 0;

  // Reduce to a root: in holds this rank's count elements; root's out receives their reduction
  // over every rank (in == out allowed: in place). On the other ranks out is scratch of count
  // elements the backend may write (its contents afterwards are unspecified). kAverage is reduced
  // as a sum (the caller divides); half types combine in float; count may be 0. Where
  // ReducesInRankOrder() is true it folds in rank order too. The default copies in into out and
  // runs Allreduce on out on every rank.
  virtual Status Reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                        int /*root*/) {
    if (in != out && count > 0) std::memcpy(out, in, count * DTypeSize(dtype));
    return Allreduce(out, count, dtype, op);
  }

  // Gather to a root: as Allgatherv, but only root's out must receive the result; on the other
  // ranks out is scratch of the same size the backend may write. The default runs Allgatherv.
  virtual Status Gatherv(const void* in, void* out, const std::vector<size_t>& bytes_per_rank,
                         int /*root*/) {
    return Allgatherv(in, out, bytes_per_rank);
  }

  virtual Status Barrier() = 0;

  // Reduce-scatter: in holds the sum of counts elements, rank r's block (counts[r] elements) after
  // the blocks of the ranks before it; out receives this rank's block reduced over every rank
  // (counts[rank()] elements). Every rank passes the same counts (any may be 0); in and out do not
  // overlap. kAverage is reduced as a sum (the caller divides). Half types combine in float.
  virtual Status ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                               DType dtype, ReduceOp op) = 0;

  // Whether OrderedReduceScatter and OrderedAllreduce are this backend's own (see there); false,
  // the default: it has none, and the engine's deterministic mode builds them from Alltoallv and
  // Allgatherv.
  virtual bool HasOrderedReductions() const { return false; }

  // ReduceScatter and Allreduce whose every element is the left fold over ranks that
  // ReducesInRankOrder() describes, for the engine's deterministic mode on a backend whose own
  // reductions do not fold so: ones that overlap the fold with the transfers. Called only where
  // HasOrderedReductions() is true; the defaults refuse (kInternal).
  virtual Status OrderedReduceScatter(const void* /*in*/, void* /*out*/,
                                      const std::vector<size_t>& /*counts*/, DType /*dtype*/,
                                      ReduceOp /*op*/) {
    return Status(Code::kInternal, std::string(name()) + " has no ordered reduce-scatter");
  }
  virtual Status OrderedAllreduce(void* /*data*/, size_t /*count*/, DType /*dtype*/,
                                  ReduceOp /*op*/) {
    return Status(Code::kInternal, std::string(name()) + " has no ordered allreduce");
  }

  // All-to-all of bytes: in holds send_bytes[d] bytes for every rank d, in rank order; out
  // receives recv_bytes[s] bytes from every rank s, in rank order. recv_bytes[s] equals what rank
  // s passes as send_bytes[rank()] (any may be 0); in and out do not overlap.
  virtual Status Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                           const std::vector<size_t>& recv_bytes) = 0;
};

// The backends this build has ("gloo", ...), and a factory by name. Creating a backend is
// collective: all ranks call it with the same name and prefix. Unknown or unbuilt names give
// kUnavailable naming what was built.
std::vector<std::string> BuiltBackends();
StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& name,
                                                 const BackendOptions& options, Store* store);

// Collectives through shared memory among ranks on one host (backends/shm). Collective over the
// lane's ranks, which must all run on this host (their ShmHostIdentity() values are equal): rank 0
// creates the segment under options.prefix in the store, every rank maps it. `buffer_bytes` is
// each rank's share of it. Allreduces of at least `direct_threshold` bytes read the peers' memory
// directly (process_vm_readv), where every rank can (SIZE_MAX: never). kUnavailable, on every rank
// alike, when shared memory cannot be set up (the caller may fall back to another backend); other
// errors when a rank fails or times out.
StatusOr<std::unique_ptr<Backend>> CreateShmBackend(const BackendOptions& options, Store* store,
                                                    size_t buffer_bytes, size_t direct_threshold);
// A backend for hosts that each run several ranks (backends/hierarchical): allreduces,
// allgathers and broadcasts of at least `threshold` bytes (an allgather's of every rank together)
// run in two levels, over `local` (this host's ranks, e.g. shared memory) and `cross` (the ranks
// with this local rank on every host: rank h is host h's), so that each host's network carries
// 1/local->size() of the data per local rank; everything else runs on `flat` (every rank).
// host_of[r] is rank r's host (0 .. cross->size() - 1); a host's local ranks are its ranks in rank
// order, which need not be consecutive; every host runs local->size() ranks. Takes the three
// backends, created collectively by the caller; kInvalidArgument, naming the mismatch, when their
// ranks and sizes do not match host_of and rank.
StatusOr<std::unique_ptr<Backend>> CreateHierarchicalBackend(
    int rank, const std::vector<int>& host_of, std::unique_ptr<Backend> local,
    std::unique_ptr<Backend> cross, std::unique_ptr<Backend> flat, size_t threshold);
// This host as shared memory sees it (boot id and namespaces), or `override_id` when not empty.
std::string ShmHostIdentity(const std::string& override_id);

// A job whose negotiation and data both run over MPI (CONCORD_BACKEND=mpi): this process's rank
// and size are MPI_COMM_WORLD's; control and backend each work on their own duplicate of it.
// p2p carries sends and recvs on a third duplicate (none with one rank). keep_alive holds MPI
// itself (Concord finalizes MPI, if it initialised it, when the last holder of any communicator's
// keep_alive goes): keep it until both transports are destroyed.
struct MpiTransports {
  int rank = 0;
  int size = 1;
  std::unique_ptr<ControlPlane> control;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<P2pTransport> p2p;
  std::shared_ptr<void> keep_alive;
};

// Collective over MPI_COMM_WORLD: every rank calls it, in the same order for each communicator.
// Initialises MPI if needed (see backends/mpi/mpi_environment.h for the thread level rules).
// kUnavailable when this Concord was built without MPI. With `world_ranks`, the transports of a
// sub-communicator of those MPI_COMM_WORLD ranks, in that order (rank i here is world_ranks[i]):
// collective over them only, each calling with the same ranks and the same `identity` (a digest
// of the sub-communicator's name, which no other communicator of the job has: MPI tells
// sub-communicators started at once apart by it, backends/mpi/mpi_backend.h). When MPI matched
// this call with another sub-communicator's (their tags coincided): kMismatch on every member,
// naming the cause.
StatusOr<MpiTransports> CreateMpiTransports(std::chrono::milliseconds timeout,
                                            const std::vector<int>& world_ranks = {},
                                            uint64_t identity = 0);

}  // namespace concord
