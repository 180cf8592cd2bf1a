// fault_rank: one rank of a training-like job that injects one class of fault when it is the
// culprit, for the fault-injection suite (tests/faults/run_faults.py, README.md beside it).
//
//   fault_rank --class missing|mismatch|crash|stop|partition|uneven [--ops allreduce|mixed]
//              [--culprit R] [--steps N] [--fault-step S] [--go-file PATH]
//
// Every rank runs N steps (default 8). A step enqueues its requests (--ops, Workload() below):
// three named allreduces, "grad.0" (256 floats: the inline path), "grad.1" (16 Ki floats: fused)
// and "grad.2" (1 Mi floats: direct); or, mixed, "grad.0" and then a reduce-scatter ("grad.1"),
// an all-to-all, an allgather, a broadcast and a ring of send/recv. It waits for all of them with
// no deadline of its own (only Concord's deadlines may end a wait) and checks the results. At
// step S (default 3) the culprit (default: the last rank) injects its fault:
//   missing    it never submits "grad.1" again (a parameter unused on one rank)
//   mismatch   it submits "grad.1" with one row (1-D) or one column more
//   crash      it enqueues the step ("grad.0" last) and raise(SIGKILL)s in the completion
//              callback of "grad.0", before the step's other operations, which the others are
//              entering (the fault line says which were still in flight)
//   stop       the same with raise(SIGSTOP); once continued (the runner sends SIGCONT) it goes on
//              like any other rank
//   partition  it enqueues the step, asks for its link to be taken down and waits (at most 10 s)
//              until the runner creates --go-file, then goes on; the runner cuts the link
//   uneven     after step S-1 it calls concord_finalize instead of going on (its epoch ended)
//
// Output: one machine-readable line per event on stdout (or, when FAULT_RANK_EVENTS_DIR is set,
// appended to <dir>/<pid>.events instead, which the runner reads whatever the launcher does with
// the rank's stdout), "FAULT_RANK " and a JSON object with
// "event", "rank" and "t" (CLOCK_MONOTONIC seconds, comparable across the processes of one host):
//   start     {"size", "pid", "culprit", "class"}
//   fault     the culprit, as it injects: {"step", "detail"}
//   failed    a request completed with an error (from its callback, at once): {"step", "tensor",
//             "status"}
//   error     the step ended with an error or a wrong result: {"step", "status", "message" (the
//             first failure), "messages" (every failure of the step), "since_step" (seconds since
//             this rank began the step), "since_fault_step" (since it began step S)}
//   finalize  {"status", "message", "seconds"}
//   signal    a SIGTERM/SIGINT/SIGHUP arrived (the process then dies of it, as by default):
//             {"signal"}
//   exit      {"code"}: the process is about to exit on its own
// Exit status: 1 after an error (or a failed finalize), 0 when every step and the finalize
// succeeded, 2 for a usage error.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "concord/concord.h"
#include "tests/common/tensors.h"

namespace {

double Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Where event lines go: stdout, or the events file (OpenEventsFile). Written by the signal
// handler too, so set once, before the handler is installed.
int g_events_fd = STDOUT_FILENO;

// Points g_events_fd at <FAULT_RANK_EVENTS_DIR>/<pid>.events when that variable is set.
void OpenEventsFile() {
  const char* dir = std::getenv("FAULT_RANK_EVENTS_DIR");
  if (dir == nullptr || *dir == '\0') return;
  const std::string path = std::string(dir) + "/" + std::to_string(::getpid()) + ".events";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "fault_rank: cannot open %s; events go to stdout\n", path.c_str());
    return;
  }
  g_events_fd = fd;
}

// Writes whole lines, one write(2) each, so that lines of the engine's threads and of the main
// thread never interleave and reach the launcher's pipe (or the events file) at once (no stdio
// buffer to flush).
class EventLog {
 public:
  void SetRank(int rank) { rank_ = rank; }

  // `fields`: more JSON members, each starting with a comma.
  void Emit(const char* event, const std::string& fields) {
    char head[96];
    std::snprintf(head, sizeof(head), "FAULT_RANK {\"event\":\"%s\",\"rank\":%d,\"t\":%.6f", event,
                  rank_, Now());
    const std::string line = head + fields + "}\n";
    std::lock_guard<std::mutex> lock(mu_);
    size_t done = 0;
    while (done < line.size()) {
      const ssize_t n = ::write(g_events_fd, line.data() + done, line.size() - done);
      if (n <= 0) return;
      done += static_cast<size_t>(n);
    }
  }

