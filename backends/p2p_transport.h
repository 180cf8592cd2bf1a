// Point-to-point messages between two ranks of a communicator, by (peer, tag), on connections of
// their own: no coordinator, no collective, nothing shared with the lanes or the control plane.
// Implemented over TCP sockets meshed through the store (backends/tcp_p2p_transport.h: the Gloo
// backends' jobs) and over a duplicate of MPI_COMM_WORLD (backends/mpi/mpi_p2p_transport.cc).
// A transport sees only base types; core's PointToPoint (core/p2p.h) turns requests into calls.
//
// Contract (every implementation):
// - A message is its P2pMeta (dtype, shape, payload bytes) and its payload. Messages from one rank
//   to another with one tag arrive in the order they were sent (FIFO per (peer, tag)); different
//   tags and peers never wait for each other (but for a bounded pause: TCP holds a large payload
//   whose recv is not posted yet in its socket for up to 20 ms, and what follows it on that link
//   waits that long), and any number may be in flight.
// - Send() and Recv() are thread-safe, never block on the network, and call `done` exactly once:
//   on the transport's progress thread, on the calling thread when the operation completes (or
//   is refused) at once, or on a thread inside Drive(). `done` must not call back into the
//   transport.
// - A send's data must stay valid until its `done`. A send completes once the transport has handed
//   its bytes on (TCP: written to the socket, or read by a same-host receiver from the sender's
//   memory; MPI: once MPI completes the send).
// - A recv matches the next message from (peer, tag). When its meta arrives, the transport calls
//   `place(meta)` (on the progress thread, or on the thread posting the recv when the message is
//   already there; under the transport's lock: it must not block or call back)
//   for where the payload goes: a buffer of exactly meta.bytes, or nullptr to consume and drop the
//   payload (the receiver refused the message: the stream stays in sync for the next one). A recv
//   not matched by its deadline completes with kTimeout; one whose payload has not arrived by then
//   fails the link to that peer (its stream can no longer be resynchronised).
// - A peer that fails (its connection closes) fails every operation with it with kPeerFailure
//   naming the peer; later operations with it fail at once.
// - Close() completes every operation in flight with `status`, refuses later ones with it, and
//   stops the progress thread; the destructor closes with kNotInitialized if Close() was not
//   called. Close() must not be called from `done` or `place`. It returns within a bound even
//   when a thread is stuck inside the transport's library (MPI: 1 s, then the transport is
//   abandoned and that thread left to itself: should it come back, it completes nothing and
//   calls no `place`; what MPI started still writes into its buffers).
// - Finish() tells every peer that this rank's communicator finalizes: each peer then fails its
//   operations with this rank at once, with kPeerFailure saying that the rank finalized, and
//   PeerFinalized() says so there (such a failure is the cause itself: core holds nothing for
//   another). Messages this rank sent before still arrive. On MPI a peer's send that MPI started
//   cannot be withdrawn: it fails when MPI completes it, once this rank dropped its message, or at
//   its deadline, alone, if this rank never takes it (it closed first); one that a recv of this
//   rank took, or that MPI sent eagerly (as a TCP send completes once written), completes. Where
//   the transport can end at once it is Close() too (TCP, which refuses later operations with
//   `status` from its start and may wait a bounded time, 2 s at most in all, driving what is in
//   flight meanwhile: for what it still has to write (the receipts it owes same-host peers whose
//   messages it read from their memory, so that their sends complete; messages queued behind a
//   full socket, whose sends then complete as sent) and for the receipts of messages that
//   same-host peers read from its memory, so that a send whose message arrived completes as sent,
//   1 s at most for both; for room for the goodbye in a socket full of what was sent; then until
//   each peer ends its side; a link with something still unwritten gets no goodbye, its peer
//   seeing the connection close); MPI instead refuses later operations and stays open until
//   Close(), as a message MPI started cannot be withdrawn and a peer may still take it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/dtype.h"
#include "base/status.h"

namespace concord {

// What a message is: the receiver checks it (or adopts it) before the payload lands.
struct P2pMeta {
  DType dtype = DType::kUint8;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;  // the payload's size: the shape's elements times the dtype's size
};

// The most dimensions a message's shape has (CONCORD_MAX_DIMS; core checks they agree).
constexpr size_t kP2pMaxDims = 8;

class P2pTransport {
 public:
  using Done = std::function<void(const Status&)>;
  using Place = std::function<void*(const P2pMeta&)>;

  virtual ~P2pTransport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The largest tag this transport carries (tags are 0 .. max_tag()).
  virtual int64_t max_tag() const = 0;

  virtual void Send(int peer, int64_t tag, const P2pMeta& meta, const void* data, Deadline deadline,
                    Done done) = 0;
  virtual void Recv(int peer, int64_t tag, Deadline deadline, Place place, Done done) = 0;
  virtual void Close(const Status& status) = 0;
  // Tells every peer, behind what this rank sent, that it finalized. Returns true when that closed
  // the transport with `status` too (TCP; MPI when a thread stuck inside MPI kept it from telling:
  // then abandoned, as by Close()); false when Close() is still to come (MPI: later sends and
  // recvs are refused with `status` meanwhile; a transport that cannot tell its peers: nothing is
  // done).
  virtual bool Finish(const Status& status) {
    (void)status;
    return false;
  }
  // Whether `peer` told this rank that it finalized (Finish() there). Lock-free: may be called
  // from `done`.
  virtual bool PeerFinalized(int peer) const {
    (void)peer;
    return false;
  }
  // Progress by the waiter: runs the transport's progress on the calling thread until `finished`
  // returns true, the deadline passes, nothing is in flight, or the transport closes; `done` of
  // any operation may run here. It polls without giving up the CPU for `busy_poll` after the last
  // progress (0 where spinning would take the core from the rank it waits for), then yields. A
  // transport without it returns at once (its progress thread drives). Not from `done` or `place`.
  virtual void Drive(const std::function<bool()>& finished, Deadline deadline,
                     std::chrono::microseconds busy_poll) {
    (void)finished;
    (void)deadline;
    (void)busy_poll;
  }
  // Whether the calling thread is the transport's progress thread (which must never wait for one
  // of the transport's operations).
  virtual bool OnProgressThread() const = 0;
  // Whether this rank reads large payloads from `peer` straight from its memory (same host), for
  // logs and tests.
  virtual bool ReadsDirectly(int /*peer*/) const { return false; }
};

// Same-host direct reads for the TCP transport: a payload of at least min_bytes between ranks
// whose host_identity (ShmHostIdentity) is equal and who can read each other's memory
// (process_vm_readv; probed at setup) is read by the receiver from the sender's buffer instead of
// travelling the socket. An empty host_identity: never.
struct P2pDirectReads {
  std::string host_identity;
  uint64_t min_bytes = UINT64_MAX;
};

struct BackendOptions;
class Store;

// The TCP transport of Gloo jobs (backends/tcp_p2p_transport.cc: setup and wire format).
// Collective: every rank of options.size calls it with the same prefix (the communicator's, plus
// "/p2p") and the same `direct` (its host_identity each rank's own); options.timeout bounds the
// setup.
StatusOr<std::unique_ptr<P2pTransport>> CreateTcpP2pTransport(
    const BackendOptions& options, Store* store, const P2pDirectReads& direct = P2pDirectReads());

}  // namespace concord
