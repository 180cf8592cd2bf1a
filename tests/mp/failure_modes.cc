// Failure paths across real processes, through the C API only. Run under concordrun:
//
//   mp_failure_modes --mode mismatch      ranks submit one name with different dtype / shape /
//                                         reduce op / root / op / scaling / allgather trailing
//                                         dims (also after the name was cached): every rank's
//                                         request fails with CONCORD_ERR_MISMATCH, the error text
//                                         names the tensor, the field and the ranks; later
//                                         operations (the same names, corrected) still work.
//   mp_failure_modes --mode kill --victim V [--mid-bytes B] [--mid-ops K,...]
//                                         rank V SIGKILLs itself while the others have every kind
//                                         of operation in flight (failure_kill.h says what is
//                                         checked).
//   --hosts-interleaved N                 (any mode) the ranks pretend to run on N hosts, rank r
//                                         on host r % N (CONCORD_HOST_ID), so that the
//                                         hierarchical backend runs (CONCORD_HIERARCHICAL).
//   mp_failure_modes --mode auth          rank 1 first calls concord_init with a wrong
//                                         CONCORD_TOKEN: CONCORD_ERR_AUTH with a clear message,
//                                         quickly; then with the right one it joins and an
//                                         allreduce succeeds on every rank.
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "failure_kill.h"
#include "mp_common.h"
#include "tests/common/check.h"
#include "tests/common/tensors.h"

