#include "backends/shm/shm_direct.h"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace concord {
namespace shm_internal {
namespace {

constexpr size_t kMaxIov = 64;  // remote pieces per process_vm_readv call

}  // namespace

Status ReadRemote(int rank, pid_t pid, const std::vector<RemoteSpan>& spans, size_t offset,
                  size_t bytes, void* into) {
  auto* out = static_cast<uint8_t*>(into);
  size_t done = 0;
  while (done < bytes) {
    // The remote pieces of [offset + done, offset + bytes), up to kMaxIov of them.
    iovec remote[kMaxIov];
    size_t pieces = 0, want = 0, start = 0;
    for (const RemoteSpan& s : spans) {
      const size_t end = start + s.bytes;
      const size_t at = offset + done + want;
      if (at < end && done + want < bytes && pieces < kMaxIov) {
        const size_t n = std::min<size_t>(end - at, bytes - done - want);
        remote[pieces].iov_base = reinterpret_cast<void*>(s.address + (at - start));
        remote[pieces].iov_len = n;
        ++pieces;
        want += n;
      }
      start = end;
    }
    if (want == 0) {
      return Status(Code::kBackendError, "reading rank " + std::to_string(rank) +
                                             "'s buffer: bytes beyond the " +
                                             std::to_string(start) + " it published");
    }
    iovec local{out + done, want};
    const ssize_t n = ::process_vm_readv(pid, &local, 1, remote, pieces, 0);
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      if (err == EINTR) continue;
      return Status(err == ESRCH ? Code::kPeerFailure : Code::kBackendError,
                    "reading rank " + std::to_string(rank) + "'s memory (pid " +
                        std::to_string(pid) + "): " + std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

bool WriteSpans(const std::vector<RemoteSpan>& spans, void* out, size_t capacity) {
  const uint64_t count = spans.size();
  if (sizeof(count) + count * sizeof(RemoteSpan) > capacity) return false;
  std::memcpy(out, &count, sizeof(count));
  if (count > 0) {
    std::memcpy(static_cast<uint8_t*>(out) + sizeof(count), spans.data(),
                count * sizeof(RemoteSpan));
  }
  return true;
}

std::vector<RemoteSpan> ParseSpans(const void* in, size_t capacity) {
  uint64_t count = 0;
  std::memcpy(&count, in, sizeof(count));
  // A count that cannot fit was not written by WriteSpans: no spans (a read then fails).
  if (count > (capacity - sizeof(count)) / sizeof(RemoteSpan)) count = 0;
  std::vector<RemoteSpan> spans(count);
  if (count > 0) {
    std::memcpy(spans.data(), static_cast<const uint8_t*>(in) + sizeof(count),
                count * sizeof(RemoteSpan));
  }
  return spans;
}

}  // namespace shm_internal
}  // namespace concord
