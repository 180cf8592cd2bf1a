// Conformance of every collective across real processes, through the C API only.
//
// Run under concordrun with any number of ranks:
//   concordrun -np 4 ./mp_conformance [--min-size N] [--max-size N] [--steps S] [--ops LIST]
//                                     [--split] [--device cuda]
//
// Every op (allreduce sum/average/min/max/product, in place and out of place, with
// prescale/postscale on floating types; allgather with first dimensions differing by rank, into
// a caller buffer and into library-owned output, with size-0 contributions; broadcast from every
// root, in place and out of place; barrier; reducescatter and alltoall, with their error cases,
// in conformance_exchange.cc; reduce to a root, every op, in place and out of place, and gather
// to a root as allgather's variants, the roots in turn, other ranks' outputs checked untouched) x
// every dtype x sizes {0, 1, 7, 4099, 1<<20}, blocking and asynchronous (wait, test-polling,
// callbacks), grouped submission, several steps (so the response cache serves the repeated names).
// Each result is checked against a value computed here. Inputs are small integers, so results are
// exact (half types get a tolerance where the average divides). The edge values
// (conformance_edge.h: 8-bit sums and products that wrap, NaN and -0 in floating min and max, bit
// for bit) run once, at sizes 7 and 65537, on CPU tensors, when the run's sizes include 7. Prints
// one summary line; exits non-zero on any mismatch.
//
// --device cuda runs the same cases on CUDA tensors (the GPU backend: CONCORD_BACKEND=nccl): each
// case's buffers are copied to the rank's GPU before it is submitted and back once it completed,
// and checked as on the CPU. Outputs the request would own are refused for device tensors, so
// those variants give a device buffer instead (conformance_exchange.cc checks the refusals), and
// compression, which covers CPU tensors only, is left out.
//
// The failure modes live in failure_modes.cc.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "conformance_edge.h"
#include "conformance_exchange.h"
#include "device_memory.h"
#include "mp_common.h"
#include "tests/common/check.h"
#include "tests/common/tensors.h"

namespace {

using concord::harness::IsFloat;
using concord::harness::LoadElement;
using concord::harness::StoreElement;

int g_rank = 0, g_size = 1;
long g_checks = 0, g_cases = 0;
std::atomic<long> g_callbacks{0}, g_callback_errors{0};
long g_async_submitted = 0;
bool g_trace = std::getenv("CONFORMANCE_TRACE") != nullptr;  // print every submission
int g_device = CONCORD_DEVICE_CPU;  // where the tensors live (--device cuda: this rank's GPU)

using mp::kDTypes;
using mp::kOps;
const char* OpName(concord_reduce_op_t op) {
  switch (op) {
    case CONCORD_SUM:
      return "sum";
    case CONCORD_AVERAGE:
      return "avg";
    case CONCORD_MIN:
      return "min";
    case CONCORD_MAX:
      return "max";
    case CONCORD_PRODUCT:
      return "prod";
  }
  return "?";
}

enum class Values { kSum, kMinMax, kProduct, kAny };

// The name suffix of an allgather's or gather's output variant: the caller's buffer, or output the
// request owns, which device tensors cannot have: there the variant is a second buffer case.
const char* OutputVariant(bool owned_variant, bool owned) {
  return !owned_variant ? ".buf" : owned ? ".owned" : ".buf2";
}

// The input of rank r at index i: a small integer, exactly representable in every dtype.
double Val(Values kind, concord_dtype_t t, int r, int64_t i, int step, int salt) {
  const int64_t h = (i * 7 + r * 3 + step * 5 + salt * 11) & 0x7fffffff;
  const bool s = mp::IsSigned(t);
  switch (kind) {
    case Values::kSum:
      return s ? static_cast<double>(h % 5) - 2 : static_cast<double>(h % 5);
    case Values::kMinMax:
      return s ? static_cast<double>(h % 9) - 4 : static_cast<double>(h % 9);
    case Values::kProduct: {
      static const double kSigned[] = {-1, 1, 2};
      static const double kUnsigned[] = {1, 2};
      return s ? kSigned[h % 3] : kUnsigned[h % 2];
    }
    case Values::kAny:
      return s ? static_cast<double>(h % 101) - 50 : static_cast<double>(h % 101);
  }
  return 0;
}

enum class Kind { kAllreduce, kAllgather, kBroadcast, kBarrier, kReduce, kGather };
enum Mode { kAsyncWait = 0, kAsyncTest = 1, kBlocking = 2 };

void Callback(concord_request_t, concord_status_t status, void*) {
  if (status != CONCORD_SUCCESS) g_callback_errors.fetch_add(1);
  g_callbacks.fetch_add(1);
}

struct Case {
  std::string name;
  Kind kind = Kind::kAllreduce;
  concord_dtype_t dt = CONCORD_FLOAT32;
  int64_t n = 0;  // elements of this rank's input
  int step = 0, salt = 0;
  Mode mode = kAsyncWait;
  bool in_place = true;
  // allreduce
  concord_reduce_op_t op = CONCORD_SUM;
  double pre = 1, post = 1;
  // broadcast, reduce, gather
  int root = 0;
  // allgather: first dims of every rank, the trailing dimension
  std::vector<int64_t> first_dims;
  int64_t cols = 1;
  bool owned = false;
  size_t capacity = 0;
  int64_t shape[2] = {0, 0};
  int ndim = 1;
  std::vector<unsigned char> in, out;
  mp::DeviceBuffer device_in, device_out;  // --device cuda: the copies the operation works on
  concord_request_t req = nullptr;
  concord_status_t status = CONCORD_SUCCESS;

