// A short job that puts every kind of Concord traffic on the wire once, for valgrind's memcheck
// (scripts/valgrind.sh, the ctest test valgrind_wire_np2): every byte a rank sends must have been
// written by someone, so no heap or stack garbage leaves the process. Through the C API only, on
// the ranks concordrun starts:
//   concordrun -np 2 valgrind ... ./valgrind_wire_job
//
// Every dtype through each path an allreduce can take (inline with its negotiation, fused through
// a lane's fusion buffer, direct on the caller's memory), odd element counts (so that no size is a
// multiple of a chunk or a vector width), a group, allgather with first dimensions differing by
// rank (into a caller buffer and into library-owned output), broadcast from each root, barrier, and
// fp16, bf16 and top-k compression of float32 and float64. Inputs are small integers, so every
// result is checked exactly. Prints "valgrind_wire_job: rank R PASS" at the end.
#include <cstdio>
#include <string>
#include <vector>

#include "concord/concord.h"
#include "tests/common/check.h"
#include "tests/common/tensors.h"

namespace {

using concord::harness::LoadElement;
using concord::harness::StoreElement;

const concord_dtype_t kDTypes[] = {CONCORD_UINT8,   CONCORD_INT8,    CONCORD_INT32,
                                   CONCORD_INT64,   CONCORD_FLOAT16, CONCORD_BFLOAT16,
                                   CONCORD_FLOAT32, CONCORD_FLOAT64};

// Thresholds set below: up to kInlineBytes an allreduce travels inline, from kDirectBytes on it
// runs in place; in between it is fused. kCounts hits each path for every dtype.
constexpr int64_t kInlineBytes = 64;
constexpr int64_t kDirectBytes = 64 << 10;
constexpr int64_t kCounts[] = {5, 4099, 70001};
// A group adds a second direct allreduce of each dtype: several buffers take the span ring.
constexpr int64_t kGroupCounts[] = {5, 4099, 70001, 70003};

int g_rank = 0, g_size = 1;

// Element i of rank r's input: small integers, exact in every dtype even when summed.
double Input(int rank, int64_t i) {
  return static_cast<double>(i % 5 + rank + 1);
}

std::vector<unsigned char> Filled(concord_dtype_t dtype, int64_t count, int rank) {
  std::vector<unsigned char> bytes(static_cast<size_t>(count) * ElementSize(dtype));
  for (int64_t i = 0; i < count; ++i) StoreElement(dtype, bytes.data(), i, Input(rank, i));
  return bytes;
}

double SumOverRanks(int64_t i) {
  double sum = 0;
  for (int r = 0; r < g_size; ++r) sum += Input(r, i);
  return sum;
}

// Waits for `request`, frees it, and checks it succeeded.
void Finish(concord_request_t request, const std::string& what) {
  const concord_status_t s = concord_wait(request, -1);
  CHECKF(s == CONCORD_SUCCESS, "%s: %s", what.c_str(), concord_request_error(request));
  concord_request_free(request);
}

void CheckSums(concord_dtype_t dtype, const std::vector<unsigned char>& data, int64_t count,
               const std::string& what) {
  int64_t wrong = 0;
  for (int64_t i = 0; i < count; ++i)
    wrong += LoadElement(dtype, data.data(), i) != SumOverRanks(i);
  CHECKF(wrong == 0, "%s: %lld wrong elements", what.c_str(), static_cast<long long>(wrong));
}

void Allreduces(concord_comm_t comm) {
  for (concord_dtype_t dtype : kDTypes) {
    for (int64_t count : kCounts) {
      const std::string name =
          "ar." + std::to_string(static_cast<int>(dtype)) + "." + std::to_string(count);
      std::vector<unsigned char> data = Filled(dtype, count, g_rank);
      const int64_t shape[1] = {count};
      concord_tensor_t t = CpuTensor(data.data(), dtype, 1, shape);
      const concord_status_t s = concord_allreduce(comm, name.c_str(), &t, nullptr, nullptr);
      CHECKF(s == CONCORD_SUCCESS, "%s: %s", name.c_str(), concord_comm_last_error(comm));
      CheckSums(dtype, data, count, name);
    }
  }
  // A group: every dtype and size in one negotiation, fused where they can be.
  std::vector<std::vector<unsigned char>> data;
  std::vector<std::pair<concord_request_t, std::string>> pending;
  CHECK_STATUS(concord_group_start(comm), CONCORD_SUCCESS);
  for (concord_dtype_t dtype : kDTypes) {
    for (int64_t count : kGroupCounts) {
      const std::string name =
          "group." + std::to_string(static_cast<int>(dtype)) + "." + std::to_string(count);
      data.push_back(Filled(dtype, count, g_rank));
      const int64_t shape[1] = {count};
      concord_tensor_t t = CpuTensor(data.back().data(), dtype, 1, shape);
      concord_request_t r = nullptr;
      CHECK_STATUS(
          concord_allreduce_async(comm, name.c_str(), &t, nullptr, nullptr, nullptr, nullptr, &r),
          CONCORD_SUCCESS);
      pending.emplace_back(r, name);
    }
  }
  CHECK_STATUS(concord_group_end(comm), CONCORD_SUCCESS);
  size_t k = 0;
  for (concord_dtype_t dtype : kDTypes) {
    for (int64_t count : kGroupCounts) {
      Finish(pending[k].first, pending[k].second);
      CheckSums(dtype, data[k], count, pending[k].second);
      ++k;
    }
  }
}

void Compressed(concord_comm_t comm) {
  for (const char* spec : {"fp16", "bf16", "topk:density=1", "topk:density=1,values=fp16"}) {
    for (concord_dtype_t dtype : {CONCORD_FLOAT32, CONCORD_FLOAT64}) {
      const bool topk = std::string(spec).rfind("topk", 0) == 0;
      if (topk && dtype != CONCORD_FLOAT32) continue;  // top-k takes float32 only
      for (int64_t count : kCounts) {
        const std::string name = std::string("c.") + spec + "." +
                                 std::to_string(static_cast<int>(dtype)) + "." +
                                 std::to_string(count);
        std::vector<unsigned char> data = Filled(dtype, count, g_rank);
        const int64_t shape[1] = {count};
        concord_tensor_t t = CpuTensor(data.data(), dtype, 1, shape);
        concord_allreduce_opts_t opts;
        concord_allreduce_opts_init(&opts);
        opts.compression = spec;
        const concord_status_t s = concord_allreduce(comm, name.c_str(), &t, nullptr, &opts);
        CHECKF(s == CONCORD_SUCCESS, "%s: %s", name.c_str(), concord_comm_last_error(comm));
        CheckSums(dtype, data, count, name);  // small integers: exact in fp16 and bf16
      }
    }
  }
}

void Allgathers(concord_comm_t comm) {
  for (concord_dtype_t dtype : kDTypes) {
    const int64_t row = 7;  // elements per row; rank r contributes r + 1 rows
    const std::string name = "ag." + std::to_string(static_cast<int>(dtype));
    std::vector<unsigned char> mine = Filled(dtype, (g_rank + 1) * row, g_rank);
    const int64_t shape[2] = {g_rank + 1, row};
    concord_tensor_t t = CpuTensor(mine.data(), dtype, 2, shape);
    int64_t rows = 0;
    for (int r = 0; r < g_size; ++r) rows += r + 1;
    std::vector<unsigned char> out(static_cast<size_t>(rows * row) * ElementSize(dtype));
    // Into a caller buffer, then into output the request owns.
    CHECK_STATUS(concord_allgather(comm, name.c_str(), &t, out.data(), out.size()),
                 CONCORD_SUCCESS);
    concord_request_t r = nullptr;
    CHECK_STATUS(concord_allgather_async(comm, (name + ".owned").c_str(), &t, nullptr, 0, nullptr,
                                         nullptr, &r),
                 CONCORD_SUCCESS);
    CHECK_STATUS(concord_wait(r, -1), CONCORD_SUCCESS);
    void* owned = nullptr;
    size_t owned_bytes = 0;
    CHECK_STATUS(concord_request_output(r, &owned, &owned_bytes, nullptr), CONCORD_SUCCESS);
    CHECKF(owned_bytes == out.size(), "%s: %zu bytes owned, %zu gathered", name.c_str(),
           owned_bytes, out.size());
    int64_t at = 0, wrong = 0;
    for (int src = 0; src < g_size; ++src) {
      for (int64_t i = 0; i < (src + 1) * row; ++i, ++at) {
        wrong += LoadElement(dtype, out.data(), at) != Input(src, i);
        if (owned_bytes == out.size()) wrong += LoadElement(dtype, owned, at) != Input(src, i);
      }
    }
    CHECKF(wrong == 0, "%s: %lld wrong elements", name.c_str(), static_cast<long long>(wrong));
    concord_request_free(r);
  }
}

void Broadcasts(concord_comm_t comm) {
  for (concord_dtype_t dtype : kDTypes) {
    for (int root = 0; root < g_size; ++root) {
      const int64_t count = 4099;
      const std::string name =
          "bc." + std::to_string(static_cast<int>(dtype)) + "." + std::to_string(root);
      std::vector<unsigned char> data = Filled(dtype, count, g_rank);
      const int64_t shape[1] = {count};
      concord_tensor_t t = CpuTensor(data.data(), dtype, 1, shape);
      CHECK_STATUS(concord_broadcast(comm, name.c_str(), &t, nullptr, root), CONCORD_SUCCESS);
      int64_t wrong = 0;
      for (int64_t i = 0; i < count; ++i) {
        wrong += LoadElement(dtype, data.data(), i) != Input(root, i);
      }
      CHECKF(wrong == 0, "%s: %lld wrong elements", name.c_str(), static_cast<long long>(wrong));
    }
  }
}

}  // namespace

int main() {
  concord_config_t config;
  concord_config_init(&config);
  config.inline_threshold_bytes = kInlineBytes;
  config.direct_threshold_bytes = kDirectBytes;
  concord_comm_t comm = nullptr;
  if (concord_init_config(&config, &comm) != CONCORD_SUCCESS) {
    std::fprintf(stderr, "valgrind_wire_job: init: %s\n", concord_comm_last_error(nullptr));
    return 1;
  }
  CHECK_STATUS(concord_comm_rank(comm, &g_rank), CONCORD_SUCCESS);
  CHECK_STATUS(concord_comm_size(comm, &g_size), CONCORD_SUCCESS);
  CheckSetContext("rank %d", g_rank);
  Allreduces(comm);
  Compressed(comm);
  Allgathers(comm);
  Broadcasts(comm);
  CHECK_STATUS(concord_barrier(comm), CONCORD_SUCCESS);
  CHECK_STATUS(concord_finalize(comm), CONCORD_SUCCESS);
  if (CheckFailures() != 0) {
    std::fprintf(stderr, "valgrind_wire_job: rank %d: %d failures\n", g_rank, CheckFailures());
    return 1;
  }
  std::printf("valgrind_wire_job: rank %d PASS\n", g_rank);
  return 0;
}
