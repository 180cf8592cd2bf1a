// concord_join under a launcher: uneven epochs. Rank r runs 3 + 2r steps, then joins; each step
// runs, on the ranks still stepping, an allreduce of every dtype and reduction (one group of
// small ones, fused; some compressed; some scaled), an allgather and a broadcast from the last
// rank, a barrier, and a reduce and a gather to the last rank. Every result is checked against the
// ranks still stepping (a joined rank contributes the identity, an average divides by the others,
// a gather has no rows of it), join returns the last rank to join, a broadcast, reduce or gather
// to a joined root fails naming it, so does a split while a rank has joined (the next split, after
// the join, works), a second epoch joins afresh, and a third
// join that the last rank skips (it finalizes) fails on the others, naming it.
//   mp_join            (then grep "join: rank .* PASS")
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/common/tensors.h"
#include "tests/mp/mp_common.h"

using concord::harness::LoadElement;
using concord::harness::StoreElement;

namespace {

int g_rank = 0, g_size = 1;
concord_comm_t g_comm = nullptr;

int StepsOf(int rank) {
  return 3 + 2 * rank;
}

// The ranks still stepping at `step`.
std::vector<int> Stepping(int step) {
  std::vector<int> ranks;
  for (int r = 0; r < g_size; ++r) {
    if (step < StepsOf(r)) ranks.push_back(r);
  }
  return ranks;
}

// Rank r's value at element i of step s (small, so products and sums stay exact).
double Value(int r, int s, int i) {
  return 1 + (r + s + i) % 3;
}

using mp::kDTypes;
using mp::kOps;

bool IsFloat(concord_dtype_t t) {
  return t == CONCORD_FLOAT16 || t == CONCORD_BFLOAT16 || t == CONCORD_FLOAT32 ||
         t == CONCORD_FLOAT64;
}

double Expected(concord_reduce_op_t op, concord_dtype_t dt, int s, int i, double pre, double post) {
  const std::vector<int> ranks = Stepping(s);
  double acc = op == CONCORD_PRODUCT ? 1
               : op == CONCORD_MIN   ? 1e300
               : op == CONCORD_MAX   ? -1e300
                                     : 0;
  for (int r : ranks) {
    const double v = Value(r, s, i) * pre;
    if (op == CONCORD_SUM || op == CONCORD_AVERAGE) acc += v;
    if (op == CONCORD_PRODUCT) acc *= v;
    if (op == CONCORD_MIN) acc = std::min(acc, v);
    if (op == CONCORD_MAX) acc = std::max(acc, v);
  }
  if (op == CONCORD_AVERAGE) {
    acc = IsFloat(dt) ? acc / static_cast<double>(ranks.size())
                      : std::trunc(acc / static_cast<double>(ranks.size()));
  }
  return acc * post;
}

struct Pending {
  concord_request_t req = nullptr;
  std::vector<unsigned char> data;
  concord_reduce_op_t op = CONCORD_SUM;
  concord_dtype_t dt = CONCORD_FLOAT32;
  double pre = 1, post = 1;
  std::string name;
};

const int64_t kN = 5;

void Allreduces(int step) {
  std::vector<Pending> all;
  CHECKF(concord_group_start(g_comm) == CONCORD_SUCCESS, "group_start");
  for (concord_dtype_t dt : kDTypes) {
    for (concord_reduce_op_t op : kOps) {
      // Floating types also scaled: the joined ranks' stand-in is the identity before the
      // prescale (a prescale of 0 makes every contribution 0; a negative one swaps min and max).
      static const char* const kScalings[] = {"", ".scaled", ".prescale0", ".negative"};
      static const double kPre[] = {1, 2, 0, -1}, kPost[] = {1, 0.5, 1, 2};
      for (int scaled = 0; scaled < (IsFloat(dt) ? 4 : 1); ++scaled) {
        Pending p;
        p.op = op;
        p.dt = dt;
        p.pre = kPre[scaled];
        p.post = kPost[scaled];
        p.name =
            std::string("ar.") + mp::DTypeName(dt) + "." + std::to_string(op) + kScalings[scaled];
        p.data.assign(kN * ElementSize(dt), 0);
        for (int i = 0; i < kN; ++i) StoreElement(dt, p.data.data(), i, Value(g_rank, step, i));
        all.push_back(std::move(p));
      }
    }
  }
  for (Pending& p : all) {
    int64_t shape[1] = {kN};
    concord_tensor_t t = CpuTensor(p.data.data(), p.dt, 1, shape);
    concord_allreduce_opts_t o;
    concord_allreduce_opts_init(&o);
    o.op = p.op;
    o.prescale = p.pre;
    o.postscale = p.post;
    CHECKF(concord_allreduce_async(g_comm, p.name.c_str(), &t, nullptr, &o, nullptr, nullptr,
                                   &p.req) == CONCORD_SUCCESS,
           "enqueue %s: %s", p.name.c_str(), concord_comm_last_error(g_comm));
  }
  CHECKF(concord_group_end(g_comm) == CONCORD_SUCCESS, "group_end: %s",
         concord_comm_last_error(g_comm));
  for (Pending& p : all) {
    const concord_status_t s = concord_wait(p.req, -1);
    CHECKF(s == CONCORD_SUCCESS, "step %d %s: %s", step, p.name.c_str(),
           concord_request_error(p.req));
    concord_request_free(p.req);
    for (int i = 0; i < kN && s == CONCORD_SUCCESS; ++i) {
      const double got = LoadElement(p.dt, p.data.data(), i);
      const double want = Expected(p.op, p.dt, step, i, p.pre, p.post);
      CHECKF(mp::Close(got, want, p.dt), "step %d %s[%d]: %g, want %g (%zu ranks stepping)", step,
             p.name.c_str(), i, got, want, Stepping(step).size());
    }
  }
}

void Compressed(int step) {
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(Value(g_rank, step, 0));
  int64_t shape[1] = {1000};
  concord_tensor_t t = CpuTensor(v.data(), CONCORD_FLOAT32, 1, shape);
  concord_allreduce_opts_t o;
  concord_allreduce_opts_init(&o);
  o.op = CONCORD_AVERAGE;
  o.compression = "fp16";
  CHECKF(concord_allreduce(g_comm, "fp16.average", &t, nullptr, &o) == CONCORD_SUCCESS,
         "fp16 average: %s", concord_comm_last_error(g_comm));
  const double want = Expected(CONCORD_AVERAGE, CONCORD_FLOAT32, step, 0, 1, 1);
  CHECKF(std::fabs(v[999] - want) < 1e-2, "step %d fp16 average %g, want %g", step, v[999], want);
  // Top-k keeps 4 of 8: elements 0-3 (1000 + Value) are sent every step, 4-7 (1 each step) stay
  // behind in each rank's residual. A joined rank's stand-in sends zeros, not its residual.
  std::vector<float> g(8);
  for (int i = 0; i < 8; ++i) g[i] = i < 4 ? 1000 + static_cast<float>(Value(g_rank, step, 0)) : 1;
  int64_t gshape[1] = {8};
  concord_tensor_t gt = CpuTensor(g.data(), CONCORD_FLOAT32, 1, gshape);
  o.compression = "topk:density=0.5,method=exact";
  CHECKF(concord_allreduce(g_comm, "topk.average", &gt, nullptr, &o) == CONCORD_SUCCESS,
         "topk average: %s", concord_comm_last_error(g_comm));
  for (int i = 0; i < 8; ++i) {
    const double sent = i < 4 ? 1000 + want : 0;
    CHECKF(std::fabs(g[i] - sent) < 1e-2, "step %d topk average [%d] %g, want %g", step, i, g[i],
           sent);
  }
}

// Large enough to skip fusion (CONCORD_DIRECT_THRESHOLD): in place, split over the lanes.
void Direct(int step) {
  for (concord_reduce_op_t op : {CONCORD_AVERAGE, CONCORD_MAX}) {
    std::vector<double> v(100000);
    for (size_t i = 0; i < v.size(); ++i) v[i] = Value(g_rank, step, static_cast<int>(i % 3));
    int64_t shape[1] = {static_cast<int64_t>(v.size())};
    concord_tensor_t t = CpuTensor(v.data(), CONCORD_FLOAT64, 1, shape);
    concord_allreduce_opts_t o;
    concord_allreduce_opts_init(&o);
    o.op = op;
    const std::string name = "direct." + std::to_string(op);
    CHECKF(concord_allreduce(g_comm, name.c_str(), &t, nullptr, &o) == CONCORD_SUCCESS, "%s: %s",
           name.c_str(), concord_comm_last_error(g_comm));
    for (size_t i : {size_t{0}, size_t{1}, v.size() - 1}) {
      const double want = Expected(op, CONCORD_FLOAT64, step, static_cast<int>(i % 3), 1, 1);
      CHECKF(mp::Close(v[i], want, CONCORD_FLOAT64), "step %d %s[%zu]: %g, want %g", step,
             name.c_str(), i, v[i], want);
    }
  }
}

void GatherAndBroadcast(int step) {
  // Allgather: rank r gives r + 1 rows of its rank; joined ranks give none.
  std::vector<int32_t> mine(static_cast<size_t>(g_rank + 1), g_rank);
  int64_t shape[1] = {g_rank + 1};
  concord_tensor_t t = CpuTensor(mine.data(), CONCORD_INT32, 1, shape);
  std::vector<int32_t> out(64, -1);
  CHECKF(concord_allgather(g_comm, "gather", &t, out.data(), out.size() * 4) == CONCORD_SUCCESS,
         "allgather: %s", concord_comm_last_error(g_comm));
  size_t k = 0;
  for (int r : Stepping(step)) {
    for (int j = 0; j <= r; ++j, ++k) {
      CHECKF(out[k] == r, "step %d allgather row %zu: %d, want %d", step, k, out[k], r);
    }
  }
  CHECKF(out[k] == -1, "step %d allgather wrote %zu+ rows, want %zu", step, k + 1, k);
  // Broadcast from the last rank, which joins last.
  std::vector<double> b(9, g_rank == g_size - 1 ? step + 0.25 : -1);
  int64_t bshape[1] = {9};
  concord_tensor_t bt = CpuTensor(b.data(), CONCORD_FLOAT64, 1, bshape);
  CHECKF(concord_broadcast(g_comm, "bcast", &bt, nullptr, g_size - 1) == CONCORD_SUCCESS,
         "broadcast: %s", concord_comm_last_error(g_comm));
  CHECKF(b[8] == step + 0.25, "step %d broadcast %g", step, b[8]);
  // From the first rank, which joined first: refused once it has.
  if (g_size > 1 && step >= StepsOf(0)) {
    const concord_status_t s = concord_broadcast(g_comm, "bcast.joined", &bt, nullptr, 0);
    const std::string err = concord_comm_last_error(g_comm);
    CHECKF(s == CONCORD_ERR_INVALID_ARGUMENT && mp::Contains(err, "has joined"),
           "broadcast from joined rank 0: %s: %s", concord_status_string(s), err.c_str());
  }
  CHECKF(concord_barrier(g_comm) == CONCORD_SUCCESS, "barrier: %s",
         concord_comm_last_error(g_comm));
}

// Reduce and gather to the last rank: joined ranks contribute the identity and no rows. To the
// first rank once it joined: refused on the ranks still stepping, naming it.
void RootedOps(int step) {
  const int root = g_size - 1;
  // Reduce: rank r gives r + 1 in 5 float64 elements (fused) and 40000 int64 ones (320 KB, above
  // the direct threshold: alone, the backend's reduce); the root gets the sum over the ranks
  // still stepping.
  for (int64_t count : {int64_t{5}, int64_t{40000}}) {
    const concord_dtype_t dt = count == 5 ? CONCORD_FLOAT64 : CONCORD_INT64;
    std::vector<double> in(static_cast<size_t>(count));
    std::vector<int64_t> in64(static_cast<size_t>(count), g_rank + 1);
    for (double& x : in) x = g_rank + 1;
    void* data = dt == CONCORD_FLOAT64 ? static_cast<void*>(in.data()) : in64.data();
    std::vector<uint8_t> out(static_cast<size_t>(count) * 8, 0xee);
    int64_t shape[1] = {count};
    concord_tensor_t t = CpuTensor(data, dt, 1, shape);
    concord_tensor_t o = CpuTensor(out.data(), dt, 1, shape);
    const std::string name = "reduce." + std::to_string(count);
    CHECKF(concord_reduce(g_comm, name.c_str(), &t, g_rank == root ? &o : nullptr, root, nullptr) ==
               CONCORD_SUCCESS,
           "%s: %s", name.c_str(), concord_comm_last_error(g_comm));
    if (g_rank == root) {
      double want = 0;
      for (int r : Stepping(step)) want += r + 1;
      for (int64_t i = 0; i < count; ++i) {
        const double got = LoadElement(dt, out.data(), static_cast<size_t>(i));
        CHECKF(got == want, "step %d %s[%lld]: %g, want %g", step, name.c_str(),
               static_cast<long long>(i), got, want);
      }
    }
  }
  // Gather: rank r gives r + 1 rows of its rank; the root gets the stepping ranks' rows.
  std::vector<int32_t> mine(static_cast<size_t>(g_rank + 1), g_rank);
  int64_t shape[1] = {g_rank + 1};
  concord_tensor_t t = CpuTensor(mine.data(), CONCORD_INT32, 1, shape);
  std::vector<int32_t> out(64, -1);
  CHECKF(concord_gather(g_comm, "gather.root", &t, g_rank == root ? out.data() : nullptr,
                        g_rank == root ? out.size() * 4 : 0, root) == CONCORD_SUCCESS,
         "gather: %s", concord_comm_last_error(g_comm));
  if (g_rank == root) {
    size_t k = 0;
    for (int r : Stepping(step)) {
      for (int j = 0; j <= r; ++j, ++k) {
        CHECKF(out[k] == r, "step %d gather row %zu: %d, want %d", step, k, out[k], r);
      }
    }
    CHECKF(out[k] == -1, "step %d gather wrote %zu+ rows, want %zu", step, k + 1, k);
  }
  if (g_size > 1 && step >= StepsOf(0)) {
    int32_t one = 1;
    int64_t one_shape[1] = {1};
    concord_tensor_t same = CpuTensor(&one, CONCORD_INT32, 1, one_shape);
    concord_status_t s = concord_reduce(g_comm, "reduce.joined", &same, nullptr, 0, nullptr);
    std::string err = concord_comm_last_error(g_comm);
    CHECKF(s == CONCORD_ERR_INVALID_ARGUMENT && mp::Contains(err, "rank 0, has joined"),
           "reduce to joined rank 0: %s: %s", concord_status_string(s), err.c_str());
    s = concord_gather(g_comm, "gather.joined", &t, nullptr, 0, 0);
    err = concord_comm_last_error(g_comm);
    CHECKF(s == CONCORD_ERR_INVALID_ARGUMENT && mp::Contains(err, "rank 0, has joined"),
           "gather to joined rank 0: %s: %s", concord_status_string(s), err.c_str());
    // A split needs every rank: refused while one has joined (and the next split still matches:
    // SplitAfterJoin).
    concord_comm_t sub = nullptr;
    s = concord_comm_split(g_comm, 0, g_rank, &sub);
    err = concord_comm_last_error(g_comm);
    CHECKF(s == CONCORD_ERR_INVALID_ARGUMENT && sub == nullptr &&
               mp::Contains(err, "joined (concord_join): a split of the communicator"),
           "split while rank 0 has joined: %s: %s", concord_status_string(s), err.c_str());
  }
}

// Once every rank has joined: a split over all ranks (keys reversed) works, whatever splits the
// ranks still stepping had refused while others had joined.
void SplitAfterJoin() {
  concord_comm_t sub = nullptr;
  concord_status_t s = concord_comm_split(g_comm, 7, g_size - 1 - g_rank, &sub);
  CHECKF(s == CONCORD_SUCCESS && sub != nullptr, "split after join: %s: %s",
         concord_status_string(s), concord_comm_last_error(g_comm));
  if (s != CONCORD_SUCCESS) return;
  int sub_rank = -1;
  concord_comm_rank(sub, &sub_rank);
  CHECKF(sub_rank == g_size - 1 - g_rank, "split after join: rank %d, want %d", sub_rank,
         g_size - 1 - g_rank);
  float x = static_cast<float>(g_rank);
  int64_t shape[1] = {1};
  concord_tensor_t t = CpuTensor(&x, CONCORD_FLOAT32, 1, shape);
  CHECKF(concord_allreduce(sub, "after.join", &t, nullptr, nullptr) == CONCORD_SUCCESS &&
             x == static_cast<float>(g_size * (g_size - 1) / 2),
         "allreduce on the split after join: %g: %s", x, concord_comm_last_error(sub));
  CHECKF(concord_finalize(sub) == CONCORD_SUCCESS, "finalize the split after join");
}

}  // namespace

