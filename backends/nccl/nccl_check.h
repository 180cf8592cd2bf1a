// NCCL error handling for the .cu files of backends/nccl (it includes nccl.h, so no header outside
// this directory includes it). CONCORD_NCCL_CHECK(call) returns a Status naming the call, its
// file:line, ncclGetErrorString, NCCL's last error text and NCCL's version when the call fails.
// ncclInProgress is not a failure: on a non-blocking communicator it means "accepted, still
// being set up", and the caller waits for the communicator (ncclCommGetAsyncError).
#pragma once

#include <nccl.h>

#include <string>

#include "backends/cuda/cuda_device.h"
#include "base/status.h"

namespace concord {
namespace nccl {

inline Status NcclError(ncclResult_t result, const char* call, const char* file, int line,
                        ncclComm_t comm = nullptr) {
  const char* last = ncclGetLastError(comm);
  std::string message = std::string(file) + ":" + std::to_string(line) + ": " + call + ": " +
                        ncclGetErrorString(result) + " (ncclResult_t " +
                        std::to_string(static_cast<int>(result)) + ")";
  if (last != nullptr && *last != '\0') message += ": " + std::string(last);
  message += " [NCCL " + cuda::NcclVersion() + "]";
  // A remote or system error is usually a peer that died or a link that broke.
  const bool peer = result == ncclRemoteError || result == ncclSystemError;
  return Status(peer ? Code::kPeerFailure : Code::kBackendError, message);
}

}  // namespace nccl
}  // namespace concord

#define CONCORD_NCCL_CHECK(call)                                                          \
  do {                                                                                    \
    const ncclResult_t concord_nccl_result_ = (call);                                     \
    if (concord_nccl_result_ != ncclSuccess && concord_nccl_result_ != ncclInProgress) {  \
      return ::concord::nccl::NcclError(concord_nccl_result_, #call, __FILE__, __LINE__); \
    }                                                                                     \
  } while (0)
