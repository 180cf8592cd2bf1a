#include <sched.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "backends/shm/shm_barrier.h"
#include "backends/shm/shm_direct.h"
#include "backends/shm/shm_segment.h"

namespace concord {
namespace {

using shm_internal::kCacheLine;
using shm_internal::ReadRemote;
using shm_internal::RemoteSpan;
using shm_internal::ShmBarrier;
using shm_internal::ShmSegment;
using shm_internal::WriteRemote;

size_t Clamp(size_t total, size_t from, size_t window) {
  return from >= total ? 0 : std::min(window, total - from);
}

size_t CeilDiv(size_t a, size_t b) {
  return (a + b - 1) / b;
}

// memcpy and memmove of n bytes, for ranges that may be empty (their pointers then may be null).
void CopyBytes(void* dst, const void* src, size_t n) {
  if (n > 0) memcpy(dst, src, n);
}
void MoveBytes(void* dst, const void* src, size_t n) {
  if (n > 0 && dst != src) memmove(dst, src, n);
}

size_t Total(const std::vector<size_t>& sizes) {
  size_t total = 0;
  for (size_t n : sizes) total += n;
  return total;
}

// kInvalidArgument naming the collective when `sizes` does not hold one entry per rank.
Status CheckSizes(const char* what, const char* of, const std::vector<size_t>& sizes, int ranks) {
  if (sizes.size() == static_cast<size_t>(ranks)) return Status::Ok();
  return InvalidArgument(std::string("shm ") + what + ": " + std::to_string(sizes.size()) + " " +
                         of + " for " + std::to_string(ranks) + " ranks");
}

Status CheckReduction(const char* what, DType dtype, ReduceOp op) {
  if (IsValidDType(static_cast<int>(dtype)) && IsValidReduceOp(static_cast<int>(op))) {
    return Status::Ok();
  }
  return InvalidArgument(std::string("shm ") + what + ": invalid dtype or reduce op");
}

// A direct allreduce folds its slice in pieces this large: two of them stay in a core's L2 cache
// (512 KiB here). 64 MiB, 2 ranks: 30-35 ms with 128 KiB pieces, 33-35 ms with 256 KiB.
constexpr size_t kFoldPieceBytes = size_t{128} << 10;

std::vector<size_t> Offsets(const std::vector<size_t>& sizes) {
  std::vector<size_t> offsets(sizes.size() + 1, 0);
  for (size_t i = 0; i < sizes.size(); ++i) offsets[i + 1] = offsets[i] + sizes[i];
  return offsets;
}

bool Oversubscribed(int ranks) {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (::sched_getaffinity(0, sizeof(cpus), &cpus) != 0) return false;
  return CPU_COUNT(&cpus) < ranks;
}

// The bytes of several buffers read as one array: a byte range of it maps onto pieces of the
// buffers in turn.
class SpanBytes {
 public:
  SpanBytes(const std::vector<AllreduceSpan>& spans, size_t element) {
    for (const AllreduceSpan& s : spans) {
      if (s.count > 0) pieces_.push_back({static_cast<uint8_t*>(s.data), s.count * element});
    }
  }
  std::vector<RemoteSpan> Remote() const {
    std::vector<RemoteSpan> remote;
    for (const Piece& p : pieces_) remote.push_back({reinterpret_cast<uint64_t>(p.data), p.bytes});
    return remote;
  }
  size_t total() const {
    size_t total = 0;
    for (const Piece& p : pieces_) total += p.bytes;
    return total;
  }
  // fn(pointer, offset within the range, bytes) for each piece of [offset, offset + bytes).
  template <typename Fn>
  void ForEach(size_t offset, size_t bytes, Fn fn) const {
    size_t start = 0, done = 0;
    for (const Piece& p : pieces_) {
      if (done == bytes) break;
      const size_t end = start + p.bytes;
      if (offset + done < end) {
        const size_t at = offset + done - start;
        const size_t n = std::min(p.bytes - at, bytes - done);
        fn(p.data + at, done, n);
        done += n;
      }
      start = end;
    }
  }

