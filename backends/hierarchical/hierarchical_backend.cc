// The two-level backend of a job whose hosts each run several ranks (backend.h,
// CreateHierarchicalBackend).
#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"

namespace concord {
namespace {

void CopyBytes(void* dst, const void* src, size_t n) {
  if (n > 0) memcpy(dst, src, n);
}

// Where part k of `parts` equal parts (the first ones one byte shorter when they cannot be equal)
// of `total` bytes begins; part k ends where part k + 1 begins.
size_t PartBegin(size_t total, int parts, int k) {
  return total * static_cast<size_t>(k) / static_cast<size_t>(parts);
}

// The bytes [a, a_end) and [b, b_end) have in common.
size_t Overlap(size_t a, size_t a_end, size_t b, size_t b_end) {
  const size_t begin = std::max(a, b), end = std::min(a_end, b_end);
  return end > begin ? end - begin : 0;
}

// Follows backend.h. Owns three backends over the same ranks: `local` among this host's ranks
// (shared memory), `cross` among the ranks that hold the same local rank on every host, and `flat`
// over all ranks. `host_of[r]` is rank r's host; a host's local ranks are its ranks in rank order
// (not necessarily consecutive), and every host has local->size() of them.
//
// At least `threshold` bytes (an allgather counts every rank's bytes together) run in two levels,
// so that each NIC carries 1/L of the data (L = local->size(), all L cross groups at once):
//   - Allreduce: a reduce-scatter within the host gives local rank j the host's sum of block j,
//     block j is allreduced across hosts, an allgather within the host. Sums are grouped by host,
//     so not in rank order.
//   - Allgatherv: each host's data (its ranks' blocks in local order) is cut into L parts; an
//     all-to-all within the host gives local rank j part j, an allgather across hosts gives it part
//     j of every host, an allgather within the host gives every rank every part, and each block is
//     copied from its parts to its place in rank order.
//   - Broadcast: the root's host broadcasts within itself; local rank j of that host broadcasts
//     part j across hosts; every other host allgathers its parts within itself.
// Everything else, and smaller messages (whose three latencies would cost more than the bytes
// saved), runs on `flat`. After the first error from any of the three every call returns it.
class HierarchicalBackend : public Backend {
 public:
  HierarchicalBackend(int rank, std::vector<int> host_of, std::unique_ptr<Backend> local,
                      std::unique_ptr<Backend> cross, std::unique_ptr<Backend> flat,
                      size_t threshold)
      : rank_(rank),
        size_(static_cast<int>(host_of.size())),
        host_of_(std::move(host_of)),
        local_(std::move(local)),
        cross_(std::move(cross)),
        flat_(std::move(flat)),
        threshold_(threshold) {
    members_.resize(cross_->size());
    for (int r = 0; r < size_; ++r) members_[host_of_[r]].push_back(r);
  }

  const char* name() const override { return "hierarchical"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // "two_level" for an allreduce, allgather or broadcast that ran over the local and cross
  // backends; otherwise what the flat backend ran.
  const char* LastAlgorithm() const override {
    return two_level_ ? "two_level" : flat_->LastAlgorithm();
  }

  std::function<void()> Interrupter() override {
    std::vector<std::function<void()>> all;
    for (Backend* b : {local_.get(), cross_.get(), flat_.get()}) {
      if (std::function<void()> f = b->Interrupter()) all.push_back(std::move(f));
    }
    if (all.empty()) return nullptr;
    return [all] {
      for (const auto& f : all) f();
    };
  }

  void Abandon() override {
    for (Backend* b : {local_.get(), cross_.get(), flat_.get()}) b->Abandon();
  }

  Status Allreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    CONCORD_RETURN_IF_ERROR(failed_);
    // An invalid dtype has no size: it would pass for 0 bytes and reach a backend as that.
    if (!IsValidDType(static_cast<int>(dtype)) || !IsValidReduceOp(static_cast<int>(op))) {
      return InvalidArgument("hierarchical allreduce: invalid dtype or reduce op");
    }
    if (count > 0 && data == nullptr) {
      return InvalidArgument("hierarchical allreduce: data is null");
    }
    const size_t element = DTypeSize(dtype);
    two_level_ = count * element >= threshold_;
    if (!two_level_) return Keep(flat_->Allreduce(data, count, dtype, op));
    const int n = local_->size();
    std::vector<size_t> counts(n), bytes(n);
    for (int j = 0; j < n; ++j) {
      counts[j] = count * (j + 1) / n - count * j / n;
      bytes[j] = counts[j] * element;
    }
    const size_t mine = counts[local_->rank()];
    block_.resize(std::max<size_t>(1, mine * element));
    CONCORD_RETURN_IF_ERROR(Keep(local_->ReduceScatter(data, block_.data(), counts, dtype, op)));
    CONCORD_RETURN_IF_ERROR(Keep(cross_->Allreduce(block_.data(), mine, dtype, op)));
    return Keep(local_->Allgatherv(block_.data(), data, bytes));
  }

