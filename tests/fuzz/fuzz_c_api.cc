// libFuzzer target for the C API's argument checking (include/concord/concord.h): every call
// must return a status (one of concord_status_t's values), never crash, hang or leak, whatever the
// arguments. A one-rank communicator (rank 0 of 1: no store, no peers) is created on the first
// input and replaced every kInputsPerComm inputs (its compression residuals and cache grow with
// the names it sees). Each input is a little program, read front to back (bytes past the end read
// as zeros), of at most kMaxOps operations:
//   u8 op, then its arguments: allreduce, allgather, broadcast, reducescatter, alltoall, reduce,
//   gather (blocking or async, with fuzzed names, tensor descriptors, options structs and their
//   struct_size, callbacks, request out-pointers), barrier, group_start/group_end, end_step, the
//   request calls (wait, test, error, output, wire_bytes, wait_stream, free), init_config with a
//   fuzzed concord_config_t (finalized at once when it succeeds), and calls on a NULL
//   communicator or request.
// Arguments are honest where the API cannot check them: a tensor's data is allocated for the
// elements its shape describes (NULL beyond kMaxBytes, which the API must refuse), an allgather's
// output for the capacity given, and each options struct for the struct_size it claims (at most
// the library's size). Values that would only make a valid call slow are left out: a cycle time
// over a second, a file store (it would create directories) and host names that need DNS.
// Open requests are waited for and freed at the end of each input; a detached request's buffers
// are kept until the communicator is replaced. The commands are in tests/fuzz/README.md.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "concord/concord.h"

extern char** environ;

namespace {

constexpr int kInputsPerComm = 128;
constexpr int kMaxOps = 24;
constexpr int64_t kMaxBytes = 1 << 16;

void Check(bool ok) {
  if (!ok) std::abort();
}

concord_status_t Valid(concord_status_t s) {
  Check(static_cast<int>(s) >= CONCORD_SUCCESS && static_cast<int>(s) <= CONCORD_ERR_PROTOCOL);
  return s;
}

// The input, read front to back; zeros once it is used up.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), left_(size) {}
  bool empty() const { return left_ == 0; }
  uint8_t U8() {
    if (left_ == 0) return 0;
    --left_;
    return *p_++;
  }
  template <typename T>
  T Raw() {
    T v{};
    const size_t n = left_ < sizeof(T) ? left_ : sizeof(T);
    std::memcpy(&v, p_, n);
    p_ += n;
    left_ -= n;
    return v;
  }
  // One of table's entries, or (for the index just past them) raw bytes.
  template <typename T, size_t N>
  T Pick(const T (&table)[N]) {
    const size_t i = U8() % (N + 1);
    return i < N ? table[i] : Raw<T>();
  }
  std::string Bytes(size_t n) {
    n = n < left_ ? n : left_;
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    left_ -= n;
    return s;
  }

 private:
  const uint8_t* p_;
  size_t left_;
};

// Strings that must stay valid while a call runs (the API copies them; the test keeps them for
// the input's length anyway).
struct Strings {
  std::vector<std::unique_ptr<std::string>> held;
  const char* Keep(std::string s) {
    held.push_back(std::make_unique<std::string>(std::move(s)));
    return held.back()->c_str();
  }
};

// A name: NULL, empty, short fuzzed bytes (any encoding), or 70000 bytes.
const char* Name(Input& in, Strings& strings) {
  switch (in.U8() % 8) {
    case 0:
      return nullptr;
    case 1:
      return "";
    case 2:
      return strings.Keep(std::string(70000, 'n'));
    case 3:
      return "__concord.barrier.0";
    default:
      return strings.Keep(in.Bytes(in.U8() % 24));
  }
}

const char* Spec(Input& in, Strings& strings) {
  static const char* const kSpecs[] = {"none",
                                       "fp16",
                                       "bf16",
                                       "topk:density=0.01",
                                       "topk:density=0.5,method=exact,values=fp16",
                                       "topk:density=1",
                                       "topk:density=0",
                                       "bogus:x=1"};
  const size_t i = in.U8() % 11;
  if (i < 8) return kSpecs[i];
  if (i == 8) return nullptr;
  if (i == 9) return "";
  return strings.Keep(in.Bytes(in.U8() % 48));
}

// Memory that must outlive an operation.
struct Buffers {
  std::vector<std::unique_ptr<uint8_t[]>> held;
  void* Get(size_t bytes) {
    held.emplace_back(new uint8_t[bytes == 0 ? 1 : bytes]());
    return held.back().get();
  }
};

