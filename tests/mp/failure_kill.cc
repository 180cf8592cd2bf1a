// mp_failure_modes --mode kill: a rank SIGKILLs itself while the others have every kind of
// operation in flight. See failure_kill.h for what is checked.
#include "failure_kill.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "mp_common.h"
#include "tests/common/check.h"
#include "tests/common/tensors.h"

namespace {

int g_rank = 0, g_size = 1, g_victim = -1;

// One operation in flight on a survivor when the victim dies: its request and its buffers.
struct Op {
  std::string what;  // "allreduce 'pending.allreduce'", "recv from rank 1 tag 11", ...
  std::vector<float> in, out;
  std::vector<int64_t> in_shape, out_shape, splits;
  concord_request_t req = nullptr;
  // A send to the victim may have been delivered before it died (Gloo keeps unexpected messages
  // whole): then it succeeds; it must still finish.
  bool may_succeed = false;
  // A large operation the victim took part in: it may succeed when the victim did its part before
  // dying, but then its result must be exact (every rank gives ones): `want` in every element of
  // the out buffer, of the request's output (`request_floats` of them), or of the in buffer (a
  // broadcast, in place).
  bool mid = false;
  enum class Result { kOut, kRequest, kInPlace } result = Result::kOut;
  float want = 1.0f;
  size_t request_floats = 0;
  double ended = 0;     // seconds after the death was noticed (set by Await)
  bool failed = false;  // it ended with an error (set by Await)
};

concord_tensor_t In(Op& op) {
  return CpuTensor(op.in.data(), CONCORD_FLOAT32, static_cast<int>(op.in_shape.size()),
                   op.in_shape.data());
}

concord_tensor_t Out(Op& op) {
  return CpuTensor(op.out.data(), CONCORD_FLOAT32, static_cast<int>(op.out_shape.size()),
                   op.out_shape.data());
}

// After the death is noticed an operation may also be refused at enqueue (with a message).
bool g_refusal_ok = false;

void Check(concord_comm_t comm, Op& op, concord_status_t enqueued) {
  if (enqueued == CONCORD_SUCCESS) return;
  op.req = nullptr;
  const std::string err = concord_comm_last_error(comm);
  CHECKF(g_refusal_ok && mp::Contains(err, "rank " + std::to_string(g_victim)),
         "enqueue %s: %s: %s", op.what.c_str(), concord_status_string(enqueued), err.c_str());
  if (g_refusal_ok) {
    std::printf("rank %d: %-58s refused at enqueue: %s: %s\n", g_rank, op.what.c_str(),
                concord_status_string(enqueued), err.c_str());
  }
}

Op Allreduce(concord_comm_t comm, const std::string& name, int64_t n, concord_callback_t cb) {
  Op op;
  op.what = "allreduce '" + name + "'";
  op.in.assign(static_cast<size_t>(n), 1.0f);
  op.in_shape = {n};
  concord_tensor_t t = In(op);
  Check(comm, op,
        concord_allreduce_async(comm, name.c_str(), &t, nullptr, nullptr, cb, nullptr, &op.req));
  return op;
}

// Allgather of `rows` rows of 2 floats from each rank; the request owns the result.
Op Allgather(concord_comm_t comm, const std::string& name, int64_t rows) {
  Op op;
  op.what = "allgather '" + name + "'";
  op.in.assign(static_cast<size_t>(rows * 2), 1.0f);
  op.in_shape = {rows, 2};
  op.result = Op::Result::kRequest;
  op.request_floats = op.in.size() * static_cast<size_t>(g_size);
  concord_tensor_t t = In(op);
  Check(comm, op,
        concord_allgather_async(comm, name.c_str(), &t, nullptr, 0, nullptr, nullptr, &op.req));
  return op;
}

// Broadcast of `n` floats, in place: the root gives ones, the others start from zeros.
Op Broadcast(concord_comm_t comm, const std::string& name, int root, int64_t n) {
  Op op;
  op.what = "broadcast '" + name + "' (root " + std::to_string(root) + ")";
  op.in.assign(static_cast<size_t>(n), g_rank == root ? 1.0f : 0.0f);
  op.in_shape = {n};
  op.result = Op::Result::kInPlace;
  concord_tensor_t t = In(op);
  Check(comm, op,
        concord_broadcast_async(comm, name.c_str(), &t, nullptr, root, nullptr, nullptr, &op.req));
  return op;
}

// Reduce-scatter of `rows` rows of `width` floats; uneven: rank r receives r + 1 rows (rows must
// then be size * (size + 1) / 2), else the even split (size divides rows).
Op Reducescatter(concord_comm_t comm, const std::string& name, int64_t rows, int64_t width,
                 bool uneven) {
  Op op;
  op.what = "reducescatter '" + name + "'";
  op.in.assign(static_cast<size_t>(rows * width), 1.0f);
  op.in_shape = {rows, width};
  concord_reducescatter_opts_t o;
  concord_reducescatter_opts_init(&o);
  int64_t mine = rows / g_size;
  if (uneven) {
    for (int r = 0; r < g_size; ++r) op.splits.push_back(r + 1);
    o.recv_splits = op.splits.data();
    o.nsplits = g_size;
    mine = g_rank + 1;
  }
  op.out.assign(static_cast<size_t>(mine * width), 0.0f);
  op.out_shape = {mine, width};
  op.want = static_cast<float>(g_size);  // the sum of ones
  concord_tensor_t t = In(op), u = Out(op);
  Check(comm, op,
        concord_reducescatter_async(comm, name.c_str(), &t, &u, &o, nullptr, nullptr, &op.req));
  return op;
}

// All-to-all of `rows` floats; uneven: rank d receives d + 1 of them from each rank (rows must
// then be size * (size + 1) / 2), else the even split. The request owns the result.
Op Alltoall(concord_comm_t comm, const std::string& name, int64_t rows, bool uneven) {
  Op op;
  op.what = "alltoall '" + name + "'";
  op.in.assign(static_cast<size_t>(rows), 1.0f);
  op.in_shape = {rows};
  op.result = Op::Result::kRequest;
  op.request_floats = static_cast<size_t>(rows);
  concord_alltoall_opts_t o;
  concord_alltoall_opts_init(&o);
  if (uneven) {
    for (int r = 0; r < g_size; ++r) op.splits.push_back(r + 1);
    o.splits = op.splits.data();
    o.nsplits = g_size;
  }
  concord_tensor_t t = In(op);
  Check(comm, op,
        concord_alltoall_async(comm, name.c_str(), &t, nullptr, 0, &o, nullptr, nullptr, &op.req));
  return op;
}

// Reduce of `n` floats to `root`, out of place (the sum of ones on the root).
Op Reduce(concord_comm_t comm, const std::string& name, int root, int64_t n) {
  Op op;
  op.what = "reduce '" + name + "' (root " + std::to_string(root) + ")";
  op.in.assign(static_cast<size_t>(n), 1.0f);
  op.in_shape = {n};
  op.out.assign(static_cast<size_t>(n), 0.0f);
  op.out_shape = {n};
  op.want = static_cast<float>(g_size);
  concord_tensor_t t = In(op), u = Out(op);
  Check(comm, op,
        concord_reduce_async(comm, name.c_str(), &t, &u, root, nullptr, nullptr, nullptr, &op.req));
  return op;
}

// Gather of `rows` rows of 2 floats from each rank to `root`; the root's request owns the result.
Op Gather(concord_comm_t comm, const std::string& name, int root, int64_t rows) {
  Op op;
  op.what = "gather '" + name + "' (root " + std::to_string(root) + ")";
  op.in.assign(static_cast<size_t>(rows * 2), 1.0f);
  op.in_shape = {rows, 2};
  op.result = Op::Result::kRequest;
  op.request_floats = g_rank == root ? op.in.size() * static_cast<size_t>(g_size) : 0;
  concord_tensor_t t = In(op);
  Check(comm, op,
        concord_gather_async(comm, name.c_str(), &t, nullptr, 0, root, nullptr, nullptr, &op.req));
  return op;
}

Op Barrier(concord_comm_t comm) {
  Op op;
  op.what = "barrier";
  Check(comm, op, concord_barrier_async(comm, nullptr, nullptr, &op.req));
  return op;
}

Op Send(concord_comm_t comm, int peer, int64_t tag, int64_t n) {
  Op op;
  op.what = "send to rank " + std::to_string(peer) + " tag " + std::to_string(tag);
  op.in.assign(static_cast<size_t>(n), 1.0f);
  op.in_shape = {n};
  concord_tensor_t t = In(op);
  Check(comm, op, concord_send_async(comm, &t, peer, tag, nullptr, nullptr, &op.req));
  return op;
}

Op Recv(concord_comm_t comm, int peer, int64_t tag) {
  Op op;
  op.what = "recv from rank " + std::to_string(peer) + " tag " + std::to_string(tag);
  op.out.assign(16, 0.0f);
  op.out_shape = {16};
  concord_tensor_t t = Out(op);
  Check(comm, op, concord_recv_async(comm, &t, peer, tag, nullptr, nullptr, &op.req));
  return op;
}

// One of every operation, under names the victim never submits (and p2p with the victim).
std::vector<Op> EveryOp(concord_comm_t comm, const std::string& prefix, int victim) {
  const int64_t tri = g_size * (g_size + 1) / 2;
  std::vector<Op> ops;
  ops.push_back(Allreduce(comm, prefix + "allreduce", 1024, nullptr));
  ops.push_back(Allgather(comm, prefix + "allgather", 64));
  ops.push_back(Broadcast(comm, prefix + "broadcast.root_victim", victim, 1024));
  ops.push_back(Broadcast(comm, prefix + "broadcast.root_survivor", (victim + 1) % g_size, 1024));
  ops.push_back(Reducescatter(comm, prefix + "reducescatter.even", 64 * g_size, 4, false));
  ops.push_back(Reducescatter(comm, prefix + "reducescatter.uneven", tri, 4, true));
  ops.push_back(Alltoall(comm, prefix + "alltoall.even", 64 * g_size, false));
  ops.push_back(Alltoall(comm, prefix + "alltoallv", tri, true));
  ops.push_back(Reduce(comm, prefix + "reduce.root_victim", victim, 1024));
  ops.push_back(Reduce(comm, prefix + "reduce.root_survivor", (victim + 1) % g_size, 1024));
  ops.push_back(Gather(comm, prefix + "gather.root_survivor", (victim + 1) % g_size, 64));
  ops.push_back(Barrier(comm));
  ops.push_back(Recv(comm, victim, 11));
  return ops;
}

// A large operation that succeeded: the victim's part arrived whole.
void CheckExact(Op& op) {
  const float* got = op.result == Op::Result::kInPlace ? op.in.data() : op.out.data();
  size_t n = op.result == Op::Result::kInPlace ? op.in.size() : op.out.size();
  if (op.result == Op::Result::kRequest) {
    void* data = nullptr;
    size_t bytes = 0;
    CHECKF(concord_request_output(op.req, &data, &bytes, nullptr) == CONCORD_SUCCESS &&
               bytes == op.request_floats * sizeof(float),
           "%s: %zu bytes received, want %zu", op.what.c_str(), bytes,
           op.request_floats * sizeof(float));
    got = static_cast<const float*>(data);
    n = bytes / sizeof(float);
  }
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != op.want) {
      CHECKF(got[i] == op.want, "%s succeeded with [%zu] = %g, want %g", op.what.c_str(), i, got[i],
             op.want);
      return;
    }
  }
}

