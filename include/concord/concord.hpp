// Concord C++ API: thin RAII types over the C API (concord.h), for C++ frameworks.
//
// Header-only, so the library's ABI stays the C one: nothing here is compiled into libconcord.
// Errors are thrown as concord::Error (carrying the C status and message) in the caller's code;
// nothing throws across the library boundary. concord.h's comments hold the rules this header
// inherits: which thread runs a callback, what an enqueue copies, what a group must contain.
//
// Example (tests/docs compiles every fenced block of this header and of the README):
//   ```cpp
//   concord::Communicator comm;                  // from the environment (concordrun, torchrun)
//   std::vector<float> grad(1024), other(4096);
//   comm.allreduce("layer1.weight", concord::TensorView(grad), concord::ReduceOp::kAverage);
//   concord::Future f = comm.allreduce_async("layer2.weight", concord::TensorView(other));
//   f.wait();                                    // throws concord::Error if it failed
//   ```
#ifndef CONCORD_CONCORD_HPP_
#define CONCORD_CONCORD_HPP_

// This header uses std::optional, std::exchange and std::uncaught_exceptions: an older language
// gets this one error, not a cascade (the rest of the header is skipped). MSVC reports the
// language in _MSVC_LANG (its __cplusplus stays 199711L without /Zc:__cplusplus).
#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 201703L
#error "concord/concord.hpp needs C++17 or later (-std=c++17); C can use concord/concord.h"
#else

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "concord/concord.h"

namespace concord {

enum class DataType : int {
  kUint8 = CONCORD_UINT8,
  kInt8 = CONCORD_INT8,
  kInt32 = CONCORD_INT32,
  kInt64 = CONCORD_INT64,
  kFloat16 = CONCORD_FLOAT16,
  kBFloat16 = CONCORD_BFLOAT16,
  kFloat32 = CONCORD_FLOAT32,
  kFloat64 = CONCORD_FLOAT64,
};

enum class ReduceOp : int {
  kSum = CONCORD_SUM,
  kAverage = CONCORD_AVERAGE,
  kMin = CONCORD_MIN,
  kMax = CONCORD_MAX,
  kProduct = CONCORD_PRODUCT,
};

/// An error from Concord: the C status and the message that explains it.
class Error : public std::runtime_error {
 public:
  Error(concord_status_t status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  concord_status_t status() const { return status_; }

 private:
  concord_status_t status_;
};

namespace detail {
template <typename T>
struct TypeOf;
template <>
struct TypeOf<uint8_t> {
  static constexpr DataType value = DataType::kUint8;
};
template <>
struct TypeOf<int8_t> {
  static constexpr DataType value = DataType::kInt8;
};
template <>
struct TypeOf<int32_t> {
  static constexpr DataType value = DataType::kInt32;
};
template <>
struct TypeOf<int64_t> {
  static constexpr DataType value = DataType::kInt64;
};
template <>
struct TypeOf<float> {
  static constexpr DataType value = DataType::kFloat32;
};
template <>
struct TypeOf<double> {
  static constexpr DataType value = DataType::kFloat64;
};

inline void Check(concord_status_t s, const std::string& message) {
  if (s != CONCORD_SUCCESS) throw Error(s, message.empty() ? concord_status_string(s) : message);
}
// Check() with `comm`'s last error on this thread (NULL: concord_init's), read only once the call
// has failed: as an argument beside the call it could be read first (the order in which a
// function's arguments are evaluated is unspecified), giving an earlier error's text or none.
inline void CheckComm(concord_status_t s, concord_comm_t comm) {
  if (s != CONCORD_SUCCESS) Check(s, concord_comm_last_error(comm));
}
}  // namespace detail

/// A non-owning view of contiguous row-major memory: pointer, dtype, shape and device.
/// The memory must stay valid (and unwritten) until the operation that uses it completes; the view
/// itself may go as soon as the call that took it returns (the C API copies the shape).
class TensorView {
 public:
  TensorView(void* data, DataType dtype, std::vector<int64_t> shape,
             int device = CONCORD_DEVICE_CPU)
      : data_(data), dtype_(dtype), shape_(std::move(shape)), device_(device) {}
  /// A 1-D view of a vector of a supported element type.
  template <typename T>
  explicit TensorView(std::vector<T>& v)
      : TensorView(v.data(), detail::TypeOf<T>::value, {static_cast<int64_t>(v.size())}) {}