namespace {

int g_rank = 0, g_size = 1;

// "rank 1" or "ranks 0, 2": how the coordinator lists ranks in its messages.
std::string RankList(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// A correct float32 sum of `n` elements named `name`; checks the result.
void GoodAllreduce(concord_comm_t comm, const std::string& name, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(g_rank + i % 3);
  int64_t shape[1] = {n};
  concord_tensor_t t = CpuTensor(x.data(), CONCORD_FLOAT32, 1, shape);
  const concord_status_t s = concord_allreduce(comm, name.c_str(), &t, nullptr, nullptr);
  CHECKF(s == CONCORD_SUCCESS, "allreduce '%s': %s: %s", name.c_str(), concord_status_string(s),
         concord_comm_last_error(comm));
  if (s != CONCORD_SUCCESS) return;
  const float ranks_sum = static_cast<float>(g_size * (g_size - 1) / 2);
  for (int64_t i = 0; i < n; ++i) {
    const float want = ranks_sum + static_cast<float>(g_size * (i % 3));
    if (x[i] != want) {
      CHECKF(x[i] == want, "allreduce '%s' [%lld]: got %g want %g", name.c_str(),
             static_cast<long long>(i), x[i], want);
      return;
    }
  }
}

// ---- mismatch ----

struct MismatchCase {
  const char* field;  // the words the error must contain
  const char* what;   // a short name for the output
  bool cached_first;  // run a correct version twice first, so the name is in the response cache
};

// Submits this rank's (possibly odd) version of `name` for case k. Odd ranks differ.
concord_status_t SubmitVariant(concord_comm_t comm, int k, const std::string& name, bool odd,
                               std::vector<unsigned char>* buf, concord_request_t* req) {
  static int64_t shape_a[2] = {6, 2}, shape_b[2] = {4, 3}, shape_c[2] = {6, 3};
  buf->assign(64 * 8, 0);
  concord_tensor_t t = CpuTensor(buf->data(), CONCORD_FLOAT32, 1, shape_a);
  concord_allreduce_opts_t o;
  concord_allreduce_opts_init(&o);
  switch (k) {
    case 0:  // dtype
      if (odd) t.dtype = CONCORD_INT32;
      return concord_allreduce_async(comm, name.c_str(), &t, nullptr, &o, nullptr, nullptr, req);
    case 1:  // shape: 6 vs 4 elements
      if (odd) t.shape = shape_b;
      return concord_allreduce_async(comm, name.c_str(), &t, nullptr, &o, nullptr, nullptr, req);
    case 2:  // reduce op
      if (odd) o.op = CONCORD_MAX;
      return concord_allreduce_async(comm, name.c_str(), &t, nullptr, &o, nullptr, nullptr, req);
    case 3:  // broadcast root
      return concord_broadcast_async(comm, name.c_str(), &t, nullptr, odd ? g_size - 1 : 0, nullptr,
                                     nullptr, req);
    case 4:  // the operation: allreduce vs broadcast
      if (odd)
        return concord_broadcast_async(comm, name.c_str(), &t, nullptr, 0, nullptr, nullptr, req);
      return concord_allreduce_async(comm, name.c_str(), &t, nullptr, &o, nullptr, nullptr, req);
    case 5:  // prescale
      if (odd) o.prescale = 2.0;
      return concord_allreduce_async(comm, name.c_str(), &t, nullptr, &o, nullptr, nullptr, req);
    case 6:  // allgather: the dims after the first differ ([6,2] vs [6,3])
      t.ndim = 2;
      if (odd) t.shape = shape_c;
      return concord_allgather_async(comm, name.c_str(), &t, nullptr, 0, nullptr, nullptr, req);
    case 7:  // dtype, after the name was cached with the even ranks' version
      if (odd) t.dtype = CONCORD_FLOAT64;
      return concord_allreduce_async(comm, name.c_str(), &t, nullptr, &o, nullptr, nullptr, req);
    case 8:  // the operation: allreduce vs allgather, after caching
      if (odd) {
        return concord_allgather_async(comm, name.c_str(), &t, nullptr, 0, nullptr, nullptr, req);
      }
      return concord_allreduce_async(comm, name.c_str(), &t, nullptr, &o, nullptr, nullptr, req);
  }
  return CONCORD_ERR_INTERNAL;
}

const MismatchCase kMismatch[] = {
    {"dtype", "dtype", false},
    {"shape", "shape", false},
    {"reduce op", "reduce-op", false},
    {"root", "root", false},
    {"operation", "op", false},
    {"prescale", "prescale", false},
    {"shape after the first dimension", "allgather-dims", false},
    {"dtype", "dtype-after-cache", true},
    {"operation", "op-after-cache", true},
};

int Mismatch() {
  concord_comm_t comm = mp::InitOrExit(&g_rank, &g_size);
  if (g_size < 2) {
    std::fprintf(stderr, "mismatch mode needs at least 2 ranks\n");
    return 2;
  }
  std::vector<int> even, odd;
  for (int r = 0; r < g_size; ++r) (r % 2 ? odd : even).push_back(r);
  const int n = static_cast<int>(sizeof(kMismatch) / sizeof(kMismatch[0]));
  for (int k = 0; k < n; ++k) {
    const MismatchCase& mc = kMismatch[k];
    const std::string name = std::string("mismatch.") + mc.what;
    std::vector<unsigned char> buf;
    concord_request_t req = nullptr;
    if (mc.cached_first) {
      for (int step = 0; step < 2; ++step) {  // everyone agrees: the response is cached
        concord_status_t s = SubmitVariant(comm, k, name, false, &buf, &req);
        CHECKF(s == CONCORD_SUCCESS, "%s: enqueue: %s", name.c_str(),
               concord_comm_last_error(comm));
        if (s == CONCORD_SUCCESS) {
          s = concord_wait(req, 60);
          CHECKF(s == CONCORD_SUCCESS, "%s (agreeing step %d): %s", name.c_str(), step,
                 concord_request_error(req));
          concord_request_free(req);
        }
      }
    }
    const double t0 = mp::Now();
    concord_status_t s = SubmitVariant(comm, k, name, g_rank % 2 == 1, &buf, &req);
    CHECKF(s == CONCORD_SUCCESS, "%s: enqueue: %s", name.c_str(), concord_comm_last_error(comm));
    if (s != CONCORD_SUCCESS) continue;
    s = concord_wait(req, 60);
    const std::string err =
        concord_test(req) == CONCORD_IN_PROGRESS ? "" : concord_request_error(req);
    CHECKF(s == CONCORD_ERR_MISMATCH, "%s: status %s (%s)", name.c_str(), concord_status_string(s),
           err.c_str());
    CHECKF(mp::Contains(err, "'" + name + "'"), "%s: error does not name the tensor: '%s'",
           name.c_str(), err.c_str());
    CHECKF(mp::Contains(err, mc.field), "%s: error does not name the field '%s': '%s'",
           name.c_str(), mc.field, err.c_str());
    CHECKF(mp::Contains(err, RankList(even)) && mp::Contains(err, RankList(odd)),
           "%s: error does not name the ranks (%s / %s): '%s'", name.c_str(),
           RankList(even).c_str(), RankList(odd).c_str(), err.c_str());
    if (g_rank == 0) {
      std::printf("mismatch %-18s -> %s in %.3f s: %s\n", mc.what, concord_status_string(s),
                  mp::Now() - t0, err.c_str());
    }
    concord_request_free(req);
    // The same name, now agreeing, and a fresh name: both work.
    s = SubmitVariant(comm, k, name, false, &buf, &req);
    CHECKF(s == CONCORD_SUCCESS, "%s again: enqueue: %s", name.c_str(),
           concord_comm_last_error(comm));
    if (s == CONCORD_SUCCESS) {
      s = concord_wait(req, 60);
      CHECKF(s == CONCORD_SUCCESS, "%s again: %s: %s", name.c_str(), concord_status_string(s),
             concord_request_error(req));
      concord_request_free(req);
    }
    GoodAllreduce(comm, "after." + name, 5 + k);
  }
  // Several mismatches in one round, next to agreeing tensors.
  {
    std::vector<std::vector<unsigned char>> bufs(4);
    concord_request_t reqs[4];
    concord_status_t ss[4];
    ss[0] = SubmitVariant(comm, 0, "multi.a", g_rank % 2 == 1, &bufs[0], &reqs[0]);
    ss[1] = SubmitVariant(comm, 1, "multi.b", false, &bufs[1], &reqs[1]);
    ss[2] = SubmitVariant(comm, 2, "multi.c", g_rank % 2 == 1, &bufs[2], &reqs[2]);
    ss[3] = SubmitVariant(comm, 3, "multi.d", false, &bufs[3], &reqs[3]);
    const concord_status_t want[4] = {CONCORD_ERR_MISMATCH, CONCORD_SUCCESS, CONCORD_ERR_MISMATCH,
                                      CONCORD_SUCCESS};
    for (int i = 0; i < 4; ++i) {
      CHECKF(ss[i] == CONCORD_SUCCESS, "multi %d: enqueue: %s", i, concord_comm_last_error(comm));
      if (ss[i] != CONCORD_SUCCESS) continue;
      const concord_status_t s = concord_wait(reqs[i], 60);
      CHECKF(s == want[i], "multi %d: %s, want %s: %s", i, concord_status_string(s),
             concord_status_string(want[i]), concord_request_error(reqs[i]));
      concord_request_free(reqs[i]);
    }
  }
  GoodAllreduce(comm, "final", 1000);
  CHECKF(concord_barrier(comm) == CONCORD_SUCCESS, "barrier: %s", concord_comm_last_error(comm));
  const concord_status_t s = concord_finalize(comm);
  CHECKF(s == CONCORD_SUCCESS, "finalize: %s", concord_status_string(s));
  std::printf("failure_modes mismatch: rank %d of %d: %d failures: %s\n", g_rank, g_size,
              CheckFailures(), CheckFailures() ? "FAIL" : "PASS");
  return CheckFailures() ? 1 : 0;
}

// ---- auth ----

int Auth() {
  const char* token = std::getenv("CONCORD_TOKEN");
  const char* rank_env = std::getenv("CONCORD_RANK");
  if (token == nullptr || rank_env == nullptr) {
    std::fprintf(stderr, "auth mode runs under concordrun\n");
    return 2;
  }
  g_rank = std::atoi(rank_env);
  CheckSetContext("rank %d", g_rank);
  if (g_rank == 1) {
    const std::string good = token;
    std::string bad = good;
    bad[0] = bad[0] == 'x' ? 'y' : 'x';
    setenv("CONCORD_TOKEN", bad.c_str(), 1);
    concord_comm_t comm = nullptr;
    const double t0 = mp::Now();
    const concord_status_t s = concord_init(&comm);
    const double took = mp::Now() - t0;
    const std::string msg = concord_comm_last_error(nullptr);
    CHECKF(s == CONCORD_ERR_AUTH, "init with a wrong token: %s (%s)", concord_status_string(s),
           msg.c_str());
    CHECKF(comm == nullptr, "init failed but wrote a communicator");
    CHECKF(mp::Contains(msg, "token") || mp::Contains(msg, "secret") || mp::Contains(msg, "auth"),
           "the message does not say what was wrong: '%s'", msg.c_str());
    CHECKF(took < 10.0, "refusing a wrong token took %.2f s", took);
    std::printf("AUTH_REFUSED rank 1 in %.3f s: %s: %s\n", took, concord_status_string(s),
                msg.c_str());
    if (s == CONCORD_SUCCESS) concord_finalize(comm);
    setenv("CONCORD_TOKEN", good.c_str(), 1);
  }
  concord_comm_t comm = mp::InitOrExit(&g_rank, &g_size);
  GoodAllreduce(comm, "after-auth", 100);
  const concord_status_t s = concord_finalize(comm);
  CHECKF(s == CONCORD_SUCCESS, "finalize: %s", concord_status_string(s));
  std::printf("failure_modes auth: rank %d: %d failures: %s\n", g_rank, CheckFailures(),
              CheckFailures() ? "FAIL" : "PASS");
  return CheckFailures() ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode;
  int victim = 1;
  int64_t mid_bytes = 16 << 20;
  std::vector<std::string> mid_ops(kMidOpKinds.begin(), kMidOpKinds.end() - 1);  // no allreduce
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mode" && i + 1 < argc) {
      mode = argv[++i];
    } else if (a == "--victim" && i + 1 < argc) {
      victim = std::atoi(argv[++i]);
    } else if (a == "--mid-bytes" && i + 1 < argc) {
      mid_bytes = std::atoll(argv[++i]);
    } else if (a == "--mid-ops" && i + 1 < argc) {
      mid_ops.clear();
      std::stringstream list(argv[++i]);
      for (std::string kind; std::getline(list, kind, ',');) {
        if (std::find(kMidOpKinds.begin(), kMidOpKinds.end(), kind) == kMidOpKinds.end()) {
          mode = "?";
        }
        mid_ops.push_back(kind);
      }
    } else if (a == "--hosts-interleaved" && i + 1 < argc) {
      const int hosts = std::atoi(argv[++i]);
      const char* r = std::getenv("CONCORD_RANK");
      if (hosts < 1 || r == nullptr) {
        std::fprintf(stderr, "--hosts-interleaved needs N >= 1 and CONCORD_RANK (concordrun)\n");
        return 2;
      }
      setenv("CONCORD_HOST_ID",
             ("failure-modes-host-" + std::to_string(std::atoi(r) % hosts)).c_str(), 1);
    } else {
      mode = "?";
    }
  }
  if (mode == "mismatch") return Mismatch();
  if (mode == "kill") return Kill(victim, mid_bytes, mid_ops);
  if (mode == "auth") return Auth();
  std::string kinds;
  for (const std::string& kind : kMidOpKinds) kinds += (kinds.empty() ? "" : ",") + kind;
  std::fprintf(stderr,
               "usage: %s --mode mismatch|kill [--victim R] [--mid-bytes B] [--mid-ops %s]|auth "
               "[--hosts-interleaved N]\n",
               argv[0], kinds.c_str());
  return 2;
}