// Waits for `op` (far past the engine's deadline) and checks that it failed with a message.
void Await(Op& op, double t0) {
  if (op.req == nullptr) return;
  const concord_status_t s = concord_wait(op.req, 60);
  op.ended = mp::Now() - t0;
  op.failed = s != CONCORD_SUCCESS;
  const bool finished = concord_test(op.req) != CONCORD_IN_PROGRESS;
  CHECKF(finished, "%s still running 60 s after the victim died", op.what.c_str());
  if (finished) {
    const std::string err = s == CONCORD_SUCCESS ? "" : concord_request_error(op.req);
    CHECKF(s != CONCORD_SUCCESS || op.may_succeed || op.mid,
           "%s succeeded although the victim is dead", op.what.c_str());
    if (s == CONCORD_SUCCESS && op.mid) CheckExact(op);
    CHECKF(s == CONCORD_SUCCESS || mp::Contains(err, "rank " + std::to_string(g_victim)),
           "%s: the error does not name rank %d: '%s'", op.what.c_str(), g_victim, err.c_str());
    std::printf("rank %d: %-58s %s after %.3f s: %s\n", g_rank, op.what.c_str(),
                concord_status_string(s), op.ended, err.c_str());
  }
  concord_request_free(op.req);
  op.req = nullptr;
}

