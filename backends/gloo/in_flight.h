// Interrupting a Gloo collective from another thread, and an all-to-all, allgather, broadcast
// and barrier that can be interrupted.
//
// Why: Gloo fails the operations pending on a pair when its connection breaks, but not a message
// it is in the middle of sending or receiving (tcp::Pair::signalException skips an unbound
// buffer's write in its transmit queue and its read in progress). So a rank waiting for such a
// message to a peer that died mid-transfer waits out the whole timeout, although Concord's
// control plane already knows the peer is gone (seen: every survivor of a 16 MiB all-to-all
// blocked in UnboundBuffer::waitSend until CONCORD_TIMEOUT_S). Gloo's own collectives keep their
// buffers to themselves, or (allgatherv, broadcast) take ours but ignore an aborted wait and go on
// waiting; Concord's own ones (the ring reduce-scatter, the span allreduce, the ordered
// reductions and the all-to-all, allgather, broadcast and barrier below) register theirs here, so
// that Interrupt() can abort their waits.
#pragma once

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace concord {
namespace gloo_internal {

// The unbound buffers of the collective running on one backend. Contract: Scope and the waits run
// on the backend's thread; Interrupt() on any thread, at any time, once or more: it aborts the
// waits of the buffers registered now and of every buffer registered later (it is final), so
// that the collective throws promptly.
class InFlight {
 public:
  // Registers buffers for one collective, until it ends; throws at once when already interrupted.
  class Scope {
   public:
    Scope(InFlight* in_flight, std::vector<gloo::transport::UnboundBuffer*> buffers);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    InFlight* const in_flight_;
    const std::vector<gloo::transport::UnboundBuffer*> buffers_;
  };

  void Interrupt();

 private:
  std::mutex mu_;
  bool interrupted_ = false;
  std::vector<gloo::transport::UnboundBuffer*> buffers_;
};

// Throws Gloo's IoException for a wait that returned false: `what` of `collective` was aborted
// (by InFlight::Interrupt, as a peer failed).
void ThrowIfAborted(bool completed, const char* collective, const char* what);

// All-to-all of bytes, as gloo::alltoallv (in: send_bytes[d] bytes for each rank d, in rank order;
// out: recv_bytes[s] from each rank s), with every message on `slot` of `context` and its buffers
// in `in_flight` (may be null). Blocks; throws Gloo's exceptions on failure or timeout (the
// context's, per wait).
void InterruptibleAlltoallv(const std::shared_ptr<gloo::Context>& context, const void* in,
                            const std::vector<size_t>& send_bytes, void* out,
                            const std::vector<size_t>& recv_bytes, uint64_t slot,
                            InFlight* in_flight);

// Allgather of bytes, as gloo::allgatherv and with its ring (at step i each rank passes block
// rank - i to rank + 1 and receives block rank - i - 1 from rank - 1): out receives bytes[r] from
// each rank r, in rank order; in is this rank's bytes[rank] (it may be their place in out). Every
// message on `slot` of `context`, the buffer in `in_flight` (may be null). Blocks; throws Gloo's
// exceptions on failure or timeout (the context's, per wait).
void InterruptibleAllgatherv(const std::shared_ptr<gloo::Context>& context, const void* in,
                             void* out, const std::vector<size_t>& bytes, uint64_t slot,
                             InFlight* in_flight);

// Broadcast of `bytes` bytes of `data` from `root`, in place, as gloo::broadcast and with its
// binomial tree (in round i the ranks that have the data send it to the ranks 2^i further from the
// root). Messages, buffers and failures as InterruptibleAllgatherv's.
void InterruptibleBroadcast(const std::shared_ptr<gloo::Context>& context, void* data, size_t bytes,
                            int root, uint64_t slot, InFlight* in_flight);

// Barrier among the context's ranks, as gloo::barrier (a dissemination barrier: in round k each
// rank sends a byte to rank + 2^k and receives one from rank - 2^k), with every message on `slot`
// and its buffers in `in_flight` (may be null). Blocks; throws Gloo's exceptions on failure or
// timeout (the context's, per wait).
void InterruptibleBarrier(const std::shared_ptr<gloo::Context>& context, uint64_t slot,
                          InFlight* in_flight);

}  // namespace gloo_internal
}  // namespace concord
