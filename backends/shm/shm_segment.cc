#include "backends/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <locale>
#include <new>
#include <optional>
#include <random>
#include <sstream>

#include "base/clock.h"
#include "rendezvous/store.h"

namespace concord {
namespace shm_internal {
namespace {

constexpr uint32_t kMagic = 0x434e4344;  // "CNCD"
constexpr uint32_t kLayoutVersion = 3;
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

// The inode of this process's pid namespace ("pid:[4026531836]"), or 0 when unknown.
uint64_t PidNamespace() {
  const std::string link = Namespace("pid");
  const size_t open = link.find('[');
  return open == std::string::npos ? 0 : std::strtoull(link.c_str() + open + 1, nullptr, 10);
}

// "pid start_ticks pid_namespace": a rank's identity under its set-up key.
std::string Encode(const ProcessIdentity& process) {
  return std::to_string(process.pid) + " " + std::to_string(process.start_ticks) + " " +
         std::to_string(process.pid_namespace);
}

// The identity Encode wrote, or one that is never Observable() when the text is not one.
ProcessIdentity Decode(const std::string& text) {
  ProcessIdentity process;
  std::istringstream fields(text);
  if (!(fields >> process.pid >> process.start_ticks >> process.pid_namespace)) return {};
  return process;
}

// A name no other segment on this host has: this process, a per-process counter and randomness.
std::string NewName() {
  static std::atomic<uint64_t> created{0};
  std::random_device random;
  std::ostringstream name;
  // The classic locale: a global C++ locale the application set would group the pid's digits
  // ("12.345"), which concordrun's and the lifeline's removal of a dead rank's segments, by pid,
  // would not find.
  name.imbue(std::locale::classic());
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

ProcessIdentity ProcessIdentity::Self() {
  ProcessIdentity self;
  self.pid = static_cast<int32_t>(::getpid());
  self.start_ticks = ProcessStartTicks(self.pid);
  self.pid_namespace = PidNamespace();
  return self;
}

bool ProcessIdentity::Observable() const {
  // Read each time, not cached: a child forked after a first look may run in a pid namespace of
  // its own (its parent unshared one), where the parent's pids mean other processes or none.
  return pid > 0 && start_ticks != 0 && pid_namespace != 0 && pid_namespace == PidNamespace();
}

bool ProcessIdentity::Gone() const {
  return ProcessStartTicks(pid) != start_ticks;
}

ProcessIdentity ShmSegment::process(int r) const {
  const RankBlock* block = rank_block(r);
  ProcessIdentity process;
  process.pid = block->pid;
  process.start_ticks = block->start_ticks;
  process.pid_namespace = block->pid_namespace;
  return process;
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
                                                       std::chrono::milliseconds timeout,
                                                       const std::vector<int>& rank_names) {
  half_bytes = RoundUp(half_bytes, kPage);
  const size_t bytes = DataOffset(size) + 2 * size_t(size) * half_bytes;
  const Deadline deadline = Deadline::After(timeout);
  auto key = [&](const char* what, int r) {
    return key_prefix + "/" + what + "/" + std::to_string(r);
  };
  auto rank_name = [&](int r) {
    const bool named = static_cast<size_t>(r) < rank_names.size();
    return "rank " + std::to_string(named ? rank_names[r] : r);
  };

  // Waits for rank r's key `k`, looking every kSetupCheck whether r still runs.
  std::vector<std::optional<ProcessIdentity>> peers(size);
  auto await = [&](const std::string& k, int r) -> StatusOr<std::string> {
    for (;;) {
      StatusOr<std::string> value =
          store->Get(k, deadline.Earlier(Deadline::After(ShmSegment::kSetupCheck)));
      if (value.ok() || value.status().code() != Code::kTimeout || deadline.passed()) return value;
      if (!peers[r]) {
        StatusOr<std::string> said =
            store->Get(key("process", r), Deadline::After(std::chrono::milliseconds(0)));
        if (said.ok()) peers[r] = Decode(*said);
      }
      if (peers[r] && peers[r]->Observable() && peers[r]->Gone()) {
        return Status(Code::kPeerFailure, rank_name(r) + " (pid " + std::to_string(peers[r]->pid) +
                                              ") exited while shared memory was set up");
      }
    }
  };

  const ProcessIdentity self = ProcessIdentity::Self();
  CONCORD_RETURN_IF_ERROR(store->Set(key("process", rank), Encode(self)));
  // Rank 0 names the segment (or says why there is none) once every rank is known to be here;
  // the others map that name.
  std::string name;
  StatusOr<uint8_t*> base = Status(Code::kUnavailable, "");
  if (rank == 0) {
    for (int r = 1; r < size; ++r) CONCORD_RETURN_IF_ERROR(await(key("process", r), r).status());
    name = NewName();
    // Said before the name exists: should this rank die before it publishes the name, the others
    // unlink it.
    CONCORD_RETURN_IF_ERROR(store->Set(key_prefix + "/creating", name));
    base = Create(name, bytes, size, half_bytes);
    if (Status s =
            store->Set(key_prefix + "/name", base.ok() ? name : kFailed + base.status().message());
        !s.ok()) {
      if (base.ok()) ::shm_unlink(name.c_str());
      return s;
    }
  } else {
    StatusOr<std::string> named = await(key_prefix + "/name", 0);
    if (named.status().code() == Code::kPeerFailure) {
      // Rank 0 is gone; it may have created the segment without publishing its name.
      StatusOr<std::string> creating =
          store->Get(key_prefix + "/creating", Deadline::After(std::chrono::milliseconds(0)));
      if (creating.ok() && creating->rfind("/concord-", 0) == 0) ::shm_unlink(creating->c_str());
    }
    CONCORD_ASSIGN_OR_RETURN(name, std::move(named));
    if (!name.empty() && name[0] == kFailed) {
      base = Status(Code::kUnavailable, "rank 0 could not create it: " + name.substr(1));
      name.clear();
    } else {
      base = Attach(name, bytes, size, half_bytes);
    }
  }
  if (base.ok()) {
    auto* block = reinterpret_cast<RankBlock*>(*base + BlocksOffset()) + rank;
    block->pid = self.pid;
    block->start_ticks = self.start_ticks;
    block->pid_namespace = self.pid_namespace;
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  std::unique_ptr<ShmSegment> segment;
  if (base.ok()) segment.reset(new ShmSegment(*base, bytes, size, half_bytes));

  // Every rank says whether it mapped the segment and learns whether all did; then nobody will
  // open the name again, so each rank unlinks it (the first one succeeds), whatever happens next.
  Status agreed =
      store->Set(key("attach", rank), base.ok() ? "ok" : kFailed + base.status().message());
  for (int r = 0; agreed.ok() && r < size; ++r) {
    StatusOr<std::string> attached = await(key("attach", r), r);
    if (!attached.ok()) {
      agreed = attached.status();
    } else if (*attached != "ok") {
      agreed = Status(Code::kUnavailable, "shared memory is unavailable on " + rank_name(r) + ": " +
                                              attached->substr(1));
    }
  }
  if (!name.empty()) ::shm_unlink(name.c_str());
  if (!agreed.ok()) return agreed;
  return segment;
}

}  // namespace shm_internal
}  // namespace concord