// The victim's last act: as the allreduce that runs with the large operations completes (on lane
// 0, while the first large one runs on lane 1), it kills the process. (A thread that killed it
// 3 ms later let it finish a 64 MiB broadcast first, now and then, on the loaded machine.)
void Die(concord_request_t, concord_status_t, void*) {
  std::printf("VICTIM rank %d kills itself\n", g_rank);
  std::fflush(stdout);
  ::raise(SIGKILL);
}

void GoodAllreduce(concord_comm_t comm) {
  std::vector<float> x(4096, 1.0f);
  int64_t shape[1] = {4096};
  concord_tensor_t t = CpuTensor(x.data(), CONCORD_FLOAT32, 1, shape);
  const concord_status_t s = concord_allreduce(comm, "warmup", &t, nullptr, nullptr);
  CHECKF(s == CONCORD_SUCCESS && x[7] == static_cast<float>(g_size), "warmup: %s: %s",
         concord_status_string(s), concord_comm_last_error(comm));
}

// The names in /dev/shm of the shared-memory segments process `pid` created (backends/shm names
// them "concord-<pid>-..."), space-separated.
std::string SharedMemoryOf(pid_t pid) {
  std::string names;
  const std::string prefix = "concord-" + std::to_string(pid) + "-";
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (const dirent* entry = ::readdir(dir)) {
      if (std::string(entry->d_name).rfind(prefix, 0) == 0)
        names += std::string(entry->d_name) + " ";
    }
    ::closedir(dir);
  }
  return names;
}

