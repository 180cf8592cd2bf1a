// The one error model inside Concord: a Status (code + message) returned by value, and a small
// StatusOr<T>. Codes have the same numeric values as the C API's concord_status_t, so the C
// boundary converts without a table. Status is a value type: copyable, thread-compatible. Both are
// [[nodiscard]]: a status is handled or visibly dropped with (void) and a reason.
#pragma once

#include <string>
#include <utility>

#include "concord/concord.h"

namespace concord {

// The values are concord_status_t's (include/concord/concord.h, where they are written down once
// and only ever appended to), so the C boundary converts by cast.
enum class Code : int {
  kOk = CONCORD_SUCCESS,
  // The caller passed something wrong; nothing changed.
  kInvalidArgument = CONCORD_ERR_INVALID_ARGUMENT,
  // Ranks submitted disagreeing requests for one tensor name.
  kMismatch = CONCORD_ERR_MISMATCH,
  // A deadline passed.
  kTimeout = CONCORD_ERR_TIMEOUT,
  // Another rank exited, was killed or reported a failure.
  kPeerFailure = CONCORD_ERR_PEER_FAILURE,
  // The transport or collective library failed.
  kBackendError = CONCORD_ERR_BACKEND,
  // Use before init or after shutdown.
  kNotInitialized = CONCORD_ERR_NOT_INITIALIZED,
  // A bug in Concord.
  kInternal = CONCORD_ERR_INTERNAL,
  // A feature or backend that was not built or cannot start here.
  kUnavailable = CONCORD_ERR_UNAVAILABLE,
  // concord_test: not finished yet (not an error).
  kInProgress = CONCORD_IN_PROGRESS,
  // Header and library major versions differ.
  kVersionMismatch = CONCORD_ERR_VERSION,
  // An OS call failed (socket, file, memory).
  kSystemError = CONCORD_ERR_SYSTEM,
  // Rendezvous refused: wrong job secret.
  kAuthFailed = CONCORD_ERR_AUTH,
  // Malformed bytes arrived from the network.
  kProtocolError = CONCORD_ERR_PROTOCOL,
};

const char* CodeName(Code code);

class [[nodiscard]] Status {
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

// Prints "StatusOr::value() of an error" with the status and aborts: reading the value of a failed
// StatusOr is a bug in Concord, never something to continue from.
[[noreturn]] void DieOnValueOfError(const Status& status);

// A value or the Status that explains why there is none. value(), * and -> on an error abort
// (DieOnValueOfError): check ok() first.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  // An OK status here is a bug (a function that returns no value where it promised one): it
  // becomes an internal error rather than a default-constructed value.
  StatusOr(Status status)  // NOLINT: implicit by design
      : status_(status.ok() ? Status(Code::kInternal, "StatusOr made from an OK status")
                            : std::move(status)) {}
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() {
    CheckOk();
    return value_;
  }
  const T& value() const {
    CheckOk();
    return value_;
  }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void CheckOk() const {
    if (!status_.ok()) DieOnValueOfError(status_);
  }

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
