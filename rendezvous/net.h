// Small POSIX socket and wire-format helpers shared by the TCP store, the TCP control plane and the
// launcher: an owning file descriptor, listen/connect with deadlines, whole reads and writes with
// deadlines, little-endian encoding, a bounds-checked reader, randomness and constant-time
// comparison. All functions are thread-safe (they touch only their arguments); none throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/clock.h"
#include "base/status.h"

namespace concord {
namespace net {

// Owns one file descriptor and closes it on destruction. Move-only; not thread-safe.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.Release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release();
  void Reset();

 private:
  int fd_ = -1;
};

// Splits "host:port" or "[v6addr]:port"; kInvalidArgument when malformed or the port is not
// 1-65535.
Status SplitHostPort(const std::string& text, std::string* host, int* port);
// "host:port", bracketing IPv6 literals.
std::string JoinHostPort(const std::string& host, int port);

// A listening, non-blocking, close-on-exec TCP socket bound to host ("" = 127.0.0.1) and port
// (0 = ephemeral). *bound_port receives the actual port.
StatusOr<Fd> Listen(const std::string& host, int port, int* bound_port);

// Connects to host:port before the deadline (tries every resolved address). The returned socket is
// non-blocking, close-on-exec, with TCP_NODELAY set.
StatusOr<Fd> Connect(const std::string& host, int port, Deadline deadline);

// Accepts one pending connection from a non-blocking listening socket: returns an invalid Fd when
// none is pending. The accepted socket is non-blocking, close-on-exec, with TCP_NODELAY set.
StatusOr<Fd> Accept(int listen_fd);

Status SetNonBlocking(int fd);
Status SetNoDelay(int fd);

// Writes all of data to a (non-blocking) socket, polling until the deadline. A peer that closed
// gives kPeerFailure; the deadline kTimeout; other errors kSystemError. `what` names the peer.
Status WriteAll(int fd, const void* data, size_t size, Deadline deadline, const std::string& what);
// Reads exactly size bytes, polling until the deadline. EOF gives kPeerFailure.
Status ReadFull(int fd, void* data, size_t size, Deadline deadline, const std::string& what);

// Little-endian encoding appended to a string.
void PutU8(std::string* out, uint8_t v);
void PutU16(std::string* out, uint16_t v);
void PutU32(std::string* out, uint32_t v);
void PutU64(std::string* out, uint64_t v);
// u32 length followed by the bytes.
void PutBytes(std::string* out, const std::string& bytes);
uint32_t LoadU32(const unsigned char* p);
uint16_t LoadU16(const unsigned char* p);

// Reads little-endian fields from a byte range; every read is bounds-checked and returns false
// (leaving the reader failed) instead of running past the end.
class Reader {
 public:
  Reader(const char* data, size_t size) : p_(data), left_(size) {}
  bool U8(uint8_t* v);
  bool U32(uint32_t* v);
  bool U64(uint64_t* v);
  // A u32 length then that many bytes; fails when the length exceeds max_size or the data left.
  bool Bytes(std::string* v, size_t max_size);
  bool done() const { return left_ == 0; }

 private:
  bool Take(void* out, size_t n);
  const char* p_;
  size_t left_;
};

// Parses a whole decimal int64 (optional '-'); false on anything else or overflow. Store counters
// (Store::Add) are kept as such decimal text.
bool ParseInt64(const std::string& text, int64_t* value);

// n random bytes from /dev/urandom as 2n lowercase hex digits.
StatusOr<std::string> RandomHex(size_t n);
// Compares in time that depends only on the lengths, not on where the strings differ.
bool ConstantTimeEquals(const std::string& a, const std::string& b);

}  // namespace net
}  // namespace concord
