// A lane's backend with its collectives timed into the communicator's metrics (core/metrics.h):
// every call is forwarded unchanged, and its bytes and duration recorded under the lane, the
// backend's name and the op; also as a slice on the lane's track of the timeline, when it is on
// (args: bytes, backend, and the algorithm the backend says it ran: Backend::LastAlgorithm).
//
// Contract: owns the backend it wraps; shares the metrics and the timeline. Thread-compatible like
// any backend (the lane's one thread calls it); Interrupter() is the wrapped backend's, for any
// thread; Abandon() is forwarded.
#pragma once

#include <memory>

#include "backends/backend.h"
#include "core/metrics.h"
#include "core/timeline.h"

namespace concord {

class MeteredBackend : public Backend {
 public:
  MeteredBackend(std::unique_ptr<Backend> backend, int lane, std::shared_ptr<Metrics> metrics,
                 std::shared_ptr<Timeline> timeline)
      : backend_(std::move(backend)),
        lane_(lane),
        metrics_(std::move(metrics)),
        timeline_(std::move(timeline)) {}

  const char* name() const override { return backend_->name(); }
  std::function<void()> Interrupter() override { return backend_->Interrupter(); }
  void Abandon() override { backend_->Abandon(); }
  int rank() const override { return backend_->rank(); }
  int size() const override { return backend_->size(); }
  bool ReducesInRankOrder() const override { return backend_->ReducesInRankOrder(); }
  bool HasOrderedReductions() const override { return backend_->HasOrderedReductions(); }
  const char* LastAlgorithm() const override { return backend_->LastAlgorithm(); }

  Status Allreduce(void* data, size_t count, DType dtype, ReduceOp op) override;
  Status AllreduceSpans(const std::vector<AllreduceSpan>& spans, DType dtype, ReduceOp op) override;
  Status Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes_per_rank) override;
  Status Broadcast(void* data, size_t bytes, int root) override;
  Status Reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                int root) override;
  Status Gatherv(const void* in, void* out, const std::vector<size_t>& bytes_per_rank,
                 int root) override;
  Status Barrier() override;
  Status ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                       ReduceOp op) override;
  Status OrderedReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                              DType dtype, ReduceOp op) override;
  Status OrderedAllreduce(void* data, size_t count, DType dtype, ReduceOp op) override;
  Status Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes) override;

 private:
  // Records `status` of a call of `op` over `bytes` that started at `start`; returns it.
  Status Record(const char* op, uint64_t bytes, Clock::time_point start, Status status) const;

  const std::unique_ptr<Backend> backend_;
  const int lane_;
  const std::shared_ptr<Metrics> metrics_;
  const std::shared_ptr<Timeline> timeline_;
};

}  // namespace concord
