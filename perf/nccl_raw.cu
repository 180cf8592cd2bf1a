#include <nccl.h>

#include <cstring>

#include "backends/cuda/cuda_check.h"
#include "backends/nccl/nccl_check.h"
#include "base/clock.h"
#include "perf/bench_common.h"
#include "perf/device_copy.h"
#include "perf/nccl_raw.h"

namespace concord {
namespace {

// Owns a communicator and a stream; destroys them at scope exit.
struct Resources {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  ~Resources() {
    if (comm != nullptr) ncclCommDestroy(comm);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

}  // namespace

StatusOr<std::vector<double>> RunRawNcclAllreduce(const RawNcclOptions& o, void* buffer,
                                                  Store* store) {
  cuda::DeviceGuard guard;
  CONCORD_CUDA_CHECK(guard.Set(o.device));
  ncclUniqueId id;
  const std::string key = o.prefix + "/raw_nccl_id";
  if (o.rank == 0) {
    CONCORD_NCCL_CHECK(ncclGetUniqueId(&id));
    CONCORD_RETURN_IF_ERROR(
        store->Set(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id))));
  } else {
    CONCORD_ASSIGN_OR_RETURN(std::string bytes, store->Get(key, Deadline::After(o.timeout)));
    if (bytes.size() != sizeof(id)) return ProtocolError("raw nccl: bad unique id in the store");
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  Resources res;
  CONCORD_NCCL_CHECK(ncclCommInitRank(&res.comm, o.size, id, o.rank));
  CONCORD_CUDA_CHECK(cudaStreamCreateWithFlags(&res.stream, cudaStreamNonBlocking));
  std::vector<double> times;
  for (int i = 0; i < o.warmup + o.iterations; ++i) {
    const auto t0 = Clock::now();
    CONCORD_NCCL_CHECK(
        ncclAllReduce(buffer, buffer, o.count, ncclFloat32, ncclSum, res.comm, res.stream));
    CONCORD_CUDA_CHECK(cudaStreamSynchronize(res.stream));
    if (i >= o.warmup) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  // The checked run: the known data copied in, one allreduce, the result copied back and compared.
  std::vector<float> host(o.count);
  for (size_t i = 0; i < o.count; ++i) {
    host[i] = static_cast<float>(bench::ReductionInput(CONCORD_SUM, o.rank, o.size, i));
  }
  const Status copied_in = CopyHostToDevice(o.device, buffer, host.data(), o.count * sizeof(float));
  // Every rank runs the allreduce, whatever its copy gave, so that no peer waits for it alone.
  CONCORD_NCCL_CHECK(
      ncclAllReduce(buffer, buffer, o.count, ncclFloat32, ncclSum, res.comm, res.stream));
  CONCORD_CUDA_CHECK(cudaStreamSynchronize(res.stream));
  CONCORD_RETURN_IF_ERROR(copied_in);
  CONCORD_RETURN_IF_ERROR(CopyDeviceToHost(o.device, host.data(), buffer, o.count * sizeof(float)));
  const std::string wrong = bench::FirstWrongElement(
      o.count, [&](size_t i) { return host[i]; }, bench::ReductionExpected);
  if (!wrong.empty()) {
    return Status(Code::kMismatch,
                  "raw nccl: wrong result on rank " + std::to_string(o.rank) + ": " + wrong);
  }
  return times;
}

}  // namespace concord
