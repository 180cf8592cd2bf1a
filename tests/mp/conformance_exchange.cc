#include "conformance_exchange.h"

#include <atomic>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "device_memory.h"
#include "mp_common.h"
#include "tests/common/check.h"
#include "tests/common/tensors.h"

namespace mp_exchange {
namespace {

using concord::harness::IsFloat;
using concord::harness::LoadElement;
using concord::harness::StoreElement;

using mp::kDTypes;
using mp::kOps;

// Rank r's input at element i: a small integer, exact in every dtype, whose reduction over four
// ranks is exact too (the values conformance.cc uses for the same ops).
double Val(concord_reduce_op_t op, bool reduce, concord_dtype_t t, int r, int64_t i, int step,
           int salt) {
  const int64_t h = (i * 7 + r * 3 + step * 5 + salt * 11) & 0x7fffffff;
  const bool s = mp::IsSigned(t);
  if (!reduce) return s ? static_cast<double>(h % 101) - 50 : static_cast<double>(h % 101);
  if (op == CONCORD_MIN || op == CONCORD_MAX) {
    return s ? static_cast<double>(h % 9) - 4 : static_cast<double>(h % 9);
  }
  if (op == CONCORD_PRODUCT) return s ? (h % 3 == 0 ? -1.0 : h % 3 == 1 ? 1.0 : 2.0) : 1.0 + h % 2;
  return s ? static_cast<double>(h % 5) - 2 : static_cast<double>(h % 5);
}

enum Mode { kWait = 0, kCallback = 1, kBlocking = 2 };

std::atomic<long> g_callbacks{0};
long g_callback_submitted = 0;
void Callback(concord_request_t, concord_status_t, void*) {
  g_callbacks.fetch_add(1);
}

struct Case {
  std::string name;
  bool alltoall = false;
  concord_dtype_t dt = CONCORD_FLOAT32;
  concord_reduce_op_t op = CONCORD_SUM;
  double pre = 1, post = 1;
  int step = 0, salt = 0;
  Mode mode = kWait;
  int64_t cols = 1;
  int ndim = 1;
  // reducescatter: the splits every rank gives (empty: the even split); alltoall: rows[s][d],
  // what rank s sends to rank d (sent as explicit splits unless `even`).
  std::vector<int64_t> splits;
  std::vector<std::vector<int64_t>> rows;
  bool even = false;
  bool owned = false;
  std::string compression;  // reducescatter: "fp16" or "bf16", empty for none
  bool inplace = false;     // the output is the start of the input buffer (alltoall: the buffer)
  int64_t in_shape[2] = {0, 0}, out_shape[2] = {0, 0};
  std::vector<unsigned char> in, out;
  mp::DeviceBuffer device_in, device_out;  // on a CUDA device: the copies the operation works on
  std::vector<int64_t> received;           // blocking alltoall's received splits
  concord_request_t req = nullptr;
  bool submitted = false;
};

std::vector<int64_t> EvenSplit(int64_t n, int size) {
  std::vector<int64_t> s(size);
  for (int k = 0; k < size; ++k) s[k] = n / size + (k < n % size ? 1 : 0);
  return s;
}

// Rank k gets about (k + 1) shares of n rows (the last rank the rest).
std::vector<int64_t> WeightedSplit(int64_t n, int size) {
  const int64_t shares = static_cast<int64_t>(size) * (size + 1) / 2;
  std::vector<int64_t> s;
  int64_t left = n;
  for (int k = 0; k < size; ++k) {
    s.push_back(k == size - 1 ? left : n * (k + 1) / shares);
    left -= s.back();
  }
  return s;
}

void Submit(concord_comm_t comm, Case& c, int rank, int size, int device, Counts* counts) {
  ++counts->cases;
  const bool async = c.mode != kBlocking;
  concord_callback_t cb = c.mode == kCallback ? Callback : nullptr;
  void* in_data = mp::Place(c.in, device, &c.device_in);
  void* out_data = mp::Place(c.out, device, &c.device_out);
  concord_tensor_t in = CpuTensor(in_data, c.dt, c.ndim, c.in_shape);
  in.device = device;
  concord_status_t s;
  if (!c.alltoall) {
    concord_reducescatter_opts_t o;
    concord_reducescatter_opts_init(&o);
    o.op = c.op;
    o.prescale = c.pre;
    o.postscale = c.post;
    if (!c.compression.empty()) o.compression = c.compression.c_str();
    if (!c.splits.empty()) {
      o.recv_splits = c.splits.data();
      o.nsplits = size;
    }
    concord_tensor_t out = CpuTensor(c.inplace ? in_data : out_data, c.dt, c.ndim, c.out_shape);
    out.device = device;
    s = async
            ? concord_reducescatter_async(comm, c.name.c_str(), &in, &out, &o, cb, nullptr, &c.req)
            : concord_reducescatter(comm, c.name.c_str(), &in, &out, &o);
  } else {
    concord_alltoall_opts_t o;
    concord_alltoall_opts_init(&o);
    if (!c.even) {
      o.splits = c.rows[rank].data();
      o.nsplits = size;
    }
    // A zero-byte result into a caller buffer: give a valid (unused) pointer.
    static unsigned char dummy[8];
    void* target = c.inplace ? in_data : out_data;
    void* dst = c.owned ? nullptr : (target == nullptr ? dummy : target);
    const size_t capacity = c.inplace ? c.in.size() : c.out.size();
    if (async) {
      s = concord_alltoall_async(comm, c.name.c_str(), &in, dst, capacity, &o, cb, nullptr, &c.req);
    } else {
      c.received.assign(size, -1);
      s = concord_alltoall(comm, c.name.c_str(), &in, dst, capacity, &o, c.received.data(), size);
    }
  }
  c.submitted = s == CONCORD_SUCCESS;
  if (c.submitted && c.mode == kCallback) ++g_callback_submitted;
  if (s != CONCORD_SUCCESS) {
    FAILF("%s: submit/run returned %s: %s", c.name.c_str(), concord_status_string(s),
          concord_comm_last_error(comm));
  }
}

void CheckReducescatter(const Case& c, int rank, int size, Counts* counts) {
  const std::vector<int64_t> splits = c.splits.empty() ? EvenSplit(c.in_shape[0], size) : c.splits;
  int64_t first = 0;
  for (int k = 0; k < rank; ++k) first += splits[k];
  const int64_t n = splits[rank] * c.cols;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = first * c.cols + i;
    const double want = concord::harness::ExpectedAllreduce(
        c.op, c.dt, size, [&](int r) { return Val(c.op, true, c.dt, r, g, c.step, c.salt); }, c.pre,
        c.post);
    const double got = LoadElement(c.dt, c.inplace ? c.in.data() : c.out.data(), i);
    ++counts->checks;
    // Compressed: reduced in 16 bits, results of magnitude up to 16 (fp16 rounds within 2^-11
    // relative per step, bf16 2^-8); a misplaced block is off by 0.5 or more.
    const double tol = c.compression == "fp16" ? 0.02 : 0.25;
    if (c.compression.empty() ? !mp::Close(got, want, c.dt) : std::fabs(got - want) > tol) {
      FAILF("%s [%lld]: got %.9g want %.9g", c.name.c_str(), static_cast<long long>(i), got, want);
      return;
    }
  }
}

void CheckAlltoall(const Case& c, int rank, int size, int device, Counts* counts) {
  const void* data = c.inplace ? c.in.data() : c.out.data();
  std::vector<int64_t> received = c.received;
  int64_t want_rows = 0;
  for (int s = 0; s < size; ++s) want_rows += c.rows[s][rank];
  const size_t want_bytes = static_cast<size_t>(want_rows * c.cols) * ElementSize(c.dt);
  if (c.req != nullptr) {
    void* got = nullptr;
    size_t bytes = 0;
    int64_t first = -1;
    received.assign(size, -1);
    if (concord_request_output(c.req, &got, &bytes, &first) != CONCORD_SUCCESS ||
        concord_request_received_splits(c.req, received.data(), size) != CONCORD_SUCCESS) {
      FAILF("%s: output or received splits refused: %s", c.name.c_str(),
            concord_request_error(c.req));
      return;
    }
    ++counts->checks;
    if (bytes != want_bytes || first != want_rows) {
      FAILF("%s: output of %zu bytes and %lld rows, want %zu and %lld", c.name.c_str(), bytes,
            static_cast<long long>(first), want_bytes, static_cast<long long>(want_rows));
      return;
    }
    const void* buffer = device != CONCORD_DEVICE_CPU ? c.device_out.data()
                         : c.inplace                  ? c.in.data()
                                                      : c.out.data();
    if (!c.owned && want_bytes > 0 && got != buffer) {
      FAILF("%s: output is not the caller's buffer", c.name.c_str());
    }
    if (device == CONCORD_DEVICE_CPU) data = got;  // else the buffer's copy from the device
  }
  size_t k = 0;
  for (int s = 0; s < size; ++s) {
    ++counts->checks;
    if (received[s] != c.rows[s][rank]) {
      FAILF("%s: received %lld rows from rank %d, want %lld", c.name.c_str(),
            static_cast<long long>(received[s]), s, static_cast<long long>(c.rows[s][rank]));
      return;
    }
    int64_t offset = 0;  // where rank s's rows for this rank start in its input
    for (int d = 0; d < rank; ++d) offset += c.rows[s][d];
    for (int64_t j = 0; j < c.rows[s][rank] * c.cols; ++j, ++k) {
      const double want = Val(CONCORD_SUM, false, c.dt, s, offset * c.cols + j, c.step, c.salt);
      ++counts->checks;
      if (LoadElement(c.dt, data, k) != want) {
        FAILF("%s: from rank %d [%lld]: got %.9g want %.9g", c.name.c_str(), s,
              static_cast<long long>(j), LoadElement(c.dt, data, k), want);
        return;
      }
    }
  }
}

void Finish(std::vector<std::unique_ptr<Case>>& batch, int rank, int size, int device,
            Counts* counts) {
  for (auto& cp : batch) {
    Case& c = *cp;
    if (!c.submitted) continue;
    if (c.req != nullptr) {
      const concord_status_t s = concord_wait(c.req, 120);
      if (s != CONCORD_SUCCESS) {
        FAILF("%s: completed with %s: %s", c.name.c_str(), concord_status_string(s),
              concord_request_error(c.req));
        concord_request_free(c.req);
        continue;
      }
    }
    if (device != CONCORD_DEVICE_CPU) {
      c.device_in.CopyTo(&c.in);
      c.device_out.CopyTo(&c.out);
    }
    if (c.alltoall) {
      CheckAlltoall(c, rank, size, device, counts);
    } else {
      CheckReducescatter(c, rank, size, counts);
    }
    if (c.req != nullptr) concord_request_free(c.req);
  }
  batch.clear();
}

std::string Name(const char* what, concord_dtype_t dt, int64_t n, const std::string& rest) {
  return std::string(what) + "." + mp::DTypeName(dt) + ".n" + std::to_string(n) + "." + rest;
}

const char* OpName(concord_reduce_op_t op) {
  static const char* const kNames[] = {"sum", "avg", "min", "max", "prod"};
  return kNames[op];
}

}  // namespace

