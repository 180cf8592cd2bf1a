#include "core/metered_backend.h"

#include <numeric>
#include <string>

#include "base/json.h"

namespace concord {
namespace {

uint64_t Sum(const std::vector<size_t>& v) {
  return std::accumulate(v.begin(), v.end(), uint64_t{0});
}

}  // namespace

Status MeteredBackend::Record(const char* op, uint64_t bytes, Clock::time_point start,
                              Status status) const {
  const Clock::time_point end = Clock::now();
  const double seconds = std::chrono::duration<double>(end - start).count();
  metrics_->RecordCollective(lane_, backend_->name(), op, bytes, seconds, status.ok());
  if (timeline_->on()) {
    const char* algorithm = status.ok() ? backend_->LastAlgorithm() : nullptr;
    std::string args;
    if (algorithm != nullptr) args = "\"algorithm\":" + JsonQuote(algorithm);
    timeline_->Slice(Timeline::kLaneTrack + lane_, op, start, end, bytes, backend_->name(),
                     std::move(args));
  }
  return status;
}

Status MeteredBackend::Allreduce(void* data, size_t count, DType dtype, ReduceOp op) {
  const auto start = Clock::now();
  return Record("allreduce", count * DTypeSize(dtype), start,
                backend_->Allreduce(data, count, dtype, op));
}

Status MeteredBackend::AllreduceSpans(const std::vector<AllreduceSpan>& spans, DType dtype,
                                      ReduceOp op) {
  const auto start = Clock::now();
  uint64_t count = 0;
  for (const AllreduceSpan& s : spans) count += s.count;
  return Record("allreduce", count * DTypeSize(dtype), start,
                backend_->AllreduceSpans(spans, dtype, op));
}

Status MeteredBackend::Allgatherv(const void* in, void* out,
                                  const std::vector<size_t>& bytes_per_rank) {
  const auto start = Clock::now();
  return Record("allgather", Sum(bytes_per_rank), start,
                backend_->Allgatherv(in, out, bytes_per_rank));
}

Status MeteredBackend::Broadcast(void* data, size_t bytes, int root) {
  const auto start = Clock::now();
  return Record("broadcast", bytes, start, backend_->Broadcast(data, bytes, root));
}

Status MeteredBackend::Reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                              int root) {
  const auto start = Clock::now();
  return Record("reduce", count * DTypeSize(dtype), start,
                backend_->Reduce(in, out, count, dtype, op, root));
}

Status MeteredBackend::Gatherv(const void* in, void* out, const std::vector<size_t>& bytes_per_rank,
                               int root) {
  const auto start = Clock::now();
  return Record("gather", Sum(bytes_per_rank), start,
                backend_->Gatherv(in, out, bytes_per_rank, root));
}

Status MeteredBackend::Barrier() {
  const auto start = Clock::now();
  return Record("barrier", 0, start, backend_->Barrier());
}

Status MeteredBackend::ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                                     DType dtype, ReduceOp op) {
  const auto start = Clock::now();
  return Record("reducescatter", Sum(counts) * DTypeSize(dtype), start,
                backend_->ReduceScatter(in, out, counts, dtype, op));
}

Status MeteredBackend::OrderedReduceScatter(const void* in, void* out,
                                            const std::vector<size_t>& counts, DType dtype,
                                            ReduceOp op) {
  const auto start = Clock::now();
  return Record("reducescatter", Sum(counts) * DTypeSize(dtype), start,
                backend_->OrderedReduceScatter(in, out, counts, dtype, op));
}

Status MeteredBackend::OrderedAllreduce(void* data, size_t count, DType dtype, ReduceOp op) {
  const auto start = Clock::now();
  return Record("allreduce", count * DTypeSize(dtype), start,
                backend_->OrderedAllreduce(data, count, dtype, op));
}

Status MeteredBackend::Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                                 const std::vector<size_t>& recv_bytes) {
  const auto start = Clock::now();
  return Record("alltoall", Sum(send_bytes), start,
                backend_->Alltoallv(in, send_bytes, out, recv_bytes));
}

}  // namespace concord
