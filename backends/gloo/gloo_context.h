// Helpers shared by the Gloo backend and the raw-Gloo benchmark (perf/gloo_raw): a Gloo store over
// a Concord Store, connecting a full mesh of TCP or ibverbs pairs, and turning Gloo's exceptions
// into Status.
#pragma once

#include <gloo/rendezvous/context.h>

#include <exception>
#include <memory>
#include <string>

#include "base/status.h"
#include "rendezvous/store.h"

namespace concord {
namespace gloo_internal {

// A Gloo rendezvous context whose slot counter can be read and reset. Gloo's algorithm objects take
// their slots from this per-context counter at construction; the allreduce cache wraps it around
// (identically on every rank) so it never overflows. Owned through a shared_ptr (Gloo's algorithms
// and options hold one); same thread-safety as gloo::Context.
class GlooContext : public gloo::rendezvous::Context {
 public:
  GlooContext(int rank, int size) : gloo::rendezvous::Context(rank, size) {}
  int next_slot() const { return slot_; }
  void set_next_slot(int slot) { slot_ = slot; }
};

// Gloo's transport: TCP sockets, or ibverbs (InfiniBand or RoCE, through libibverbs; Debian's
// Gloo is built with it).
enum class GlooTransport { kTcp, kIbverbs };

// What ConnectGloo needs; mirrors the relevant BackendOptions fields.
struct GlooConnectOptions {
  GlooTransport transport = GlooTransport::kTcp;
  int rank = 0;
  int size = 1;
  std::string iface;   // network interface ("" = use host)
  std::string host;    // address to bind and advertise ("" = 127.0.0.1)
  std::string prefix;  // key namespace in the store
  std::chrono::milliseconds timeout{30000};
};

// Checks that `transport` can run on this host: for ibverbs, that libibverbs lists an RDMA device
// (the first one, port 1, GID index 0 is used); kUnavailable with what is missing otherwise.
Status CheckTransportAvailable(GlooTransport transport);

// Creates a device of options.transport (TCP: on options.iface, else options.host) and connects a
// full mesh through `store` (keys under options.prefix + "/gloo/"). Blocks until every rank has
// connected or options.timeout passes. `store` must outlive the call only. Collective: all ranks
// call it with the same prefix and size.
StatusOr<std::shared_ptr<GlooContext>> ConnectGloo(const GlooConnectOptions& options, Store* store);

// Converts the exception in flight (call inside a catch block) into a Status naming `operation`:
// kTimeout when Gloo's message speaks of a timeout, else kBackendError.
Status CurrentExceptionToStatus(const std::string& operation);

}  // namespace gloo_internal
}  // namespace concord
