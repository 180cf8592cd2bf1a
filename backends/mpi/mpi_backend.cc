#include "backends/mpi/mpi_backend.h"

#include <array>
#include <climits>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <thread>

namespace concord {
namespace {

// MPI user function over Concord's own kernels (base/dtype.h): inout = in (op) inout.
template <DType kType, ReduceOp kOp>
void ConcordReduce(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceElements(inout, in, inout, static_cast<size_t>(*len), kType, kOp);
}

// The user function that reduces `dtype` with op `op_index` (OpIndex) by Concord's kernels, or
// nullptr where MPI's built-in op does. Concord's own, so that every backend gives the same bits
// (ReduceElements' contract), for:
//   - float16 and bfloat16: MPI has no such types;
//   - 8-bit sums and products: Open MPI 4.1.4's vectorised (op/avx) 8-bit sums saturate (uint8
//     200 x 3 ranks, 100000 elements, gave 255, not 88). Its 8-bit products wrapped there, and
//     its 32- and 64-bit sums and products (checked: 3 ranks, 100000 elements), but the
//     8-bit products come from the same component, whose paths differ by CPU (AVX2, AVX-512):
//     they go with the sums (tests/mp/conformance_edge.cc checks 8-bit ones at 1 to 4 ranks);
//   - floating min and max: MPI_MIN and MPI_MAX return one operand or the other for a NaN or for
//     -0 and +0, depending on which rank holds which, so ranks could end with different bits.
MPI_User_function* OwnReduction(DType dtype, int op_index) {
  using Table = std::array<MPI_User_function*, 4>;  // by OpIndex: sum, min, max, product
  switch (dtype) {
    case DType::kFloat16:
      return Table{ConcordReduce<DType::kFloat16, ReduceOp::kSum>,
                   ConcordReduce<DType::kFloat16, ReduceOp::kMin>,
                   ConcordReduce<DType::kFloat16, ReduceOp::kMax>,
                   ConcordReduce<DType::kFloat16, ReduceOp::kProduct>}[op_index];
    case DType::kBFloat16:
      return Table{ConcordReduce<DType::kBFloat16, ReduceOp::kSum>,
                   ConcordReduce<DType::kBFloat16, ReduceOp::kMin>,
                   ConcordReduce<DType::kBFloat16, ReduceOp::kMax>,
                   ConcordReduce<DType::kBFloat16, ReduceOp::kProduct>}[op_index];
    case DType::kUint8:
      return Table{ConcordReduce<DType::kUint8, ReduceOp::kSum>, nullptr, nullptr,
                   ConcordReduce<DType::kUint8, ReduceOp::kProduct>}[op_index];
    case DType::kInt8:
      return Table{ConcordReduce<DType::kInt8, ReduceOp::kSum>, nullptr, nullptr,
                   ConcordReduce<DType::kInt8, ReduceOp::kProduct>}[op_index];
    case DType::kFloat32:
      return Table{nullptr, ConcordReduce<DType::kFloat32, ReduceOp::kMin>,
                   ConcordReduce<DType::kFloat32, ReduceOp::kMax>, nullptr}[op_index];
    case DType::kFloat64:
      return Table{nullptr, ConcordReduce<DType::kFloat64, ReduceOp::kMin>,
                   ConcordReduce<DType::kFloat64, ReduceOp::kMax>, nullptr}[op_index];
    case DType::kInt32:
    case DType::kInt64:
      return nullptr;
  }
  return nullptr;
}

MPI_Datatype MpiType(DType dtype) {
  switch (dtype) {
    case DType::kUint8:
      return MPI_UINT8_T;
    case DType::kInt8:
      return MPI_INT8_T;
    case DType::kInt32:
      return MPI_INT32_T;
    case DType::kInt64:
      return MPI_INT64_T;
    case DType::kFloat16:
    case DType::kBFloat16:
      return MPI_UINT16_T;  // reduced by user-defined ops (OwnReduction)
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kFloat64:
      return MPI_DOUBLE;
  }
  return MPI_DATATYPE_NULL;
}

// Index of a reduce op among the four MPI reduces (average is reduced as a sum).
int OpIndex(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return 0;
    case ReduceOp::kMin:
      return 1;
    case ReduceOp::kMax:
      return 2;
    case ReduceOp::kProduct:
      return 3;
  }
  return -1;
}

// Contract: see CreateMpiBackend. Owns its communicator and its user-defined MPI_Ops
// (OwnReduction); used by one thread at a time (the engine's); Interrupter()'s callable is for any
// thread. The first failure is sticky. After a timeout or an interrupt the pending request and the
// communicator are deliberately leaked (MPI could still write into the buffer if the missing peer
// ever arrived, and freeing either could block).
class MpiBackend : public Backend {
 public:
  MpiBackend(std::shared_ptr<MpiEnvironment> env, MPI_Comm comm, int rank, int size,
             std::chrono::milliseconds timeout, size_t max_message_bytes)
      : env_(std::move(env)),
        comm_(comm),
        rank_(rank),
        size_(size),
        timeout_(timeout),
        max_message_bytes_(max_message_bytes) {
    for (auto& per_type : own_ops_) per_type.fill(MPI_OP_NULL);
  }