int64_t ElementSize(int dtype) {
  static const int64_t kSizes[] = {1, 1, 4, 8, 2, 2, 4, 8};
  return dtype >= 0 && dtype < 8 ? kSizes[dtype] : 1;
}

// A tensor descriptor with its shape; data is allocated for the elements the shape describes.
struct Tensor {
  concord_tensor_t t{};
  int64_t shape[CONCORD_MAX_DIMS + 2] = {};
  int64_t bytes = -1;  // -1: not allocated (the shape is invalid or too large)
};

void MakeTensor(Input& in, Buffers& buffers, Tensor* out, const Tensor* like = nullptr) {
  static const int kDTypes[] = {0, 1, 2, 3, 4, 5, 6, 7, 6, 6, 8, -1};
  static const int kNdims[] = {0, 1, 1, 2, 3, 8, 9, -1};
  static const int64_t kDims[] = {0, 1, 2, 3, 5, 16, 100, 1024, -1, INT64_MAX, int64_t{1} << 32};
  static const int kDevices[] = {-1, -1, -1, -1, -2, 0, 1, INT_MIN};
  concord_tensor_t& t = out->t;
  const uint8_t how = in.U8();
  if (like != nullptr && (how & 1)) {  // the same layout as `like` (a valid output)
    *out = *like;
    t.shape = out->shape;
  } else {
    const int dtype = in.Pick(kDTypes);
    std::memcpy(&t.dtype, &dtype, sizeof(dtype));  // any int, as a C caller may store
    t.ndim = in.Pick(kNdims);
    for (int i = 0; i < CONCORD_MAX_DIMS + 2; ++i) out->shape[i] = in.Pick(kDims);
    t.shape = (how & 2) && t.ndim > 0 ? nullptr : out->shape;
    t.device = in.Pick(kDevices);
  }
  out->bytes = -1;
  int dtype = 0;
  std::memcpy(&dtype, &t.dtype, sizeof(dtype));
  int64_t n = ElementSize(dtype);
  bool ok = t.ndim >= 0 && t.ndim <= CONCORD_MAX_DIMS + 2;
  for (int i = 0; ok && i < t.ndim; ++i) {
    ok = out->shape[i] >= 0 && !__builtin_mul_overflow(n, out->shape[i], &n) && n <= kMaxBytes;
  }
  t.data = nullptr;
  if (ok && !(how & 4)) {
    out->bytes = n;
    t.data = buffers.Get(static_cast<size_t>(n));
  }
}

std::atomic<int> callbacks{0};
void Callback(concord_request_t request, concord_status_t status, void* user_data) {
  Check(request != nullptr && user_data == &callbacks);
  Valid(status);
  callbacks.fetch_add(1);
}

// One communicator and what its detached requests still use.
struct Comm {
  concord_comm_t comm = nullptr;
  int inputs = 0;
  Buffers detached;
};
Comm* g = nullptr;

void FinalizeComm() {
  if (g == nullptr) return;
  Valid(concord_finalize(g->comm));
  delete g;
  g = nullptr;
}

void ReplaceComm() {
  if (g == nullptr) {
    // libFuzzer ends with exit(): the communicator's engine thread is then stopped and joined
    // before LeakSanitizer looks (its checker was registered earlier, so it runs after this),
    // instead of running while the heap is scanned.
    std::atexit(FinalizeComm);
  }
  FinalizeComm();
  g = new Comm;
  concord_config_t c;
  concord_config_init(&c);
  c.rank = 0;
  c.size = 1;
  if (concord_init_config(&c, &g->comm) != CONCORD_SUCCESS) {
    std::fprintf(stderr, "fuzz_c_api: init: %s\n", concord_comm_last_error(nullptr));
    std::abort();
  }
}

// The state of one input.
struct Program {
  Input in;
  Strings strings;
  Buffers buffers;
  std::vector<concord_request_t> requests;
  bool group_open = false;
};

// A copy of options struct `o` in zeroed memory of the size it claims: the library reads
// struct_size bytes of it (a newer caller's zero tail too) when struct_size is at most 4096 (larger
// is refused unread), so they must all be there; Pick may give any size.
template <typename Opts>
const Opts* AsClaimed(Program& p, const Opts& o) {
  void* mem = p.buffers.Get(std::max(sizeof(size_t), std::min<size_t>(o.struct_size, 4096)));
  std::memcpy(mem, &o, std::max(sizeof(size_t), std::min(o.struct_size, sizeof(o))));
  return static_cast<const Opts*>(mem);
}

