#include "backends/shm/shm_direct.h"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace concord {
namespace shm_internal {
namespace {

constexpr size_t kMaxIov = 64;  // remote pieces per process_vm_readv/writev call

// Moves bytes [offset, offset + bytes) of the concatenation of `spans` in process `pid` from
// (`write` false) or to (`write` true) `local`.
Status TransferRemote(int rank, pid_t pid, const std::vector<RemoteSpan>& spans, size_t offset,
                      size_t bytes, uint8_t* local_bytes, bool write) {
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
    const char* what = write ? "writing into" : "reading";
    if (want == 0) {
      return Status(Code::kBackendError, std::string(what) + " rank " + std::to_string(rank) +
                                             "'s buffer: bytes beyond the " +
                                             std::to_string(start) + " it published");
    }
    iovec local{local_bytes + done, want};
    const ssize_t n = write ? ::process_vm_writev(pid, &local, 1, remote, pieces, 0)
                            : ::process_vm_readv(pid, &local, 1, remote, pieces, 0);
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      if (err == EINTR) continue;
      return Status(err == ESRCH ? Code::kPeerFailure : Code::kBackendError,
                    std::string(what) + " rank " + std::to_string(rank) + "'s memory (pid " +
                        std::to_string(pid) + "): " + std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

Status ReadRemote(int rank, pid_t pid, const std::vector<RemoteSpan>& spans, size_t offset,
                  size_t bytes, void* into) {
  return TransferRemote(rank, pid, spans, offset, bytes, static_cast<uint8_t*>(into), false);
}

Status WriteRemote(int rank, pid_t pid, const std::vector<RemoteSpan>& spans, size_t offset,
                   size_t bytes, const void* from) {
  // process_vm_writev only reads the local iovec's memory.
  return TransferRemote(rank, pid, spans, offset, bytes,
                        const_cast<uint8_t*>(static_cast<const uint8_t*>(from)), true);
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
