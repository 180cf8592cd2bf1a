// The MPI backend and control plane (registry.cc reaches them through CreateMpiTransports in
// backends/backend.h; tests use these factories directly).
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/control_plane.h"
#include "backends/mpi/mpi_environment.h"
#include "base/clock.h"

namespace concord {

// The most bytes one MPI call moves: larger buffers go in several calls (MPI counts are int).
constexpr size_t kMpiMaxMessageBytes = size_t{1} << 30;

// Polls MPI_Test on *request, holding env's lock for each test, until it completes (OK, or the
// error MPI reports), the deadline passes (kTimeout naming `what`) or `interrupted` (when given)
// becomes true (kBackendError: a peer failed). In either of the last two cases the request stays
// pending (MPI cannot cancel a collective) and env is marked abandoned.
Status WaitForRequest(MpiEnvironment& env, MPI_Request* request, Deadline deadline,
                      const std::string& what, const std::atomic<bool>* interrupted = nullptr);

// A private duplicate of `base` (MPI_Comm_idup, waited for until the deadline) with
// MPI_ERRORS_RETURN. Collective over base.
StatusOr<MPI_Comm> Duplicate(MpiEnvironment& env, MPI_Comm base, Deadline deadline);

// A communicator of the MPI_COMM_WORLD ranks `world_ranks`, in that order, for a
// sub-communicator's transports to duplicate; the caller frees it. MPI_Comm_create_group, with
// `identity` (a digest of the sub-communicator's name, which no other communicator of the job
// has) modulo MPI_TAG_UB + 1 as its tag: sub-communicators started at once, from several threads,
// in different orders on different ranks, are told apart by their tags. Under
// MPI_THREAD_MULTIPLE the call runs without the environment's lock, so that they can all go on at
// once (under SERIALIZED it holds it: start sub-communicators from one thread at a time there).
// Collective over those ranks only. MPI gives it no deadline: every member has just agreed to
// create it.
StatusOr<MPI_Comm> CreateGroupComm(MpiEnvironment& env, const std::vector<int>& world_ranks,
                                   uint64_t identity);

// Checks that every member of `comm`, a communicator CreateGroupComm just made, started it as the
// same sub-communicator (`identity`). MPI matches MPI_Comm_create_group calls by group and tag
// only, so two sub-communicators of the same ranks started at once whose tags coincide (their
// identities are equal modulo MPI_TAG_UB + 1) can be matched across: this rank's one with another
// rank's other one. kMismatch then, on every member, saying so, instead of two cross-wired
// communicators. Collective over comm, waited for until the deadline.
Status CheckSameIdentity(MpiEnvironment& env, MPI_Comm comm, uint64_t identity, Deadline deadline);

// A Backend over its own duplicate of MPI_COMM_WORLD: allreduce is MPI_Iallreduce (half types,
// 8-bit sums and products and floating min and max through user-defined MPI_Ops over Concord's
// kernels, so that results are ReduceElements' bits), allgatherv MPI_Iallgatherv (one MPI_Ibcast
// per rank when a count or displacement would not fit MPI's int), broadcast MPI_Ibcast, barrier
// MPI_Ibarrier; each polled until `timeout` or until its Interrupter() is called (the engine
// calls it when its control plane finds a peer failed). Calls move at most max_message_bytes at a
// time (tests lower it to exercise the splitting). Collective over `base` (a sub-communicator's
// group).
StatusOr<std::unique_ptr<Backend>> CreateMpiBackend(std::shared_ptr<MpiEnvironment> env,
                                                    std::chrono::milliseconds timeout,
                                                    size_t max_message_bytes = kMpiMaxMessageBytes,
                                                    MPI_Comm base = MPI_COMM_WORLD);

// A P2pTransport (backends/p2p_transport.h) over its own duplicate of `base`, with its own
// progress thread (mpi_p2p_transport.cc). Collective over base; waits for the duplicate at most
// `timeout`.
StatusOr<std::unique_ptr<P2pTransport>> CreateMpiP2pTransport(std::shared_ptr<MpiEnvironment> env,
                                                              std::chrono::milliseconds timeout,
                                                              MPI_Comm base = MPI_COMM_WORLD);

// A ControlPlane over its own duplicate of `base` (see MpiControlPlane in mpi_control_plane.cc).
// Collective over base; waits for the duplicate at most liveness_timeout.
StatusOr<std::unique_ptr<ControlPlane>> CreateMpiControlPlane(
    std::shared_ptr<MpiEnvironment> env, std::chrono::milliseconds liveness_timeout,
    MPI_Comm base = MPI_COMM_WORLD);

}  // namespace concord