  void* data() const { return data_; }
  DataType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int device() const { return device_; }
  /// The C descriptor; valid while this view lives.
  concord_tensor_t c_tensor() const {
    concord_tensor_t t;
    t.data = data_;
    t.dtype = static_cast<concord_dtype_t>(dtype_);
    t.ndim = static_cast<int>(shape_.size());
    t.shape = shape_.data();
    t.device = device_;
    return t;
  }

 private:
  void* data_;
  DataType dtype_;
  std::vector<int64_t> shape_;
  int device_;
};

/// CUDA tensors only (TensorView device >= 0): what the operation waits for before it reads its
/// input, as CUDA handles (cudaStream_t, cudaEvent_t) passed as void*. See concord_device_opts_t.
/// It is the last argument of the *_async calls, after the callback (and, for allreduce and
/// reducescatter, the compression spec, where "" keeps the default). The blocking calls take CUDA
/// tensors through the C API's plain forms, ordered after the legacy default stream. Given for a
/// CPU tensor, a stream or event is an Error (INVALID_ARGUMENT):
///   ```cpp
///   concord::TensorView g(device_ptr, concord::DataType::kFloat16, {1024}, local_gpu);
///   concord::Future f = comm.allreduce_async("layer1.weight", g, concord::ReduceOp::kAverage,
///                                            nullptr, 1.0, 1.0, nullptr, "",
///                                            concord::DeviceOptions{backward_stream, nullptr});
///   f.wait_stream(optimizer_stream);  // optimizer kernels queued on it run after the allreduce
///   ```
struct DeviceOptions {
  void* stream = nullptr;       ///< the work queued on it so far runs first
  void* ready_event = nullptr;  ///< a recorded event the operation waits for
  concord_device_opts_t c_opts() const {
    concord_device_opts_t o;
    concord_device_opts_init(&o);
    o.stream = stream;
    o.ready_event = ready_event;
    return o;
  }
};

/// The pending result of an asynchronous operation. Move-only; destroying an unfinished Future
/// detaches it (the operation still completes). wait() throws Error when the operation failed.
class Future {
 public:
  Future() = default;
  /// `on_device`: the operation's tensors are CUDA tensors (output() then refuses).
  explicit Future(concord_request_t request, bool on_device = false)
      : request_(request), on_device_(on_device) {}
  Future(Future&& o) noexcept
      : request_(std::exchange(o.request_, nullptr)), on_device_(o.on_device_) {}
  Future& operator=(Future&& o) noexcept {
    if (this != &o) {
      concord_request_free(request_);
      request_ = std::exchange(o.request_, nullptr);
      on_device_ = o.on_device_;
    }
    return *this;
  }
  Future(const Future&) = delete;
  Future& operator=(const Future&) = delete;
  ~Future() { concord_request_free(request_); }

