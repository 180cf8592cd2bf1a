// The TCP store: a server that the launcher runs for the whole job, and the Store that each rank
// uses to talk to it. Every connection must first present the job's secret token.
//
// Wire protocol (all integers little-endian; rendezvous/tcp_store_wire.h encodes and parses it).
// Every message is one frame:
//   u32 magic 'CSTR' (0x52545343) | u8 version (1) | u8 type | u16 flags (0) | u32 body length
// followed by the body, at most kTcpStoreMaxFrame bytes. Requests (client -> server):
//   HELLO (1): the token bytes, at most kTcpStoreMaxToken. Must be the first frame; anything
//              else (refused from its header, before any body is read), a longer one or a wrong
//              token is answered with AUTH_FAILED and the connection is closed.
//   SET   (2): bytes key, bytes value            ("bytes" = u32 length + the bytes)
//   GET   (3): u64 timeout_ms (all ones: none), bytes key
//   WAIT  (4): u64 timeout_ms, u32 count, count x bytes key
//   ADD   (5): bytes key, u64 delta (two's complement)
//   GET_FIRST (6): u64 timeout_ms, u32 count (at least 1), count x bytes key
// Reply (server -> client), one per request, in order:
//   REPLY (0x80): u8 status code (concord::Code), then for OK: GET's value, ADD's u64 new value,
//                 GET_FIRST's u32 index (of the first key in its list that exists) and that
//                 key's value, nothing otherwise; for errors: the message text.
// GET, WAIT and GET_FIRST on missing keys are parked in the server and answered when the keys
// appear (GET_FIRST: any of them) or with TIMEOUT when timeout_ms passes, so clients never poll.
// Bytes that do not parse (bad magic, version, type, length or body) get a PROTOCOL_ERROR reply and
// the connection is closed; the server keeps serving everyone else.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/mutex.h"
#include "rendezvous/net.h"
#include "rendezvous/store.h"
#include "rendezvous/tcp_store_wire.h"

namespace concord {

// Contract: owns the listening socket, every client connection, the key-value map and one thread
// that serves them all with epoll; the map lives only in that thread, so no locks. Start returns
// once the socket listens. The destructor stops the thread and closes every connection (blocked
// clients then see kPeerFailure). port(), address() and requests() are thread-safe.
//
// A request costs the server what it touches, not what it holds: epoll reports only the
// connections with something to do, a SET or ADD answers the parked requests that wait for its key
// (found by key), and parked deadlines wait in order of expiry. So thousands of connections, most
// of them parked while a job starts, cost no more per request than a few (with poll() over every
// connection, a GET took 9 us beside no idle connection and 1.3 ms beside 4000).
//
// Unauthenticated clients (anyone who can reach the port) cost little: one buffers at most a
// HELLO frame; one that has not authenticated within 10 s is dropped; at most
// kMaxUnauthenticated are held, and when they fill that, the oldest is dropped to make room once
// it has had kUnauthenticatedGrace to send its HELLO (a real client sends it at once), while
// until then new connections wait in the listen queue (not refused, so a burst of real clients
// larger than the cap is only delayed). When accept() fails (out of descriptors: EMFILE,
// ENFILE) the connection also waits in the queue and accepting pauses for 100 ms instead of
// polling the still-readable listener in a loop; the server has no log, so this is silent.
class TcpStoreServer {
 public:
  static constexpr size_t kMaxUnauthenticated = 256;
  static constexpr std::chrono::milliseconds kUnauthenticatedGrace{1000};

  // Listens on bind_host ("" = 127.0.0.1) and port (0 = ephemeral) and starts serving. The token
  // must be 1 to kTcpStoreMaxToken bytes.
  static StatusOr<std::unique_ptr<TcpStoreServer>> Start(const std::string& bind_host, int port,
                                                         const std::string& token);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  // "bind_host:port" as bound.
  const std::string& address() const { return address_; }
  // Requests received from authenticated clients so far (HELLOs not counted): what a job's
  // waiting ranks cost the server (tests).
  uint64_t requests() const { return requests_.load(std::memory_order_relaxed); }