int main() {
  g_comm = mp::InitOrExit(&g_rank, &g_size);
  const double t0 = mp::Now();
  for (int epoch = 0; epoch < 2; ++epoch) {
    const int steps = epoch == 0 ? StepsOf(g_rank) : 2;
    for (int step = 0; step < steps; ++step) {
      if (epoch == 0) {
        Allreduces(step);
        Compressed(step);
        Direct(step);
        GatherAndBroadcast(step);
        RootedOps(step);
      } else {
        float x = 1;
        int64_t shape[1] = {1};
        concord_tensor_t t = CpuTensor(&x, CONCORD_FLOAT32, 1, shape);
        CHECKF(concord_allreduce(g_comm, "epoch2", &t, nullptr, nullptr) == CONCORD_SUCCESS &&
                   x == g_size,
               "epoch 2 step %d: %g", step, x);
      }
      concord_end_step(g_comm);
    }
    int last = -1;
    const concord_status_t s = concord_join(g_comm, &last);
    CHECKF(s == CONCORD_SUCCESS, "join: %s", concord_comm_last_error(g_comm));
    if (epoch == 0) CHECKF(last == g_size - 1, "join returned %d, want %d", last, g_size - 1);
    if (epoch == 0) SplitAfterJoin();
    if (epoch == 1) CHECKF(last >= 0 && last < g_size, "second join returned %d", last);
  }
  // A rank that finalizes instead of joining ends the others' join with an error naming it.
  if (g_size > 1 && g_rank == g_size - 1) {
    concord_finalize(g_comm);  // may report the others' join it left behind
  } else if (g_size > 1) {
    int last = -1;
    const concord_status_t s = concord_join(g_comm, &last);
    const std::string err = concord_comm_last_error(g_comm);
    CHECKF(s == CONCORD_ERR_PEER_FAILURE && mp::Contains(err, std::to_string(g_size - 1) + " ha") &&
               mp::Contains(err, "finalized (concord_finalize) without submitting it"),
           "join without rank %d: %s: %s", g_size - 1, concord_status_string(s), err.c_str());
    // The others' joins may fail after this rank has finalized: that is reported (MISMATCH).
    const concord_status_t f = concord_finalize(g_comm);
    CHECKF(f == CONCORD_SUCCESS || f == CONCORD_ERR_MISMATCH, "finalize: %s",
           concord_status_string(f));
  } else {
    CHECKF(concord_finalize(g_comm) == CONCORD_SUCCESS, "finalize");
  }
  std::printf("join: rank %d of %d: %d failures, %.2f s: %s\n", g_rank, g_size, CheckFailures(),
              mp::Now() - t0, CheckFailures() == 0 ? "PASS" : "FAIL");
  return CheckFailures() == 0 ? 0 : 1;
}
