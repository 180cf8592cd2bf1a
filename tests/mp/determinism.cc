// Deterministic mode (concord_config_t.deterministic, CONCORD_DETERMINISTIC): one fixed set of
// tensors, allreduced and reducescattered under many configurations, gives the same bits under
// every one of them, on every rank, and the bits of the rank-order left fold.
//
// The tensors: float16, bfloat16, float32 and float64, of 0, 1, 7, 4099, 10007 elements and about
// --large bytes (an odd count), holding values of widely varying magnitude (exponents -6..6, both
// signs, a fixed seed per tensor and rank), so that a different summation order changes the bits.
// Most are summed, some averaged; even ones in place. Each configuration is a fresh communicator
// (concord_init_config) with its own fusion, direct and inline thresholds, lanes, submission order
// (natural, reversed, or shuffled differently on every rank), compression (none; fp16 for the
// float32 and float64 tensors; top-k for the float32 allreduces, which sums its shares in rank
// order by itself) and path (shared memory, Gloo's TCP pairs, two pretend hosts: hierarchical at
// 4 ranks). Checked:
//  - every configuration of one compression gives the same SHA-256 for every result;
//  - every rank's allreduce results hash the same (their digests allgathered);
//  - the summed results of the first configuration are, bit for bit, the left fold over ranks
//    0..size-1 computed here (half types rounded after each rank's addition);
//  - with --teeth, at 3 ranks and more: with deterministic mode OFF, the same tensors under some
//    of the same configurations give at least one different digest (else these inputs could not
//    show a change of order, and the checks above would prove nothing). Gloo's ring shows it
//    (dozens of results differ); Open MPI's reductions at 3 ranks happen to fold in rank order for
//    all but about one result, so the MPI runs leave this check to Gloo's.
// Usage: mp_determinism [--large BYTES] [--teeth]
// Prints "determinism: rank R: PASS" when every check passed.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/common/sha256.h"
#include "tests/common/tensors.h"
#include "tests/mp/mp_common.h"

