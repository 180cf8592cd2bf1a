// The TCP control plane: a star of TCP connections centred on rank 0 (see CreateTcpControlPlane in
// backends/control_plane.h for the factory).
//
// Setup protocol. Rank 0 writes a random nonce to the store under prefix + "/cp/nonce", listens on
// options.host (port 0 = ephemeral) and publishes "host:port" under prefix + "/cp/addr". Every
// other rank reads both keys, connects and sends a HELLO (all integers little-endian):
//   u32 magic 'CCPH' | u16 version | u16 zero | i32 rank | i32 size | 32 bytes nonce (hex)
// Rank 0 answers with u32 magic 'CCPA' | u32 result (0 accepted, else a refusal reason below) and
// closes refused connections. It accepts exactly size - 1 distinct ranks before connect_timeout.
// A HELLO with the right nonce but another size (a misconfigured job) is refused, and fails rank
// 0's setup at once, naming the rank and both sizes.
//
// Stream protocol, after the handshake, in both directions: frames of
//   u32 type (1 DATA, 2 HEARTBEAT) | u32 length (<= kControlPlaneMaxFrame; 0 for HEARTBEAT) | bytes
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/control_plane.h"
#include "base/mutex.h"
#include "rendezvous/net.h"

namespace concord {

constexpr uint32_t kControlPlaneMaxFrame = 1u << 30;
constexpr uint32_t kControlFrameData = 1;
constexpr uint32_t kControlFrameHeartbeat = 2;
constexpr uint32_t kControlHelloMagic = 0x48504343;  // "CCPH" on the wire
constexpr uint32_t kControlAckMagic = 0x41504343;    // "CCPA" on the wire
constexpr uint16_t kControlPlaneVersion = 1;
constexpr size_t kControlHelloSize = 48;
constexpr size_t kControlNonceSize = 32;

// Contract: owns one socket per peer (rank 0: size - 1 of them; others: one, to rank 0), three
// eventfds and, when it has peers, a liveness thread. The caller uses it from one thread at a time
// (Send, Receive, Drain, destruction); Wake() may come from any thread. Send() never blocks: it
// writes what the socket takes and queues the rest, which later Send(), Receive() and Drain() calls
// and the liveness thread's rounds keep flushing. Receive() blocks in poll() until a message,
// Wake(), the deadline, or a peer failure; it sends no heartbeats and keeps no timers.
//
// Liveness is the liveness thread's alone, whatever the caller does (a collective longer than the
// timeout, an application away from Concord). Each round it reads what arrived (frames go to the
// inbox, so heartbeats never back up in a full socket buffer and a close is seen), flushes queued
// bytes, queues a HEARTBEAT to each peer it sent nothing to for a quarter of the liveness timeout,
// and fails each peer whose socket has received no data for the timeout. Silence is measured by
// the kernel's receive time (TCP_INFO's tcpi_last_data_recv), not by when anybody read, so it
// does not depend on whether this rank was listening. Between rounds the thread sleeps in poll()
// on the peers' sockets for POLLRDHUP (a peer closing) only, so data arriving never wakes it; a
// round runs at the earliest of: a heartbeat due, a peer's silence expiring, a peer closing. What
// a round adds to the inbox or a failure it finds wakes a blocked Receive() or Drain(). The thread
// takes only mu_, which nobody holds across a blocking call.
//
// The first failure of a peer is sticky: every later Receive() and Drain(), and Send() to that
// peer, returns it, Receive() and Drain() only once the inbox is empty, Send() once every message
// that peer sent before it has been received: until then Send() drops its bytes and returns OK,
// so that the caller reads the peer's last message (rank 0's abort, another rank's report: each
// names the rank that failed) before the failure that its closing caused. Send() finding a
// connection closed first reads what is still readable on it, for the same reason. The destructor
// stops and joins the liveness thread, then tries for up to a second to flush queued bytes, then
// closes every socket (peers see kPeerFailure).
//
// Locks: mu_ guards the peers, the inbox and the failure. It is a leaf: held only around
// non-blocking socket calls and bookkeeping, never while calling out or waiting.
class TcpControlPlane : public ControlPlane {
 public:
  struct Peer;

  // wake: Wake()'s eventfd; notify: the liveness thread's to a blocked Receive() or Drain();
  // stop: the destructor's to the liveness thread. Starts the liveness thread (with peers only).
  TcpControlPlane(int rank, int size, std::chrono::milliseconds liveness_timeout, net::Fd wake,
                  net::Fd notify, net::Fd stop, std::vector<std::unique_ptr<Peer>> peers);
  ~TcpControlPlane() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status Send(int to, std::string bytes) override EXCLUDES(mu_);
  StatusOr<bool> Receive(ControlMessage* out, Deadline deadline) override EXCLUDES(mu_) {
    return ReceiveBusy(out, deadline, std::chrono::microseconds(0));
  }
  // Calls poll() without a timeout until `busy` has passed, then blocks in it.
  StatusOr<bool> ReceiveBusy(ControlMessage* out, Deadline deadline,
                             std::chrono::microseconds busy) override EXCLUDES(mu_);
  Status Drain(Deadline deadline) override EXCLUDES(mu_);
  void Wake() override;
  void SetFailureListener(std::function<void()> listener) override EXCLUDES(mu_);
  // Thread-safe, and callable while another thread uses the plane: the first peer failure the
  // plane has found (OK while none), without receiving anything. The communicator's start looks
  // at it while it waits for the others' other connections (a rank whose start failed closes
  // this one at once).
  Status PeerFailure() EXCLUDES(mu_);

 private:
  Peer* PeerFor(int rank) REQUIRES(mu_);
  // Writes queued bytes until the socket would block; marks the peer failed on errors.
  void Flush(Peer* p) REQUIRES(mu_);
  // Reads what is available and parses whole frames into inbox_; marks the peer failed on EOF,
  // errors and malformed frames.
  void ReadFrom(Peer* p) REQUIRES(mu_);
  void Consume(Peer* p, const char* data, size_t n) REQUIRES(mu_);
  void Enqueue(Peer* p, uint32_t type, const std::string& bytes) REQUIRES(mu_);
  void MarkFailed(Peer* p, Status status) REQUIRES(mu_);
  // One round of the liveness thread (see the contract); returns when the next one is due.
  Clock::time_point Beat() REQUIRES(mu_);
  // The liveness thread's body: rounds until stop_ is signalled.
  void LivenessLoop() EXCLUDES(mu_);

  const int rank_;
  const int size_;
  const std::chrono::milliseconds liveness_timeout_;
  const net::Fd wake_;
  const net::Fd notify_;
  const net::Fd stop_;
  // A Peer is reached only through peers_ (the vector itself never changes after construction),
  // so mu_ guards every Peer's fields too.
  Mutex mu_;
  std::vector<std::unique_ptr<Peer>> peers_ GUARDED_BY(mu_);
  std::deque<ControlMessage> inbox_ GUARDED_BY(mu_);
  Status failure_ GUARDED_BY(mu_);  // the first peer failure
  // Called by the liveness thread when it finds the first failure (SetFailureListener).
  std::function<void()> failure_listener_ GUARDED_BY(mu_);
  std::thread liveness_;  // last: it starts once every member above exists
};

// CreateTcpControlPlane (backends/control_plane.h), for a caller that needs PeerFailure().
StatusOr<std::unique_ptr<TcpControlPlane>> StartTcpControlPlane(
    const TcpControlPlaneOptions& options, Store* store);

}  // namespace concord