  ~MpiBackend() override {
    if (env_->abandoned()) return;
    auto lock = env_->Lock();
    if (!lock) return;
    for (auto& per_type : own_ops_) {
      for (MPI_Op& op : per_type) {
        if (op != MPI_OP_NULL) MPI_Op_free(&op);
      }
    }
    MPI_Comm_free(&comm_);
  }

  // Creates the user-defined MPI_Ops (commutative) of every dtype and op OwnReduction names.
  Status CreateOwnOps() {
    CONCORD_MPI_LOCK_OR_RETURN(lock, *env_);
    for (int t = 0; t < kNumDTypes; ++t) {
      for (int o = 0; o < 4; ++o) {
        MPI_User_function* const fn = OwnReduction(static_cast<DType>(t), o);
        if (fn != nullptr) CONCORD_MPI_CHECK(MPI_Op_create(fn, 1, &own_ops_[t][o]));
      }
    }
    return Status::Ok();
  }

  const char* name() const override { return "mpi"; }

  // Ends the current and every later wait for a request (WaitForRequest) with an error.
  std::function<void()> Interrupter() override {
    std::shared_ptr<std::atomic<bool>> flag = interrupted_;
    return [flag] { flag->store(true); };
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // The MPI call that ran it (the MPI library picks the algorithm): "MPI_Iallreduce", ...; a
  // reduce-scatter is one MPI_Ireduce per rank; a gather past one call's size an allgatherv.
  const char* LastAlgorithm() const override { return last_algorithm_; }

  Status Allreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    last_algorithm_ = "MPI_Iallreduce";
    if (!IsValidDType(static_cast<int>(dtype)) || OpIndex(op) < 0) {
      return InvalidArgument("mpi allreduce: invalid dtype or reduce op");
    }
    if (count > 0 && data == nullptr) return InvalidArgument("mpi allreduce: data is null");
    if (!failed_.ok()) return failed_;
    if (count == 0 || size_ == 1) return Status::Ok();
    const size_t esize = DTypeSize(dtype);
    const MPI_Op mpi_op = OpFor(dtype, op);
    const size_t per_call =
        std::max<size_t>(1, std::min<size_t>(max_message_bytes_ / esize, INT_MAX));
    auto* bytes = static_cast<char*>(data);
    for (size_t done = 0; done < count; done += per_call) {
      const int n = static_cast<int>(std::min(per_call, count - done));
      MPI_Request request;
      {
        auto lock = env_->Lock();
        if (!lock) return Fail(env_->StalledError());
        const int rc = MPI_Iallreduce(MPI_IN_PLACE, bytes + done * esize, n, MpiType(dtype), mpi_op,
                                      comm_, &request);
        if (rc != MPI_SUCCESS) return Fail(MpiError(rc, "MPI_Iallreduce", __FILE__, __LINE__));
      }
      CONCORD_RETURN_IF_ERROR(Wait(&request, "allreduce of " + std::to_string(count) + " x " +
                                                 DTypeName(dtype) + " (" + ReduceOpName(op) + ")"));
    }
    return Status::Ok();
  }