// Every rank's pid, in rank order.
std::vector<int32_t> Pids(concord_comm_t comm) {
  int32_t mine = static_cast<int32_t>(::getpid());
  int64_t shape[1] = {1};
  concord_tensor_t t = CpuTensor(&mine, CONCORD_INT32, 1, shape);
  std::vector<int32_t> all(static_cast<size_t>(g_size), 0);
  concord_request_t req = nullptr;
  concord_status_t s = concord_allgather_async(
      comm, "pids", &t, all.data(), all.size() * sizeof(int32_t), nullptr, nullptr, &req);
  if (s == CONCORD_SUCCESS) {
    s = concord_wait(req, 60);
    concord_request_free(req);
  }
  CHECKF(s == CONCORD_SUCCESS, "allgather of the pids: %s: %s", concord_status_string(s),
         concord_comm_last_error(comm));
  return all;
}

// A large operation of kind `kind` (one of kMidOpKinds) named "mid.<kind>", of about `bytes` bytes
// (an allgather's output; a broadcast's root is rank size - 1, or 0 when that is the victim), which
// the victim takes part in.
Op Mid(concord_comm_t comm, const std::string& kind, int64_t bytes) {
  const int64_t rows = std::max<int64_t>(1, bytes / 4 / g_size) * g_size;
  Op op;
  if (kind == "reducescatter") {
    op = Reducescatter(comm, "mid.reducescatter", rows, 1, false);
  } else if (kind == "alltoall") {
    op = Alltoall(comm, "mid.alltoall", rows, false);
  } else if (kind == "allgather") {
    op = Allgather(comm, "mid.allgather", std::max<int64_t>(1, rows / g_size / 2));
  } else if (kind == "allreduce") {
    op = Allreduce(comm, "mid.allreduce", rows, nullptr);
  } else {
    op = Broadcast(comm, "mid.broadcast", g_victim == g_size - 1 ? 0 : g_size - 1, rows);
  }
  op.mid = true;
  return op;
}

}  // namespace