 private:
  std::mutex mu_;
  int rank_ = -1;
};

EventLog g_log;
// Read by the signal handler only (set once, before the handler is installed).
int g_signal_rank = -1;

// Appends the decimal digits of v (async-signal-safe).
char* PutInt(char* p, long long v) {
  char digits[24];
  int n = 0;
  const bool negative = v < 0;
  unsigned long long u = negative ? 0ULL - static_cast<unsigned long long>(v) : v;
  do {
    digits[n++] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u != 0);
  if (negative) *p++ = '-';
  while (n > 0) *p++ = digits[--n];
  return p;
}

// Reports the signal in one line, then dies of it as the default action would.
void OnTerminatingSignal(int sig) {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  char line[160];
  char* p = line;
  const char* head = "FAULT_RANK {\"event\":\"signal\",\"rank\":";
  p = std::strcpy(p, head) + std::strlen(head);
  p = PutInt(p, g_signal_rank);
  p = std::strcpy(p, ",\"t\":") + 5;
  p = PutInt(p, static_cast<long long>(ts.tv_sec));
  *p++ = '.';
  const long long micros = ts.tv_nsec / 1000;
  for (long long scale = 100000; scale > 0; scale /= 10)
    *p++ = static_cast<char>('0' + (micros / scale) % 10);
  p = std::strcpy(p, ",\"signal\":") + 10;
  p = PutInt(p, sig);
  *p++ = '}';
  *p++ = '\n';
  ssize_t ignored = ::write(g_events_fd, line, static_cast<size_t>(p - line));
  (void)ignored;
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

struct Options {
  std::string fault_class;
  std::string ops = "allreduce";
  int culprit = -1;  // -1: the last rank
  int steps = 8;
  int fault_step = 3;
  std::string go_file;
};

// What one request of a step does.
enum class Kind { kAllreduce, kReducescatter, kAlltoall, kAllgather, kBroadcast, kSend, kRecv };

// One request of every step: its name, what it does and its input's shape (rows x cols; cols 1:
// a 1-D tensor). The mismatch class gives "grad.1" one row more (1-D) or one column more.
struct OpSpec {
  const char* name;
  Kind kind;
  int64_t rows;
  int64_t cols;
};

// The requests of a step (--ops). "allreduce": three allreduces, inline, fused and direct.
// "mixed": an inline allreduce, then a reduce-scatter, an all-to-all (1 MiB to each rank), an
// allgather, a broadcast from rank 0 and a ring of send/recv (to rank + 1, from rank - 1, tag: the
// step). "grad.0" comes first in both: crash and stop raise in its callback.
std::vector<OpSpec> Workload(const std::string& ops, int size) {
  if (ops == "allreduce") {
    return {{"grad.0", Kind::kAllreduce, 256, 1},
            {"grad.1", Kind::kAllreduce, 16384, 1},
            {"grad.2", Kind::kAllreduce, 1 << 20, 1}};
  }
  return {{"grad.0", Kind::kAllreduce, 256, 1},
          {"grad.1", Kind::kReducescatter, 64 * size, 64},
          {"grad.2", Kind::kAlltoall, 256 * size, 1024},
          {"grad.3", Kind::kAllgather, 64, 1024},
          {"grad.4", Kind::kBroadcast, 256, 1024},
          {"p2p.send", Kind::kSend, 64, 1024},
          {"p2p.recv", Kind::kRecv, 64, 1024}};
}

// One request of a step: what its callback saw, read by the main thread after concord_wait.
struct Slot {
  int step = 0;
  const char* name = "";
  concord_request_t request = nullptr;
  concord_status_t status = CONCORD_SUCCESS;
  double done_at = 0;
  // crash/stop: the signal the callback raises, and the step's other requests (to say which are
  // still in flight then).
  int raise_signal = 0;
  std::vector<const Slot*> others;
};

// The status's name as the error messages spell it ("TIMEOUT"), for the output.
const char* StatusName(concord_status_t s) {
  switch (s) {
    case CONCORD_SUCCESS:
      return "SUCCESS";
    case CONCORD_ERR_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case CONCORD_ERR_MISMATCH:
      return "MISMATCH";
    case CONCORD_ERR_TIMEOUT:
      return "TIMEOUT";
    case CONCORD_ERR_PEER_FAILURE:
      return "PEER_FAILURE";
    case CONCORD_ERR_BACKEND:
      return "BACKEND";
    case CONCORD_ERR_NOT_INITIALIZED:
      return "NOT_INITIALIZED";
    case CONCORD_ERR_INTERNAL:
      return "INTERNAL";
    case CONCORD_ERR_UNAVAILABLE:
      return "UNAVAILABLE";
    case CONCORD_ERR_VERSION:
      return "VERSION";
    case CONCORD_ERR_SYSTEM:
      return "SYSTEM";
    case CONCORD_ERR_AUTH:
      return "AUTH";
    case CONCORD_ERR_PROTOCOL:
      return "PROTOCOL";
    default:
      return concord_status_string(s);
  }
}

// Inside its callback a request is still in progress, so its message is read after the wait;
// this line gives the moment of the failure (a rank that then hangs still shows it).
// crash and stop: raised in the callback of "grad.0" (an inline allreduce, completed by the
// thread executing the step's response list before it runs the list's collectives), so the
// culprit stops while the others are entering, or inside, the collectives of "grad.1" and
// "grad.2".
void RaiseInCallback(const Slot& slot) {
  std::string in_flight;
  for (const Slot* other : slot.others) {
    if (other->request != nullptr && concord_test(other->request) == CONCORD_IN_PROGRESS) {
      in_flight += std::string(in_flight.empty() ? "" : ", ") + other->name;
    }
  }
  g_log.Emit("fault", ",\"step\":" + std::to_string(slot.step) + ",\"detail\":\"raise(" +
                          (slot.raise_signal == SIGKILL ? "SIGKILL" : "SIGSTOP") +
                          ") as grad.0 completes; " +
                          (in_flight.empty() ? "the step's other requests already done"
                                             : in_flight + " in flight") +
                          "\"");
  ::raise(slot.raise_signal);
  g_log.Emit("resumed", ",\"step\":" + std::to_string(slot.step));
}

void OnComplete(concord_request_t /*request*/, concord_status_t status, void* user_data) {
  Slot* slot = static_cast<Slot*>(user_data);
  if (slot->raise_signal != 0 && status == CONCORD_SUCCESS) RaiseInCallback(*slot);
  slot->status = status;
  slot->done_at = Now();
  if (status == CONCORD_SUCCESS) return;
  g_log.Emit("failed", ",\"step\":" + std::to_string(slot->step) +
                           ",\"tensor\":" + JsonString(slot->name) +
                           ",\"status\":" + JsonString(StatusName(status)));
}

class FaultRank {
 public:
  FaultRank(Options options, concord_comm_t comm, int rank, int size)
      : o_(std::move(options)),
        comm_(comm),
        rank_(rank),
        size_(size),
        ops_(Workload(o_.ops, size)),
        in_(ops_.size()),
        out_(ops_.size()),
        enqueue_errors_(ops_.size()) {
    for (size_t i = 0; i < ops_.size(); ++i) {
      const OpSpec& op = ops_[i];
      in_[i].resize(static_cast<size_t>((op.rows + 1) * (op.cols + 1)));  // + 1: the mismatch
      out_[i].resize(static_cast<size_t>(OutputElements(op)));
    }
  }

  // Runs the steps; returns the process's exit status.
  int Run() {
    for (int step = 0; step < o_.steps; ++step) {
      const bool culprit = rank_ == o_.culprit;
      step_began_ = Now();
      if (step == o_.fault_step) fault_step_began_ = step_began_;
      if (culprit && step == o_.fault_step && o_.fault_class == "uneven") return FinalizeEarly();
      if (!RunStep(step, culprit && step >= o_.fault_step)) return FinalizeAndExit(1);
      ::usleep(10 * 1000);  // the "compute" between two steps
    }
    g_log.Emit("completed", ",\"steps\":" + std::to_string(o_.steps));
    return FinalizeAndExit(0);
  }

 private:
  // One step: enqueue, inject (culprit at or after the fault step), wait, check. False after an
  // error, which has been reported.
  bool RunStep(int step, bool inject) {
    const bool skip_grad1 = inject && o_.fault_class == "missing";
    if (inject && step == o_.fault_step) Announce();
    const size_t n = ops_.size();
    std::vector<Slot> slots(n);
    for (size_t i = 0; i < n; ++i) {
      slots[i].step = step;
      slots[i].name = ops_[i].name;
    }
    // crash/stop: "grad.0", whose callback raises the signal, is enqueued last, after the others.
    const bool raise =
        inject && step == o_.fault_step && (o_.fault_class == "crash" || o_.fault_class == "stop");
    if (raise) {
      slots[0].raise_signal = o_.fault_class == "crash" ? SIGKILL : SIGSTOP;
      for (size_t i = 1; i < n; ++i) slots[0].others.push_back(&slots[i]);
    }
    for (size_t k = 0; k < n; ++k) {
      const size_t i = raise ? (k + 1) % n : k;
      if (i == 1 && skip_grad1) continue;
      const bool wrong_shape =
          inject && step == o_.fault_step && o_.fault_class == "mismatch" && i == 1;
      const concord_status_t s = Enqueue(i, step, wrong_shape, &slots[i]);
      if (s != CONCORD_SUCCESS) {
        slots[i].request = nullptr;
        slots[i].status = s;
        slots[i].done_at = Now();
        enqueue_errors_[i] = concord_comm_last_error(comm_);
      }
    }
    if (inject && step == o_.fault_step) Inject();

    for (Slot& slot : slots) {
      if (slot.request != nullptr) concord_wait(slot.request, -1);
    }
    // The step's failures, the earliest first; a wrong result counts as one.
    std::string first_status, first_message, messages = "[";
    double first_at = 0;
    for (size_t i = 0; i < n; ++i) {
      Slot& slot = slots[i];
      if (i == 1 && skip_grad1) continue;
      std::string status, message;
      double at = slot.done_at;
      if (slot.status != CONCORD_SUCCESS) {
        status = StatusName(slot.status);
        message = std::string("'") + slot.name + "': " +
                  (slot.request != nullptr ? std::string(concord_request_error(slot.request))
                                           : "enqueue: " + enqueue_errors_[i]);
      } else if (!ResultIsRight(i, step)) {
        status = "WRONG_RESULT";
        message = std::string("'") + slot.name + "': wrong result, no error reported";
        at = Now();
      }
      if (slot.request != nullptr) concord_request_free(slot.request);
      if (message.empty()) continue;
      messages += (messages.size() > 1 ? "," : "") + JsonString(message);
      if (first_status.empty() || at < first_at) {
        first_status = status;
        first_message = message;
        first_at = at;
      }
    }
    if (first_status.empty()) return true;
    char times[96];
    std::snprintf(times, sizeof(times), ",\"since_step\":%.3f,\"since_fault_step\":%.3f",
                  first_at - step_began_,
                  fault_step_began_ > 0 ? first_at - fault_step_began_ : -1.0);
    g_log.Emit("error", ",\"step\":" + std::to_string(step) + ",\"error_t\":" +
                            std::to_string(first_at) + ",\"status\":" + JsonString(first_status) +
                            ",\"message\":" + JsonString(first_message) +
                            ",\"messages\":" + messages + "]" + times);
    return false;
  }

  // Elements of op's result where it does not land in its input: a reduce-scatter's share, an
  // all-to-all's or an allgather's output, a recv's buffer.
  int64_t OutputElements(const OpSpec& op) const {
    switch (op.kind) {
      case Kind::kReducescatter:
        return op.rows / size_ * op.cols;
      case Kind::kAlltoall:
      case Kind::kRecv:
        return op.rows * op.cols;
      case Kind::kAllgather:
        return op.rows * size_ * op.cols;
      default:
        return 0;
    }
  }

  // The shape op is submitted with (mismatch: one row more, or one column more) into `shape`;
  // returns its ndim.
  static int ShapeOf(const OpSpec& op, bool wrong_shape, int64_t shape[2]) {
    shape[0] = op.rows + (wrong_shape && op.cols == 1 ? 1 : 0);
    shape[1] = op.cols + (wrong_shape && op.cols > 1 ? 1 : 0);
    return op.cols == 1 ? 1 : 2;
  }

  // The value element e of op's input holds at `step` (an all-to-all's block for rank d holds
  // (rank + 1) * 100 + d; a broadcast's root holds 1000 + step, the others -1; a send
  // (rank + 1) * 10 + step), and the value element e of its result must hold.
  float InputValue(const OpSpec& op, int64_t e, int step) const {
    switch (op.kind) {
      case Kind::kAlltoall:
        return static_cast<float>((rank_ + 1) * 100 + e / (op.rows / size_ * op.cols));
      case Kind::kBroadcast:
        return rank_ == 0 ? static_cast<float>(1000 + step) : -1.0f;
      case Kind::kSend:
        return static_cast<float>((rank_ + 1) * 10 + step);
      default:
        return static_cast<float>(rank_ + 1);
    }
  }
  float ResultValue(const OpSpec& op, int64_t e, int step) const {
    switch (op.kind) {
      case Kind::kAlltoall:
        return static_cast<float>((e / (op.rows / size_ * op.cols) + 1) * 100 + rank_);
      case Kind::kAllgather:
        return static_cast<float>(e / (op.rows * op.cols) + 1);
      case Kind::kBroadcast:
        return static_cast<float>(1000 + step);
      case Kind::kRecv:
        return static_cast<float>(((rank_ + size_ - 1) % size_ + 1) * 10 + step);
      default:
        return static_cast<float>(size_ * (size_ + 1) / 2);
    }
  }

  // Fills request i's input (and clears its output) and enqueues it.
  concord_status_t Enqueue(size_t i, int step, bool wrong_shape, Slot* slot) {
    const OpSpec& op = ops_[i];
    int64_t shape[2];
    const int ndim = ShapeOf(op, wrong_shape, shape);
    const int64_t elements = shape[0] * shape[1];
    for (int64_t e = 0; e < elements; ++e) in_[i][e] = InputValue(op, e, step);
    std::fill(out_[i].begin(), out_[i].end(), -1.0f);
    concord_tensor_t t = CpuTensor(in_[i].data(), CONCORD_FLOAT32, ndim, shape);
    void* out = out_[i].data();
    const size_t capacity = out_[i].size() * sizeof(float);
    concord_request_t* request = &slot->request;
    switch (op.kind) {
      case Kind::kAllreduce:
        return concord_allreduce_async(comm_, op.name, &t, nullptr, nullptr, OnComplete, slot,
                                       request);
      case Kind::kReducescatter: {
        int64_t share[2] = {shape[0] / size_, shape[1]};
        concord_tensor_t o = CpuTensor(out, CONCORD_FLOAT32, ndim, share);
        return concord_reducescatter_async(comm_, op.name, &t, &o, nullptr, OnComplete, slot,
                                           request);
      }
      case Kind::kAlltoall:
        return concord_alltoall_async(comm_, op.name, &t, out, capacity, nullptr, OnComplete, slot,
                                      request);
      case Kind::kAllgather:
        return concord_allgather_async(comm_, op.name, &t, out, capacity, OnComplete, slot,
                                       request);
      case Kind::kBroadcast:
        return concord_broadcast_async(comm_, op.name, &t, nullptr, 0, OnComplete, slot, request);
      case Kind::kSend:
        return concord_send_async(comm_, &t, (rank_ + 1) % size_, step, OnComplete, slot, request);
      case Kind::kRecv:
        t.data = out;
        return concord_recv_async(comm_, &t, (rank_ + size_ - 1) % size_, step, OnComplete, slot,
                                  request);
    }
    return CONCORD_ERR_INTERNAL;
  }

  // Whether request i's result holds what it must (every 97th element and the last).
  bool ResultIsRight(size_t i, int step) const {
    const OpSpec& op = ops_[i];
    if (op.kind == Kind::kSend) return true;
    const bool in_place = op.kind == Kind::kAllreduce || op.kind == Kind::kBroadcast;
    const std::vector<float>& result = in_place ? in_[i] : out_[i];
    const int64_t elements = in_place ? op.rows * op.cols : OutputElements(op);
    for (int64_t e = 0; e < elements; e += 97) {
      if (result[e] != ResultValue(op, e, step)) return false;
    }
    return result[elements - 1] == ResultValue(op, elements - 1, step);
  }

  // The faults that happen at enqueue are announced before it, so the line's time is the fault's.
  void Announce() {
    const std::string step = ",\"step\":" + std::to_string(o_.fault_step);
    if (o_.fault_class == "missing") {
      g_log.Emit("fault", step + ",\"detail\":\"grad.1 not submitted from this step on\"");
    } else if (o_.fault_class == "mismatch") {
      int64_t right[2], wrong[2];
      const int ndim = ShapeOf(ops_[1], false, right);
      ShapeOf(ops_[1], true, wrong);
      auto text = [ndim](const int64_t* s) {
        return "[" + std::to_string(s[0]) + (ndim == 2 ? ", " + std::to_string(s[1]) : "") + "]";
      };
      g_log.Emit("fault", step + ",\"detail\":\"grad.1 submitted with shape " + text(wrong) +
                              ", not " + text(right) + "\"");
    }
  }

  // The partition, once the step is enqueued (crash and stop: RaiseInCallback).
  void Inject() {
    if (o_.fault_class != "partition") return;
    const std::string step = ",\"step\":" + std::to_string(o_.fault_step);
    g_log.Emit("fault", step + ",\"detail\":\"asks for its link to be taken down\"");
    const double until = Now() + 10;
    struct stat st;
    while (::stat(o_.go_file.c_str(), &st) != 0 && Now() < until) ::usleep(1000);
    g_log.Emit("link_down_seen",
               step + ",\"go_file\":" + (::stat(o_.go_file.c_str(), &st) == 0 ? "true" : "false"));
  }

  int FinalizeEarly() {
    g_log.Emit("fault", ",\"step\":" + std::to_string(o_.fault_step) +
                            ",\"detail\":\"concord_finalize after step " +
                            std::to_string(o_.fault_step - 1) + ", the others go on\"");
    return FinalizeAndExit(0);
  }

  // Finalizes; `code` is the exit status unless the finalize fails (then 1).
  int FinalizeAndExit(int code) {
    const double t0 = Now();
    const concord_status_t s = concord_finalize(comm_);
    char seconds[48];
    std::snprintf(seconds, sizeof(seconds), ",\"seconds\":%.3f", Now() - t0);
    g_log.Emit("finalize",
               ",\"status\":" + JsonString(StatusName(s)) + ",\"message\":" +
                   JsonString(s == CONCORD_SUCCESS ? "" : concord_comm_last_error(nullptr)) +
                   seconds);
    if (s != CONCORD_SUCCESS) code = 1;
    g_log.Emit("exit", ",\"code\":" + std::to_string(code));
    return code;
  }

  const Options o_;
  concord_comm_t comm_;
  const int rank_;
  const int size_;
  const std::vector<OpSpec> ops_;
  std::vector<std::vector<float>> in_;   // each request's input (the result too, in place)
  std::vector<std::vector<float>> out_;  // and its output, where it has one of its own
  std::vector<std::string> enqueue_errors_;
  double step_began_ = 0;
  double fault_step_began_ = 0;
};

bool ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return false;
    const std::string v = argv[++i];
    if (a == "--class") {
      o->fault_class = v;
    } else if (a == "--ops") {
      o->ops = v;
    } else if (a == "--culprit") {
      o->culprit = std::atoi(v.c_str());
    } else if (a == "--steps") {
      o->steps = std::atoi(v.c_str());
    } else if (a == "--fault-step") {
      o->fault_step = std::atoi(v.c_str());
    } else if (a == "--go-file") {
      o->go_file = v;
    } else {
      return false;
    }
  }
  const std::string& c = o->fault_class;
  const bool known = c == "missing" || c == "mismatch" || c == "crash" || c == "stop" ||
                     c == "partition" || c == "uneven";
  return known && (o->ops == "allreduce" || o->ops == "mixed") && o->steps > o->fault_step &&
         o->fault_step >= 1 && (c != "partition" || !o->go_file.empty());
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!ParseArgs(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: %s --class missing|mismatch|crash|stop|partition|uneven\n"
                 "          [--ops allreduce|mixed] [--culprit R] [--steps N] [--fault-step S (1 "
                 "<= S < N)] [--go-file PATH "
                 "(partition)]\n",
                 argv[0]);
    return 2;
  }
  OpenEventsFile();
  concord_comm_t comm = nullptr;
  const concord_status_t s = concord_init(&comm);
  if (s != CONCORD_SUCCESS) {
    g_log.Emit("init_failed", ",\"status\":" + JsonString(StatusName(s)) +
                                  ",\"message\":" + JsonString(concord_comm_last_error(nullptr)));
    g_log.Emit("exit", ",\"code\":1");
    return 1;
  }
  int rank = 0, size = 1;
  concord_comm_rank(comm, &rank);
  concord_comm_size(comm, &size);
  g_log.SetRank(rank);
  g_signal_rank = rank;
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::signal(sig, OnTerminatingSignal);
  if (o.culprit < 0) o.culprit = size - 1;
  g_log.Emit("start", ",\"size\":" + std::to_string(size) + ",\"pid\":" +
                          std::to_string(::getpid()) + ",\"culprit\":" + std::to_string(o.culprit) +
                          ",\"class\":" + JsonString(o.fault_class));
  FaultRank job(o, comm, rank, size);
  return job.Run();
}