  Status Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes_per_rank) override {
    last_algorithm_ = "MPI_Iallgatherv";
    if (bytes_per_rank.size() != static_cast<size_t>(size_)) {
      return InvalidArgument("mpi allgatherv: " + std::to_string(bytes_per_rank.size()) +
                             " sizes for " + std::to_string(size_) + " ranks");
    }
    const size_t total = std::accumulate(bytes_per_rank.begin(), bytes_per_rank.end(), size_t{0});
    const size_t mine = bytes_per_rank[rank_];
    if ((mine > 0 && in == nullptr) || (total > 0 && out == nullptr)) {
      return InvalidArgument("mpi allgatherv: null buffer");
    }
    if (!failed_.ok()) return failed_;
    if (total == 0) return Status::Ok();
    std::vector<size_t> offsets(size_, 0);
    for (int r = 1; r < size_; ++r) offsets[r] = offsets[r - 1] + bytes_per_rank[r - 1];
    auto* dst = static_cast<char*>(out);
    if (size_ == 1) {
      std::memmove(dst, in, mine);
      return Status::Ok();
    }
    if (total > max_message_bytes_ || total > static_cast<size_t>(INT_MAX)) {
      // Counts or displacements beyond MPI's int: every rank broadcasts its part, in pieces.
      if (mine > 0 && in != dst + offsets[rank_]) std::memmove(dst + offsets[rank_], in, mine);
      for (int r = 0; r < size_; ++r) {
        CONCORD_RETURN_IF_ERROR(Broadcast(dst + offsets[r], bytes_per_rank[r], r));
      }
      return Status::Ok();
    }
    std::vector<int> counts(size_), displs(size_);
    for (int r = 0; r < size_; ++r) {
      counts[r] = static_cast<int>(bytes_per_rank[r]);
      displs[r] = static_cast<int>(offsets[r]);
    }
    const void* send = in == dst + offsets[rank_] ? MPI_IN_PLACE : in;
    MPI_Request request;
    {
      auto lock = env_->Lock();
      if (!lock) return Fail(env_->StalledError());
      const int rc = MPI_Iallgatherv(send, counts[rank_], MPI_BYTE, dst, counts.data(),
                                     displs.data(), MPI_BYTE, comm_, &request);
      if (rc != MPI_SUCCESS) return Fail(MpiError(rc, "MPI_Iallgatherv", __FILE__, __LINE__));
    }
    return Wait(&request, "allgatherv of " + std::to_string(total) + " bytes");
  }

  Status Broadcast(void* data, size_t bytes, int root) override {
    last_algorithm_ = "MPI_Ibcast";
    if (root < 0 || root >= size_) {
      return InvalidArgument("mpi broadcast: root " + std::to_string(root) + " out of range");
    }
    if (bytes > 0 && data == nullptr) return InvalidArgument("mpi broadcast: data is null");
    if (!failed_.ok()) return failed_;
    if (bytes == 0 || size_ == 1) return Status::Ok();
    const size_t per_call = std::min<size_t>(max_message_bytes_, INT_MAX);
    auto* p = static_cast<char*>(data);
    for (size_t done = 0; done < bytes; done += per_call) {
      const int n = static_cast<int>(std::min(per_call, bytes - done));
      MPI_Request request;
      {
        auto lock = env_->Lock();
        if (!lock) return Fail(env_->StalledError());
        const int rc = MPI_Ibcast(p + done, n, MPI_BYTE, root, comm_, &request);
        if (rc != MPI_SUCCESS) return Fail(MpiError(rc, "MPI_Ibcast", __FILE__, __LINE__));
      }
      CONCORD_RETURN_IF_ERROR(Wait(&request, "broadcast of " + std::to_string(bytes) +
                                                 " bytes from rank " + std::to_string(root)));
    }
    return Status::Ok();
  }