int Kill(int victim, int64_t mid_bytes, const std::vector<std::string>& mid_ops) {
  // The survivors observe the failure themselves: concordrun gives them its grace period first,
  // but mpirun (--backend mpi) SIGTERMs them; they ignore that (SIGKILL follows).
  ::signal(SIGTERM, SIG_IGN);
  // The large operations' placement below assumes two lanes, whatever the caller's environment.
  ::setenv("CONCORD_LANES", "2", 1);
  concord_comm_t comm = mp::InitOrExit(&g_rank, &g_size);
  g_victim = victim;
  if (victim < 0 || victim >= g_size || g_size < 2) {
    std::fprintf(stderr, "kill mode needs a victim in [0, size) and 2+ ranks\n");
    return 2;
  }
  for (int step = 0; step < 3; ++step) GoodAllreduce(comm);
  const std::vector<int32_t> pids = Pids(comm);
  CHECKF(concord_barrier(comm) == CONCORD_SUCCESS, "barrier: %s", concord_comm_last_error(comm));
  if (CheckFailures()) return 1;
  // Pending in negotiation: names the victim never submits, a recv from it and a send to it
  // (8 MiB: more than a socket buffer holds).
  std::vector<Op> ops;
  if (g_rank != victim) {
    ops = EveryOp(comm, "pending.", victim);
    ops.push_back(Send(comm, victim, 12, 2 << 20));
    ops.back().may_succeed = true;
  }
  // Running on the backend: a 64 KiB allreduce (above the inline threshold: it runs on the
  // backend), then the large operations (mid_ops, in that order), as one group: negotiated
  // together once every rank enqueued it (and everything above), and spread over the lanes in that
  // order (the allreduce on lane 0, the first large one on lane 1, at once: CONCORD_LANES is 2, set
  // above).
  // The victim dies as the allreduce completes, inside the first large one.
  CHECKF(concord_group_start(comm) == CONCORD_SUCCESS, "group_start: %s",
         concord_comm_last_error(comm));
  Op go = Allreduce(comm, "mid.go", 16384, g_rank == victim ? Die : nullptr);
  for (const std::string& kind : mid_ops) ops.push_back(Mid(comm, kind, mid_bytes));
  CHECKF(concord_group_end(comm) == CONCORD_SUCCESS, "group_end: %s",
         concord_comm_last_error(comm));
  if (g_rank == victim) {
    concord_wait(go.req, 60);  // the callback kills this process
    std::this_thread::sleep_for(std::chrono::seconds(60));
    std::fprintf(stderr, "rank %d: the victim outlived its callback\n", g_rank);
    return 1;
  }
  // And a join (uneven epochs: this survivor ran out of data), blocking, on a thread of its own.
  std::string join_result;
  std::thread joiner([comm, &join_result] {
    const double tj = mp::Now();
    const concord_status_t js = concord_join(comm, nullptr);
    const std::string err = concord_comm_last_error(comm);
    CHECKF(js != CONCORD_SUCCESS && mp::Contains(err, "rank " + std::to_string(g_victim)),
           "join: %s: '%s'", concord_status_string(js), err.c_str());
    char line[160];
    std::snprintf(line, sizeof(line), "rank %d: %-58s %s after %.3f s", g_rank, "join",
                  concord_status_string(js), mp::Now() - tj);
    join_result = line;
  });
  // The victim's allreduce may complete before this rank's (its last exchange can come earlier):
  // mid.go then fails here, naming the victim, like everything else in flight. The victim dies
  // within milliseconds of this: the times below count from here.
  const double t0 = mp::Now();
  const concord_status_t gs = concord_wait(go.req, 60);
  const std::string go_error = concord_request_error(go.req);
  CHECKF(gs == CONCORD_SUCCESS || mp::Contains(go_error, "rank " + std::to_string(victim)),
         "mid.go: %s: %s", concord_status_string(gs), go_error.c_str());
  concord_request_free(go.req);
  double detect = 0;
  std::string first_failed = "none";  // the first large operation that failed: the victim's last
  for (Op& op : ops) {
    const bool mid = op.mid;
    Await(op, t0);
    detect = std::max(detect, op.ended);
    if (mid && op.failed && first_failed == "none") first_failed = op.what;
  }
  std::printf("MID_FAILED rank %d: the first large operation to fail: %s\n", g_rank,
              first_failed.c_str());
  joiner.join();
  std::printf("%s\n", join_result.c_str());
  double limit = 10;
  if (const char* t = std::getenv("CONCORD_TIMEOUT_S")) limit = std::atof(t);
  CHECKF(detect <= limit + 2.0, "the failure took %.2f s to surface (deadline %.1f s)", detect,
         limit);
  // Later operations of every kind fail too: at enqueue, or promptly after.
  const double t1 = mp::Now();
  g_refusal_ok = true;
  std::vector<Op> later = EveryOp(comm, "later.", victim);
  later.push_back(Send(comm, victim, 12, 16));
  for (Op& op : later) Await(op, t1);
  CHECKF(mp::Now() - t1 < 5.0, "later requests took %.2f s to fail", mp::Now() - t1);
  const double t2 = mp::Now();
  const concord_status_t fs = concord_finalize(comm);
  const double fin = mp::Now() - t2;
  CHECKF(fs == CONCORD_SUCCESS, "finalize: %s", concord_status_string(fs));
  CHECKF(fin < 5.0, "finalize took %.2f s", fin);
  // Each host's first rank created its shared-memory segments (named after its pid; the victim
  // may be one): nothing of any rank may remain. The first survivor looks.
  if (g_rank == (victim == 0 ? 1 : 0)) {
    std::string leftover;
    for (const int32_t pid : pids) leftover += SharedMemoryOf(pid);
    CHECKF(leftover.empty(), "left in /dev/shm: %s", leftover.c_str());
  }
  if (CheckFailures() == 0) {
    std::printf(
        "SURVIVOR_OK rank %d: %zu requests of every kind failed within %.3f s; finalize "
        "%.3f s\n",
        g_rank, ops.size(), detect, fin);
  }
  std::fflush(stdout);
  return CheckFailures() ? 1 : 0;
}