 private:
  struct Piece {
    uint8_t* data;
    size_t bytes;
  };
  std::vector<Piece> pieces_;
};

// Follows backend.h. Every collective moves its data in chunks of at most a half per rank: each
// rank copies its part of a chunk into its own half, the ranks meet at a barrier, and each copies
// (or reduces) what it needs from the others' halves. Consecutive chunks use alternate halves, so
// one barrier per chunk suffices: a rank overwrites a half only after the next chunk's barrier,
// which every rank reaches after reading that half. Reductions are a left fold over ranks 0, 1,
// ... in ReduceElements, each rank folding its slice of every chunk: results are independent of
// counts, spans and chunking (ReducesInRankOrder). Arguments are checked before anything else:
// bad ones (sizes not one per rank, a root out of range, a null buffer, an invalid dtype or op)
// give kInvalidArgument and leave the backend usable (every rank passes the same, so all refuse
// alike). After the first other error every call returns it.
class ShmBackend : public Backend {
 public:
  ShmBackend(const BackendOptions& options, std::unique_ptr<ShmSegment> segment,
             size_t direct_threshold)
      : rank_(options.rank),
        size_(options.size),
        segment_(std::move(segment)),
        half_bytes_(segment_->half_bytes()),
        direct_threshold_(direct_threshold),
        rank_names_(options.rank_names),
        barrier_(segment_.get(), rank_, options.timeout, !Oversubscribed(size_),
                 options.rank_names) {}

  // Collective, once, before any other call: whether every rank can read and write every other's
  // memory (shm_direct.h). A rank that cannot is no error: all then keep to the segment.
  Status ProbeDirectReads() {
    if (size_ == 1 || direct_threshold_ == SIZE_MAX) return Status::Ok();
    uint64_t probe = 0xC0C0'0000'0000'0000ull + rank_;  // read by every peer, and written back
    const RemoteSpan mine{reinterpret_cast<uint64_t>(&probe), sizeof(probe)};
    shm_internal::WriteSpans({mine}, Half(rank_), half_bytes_);
    // The peers write into `probe` after this round: a failure returns once none may.
    const uint64_t published = barrier_.round() + 1;
    CONCORD_RETURN_IF_ERROR(Drained(Sync(), published));
    uint64_t readable = 1;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      // A pid of another pid namespace names another process here, or none.
      if (!segment_->process(r).Observable()) {
        readable = 0;
        continue;
      }
      const std::vector<RemoteSpan> theirs_at = shm_internal::ParseSpans(Half(r), half_bytes_);
      uint64_t theirs = 0;
      if (!ReadRemote(Name(r), Pid(r), theirs_at, 0, sizeof(theirs), &theirs).ok() ||
          theirs != 0xC0C0'0000'0000'0000ull + r ||
          !WriteRemote(Name(r), Pid(r), theirs_at, 0, sizeof(theirs), &theirs).ok()) {
        readable = 0;
      }
    }
    half_ ^= 1;
    memcpy(Half(rank_), &readable, sizeof(readable));
    CONCORD_RETURN_IF_ERROR(Drained(Sync(), published));
    direct_ = true;
    for (int r = 0; r < size_; ++r) {
      memcpy(&readable, Half(r), sizeof(readable));
      direct_ = direct_ && readable == 1;
    }
    half_ ^= 1;
    return Status::Ok();
  }

  const char* name() const override { return "shm"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool ReducesInRankOrder() const override { return true; }
  // "direct" for an allreduce on the peers' memory (process_vm_readv/writev), "segment" for every
  // collective through the shared segment.
  const char* LastAlgorithm() const override { return last_algorithm_; }

  std::function<void()> Interrupter() override {
    std::shared_ptr<std::atomic<bool>> flag = barrier_.interrupted();
    return [flag] { flag->store(true); };
  }

  void Abandon() override {
    barrier_.Abandon();
    failed_ = Status(Code::kBackendError, "shm backend: this rank abandoned its group");
  }

  Status Allreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    return AllreduceSpans({AllreduceSpan{data, count}}, dtype, op);
  }

