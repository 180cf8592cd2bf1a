// Faults of the application's own making, across real processes, through the C API only: a rank
// that skips a tensor, finalizes early, or stops submitting. The culprit is the last rank. Run
// under concordrun:
//
//   mp_lifecycle_faults --mode skip      every rank runs 6 steps of allreduces 'a', 'x', 'y', 'b'
//                                        (values that identify rank and step) and marks each
//                                        step's end (concord_end_step). The culprit skips 'y' in
//                                        step 0 (a full request) and 'x' in step 3 (a cached
//                                        one). The others' submissions of those steps fail with
//                                        MISMATCH naming the tensor and the steps, at once; every
//                                        other result, the culprit's next steps included, is the
//                                        exact sum of that step's values: never a mixed sum.
//   mp_lifecycle_faults --mode finalize  after 2 good steps the culprit finalizes; the others'
//                                        next allreduce fails with PEER_FAILURE naming it within
//                                        a second (not at a deadline), and so does a later one;
//                                        then they finalize, and every finalize (the culprit's
//                                        too) returns SUCCESS. With --linger S the others wait S
//                                        seconds before finalizing: the culprit's finalize then
//                                        returns TIMEOUT at its deadline, saying so.
//   mp_lifecycle_faults --mode stall     (run with CONCORD_STALL_WARNING_S=1,
//                                        CONCORD_STALL_SHUTDOWN_S=3 and CONCORD_TIMEOUT_S=1.5)
//                                        after one good round of 'x.reducescatter',
//                                        'x.alltoall', 'x.allgather' and 'x.broadcast' (cached
//                                        from then on; the allreduce 'x' is not), the culprit
//                                        stops submitting for 5 s while the others wait for 'x',
//                                        then (0.1 s later) for those four, and for a recv from
//                                        it: the recv fails on its own after 1.5 s with TIMEOUT
//                                        naming the culprit and the tag; the job fails on every
//                                        rank with TIMEOUT naming 'x', the culprit and its last
//                                        tensor, 3-5 s after 'x' was submitted, and every request
//                                        (the culprit's late ones too) gets that error (the
//                                        warnings, one per tensor on every rank, are checked by
//                                        the test's output expectations). Under mpirun the
//                                        culprit is torn down before it wakes (the others leave
//                                        MPI unfinalized after a failure: mpirun ends the job).
// Each rank prints "lifecycle <mode>: rank R of N: PASS" (or FAIL with the checks that failed).
#include <unistd.h>

#include <string>
#include <vector>

#include "mp_common.h"
#include "tests/common/check.h"
#include "tests/common/tensors.h"