// The options an allreduce gets: NULL, or a struct allocated at the size it claims.
const concord_allreduce_opts_t* AllreduceOpts(Program& p) {
  static const size_t kSizes[] = {sizeof(concord_allreduce_opts_t),
                                  0,
                                  8,
                                  offsetof(concord_allreduce_opts_t, compression),
                                  offsetof(concord_allreduce_opts_t, compression) + 4,
                                  sizeof(concord_allreduce_opts_t) + 64};
  static const int kOps[] = {0, 1, 2, 3, 4, 5, -1, INT_MAX};
  static const double kScales[] = {1.0, 0.5, -2.0, 0.0, NAN, INFINITY, 1e308, 5e-324};
  Input& in = p.in;
  if (in.U8() % 4 == 0) return nullptr;
  concord_allreduce_opts_t o;
  concord_allreduce_opts_init(&o);
  o.struct_size = in.Pick(kSizes);
  const int op = in.Pick(kOps);
  std::memcpy(&o.op, &op, sizeof(op));
  o.prescale = in.Pick(kScales);
  o.postscale = in.Pick(kScales);
  o.compression = Spec(in, p.strings);
  return AsClaimed(p, o);
}

const concord_device_opts_t* DeviceOpts(Program& p) {
  Input& in = p.in;
  if (in.U8() % 4 != 0) return nullptr;
  concord_device_opts_t o;
  concord_device_opts_init(&o);
  static const size_t kSizes[] = {sizeof(o), 0, 8, 16};
  o.struct_size = in.Pick(kSizes);
  return AsClaimed(p, o);
}