  // MPI_Ireduce to the root, in pieces of at most max_message_bytes_ (in place on the root).
  Status Reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                int root) override {
    last_algorithm_ = "MPI_Ireduce";
    if (!IsValidDType(static_cast<int>(dtype)) || OpIndex(op) < 0) {
      return InvalidArgument("mpi reduce: invalid dtype or reduce op");
    }
    if (root < 0 || root >= size_) {
      return InvalidArgument("mpi reduce: root " + std::to_string(root) + " out of range");
    }
    if (count > 0 && (in == nullptr || out == nullptr)) {
      return InvalidArgument("mpi reduce: null buffer");
    }
    if (!failed_.ok()) return failed_;
    const size_t esize = DTypeSize(dtype);
    if (count == 0) return Status::Ok();
    if (size_ == 1) {
      if (in != out) std::memmove(out, in, count * esize);
      return Status::Ok();
    }
    const MPI_Op mpi_op = OpFor(dtype, op);
    const size_t per_call =
        std::max<size_t>(1, std::min<size_t>(max_message_bytes_ / esize, INT_MAX));
    const auto* src = static_cast<const char*>(in);
    auto* dst = static_cast<char*>(out);
    const bool in_place = rank_ == root && in == out;
    for (size_t done = 0; done < count; done += per_call) {
      const int n = static_cast<int>(std::min(per_call, count - done));
      MPI_Request request;
      {
        auto lock = env_->Lock();
        if (!lock) return Fail(env_->StalledError());
        // The receive buffer matters on the root only (elsewhere none: no aliasing of in).
        const int rc = MPI_Ireduce(in_place ? MPI_IN_PLACE : src + done * esize,
                                   rank_ == root ? dst + done * esize : nullptr, n, MpiType(dtype),
                                   mpi_op, root, comm_, &request);
        if (rc != MPI_SUCCESS) return Fail(MpiError(rc, "MPI_Ireduce", __FILE__, __LINE__));
      }
      CONCORD_RETURN_IF_ERROR(Wait(&request, "reduce of " + std::to_string(count) + " x " +
                                                 DTypeName(dtype) + " (" + ReduceOpName(op) +
                                                 ") to rank " + std::to_string(root)));
    }
    return Status::Ok();
  }

  // MPI_Igatherv to the root; past one call's size, Allgatherv (out is full-size everywhere).
  Status Gatherv(const void* in, void* out, const std::vector<size_t>& bytes_per_rank,
                 int root) override {
    if (bytes_per_rank.size() != static_cast<size_t>(size_) || root < 0 || root >= size_) {
      return InvalidArgument("mpi gatherv: " + std::to_string(bytes_per_rank.size()) +
                             " sizes for " + std::to_string(size_) + " ranks, root " +
                             std::to_string(root));
    }
    const size_t total = std::accumulate(bytes_per_rank.begin(), bytes_per_rank.end(), size_t{0});
    if (size_ == 1 || total > max_message_bytes_ || total > static_cast<size_t>(INT_MAX)) {
      return Allgatherv(in, out, bytes_per_rank);
    }
    last_algorithm_ = "MPI_Igatherv";
    const size_t mine = bytes_per_rank[rank_];
    if ((mine > 0 && in == nullptr) || (total > 0 && out == nullptr)) {
      return InvalidArgument("mpi gatherv: null buffer");
    }
    if (!failed_.ok()) return failed_;
    if (total == 0) return Status::Ok();
    std::vector<int> counts(size_), displs(size_);
    int offset = 0;
    for (int r = 0; r < size_; ++r) {
      counts[r] = static_cast<int>(bytes_per_rank[r]);
      displs[r] = offset;
      offset += counts[r];
    }
    auto* dst = static_cast<char*>(out);
    const void* send = rank_ == root && in == dst + displs[rank_] ? MPI_IN_PLACE : in;
    MPI_Request request;
    {
      auto lock = env_->Lock();
      if (!lock) return Fail(env_->StalledError());
      const int rc = MPI_Igatherv(send, counts[rank_], MPI_BYTE, dst, counts.data(), displs.data(),
                                  MPI_BYTE, root, comm_, &request);
      if (rc != MPI_SUCCESS) return Fail(MpiError(rc, "MPI_Igatherv", __FILE__, __LINE__));
    }
    return Wait(&request,
                "gatherv of " + std::to_string(total) + " bytes to rank " + std::to_string(root));
  }

  Status Barrier() override {
    last_algorithm_ = "MPI_Ibarrier";
    if (!failed_.ok()) return failed_;
    if (size_ == 1) return Status::Ok();
    MPI_Request request;
    {
      auto lock = env_->Lock();
      if (!lock) return Fail(env_->StalledError());
      const int rc = MPI_Ibarrier(comm_, &request);
      if (rc != MPI_SUCCESS) return Fail(MpiError(rc, "MPI_Ibarrier", __FILE__, __LINE__));
    }
    return Wait(&request, "barrier");
  }

  Status ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                       ReduceOp op) override;
  Status Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes) override;

 private:
  MPI_Op OpFor(DType dtype, ReduceOp op) const {
    const int index = OpIndex(op);
    const MPI_Op own = own_ops_[static_cast<int>(dtype)][index];
    if (own != MPI_OP_NULL) return own;
    const MPI_Op ops[4] = {MPI_SUM, MPI_MIN, MPI_MAX, MPI_PROD};
    return ops[index];
  }

  Status Wait(MPI_Request* request, const std::string& what) {
    const Status s = WaitForRequest(*env_, request, Deadline::After(timeout_), "mpi " + what,
                                    interrupted_.get());
    return s.ok() ? s : Fail(s);
  }

  Status Fail(Status status) {
    failed_ = std::move(status);
    return failed_;
  }

  std::shared_ptr<MpiEnvironment> env_;
  MPI_Comm comm_;
  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  const size_t max_message_bytes_;
  // By dtype and OpIndex: MPI_OP_NULL where MPI's built-in op is used (OwnReduction).
  std::array<std::array<MPI_Op, 4>, kNumDTypes> own_ops_;
  Status failed_;
  const char* last_algorithm_ = nullptr;  // LastAlgorithm()
  // Set by Interrupter()'s callable, from any thread; shared so that it outlives the backend.
  const std::shared_ptr<std::atomic<bool>> interrupted_ =
      std::make_shared<std::atomic<bool>>(false);
};