  bool valid() const { return request_ != nullptr; }
  /// True once finished (successfully or not); never blocks.
  bool ready() const {
    return request_ == nullptr || concord_test(request_) != CONCORD_IN_PROGRESS;
  }
  /// Blocks until finished; throws Error on failure.
  void wait() {
    if (request_ == nullptr) throw Error(CONCORD_ERR_INVALID_ARGUMENT, "wait on an empty Future");
    const concord_status_t s = concord_wait(request_, -1.0);
    detail::Check(s, concord_request_error(request_));
  }
  /// Blocks up to timeout_s (< 0: no limit): true once finished successfully, false when the
  /// limit passed first (still running: call it again, or wait()). Throws Error when the
  /// operation failed, with status CONCORD_ERR_TIMEOUT when it failed by a deadline of its own.
  bool wait_for(double timeout_s) {
    if (request_ == nullptr) throw Error(CONCORD_ERR_INVALID_ARGUMENT, "wait on an empty Future");
    const concord_status_t s = concord_wait(request_, timeout_s);
    if (s == CONCORD_IN_PROGRESS) return false;
    detail::Check(s, concord_request_error(request_));
    return true;
  }
  /// CUDA operations: makes `stream` (a cudaStream_t) wait on the GPU for the result, blocking
  /// the host only until the operation was launched (torch's Work.wait()), at most timeout_s
  /// (< 0: no limit). True when the stream waits (or the operation already succeeded); false when
  /// the limit passed before the launch (nothing queued: call it again). Throws Error on failure.
  bool wait_stream(void* stream, double timeout_s = -1.0) {
    if (request_ == nullptr) throw Error(CONCORD_ERR_INVALID_ARGUMENT, "wait on an empty Future");
    const concord_status_t s = concord_request_wait_stream(request_, stream, timeout_s);
    if (s == CONCORD_IN_PROGRESS) return false;
    // The C call keeps the reason of every failure on the request, its own refusals too (a CPU
    // operation, a NULL stream, a group member) and the operation's INVALID_ARGUMENT.
    detail::Check(s, concord_request_error(request_));
    return true;
  }
  /// An allgather's, gather's (on its root: empty elsewhere) or alltoall's result: its bytes (a
  /// copy made on the host) and its first dimension. CPU tensors only: a CUDA operation's result
  /// is in the device buffer the caller gave it (concord_request_output describes it), and this
  /// throws Error (INVALID_ARGUMENT) without waiting.
  std::vector<uint8_t> output(int64_t* first_dim = nullptr) {
    if (on_device_) {
      throw Error(CONCORD_ERR_INVALID_ARGUMENT,
                  "Future::output: a CUDA operation's result is in its device output buffer; "
                  "output() copies host memory only");
    }
    wait();
    void* data = nullptr;
    size_t bytes = 0;
    detail::Check(concord_request_output(request_, &data, &bytes, first_dim), "no output");
    const auto* p = static_cast<const uint8_t*>(data);
    return std::vector<uint8_t>(p, p + bytes);
  }
  /// An alltoall's received splits (after waiting): the rows from each of the `ranks` ranks.
  std::vector<int64_t> received_splits(int ranks) {
    wait();
    std::vector<int64_t> splits(static_cast<size_t>(ranks > 0 ? ranks : 0));
    detail::Check(concord_request_received_splits(request_, splits.data(), ranks),
                  concord_request_error(request_));
    return splits;
  }
  /// A recv's received dtype and shape (after waiting): see concord_request_output_shape.
  std::vector<int64_t> output_shape(concord_dtype_t* dtype = nullptr) {
    wait();
    int64_t shape[CONCORD_MAX_DIMS];
    int ndim = 0;
    detail::Check(concord_request_output_shape(request_, dtype, &ndim, shape), "not a recv");
    return std::vector<int64_t>(shape, shape + ndim);
  }
  /// Bytes this rank put on the wire (after waiting): see concord_request_wire_bytes.
  uint64_t wire_bytes() {
    wait();
    uint64_t bytes = 0;
    detail::Check(concord_request_wire_bytes(request_, &bytes), "no wire bytes");
    return bytes;
  }
  concord_request_t native() const { return request_; }