namespace {

using concord::harness::Sha256;
namespace h = concord::harness;

int g_rank = 0;
int g_size = 1;

struct Tensor {
  concord_dtype_t dtype;
  int64_t count;
  concord_reduce_op_t op;
  std::vector<uint8_t> input;  // this rank's
};

// Element `i` of rank `rank`'s input of tensor `k`: +-(1 + u) * 2^e, e in [-6, 6].
std::vector<double> Values(size_t k, int rank, int64_t count) {
  std::mt19937_64 rng(0x5eed0000u + k * 131 + static_cast<uint64_t>(rank));
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  std::uniform_int_distribution<int> exponent(-6, 6);
  std::vector<double> v(static_cast<size_t>(count));
  for (double& x : v) {
    x = std::ldexp(mantissa(rng), exponent(rng));
    if (rng() & 1) x = -x;
  }
  return v;
}

std::vector<uint8_t> Store(concord_dtype_t dtype, const std::vector<double>& v) {
  std::vector<uint8_t> out(std::max<size_t>(v.size() * ElementSize(dtype), 1));
  for (size_t i = 0; i < v.size(); ++i) h::StoreElement(dtype, out.data(), i, v[i]);
  return out;
}

std::vector<Tensor> MakeTensors(int64_t large_bytes) {
  const concord_dtype_t dtypes[] = {CONCORD_FLOAT16, CONCORD_BFLOAT16, CONCORD_FLOAT32,
                                    CONCORD_FLOAT64};
  std::vector<Tensor> tensors;
  for (concord_dtype_t dtype : dtypes) {
    const int64_t large = large_bytes / static_cast<int64_t>(ElementSize(dtype)) | 1;  // odd
    for (int64_t count :
         {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{4099}, int64_t{10007}, large}) {
      Tensor t;
      t.dtype = dtype;
      t.count = count;
      t.op = tensors.size() % 3 == 2 ? CONCORD_AVERAGE : CONCORD_SUM;
      t.input = Store(dtype, Values(tensors.size(), g_rank, count));
      tensors.push_back(std::move(t));
    }
  }
  return tensors;
}

// The rank-order left fold of tensor k's inputs: acc = x_0, then acc = acc + x_r for r = 1.., in
// the element type (half types: added in float, rounded after each rank).
std::vector<uint8_t> LeftFold(size_t k, const Tensor& t) {
  std::vector<double> acc = Values(k, 0, t.count);
  std::vector<uint8_t> out = Store(t.dtype, acc);
  for (size_t i = 0; i < acc.size(); ++i) acc[i] = h::LoadElement(t.dtype, out.data(), i);
  for (int r = 1; r < g_size; ++r) {
    const std::vector<uint8_t> x = Store(t.dtype, Values(k, r, t.count));
    for (size_t i = 0; i < acc.size(); ++i) {
      const double xi = h::LoadElement(t.dtype, x.data(), i);
      switch (t.dtype) {
        case CONCORD_FLOAT16:
          acc[i] =
              h::HalfToFloat(h::FloatToHalf(static_cast<float>(acc[i]) + static_cast<float>(xi)));
          break;
        case CONCORD_BFLOAT16:
          acc[i] = h::BFloat16ToFloat(
              h::FloatToBFloat16(static_cast<float>(acc[i]) + static_cast<float>(xi)));
          break;
        case CONCORD_FLOAT32:
          acc[i] = static_cast<float>(static_cast<float>(acc[i]) + static_cast<float>(xi));
          break;
        default:
          acc[i] += xi;
      }
    }
  }
  return Store(t.dtype, acc);
}

// Rows of `count` this rank receives from a reducescatter (the even split).
int64_t MyRows(int64_t count, int64_t* first) {
  *first = 0;
  for (int r = 0; r < g_rank; ++r) *first += count / g_size + (r < count % g_size);
  return count / g_size + (g_rank < count % g_size);
}

enum class Order { kNatural, kReversed, kShuffled };

// Where the collectives run: shared memory (all ranks on this host, the default), Gloo's TCP pairs
// (CONCORD_SHM=off), or two pretend hosts (CONCORD_HOST_ID; at 4 ranks every allreduce is
// hierarchical, shared memory within a host and Gloo across; at 2 and 3 ranks they run flat).
enum class Path { kShm, kTcp, kTwoHosts };

struct Setup {
  const char* what;
  int64_t fusion, direct, inline_bytes;
  int lanes;
  Order order;
  const char* compression;  // for the tensors it takes (fp16: float32 and 64; top-k: float32)
  Path path = Path::kShm;
};

// Sets the environment that concord_init reads for `path` (none of it is in concord_config_t).
void SetPath(Path path) {
  unsetenv("CONCORD_SHM");
  unsetenv("CONCORD_HOST_ID");
  unsetenv("CONCORD_HIERARCHICAL_THRESHOLD");
  if (path == Path::kTcp) setenv("CONCORD_SHM", "off", 1);
  if (path == Path::kTwoHosts) {
    setenv("CONCORD_HOST_ID", ("determinism-host-" + std::to_string(g_rank * 2 / g_size)).c_str(),
           1);
    setenv("CONCORD_HIERARCHICAL_THRESHOLD", "0", 1);
  }
}

const Setup kSetups[] = {
    {"defaults", 64 << 20, 256 << 10, 32 << 10, 2, Order::kNatural, "none"},
    {"no fusion, 1 lane, no inline, tcp", 0, 256 << 10, 0, 1, Order::kNatural, "none", Path::kTcp},
    {"all direct, 4 lanes, two hosts", 1 << 20, 0, 0, 4, Order::kReversed, "none", Path::kTwoHosts},
    {"small fusion, big direct, shuffled", 64 << 10, 1 << 20, 32 << 10, 2, Order::kShuffled,
     "none"},
    {"never direct, max inline, 4 lanes, shuffled", 64 << 20, 64 << 20, 256 << 10, 4,
     Order::kShuffled, "none"},
    {"8 MiB fusion, all direct, 1 lane, shuffled, tcp", 8 << 20, 0, 0, 1, Order::kShuffled, "none",
     Path::kTcp},
    {"256 KiB fusion, 64 KiB direct, 4 KiB inline", 256 << 10, 64 << 10, 4 << 10, 2,
     Order::kReversed, "none"},
    {"no fusion, all direct, max inline, 4 lanes, two hosts", 0, 0, 256 << 10, 4, Order::kShuffled,
     "none", Path::kTwoHosts},
    {"fp16, defaults", 64 << 20, 256 << 10, 32 << 10, 2, Order::kNatural, "fp16"},
    {"fp16, 64 KiB fusion, 4 lanes, shuffled, tcp", 64 << 10, 0, 0, 4, Order::kShuffled, "fp16",
     Path::kTcp},
    {"fp16, 1 lane, reversed", 1 << 20, 1 << 20, 256 << 10, 1, Order::kReversed, "fp16"},
    {"topk, defaults", 64 << 20, 256 << 10, 32 << 10, 2, Order::kNatural, "topk:density=0.1"},
    {"topk, no fusion, 4 lanes, shuffled", 0, 0, 0, 4, Order::kShuffled, "topk:density=0.1"},
};
constexpr size_t kNumSetups = sizeof(kSetups) / sizeof(kSetups[0]);
// The configurations run again with deterministic mode off (the teeth).
const size_t kUndetermined[] = {0, 1, 2, 3};

struct Results {
  std::vector<Sha256::Digest> allreduce, reducescatter;
  std::vector<std::vector<uint8_t>> data;  // allreduce results (setup 0 only)
};

bool Floating32or64(concord_dtype_t d) {
  return d == CONCORD_FLOAT32 || d == CONCORD_FLOAT64;
}

Results Run(size_t s, bool deterministic, const std::vector<Tensor>& tensors) {
  const Setup& setup = kSetups[s];
  concord_config_t config;
  concord_config_init(&config);
  config.fusion_threshold_bytes = setup.fusion;
  config.direct_threshold_bytes = setup.direct;
  config.inline_threshold_bytes = setup.inline_bytes;
  config.lanes = setup.lanes;
  config.deterministic = deterministic ? 1 : 0;
  SetPath(setup.path);
  const std::string job = "determinism-" + std::to_string(s) + (deterministic ? "-on" : "-off");
  config.job_id = job.c_str();
  concord_comm_t comm = nullptr;
  Results out;
  if (concord_init_config(&config, &comm) != CONCORD_SUCCESS) {
    CHECKF(false, "init of '%s': %s", setup.what, concord_comm_last_error(nullptr));
    return out;
  }
  const size_t n = tensors.size();
  std::vector<std::vector<uint8_t>> ar(n), rs(n);
  std::vector<std::vector<int64_t>> shapes(n);
  std::vector<size_t> order(2 * n);  // k < n: allreduce k; else reducescatter k - n
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (setup.order == Order::kReversed) std::reverse(order.begin(), order.end());
  if (setup.order == Order::kShuffled) {
    std::shuffle(order.begin(), order.end(), std::mt19937(977 + 31 * g_rank + s));
  }
  std::vector<concord_request_t> requests(order.size(), nullptr);
  std::vector<std::string> names(order.size());
  for (size_t i : order) {
    const size_t k = i % n;
    const Tensor& t = tensors[k];
    shapes[k] = {t.count};
    // fp16 takes float32 and float64 tensors, top-k float32 only and no reducescatter (it is an
    // allgather of sparse shares).
    const bool topk = std::strncmp(setup.compression, "topk", 4) == 0;
    const bool takes = topk ? t.dtype == CONCORD_FLOAT32 : Floating32or64(t.dtype);
    const char* compression = takes ? setup.compression : "none";
    const char* rs_compression = topk ? "none" : compression;
    concord_tensor_t in =
        CpuTensor(const_cast<uint8_t*>(t.input.data()), t.dtype, 1, shapes[k].data());
    names[i] = (i < n ? "ar." : "rs.") + std::to_string(k);
    concord_status_t st;
    if (i < n) {
      ar[k] = k % 2 == 0 ? t.input : std::vector<uint8_t>(t.input.size());
      concord_tensor_t result = CpuTensor(ar[k].data(), t.dtype, 1, shapes[k].data());
      concord_allreduce_opts_t opts;
      concord_allreduce_opts_init(&opts);
      opts.op = t.op;
      opts.compression = compression;
      st = concord_allreduce_async(comm, names[i].c_str(), k % 2 == 0 ? &result : &in, &result,
                                   &opts, nullptr, nullptr, &requests[i]);
    } else {
      int64_t first = 0;
      const int64_t rows = MyRows(t.count, &first);
      rs[k].assign(std::max<size_t>(static_cast<size_t>(rows) * ElementSize(t.dtype), 1), 0);
      concord_tensor_t result = CpuTensor(rs[k].data(), t.dtype, 1, &rows);
      concord_reducescatter_opts_t opts;
      concord_reducescatter_opts_init(&opts);
      opts.op = t.op;
      opts.compression = rs_compression;
      st = concord_reducescatter_async(comm, names[i].c_str(), &in, &result, &opts, nullptr,
                                       nullptr, &requests[i]);
      rs[k].resize(static_cast<size_t>(rows) * ElementSize(t.dtype));
    }
    CHECKF(st == CONCORD_SUCCESS, "'%s': submitting %s: %s", setup.what, names[i].c_str(),
           concord_comm_last_error(comm));
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i] == nullptr) continue;
    const concord_status_t st = concord_wait(requests[i], 120);
    CHECKF(st == CONCORD_SUCCESS, "'%s': %s: %s", setup.what, names[i].c_str(),
           concord_request_error(requests[i]));
    concord_request_free(requests[i]);
  }
  for (size_t k = 0; k < n; ++k) {
    ar[k].resize(static_cast<size_t>(tensors[k].count) * ElementSize(tensors[k].dtype));
    out.allreduce.push_back(Sha256::Of(ar[k].data(), ar[k].size()));
    out.reducescatter.push_back(Sha256::Of(rs[k].data(), rs[k].size()));
  }
  // Every rank's allreduce results are the same: compare the digests of all of them.
  Sha256 all;
  for (const Sha256::Digest& d : out.allreduce) all.Update(d.data(), d.size());
  const Sha256::Digest mine = all.Finish();
  std::vector<uint8_t> gathered(mine.size() * static_cast<size_t>(g_size));
  const int64_t digest_shape = static_cast<int64_t>(mine.size());
  concord_tensor_t d =
      CpuTensor(const_cast<uint8_t*>(mine.data()), CONCORD_UINT8, 1, &digest_shape);
  CHECKF(
      concord_allgather(comm, "digests", &d, gathered.data(), gathered.size()) == CONCORD_SUCCESS,
      "'%s': allgather of the digests: %s", setup.what, concord_comm_last_error(comm));
  for (int r = 0; deterministic && r < g_size; ++r) {
    CHECKF(std::memcmp(gathered.data() + r * mine.size(), mine.data(), mine.size()) == 0,
           "'%s': rank %d's allreduce results differ from this rank's", setup.what, r);
  }
  if (s == 0) out.data = std::move(ar);
  CHECKF(concord_finalize(comm) == CONCORD_SUCCESS, "'%s': finalize", setup.what);
  return out;
}