void RunCases(concord_comm_t comm, int rank, int size, int device, int64_t n, int step, bool large,
              Counts* counts) {
  CheckSetContext("rank %d", rank);
  long mode = 0;
  for (concord_dtype_t dt : kDTypes) {
    std::vector<std::unique_ptr<Case>> batch;
    const size_t es = ElementSize(dt);
    // Reducescatter: every op over the even split; a weighted split (rank k gets k + 1 shares)
    // of [n, 3] for the sum; floating sums and averages scaled.
    for (concord_reduce_op_t op : kOps) {
      // The large size is about bytes (the ring's segments, MPI's pieces): sum and max only.
      if (large && op != CONCORD_SUM && op != CONCORD_MAX) continue;
      for (int variant = 0; variant < (large || op != CONCORD_SUM ? 1 : 2); ++variant) {
        auto c = std::make_unique<Case>();
        c->dt = dt;
        c->op = op;
        c->step = step;
        c->salt = static_cast<int>(op) * 2 + variant;
        c->mode = static_cast<Mode>(mode++ % 3);
        c->cols = variant == 1 ? 3 : 1;
        c->ndim = variant == 1 ? 2 : 1;
        const bool scaled = IsFloat(dt) && (op == CONCORD_SUM || op == CONCORD_AVERAGE);
        if (scaled) {
          c->pre = 0.5;
          c->post = 4.0;
        }
        if (variant == 1) c->splits = WeightedSplit(n, size);
        const std::vector<int64_t> splits = c->splits.empty() ? EvenSplit(n, size) : c->splits;
        c->in_shape[0] = n;
        c->in_shape[1] = c->cols;
        c->out_shape[0] = splits[rank];
        c->out_shape[1] = c->cols;
        c->name = Name("rs", dt, n,
                       std::string(OpName(op)) + (variant ? ".weighted" : ".even") +
                           (scaled ? ".scaled" : ""));
        c->in.assign(static_cast<size_t>(n * c->cols) * es, 0);
        for (int64_t i = 0; i < n * c->cols; ++i) {
          StoreElement(dt, c->in.data(), i, Val(op, true, dt, rank, i, step, c->salt));
        }
        c->out.assign(static_cast<size_t>(splits[rank] * c->cols) * es, 0xAB);
        Submit(comm, *c, rank, size, device, counts);
        batch.push_back(std::move(c));
      }
    }
    // In place (float32, and uint8 but at the large size): the output is the start of the input
    // buffer; alone (at the large size) the engine copies the input first, fused it packs it.
    if (dt == CONCORD_FLOAT32 || (dt == CONCORD_UINT8 && !large)) {
      auto c = std::make_unique<Case>();
      c->dt = dt;
      c->inplace = true;
      c->step = step;
      c->salt = 40;
      c->mode = static_cast<Mode>(mode++ % 3);
      c->in_shape[0] = n;
      c->out_shape[0] = EvenSplit(n, size)[rank];
      c->name = Name("rs", dt, n, "sum.inplace");
      c->in.assign(static_cast<size_t>(n) * es, 0);
      for (int64_t i = 0; i < n; ++i) {
        StoreElement(dt, c->in.data(), i, Val(c->op, true, dt, rank, i, step, c->salt));
      }
      Submit(comm, *c, rank, size, device, counts);
      batch.push_back(std::move(c));
    }
    // Compressed reducescatters of the floating types that take them: fp16 of a weighted split,
    // scaled, and a bf16 average of the even split (not at the large size: the packed path is
    // size-independent, and the 16-bit ring is the float16 cases').
    const bool compressible =
        !large && device == CONCORD_DEVICE_CPU && (dt == CONCORD_FLOAT32 || dt == CONCORD_FLOAT64);
    for (int variant = 0; variant < 2 && compressible; ++variant) {
      auto c = std::make_unique<Case>();
      c->dt = dt;
      c->op = variant == 0 ? CONCORD_SUM : CONCORD_AVERAGE;
      c->compression = variant == 0 ? "fp16" : "bf16";
      c->step = step;
      c->salt = 30 + variant;
      c->mode = static_cast<Mode>(mode++ % 3);
      if (variant == 0) {
        c->pre = 0.5;
        c->post = 4.0;
        c->splits = WeightedSplit(n, size);
      }
      const std::vector<int64_t> splits = c->splits.empty() ? EvenSplit(n, size) : c->splits;
      c->in_shape[0] = n;
      c->out_shape[0] = splits[rank];
      c->name = Name("rs", dt, n, std::string(OpName(c->op)) + "." + c->compression);
      c->in.assign(static_cast<size_t>(n) * es, 0);
      for (int64_t i = 0; i < n; ++i) {
        StoreElement(dt, c->in.data(), i, Val(c->op, true, dt, rank, i, step, c->salt));
      }
      c->out.assign(static_cast<size_t>(splits[rank]) * es, 0xAB);
      Submit(comm, *c, rank, size, device, counts);
      batch.push_back(std::move(c));
    }
    // Alltoall: the even split (n rows to each rank; large: n in all, split as evenly as may
    // be), and an uneven one of [rows, 2] where rank s sends (n + 3s + 5d + step) % (n + 1) rows
    // to rank d, into the caller's buffer and into library-owned output.
    for (int variant = 0; variant < (large ? 1 : 3); ++variant) {
      auto c = std::make_unique<Case>();
      c->alltoall = true;
      c->dt = dt;
      c->step = step;
      c->salt = 20 + variant;
      c->owned = variant == 2 && device == CONCORD_DEVICE_CPU;
      c->mode = static_cast<Mode>(mode++ % (c->owned ? 2 : 3));  // blocking keeps no output
      c->cols = variant == 0 ? 1 : 2;
      c->ndim = variant == 0 ? 1 : 2;
      c->rows.assign(size, std::vector<int64_t>(size));
      for (int s = 0; s < size; ++s) {
        for (int d = 0; d < size; ++d) {
          c->rows[s][d] = variant != 0 ? (n + 3 * s + 5 * d + step) % (n + 1)
                          : large      ? EvenSplit(n, size)[d]
                                       : n;
        }
      }
      c->even = variant == 0 && !large;
      int64_t mine = 0, incoming = 0;
      for (int d = 0; d < size; ++d) mine += c->rows[rank][d];
      for (int s = 0; s < size; ++s) incoming += c->rows[s][rank];
      c->in_shape[0] = mine;
      c->in_shape[1] = c->cols;
      c->name = Name("a2a", dt, n,
                     variant == 0   ? "even"
                     : variant == 1 ? "uneven.buf"
                                    : (c->owned ? "uneven.owned" : "uneven.buf2"));
      c->in.assign(static_cast<size_t>(mine * c->cols) * es, 0);
      for (int64_t i = 0; i < mine * c->cols; ++i) {
        StoreElement(dt, c->in.data(), i, Val(CONCORD_SUM, false, dt, rank, i, step, c->salt));
      }
      if (!c->owned) {
        // Exact capacity, or a little more for the uneven split.
        c->out.assign(static_cast<size_t>(incoming * c->cols) * es + (variant == 1 ? 8 : 0), 0xCD);
      }
      Submit(comm, *c, rank, size, device, counts);
      batch.push_back(std::move(c));
    }
    // In place on the host: the output is the input buffer (every rank sends and gets the same
    // number of rows); the engine sends from a copy, else arriving blocks would overwrite rows
    // not yet sent. (Device tensors are refused so: mp_conformance's error cases.)
    if (device == CONCORD_DEVICE_CPU) {
      auto c = std::make_unique<Case>();
      c->alltoall = true;
      c->inplace = true;
      c->dt = dt;
      c->step = step;
      c->salt = 23;
      c->mode = static_cast<Mode>(mode++ % 3);
      c->rows.assign(size, std::vector<int64_t>(size, large ? n / size : n));
      const int64_t mine = size * c->rows[0][0];
      c->in_shape[0] = mine;
      c->name = Name("a2a", dt, n, "inplace");
      c->in.assign(static_cast<size_t>(mine) * es, 0);
      for (int64_t i = 0; i < mine; ++i) {
        StoreElement(dt, c->in.data(), i, Val(CONCORD_SUM, false, dt, rank, i, step, c->salt));
      }
      Submit(comm, *c, rank, size, device, counts);
      batch.push_back(std::move(c));
    }
    Finish(batch, rank, size, device, counts);
  }
  // Every callback ran once, before its wait returned.
  ++counts->checks;
  if (g_callbacks.load() != g_callback_submitted) {
    FAILF("%ld callbacks for %ld requests with one", g_callbacks.load(), g_callback_submitted);
  }
  counts->failures = CheckFailures();
}

