// The one error model inside Concord: a Status (code + message) returned by value, and a small
// StatusOr<T>. Codes have the same numeric values as the C API's concord_status_t, so the C
// boundary converts without a table. Status is a value type: copyable, thread-compatible.
#pragma once

#include <string>
#include <utility>

namespace concord {

// Values are part of the ABI (they equal concord_status_t): append only, never renumber.
enum class Code : int {
  kOk = 0,
  kInvalidArgument = 1,   // the caller passed something wrong; nothing changed
  kMismatch = 2,          // ranks submitted disagreeing requests for one tensor name
  kTimeout = 3,           // a deadline passed
  kPeerFailure = 4,       // another rank exited, was killed or reported a failure
  kBackendError = 5,      // the transport or collective library failed
  kNotInitialized = 6,    // use before init or after shutdown
  kInternal = 7,          // a bug in Concord
  kUnavailable = 8,       // a feature or backend that was not built or cannot start here
  kInProgress = 9,        // concord_test: not finished yet (not an error)
  kVersionMismatch = 10,  // header and library major versions differ
  kSystemError = 11,      // an OS call failed (socket, file, memory)
  kAuthFailed = 12,       // rendezvous refused: wrong job secret
  kProtocolError = 13,    // malformed bytes arrived from the network
};

const char* CodeName(Code code);

class Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "CODE_NAME: message"
  std::string ToString() const;
  // Returns a copy whose message is prefixed with `context: `.
  Status WithContext(const std::string& context) const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return Status(Code::kInvalidArgument, std::move(m));
}
inline Status Internal(std::string m) {
  return Status(Code::kInternal, std::move(m));
}
inline Status TimeoutError(std::string m) {
  return Status(Code::kTimeout, std::move(m));
}
inline Status SystemError(std::string m) {
  return Status(Code::kSystemError, std::move(m));
}
inline Status ProtocolError(std::string m) {
  return Status(Code::kProtocolError, std::move(m));
}
// A failed OS call: message plus strerror(errnum).
Status ErrnoError(const std::string& what, int errnum);

// A value or the Status that explains why there is none.
template <typename T>
class StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {}  // NOLINT: implicit by design
  StatusOr(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() { return value_; }
  const T& value() const { return value_; }
  T& operator*() { return value_; }
  T* operator->() { return &value_; }

 private:
  Status status_;
  T value_{};
};

}  // namespace concord

#define CONCORD_CONCAT_INNER(a, b) a##b
#define CONCORD_CONCAT(a, b) CONCORD_CONCAT_INNER(a, b)

#define CONCORD_RETURN_IF_ERROR(expr)                          \
  do {                                                         \
    ::concord::Status concord_status_tmp_ = (expr);            \
    if (!concord_status_tmp_.ok()) return concord_status_tmp_; \
  } while (0)

#define CONCORD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp.value())

#define CONCORD_ASSIGN_OR_RETURN(lhs, expr) \
  CONCORD_ASSIGN_OR_RETURN_IMPL(CONCORD_CONCAT(concord_statusor_, __LINE__), lhs, expr)