std::string Describe(const Tensor& t, size_t k) {
  return std::string(mp::DTypeName(t.dtype)) + "[" + std::to_string(t.count) + "] #" +
         std::to_string(k);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t large = 1 << 20;
  bool teeth = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--large") == 0 && i + 1 < argc) large = std::atoll(argv[++i]);
    if (std::strcmp(argv[i], "--teeth") == 0) teeth = true;
  }
  // Held to the end: under MPI, the last communicator to go finalizes MPI for good.
  concord_comm_t world = mp::InitOrExit(&g_rank, &g_size);
  const std::vector<Tensor> tensors = MakeTensors(large);
  std::vector<Results> results;
  for (size_t s = 0; s < kNumSetups; ++s) {
    const double t0 = mp::Now();
    results.push_back(Run(s, true, tensors));
    if (g_rank == 0) {
      std::printf("determinism: '%s': %.2f s\n", kSetups[s].what, mp::Now() - t0);
    }
  }
  // Every configuration agrees with the first of its compression.
  for (size_t s = 1; s < kNumSetups; ++s) {
    size_t first = 0;
    while (std::strcmp(kSetups[first].compression, kSetups[s].compression) != 0) ++first;
    if (first == s || results[s].allreduce.size() != tensors.size()) continue;
    for (size_t k = 0; k < tensors.size(); ++k) {
      CHECKF(results[s].allreduce[k] == results[first].allreduce[k],
             "allreduce of %s: '%s' gives other bits than '%s'", Describe(tensors[k], k).c_str(),
             kSetups[s].what, kSetups[first].what);
      CHECKF(results[s].reducescatter[k] == results[first].reducescatter[k],
             "reducescatter of %s: '%s' gives other bits than '%s'",
             Describe(tensors[k], k).c_str(), kSetups[s].what, kSetups[first].what);
    }
  }
  // The sums are the rank-order left fold, bit for bit.
  for (size_t k = 0; k < tensors.size() && !results[0].data.empty(); ++k) {
    const Tensor& t = tensors[k];
    if (t.op != CONCORD_SUM) continue;
    const std::vector<uint8_t> want = LeftFold(k, t);
    const size_t bytes = static_cast<size_t>(t.count) * ElementSize(t.dtype);
    CHECKF(std::memcmp(results[0].data[k].data(), want.data(), bytes) == 0,
           "allreduce of %s is not the rank-order left fold", Describe(t, k).c_str());
    int64_t first = 0;
    const int64_t rows = MyRows(t.count, &first);
    const Sha256::Digest slice = Sha256::Of(want.data() + first * ElementSize(t.dtype),
                                            static_cast<size_t>(rows) * ElementSize(t.dtype));
    CHECKF(results[0].reducescatter[k] == slice,
           "reducescatter of %s is not the rank-order left fold", Describe(t, k).c_str());
  }
  // The teeth: without deterministic mode, the order shows in the bits.
  if (teeth && g_size >= 3) {
    std::vector<Results> loose;
    for (size_t s : kUndetermined) loose.push_back(Run(s, false, tensors));
    size_t differ = 0;
    for (size_t k = 0; k < tensors.size(); ++k) {
      bool ar = false, rs = false;
      for (const Results& r : loose) {
        if (r.allreduce.size() != tensors.size()) continue;
        ar = ar || r.allreduce[k] != results[0].allreduce[k];
        rs = rs || r.reducescatter[k] != results[0].reducescatter[k];
      }
      differ += ar + rs;
    }
    std::printf(
        "determinism: rank %d: with deterministic mode off, %zu of %zu results differ "
        "from the rank-order fold in some configuration\n",
        g_rank, differ, 2 * tensors.size());
    CHECKF(differ > 0,
           "with deterministic mode off every configuration gave the rank-order bits: these "
           "inputs cannot show a change of summation order");
  }
  CHECKF(concord_finalize(world) == CONCORD_SUCCESS, "finalize");
  if (CheckFailures() == 0) std::printf("determinism: rank %d: PASS\n", g_rank);
  return CheckFailures() == 0 ? 0 : 1;
}