 private:
  struct Client;
  TcpStoreServer(net::Fd listen_fd, net::Fd wake_fd, net::Fd epoll_fd, int port,
                 std::string address, std::string token);
  void Loop();
  // Accepts pending connections, within the unauthenticated cap; may pause accepting.
  void AcceptAll();
  // Stops watching the listener for 100 ms (pending connections wait in its queue).
  void PauseAccepting();
  // Watches the listener again once the pause is over; returns how many ms it has left (-1: none).
  int ResumeAccepting();
  // Drops unauthenticated clients older than their limit; returns when the next one is due
  // (ms, -1 when none is held).
  int DropSilentClients();
  // Answers the parked requests whose deadline has passed; returns the ms to the next (-1: none).
  int ExpireParked();
  // Reads what is available; false when the client must be dropped now.
  bool ReadFrom(Client* c);
  // Handles complete frames in c's buffer until it parks, closes or runs out of bytes.
  void HandleFrames(Client* c);
  void HandleRequest(Client* c, uint8_t type, const char* body, size_t size);
  // Answers c's parked request if all its keys exist (GET_FIRST: any), or with kTimeout when
  // `expired`; true if answered (then no longer parked).
  bool TryAnswerParked(Client* c, bool expired);
  // Files c's parked request under its keys and deadline, and takes it out again.
  void Park(Client* c);
  void Unpark(Client* c);
  // Answers the requests parked on `key`, which a SET or ADD just wrote.
  void WakeWaitersOf(const std::string& key);
  void Reply(Client* c, Code code, const std::string& payload);
  void Fail(Client* c, Code code, const std::string& message);
  void Flush(Client* c);
  // What epoll watches on c follows what it may do: read unless closing, write while output waits.
  void Watch(Client* c);
  // Marks c to be dropped at the end of this round of events (its pointer stays valid until then).
  void Drop(Client* c);
  void Reap();

  const net::Fd listen_fd_;
  const net::Fd wake_fd_;   // eventfd: the destructor writes it to stop Loop()
  const net::Fd epoll_fd_;  // the listener, wake_fd_ and every client
  const int port_;
  const std::string address_;
  const std::string token_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> requests_{0};
  // Owned by the server thread only.
  std::unordered_map<Client*, std::unique_ptr<Client>> clients_;
  // In accept order; authenticated ones linger until they reach the front, dropped ones until
  // Reap() (which frees them).
  std::deque<Client*> unauthenticated_;
  size_t unauthenticated_count_ = 0;  // those of them still unauthenticated and not dropped
  std::vector<Client*> dropped_;      // this round's, reaped at its end
  // Parked requests by key, and those with a deadline by its time.
  std::unordered_map<std::string, std::unordered_set<Client*>> waiting_;
  std::multimap<Clock::time_point, Client*> expiries_;
  bool accepting_ = true;                  // whether epoll watches the listener
  Clock::time_point accept_paused_until_;  // the listener is not watched before this
  std::map<std::string, std::string> values_;
  std::thread thread_;
};

// Contract: a client of a TcpStoreServer, thread-safe. Each call runs on a connection of its own
// (requests and replies share a connection, and a Get, Wait or GetFirst may wait in the server):
// one left idle by an earlier call, or a new one, connected and authenticated like the first. So
// a call that waits for a key never delays another thread's calls (two threads that each wait
// for a key the other's peer sets, as when sub-communicators start at once, would deadlock
// otherwise). Set and Add wait at most op_timeout; Get, Wait and GetFirst use the caller's
// deadline (the server answers kTimeout then). A connection that failed (an I/O error, a lost
// reply) is closed; the next call opens another, or says why it cannot (the server is gone).
class TcpStore : public Store {
 public:
  // Connects and authenticates. A wrong token gives kAuthFailed; no server gives kSystemError; a
  // token longer than kTcpStoreMaxToken gives kInvalidArgument.
  static StatusOr<std::unique_ptr<TcpStore>> Connect(
      const std::string& host, int port, const std::string& token, Deadline deadline,
      std::chrono::milliseconds op_timeout = std::chrono::seconds(60));

  Status Set(const std::string& key, const std::string& value) override;
  StatusOr<std::string> Get(const std::string& key, Deadline deadline) override;
  Status Wait(const std::vector<std::string>& keys, Deadline deadline) override;
  // A server from before GET_FIRST answers it with kProtocolError, which says so.
  StatusOr<FoundKey> GetFirst(const std::vector<std::string>& keys, Deadline deadline) override;
  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;

  // Connections open now (for tests): the idle ones and those a call is using.
  int connections() const EXCLUDES(mu_);

 private:
  TcpStore(std::string host, int port, std::string token, std::chrono::milliseconds op_timeout);
  // A new connection, authenticated by `deadline`.
  StatusOr<net::Fd> Open(Deadline deadline) const;
  // Sends one request and returns the OK reply's payload, or the reply's error. The request must
  // be written by write_deadline and answered by reply_deadline.
  StatusOr<std::string> Call(uint8_t type, const std::string& body, Deadline write_deadline,
                             Deadline reply_deadline) EXCLUDES(mu_);
  // The exchange itself on `fd`. *in_sync tells whether the connection is still usable.
  Status Exchange(int fd, uint8_t type, const std::string& body, Deadline write_deadline,
                  Deadline reply_deadline, std::string* payload, bool* in_sync) const;

  const std::string host_;
  const int port_;
  const std::string token_;
  const std::string where_;
  const std::chrono::milliseconds op_timeout_;
  mutable Mutex mu_;
  std::vector<net::Fd> idle_ GUARDED_BY(mu_);  // connections no call uses now
  int open_ GUARDED_BY(mu_) = 0;               // idle ones and those in use
};

}  // namespace concord