Status MpiBackend::ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                                 DType dtype, ReduceOp op) {
  last_algorithm_ = "MPI_Ireduce";
  if (!IsValidDType(static_cast<int>(dtype)) || OpIndex(op) < 0) {
    return InvalidArgument("mpi reduce-scatter: invalid dtype or reduce op");
  }
  if (counts.size() != static_cast<size_t>(size_)) {
    return InvalidArgument("mpi reduce-scatter: " + std::to_string(counts.size()) + " counts for " +
                           std::to_string(size_) + " ranks");
  }
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  if ((total > 0 && in == nullptr) || (counts[rank_] > 0 && out == nullptr)) {
    return InvalidArgument("mpi reduce-scatter: null buffer");
  }
  if (!failed_.ok()) return failed_;
  const size_t esize = DTypeSize(dtype);
  if (size_ == 1) {
    if (total > 0) std::memcpy(out, in, total * esize);
    return Status::Ok();
  }
  if (total == 0) return Status::Ok();
  const MPI_Datatype type = MpiType(dtype);
  const MPI_Op mpi_op = OpFor(dtype, op);
  const std::string what = "reduce-scatter of " + std::to_string(total) + " x " + DTypeName(dtype) +
                           " (" + ReduceOpName(op) + ")";
  // Every rank knows every count, so every rank takes the same path.
  const size_t per_call =
      std::max<size_t>(1, std::min<size_t>(max_message_bytes_ / esize, INT_MAX));
  if (total <= per_call) {
    std::vector<int> recv_counts(counts.begin(), counts.end());
    MPI_Request request;
    {
      auto lock = env_->Lock();
      if (!lock) return Fail(env_->StalledError());
      const int rc =
          MPI_Ireduce_scatter(in, out, recv_counts.data(), type, mpi_op, comm_, &request);
      if (rc != MPI_SUCCESS) return Fail(MpiError(rc, "MPI_Ireduce_scatter", __FILE__, __LINE__));
    }
    return Wait(&request, what);
  }
  // Counts beyond one call: each rank's block is reduced to it, in pieces.
  const auto* src = static_cast<const char*>(in);
  size_t offset = 0;
  for (int root = 0; root < size_; ++root) {
    for (size_t done = 0; done < counts[root]; done += per_call) {
      const int n = static_cast<int>(std::min(per_call, counts[root] - done));
      char* dst = root == rank_ ? static_cast<char*>(out) + done * esize : nullptr;
      MPI_Request request;
      {
        auto lock = env_->Lock();
        if (!lock) return Fail(env_->StalledError());
        const int rc =
            MPI_Ireduce(src + (offset + done) * esize, dst, n, type, mpi_op, root, comm_, &request);
        if (rc != MPI_SUCCESS) return Fail(MpiError(rc, "MPI_Ireduce", __FILE__, __LINE__));
      }
      CONCORD_RETURN_IF_ERROR(Wait(&request, what));
    }
    offset += counts[root];
  }
  return Status::Ok();
}