  Status AllreduceSpans(const std::vector<AllreduceSpan>& spans, DType dtype,
                        ReduceOp op) override {
    CONCORD_RETURN_IF_ERROR(CheckReduction("allreduce", dtype, op));
    for (const AllreduceSpan& s : spans) {
      if (s.count > 0 && s.data == nullptr) return InvalidArgument("shm allreduce: data is null");
    }
    CONCORD_RETURN_IF_ERROR(failed_);
    if (size_ == 1) return Status::Ok();
    const size_t element = DTypeSize(dtype);
    const SpanBytes bytes(spans, element);
    const size_t total = bytes.total();
    last_algorithm_ = "direct";
    if (direct_ && total >= direct_threshold_ &&
        sizeof(uint64_t) + spans.size() * sizeof(RemoteSpan) <= half_bytes_) {
      return DirectAllreduce(bytes, total / element, dtype, op);
    }
    last_algorithm_ = "segment";
    const size_t chunk = half_bytes_ / element * element;
    for (size_t offset = 0; offset < total; offset += chunk) {
      const size_t len = std::min(chunk, total - offset);
      uint8_t* mine = Half(rank_);
      bytes.ForEach(offset, len,
                    [&](uint8_t* p, size_t at, size_t n) { CopyBytes(mine + at, p, n); });
      CONCORD_RETURN_IF_ERROR(Sync());
      // Fold this rank's slice of the chunk into the caller's buffer, then publish it.
      const std::pair<size_t, size_t> mine_slice = Slice(len / element, rank_, element);
      const size_t begin = mine_slice.first, end = mine_slice.second;
      bytes.ForEach(offset + begin, end - begin, [&](uint8_t* p, size_t at, size_t n) {
        const size_t from = begin + at;
        ReduceElements(p, Half(0) + from, Half(1) + from, n / element, dtype, op);
        for (int r = 2; r < size_; ++r)
          ReduceElements(p, p, Half(r) + from, n / element, dtype, op);
        CopyBytes(mine + from, p, n);
      });
      CONCORD_RETURN_IF_ERROR(Sync());
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        const std::pair<size_t, size_t> slice = Slice(len / element, r, element);
        const size_t b = slice.first, e = slice.second;
        const uint8_t* theirs = Half(r);
        bytes.ForEach(offset + b, e - b,
                      [&](uint8_t* p, size_t at, size_t n) { CopyBytes(p, theirs + b + at, n); });
      }
      half_ ^= 1;
    }
    return Status::Ok();
  }

