// Helpers shared by the Gloo backend and the raw-Gloo benchmark (perf/gloo_raw): a Gloo store over
// a Concord Store, connecting a full mesh of TCP or ibverbs pairs, and turning Gloo's exceptions
// into Status.
#pragma once

#include <gloo/rendezvous/context.h>

#include <chrono>
#include <exception>
#include <functional>
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
  // Gloo's connectFullMesh (a pair to every other rank), except that each pair's address goes
  // through `store` under a key of its own ("r/p": rank r's end of its pair with rank p; a rank
  // sets size - 1 keys and gets size - 1, so the store serves size^2 addresses in all, where
  // Gloo's one key per rank makes it serve size^3), and that while the pairs connect `give_up`
  // is called every kGiveUpCheck from a thread of its own: once it fails, the pair being
  // connected is closed, no other is started, *gave_up is set to its failure and this throws.
  // Otherwise it throws what Gloo throws (a peer that never connects: after 5 times the
  // context's timeout, Gloo's wait for an initial connect). Collective, like connectFullMesh.
  void ConnectFullMesh(gloo::rendezvous::Store& store,
                       const std::shared_ptr<gloo::transport::Device>& device,
                       const std::function<Status()>& give_up, Status* gave_up);
  static constexpr std::chrono::milliseconds kGiveUpCheck{100};
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
// connected, options.timeout passes, or `store`'s GiveUp() fails (a sub-communicator's member
// died: its error is returned; see GlooContext::ConnectFullMesh). `store` must outlive the call
// only. Collective: all ranks call it with the same prefix and size.
StatusOr<std::shared_ptr<GlooContext>> ConnectGloo(const GlooConnectOptions& options, Store* store);

// Converts the exception in flight (call inside a catch block) into a Status naming `operation`:
// kTimeout when Gloo's message speaks of a timeout, else kBackendError.
Status CurrentExceptionToStatus(const std::string& operation);

}  // namespace gloo_internal
}  // namespace concord