  Status Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override {
    CONCORD_RETURN_IF_ERROR(failed_);
    if (bytes.size() != static_cast<size_t>(size_)) {
      return InvalidArgument("hierarchical allgatherv: " + std::to_string(bytes.size()) +
                             " sizes for " + std::to_string(size_) + " ranks");
    }
    const size_t total = std::accumulate(bytes.begin(), bytes.end(), size_t{0});
    if ((bytes[rank_] > 0 && in == nullptr) || (total > 0 && out == nullptr)) {
      return InvalidArgument("hierarchical allgatherv: null buffer");
    }
    two_level_ = total >= threshold_;
    if (!two_level_) return Keep(flat_->Allgatherv(in, out, bytes));
    const int parts = local_->size(), hosts = cross_->size();
    const int j = local_->rank(), host = host_of_[rank_];
    // Each host's bytes, and where each rank's block begins within its host's.
    std::vector<size_t> host_bytes(hosts, 0), at_host(size_);
    for (int r = 0; r < size_; ++r) {
      at_host[r] = host_bytes[host_of_[r]];
      host_bytes[host_of_[r]] += bytes[r];
    }
    auto part_bytes = [&](int h, int k) {
      return PartBegin(host_bytes[h], parts, k + 1) - PartBegin(host_bytes[h], parts, k);
    };
    // 1. Within the host: this rank sends local rank k what of its block lies in part k, and
    // receives from it what of its block lies in part j.
    std::vector<size_t> send(parts), recv(parts);
    const size_t part_begin = PartBegin(host_bytes[host], parts, j);
    const size_t part_end = PartBegin(host_bytes[host], parts, j + 1);
    for (int k = 0; k < parts; ++k) {
      const int r = members_[host][k];
      send[k] =
          Overlap(at_host[rank_], at_host[rank_] + bytes[rank_],
                  PartBegin(host_bytes[host], parts, k), PartBegin(host_bytes[host], parts, k + 1));
      recv[k] = Overlap(at_host[r], at_host[r] + bytes[r], part_begin, part_end);
    }
    block_.resize(std::max<size_t>(1, part_end - part_begin));
    const uint8_t nothing = 0;  // an empty block's address may be null
    CONCORD_RETURN_IF_ERROR(
        Keep(local_->Alltoallv(in != nullptr ? in : &nothing, send, block_.data(), recv)));
    // 2. Across hosts: part j of every host, in host order.
    std::vector<size_t> across(hosts);
    for (int h = 0; h < hosts; ++h) across[h] = part_bytes(h, j);
    const size_t gathered = std::accumulate(across.begin(), across.end(), size_t{0});
    gathered_.resize(std::max<size_t>(1, gathered));
    CONCORD_RETURN_IF_ERROR(Keep(cross_->Allgatherv(block_.data(), gathered_.data(), across)));
    // 3. Within the host: every part of every host, part 0 of hosts 0 .. H-1 first.
    std::vector<size_t> within(parts, 0);
    std::vector<std::vector<size_t>> part_at(hosts, std::vector<size_t>(parts));
    size_t at = 0;
    for (int k = 0; k < parts; ++k) {
      for (int h = 0; h < hosts; ++h) {
        part_at[h][k] = at;
        at += part_bytes(h, k);
        within[k] += part_bytes(h, k);
      }
    }
    all_.resize(std::max<size_t>(1, total));
    CONCORD_RETURN_IF_ERROR(Keep(local_->Allgatherv(gathered_.data(), all_.data(), within)));
    // 4. Every block from its host's parts to its place in rank order.
    std::vector<size_t> at_out(size_);
    std::exclusive_scan(bytes.begin(), bytes.end(), at_out.begin(), size_t{0});
    auto* dst = static_cast<uint8_t*>(out);
    for (int h = 0; h < hosts; ++h) {
      int k = 0;
      size_t pos = 0;  // within host h's bytes
      for (const int r : members_[h]) {
        for (size_t done = 0; done < bytes[r];) {
          while (pos >= PartBegin(host_bytes[h], parts, k + 1)) ++k;
          const size_t begin = PartBegin(host_bytes[h], parts, k);
          const size_t n = std::min(bytes[r] - done, PartBegin(host_bytes[h], parts, k + 1) - pos);
          CopyBytes(dst + at_out[r] + done, all_.data() + part_at[h][k] + (pos - begin), n);
          done += n;
          pos += n;
        }
      }
    }
    return Status::Ok();
  }

