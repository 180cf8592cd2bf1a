// Reading and writing a peer process's memory directly (cross-memory attach, process_vm_readv and
// process_vm_writev, which the kernel allows on the same ptrace check): the
// shared-memory backend's path for large messages, where copying every byte into the segment and
// out again would double the memory traffic. Needs ptrace access to the peer (the same user, and
// Yama's ptrace_scope or a container's seccomp profile allowing it): ShmBackend probes it at
// set-up and keeps to the segment where any rank cannot read and write every other.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace concord {
namespace shm_internal {

// A buffer in a peer's address space.
struct RemoteSpan {
  uint64_t address = 0;
  uint64_t bytes = 0;
};

// Reads bytes [offset, offset + bytes) of the concatenation of `spans` (in process `pid`, which
// errors call rank `rank`: the number the job knows it by) into `into`. kPeerFailure naming the
// rank when the process is gone, kBackendError for any other failure.
Status ReadRemote(int rank, pid_t pid, const std::vector<RemoteSpan>& spans, size_t offset,
                  size_t bytes, void* into);
// Writes `from` into bytes [offset, offset + bytes) of the concatenation of `spans`; errors as
// ReadRemote's.
Status WriteRemote(int rank, pid_t pid, const std::vector<RemoteSpan>& spans, size_t offset,
                   size_t bytes, const void* from);

// Writes a span list into `out` (at most `capacity` bytes) as a count and pairs; false when it
// does not fit. ParseSpans reads one back (the peer's, from its half of the segment, `capacity`
// bytes long); a count that cannot fit there gives no spans.
bool WriteSpans(const std::vector<RemoteSpan>& spans, void* out, size_t capacity);
std::vector<RemoteSpan> ParseSpans(const void* in, size_t capacity);

}  // namespace shm_internal
}  // namespace concord