namespace {

int g_rank = 0, g_size = 1;

int Report(const char* mode) {
  std::printf("lifecycle %s: rank %d of %d: %s\n", mode, g_rank, g_size,
              CheckFailures() ? "FAIL" : "PASS");
  std::fflush(stdout);
  return CheckFailures() ? 1 : 0;
}

// One named float32 allreduce in flight: its buffer, and what every element must become.
struct Op {
  std::string name;
  std::vector<float> data;
  concord_request_t req = nullptr;
};

// The value rank r gives tensor k in step s: the sum over ranks identifies the step.
float Value(int k, int step, int rank) {
  return static_cast<float>(1000 * k + 10 * step + rank);
}

float Sum(int k, int step) {
  float sum = 0;
  for (int r = 0; r < g_size; ++r) sum += Value(k, step, r);
  return sum;
}

void Submit(concord_comm_t comm, Op& op, int k, int step) {
  op.data.assign(7, Value(k, step, g_rank));
  int64_t shape[1] = {7};
  concord_tensor_t t = CpuTensor(op.data.data(), CONCORD_FLOAT32, 1, shape);
  const concord_status_t s = concord_allreduce_async(comm, op.name.c_str(), &t, nullptr, nullptr,
                                                     nullptr, nullptr, &op.req);
  CHECKF(s == CONCORD_SUCCESS, "enqueue '%s': %s", op.name.c_str(), concord_comm_last_error(comm));
  if (s != CONCORD_SUCCESS) op.req = nullptr;
}

// ---- skip ----

int Skip() {
  concord_comm_t comm = mp::InitOrExit(&g_rank, &g_size);
  const int culprit = g_size - 1;
  const char* names[4] = {"a", "x", "y", "b"};
  constexpr int kX = 1, kY = 2;
  for (int step = 0; step < 6; ++step) {
    Op ops[4];
    for (int k = 0; k < 4; ++k) {
      ops[k].name = names[k];
      const bool skipped = g_rank == culprit && ((k == kY && step == 0) || (k == kX && step == 3));
      if (!skipped) Submit(comm, ops[k], k, step);
    }
    for (int k = 0; k < 4; ++k) {
      if (ops[k].req == nullptr) continue;
      const double t0 = mp::Now();
      const concord_status_t s = concord_wait(ops[k].req, 30);
      const std::string err = s == CONCORD_SUCCESS ? "" : concord_request_error(ops[k].req);
      const bool older = g_rank != culprit && ((k == kY && step == 0) || (k == kX && step == 3));
      if (older) {
        // The culprit's next-step submission arrived instead: this step's fails, naming both.
        const std::string mine = "step " + std::to_string(step) + " on rank";
        const std::string theirs =
            "step " + std::to_string(step + 1) + " on rank " + std::to_string(culprit);
        CHECKF(s == CONCORD_ERR_MISMATCH, "'%s' step %d: %s, want MISMATCH (%s)", names[k], step,
               concord_status_string(s), err.c_str());
        CHECKF(mp::Contains(err, std::string("tensor '") + names[k] + "'") &&
                   mp::Contains(err, mine) && mp::Contains(err, theirs),
               "'%s' step %d: the error does not name the tensor and both steps: %s", names[k],
               step, err.c_str());
        CHECKF(mp::Now() - t0 < 5, "'%s' step %d: the mismatch took %.1f s", names[k], step,
               mp::Now() - t0);
        if (g_rank == 0) std::printf("skip: rank 0 step %d: %s\n", step, err.c_str());
      } else {
        CHECKF(s == CONCORD_SUCCESS, "'%s' step %d: %s: %s", names[k], step,
               concord_status_string(s), err.c_str());
        for (float v : ops[k].data) {
          if (s == CONCORD_SUCCESS && v != Sum(k, step)) {
            CHECKF(v == Sum(k, step), "'%s' step %d: got %g, want %g (another step's data?)",
                   names[k], step, v, Sum(k, step));
            break;
          }
        }
      }
      concord_request_free(ops[k].req);
    }
    CHECKF(concord_end_step(comm) == CONCORD_SUCCESS, "end_step: %s",
           concord_comm_last_error(comm));
  }
  const concord_status_t s = concord_finalize(comm);
  CHECKF(s == CONCORD_SUCCESS, "finalize: %s: %s", concord_status_string(s),
         concord_comm_last_error(nullptr));
  return Report("skip");
}

// ---- finalize ----

int Finalize(double linger_s) {
  concord_comm_t comm = mp::InitOrExit(&g_rank, &g_size);
  const int culprit = g_size - 1;
  for (int step = 0; step < 2; ++step) {
    Op op;
    op.name = "w";
    Submit(comm, op, 0, step);
    if (op.req == nullptr) continue;
    const concord_status_t s = concord_wait(op.req, 30);
    CHECKF(s == CONCORD_SUCCESS && op.data[0] == Sum(0, step), "step %d: %s", step,
           concord_request_error(op.req));
    concord_request_free(op.req);
  }
  if (g_rank == culprit) {
    const double t0 = mp::Now();
    const concord_status_t s = concord_finalize(comm);
    const double took = mp::Now() - t0;
    const std::string err = concord_comm_last_error(nullptr);
    std::printf("finalize: rank %d's early finalize returned %s after %.2f s: %s\n", g_rank,
                concord_status_string(s), took, err.c_str());
    if (linger_s > 0) {
      CHECKF(s == CONCORD_ERR_TIMEOUT, "early finalize: %s, want TIMEOUT",
             concord_status_string(s));
      CHECKF(mp::Contains(err, "finalize barrier did not complete"), "finalize message: %s",
             err.c_str());
    } else {
      // The others follow, so the barrier completes; but their 'x' and 'z' failed for want of
      // this rank, which its finalize reports.
      CHECKF(s == CONCORD_ERR_MISMATCH, "early finalize: %s, want MISMATCH: %s",
             concord_status_string(s), err.c_str());
      CHECKF(mp::Contains(err, "this rank finalized while ranks 0, 1 still submitted tensors") &&
                 mp::Contains(err, "'x'") && mp::Contains(err, "'z'"),
             "early finalize's message: %s", err.c_str());
    }
    return Report("finalize");
  }
  const std::string told = "rank " + std::to_string(culprit) + " has finalized";
  for (const char* name : {"x", "z"}) {
    Op op;
    op.name = name;
    Submit(comm, op, 1, 2);
    if (op.req == nullptr) continue;
    const double t0 = mp::Now();
    const concord_status_t s = concord_wait(op.req, 30);
    const double took = mp::Now() - t0;
    const std::string err = s == CONCORD_SUCCESS ? "" : concord_request_error(op.req);
    CHECKF(s == CONCORD_ERR_PEER_FAILURE, "'%s': %s, want PEER_FAILURE (%s)", name,
           concord_status_string(s), err.c_str());
    // Ranks that finished first and finalized too may be listed with the culprit.
    const std::string list = err.substr(0, err.find(" finalized"));
    const bool named = mp::Contains(list + ",", " " + std::to_string(culprit) + ",") ||
                       mp::Contains(list, " " + std::to_string(culprit) + " ha");
    CHECKF(named && mp::Contains(err, std::string("'") + name + "'"),
           "'%s': the error does not say that %s: %s", name, told.c_str(), err.c_str());
    CHECKF(took < 1.0, "'%s': the others learned it after %.2f s", name, took);
    if (g_rank == 0)
      std::printf("finalize: rank 0 '%s' after %.3f s: %s\n", name, took, err.c_str());
    concord_request_free(op.req);
  }
  if (linger_s > 0) usleep(static_cast<useconds_t>(linger_s * 1e6));
  const concord_status_t s = concord_finalize(comm);
  if (linger_s == 0) {
    // A rank that finalized while another still submitted its 'z' (the culprit and it both
    // absent then) is told so; otherwise its finalize succeeds.
    const std::string err = s == CONCORD_SUCCESS ? "" : concord_comm_last_error(nullptr);
    CHECKF(s == CONCORD_SUCCESS ||
               (s == CONCORD_ERR_MISMATCH && mp::Contains(err, "still submitted tensors")),
           "finalize: %s: %s", concord_status_string(s), err.c_str());
  }
  return Report("finalize");
}

// ---- stall ----

// One tensor of each operation but the allreduce, named "x.<op>", for the stall mode.
struct Stalled {
  std::string name;
  std::vector<float> in, out;
  concord_request_t req = nullptr;
};

// `refused`: the error an enqueue may be refused with (the job already failed), or empty.
std::vector<Stalled> SubmitEveryOp(concord_comm_t comm, const std::string& refused) {
  std::vector<Stalled> ops(4);
  const char* kinds[4] = {"reducescatter", "alltoall", "allgather", "broadcast"};
  for (int k = 0; k < 4; ++k) {
    Stalled& op = ops[k];
    op.name = std::string("x.") + kinds[k];
    op.in.assign(static_cast<size_t>(2 * g_size), 1.0f);
    op.out.assign(2, 0.0f);
    const int64_t in_shape[1] = {2 * g_size}, out_shape[1] = {2};
    concord_tensor_t in = CpuTensor(op.in.data(), CONCORD_FLOAT32, 1, in_shape);
    concord_tensor_t out = CpuTensor(op.out.data(), CONCORD_FLOAT32, 1, out_shape);
    concord_status_t s = CONCORD_ERR_INTERNAL;
    const char* n = op.name.c_str();
    switch (k) {
      case 0:
        s = concord_reducescatter_async(comm, n, &in, &out, nullptr, nullptr, nullptr, &op.req);
        break;
      case 1:
        s = concord_alltoall_async(comm, n, &in, nullptr, 0, nullptr, nullptr, nullptr, &op.req);
        break;
      case 2:
        s = concord_allgather_async(comm, n, &out, nullptr, 0, nullptr, nullptr, &op.req);
        break;
      case 3:
        s = concord_broadcast_async(comm, n, &in, nullptr, 0, nullptr, nullptr, &op.req);
        break;
    }
    if (s == CONCORD_SUCCESS) continue;
    op.req = nullptr;
    const std::string err = concord_comm_last_error(comm);
    CHECKF(!refused.empty() && s == CONCORD_ERR_TIMEOUT && mp::Contains(err, refused),
           "enqueue '%s': %s: %s", n, concord_status_string(s), err.c_str());
  }
  return ops;
}

// Waits for `req` and checks that it failed with the stall shutdown's error `want`.
void ExpectStallError(concord_request_t req, const std::string& what, const std::string& want) {
  if (req == nullptr) return;
  const concord_status_t s = concord_wait(req, 30);
  const std::string err = s == CONCORD_SUCCESS ? "" : concord_request_error(req);
  CHECKF(s == CONCORD_ERR_TIMEOUT && mp::Contains(err, want), "'%s': %s: %s", what.c_str(),
         concord_status_string(s), err.c_str());
  concord_request_free(req);
}

int Stall() {
  concord_comm_t comm = mp::InitOrExit(&g_rank, &g_size);
  const int culprit = g_size - 1;
  // Everyone runs the operations other than 'x' once: the culprit's missing them later is then a
  // wait on cached responses (the coordinator's bit waits), 'x''s a wait on a full request.
  for (Stalled& op : SubmitEveryOp(comm, "")) {
    if (op.req == nullptr) continue;
    CHECKF(concord_wait(op.req, 30) == CONCORD_SUCCESS, "%s: %s", op.name.c_str(),
           concord_request_error(op.req));
    concord_request_free(op.req);
  }
  Op warm;
  warm.name = "b";
  Submit(comm, warm, 0, 0);
  if (warm.req != nullptr) {
    CHECKF(concord_wait(warm.req, 30) == CONCORD_SUCCESS, "b: %s", concord_request_error(warm.req));
    concord_request_free(warm.req);
  }
  const std::string want = "tensor 'x' was not submitted by rank " + std::to_string(culprit) +
                           " (rank " + std::to_string(culprit) + " last submitted 'b'";
  if (g_rank == culprit) {
    sleep(5);  // frozen in the application: the job fails meanwhile
    std::vector<float> late(7, 0.0f);
    const int64_t shape[1] = {7};
    concord_tensor_t t = CpuTensor(late.data(), CONCORD_FLOAT32, 1, shape);
    const concord_status_t s = concord_allreduce(comm, "x", &t, nullptr, nullptr);
    const std::string err = concord_comm_last_error(comm);
    CHECKF(s == CONCORD_ERR_TIMEOUT && mp::Contains(err, want), "late 'x': %s: %s",
           concord_status_string(s), err.c_str());
    // The other operations too: refused at enqueue, or failed at once.
    for (Stalled& op : SubmitEveryOp(comm, want)) ExpectStallError(op.req, "late " + op.name, want);
  } else {
    // A recv from the culprit, which never sends: it times out on its own (CONCORD_TIMEOUT_S),
    // naming the peer and the tag, before the stall shutdown.
    std::vector<float> rbuf(4);
    const int64_t rshape[1] = {4};
    concord_tensor_t rt = CpuTensor(rbuf.data(), CONCORD_FLOAT32, 1, rshape);
    concord_request_t recv = nullptr;
    const double t0 = mp::Now();
    CHECKF(concord_recv_async(comm, &rt, culprit, 7, nullptr, nullptr, &recv) == CONCORD_SUCCESS,
           "recv: %s", concord_comm_last_error(comm));
    Op x;
    x.name = "x";
    Submit(comm, x, 1, 0);
    usleep(100 * 1000);  // 'x' is the oldest: the shutdown names it
    std::vector<Stalled> ops = SubmitEveryOp(comm, "");
    if (recv != nullptr) {
      const concord_status_t s = concord_wait(recv, 30);
      const double took = mp::Now() - t0;
      const std::string err = s == CONCORD_SUCCESS ? "" : concord_request_error(recv);
      const std::string peer_tag = "recv from rank " + std::to_string(culprit) + " with tag 7";
      CHECKF(s == CONCORD_ERR_TIMEOUT && mp::Contains(err, peer_tag) &&
                 mp::Contains(err, "no message arrived within the timeout"),
             "recv without a sender: %s: %s", concord_status_string(s), err.c_str());
      CHECKF(took > 1.2 && took < 2.9, "the recv failed after %.2f s, want 1.5 s", took);
      std::printf("stall: rank %d: recv failed after %.2f s: %s\n", g_rank, took, err.c_str());
      concord_request_free(recv);
    }
    if (x.req != nullptr) {
      const concord_status_t s = concord_wait(x.req, 30);
      const double took = mp::Now() - t0;
      const std::string err = s == CONCORD_SUCCESS ? "" : concord_request_error(x.req);
      CHECKF(s == CONCORD_ERR_TIMEOUT && mp::Contains(err, want), "'x': %s: %s",
             concord_status_string(s), err.c_str());
      CHECKF(took > 2.5 && took < 5.0, "'x' failed after %.2f s, want 3 s (+ a step)", took);
      std::printf("stall: rank %d failed after %.2f s: %s\n", g_rank, took, err.c_str());
      concord_request_free(x.req);
    }
    for (Stalled& op : ops) ExpectStallError(op.req, op.name, want);
  }
  (void)concord_finalize(comm);
  return Report("stall");
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode;
  double linger = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mode" && i + 1 < argc) {
      mode = argv[++i];
    } else if (a == "--linger" && i + 1 < argc) {
      linger = std::atof(argv[++i]);
    }
  }
  if (mode == "skip") return Skip();
  if (mode == "finalize") return Finalize(linger);
  if (mode == "stall") return Stall();
  std::fprintf(stderr, "usage: %s --mode skip|finalize [--linger S]|stall\n", argv[0]);
  return 2;
}