// An operation: blocking, or async with a request kept (or none asked for).
void Collective(Program& p, int which) {
  Input& in = p.in;
  const uint8_t how = in.U8();
  const char* name = Name(in, p.strings);
  Tensor input;
  MakeTensor(in, p.buffers, &input);
  const bool blocking = (how & 3) == 0;
  concord_callback_t callback = (how & 4) ? Callback : nullptr;
  concord_request_t request = nullptr;
  concord_request_t* out = (how & 8) ? nullptr : &request;
  concord_status_t s;
  if (which == 0) {
    Tensor output;
    const bool in_place = in.U8() & 1;
    if (!in_place) MakeTensor(in, p.buffers, &output, &input);
    const concord_allreduce_opts_t* opts = AllreduceOpts(p);
    const concord_device_opts_t* device = DeviceOpts(p);
    const concord_tensor_t* o = in_place ? nullptr : &output.t;
    s = blocking ? concord_allreduce(g->comm, name, &input.t, o, opts)
                 : concord_allreduce_async_ex(g->comm, name, &input.t, o, opts, device, callback,
                                              &callbacks, out);
  } else if (which == 1) {
    static const size_t kCapacities[] = {0, 1, 8, 1024, kMaxBytes};
    const size_t capacity = in.Pick(kCapacities) % (kMaxBytes + 1);
    void* output = (in.U8() & 1) ? nullptr : p.buffers.Get(capacity);
    s = blocking ? concord_allgather(g->comm, name, &input.t, output, capacity)
                 : concord_allgather_async_ex(g->comm, name, &input.t, output, capacity,
                                              DeviceOpts(p), callback, &callbacks, out);
  } else if (which == 2) {
    static const int kRoots[] = {0, 0, 1, -1, INT_MAX};
    const int root = in.Pick(kRoots);
    s = blocking ? concord_broadcast(g->comm, name, &input.t, nullptr, root)
                 : concord_broadcast_async_ex(g->comm, name, &input.t, nullptr, root, DeviceOpts(p),
                                              callback, &callbacks, out);
  } else if (which == 4 || which == 5) {
    // Splits of any count and value (NULL: the even split), outputs of any size.
    static const int64_t kSplits[] = {0, 1, 7, -1, INT64_MAX, 4099};
    const int nsplits = in.U8() % 4;
    std::vector<int64_t> splits(static_cast<size_t>(nsplits) + 1);
    for (int64_t& c : splits) c = in.Pick(kSplits);
    const int64_t* sp = (in.U8() & 1) ? nullptr : splits.data();
    if (which == 4) {
      Tensor output;
      MakeTensor(in, p.buffers, &output, &input);
      concord_reducescatter_opts_t o;
      concord_reducescatter_opts_init(&o);
      static const size_t kStructSizes[] = {
          sizeof(o), 0, 8, offsetof(concord_reducescatter_opts_t, compression),
          offsetof(concord_reducescatter_opts_t, compression) + 4};
      o.struct_size = in.Pick(kStructSizes);
      o.compression = Spec(in, p.strings);
      o.op = static_cast<concord_reduce_op_t>(in.U8() % 7);
      o.recv_splits = sp;
      o.nsplits = nsplits;
      const concord_reducescatter_opts_t* opts = AsClaimed(p, o);
      s = blocking ? concord_reducescatter(g->comm, name, &input.t, &output.t, opts)
                   : concord_reducescatter_async(g->comm, name, &input.t, &output.t, opts, callback,
                                                 &callbacks, out);
    } else {
      static const size_t kCapacities[] = {0, 1, 8, 1024, kMaxBytes};
      const size_t capacity = in.Pick(kCapacities) % (kMaxBytes + 1);
      void* output = (in.U8() & 1) ? nullptr : p.buffers.Get(capacity);
      concord_alltoall_opts_t o;
      concord_alltoall_opts_init(&o);
      o.splits = sp;
      o.nsplits = nsplits;
      int64_t received[4] = {0, 0, 0, 0};
      s = blocking ? concord_alltoall(g->comm, name, &input.t, output, capacity, &o, received,
                                      in.U8() % 3)
                   : concord_alltoall_async(g->comm, name, &input.t, output, capacity, &o, callback,
                                            &callbacks, out);
    }
  } else if (which == 6 || which == 7) {
    static const int kRoots[] = {0, 0, 1, -1, INT_MAX};
    const int root = in.Pick(kRoots);
    if (which == 6) {
      Tensor output;
      const bool in_place = in.U8() & 1;
      if (!in_place) MakeTensor(in, p.buffers, &output, &input);
      concord_reduce_opts_t o;
      concord_reduce_opts_init(&o);
      static const size_t kStructSizes[] = {sizeof(o), 0, 8, 16};
      o.struct_size = in.Pick(kStructSizes);
      o.op = static_cast<concord_reduce_op_t>(in.U8() % 7);
      static const double kScales[] = {1.0, 0.5, HUGE_VAL, NAN};
      o.prescale = in.Pick(kScales);
      const concord_reduce_opts_t* opts = (in.U8() & 1) ? nullptr : AsClaimed(p, o);
      const concord_tensor_t* t = in_place ? nullptr : &output.t;
      s = blocking ? concord_reduce(g->comm, name, &input.t, t, root, opts)
                   : concord_reduce_async(g->comm, name, &input.t, t, root, opts, callback,
                                          &callbacks, out);
    } else {
      static const size_t kCapacities[] = {0, 1, 8, 1024, kMaxBytes};
      const size_t capacity = in.Pick(kCapacities) % (kMaxBytes + 1);
      void* output = (in.U8() & 1) ? nullptr : p.buffers.Get(capacity);
      s = blocking ? concord_gather(g->comm, name, &input.t, output, capacity, root)
                   : concord_gather_async(g->comm, name, &input.t, output, capacity, root, callback,
                                          &callbacks, out);
    }
  } else {
    s = blocking ? concord_barrier(g->comm)
                 : concord_barrier_async(g->comm, callback, &callbacks, out);
  }
  Valid(s);
  (void)concord_comm_last_error(g->comm);
  if (!blocking && s == CONCORD_SUCCESS) {
    Check(request != nullptr);
    p.requests.push_back(request);
  }
}

