#include "backends/gloo/gloo_allreduce.h"

#include <gloo/algorithm.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>

#include <climits>
#include <cstdint>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace concord {
namespace gloo_internal {
namespace {

// In-place reduction with Gloo's signature: x[i] = x[i] (op) y[i].
template <typename T, DType D, ReduceOp O>
void ReduceInto(T* x, const T* y, size_t n) {
  ReduceElements(x, x, y, n, D, O);
}

template <typename T, DType D, ReduceOp O>
const gloo::ReductionFunction<T>* Reduction() {
  static const gloo::ReductionFunction<T> fn(gloo::CUSTOM, &ReduceInto<T, D, O>);
  return &fn;
}

template <typename T, DType D>
const gloo::ReductionFunction<T>* ReductionFor(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return Reduction<T, D, ReduceOp::kSum>();
    case ReduceOp::kMin:
      return Reduction<T, D, ReduceOp::kMin>();
    case ReduceOp::kMax:
      return Reduction<T, D, ReduceOp::kMax>();
    case ReduceOp::kProduct:
      return Reduction<T, D, ReduceOp::kProduct>();
  }
  return nullptr;
}

// Owns a Gloo algorithm object, built in zero-filled memory of its own. Gloo's object algorithms
// (gloo/allreduce_ring.h, _ring_chunked.h, _halving_doubling.h, _bcube.h) send their notifications
// from an `int dummy_` member that their constructors never initialise; built in zeroed memory,
// those bytes are zeros rather than whatever the heap held, so no uninitialised heap byte goes on
// the wire (valgrind found it: tests/valgrind). Gloo declares its destructors noexcept(false); a
// failure while tearing down a broken connection is not worth propagating, so it is swallowed.
class AlgorithmObject : public BoundAllreduce {
 public:
  // Builds an A from `args` in zeroed storage. Gloo's exceptions from A's constructor propagate.
  template <typename A, typename... Args>
  static std::unique_ptr<BoundAllreduce> Make(Args&&... args) {
    static_assert(std::is_base_of_v<gloo::Algorithm, A>);
    static_assert(alignof(A) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);
    std::unique_ptr<unsigned char[]> storage(new unsigned char[sizeof(A)]());  // zero-filled
    gloo::Algorithm* algorithm = new (storage.get()) A(std::forward<Args>(args)...);
    return std::unique_ptr<BoundAllreduce>(new AlgorithmObject(std::move(storage), algorithm));
  }
  ~AlgorithmObject() override {
    try {
      algorithm_->~Algorithm();  // virtual: A's destructor; storage_ then frees the memory
    } catch (...) {
    }
  }
  AlgorithmObject(const AlgorithmObject&) = delete;
  AlgorithmObject& operator=(const AlgorithmObject&) = delete;
  void Run() override { algorithm_->run(); }

 private:
  AlgorithmObject(std::unique_ptr<unsigned char[]> storage, gloo::Algorithm* algorithm)
      : storage_(std::move(storage)), algorithm_(algorithm) {}

  std::unique_ptr<unsigned char[]> storage_;
  gloo::Algorithm* algorithm_;  // lives in storage_
};

// Function-style gloo::allreduce with its options (and their unbound buffers) built once.
class FunctionAllreduce : public BoundAllreduce {
 public:
  explicit FunctionAllreduce(const std::shared_ptr<gloo::Context>& context) : options_(context) {}
  gloo::AllreduceOptions& options() { return options_; }
  void Run() override { gloo::allreduce(options_); }