  Values values() const {
    if (kind != Kind::kAllreduce && kind != Kind::kReduce) return Values::kAny;
    if (op == CONCORD_MIN || op == CONCORD_MAX) return Values::kMinMax;
    if (op == CONCORD_PRODUCT) return Values::kProduct;
    return Values::kSum;
  }
  size_t bytes() const { return in.size() + out.size(); }
};

void Fill(Case& c) {
  const size_t es = ElementSize(c.dt);
  c.in.assign(static_cast<size_t>(c.n) * es, 0);
  for (int64_t i = 0; i < c.n; ++i) {
    StoreElement(c.dt, c.in.data(), i, Val(c.values(), c.dt, g_rank, i, c.step, c.salt));
  }
}

// Enqueues c (or runs it, when blocking).
void Submit(concord_comm_t comm, Case& c) {
  ++g_cases;
  if (g_trace)
    std::fprintf(stderr, "rank %d: submit %s (mode %d)\n", g_rank, c.name.c_str(), c.mode);
  void* in_data = mp::Place(c.in, g_device, &c.device_in);
  void* out_data = mp::Place(c.out, g_device, &c.device_out);
  concord_tensor_t in = CpuTensor(in_data, c.dt, c.ndim, c.shape);
  concord_tensor_t out = CpuTensor(out_data, c.dt, c.ndim, c.shape);
  in.device = out.device = g_device;
  const bool async = c.mode != kBlocking;
  concord_request_t* rq = async ? &c.req : nullptr;
  concord_callback_t cb = async ? Callback : nullptr;
  concord_status_t s = CONCORD_SUCCESS;
  switch (c.kind) {
    case Kind::kAllreduce: {
      concord_allreduce_opts_t o;
      concord_allreduce_opts_init(&o);
      o.op = c.op;
      o.prescale = c.pre;
      o.postscale = c.post;
      const concord_tensor_t* outp = c.in_place ? nullptr : &out;
      s = async ? concord_allreduce_async(comm, c.name.c_str(), &in, outp, &o, cb, nullptr, rq)
                : concord_allreduce(comm, c.name.c_str(), &in, outp, &o);
      break;
    }
    case Kind::kAllgather: {
      void* dst = c.owned ? nullptr : out_data;
      if (!c.owned && dst == nullptr) {
        // A zero-byte result into a caller buffer: give a valid (unused) pointer.
        static unsigned char dummy[8];
        dst = dummy;
      }
      s = async
              ? concord_allgather_async(comm, c.name.c_str(), &in, dst, c.capacity, cb, nullptr, rq)
              : concord_allgather(comm, c.name.c_str(), &in, dst, c.capacity);
      break;
    }
    case Kind::kBroadcast: {
      const concord_tensor_t* outp = c.in_place ? nullptr : &out;
      s = async ? concord_broadcast_async(comm, c.name.c_str(), &in, outp, c.root, cb, nullptr, rq)
                : concord_broadcast(comm, c.name.c_str(), &in, outp, c.root);
      break;
    }
    case Kind::kBarrier:
      s = async ? concord_barrier_async(comm, cb, nullptr, rq) : concord_barrier(comm);
      break;
    case Kind::kReduce: {
      concord_reduce_opts_t o;
      concord_reduce_opts_init(&o);
      o.op = c.op;
      o.prescale = c.pre;
      o.postscale = c.post;
      // Other ranks give their output too when out of place: it must stay untouched.
      const concord_tensor_t* outp = c.in_place ? nullptr : &out;
      s = async ? concord_reduce_async(comm, c.name.c_str(), &in, outp, c.root, &o, cb, nullptr, rq)
                : concord_reduce(comm, c.name.c_str(), &in, outp, c.root, &o);
      break;
    }
    case Kind::kGather: {
      // Only the root has an output (NULL elsewhere, or a buffer that must stay untouched).
      void* dst = c.owned ? nullptr : out_data;
      if (!c.owned && dst == nullptr) {
        static unsigned char dummy[8];
        dst = dummy;
      }
      if (g_rank != c.root && c.salt % 2 == 0) dst = nullptr;
      s = async ? concord_gather_async(comm, c.name.c_str(), &in, dst, c.capacity, c.root, cb,
                                       nullptr, rq)
                : concord_gather(comm, c.name.c_str(), &in, dst, c.capacity, c.root);
      break;
    }
  }
  if (async && s == CONCORD_SUCCESS) ++g_async_submitted;
  if (s != CONCORD_SUCCESS) {
    FAILF("%s: submit/run returned %s: %s", c.name.c_str(), concord_status_string(s),
          concord_comm_last_error(comm));
    c.req = nullptr;
  }
  c.status = s;
}

void CheckAllreduce(const Case& c) {
  const void* res = c.in_place ? c.in.data() : c.out.data();
  for (int64_t i = 0; i < c.n; ++i) {
    const double acc = concord::harness::ExpectedAllreduce(
        c.op, c.dt, g_size, [&](int r) { return Val(c.values(), c.dt, r, i, c.step, c.salt); },
        c.pre, c.post);
    const double got = LoadElement(c.dt, res, i);
    ++g_checks;
    if (!mp::Close(got, acc, c.dt)) {
      FAILF("%s [%lld]: got %.9g want %.9g", c.name.c_str(), static_cast<long long>(i), got, acc);
      return;
    }
  }
  if (!c.in_place) {  // the input of an out-of-place allreduce is left alone
    for (int64_t i = 0; i < c.n; ++i) {
      const double want = Val(c.values(), c.dt, g_rank, i, c.step, c.salt);
      if (LoadElement(c.dt, c.in.data(), i) != want) {
        FAILF("%s [%lld]: out-of-place input was modified", c.name.c_str(),
              static_cast<long long>(i));
        return;
      }
    }
  }
}

// A reduce: the root's result as an allreduce's; elsewhere the input and any output untouched.
void CheckReduce(const Case& c) {
  if (g_rank == c.root) {
    CheckAllreduce(c);
    return;
  }
  for (int64_t i = 0; i < c.n; ++i) {
    ++g_checks;
    if (LoadElement(c.dt, c.in.data(), i) != Val(c.values(), c.dt, g_rank, i, c.step, c.salt)) {
      FAILF("%s [%lld]: the input of a rank other than the root was modified", c.name.c_str(),
            static_cast<long long>(i));
      return;
    }
  }
  for (unsigned char b : c.out) {
    if (b != 0xAB) {
      FAILF("%s: the output of a rank other than the root was written", c.name.c_str());
      return;
    }
  }
}

void CheckBroadcast(const Case& c) {
  const void* res = c.in_place ? c.in.data() : c.out.data();
  for (int64_t i = 0; i < c.n; ++i) {
    const double want = Val(Values::kAny, c.dt, c.root, i, c.step, c.salt);
    ++g_checks;
    if (LoadElement(c.dt, res, i) != want) {
      FAILF("%s [%lld]: got %.9g want %.9g", c.name.c_str(), static_cast<long long>(i),
            LoadElement(c.dt, res, i), want);
      return;
    }
  }
}

void CheckAllgather(const Case& c) {
  void* data = nullptr;
  size_t bytes = 0;
  int64_t first = -1;
  const concord_status_t s =
      c.req ? concord_request_output(c.req, &data, &bytes, &first) : CONCORD_SUCCESS;
  if (s != CONCORD_SUCCESS) {
    FAILF("%s: concord_request_output: %s", c.name.c_str(), concord_status_string(s));
    return;
  }
  const size_t es = ElementSize(c.dt);
  int64_t want_first = 0;
  for (int64_t d : c.first_dims) want_first += d;
  const size_t want_bytes = static_cast<size_t>(want_first * c.cols) * es;
  if (c.req) {
    ++g_checks;
    if (first != want_first || bytes != want_bytes) {
      FAILF("%s: output first_dim %lld bytes %zu, want %lld and %zu", c.name.c_str(),
            static_cast<long long>(first), bytes, static_cast<long long>(want_first), want_bytes);
      return;
    }
    const void* buffer = g_device == CONCORD_DEVICE_CPU ? c.out.data() : c.device_out.data();
    if (!c.owned && want_bytes > 0 && data != buffer) {
      FAILF("%s: output data %p is not the caller's buffer %p", c.name.c_str(), data, buffer);
    }
    if (c.owned && want_bytes > 0 && data == nullptr) {
      FAILF("%s: library-owned output is NULL", c.name.c_str());
      return;
    }
  }
  // The caller's buffer, or its copy from the device.
  if (!c.req || g_device != CONCORD_DEVICE_CPU) data = const_cast<unsigned char*>(c.out.data());
  size_t k = 0;
  for (int r = 0; r < g_size; ++r) {
    const int64_t elems = c.first_dims[r] * c.cols;
    for (int64_t i = 0; i < elems; ++i, ++k) {
      const double want = Val(Values::kAny, c.dt, r, i, c.step, c.salt);
      ++g_checks;
      if (LoadElement(c.dt, data, k) != want) {
        FAILF("%s: block of rank %d [%lld]: got %.9g want %.9g", c.name.c_str(), r,
              static_cast<long long>(i), LoadElement(c.dt, data, k), want);
        return;
      }
    }
  }
}

// A gather: the root's result as an allgather's; elsewhere no output and the buffer untouched.
void CheckGather(const Case& c) {
  if (g_rank == c.root) {
    CheckAllgather(c);
    return;
  }
  void* data = nullptr;
  size_t bytes = 1;
  int64_t first = -1;
  ++g_checks;
  if (c.req && (concord_request_output(c.req, &data, &bytes, &first) != CONCORD_SUCCESS ||
                data != nullptr || bytes != 0 || first != 0)) {
    FAILF("%s: a rank other than the root has output (%p, %zu bytes, first dim %lld)",
          c.name.c_str(), data, bytes, static_cast<long long>(first));
  }
  for (unsigned char b : c.out) {
    if (b != 0xEE) {
      FAILF("%s: the output of a rank other than the root was written", c.name.c_str());
      return;
    }
  }
}

// Waits for every submitted request of the batch, checks every result, frees the requests.
void Finish(std::vector<std::unique_ptr<Case>>& batch) {
  for (auto& cp : batch) {
    Case& c = *cp;
    if (c.status != CONCORD_SUCCESS) continue;
    if (c.req) {
      concord_status_t s;
      if (c.mode == kAsyncTest) {
        const double until = mp::Now() + 120;
        while ((s = concord_test(c.req)) == CONCORD_IN_PROGRESS && mp::Now() < until) {
          // The poll interval of the test-polling mode under test, not an ordering.
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      } else {
        s = concord_wait(c.req, 120);
      }
      if (s != CONCORD_SUCCESS) {
        FAILF("%s: completed with %s: %s", c.name.c_str(), concord_status_string(s),
              concord_test(c.req) == CONCORD_IN_PROGRESS ? "(still running)"
                                                         : concord_request_error(c.req));
        concord_request_free(c.req);
        c.req = nullptr;
        continue;
      }
      if (concord_request_error(c.req)[0] != '\0') {
        FAILF("%s: success with error text '%s'", c.name.c_str(), concord_request_error(c.req));
      }
    }
    if (g_device != CONCORD_DEVICE_CPU) {
      c.device_in.CopyTo(&c.in);
      c.device_out.CopyTo(&c.out);
    }
    switch (c.kind) {
      case Kind::kAllreduce:
        CheckAllreduce(c);
        break;
      case Kind::kAllgather:
        CheckAllgather(c);
        break;
      case Kind::kBroadcast:
        CheckBroadcast(c);
        break;
      case Kind::kBarrier:
        break;
      case Kind::kReduce:
        CheckReduce(c);
        break;
      case Kind::kGather:
        CheckGather(c);
        break;
    }
    if (c.req) concord_request_free(c.req);
    c.req = nullptr;
  }
  batch.clear();
}

struct Runner {
  concord_comm_t comm;
  std::vector<std::unique_ptr<Case>> batch;
  size_t batch_bytes = 0;
  long counter = 0;
  size_t budget = 48u << 20;  // bytes of buffers held by one batch

  Mode NextMode(bool allow_blocking) {
    const long k = counter++;
    if (!allow_blocking) return (k % 2) ? kAsyncTest : kAsyncWait;
    return static_cast<Mode>(k % 3);
  }
  void Add(std::unique_ptr<Case> c) {
    if (batch_bytes + c->bytes() > budget && !batch.empty()) Flush();
    batch_bytes += c->bytes();
    Submit(comm, *c);
    batch.push_back(std::move(c));
  }
  void Flush() {
    Finish(batch);
    batch_bytes = 0;
  }
};

std::string Name(const char* what, concord_dtype_t dt, int64_t n, const std::string& rest) {
  return std::string(what) + "." + mp::DTypeName(dt) + ".n" + std::to_string(n) + "." + rest;
}

void AllreduceCases(Runner& run, concord_dtype_t dt, int64_t n, int step) {
  const bool fp = IsFloat(dt);
  for (concord_reduce_op_t op : kOps) {
    for (int place = 0; place < 2; ++place) {
      // Floating types: out-of-place variants are scaled; one in-place sum is scaled too.
      const bool scaled = fp && (place == 1 || op == CONCORD_SUM);
      for (int sv = 0; sv < (fp && place == 0 && op == CONCORD_SUM ? 2 : 1); ++sv) {
        const bool sc = scaled && (place == 1 || sv == 1);
        auto c = std::make_unique<Case>();
        c->kind = Kind::kAllreduce;
        c->dt = dt;
        c->n = n;
        c->step = step;
        c->salt = static_cast<int>(op) * 3 + place;
        c->op = op;
        c->in_place = place == 0;
        if (sc) {
          c->pre = 0.5;
          c->post = 4.0;
        }
        c->mode = run.NextMode(true);
        c->ndim = 1;
        c->shape[0] = n;
        c->name = Name("ar", dt, n,
                       std::string(OpName(op)) + (place ? ".out" : ".in") + (sc ? ".scaled" : ""));
        Fill(*c);
        if (!c->in_place) c->out.assign(c->in.size(), 0xAB);
        run.Add(std::move(c));
      }
    }
  }
}

void BroadcastCases(Runner& run, concord_dtype_t dt, int64_t n, int step, bool all_roots) {
  for (int root = 0; root < g_size; ++root) {
    if (!all_roots && root != 0 && root != g_size - 1) continue;
    for (int place = 0; place < 2; ++place) {
      auto c = std::make_unique<Case>();
      c->kind = Kind::kBroadcast;
      c->dt = dt;
      c->n = n;
      c->step = step;
      c->salt = 40 + place;
      c->root = root;
      c->in_place = place == 0;
      c->mode = run.NextMode(true);
      c->ndim = 1;
      c->shape[0] = n;
      c->name = Name("bc", dt, n, "root" + std::to_string(root) + (place ? ".out" : ".in"));
      const size_t es = ElementSize(dt);
      c->in.assign(static_cast<size_t>(n) * es, 0);
      // The root sends its values; the others' inputs hold values the result must replace.
      for (int64_t i = 0; i < n; ++i) {
        const double v = g_rank == root ? Val(Values::kAny, dt, root, i, step, c->salt)
                                        : Val(Values::kAny, dt, root, i, step, c->salt + 7) + 1;
        StoreElement(dt, c->in.data(), i, v);
      }
      if (!c->in_place) c->out.assign(c->in.size(), 0xCD);
      run.Add(std::move(c));
    }
  }
}

// variant 0: first dim n + rank; 1: ranks alternate 0 and n rows (size-0 contributions);
// 2: two dimensions [rank, 3] (rank 0 gives none).
void AllgatherCases(Runner& run, concord_dtype_t dt, int64_t n, int step, bool large) {
  for (int variant = 0; variant < 3; ++variant) {
    if (large && variant != 0) continue;
    for (int owned = 0; owned < 2; ++owned) {
      auto c = std::make_unique<Case>();
      c->kind = Kind::kAllgather;
      c->dt = dt;
      c->step = step;
      c->salt = 50 + variant;
      c->owned = owned == 1 && g_device == CONCORD_DEVICE_CPU;
      c->mode = run.NextMode(!c->owned);  // a blocking call cannot hand back owned output
      c->first_dims.resize(g_size);
      for (int r = 0; r < g_size; ++r) {
        c->first_dims[r] = variant == 0   ? (n == 0 ? 0 : n + r)
                           : variant == 1 ? (r % 2 == 0 ? 0 : n)
                                          : r;
      }
      c->cols = variant == 2 ? 3 : 1;
      c->ndim = variant == 2 ? 2 : 1;
      c->shape[0] = c->first_dims[g_rank];
      c->shape[1] = c->cols;
      c->n = c->first_dims[g_rank] * c->cols;
      c->name =
          Name("ag", dt, n, "v" + std::to_string(variant) + OutputVariant(owned == 1, c->owned));
      Fill(*c);
      if (!c->owned) {
        int64_t total = 0;
        for (int64_t d : c->first_dims) total += d;
        // Exact capacity, or a little more on some variants.
        c->capacity =
            static_cast<size_t>(total * c->cols) * ElementSize(dt) + (variant == 1 ? 16 : 0);
        c->out.assign(c->capacity, 0xEE);
      }
      run.Add(std::move(c));
    }
  }
}

// Every op in place and out of place (scaled on floating types, out of place), to a root that
// moves with the op; the large size runs sum and max only.
void ReduceCases(Runner& run, concord_dtype_t dt, int64_t n, int step, bool large) {
  for (concord_reduce_op_t op : kOps) {
    if (large && op != CONCORD_SUM && op != CONCORD_MAX) continue;
    for (int place = 0; place < 2; ++place) {
      auto c = std::make_unique<Case>();
      c->kind = Kind::kReduce;
      c->dt = dt;
      c->n = n;
      c->step = step;
      c->salt = 70 + static_cast<int>(op) * 3 + place;
      c->op = op;
      c->root = (static_cast<int>(op) + place + step) % g_size;
      c->in_place = place == 0;
      if (IsFloat(dt) && place == 1) {
        c->pre = 0.5;
        c->post = 4.0;
      }
      c->mode = run.NextMode(true);
      c->ndim = 1;
      c->shape[0] = n;
      c->name = Name(
          "rd", dt, n,
          std::string(OpName(op)) + ".root" + std::to_string(c->root) + (place ? ".out" : ".in"));
      Fill(*c);
      if (!c->in_place) c->out.assign(c->in.size(), 0xAB);
      run.Add(std::move(c));
    }
  }
}

// Allgather's variants (first dims n + rank; alternating 0 and n; [rank, 3]), to every root in
// turn (the large size: variant 0 to the last rank), into the root's buffer or the request.
void GatherCases(Runner& run, concord_dtype_t dt, int64_t n, int step, bool large) {
  for (int variant = 0; variant < 3; ++variant) {
    if (large && variant != 0) continue;
    for (int owned = 0; owned < 2; ++owned) {
      auto c = std::make_unique<Case>();
      c->kind = Kind::kGather;
      c->dt = dt;
      c->step = step;
      c->salt = 90 + variant * 2 + owned;
      c->root = large ? g_size - 1 : (variant + owned + step) % g_size;
      c->owned = owned == 1 && g_device == CONCORD_DEVICE_CPU;
      c->mode = run.NextMode(!c->owned || g_rank != c->root);
      c->first_dims.resize(g_size);
      for (int r = 0; r < g_size; ++r) {
        c->first_dims[r] = variant == 0   ? (n == 0 ? 0 : n + r)
                           : variant == 1 ? (r % 2 == 0 ? 0 : n)
                                          : r;
      }
      c->cols = variant == 2 ? 3 : 1;
      c->ndim = variant == 2 ? 2 : 1;
      c->shape[0] = c->first_dims[g_rank];
      c->shape[1] = c->cols;
      c->n = c->first_dims[g_rank] * c->cols;
      c->name = Name("ga", dt, n,
                     "v" + std::to_string(variant) + ".root" + std::to_string(c->root) +
                         OutputVariant(owned == 1, c->owned));
      Fill(*c);
      if (!c->owned) {
        int64_t total = 0;
        for (int64_t d : c->first_dims) total += d;
        c->capacity =
            static_cast<size_t>(total * c->cols) * ElementSize(dt) + (variant == 1 ? 16 : 0);
        c->out.assign(c->capacity, 0xEE);
      }
      run.Add(std::move(c));
    }
  }
}

void BarrierCase(Runner& run, bool blocking) {
  auto c = std::make_unique<Case>();
  c->kind = Kind::kBarrier;
  c->mode = blocking ? kBlocking : kAsyncWait;
  c->name = "barrier";
  run.Add(std::move(c));
}

// Many tensors of several dtypes and ops in one group: enqueued atomically, fused where possible.
void GroupCases(Runner& run, int step) {
  if (concord_group_start(run.comm) != CONCORD_SUCCESS) {
    FAILF("group_start: %s", concord_comm_last_error(run.comm));
    return;
  }
  std::vector<std::unique_ptr<Case>> cases;
  for (int k = 0; k < 48; ++k) {
    auto c = std::make_unique<Case>();
    c->dt = kDTypes[k % 8];
    c->n = 1 + (k * 37) % 300;
    c->step = step;
    c->salt = 60 + k;
    c->mode = (k % 2) ? kAsyncTest : kAsyncWait;
    c->ndim = 1;
    c->shape[0] = c->n;
    if (k % 12 == 5) {
      c->kind = Kind::kBroadcast;
      c->root = k % g_size;
      c->name = "grp.bc." + std::to_string(k);
      c->in.assign(static_cast<size_t>(c->n) * ElementSize(c->dt), 0);
      for (int64_t i = 0; i < c->n; ++i) {
        const double v = Val(Values::kAny, c->dt, c->root, i, step, c->salt) + (g_rank != c->root);
        StoreElement(c->dt, c->in.data(), i, v);
      }
    } else if (k % 12 == 7) {
      c->kind = Kind::kAllgather;
      c->owned = g_device == CONCORD_DEVICE_CPU;
      c->first_dims.resize(g_size);
      int64_t total = 0;
      for (int r = 0; r < g_size; ++r) {
        c->first_dims[r] = (c->n + r) % 5;
        total += c->first_dims[r];
      }
      c->n = c->first_dims[g_rank];
      c->shape[0] = c->n;
      c->name = "grp.ag." + std::to_string(k);
      Fill(*c);
      if (!c->owned) {
        c->capacity = static_cast<size_t>(total) * ElementSize(c->dt);
        c->out.assign(c->capacity, 0xEE);
      }
    } else {
      c->kind = Kind::kAllreduce;
      c->op = (k % 3 == 0) ? CONCORD_SUM : (k % 3 == 1 ? CONCORD_MAX : CONCORD_AVERAGE);
      c->in_place = (k % 4) != 1;
      c->name = "grp.ar." + std::to_string(k);
      Fill(*c);
      if (!c->in_place) c->out.assign(c->in.size(), 0);
    }
    Submit(run.comm, *c);
    cases.push_back(std::move(c));
  }
  if (concord_group_end(run.comm) != CONCORD_SUCCESS) {
    FAILF("group_end: %s", concord_comm_last_error(run.comm));
  }
  Finish(cases);
}

bool Has(const std::string& list, const char* item) {
  return ("," + list + ",").find("," + std::string(item) + ",") != std::string::npos;
}

int Run(int argc, char** argv) {
  int64_t min_size = 0, max_size = int64_t{1} << 20;
  int steps = 3;
  // Which families to run (for narrowing down a failure); x: reducescatter and alltoall; edge:
  // the edge values (conformance_edge.h).
  std::string ops = "ar,bc,ag,grp,x,rd,ga,edge";
  bool split = false;   // run on sub-communicators of the job (concord_comm_split)
  bool device = false;  // CUDA tensors
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--min-size" && i + 1 < argc) {
      min_size = std::atoll(argv[++i]);
    } else if (a == "--max-size" && i + 1 < argc) {
      max_size = std::atoll(argv[++i]);
    } else if (a == "--ops" && i + 1 < argc) {
      ops = argv[++i];
    } else if (a == "--steps" && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else if (a == "--split") {
      split = true;
    } else if (a == "--device" && i + 1 < argc && std::string(argv[i + 1]) == "cuda") {
      ++i;
      device = true;
    } else if ((a == "--hosts" || a == "--hosts-interleaved") && i + 1 < argc) {
      // Pretend the ranks run on K hosts (CONCORD_HOST_ID), so that the hierarchical backend runs
      // (its local levels share this machine's memory): consecutive ranks on one host, or
      // interleaved (rank r on host r % K: a host's ranks are not consecutive).
      const bool interleaved = a == "--hosts-interleaved";
      const int hosts = std::atoi(argv[++i]);
      const char* r = std::getenv("CONCORD_RANK");
      const char* n = std::getenv("CONCORD_SIZE");
      if (hosts < 1 || r == nullptr || n == nullptr) {
        std::fprintf(stderr, "%s needs K >= 1 and CONCORD_RANK, CONCORD_SIZE (concordrun)\n",
                     a.c_str());
        return 2;
      }
      const int host = interleaved ? std::atoi(r) % hosts : std::atoi(r) * hosts / std::atoi(n);
      setenv("CONCORD_HOST_ID", ("conformance-host-" + std::to_string(host)).c_str(), 1);
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--min-size N] [--max-size N] [--steps S] [--ops ar,bc,ag,grp,x,rd,ga,edge] "
          "[--split] [--hosts K | --hosts-interleaved K] [--device cuda]\n",
          argv[0]);
      return 2;
    }
  }
  const double t0 = mp::Now();
  if (device) g_device = mp::DeviceOrExit();  // before init (see DeviceOrExit)
  concord_comm_t comm = nullptr;
  concord_status_t s = concord_init(&comm);
  if (s != CONCORD_SUCCESS) {
    std::fprintf(stderr, "concord_init: %s: %s\n", concord_status_string(s),
                 concord_comm_last_error(nullptr));
    return 1;
  }
  concord_comm_t parent = nullptr;
  if (split) {
    // The suite runs on sub-communicators: ranks of one parity form one (two of them side by
    // side from 3 ranks up), in reverse order of their parent ranks.
    int rank = 0, size = 1;
    concord_comm_rank(comm, &rank);
    concord_comm_size(comm, &size);
    parent = comm;
    comm = nullptr;
    s = concord_comm_split(parent, size >= 3 ? rank % 2 : 0, size - rank, &comm);
    if (s != CONCORD_SUCCESS || comm == nullptr) {
      std::fprintf(stderr, "rank %d: concord_comm_split: %s: %s\n", rank, concord_status_string(s),
                   concord_comm_last_error(parent));
      return 1;
    }
  }
  concord_comm_rank(comm, &g_rank);
  concord_comm_size(comm, &g_size);
  CheckSetContext("rank %d", g_rank);
  Runner run;
  run.comm = comm;
  mp_exchange::Counts exchange, edge;
  const int64_t kSizes[] = {0, 1, 7, 4099, int64_t{1} << 20};
  for (int step = 0; step < steps; ++step) {
    for (int64_t n : kSizes) {
      if (n < min_size || n > max_size) continue;
      const bool large = n >= (int64_t{1} << 20);
      if (large && step > 0) continue;  // the large size once: it is about bytes, not the cache
      for (concord_dtype_t dt : kDTypes) {
        if (!Has(ops, "ar")) break;
        AllreduceCases(run, dt, n, step);
        if (large) run.Flush();  // keep the large size's memory bounded
      }
      for (concord_dtype_t dt : kDTypes) {
        if (Has(ops, "bc")) BroadcastCases(run, dt, n, step, !large);
      }
      if (large) run.Flush();
      for (concord_dtype_t dt : kDTypes) {
        if (Has(ops, "ag")) AllgatherCases(run, dt, n, step, large);
      }
      if (large) run.Flush();
      for (concord_dtype_t dt : kDTypes) {
        if (Has(ops, "rd")) ReduceCases(run, dt, n, step, large);
        if (large) run.Flush();
      }
      for (concord_dtype_t dt : kDTypes) {
        if (Has(ops, "ga")) GatherCases(run, dt, n, step, large);
      }
      BarrierCase(run, false);
      run.Flush();
      if (Has(ops, "x")) {
        mp_exchange::RunCases(comm, g_rank, g_size, g_device, n, step, large, &exchange);
      }
      // Once, with the small sizes: 7 elements (inline) and 65537 (every dtype past the inline
      // threshold, float64 past the direct one).
      if (Has(ops, "edge") && step == 0 && n == 7 && g_device == CONCORD_DEVICE_CPU) {
        for (int64_t edge_n : {int64_t{7}, int64_t{65537}}) {
          mp_edge::RunCases(comm, g_rank, g_size, edge_n, &edge);
        }
      }
    }
    if (Has(ops, "x") && step == 0) {
      mp_exchange::RunErrorCases(comm, g_rank, g_size, g_device, &exchange);
    }
    if (Has(ops, "grp")) GroupCases(run, step);
    BarrierCase(run, true);
    run.Flush();
  }
  // Every asynchronous request ran its callback exactly once, before its wait returned.
  if (g_callbacks.load() != g_async_submitted) {
    FAILF("%ld callbacks for %ld asynchronous requests", g_callbacks.load(), g_async_submitted);
  }
  if (g_callback_errors.load() != 0) FAILF("%ld callbacks saw an error", g_callback_errors.load());
  s = concord_finalize(comm);
  if (s != CONCORD_SUCCESS) FAILF("finalize: %s", concord_status_string(s));
  if (parent != nullptr) {
    s = concord_finalize(parent);
    if (s != CONCORD_SUCCESS) FAILF("finalize the parent: %s", concord_status_string(s));
  }
  g_cases += exchange.cases + edge.cases;
  g_checks += exchange.checks + edge.checks;
  const int failures = CheckFailures() + exchange.failures + edge.failures;
  std::printf(
      "conformance: rank %d of %d: %ld cases, %ld checks, %ld async callbacks, %d failures, "
      "%.2f s: %s\n",
      g_rank, g_size, g_cases, g_checks, g_callbacks.load(), failures, mp::Now() - t0,
      failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return Run(argc, argv);
}