namespace {

// A submission that must fail: at enqueue with `code` (want_queued false), or once run.
void ExpectError(concord_comm_t comm, const char* what, concord_status_t got, concord_request_t req,
                 concord_status_t code, const std::vector<std::string>& parts, Counts* counts) {
  ++counts->cases;
  ++counts->checks;
  std::string text = concord_comm_last_error(comm);
  if (req != nullptr) {
    got = concord_wait(req, 120);
    text = concord_request_error(req);
    concord_request_free(req);
  }
  if (got != code) {
    FAILF("%s: %s (%s), want %s", what, concord_status_string(got), text.c_str(),
          concord_status_string(code));
    return;
  }
  for (const std::string& part : parts) {
    if (!mp::Contains(text, part)) {
      FAILF("%s: error '%s' does not name '%s'", what, text.c_str(), part.c_str());
    }
  }
}

void RunErrors(concord_comm_t comm, int rank, int size, int device, Counts* counts) {
  std::vector<float> in(4 * size * 2, 1.0f), out(4 * size * 2, 0.0f);
  int64_t shape[2] = {4 * size, 1}, out_shape[2] = {4, 1};
  concord_tensor_t t = CpuTensor(in.data(), CONCORD_FLOAT32, 1, shape);
  concord_tensor_t o = CpuTensor(out.data(), CONCORD_FLOAT32, 1, out_shape);
  concord_request_t req = nullptr;
  std::vector<int64_t> splits(size, 4);
  concord_reducescatter_opts_t rs;
  concord_reducescatter_opts_init(&rs);
  concord_alltoall_opts_t a2a;
  concord_alltoall_opts_init(&a2a);

  // Refused at enqueue, on this rank alone: nothing is queued.
  const concord_status_t kBad = CONCORD_ERR_INVALID_ARGUMENT;
  std::vector<int64_t> bad = splits;
  bad[0] += 1;  // sums to one more than the first dimension
  rs.recv_splits = bad.data();
  rs.nsplits = size;
  ExpectError(comm, "rs splits sum",
              concord_reducescatter_async(comm, "e.rs", &t, &o, &rs, nullptr, nullptr, &req),
              nullptr, kBad, {"'e.rs'", "sum to"}, counts);
  a2a.splits = bad.data();
  a2a.nsplits = size;
  ExpectError(comm, "a2a splits sum",
              concord_alltoall_async(comm, "e.a2a", &t, nullptr, 0, &a2a, nullptr, nullptr, &req),
              nullptr, kBad, {"'e.a2a'", "sum to"}, counts);
  a2a.splits = splits.data();  // given, but nsplits left 0: not the even split
  a2a.nsplits = 0;
  ExpectError(comm, "a2a nsplits 0",
              concord_alltoall_async(comm, "e.a2a", &t, nullptr, 0, &a2a, nullptr, nullptr, &req),
              nullptr, kBad, {"nsplits 0"}, counts);
  rs.recv_splits = splits.data();
  rs.nsplits = 0;
  ExpectError(comm, "rs nsplits 0",
              concord_reducescatter_async(comm, "e.rs", &t, &o, &rs, nullptr, nullptr, &req),
              nullptr, kBad, {"nsplits 0"}, counts);
  std::vector<int64_t> one_more = splits;
  one_more.push_back(0);
  a2a.splits = one_more.data();
  a2a.nsplits = size + 1;
  ExpectError(comm, "a2a split count",
              concord_alltoall_async(comm, "e.a2a", &t, nullptr, 0, &a2a, nullptr, nullptr, &req),
              nullptr, kBad, {"one split per rank"}, counts);
  bad = splits;
  bad[0] = -4;
  if (size > 1) bad[size - 1] += 8;  // still the first dimension in all
  a2a.splits = bad.data();
  a2a.nsplits = size;
  ExpectError(comm, "a2a negative split",
              concord_alltoall_async(comm, "e.a2a", &t, nullptr, 0, &a2a, nullptr, nullptr, &req),
              nullptr, kBad, {"negative"}, counts);
  concord_tensor_t scalar = CpuTensor(in.data(), CONCORD_FLOAT32, 0, shape);
  ExpectError(
      comm, "a2a scalar",
      concord_alltoall_async(comm, "e.a2a", &scalar, nullptr, 0, nullptr, nullptr, nullptr, &req),
      nullptr, kBad, {"at least one dimension"}, counts);
  int64_t wrong_shape[1] = {5};
  concord_tensor_t wrong = CpuTensor(out.data(), CONCORD_FLOAT32, 1, wrong_shape);
  ExpectError(
      comm, "rs output shape",
      concord_reducescatter_async(comm, "e.rs", &t, &wrong, nullptr, nullptr, nullptr, &req),
      nullptr, kBad, {"shape [4]"}, counts);
  // Compression a reduce-scatter cannot take: top-k (not summable), a cast of an integer tensor.
  concord_reducescatter_opts_t rc;
  concord_reducescatter_opts_init(&rc);
  rc.compression = "topk:density=0.5";
  ExpectError(comm, "rs top-k",
              concord_reducescatter_async(comm, "e.rs", &t, &o, &rc, nullptr, nullptr, &req),
              nullptr, kBad, {"'e.rs'", "summable"}, counts);
  rc.compression = "fp16";
  concord_tensor_t ti = t, oi = o;
  ti.dtype = oi.dtype = CONCORD_INT32;
  ExpectError(comm, "rs fp16 of int32",
              concord_reducescatter_async(comm, "e.rs", &ti, &oi, &rc, nullptr, nullptr, &req),
              nullptr, kBad, {"'e.rs'", "int32"}, counts);
  ExpectError(comm, "blocking a2a without output",
              concord_alltoall(comm, "e.a2a", &t, nullptr, 0, nullptr, nullptr, 0), nullptr, kBad,
              {"output is NULL"}, counts);
  if (device == CONCORD_DEVICE_CPU) {
    concord_tensor_t cuda = t;
    cuda.device = 0;
    ExpectError(
        comm, "a2a of a CUDA tensor without a GPU backend",
        concord_alltoall_async(comm, "e.a2a", &cuda, nullptr, 0, nullptr, nullptr, nullptr, &req),
        nullptr, CONCORD_ERR_UNAVAILABLE, {"'e.a2a' on CUDA device 0"}, counts);
  }
  if (size < 2) return;

  // Mismatches: every rank fails, the error names the tensor, the field and the ranks.
  const std::string one = "on rank 1";
  rs.recv_splits = nullptr;
  rs.nsplits = 0;
  bad = splits;
  if (rank == 1) {
    bad[0] += 1;
    bad[1] -= 1;
  }
  rs.recv_splits = bad.data();
  rs.nsplits = size;
  out_shape[0] = bad[rank];
  concord_status_t s =
      concord_reducescatter_async(comm, "m.rs.splits", &t, &o, &rs, nullptr, nullptr, &req);
  ExpectError(comm, "rs splits mismatch", s, s == CONCORD_SUCCESS ? req : nullptr,
              CONCORD_ERR_MISMATCH, {"'m.rs.splits'", "splits", one}, counts);
  concord_reducescatter_opts_init(&rs);
  rs.op = rank == 1 ? CONCORD_MAX : CONCORD_SUM;
  out_shape[0] = 4;
  s = concord_reducescatter_async(comm, "m.rs.op", &t, &o, &rs, nullptr, nullptr, &req);
  ExpectError(comm, "rs op mismatch", s, s == CONCORD_SUCCESS ? req : nullptr, CONCORD_ERR_MISMATCH,
              {"'m.rs.op'", "reduce op", one}, counts);
  rc.compression = rank == 1 ? "bf16" : "fp16";
  s = concord_reducescatter_async(comm, "m.rs.compression", &t, &o, &rc, nullptr, nullptr, &req);
  ExpectError(comm, "rs compression mismatch", s, s == CONCORD_SUCCESS ? req : nullptr,
              CONCORD_ERR_MISMATCH, {"'m.rs.compression'", "compression", one}, counts);
  int64_t cols_shape[2] = {2 * size, rank == 1 ? 2 : 1};
  concord_tensor_t cols = CpuTensor(in.data(), CONCORD_FLOAT32, 2, cols_shape);
  s = concord_alltoall_async(comm, "m.a2a.dims", &cols, nullptr, 0, nullptr, nullptr, nullptr,
                             &req);
  ExpectError(comm, "a2a dims mismatch", s, s == CONCORD_SUCCESS ? req : nullptr,
              CONCORD_ERR_MISMATCH, {"'m.a2a.dims'", "after the first dimension", one}, counts);
  concord_tensor_t typed = t;
  typed.dtype = rank == 1 ? CONCORD_INT32 : CONCORD_FLOAT32;
  s = concord_alltoall_async(comm, "m.a2a.dtype", &typed, nullptr, 0, nullptr, nullptr, nullptr,
                             &req);
  ExpectError(comm, "a2a dtype mismatch", s, s == CONCORD_SUCCESS ? req : nullptr,
              CONCORD_ERR_MISMATCH, {"'m.a2a.dtype'", "dtype", one}, counts);
  // Rank 0's output is one byte short: it fails, the others complete.
  const size_t need = static_cast<size_t>(4 * size) * sizeof(float);
  s = concord_alltoall_async(comm, "m.a2a.small", &t, out.data(), rank == 0 ? need - 1 : need,
                             nullptr, nullptr, nullptr, &req);
  if (rank == 0) {
    ExpectError(comm, "a2a small output", s, s == CONCORD_SUCCESS ? req : nullptr, kBad,
                {"'m.a2a.small'", "bytes"}, counts);
  } else {
    ++counts->checks;
    const concord_status_t done = s == CONCORD_SUCCESS ? concord_wait(req, 120) : s;
    if (done != CONCORD_SUCCESS)
      FAILF("a2a small output on rank 0: this rank got %s", concord_status_string(done));
    if (s == CONCORD_SUCCESS) concord_request_free(req);
  }
  // The engine goes on: the same name, now agreed.
  rs.op = CONCORD_SUM;
  ++counts->checks;
  s = concord_reducescatter(comm, "m.rs.op", &t, &o, &rs);
  if (s != CONCORD_SUCCESS || out[0] != static_cast<float>(size)) {
    FAILF("reducescatter after the mismatches: %s, %g", concord_status_string(s), out[0]);
  }
}

// Reduce and gather to a root: refusals at enqueue on one rank, then mismatches on every rank.
void RunRootErrors(concord_comm_t comm, int rank, int size, int device, Counts* counts) {
  std::vector<float> in(4, 1.0f);
  int64_t shape[1] = {4};
  concord_tensor_t t = CpuTensor(in.data(), CONCORD_FLOAT32, 1, shape);
  concord_tensor_t null_out = CpuTensor(nullptr, CONCORD_FLOAT32, 1, shape);
  concord_request_t req = nullptr;
  const concord_status_t kBad = CONCORD_ERR_INVALID_ARGUMENT;
  ExpectError(
      comm, "reduce root out of range",
      concord_reduce_async(comm, "e.rd", &t, nullptr, size, nullptr, nullptr, nullptr, &req),
      nullptr, kBad, {"'e.rd'", "root " + std::to_string(size), "outside"}, counts);
  ExpectError(comm, "reduce negative root",
              concord_reduce_async(comm, "e.rd", &t, nullptr, -1, nullptr, nullptr, nullptr, &req),
              nullptr, kBad, {"'e.rd'", "root -1"}, counts);
  ExpectError(
      comm, "reduce NULL output data on the root",
      concord_reduce_async(comm, "e.rd", &t, &null_out, rank, nullptr, nullptr, nullptr, &req),
      nullptr, kBad, {"'e.rd'", "output data is NULL"}, counts);
  concord_reduce_opts_t ro;
  concord_reduce_opts_init(&ro);
  ro.op = static_cast<concord_reduce_op_t>(99);
  ExpectError(comm, "reduce unknown op",
              concord_reduce_async(comm, "e.rd", &t, nullptr, 0, &ro, nullptr, nullptr, &req),
              nullptr, kBad, {"'e.rd'", "unknown reduce op"}, counts);
  ro.struct_size = 4;
  ExpectError(comm, "reduce opts struct_size",
              concord_reduce_async(comm, "e.rd", &t, nullptr, 0, &ro, nullptr, nullptr, &req),
              nullptr, kBad, {"struct_size"}, counts);
  concord_tensor_t ti = t;
  ti.dtype = CONCORD_INT32;
  concord_reduce_opts_init(&ro);
  ro.prescale = 2;
  ExpectError(comm, "reduce scaled int32",
              concord_reduce_async(comm, "e.rd", &ti, nullptr, 0, &ro, nullptr, nullptr, &req),
              nullptr, kBad, {"'e.rd'", "floating-point"}, counts);
  ExpectError(comm, "gather root out of range",
              concord_gather_async(comm, "e.ga", &t, nullptr, 0, size + 3, nullptr, nullptr, &req),
              nullptr, kBad, {"'e.ga'", "root " + std::to_string(size + 3)}, counts);
  concord_tensor_t scalar = CpuTensor(in.data(), CONCORD_FLOAT32, 0, shape);
  ExpectError(comm, "gather scalar",
              concord_gather_async(comm, "e.ga", &scalar, nullptr, 0, 0, nullptr, nullptr, &req),
              nullptr, kBad, {"'e.ga'", "at least one dimension"}, counts);
  ExpectError(comm, "blocking gather without output on the root",
              concord_gather(comm, "e.ga", &t, nullptr, 0, rank), nullptr, kBad,
              {"output is NULL on the root"}, counts);
  if (device == CONCORD_DEVICE_CPU) {
    concord_tensor_t cuda = t;
    cuda.device = 0;
    ExpectError(
        comm, "reduce of a CUDA tensor without a GPU backend",
        concord_reduce_async(comm, "e.rd", &cuda, &cuda, 0, nullptr, nullptr, nullptr, &req),
        nullptr, CONCORD_ERR_UNAVAILABLE, {"'e.rd' on CUDA device 0"}, counts);
    concord_device_opts_t no_wait;
    concord_device_opts_init(&no_wait);
    ExpectError(comm, "gather of a CUDA tensor without a GPU backend",
                concord_gather_async_ex(comm, "e.ga", &cuda, in.data(), in.size() * sizeof(in[0]),
                                        0, &no_wait, nullptr, nullptr, &req),
                nullptr, CONCORD_ERR_UNAVAILABLE, {"'e.ga' on CUDA device 0"}, counts);
  }
  if (size < 2) return;

  // Mismatches: every rank fails, the error names the tensor, the field and the ranks.
  const std::string one = "on rank 1";
  concord_status_t s = concord_reduce_async(comm, "m.rd.root", &t, nullptr, rank == 1 ? 1 : 0,
                                            nullptr, nullptr, nullptr, &req);
  ExpectError(comm, "reduce root mismatch", s, s == CONCORD_SUCCESS ? req : nullptr,
              CONCORD_ERR_MISMATCH, {"'m.rd.root'", "root", one}, counts);
  concord_reduce_opts_init(&ro);
  ro.op = rank == 1 ? CONCORD_MAX : CONCORD_SUM;
  s = concord_reduce_async(comm, "m.rd.op", &t, nullptr, 0, &ro, nullptr, nullptr, &req);
  ExpectError(comm, "reduce op mismatch", s, s == CONCORD_SUCCESS ? req : nullptr,
              CONCORD_ERR_MISMATCH, {"'m.rd.op'", "reduce op", one}, counts);
  concord_tensor_t typed = t;
  typed.dtype = rank == 1 ? CONCORD_INT32 : CONCORD_FLOAT32;
  s = concord_reduce_async(comm, "m.rd.dtype", &typed, nullptr, 0, nullptr, nullptr, nullptr, &req);
  ExpectError(comm, "reduce dtype mismatch", s, s == CONCORD_SUCCESS ? req : nullptr,
              CONCORD_ERR_MISMATCH, {"'m.rd.dtype'", "dtype", one}, counts);
  // A reduce on some ranks, an allreduce of the same name on the others.
  s = rank == 1
          ? concord_allreduce_async(comm, "m.rd.kind", &t, nullptr, nullptr, nullptr, nullptr, &req)
          : concord_reduce_async(comm, "m.rd.kind", &t, nullptr, 0, nullptr, nullptr, nullptr,
                                 &req);
  ExpectError(comm, "reduce against allreduce", s, s == CONCORD_SUCCESS ? req : nullptr,
              CONCORD_ERR_MISMATCH, {"'m.rd.kind'", "operation", "allreduce on rank 1"}, counts);
  s = concord_gather_async(comm, "m.ga.root", &t, nullptr, 0, rank == 1 ? 1 : 0, nullptr, nullptr,
                           &req);
  ExpectError(comm, "gather root mismatch", s, s == CONCORD_SUCCESS ? req : nullptr,
              CONCORD_ERR_MISMATCH, {"'m.ga.root'", "root", one}, counts);
  s = concord_gather_async(comm, "m.ga.dtype", &typed, nullptr, 0, 0, nullptr, nullptr, &req);
  ExpectError(comm, "gather dtype mismatch", s, s == CONCORD_SUCCESS ? req : nullptr,
              CONCORD_ERR_MISMATCH, {"'m.ga.dtype'", "dtype", one}, counts);
  // The root's output is one byte short: it fails, the others complete.
  std::vector<float> out(4 * size);
  const size_t need = out.size() * sizeof(float);
  s = concord_gather_async(comm, "m.ga.small", &t, out.data(), need - 1, 0, nullptr, nullptr, &req);
  if (rank == 0) {
    ExpectError(comm, "gather small output", s, s == CONCORD_SUCCESS ? req : nullptr, kBad,
                {"'m.ga.small'", "bytes"}, counts);
  } else {
    ++counts->checks;
    const concord_status_t done = s == CONCORD_SUCCESS ? concord_wait(req, 120) : s;
    if (done != CONCORD_SUCCESS)
      FAILF("gather small output on the root: this rank got %s", concord_status_string(done));
    if (s == CONCORD_SUCCESS) concord_request_free(req);
  }
  // The engine goes on: the same name, now agreed.
  ++counts->checks;
  in.assign(4, 1.0f);
  s = concord_reduce(comm, "m.rd.root", &t, nullptr, size - 1, nullptr);
  const float want = rank == size - 1 ? static_cast<float>(size) : 1.0f;
  if (s != CONCORD_SUCCESS || in[0] != want) {
    FAILF("reduce after the mismatches: %s, %g (want %g)", concord_status_string(s), in[0], want);
  }
}

// Device tensors whose result the request would own (host memory) are refused at enqueue, on
// this rank alone: an allgather, an alltoall, and a gather on its root, without an output buffer.
void RunDeviceRefusals(concord_comm_t comm, int rank, int size, int device, Counts* counts) {
  // One row per rank: the even alltoall split exists, so the missing output is the one error.
  const mp::DeviceBuffer rows(std::vector<unsigned char>(size * sizeof(float), 0));
  int64_t shape[1] = {size};
  concord_tensor_t t = CpuTensor(rows.data(), CONCORD_FLOAT32, 1, shape);
  t.device = device;
  const std::string where = "on CUDA device " + std::to_string(device);
  const std::string why = "needs an output buffer on the device";
  const concord_status_t kBad = CONCORD_ERR_INVALID_ARGUMENT;
  concord_request_t req = nullptr;
  ExpectError(comm, "allgather of a CUDA tensor without output",
              concord_allgather_async(comm, "e.ag", &t, nullptr, 0, nullptr, nullptr, &req),
              nullptr, kBad, {"'e.ag' " + where, why}, counts);
  ExpectError(
      comm, "alltoall of a CUDA tensor without output",
      concord_alltoall_async(comm, "e.a2a", &t, nullptr, 0, nullptr, nullptr, nullptr, &req),
      nullptr, kBad, {"'e.a2a' " + where, why}, counts);
  ExpectError(comm, "gather of a CUDA tensor without output on its root",
              concord_gather_async(comm, "e.ga", &t, nullptr, 0, rank, nullptr, nullptr, &req),
              nullptr, kBad, {"'e.ga' " + where, why}, counts);
}

}  // namespace

void RunErrorCases(concord_comm_t comm, int rank, int size, int device, Counts* counts) {
  CheckSetContext("rank %d", rank);
  RunErrors(comm, rank, size, device, counts);
  RunRootErrors(comm, rank, size, device, counts);
  if (device != CONCORD_DEVICE_CPU) RunDeviceRefusals(comm, rank, size, device, counts);
  counts->failures = CheckFailures();
}

}  // namespace mp_exchange