// The request calls on one open request (or on NULL).
void RequestCalls(Program& p) {
  Input& in = p.in;
  const uint8_t how = in.U8();
  concord_request_t r = nullptr;
  size_t index = 0;
  if (!p.requests.empty() && (how & 1)) {
    index = in.U8() % p.requests.size();
    r = p.requests[index];
  }
  static const double kTimeouts[] = {0.0, -1.0, 0.001, NAN, 1e300, -INFINITY};
  // An unbounded wait in an open group never ends: the member is held until group_end.
  double timeout = in.Pick(kTimeouts);
  if (p.group_open && !(timeout >= 0 && timeout <= 0.01)) timeout = 0.0;
  Valid(concord_wait(r, timeout));
  Valid(concord_test(r));
  Check(concord_request_error(r) != nullptr);
  void* data = nullptr;
  size_t bytes = 0;
  int64_t first_dim = 0;
  Valid(concord_request_output(r, (how & 2) ? &data : nullptr, (how & 4) ? &bytes : nullptr,
                               (how & 8) ? &first_dim : nullptr));
  uint64_t wire = 0;
  Valid(concord_request_wire_bytes(r, (how & 16) ? &wire : nullptr));
  int64_t received[4] = {0, 0, 0, 0};
  Valid(concord_request_received_splits(r, (how & 32) ? received : nullptr, (how >> 6) % 4));
  // Any non-NULL stream: a CPU request must be refused before it is used.
  Valid(concord_request_wait_stream(r, (how & 32) ? &wire : nullptr, 0.0));
  if (r != nullptr && (how & 64)) {  // detached: it frees itself when done
    concord_request_free(r);
    p.requests.erase(p.requests.begin() + static_cast<std::ptrdiff_t>(index));
    for (auto& b : p.buffers.held) g->detached.held.push_back(std::move(b));
    p.buffers.held.clear();
  }
}

const char* ConfigString(Input& in, Strings& strings, const char* const* table, size_t n) {
  const size_t i = in.U8() % (n + 2);
  if (i < n) return table[i];
  if (i == n) return nullptr;
  std::string s = in.Bytes(in.U8() % 32);
  // Never a store that would be opened: a file store creates directories, a TCP one waits.
  if (s.rfind("file:", 0) == 0 || s.rfind("tcp:", 0) == 0) s = "x" + s;
  return strings.Keep(std::move(s));
}

void InitConfig(Program& p) {
  Input& in = p.in;
  static const size_t kSizes[] = {sizeof(concord_config_t),
                                  0,
                                  8,
                                  12,
                                  16,
                                  offsetof(concord_config_t, fusion_threshold_bytes),
                                  sizeof(concord_config_t) + 8,
                                  65536,
                                  65537};
  static const int kVersions[] = {CONCORD_VERSION, 0, -1, 10000, 9999, INT_MAX};
  static const int kRanks[] = {-1, 0, 1, 2, -2, INT_MAX};
  static const int64_t kBytes[] = {-1, 0, 1, 4096, 1 << 20, 256 * 1024 + 1, -2, INT64_MAX};
  static const double kCycles[] = {-1, 0, 0.5, 60000.5, -0.5, NAN, INFINITY};
  static const double kTimeouts[] = {-1, 0, 0.001, 30, 86400.5, NAN, -INFINITY};
  static const int kInts[] = {-1, 0, 1, 2, 8, 9, -3, INT_MAX};
  static const int kLogLevels[] = {-1, 0, 1, 4, -2};
  static const char* const kStores[] = {"", "bogus", "tcp://", "file://", "tcp://[::1"};
  static const char* const kHosts[] = {"", "127.0.0.1", "::1", "localhost"};
  static const char* const kIfaces[] = {"", "lo", "nonexistent0"};
  static const char* const kBackends[] = {"", "gloo", "auto", "mpi", "nccl", "gloo-ibverbs"};
  static const char* const kJobs[] = {"", "default", "job"};
  concord_config_t c;
  concord_config_init(&c);
  c.struct_size = in.Pick(kSizes);
  c.version = in.Pick(kVersions);
  c.rank = in.Pick(kRanks);
  c.size = in.Pick(kRanks);
  c.local_rank = in.Pick(kRanks);
  c.local_size = in.Pick(kRanks);
  c.store = ConfigString(in, p.strings, kStores, 5);
  c.token = ConfigString(in, p.strings, kJobs, 3);
  c.job_id = ConfigString(in, p.strings, kJobs, 3);
  c.iface = ConfigString(in, p.strings, kIfaces, 3);
  c.host = in.U8() % 5 == 4 ? nullptr : kHosts[in.U8() % 4];
  // More than one rank on this host with a job id would open a file store and wait for peers.
  if (c.size != 1 && c.size != -1) c.job_id = nullptr;
  c.fusion_threshold_bytes = in.Pick(kBytes);
  c.cycle_time_ms = in.Pick(kCycles);
  if (c.cycle_time_ms > 1000 && c.cycle_time_ms <= 60000) c.cycle_time_ms = 1;
  c.timeout_s = in.Pick(kTimeouts);
  c.cache_capacity = in.Pick(kInts);
  c.log_level = in.Pick(kLogLevels);
  if (c.log_level >= 2 && c.log_level <= 3) c.log_level = 1;  // valid, but floods the output
  c.inline_threshold_bytes = in.Pick(kBytes);
  c.direct_threshold_bytes = in.Pick(kBytes);
  c.lanes = in.Pick(kInts);
  c.backend = ConfigString(in, p.strings, kBackends, 6);
  c.compression = Spec(in, p.strings);
  c.waiter_progress = in.Pick(kInts);
  const size_t size = std::max(sizeof(size_t), std::min(c.struct_size, sizeof(c)));
  void* mem = p.buffers.Get(size);
  std::memcpy(mem, &c, size);
  concord_comm_t comm = nullptr;
  const bool no_out = in.U8() % 8 == 0;
  const concord_status_t s = Valid(
      concord_init_config(static_cast<const concord_config_t*>(mem), no_out ? nullptr : &comm));
  Check(concord_comm_last_error(nullptr) != nullptr);
  if (s == CONCORD_SUCCESS) {
    Check(comm != nullptr);
    if (in.U8() & 1) Valid(concord_barrier(comm));
    Valid(concord_finalize(comm));
  } else {
    Check(comm == nullptr);
  }
}