// The datatype of `bytes` bytes at `offset` from a buffer's start, for counts and displacements
// beyond MPI's int: pieces of at most `piece` bytes (MPI_Type_create_struct takes MPI_Aint
// displacements). Commits it; the caller frees it.
int LargeBytesType(size_t offset, size_t bytes, size_t piece, MPI_Datatype* out) {
  MPI_Datatype chunk;
  int rc = MPI_Type_contiguous(static_cast<int>(piece), MPI_BYTE, &chunk);
  if (rc != MPI_SUCCESS) return rc;
  const int lengths[2] = {static_cast<int>(bytes / piece), static_cast<int>(bytes % piece)};
  const MPI_Aint displs[2] = {static_cast<MPI_Aint>(offset),
                              static_cast<MPI_Aint>(offset + bytes / piece * piece)};
  MPI_Datatype types[2] = {chunk, MPI_BYTE};
  rc = MPI_Type_create_struct(2, lengths, displs, types, out);
  MPI_Type_free(&chunk);
  if (rc == MPI_SUCCESS) rc = MPI_Type_commit(out);
  return rc;
}

Status MpiBackend::Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                             const std::vector<size_t>& recv_bytes) {
  last_algorithm_ = "MPI_Ialltoallw";
  if (send_bytes.size() != static_cast<size_t>(size_) ||
      recv_bytes.size() != static_cast<size_t>(size_)) {
    return InvalidArgument("mpi alltoallv: sizes for " + std::to_string(send_bytes.size()) +
                           " and " + std::to_string(recv_bytes.size()) + " ranks, not " +
                           std::to_string(size_));
  }
  const size_t sent = std::accumulate(send_bytes.begin(), send_bytes.end(), size_t{0});
  const size_t received = std::accumulate(recv_bytes.begin(), recv_bytes.end(), size_t{0});
  if ((sent > 0 && in == nullptr) || (received > 0 && out == nullptr)) {
    return InvalidArgument("mpi alltoallv: null buffer");
  }
  if (!failed_.ok()) return failed_;
  if (size_ == 1) {
    if (sent > 0) std::memmove(out, in, sent);
    return Status::Ok();
  }
  // Every rank must make the same collective call while knowing only its own sizes, so it is
  // always MPI_Ialltoallw: a peer whose bytes or offset would not fit MPI's int (or exceed
  // max_message_bytes) gets a derived datatype of pieces instead of a count of bytes.
  const size_t piece = std::min<size_t>(max_message_bytes_, INT_MAX);
  std::vector<int> scounts(size_), sdispls(size_, 0), rcounts(size_), rdispls(size_, 0);
  std::vector<MPI_Datatype> stypes(size_, MPI_BYTE), rtypes(size_, MPI_BYTE);
  std::vector<MPI_Datatype> made;
  Status status = Status::Ok();
  {
    auto lock = env_->Lock();
    if (!lock) return Fail(env_->StalledError());
    auto describe = [&](size_t offset, size_t bytes, int* count, int* displ, MPI_Datatype* type) {
      if (bytes <= piece && offset + bytes <= static_cast<size_t>(INT_MAX)) {
        *count = static_cast<int>(bytes);
        *displ = static_cast<int>(offset);
        return MPI_SUCCESS;
      }
      *count = 1;
      const int rc = LargeBytesType(offset, bytes, piece, type);
      if (rc == MPI_SUCCESS) made.push_back(*type);
      return rc;
    };
    size_t soff = 0, roff = 0;
    for (int r = 0; r < size_ && status.ok(); ++r) {
      int rc = describe(soff, send_bytes[r], &scounts[r], &sdispls[r], &stypes[r]);
      if (rc == MPI_SUCCESS)
        rc = describe(roff, recv_bytes[r], &rcounts[r], &rdispls[r], &rtypes[r]);
      if (rc != MPI_SUCCESS) status = MpiError(rc, "MPI_Type_create_struct", __FILE__, __LINE__);
      soff += send_bytes[r];
      roff += recv_bytes[r];
    }
  }
  MPI_Request request = MPI_REQUEST_NULL;
  if (status.ok()) {
    auto lock = env_->Lock();
    if (!lock) return Fail(env_->StalledError());  // the datatypes are left to MPI
    // Buffers need valid addresses even when empty.
    static char empty = 0;
    const int rc = MPI_Ialltoallw(sent > 0 ? in : &empty, scounts.data(), sdispls.data(),
                                  stypes.data(), received > 0 ? out : &empty, rcounts.data(),
                                  rdispls.data(), rtypes.data(), comm_, &request);
    if (rc != MPI_SUCCESS) status = MpiError(rc, "MPI_Ialltoallw", __FILE__, __LINE__);
  }
  {
    // Freed at once: MPI keeps a datatype a pending operation uses until it completes.
    auto lock = env_->Lock();
    if (!lock) return Fail(env_->StalledError());
    for (MPI_Datatype& t : made) MPI_Type_free(&t);
  }
  if (status.ok()) {
    return Wait(&request, "alltoallv (" + std::to_string(sent) + " bytes out, " +
                              std::to_string(received) + " in)");
  }
  return Fail(status);
}

}  // namespace

