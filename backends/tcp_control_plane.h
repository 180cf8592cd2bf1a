// The TCP control plane: a star of TCP connections centred on rank 0 (see CreateTcpControlPlane in
// backends/control_plane.h for the factory).
//
// Setup protocol. Rank 0 writes a random nonce to the store under prefix + "/cp/nonce", listens on
// options.host (port 0 = ephemeral) and publishes "host:port" under prefix + "/cp/addr". Every
// other rank reads both keys, connects and sends a HELLO (all integers little-endian):
//   u32 magic 'CCPH' | u16 version | u16 zero | i32 rank | i32 size | 32 bytes nonce (hex)
// Rank 0 answers with u32 magic 'CCPA' | u32 result (0 accepted, else a refusal reason below) and
// closes refused connections. It accepts exactly size - 1 distinct ranks before connect_timeout.
//
// Stream protocol, after the handshake, in both directions: frames of
//   u32 type (1 DATA, 2 HEARTBEAT) | u32 length (<= kControlPlaneMaxFrame; 0 for HEARTBEAT) | bytes
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "backends/control_plane.h"
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

// Contract: owns one socket per peer (rank 0: size - 1 of them; others: one, to rank 0) and an
// eventfd for Wake(). Used by one thread, except Wake(), which any thread may call. Send() never
// blocks: it writes what the socket takes and queues the rest, which later Send() and Receive()
// calls keep flushing. Receive() blocks in poll() until a message, Wake(), the deadline, or a peer
// failure; while it runs it sends heartbeats and checks liveness (time spent outside Receive() does
// not count as a peer's silence). The first failure of a peer is
// sticky: every later Receive(), and Send() to that peer, returns it. The destructor tries for up
// to a second to flush queued bytes, then closes every socket (peers see kPeerFailure).
class TcpControlPlane : public ControlPlane {
 public:
  struct Peer;

  TcpControlPlane(int rank, int size, std::chrono::milliseconds liveness_timeout, net::Fd wake,
                  std::vector<std::unique_ptr<Peer>> peers);
  ~TcpControlPlane() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status Send(int to, std::string bytes) override;
  StatusOr<bool> Receive(ControlMessage* out, Deadline deadline) override {
    return ReceiveBusy(out, deadline, std::chrono::microseconds(0));
  }
  // Calls poll() without a timeout until `busy` has passed, then blocks in it.
  StatusOr<bool> ReceiveBusy(ControlMessage* out, Deadline deadline,
                             std::chrono::microseconds busy) override;
  Status Drain(Deadline deadline) override;
  void Wake() override;

 private:
  Peer* PeerFor(int rank);
  // Writes queued bytes until the socket would block; marks the peer failed on errors.
  void Flush(Peer* p);
  // Reads what is available and parses whole frames into inbox_; marks the peer failed on EOF,
  // errors and malformed frames.
  void ReadFrom(Peer* p);
  void Consume(Peer* p, const char* data, size_t n);
  void Enqueue(Peer* p, uint32_t type, const std::string& bytes);
  void MarkFailed(Peer* p, Status status);
  // Sends due heartbeats and declares silent peers failed.
  void Tick();

  const int rank_;
  const int size_;
  const std::chrono::milliseconds liveness_timeout_;
  const net::Fd wake_;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::deque<ControlMessage> inbox_;
  Status failure_;  // the first peer failure
  // When Receive() last returned. Silence is counted only while this rank listens: after a long
  // absence (the caller was busy, e.g. in a long collective, and so were its peers), each peer
  // gets half the liveness timeout to be heard again before it counts as silent.
  Clock::time_point last_listen_ = Clock::now();
};

}  // namespace concord
