// The metrics endpoint (CONCORD_METRICS_PORT): a minimal HTTP server on its own thread that answers
// GET /metrics with whatever the caller renders (Prometheus text format), for a scraper.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "rendezvous/net.h"

namespace concord {

// Contract: owns the listening socket, an eventfd, the accepted connections and one thread that
// serves up to kMaxConnections of them at once with poll(), each with its own request buffer,
// deadline and response, so an idle or slow client never delays another; no third-party code.
// Requests (HTTP/1.x; the server answers and closes):
//   GET /metrics, GET /     200, Content-Type: text/plain; version=0.0.4; charset=utf-8, the body
//                           render() returns (a query string is ignored, and so are the scheme
//                           and authority of an absolute-form target, "http://host:port/metrics")
//   HEAD (same paths)       the same headers, no body
//   any other path          404
//   another method          405 (Allow: GET, HEAD)
//   a malformed request     400; a request head over 8 KiB: 431
//   empty lines (CRLF or bare LF) before the request line are ignored (RFC 9112 2.2), but count
//   towards the 8 KiB, so a client that sends nothing else gets 431 or is closed at its deadline
//   a client that sends no complete request head within client_deadline (2 s by default) of its
//   connecting is closed without an answer; a response not taken within client_deadline of its
//   rendering is abandoned. Once a response is out the server half-closes, then reads and drops
//   what the client still sends (a body, a pipelined request; up to 64 KiB for up to 200 ms, ended
//   by the client closing) before it closes, so that unread bytes do not make the kernel reset the
//   connection and drop the response's tail. With kMaxConnections open, a new connection closes the
//   oldest one that has not sent a complete request head yet (without an answer), so idle
//   connections cannot lock a scraper out; when every open one is being answered, new ones wait in
//   the kernel's backlog until one ends.
//
// Start() binds (SO_REUSEADDR) and listens before it returns, so a port in use is an error there
// and a scraper may connect as soon as it returned. bind_address: an IPv4 or IPv6 literal
// ("127.0.0.1", "0.0.0.0", "::1", "[::1]") or a host name (getaddrinfo: the first of its addresses
// that binds; one whose port is in use is an error); "" means 127.0.0.1. Errors: a port outside
// 0-65535, an empty or unresolvable address: kInvalidArgument naming it; bind/listen failing
// (port in use, no permission): kUnavailable "cannot listen on HOST:PORT: <strerror>";
// socket/eventfd failing: kSystemError. Messages carry no variable name: the caller adds its
// context (e.g. "CONCORD_METRICS_PORT: ").
//
// After Start, failures never reach the caller: an accept() or poll() error that is not transient
// calls warn("metrics endpoint HOST:PORT: ...; the metrics endpoint is off") once, closes the
// listening socket (scrapers are refused) and the open connections, and ends the thread.
// Transient accept errors (a connection reset before it was taken, out of descriptors or memory)
// are skipped, and for the resource ones accepting pauses for 100 ms while the open connections
// are still served.
//
// Threads: render and warn run on the server thread, never concurrently with themselves (render
// runs once per GET or HEAD of /metrics or /, its text held until that response is sent or
// abandoned); render must be thread-safe against whatever the caller does meanwhile, and neither
// may block long (every connection waits while one runs, and the destructor waits for a render
// that is running). port() and address() may be called from any thread. The destructor wakes the
// thread (eventfd) and joins it: it returns promptly (connected clients, idle or slow, are dropped
// at once), and must not run on the server thread (that is, not from render or warn).
class MetricsServer {
 public:
  static constexpr std::chrono::milliseconds kDefaultClientDeadline{2000};
  static constexpr size_t kMaxRequestHead = 8192;
  static constexpr size_t kMaxConnections = 64;

  static StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& bind_address, int port, std::function<std::string()> render,
      std::function<void(const std::string&)> warn,
      std::chrono::milliseconds client_deadline = kDefaultClientDeadline);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The bound port (the kernel's choice when Start was given 0).
  int port() const { return port_; }
  // "HOST:PORT" as bound, IPv6 hosts in brackets.
  const std::string& address() const { return address_; }

 private:
  class Connection;  // one accepted client (metrics_server.cc)

  MetricsServer(net::Fd listen_fd, net::Fd wake_fd, int port, std::string address,
                std::function<std::string()> render, std::function<void(const std::string&)> warn,
                std::chrono::milliseconds client_deadline);
  void Loop();
  // Takes one pending connection (poll() reported listen_events on the listening socket),
  // closing the oldest waiting one when kMaxConnections are open. False when the endpoint turned
  // itself off.
  bool Accept(std::vector<Connection>& connections, short listen_events);
  // Moves one connection on by what poll() reported for it (revents, 0 for nothing) and closes it
  // past its deadline.
  void Serve(Connection& connection, short revents);
  // The whole response to one request head (status line, headers and, for GET, the body).
  std::string Respond(const std::string& head);
  // Warns, closes the listening socket; the thread then ends.
  void Off(const std::string& why);

  net::Fd listen_fd_;      // the server thread's once it runs
  const net::Fd wake_fd_;  // eventfd: the destructor writes it to stop Loop()
  const int port_;
  const std::string address_;
  const std::function<std::string()> render_;
  const std::function<void(const std::string&)> warn_;
  const std::chrono::milliseconds client_deadline_;
  std::atomic<bool> stop_{false};
  // Set after accept() ran out of descriptors or memory: no accepting until then.
  std::optional<Deadline> accept_paused_until_;
  std::thread thread_;
};

}  // namespace concord