Status WaitForRequest(MpiEnvironment& env, MPI_Request* request, Deadline deadline,
                      const std::string& what, const std::atomic<bool>* interrupted) {
  // Busy polling, as MPI's own blocking calls do: with Open MPI's shared-memory transport the
  // transfer progresses only inside MPI calls. Past kBusy it yields between polls, so threads
  // that share the core (MPI's own, under a real-time policy too) still run.
  constexpr auto kBusy = std::chrono::microseconds(50);
  const auto busy_until = Clock::now() + kBusy;
  for (;;) {
    int done = 0;
    MPI_Status status;
    {
      auto lock = env.Lock();
      if (!lock) return env.StalledError().WithContext(what);
      const int rc = MPI_Test(request, &done, &status);
      if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Test", __FILE__, __LINE__).WithContext(what);
    }
    if (done) return Status::Ok();
    if (interrupted != nullptr && interrupted->load(std::memory_order_relaxed)) {
      env.MarkAbandoned();
      return Status(Code::kBackendError,
                    what + " interrupted: the control plane found a peer failed");
    }
    if (deadline.passed()) {
      env.MarkAbandoned();
      return TimeoutError(what +
                          " did not complete before the deadline (CONCORD_TIMEOUT_S): a rank "
                          "is dead, stuck or not calling it");
    }
    if (Clock::now() > busy_until) std::this_thread::yield();
  }
}

StatusOr<MPI_Comm> Duplicate(MpiEnvironment& env, MPI_Comm base, Deadline deadline) {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request request;
  {
    CONCORD_MPI_LOCK_OR_RETURN(lock, env);
    CONCORD_MPI_CHECK(MPI_Comm_idup(base, &comm, &request));
  }
  CONCORD_RETURN_IF_ERROR(WaitForRequest(
      env, &request, deadline,
      base == MPI_COMM_WORLD ? "duplicating MPI_COMM_WORLD (MPI_Comm_idup)"
                             : "duplicating a sub-communicator's group (MPI_Comm_idup)"));
  CONCORD_MPI_LOCK_OR_RETURN(lock, env);
  CONCORD_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  return comm;
}