 private:
  gloo::AllreduceOptions options_;
};

template <typename T, DType D>
std::unique_ptr<BoundAllreduce> MakeTyped(const std::shared_ptr<gloo::Context>& context,
                                          AllreduceAlgorithm algorithm, void* data, size_t count,
                                          ReduceOp op) {
  T* ptr = static_cast<T*>(data);
  const std::vector<T*> ptrs{ptr};
  const gloo::ReductionFunction<T>* fn = ReductionFor<T, D>(op);
  const int n = static_cast<int>(count);
  switch (algorithm) {
    case AllreduceAlgorithm::kRing:
      return AlgorithmObject::Make<gloo::AllreduceRing<T>>(context, ptrs, n, fn);
    case AllreduceAlgorithm::kRingChunked:
      return AlgorithmObject::Make<gloo::AllreduceRingChunked<T>>(context, ptrs, n, fn);
    case AllreduceAlgorithm::kHalvingDoubling:
      return AlgorithmObject::Make<gloo::AllreduceHalvingDoubling<T>>(context, ptrs, n, fn);
    case AllreduceAlgorithm::kBcube:
      return AlgorithmObject::Make<gloo::AllreduceBcube<T>>(context, ptrs, n, fn);
    case AllreduceAlgorithm::kFunction: {
      auto function = std::make_unique<FunctionAllreduce>(context);
      function->options().setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      function->options().setOutput(ptr, count);
      const ReduceOp reduce_op = op;
      function->options().setReduceFunction(
          [reduce_op](void* out, const void* a, const void* b, size_t elements) {
            ReduceElements(out, a, b, elements, D, reduce_op);
          });
      return function;
    }
  }
  return nullptr;
}

}  // namespace

const char* AllreduceAlgorithmName(AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllreduceAlgorithm::kRing:
      return "ring";
    case AllreduceAlgorithm::kRingChunked:
      return "ring_chunked";
    case AllreduceAlgorithm::kHalvingDoubling:
      return "halving_doubling";
    case AllreduceAlgorithm::kBcube:
      return "bcube";
    case AllreduceAlgorithm::kFunction:
      return "allreduce";
  }
  return "unknown";
}

StatusOr<AllreduceAlgorithm> ParseAllreduceAlgorithm(const std::string& name) {
  for (AllreduceAlgorithm a : {AllreduceAlgorithm::kRing, AllreduceAlgorithm::kRingChunked,
                               AllreduceAlgorithm::kHalvingDoubling, AllreduceAlgorithm::kBcube,
                               AllreduceAlgorithm::kFunction}) {
    if (name == AllreduceAlgorithmName(a)) return a;
  }
  return InvalidArgument("gloo: unknown allreduce algorithm '" + name +
                         "' (expected auto, ring, ring_chunked, halving_doubling, bcube or "
                         "allreduce)");
}

bool AlgorithmObjectFits(size_t count, size_t element_bytes) {
  return element_bytes > 0 && count <= static_cast<size_t>(INT_MAX) / element_bytes;
}

bool AlgorithmSupports(AllreduceAlgorithm algorithm, int size, size_t count, size_t element_bytes) {
  if (algorithm == AllreduceAlgorithm::kFunction) return true;
  if (!AlgorithmObjectFits(count, element_bytes)) return false;
  if (algorithm == AllreduceAlgorithm::kBcube) return size > 0 && (size & (size - 1)) == 0;
  return true;
}

std::unique_ptr<BoundAllreduce> MakeBoundAllreduce(const std::shared_ptr<gloo::Context>& context,
                                                   AllreduceAlgorithm algorithm, void* data,
                                                   size_t count, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kUint8:
      return MakeTyped<uint8_t, DType::kUint8>(context, algorithm, data, count, op);
    case DType::kInt8:
      return MakeTyped<int8_t, DType::kInt8>(context, algorithm, data, count, op);
    case DType::kInt32:
      return MakeTyped<int32_t, DType::kInt32>(context, algorithm, data, count, op);
    case DType::kInt64:
      return MakeTyped<int64_t, DType::kInt64>(context, algorithm, data, count, op);
    case DType::kFloat16:
      return MakeTyped<uint16_t, DType::kFloat16>(context, algorithm, data, count, op);
    case DType::kBFloat16:
      return MakeTyped<uint16_t, DType::kBFloat16>(context, algorithm, data, count, op);
    case DType::kFloat32:
      return MakeTyped<float, DType::kFloat32>(context, algorithm, data, count, op);
    case DType::kFloat64:
      return MakeTyped<double, DType::kFloat64>(context, algorithm, data, count, op);
  }
  return nullptr;
}

}  // namespace gloo_internal
}  // namespace concord