// Calls on a NULL communicator, and the pure queries.
void NullCalls(Program& p) {
  Input& in = p.in;
  int v = 0;
  int* out = (in.U8() & 1) ? &v : nullptr;
  concord_comm_t comm = (in.U8() & 1) ? g->comm : nullptr;
  Valid(concord_comm_rank(comm, out));
  Valid(concord_comm_size(comm, out));
  Valid(concord_comm_local_rank(comm, out));
  Valid(concord_comm_local_size(comm, out));
  Check(concord_comm_last_error(comm) != nullptr);
  Check(concord_status_string(static_cast<concord_status_t>(in.Raw<int>())) != nullptr);
  concord_version(out, nullptr, out);
  concord_config_init(nullptr);
  concord_allreduce_opts_init(nullptr);
  concord_device_opts_init(nullptr);
  const concord_status_t checked =
      Valid(concord_compression_check(Spec(in, p.strings), in.Raw<int>()));
  Check(checked == CONCORD_SUCCESS || checked == CONCORD_ERR_INVALID_ARGUMENT);
  if (comm == nullptr) {
    Check(concord_barrier(nullptr) == CONCORD_ERR_NOT_INITIALIZED);
    Check(concord_group_start(nullptr) == CONCORD_ERR_NOT_INITIALIZED);
    Check(concord_finalize(nullptr) == CONCORD_SUCCESS);
  }
  concord_request_free(nullptr);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Only the config under test: no launcher's variables from the environment running the fuzzer.
  std::vector<std::string> names;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    for (const char* prefix : {"CONCORD_", "OMPI_", "PMIX_", "PMI_", "SLURM_", "MASTER_", "RANK",
                               "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) {
      if (name.rfind(prefix, 0) == 0) names.push_back(name);
    }
  }
  for (const std::string& name : names) unsetenv(name.c_str());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (g == nullptr || ++g->inputs > kInputsPerComm) ReplaceComm();
  Program p{Input(data, size), {}, {}, {}, false};
  for (int op = 0; op < kMaxOps && !p.in.empty(); ++op) {
    switch (p.in.U8() % 12) {
      case 0:
      case 1:
        Collective(p, 0);
        break;
      case 2:
        Collective(p, 1);
        break;
      case 3:
        Collective(p, 2);
        break;
      case 4:
        // A barrier, a reducescatter, an alltoall, a reduce or a gather.
        Collective(p, 3 + p.in.U8() % 5);
        break;
      case 5: {
        const concord_status_t s = Valid(concord_group_start(g->comm));
        Check((s == CONCORD_SUCCESS) != p.group_open);
        p.group_open = true;
        break;
      }
      case 6: {
        const concord_status_t s = Valid(concord_group_end(g->comm));
        if (!p.group_open) Check(s == CONCORD_ERR_INVALID_ARGUMENT);
        p.group_open = false;
        break;
      }
      case 7:
        Check(concord_end_step(g->comm) == CONCORD_SUCCESS);
        break;
      case 8:
      case 9:
        RequestCalls(p);
        break;
      case 10:
        InitConfig(p);
        break;
      default:
        NullCalls(p);
        break;
    }
  }
  if (p.group_open) Valid(concord_group_end(g->comm));
  for (concord_request_t r : p.requests) {
    Check(Valid(concord_wait(r, -1.0)) != CONCORD_IN_PROGRESS);
    concord_request_free(r);
  }
  return 0;
}