StatusOr<MPI_Comm> CreateGroupComm(MpiEnvironment& env, const std::vector<int>& world_ranks,
                                   uint64_t identity) {
  MPI_Group members = MPI_GROUP_NULL;
  int tag = 0;
  {
    CONCORD_MPI_LOCK_OR_RETURN(lock, env);
    MPI_Group world = MPI_GROUP_NULL;
    CONCORD_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
    const int rc =
        MPI_Group_incl(world, static_cast<int>(world_ranks.size()), world_ranks.data(), &members);
    MPI_Group_free(&world);
    CONCORD_MPI_CHECK(rc);
    int* tag_ub = nullptr;
    int found = 0;
    CONCORD_MPI_CHECK(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found));
    const uint64_t tags = found != 0 && tag_ub != nullptr && *tag_ub > 0
                              ? static_cast<uint64_t>(*tag_ub) + 1
                              : 32768;  // the least MPI_TAG_UB MPI allows
    tag = static_cast<int>(identity % tags);
  }
  MPI_Comm comm = MPI_COMM_NULL;
  int created = MPI_SUCCESS;
  if (env.thread_level() == MPI_THREAD_MULTIPLE) {
    // Blocks until every member calls it: without the lock, so that this process's other threads
    // go on calling MPI meanwhile, starting other sub-communicators among them.
    created = MPI_Comm_create_group(MPI_COMM_WORLD, members, tag, &comm);
  } else {
    CONCORD_MPI_LOCK_OR_RETURN(lock, env);
    created = MPI_Comm_create_group(MPI_COMM_WORLD, members, tag, &comm);
  }
  CONCORD_MPI_LOCK_OR_RETURN(lock, env);
  MPI_Group_free(&members);
  CONCORD_MPI_CHECK(created);
  return comm;
}

Status CheckSameIdentity(MpiEnvironment& env, MPI_Comm comm, uint64_t identity, Deadline deadline) {
  // The least identity and the least complement: every member gave the same one iff the first is
  // the complement of the second. On the heap: a request abandoned at the deadline may still be
  // written by MPI, so its buffers are then left to it.
  auto buffers = std::make_unique<std::array<uint64_t, 4>>();
  (*buffers)[0] = identity;
  (*buffers)[1] = ~identity;
  MPI_Request request;
  {
    CONCORD_MPI_LOCK_OR_RETURN(lock, env);
    CONCORD_MPI_CHECK(MPI_Iallreduce(buffers->data(), buffers->data() + 2, 2, MPI_UINT64_T, MPI_MIN,
                                     comm, &request));
  }
  const Status waited = WaitForRequest(
      env, &request, deadline, "checking that a sub-communicator's members agree (MPI_Iallreduce)");
  if (!waited.ok()) {
    (void)buffers.release();  // MPI may still write them
    return waited;
  }
  if ((*buffers)[2] != ~(*buffers)[3]) {
    return Status(Code::kMismatch,
                  "MPI matched this sub-communicator's start with another one on another rank: "
                  "two sub-communicators of the same ranks, started at the same time, got the "
                  "same MPI tag (their names' digests modulo MPI_TAG_UB + 1 coincide); start "
                  "them one after the other");
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<Backend>> CreateMpiBackend(std::shared_ptr<MpiEnvironment> env,
                                                    std::chrono::milliseconds timeout,
                                                    size_t max_message_bytes, MPI_Comm base) {
  if (max_message_bytes == 0) return InvalidArgument("mpi backend: max_message_bytes is 0");
  CONCORD_ASSIGN_OR_RETURN(MPI_Comm comm, Duplicate(*env, base, Deadline::After(timeout)));
  int rank = 0, size = 0;
  {
    CONCORD_MPI_LOCK_OR_RETURN(lock, *env);
    CONCORD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    CONCORD_MPI_CHECK(MPI_Comm_size(comm, &size));
  }
  auto backend =
      std::make_unique<MpiBackend>(std::move(env), comm, rank, size, timeout, max_message_bytes);
  CONCORD_RETURN_IF_ERROR(backend->CreateOwnOps());
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace concord
