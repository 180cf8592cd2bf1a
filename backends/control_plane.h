// Negotiation traffic: small messages between the coordinator (rank 0) and every other rank, in a
// star. The engine's coordinator protocol (core/coordinator.h) runs on top of it.
//
// Contract: used by one thread at a time (the one stepping the engine), except Wake(), which any
// thread may call to make a blocked Receive() return early. Messages between a pair of ranks
// arrive in order, whole, or not at all. A peer that closes its connection, dies, or stays silent
// for longer than the liveness timeout given at construction turns into a kPeerFailure error
// naming the rank.
//
// Liveness apart from progress: implementations keep the link alive from a thread of their own,
// which they start, own and join in their destructor, and which never waits for the caller or for
// a collective: it sends heartbeats and judges peers' silence by when their messages arrived,
// whether or not the caller was inside Receive() then. So a rank whose caller is away for longer
// than the timeout (a long collective, an application that does not call into Concord) is never
// silent, while a rank that sends nothing at all (a frozen process, a cut link) is reported by
// its peers within about the timeout. A failure found while the caller is away is returned by the
// next Receive() (after the messages that arrived before it), by Drain() once no message waits to
// be received, and by Send() to that peer once no message from that peer waits: until then Send()
// returns OK (its bytes go best effort, or not at all) and Drain() what it would without the
// failure, so the caller reads a peer's last words (rank 0's abort, or another rank's report, which
// names the rank that failed) before the failure that the peer's exit then caused.
#pragma once

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "base/clock.h"
#include "base/status.h"

namespace concord {

struct ControlMessage {
  int from = -1;      // sender's rank
  std::string bytes;  // payload (core/message.h defines the format)
};

// Whether `inbox` holds a message from `rank`: a plane's Send() returns that peer's failure only
// once none waits (the contract above).
inline bool MessageWaitingFrom(const std::deque<ControlMessage>& inbox, int rank) {
  return std::any_of(inbox.begin(), inbox.end(),
                     [rank](const ControlMessage& m) { return m.from == rank; });
}

class ControlPlane {
 public:
  virtual ~ControlPlane() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Queues bytes for rank `to` (rank 0 may send to anyone; others only to 0). Does not wait for the
  // peer to read them. Sending to oneself is an error. Takes the bytes (move them in: the plane
  // may keep them until the transport is done).
  virtual Status Send(int to, std::string bytes) = 0;

  // Waits until a message arrives (returns true and fills *out), Wake() is called or the deadline
  // passes (returns false), or a peer fails (returns the error).
  virtual StatusOr<bool> Receive(ControlMessage* out, Deadline deadline) = 0;

  // Receive() for a thread that would otherwise only sleep (a waiter driving the engine): it
  // polls without sleeping for up to `busy` first, so a reply in a round trip is seen at once
  // rather than after a wake-up. Planes whose Receive() spins anyway keep this default.
  virtual StatusOr<bool> ReceiveBusy(ControlMessage* out, Deadline deadline,
                                     std::chrono::microseconds /*busy*/) {
    return Receive(out, deadline);
  }

  // Waits until every byte Send() queued has been handed to the transport, reading (and keeping
  // for Receive()) whatever arrives meanwhile, so two ranks draining towards each other never
  // block. kTimeout, naming the ranks, when the deadline passes first; a peer's failure as an
  // error once no message waits to be received (the bytes to a failed peer are not waited for). The
  // coordinator drains its responses before it enters a collective: a peer still waiting for the
  // rest of a response could never join it.
  virtual Status Drain(Deadline deadline) = 0;

  // Thread-safe: makes the current or next Receive() return false promptly.
  virtual void Wake() = 0;

  // Thread-safe: `listener` is called once, on the plane's own thread (or at once, on this one,
  // if it already has), when the plane first finds a peer failed by itself, while its caller may
  // be away in a collective that waits for that peer. It must not call into the plane. Planes
  // without a thread of their own never call it (the default).
  virtual void SetFailureListener(std::function<void()> /*listener*/) {}

  // The job failed (the engine's failure path calls it, then hands the plane to another thread
  // for its last messages and its destruction): nothing the plane holds may wait for its peers
  // any more, since some may be dead or cut off. Quick, and no MPI call. The MPI plane then keeps
  // the process from MPI_Finalize, which would wait for every process, and its destruction tells
  // its peers that this rank failed (a TCP plane's peers see its connections close).
  virtual void Abandon() {}
};

class Store;

struct TcpControlPlaneOptions {
  int rank = 0;
  int size = 1;
  std::string host;    // address to listen on and advertise (rank 0 only); "" = 127.0.0.1
  std::string prefix;  // namespace for keys in the store
  std::chrono::milliseconds connect_timeout{30000};
  // A peer silent for this long is declared failed; heartbeats go out at a quarter of it, from
  // the plane's own thread.
  std::chrono::milliseconds liveness_timeout{30000};
  // When set: rank 0 calls it every kGiveUpCheck while it waits for the others to connect, and a
  // failure it returns ends the wait with that error (a sub-communicator whose parent failed: a
  // member died, and its connection will never come).
  std::function<Status()> give_up;
  static constexpr std::chrono::milliseconds kGiveUpCheck{100};
};

// A star of TCP connections: rank 0 listens (its address goes into the store under prefix), every
// other rank connects and authenticates with its rank. Collective: all ranks call it.
StatusOr<std::unique_ptr<ControlPlane>> CreateTcpControlPlane(const TcpControlPlaneOptions& options,
                                                              Store* store);

}  // namespace concord