 private:
  concord_request_t request_ = nullptr;
  bool on_device_ = false;
};

/// Called once when an operation finishes, on the thread that completes it (the engine's thread, a
/// thread waiting in wait(), a lane or device completion thread: see concord_callback_t). It must
/// not wait on operations of the same communicator. An exception it throws is swallowed.
using Callback = std::function<void(concord_status_t status)>;

/// One communicator: owns the engine, its thread and its connections. Thread-safe: any thread
/// may enqueue. Move-only; the destructor finalizes (pending operations fail).
class Communicator {
 public:
  /// From the environment (CONCORD_*, torchrun's, Slurm's or Open MPI's variables).
  Communicator() { detail::CheckComm(concord_init(&comm_), nullptr); }
  explicit Communicator(const concord_config_t& config) {
    detail::CheckComm(concord_init_config(&config, &comm_), nullptr);
  }
  Communicator(Communicator&& o) noexcept : comm_(std::exchange(o.comm_, nullptr)) {}
  Communicator& operator=(Communicator&& o) noexcept {
    if (this != &o) {
      concord_finalize(comm_);
      comm_ = std::exchange(o.comm_, nullptr);
    }
    return *this;
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator() { concord_finalize(comm_); }

  /// Sub-communicators (concord_comm_split, concord_comm_create_group): collective over this
  /// communicator; empty for a rank of color CONCORD_UNDEFINED or outside the list.
  std::optional<Communicator> split(int color, int key = 0) {
    concord_comm_t sub = nullptr;
    detail::CheckComm(concord_comm_split(comm_, color, key, &sub), comm_);
    return Adopt(sub);
  }
  std::optional<Communicator> create_group(const std::vector<int>& ranks) {
    concord_comm_t sub = nullptr;
    detail::CheckComm(
        concord_comm_create_group(comm_, ranks.data(), static_cast<int>(ranks.size()), &sub),
        comm_);
    return Adopt(sub);
  }

  /// concord_join: this rank is out of data; takes part with the identity until every rank has
  /// joined, then returns the last rank to join.
  int join() {
    int last = -1;
    detail::CheckComm(concord_join(comm_, &last), comm_);
    return last;
  }

  int rank() const { return Get(concord_comm_rank); }
  int size() const { return Get(concord_comm_size); }
  int local_rank() const { return Get(concord_comm_local_rank); }
  int local_size() const { return Get(concord_comm_local_size); }
  /// The communicator's counters (concord_stats_t: cache hits, evictions, collectives, ...,
  /// and the scratch memory it holds).
  concord_stats_t stats() const {
    concord_stats_t s{};
    s.struct_size = sizeof(s);
    detail::CheckComm(concord_comm_stats(comm_, &s), comm_);
    return s;
  }

  /// The communicator's metrics as JSON (concord_comm_metrics).
  std::string metrics() const {
    size_t length = 0;
    detail::CheckComm(concord_comm_metrics(comm_, nullptr, 0, &length), comm_);
    for (;;) {
      std::string json(length + 4096, '\0');
      const concord_status_t s = concord_comm_metrics(comm_, &json[0], json.size(), &length);
      if (s == CONCORD_ERR_INVALID_ARGUMENT && length + 1 > json.size()) continue;  // it grew
      detail::CheckComm(s, comm_);
      json.resize(length);
      return json;
    }
  }

  /// Allreduce; `out` absent means in place. prescale multiplies the input, postscale the result.
  /// `compression` is a compressor spec ("none", "fp16", "topk:density=0.01", ...); empty: the
  /// communicator's default (CONCORD_COMPRESSION). A spec the library cannot parse throws Error
  /// (INVALID_ARGUMENT) naming the problem.
  Future allreduce_async(const std::string& name, const TensorView& in,
                         ReduceOp op = ReduceOp::kSum, const TensorView* out = nullptr,
                         double prescale = 1.0, double postscale = 1.0, Callback callback = nullptr,
                         const std::string& compression = "", const DeviceOptions& device = {}) {
    const concord_allreduce_opts_t o = AllreduceOpts(op, prescale, postscale, compression);
    const concord_tensor_t ct = in.c_tensor();
    concord_tensor_t co;
    if (out) co = out->c_tensor();
    const concord_device_opts_t d = device.c_opts();
    return Enqueue(&in, std::move(callback),
                   [&](concord_callback_t cb, void* ud, concord_request_t* r) {
                     return concord_allreduce_async_ex(comm_, name.c_str(), &ct,
                                                       out ? &co : nullptr, &o, &d, cb, ud, r);
                   });
  }
  /// Blocking: this thread runs the operation itself (concord_allreduce), with no hand-off to the
  /// engine's thread, unlike allreduce_async(...).wait(). CUDA tensors: after the legacy stream.
  void allreduce(const std::string& name, const TensorView& in, ReduceOp op = ReduceOp::kSum,
                 const TensorView* out = nullptr, double prescale = 1.0, double postscale = 1.0,
                 const std::string& compression = "") {
    const concord_allreduce_opts_t o = AllreduceOpts(op, prescale, postscale, compression);
    const concord_tensor_t ct = in.c_tensor();
    concord_tensor_t co;
    if (out) co = out->c_tensor();
    detail::CheckComm(concord_allreduce(comm_, name.c_str(), &ct, out ? &co : nullptr, &o), comm_);
  }

  /// Allgather along the first dimension (it may differ between ranks). With out == nullptr the
  /// Future owns the result (Future::output).
  Future allgather_async(const std::string& name, const TensorView& in, void* out = nullptr,
                         size_t out_capacity = 0, Callback callback = nullptr,
                         const DeviceOptions& device = {}) {
    const concord_tensor_t ct = in.c_tensor();
    const concord_device_opts_t d = device.c_opts();
    return Enqueue(&in, std::move(callback),
                   [&](concord_callback_t cb, void* ud, concord_request_t* r) {
                     return concord_allgather_async_ex(comm_, name.c_str(), &ct, out, out_capacity,
                                                       &d, cb, ud, r);
                   });
  }

  /// Broadcast from root; `out` absent means in place.
  Future broadcast_async(const std::string& name, const TensorView& in, int root,
                         const TensorView* out = nullptr, Callback callback = nullptr,
                         const DeviceOptions& device = {}) {
    const concord_tensor_t ct = in.c_tensor();
    concord_tensor_t co;
    if (out) co = out->c_tensor();
    const concord_device_opts_t d = device.c_opts();
    return Enqueue(&in, std::move(callback),
                   [&](concord_callback_t cb, void* ud, concord_request_t* r) {
                     return concord_broadcast_async_ex(comm_, name.c_str(), &ct,
                                                       out ? &co : nullptr, root, &d, cb, ud, r);
                   });
  }
  /// Blocking, in place (concord_broadcast), as allreduce().
  void broadcast(const std::string& name, const TensorView& in, int root) {
    const concord_tensor_t ct = in.c_tensor();
    detail::CheckComm(concord_broadcast(comm_, name.c_str(), &ct, nullptr, root), comm_);
  }

  void barrier() { detail::CheckComm(concord_barrier(comm_), comm_); }

  /// Reduce-scatter along the first dimension into `out` ([recv_splits[rank], in's other dims]).
  /// Empty recv_splits: the even split (the first n % size ranks get one more row); otherwise one
  /// count per rank, the same on every rank. `compression`: "fp16" or "bf16" (float32/float64,
  /// CPU tensors), empty or "none" for none.
  Future reducescatter_async(const std::string& name, const TensorView& in, const TensorView& out,
                             ReduceOp op = ReduceOp::kSum,
                             const std::vector<int64_t>& recv_splits = {}, double prescale = 1.0,
                             double postscale = 1.0, Callback callback = nullptr,
                             const std::string& compression = "",
                             const DeviceOptions& device = {}) {
    const concord_reducescatter_opts_t o =
        ReducescatterOpts(op, prescale, postscale, recv_splits, compression);
    const concord_tensor_t ct = in.c_tensor();
    const concord_tensor_t co = out.c_tensor();
    const concord_device_opts_t d = device.c_opts();
    return Enqueue(
        &in, std::move(callback), [&](concord_callback_t cb, void* ud, concord_request_t* r) {
          return concord_reducescatter_async_ex(comm_, name.c_str(), &ct, &co, &o, &d, cb, ud, r);
        });
  }
  /// Blocking (concord_reducescatter), as allreduce(): refused inside this thread's group.
  void reducescatter(const std::string& name, const TensorView& in, const TensorView& out,
                     ReduceOp op = ReduceOp::kSum, const std::vector<int64_t>& recv_splits = {},
                     const std::string& compression = "") {
    const concord_reducescatter_opts_t o =
        ReducescatterOpts(op, 1.0, 1.0, recv_splits, compression);
    const concord_tensor_t ct = in.c_tensor();
    const concord_tensor_t co = out.c_tensor();
    detail::CheckComm(concord_reducescatter(comm_, name.c_str(), &ct, &co, &o), comm_);
  }

  /// Reduce to `root`: only the root's `out` (absent: in place) receives the reduction; on the
  /// other ranks `out` is ignored and untouched. prescale and postscale as in allreduce_async.
  Future reduce_async(const std::string& name, const TensorView& in, int root,
                      ReduceOp op = ReduceOp::kSum, const TensorView* out = nullptr,
                      double prescale = 1.0, double postscale = 1.0, Callback callback = nullptr,
                      const DeviceOptions& device = {}) {
    const concord_reduce_opts_t o = ReduceOpts(op, prescale, postscale);
    const concord_tensor_t ct = in.c_tensor();
    concord_tensor_t co;
    if (out) co = out->c_tensor();
    const concord_device_opts_t d = device.c_opts();
    return Enqueue(&in, std::move(callback),
                   [&](concord_callback_t cb, void* ud, concord_request_t* r) {
                     return concord_reduce_async_ex(comm_, name.c_str(), &ct, out ? &co : nullptr,
                                                    root, &o, &d, cb, ud, r);
                   });
  }
  /// Blocking (concord_reduce), as allreduce().
  void reduce(const std::string& name, const TensorView& in, int root, ReduceOp op = ReduceOp::kSum,
              const TensorView* out = nullptr) {
    const concord_reduce_opts_t o = ReduceOpts(op, 1.0, 1.0);
    const concord_tensor_t ct = in.c_tensor();
    concord_tensor_t co;
    if (out) co = out->c_tensor();
    detail::CheckComm(concord_reduce(comm_, name.c_str(), &ct, out ? &co : nullptr, root, &o),
                      comm_);
  }

  /// Gather to `root` along the first dimension (it may differ between ranks): on the root as
  /// allgather_async (out == nullptr: the Future owns the result; a CUDA tensor needs `out` on the
  /// device); elsewhere `out` is ignored and Future::output is empty.
  Future gather_async(const std::string& name, const TensorView& in, int root, void* out = nullptr,
                      size_t out_capacity = 0, Callback callback = nullptr,
                      const DeviceOptions& device = {}) {
    const concord_tensor_t ct = in.c_tensor();
    const concord_device_opts_t d = device.c_opts();
    return Enqueue(&in, std::move(callback),
                   [&](concord_callback_t cb, void* ud, concord_request_t* r) {
                     return concord_gather_async_ex(comm_, name.c_str(), &ct, out, out_capacity,
                                                    root, &d, cb, ud, r);
                   });
  }

  /// All-to-all along the first dimension: splits[d] rows to rank d (empty: the even split). With
  /// out == nullptr the Future owns the result (Future::output); Future::received_splits tells
  /// how many rows came from each rank. A CUDA tensor needs `out` on the device.
  Future alltoall_async(const std::string& name, const TensorView& in,
                        const std::vector<int64_t>& splits = {}, void* out = nullptr,
                        size_t out_capacity = 0, Callback callback = nullptr,
                        const DeviceOptions& device = {}) {
    concord_alltoall_opts_t o;
    concord_alltoall_opts_init(&o);
    if (!splits.empty()) {
      o.splits = splits.data();
      o.nsplits = static_cast<int>(splits.size());
    }
    const concord_tensor_t ct = in.c_tensor();
    const concord_device_opts_t d = device.c_opts();
    return Enqueue(&in, std::move(callback),
                   [&](concord_callback_t cb, void* ud, concord_request_t* r) {
                     return concord_alltoall_async_ex(comm_, name.c_str(), &ct, out, out_capacity,
                                                      &o, &d, cb, ud, r);
                   });
  }

  /// Point to point (concord_send_async): `in` to rank `peer` with `tag`, not negotiated; FIFO
  /// per (peer, tag). `in` must stay valid until the Future is ready.
  Future send_async(const TensorView& in, int peer, int64_t tag, Callback callback = nullptr,
                    const DeviceOptions& device = {}) {
    const concord_tensor_t ct = in.c_tensor();
    const concord_device_opts_t d = device.c_opts();
    return Enqueue(&in, std::move(callback),
                   [&](concord_callback_t cb, void* ud, concord_request_t* r) {
                     return concord_send_async_ex(comm_, &ct, peer, tag, &d, cb, ud, r);
                   });
  }
  /// The next message from (peer, tag) into `expected` (its dtype and shape must match the
  /// sender's, else Error MISMATCH naming both), or with expected == nullptr into a buffer the
  /// Future owns (Future::output, Future::output_shape).
  Future recv_async(const TensorView* expected, int peer, int64_t tag, Callback callback = nullptr,
                    const DeviceOptions& device = {}) {
    concord_tensor_t ct;
    if (expected) ct = expected->c_tensor();
    const concord_device_opts_t d = device.c_opts();
    return Enqueue(
        expected, std::move(callback), [&](concord_callback_t cb, void* ud, concord_request_t* r) {
          return concord_recv_async_ex(comm_, expected ? &ct : nullptr, peer, tag, &d, cb, ud, r);
        });
  }
  /// Blocking (concord_send, concord_recv).
  void send(const TensorView& in, int peer, int64_t tag) {
    const concord_tensor_t ct = in.c_tensor();
    detail::CheckComm(concord_send(comm_, &ct, peer, tag), comm_);
  }
  void recv(const TensorView& expected, int peer, int64_t tag) {
    const concord_tensor_t ct = expected.c_tensor();
    detail::CheckComm(concord_recv(comm_, &ct, peer, tag), comm_);
  }

  /// Ends this rank's training step (see concord_end_step): a tensor a rank skips in a step then
  /// fails with a mismatch instead of being reduced with another step's.
  void end_step() { detail::CheckComm(concord_end_step(comm_), comm_); }

  /// Operations enqueued by this thread inside the group are negotiated and fused as one unit.
  /// Every rank must enqueue the same members in the same order (see concord_group_start).
  class Group {
   public:
    explicit Group(Communicator& c) : c_(c) {
      detail::CheckComm(concord_group_start(c_.comm_), c_.comm_);
    }
    ~Group() noexcept(false) {
      const concord_status_t s = concord_group_end(c_.comm_);
      if (s != CONCORD_SUCCESS && std::uncaught_exceptions() == 0) {
        throw Error(s, concord_comm_last_error(c_.comm_));
      }
    }
    Group(const Group&) = delete;
    Group& operator=(const Group&) = delete;

   private:
    Communicator& c_;
  };

  concord_comm_t native() const { return comm_; }

 private:
  struct Adopted {};
  Communicator(Adopted, concord_comm_t comm) : comm_(comm) {}
  static std::optional<Communicator> Adopt(concord_comm_t sub) {
    if (sub == nullptr) return std::nullopt;
    return Communicator(Adopted{}, sub);
  }

  int Get(concord_status_t (*fn)(concord_comm_t, int*)) const {
    int v = -1;
    detail::CheckComm(fn(comm_, &v), comm_);
    return v;
  }

  // The C options of an allreduce; `compression` must outlive their use.
  static concord_allreduce_opts_t AllreduceOpts(ReduceOp op, double prescale, double postscale,
                                                const std::string& compression) {
    concord_allreduce_opts_t o;
    concord_allreduce_opts_init(&o);
    o.op = static_cast<concord_reduce_op_t>(op);
    o.prescale = prescale;
    o.postscale = postscale;
    if (!compression.empty()) o.compression = compression.c_str();
    return o;
  }

  // `recv_splits` (and `compression`) must outlive the struct: it points into them.
  static concord_reducescatter_opts_t ReducescatterOpts(ReduceOp op, double prescale,
                                                        double postscale,
                                                        const std::vector<int64_t>& recv_splits,
                                                        const std::string& compression) {
    concord_reducescatter_opts_t o;
    concord_reducescatter_opts_init(&o);
    o.op = static_cast<concord_reduce_op_t>(op);
    o.prescale = prescale;
    o.postscale = postscale;
    if (!compression.empty()) o.compression = compression.c_str();
    if (!recv_splits.empty()) {
      o.recv_splits = recv_splits.data();
      o.nsplits = static_cast<int>(recv_splits.size());
    }
    return o;
  }
  static concord_reduce_opts_t ReduceOpts(ReduceOp op, double prescale, double postscale) {
    concord_reduce_opts_t o;
    concord_reduce_opts_init(&o);
    o.op = static_cast<concord_reduce_op_t>(op);
    o.prescale = prescale;
    o.postscale = postscale;
    return o;
  }

  // Calls submit with a C trampoline for callback (if any); the heap-held callback is freed after
  // it runs, or at once when the enqueue fails.
  // `in` is the operation's tensor: a CUDA one makes a Future whose output() refuses.
  template <typename Submit>
  Future Enqueue(const TensorView* in, Callback callback, Submit&& submit) {
    concord_request_t r = nullptr;
    concord_status_t s;
    if (callback) {
      auto* held = new Callback(std::move(callback));
      s = submit(
          [](concord_request_t, concord_status_t st, void* ud) {
            std::unique_ptr<Callback> cb(static_cast<Callback*>(ud));
            try {
              (*cb)(st);
            } catch (...) {
              // A callback runs on one of Concord's threads: no exception may unwind through C.
            }
          },
          held, &r);
      if (s != CONCORD_SUCCESS) delete held;
    } else {
      s = submit(nullptr, nullptr, &r);
    }
    detail::CheckComm(s, comm_);
    return Future(r, in != nullptr && in->device() >= 0);
  }

  concord_comm_t comm_ = nullptr;
};

}  // namespace concord

#endif  // C++17
#endif  // CONCORD_CONCORD_HPP_
