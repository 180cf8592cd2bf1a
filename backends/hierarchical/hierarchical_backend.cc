// The two-level backend of a job whose hosts each run several ranks (backend.h,
// CreateHierarchicalBackend).
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "backends/backend.h"

namespace concord {
namespace {

// Follows backend.h. Owns three backends over the same ranks: `local` among this host's ranks
// (shared memory), `cross` among the ranks that hold the same local rank on every host, and `flat`
// over all ranks. An allreduce of at least `threshold` bytes runs in three steps: a reduce-scatter
// within the host gives each local rank the host's sum of one block, an allreduce of that block
// across hosts (local_size of them run at once, one per local rank, so each NIC carries
// 1/local_size of the data), and an allgather within the host. Everything else, and smaller
// allreduces (whose three latencies would cost more than the bytes saved), runs on `flat`. Sums
// are grouped by host, so not in rank order. After the first error every call returns it.
class HierarchicalBackend : public Backend {
 public:
  HierarchicalBackend(int rank, int size, std::unique_ptr<Backend> local,
                      std::unique_ptr<Backend> cross, std::unique_ptr<Backend> flat,
                      size_t threshold)
      : rank_(rank),
        size_(size),
        local_(std::move(local)),
        cross_(std::move(cross)),
        flat_(std::move(flat)),
        threshold_(threshold) {}

  const char* name() const override { return "hierarchical"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

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

  Status Allreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    CONCORD_RETURN_IF_ERROR(failed_);
    const size_t element = DTypeSize(dtype);
    if (count * element < threshold_) return Keep(flat_->Allreduce(data, count, dtype, op));
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
    return Keep(flat_->Allgatherv(in, out, bytes));
  }
  Status Broadcast(void* data, size_t bytes, int root) override {
    CONCORD_RETURN_IF_ERROR(failed_);
    return Keep(flat_->Broadcast(data, bytes, root));
  }
  Status Barrier() override {
    CONCORD_RETURN_IF_ERROR(failed_);
    return Keep(flat_->Barrier());
  }
  Status ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                       ReduceOp op) override {
    CONCORD_RETURN_IF_ERROR(failed_);
    return Keep(flat_->ReduceScatter(in, out, counts, dtype, op));
  }
  Status Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes) override {
    CONCORD_RETURN_IF_ERROR(failed_);
    return Keep(flat_->Alltoallv(in, send_bytes, out, recv_bytes));
  }

 private:
  Status Keep(Status status) {
    if (!status.ok()) failed_ = status;
    return status;
  }

  const int rank_;
  const int size_;
  const std::unique_ptr<Backend> local_;
  const std::unique_ptr<Backend> cross_;
  const std::unique_ptr<Backend> flat_;
  const size_t threshold_;
  std::vector<uint8_t> block_;  // this rank's block between the three steps
  Status failed_;
};

}  // namespace

std::unique_ptr<Backend> CreateHierarchicalBackend(int rank, int size,
                                                   std::unique_ptr<Backend> local,
                                                   std::unique_ptr<Backend> cross,
                                                   std::unique_ptr<Backend> flat,
                                                   size_t threshold) {
  return std::make_unique<HierarchicalBackend>(rank, size, std::move(local), std::move(cross),
                                               std::move(flat), threshold);
}

}  // namespace concord