  Status ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                       ReduceOp op) override {
    CONCORD_RETURN_IF_ERROR(CheckReduction("reduce-scatter", dtype, op));
    CONCORD_RETURN_IF_ERROR(CheckSizes("reduce-scatter", "counts", counts, size_));
    if ((Total(counts) > 0 && in == nullptr) || (counts[rank_] > 0 && out == nullptr)) {
      return InvalidArgument("shm reduce-scatter: null buffer");
    }
    CONCORD_RETURN_IF_ERROR(failed_);
    const size_t element = DTypeSize(dtype);
    const std::vector<size_t> start = Offsets(counts);
    const auto* src = static_cast<const uint8_t*>(in);
    auto* dst = static_cast<uint8_t*>(out);
    if (size_ == 1) {
      CopyBytes(dst, src, counts[0] * element);
      return Status::Ok();
    }
    // Each chunk carries a window of `window` elements of every rank's block.
    const size_t window = half_bytes_ / (element * size_);
    const size_t rounds = CeilDiv(*std::max_element(counts.begin(), counts.end()), window);
    for (size_t k = 0; k < rounds; ++k) {
      const size_t from = k * window;
      uint8_t* mine = Half(rank_);
      for (int d = 0; d < size_; ++d) {
        CopyBytes(mine + d * window * element, src + (start[d] + from) * element,
                  Clamp(counts[d], from, window) * element);
      }
      CONCORD_RETURN_IF_ERROR(Sync());
      if (const size_t n = Clamp(counts[rank_], from, window); n > 0) {
        const size_t at = rank_ * window * element;
        uint8_t* into = dst + from * element;
        ReduceElements(into, Half(0) + at, Half(1) + at, n, dtype, op);
        for (int r = 2; r < size_; ++r) ReduceElements(into, into, Half(r) + at, n, dtype, op);
      }
      half_ ^= 1;
    }
    return Status::Ok();
  }

  Status Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes_per_rank) override {
    CONCORD_RETURN_IF_ERROR(CheckSizes("allgatherv", "sizes", bytes_per_rank, size_));
    if ((bytes_per_rank[rank_] > 0 && in == nullptr) ||
        (Total(bytes_per_rank) > 0 && out == nullptr)) {
      return InvalidArgument("shm allgatherv: null buffer");
    }
    CONCORD_RETURN_IF_ERROR(failed_);
    const std::vector<size_t> start = Offsets(bytes_per_rank);
    auto* dst = static_cast<uint8_t*>(out);
    MoveBytes(dst + start[rank_], in, bytes_per_rank[rank_]);
    if (size_ == 1) return Status::Ok();
    const uint8_t* own = dst + start[rank_];
    const size_t most = *std::max_element(bytes_per_rank.begin(), bytes_per_rank.end());
    for (size_t from = 0; from < most; from += half_bytes_) {
      CopyBytes(Half(rank_), own + from, Clamp(bytes_per_rank[rank_], from, half_bytes_));
      CONCORD_RETURN_IF_ERROR(Sync());
      for (int r = 0; r < size_; ++r) {
        if (r != rank_) {
          CopyBytes(dst + start[r] + from, Half(r), Clamp(bytes_per_rank[r], from, half_bytes_));
        }
      }
      half_ ^= 1;
    }
    return Status::Ok();
  }

  Status Broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size_) {
      return InvalidArgument("shm broadcast: root " + std::to_string(root) + " out of range");
    }
    if (bytes > 0 && data == nullptr) return InvalidArgument("shm broadcast: data is null");
    CONCORD_RETURN_IF_ERROR(failed_);
    if (size_ == 1) return Status::Ok();
    auto* p = static_cast<uint8_t*>(data);
    for (size_t from = 0; from < bytes; from += half_bytes_) {
      const size_t n = std::min(half_bytes_, bytes - from);
      if (rank_ == root) CopyBytes(Half(rank_), p + from, n);
      CONCORD_RETURN_IF_ERROR(Sync());
      if (rank_ != root) CopyBytes(p + from, Half(root), n);
      half_ ^= 1;
    }
    return Status::Ok();
  }

  Status Barrier() override {
    CONCORD_RETURN_IF_ERROR(failed_);
    return size_ == 1 ? Status::Ok() : Sync();
  }

  Status Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes) override {
    CONCORD_RETURN_IF_ERROR(CheckSizes("alltoallv", "send sizes", send_bytes, size_));
    CONCORD_RETURN_IF_ERROR(CheckSizes("alltoallv", "receive sizes", recv_bytes, size_));
    if ((Total(send_bytes) > 0 && in == nullptr) || (Total(recv_bytes) > 0 && out == nullptr)) {
      return InvalidArgument("shm alltoallv: null buffer");
    }
    CONCORD_RETURN_IF_ERROR(failed_);
    const std::vector<size_t> send_start = Offsets(send_bytes);
    const std::vector<size_t> recv_start = Offsets(recv_bytes);
    const auto* src = static_cast<const uint8_t*>(in);
    auto* dst = static_cast<uint8_t*>(out);
    CopyBytes(dst + recv_start[rank_], src + send_start[rank_], send_bytes[rank_]);
    if (size_ == 1) return Status::Ok();
    // A chunk holds, after a line for the sender's largest message, a window for every receiver.
    // Only the senders know their sizes: the first chunk tells everyone how many chunks follow.
    const size_t window = (half_bytes_ - kCacheLine) / size_ / kCacheLine * kCacheLine;
    uint64_t largest = 0;
    for (int d = 0; d < size_; ++d) {
      if (d != rank_) largest = std::max<uint64_t>(largest, send_bytes[d]);
    }
    size_t rounds = std::max<size_t>(1, CeilDiv(largest, window));
    for (size_t k = 0; k < rounds; ++k) {
      const size_t from = k * window;
      uint8_t* mine = Half(rank_);
      memcpy(mine, &largest, sizeof(largest));
      for (int d = 0; d < size_; ++d) {
        if (d == rank_) continue;
        CopyBytes(mine + kCacheLine + d * window, src + send_start[d] + from,
                  Clamp(send_bytes[d], from, window));
      }
      CONCORD_RETURN_IF_ERROR(Sync());
      for (int s = 0; s < size_; ++s) {
        if (s == rank_) continue;
        uint64_t theirs = 0;
        memcpy(&theirs, Half(s), sizeof(theirs));
        rounds = std::max(rounds, CeilDiv(theirs, window));
        CopyBytes(dst + recv_start[s] + from, Half(s) + kCacheLine + rank_ * window,
                  Clamp(recv_bytes[s], from, window));
      }
      half_ ^= 1;
    }
    return Status::Ok();
  }

 private:
  uint8_t* Half(int r) const { return segment_->half(r, half_); }

  // Rank r's part [begin, end), in bytes, of a chunk of `count` elements.
  std::pair<size_t, size_t> Slice(size_t count, int r, size_t element) const {
    return {count * r / size_ * element, count * (r + 1) / size_ * element};
  }

  Status Sync() {
    Status status = barrier_.Sync();
    if (!status.ok()) failed_ = status;
    return status;
  }

  // An error found outside a barrier: the group is aborted so that no peer waits for this rank.
  Status Fail(Status status) {
    failed_ = barrier_.Abort(status.code() == Code::kPeerFailure ? dead_ : -1, status);
    return failed_;
  }

  // `status`, once no peer may touch this rank's memory any more when it is an error of a
  // collective whose ranks read and write each other's memory after round `published`: the
  // caller frees or reuses its buffers as soon as it returns (ShmBarrier::Drain).
  Status Drained(Status status, uint64_t published) {
    if (!status.ok()) barrier_.Drain(published);
    return status;
  }

  pid_t Pid(int r) const { return segment_->rank_block(r)->pid; }
  // The number errors name rank r by (BackendOptions::rank_names).
  int Name(int r) const { return static_cast<size_t>(r) < rank_names_.size() ? rank_names_[r] : r; }

  // Allreduce on the peers' buffers in place: each rank publishes its spans, then folds its slice
  // of every rank's data (rank order) into its own buffer piece by piece and writes each reduced
  // piece, still in cache, into every peer's buffer. Rank r's slice of a peer's buffer is read and
  // written by rank r alone, so the pieces need no ordering among ranks. Two barriers: spans
  // published, every write done (the caller may then reuse the buffer, which holds the result).
  // A rank stops between pieces once the group is aborted, and a failed one returns only once no
  // peer may still write into its buffer (Drained).
  Status DirectAllreduce(const SpanBytes& bytes, size_t count, DType dtype, ReduceOp op) {
    const size_t element = DTypeSize(dtype);
    shm_internal::WriteSpans(bytes.Remote(), Half(rank_), half_bytes_);
    const uint64_t published = barrier_.round() + 1;
    CONCORD_RETURN_IF_ERROR(Drained(Sync(), published));
    peers_.resize(size_);
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) peers_[r] = shm_internal::ParseSpans(Half(r), half_bytes_);
    }
    half_ ^= 1;
    acc_.resize(kFoldPieceBytes);
    tmp_.resize(kFoldPieceBytes);
    Status status;
    const std::pair<size_t, size_t> mine_slice = Slice(count, rank_, element);
    const size_t begin = mine_slice.first, end = mine_slice.second;
    bytes.ForEach(begin, end - begin, [&](uint8_t* own, size_t at, size_t n) {
      for (size_t k = 0; k < n && status.ok(); k += kFoldPieceBytes) {
        if (barrier_.Aborted()) {
          status = barrier_.Stopped();
          break;
        }
        const size_t offset = begin + at + k, piece = std::min(kFoldPieceBytes, n - k);
        status = FoldPiece(offset, piece, own + k, dtype, op);
        for (int r = 0; r < size_ && status.ok(); ++r) {
          if (r != rank_) status = Write(r, offset, piece, own + k);
        }
      }
    });
    if (!status.ok()) return Drained(Fail(status), published);
    return Drained(Sync(), published);
  }

  // own[0, bytes) = the rank-order fold of every rank's bytes at `offset` (own holds this rank's).
  Status FoldPiece(size_t offset, size_t bytes, uint8_t* own, DType dtype, ReduceOp op) {
    const size_t n = bytes / DTypeSize(dtype);
    uint8_t* acc = acc_.data();
    uint8_t* tmp = tmp_.data();
    if (rank_ > 0) {
      CONCORD_RETURN_IF_ERROR(Read(0, offset, bytes, acc));
      for (int r = 1; r < rank_; ++r) {
        CONCORD_RETURN_IF_ERROR(Read(r, offset, bytes, tmp));
        ReduceElements(acc, acc, tmp, n, dtype, op);
      }
      ReduceElements(own, acc, own, n, dtype, op);
    }
    for (int r = rank_ + 1; r < size_; ++r) {
      CONCORD_RETURN_IF_ERROR(Read(r, offset, bytes, tmp));
      ReduceElements(own, own, tmp, n, dtype, op);
    }
    return Status::Ok();
  }

  Status Read(int r, size_t offset, size_t bytes, void* into) {
    Status status = ReadRemote(Name(r), Pid(r), peers_[r], offset, bytes, into);
    if (status.code() == Code::kPeerFailure) dead_ = r;
    return status;
  }

  Status Write(int r, size_t offset, size_t bytes, const void* from) {
    Status status = WriteRemote(Name(r), Pid(r), peers_[r], offset, bytes, from);
    if (status.code() == Code::kPeerFailure) dead_ = r;
    return status;
  }

  const int rank_;
  const int size_;
  const std::unique_ptr<ShmSegment> segment_;
  const size_t half_bytes_;
  // Allreduces at least this large use the peers' memory directly, when direct_ (every rank can).
  const size_t direct_threshold_;
  const std::vector<int> rank_names_;  // BackendOptions::rank_names
  ShmBarrier barrier_;
  int half_ = 0;  // the half the next chunk uses: the same on every rank
  Status failed_;
  bool direct_ = false;
  const char* last_algorithm_ = "segment";      // LastAlgorithm(): only allreduces change it
  int dead_ = -1;                               // a peer a direct read or write found gone
  std::vector<std::vector<RemoteSpan>> peers_;  // the buffers the peers published
  std::vector<uint8_t> acc_, tmp_;              // a direct fold's pieces
};

}  // namespace

StatusOr<std::unique_ptr<Backend>> CreateShmBackend(const BackendOptions& options, Store* store,
                                                    size_t buffer_bytes, size_t direct_threshold) {
  // Every window must hold a line per rank (all-to-all) and an element of every rank's block.
  const size_t half_bytes = std::max(buffer_bytes / 2, (options.size + 1) * kCacheLine);
  CONCORD_ASSIGN_OR_RETURN(std::unique_ptr<ShmSegment> segment,
                           ShmSegment::Open(options.rank, options.size, half_bytes, options.prefix,
                                            store, options.timeout, options.rank_names));
  auto backend = std::make_unique<ShmBackend>(options, std::move(segment), direct_threshold);
  CONCORD_RETURN_IF_ERROR(backend->ProbeDirectReads());
  return std::unique_ptr<Backend>(std::move(backend));
}

std::string ShmHostIdentity(const std::string& override_id) {
  return shm_internal::HostIdentity(override_id);
}

}  // namespace concord