  Status Broadcast(void* data, size_t bytes, int root) override {
    CONCORD_RETURN_IF_ERROR(failed_);
    if (root < 0 || root >= size_) {
      return InvalidArgument("hierarchical broadcast: root " + std::to_string(root) +
                             " out of range");
    }
    if (bytes > 0 && data == nullptr) {
      return InvalidArgument("hierarchical broadcast: data is null");
    }
    two_level_ = bytes >= threshold_;
    if (!two_level_) return Keep(flat_->Broadcast(data, bytes, root));
    const int parts = local_->size(), j = local_->rank();
    const int root_host = host_of_[root], host = host_of_[rank_];
    const std::vector<int>& root_members = members_[root_host];
    auto* p = static_cast<uint8_t*>(data);
    if (host == root_host) {
      const int local_root = static_cast<int>(
          std::find(root_members.begin(), root_members.end(), root) - root_members.begin());
      CONCORD_RETURN_IF_ERROR(Keep(local_->Broadcast(data, bytes, local_root)));
    }
    const size_t begin = PartBegin(bytes, parts, j);
    const size_t n = PartBegin(bytes, parts, j + 1) - begin;
    CONCORD_RETURN_IF_ERROR(Keep(cross_->Broadcast(p + begin, n, root_host)));
    if (host == root_host) return Status::Ok();
    std::vector<size_t> within(parts);
    for (int k = 0; k < parts; ++k) {
      within[k] = PartBegin(bytes, parts, k + 1) - PartBegin(bytes, parts, k);
    }
    block_.resize(std::max<size_t>(1, n));
    CopyBytes(block_.data(), p + begin, n);
    return Keep(local_->Allgatherv(block_.data(), data, within));
  }

  Status Barrier() override {
    CONCORD_RETURN_IF_ERROR(failed_);
    two_level_ = false;
    return Keep(flat_->Barrier());
  }
  Status ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                       ReduceOp op) override {
    CONCORD_RETURN_IF_ERROR(failed_);
    two_level_ = false;
    return Keep(flat_->ReduceScatter(in, out, counts, dtype, op));
  }
  Status Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes) override {
    CONCORD_RETURN_IF_ERROR(failed_);
    two_level_ = false;
    return Keep(flat_->Alltoallv(in, send_bytes, out, recv_bytes));
  }

 private:
  Status Keep(Status status) {
    if (!status.ok()) failed_ = status;
    return status;
  }

  const int rank_;
  const int size_;
  const std::vector<int> host_of_;         // every rank's host
  std::vector<std::vector<int>> members_;  // every host's ranks, in rank order
  const std::unique_ptr<Backend> local_;
  const std::unique_ptr<Backend> cross_;
  const std::unique_ptr<Backend> flat_;
  const size_t threshold_;
  std::vector<uint8_t> block_;     // this rank's block or part between the steps
  std::vector<uint8_t> gathered_;  // an allgather's part of every host
  std::vector<uint8_t> all_;       // an allgather's parts of every host, by part
  Status failed_;
  bool two_level_ = false;  // the last call ran in two levels (LastAlgorithm)
};

}  // namespace

StatusOr<std::unique_ptr<Backend>> CreateHierarchicalBackend(
    int rank, const std::vector<int>& host_of, std::unique_ptr<Backend> local,
    std::unique_ptr<Backend> cross, std::unique_ptr<Backend> flat, size_t threshold) {
  const int size = static_cast<int>(host_of.size());
  auto refuse = [](const std::string& what) {
    return InvalidArgument("hierarchical backend: " + what);
  };
  if (rank < 0 || rank >= size) {
    return refuse("rank " + std::to_string(rank) + " of " + std::to_string(size));
  }
  if (flat->rank() != rank || flat->size() != size) {
    return refuse("the flat backend is rank " + std::to_string(flat->rank()) + " of " +
                  std::to_string(flat->size()) + ", not " + std::to_string(rank) + " of " +
                  std::to_string(size));
  }
  std::vector<int> ranks_on(cross->size(), 0);
  int local_rank = -1;
  for (int r = 0; r < size; ++r) {
    if (host_of[r] < 0 || host_of[r] >= cross->size()) {
      return refuse("rank " + std::to_string(r) + "'s host " + std::to_string(host_of[r]) +
                    " is not one of the " + std::to_string(cross->size()) +
                    " ranks of the backend across hosts");
    }
    if (r == rank) local_rank = ranks_on[host_of[r]];
    ++ranks_on[host_of[r]];
  }
  for (int h = 0; h < cross->size(); ++h) {
    if (ranks_on[h] != local->size()) {
      return refuse("host " + std::to_string(h) + " runs " + std::to_string(ranks_on[h]) +
                    " ranks, the local backend " + std::to_string(local->size()));
    }
  }
  if (cross->rank() != host_of[rank] || local->rank() != local_rank) {
    return refuse("rank " + std::to_string(rank) + " is local rank " + std::to_string(local_rank) +
                  " of host " + std::to_string(host_of[rank]) + ", but rank " +
                  std::to_string(local->rank()) + " of the local backend and " +
                  std::to_string(cross->rank()) + " of the one across hosts");
  }
  return std::unique_ptr<Backend>(std::make_unique<HierarchicalBackend>(
      rank, host_of, std::move(local), std::move(cross), std::move(flat), threshold));
}

}  // namespace concord
