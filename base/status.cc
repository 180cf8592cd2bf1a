#include "base/status.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace concord {

const char* CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "OK";
    case Code::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case Code::kMismatch:
      return "MISMATCH";
    case Code::kTimeout:
      return "TIMEOUT";
    case Code::kPeerFailure:
      return "PEER_FAILURE";
    case Code::kBackendError:
      return "BACKEND_ERROR";
    case Code::kNotInitialized:
      return "NOT_INITIALIZED";
    case Code::kInternal:
      return "INTERNAL";
    case Code::kUnavailable:
      return "UNAVAILABLE";
    case Code::kInProgress:
      return "IN_PROGRESS";
    case Code::kVersionMismatch:
      return "VERSION_MISMATCH";
    case Code::kSystemError:
      return "SYSTEM_ERROR";
    case Code::kAuthFailed:
      return "AUTH_FAILED";
    case Code::kProtocolError:
      return "PROTOCOL_ERROR";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(CodeName(code_)) + ": " + message_;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

void DieOnValueOfError(const Status& status) {
  std::fprintf(stderr, "Concord internal error: StatusOr::value() of an error: %s\n",
               status.ToString().c_str());
  std::abort();
}

Status ErrnoError(const std::string& what, int errnum) {
  char buf[256];
  // GNU strerror_r returns a char* that may or may not point into buf.
  const char* text = strerror_r(errnum, buf, sizeof(buf));
  return Status(Code::kSystemError, what + ": " + text);
}

}  // namespace concord
