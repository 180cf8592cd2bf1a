#include "backends/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <new>
#include <random>
#include <sstream>

#include "base/clock.h"
#include "rendezvous/store.h"

namespace concord {
namespace shm_internal {
namespace {

constexpr uint32_t kMagic = 0x434e4344;  // "CNCD"
constexpr uint32_t kLayoutVersion = 1;
constexpr size_t kPage = 4096;
// A value under a key that reports a failure instead of a name or "ok".
constexpr char kFailed = '!';

size_t RoundUp(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

std::string Errno(const char* what, int err) {
  return std::string(what) + ": " + std::strerror(err);
}

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string Namespace(const char* name) {
  char target[256] = {0};
  const std::string link = std::string("/proc/self/ns/") + name;
  const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
  return n > 0 ? std::string(target, static_cast<size_t>(n)) : std::string(name) + ":?";
}

// A name no other segment on this host has: this process, a per-process counter and randomness.
std::string NewName() {
  static std::atomic<uint64_t> created{0};
  std::random_device random;
  std::ostringstream name;
  name << "/concord-" << ::getpid() << "-" << created.fetch_add(1) << "-" << std::hex << random();
  return name.str();
}

// Maps the object `fd` refers to, `bytes` long.
StatusOr<uint8_t*> Map(int fd, size_t bytes) {
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return Status(Code::kUnavailable, Errno("mmap", errno));
  return static_cast<uint8_t*>(base);
}

// Rank 0: creates, sizes, reserves and maps the object `name`, and writes the header.
StatusOr<uint8_t*> Create(const std::string& name, size_t bytes, int size, size_t half_bytes) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return Status(Code::kUnavailable, Errno(("shm_open " + name).c_str(), errno));
  Status failed;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    failed = Status(Code::kUnavailable, Errno("ftruncate", errno));
  } else if (int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    failed = Status(
        Code::kUnavailable,
        Errno(("reserving " + std::to_string(bytes >> 10) + " KiB in /dev/shm").c_str(), err));
  }
  StatusOr<uint8_t*> base = failed.ok() ? Map(fd, bytes) : StatusOr<uint8_t*>(failed);
  ::close(fd);
  if (!base.ok()) {
    ::shm_unlink(name.c_str());
    return base.status();
  }
  auto* header = new (*base) SegmentHeader();
  header->size = size;
  header->half_bytes = half_bytes;
  header->layout_version = kLayoutVersion;
  for (int r = 0; r < size; ++r) {
    new (*base + RoundUp(sizeof(SegmentHeader), kCacheLine) + r * sizeof(RankBlock)) RankBlock();
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  header->magic = kMagic;
  return base;
}

// Ranks 1..: opens and maps `name`, checking that it is the segment rank 0 made for this lane.
StatusOr<uint8_t*> Attach(const std::string& name, size_t bytes, int size, size_t half_bytes) {
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return Status(Code::kUnavailable, Errno(("shm_open " + name).c_str(), errno));
  struct stat st {};
  StatusOr<uint8_t*> base = Status(Code::kUnavailable, "");
  if (::fstat(fd, &st) != 0) {
    base = Status(Code::kUnavailable, Errno("fstat", errno));
  } else if (static_cast<size_t>(st.st_size) != bytes) {
    base = Status(Code::kUnavailable, name + " is " + std::to_string(st.st_size) +
                                          " bytes, expected " + std::to_string(bytes));
  } else {
    base = Map(fd, bytes);
  }
  ::close(fd);
  if (!base.ok()) return base.status();
  const auto* header = reinterpret_cast<const SegmentHeader*>(*base);
  if (header->magic != kMagic || header->layout_version != kLayoutVersion || header->size != size ||
      header->half_bytes != half_bytes) {
    ::munmap(*base, bytes);
    return Status(Code::kUnavailable, name + " does not hold this lane's layout (size " +
                                          std::to_string(header->size) + ", version " +
                                          std::to_string(header->layout_version) + ")");
  }
  return base;
}

}  // namespace

std::string HostIdentity(const std::string& override_id) {
  if (!override_id.empty()) return "id:" + override_id;
  return ReadFirstLine("/proc/sys/kernel/random/boot_id") + "/" + Namespace("mnt") + "/" +
         Namespace("ipc") + "/" + Namespace("net") + "/" + Namespace("pid");
}

uint64_t ProcessStartTicks(int pid) {
  const std::string stat = ReadFirstLine("/proc/" + std::to_string(pid) + "/stat");
  // "pid (comm) state ppid ... starttime(22nd) ...": comm may hold spaces and parentheses.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 1));
  std::string state;
  fields >> state;
  if (state == "Z" || state == "X" || state == "x") return 0;
  std::string field;
  for (int i = 4; i < 22 && fields >> field; ++i) {
  }
  uint64_t ticks = 0;
  fields >> ticks;
  return ticks;
}

size_t ShmSegment::BlocksOffset() {
  return RoundUp(sizeof(SegmentHeader), kCacheLine);
}

size_t ShmSegment::DataOffset(int size) {
  return RoundUp(BlocksOffset() + size * sizeof(RankBlock), kPage);
}

ShmSegment::ShmSegment(uint8_t* base, size_t bytes, int size, size_t half_bytes)
    : base_(base),
      bytes_(bytes),
      size_(size),
      half_bytes_(half_bytes),
      blocks_(BlocksOffset()),
      data_(DataOffset(size)) {}

ShmSegment::~ShmSegment() {
  ::munmap(base_, bytes_);
}

StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Open(int rank, int size, size_t half_bytes,
                                                       const std::string& key_prefix, Store* store,
                                                       std::chrono::milliseconds timeout) {
  half_bytes = RoundUp(half_bytes, kPage);
  const size_t bytes = DataOffset(size) + 2 * size_t(size) * half_bytes;
  const Deadline deadline = Deadline::After(timeout);
  const std::string name_key = key_prefix + "/name";

  // Rank 0 names the segment (or says why there is none); the others map that name.
  std::string name;
  StatusOr<uint8_t*> base = Status(Code::kUnavailable, "");
  if (rank == 0) {
    name = NewName();
    base = Create(name, bytes, size, half_bytes);
    CONCORD_RETURN_IF_ERROR(
        store->Set(name_key, base.ok() ? name : kFailed + base.status().message()));
  } else {
    CONCORD_ASSIGN_OR_RETURN(name, store->Get(name_key, deadline));
    if (!name.empty() && name[0] == kFailed) {
      base = Status(Code::kUnavailable, "rank 0 could not create it: " + name.substr(1));
      name.clear();
    } else {
      base = Attach(name, bytes, size, half_bytes);
    }
  }
  if (base.ok()) {
    auto* block = reinterpret_cast<RankBlock*>(*base + BlocksOffset()) + rank;
    block->pid = static_cast<int32_t>(::getpid());
    block->start_ticks = ProcessStartTicks(block->pid);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  std::unique_ptr<ShmSegment> segment;
  if (base.ok()) segment.reset(new ShmSegment(*base, bytes, size, half_bytes));

  // Every rank says whether it mapped the segment and learns whether all did; then nobody will
  // open the name again, so each rank unlinks it (the first one succeeds), whatever happens next.
  Status agreed = store->Set(key_prefix + "/attach/" + std::to_string(rank),
                             base.ok() ? "ok" : kFailed + base.status().message());
  for (int r = 0; agreed.ok() && r < size; ++r) {
    StatusOr<std::string> attached =
        store->Get(key_prefix + "/attach/" + std::to_string(r), deadline);
    if (!attached.ok()) {
      agreed = attached.status();
    } else if (*attached != "ok") {
      agreed = Status(Code::kUnavailable, "shared memory is unavailable on rank " +
                                              std::to_string(r) + ": " + attached->substr(1));
    }
  }
  if (!name.empty()) ::shm_unlink(name.c_str());
  if (!agreed.ok()) return agreed;
  return segment;
}

}  // namespace shm_internal
}  // namespace concord
