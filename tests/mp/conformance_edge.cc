#include "conformance_edge.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "mp_common.h"
#include "tests/common/check.h"
#include "tests/common/tensors.h"

namespace mp_edge {
namespace {

// One element's bits, up to 8 bytes, as an unsigned integer (little-endian).
uint64_t Bits(const std::vector<unsigned char>& buf, size_t es, int64_t i) {
  uint64_t v = 0;
  std::memcpy(&v, buf.data() + i * es, es);
  return v;
}
void SetBits(std::vector<unsigned char>* buf, size_t es, int64_t i, uint64_t v) {
  std::memcpy(buf->data() + i * es, &v, es);
}

// Bit patterns of each floating type (by ElementSize and dtype).
struct FloatBits {
  uint64_t canonical_nan, other_nan, minus_nan, minus_zero;
};
FloatBits BitsOf(concord_dtype_t t) {
  switch (t) {
    case CONCORD_FLOAT16:
      return {0x7e00, 0x7e15, 0xfe01, 0x8000};
    case CONCORD_BFLOAT16:
      return {0x7fc0, 0x7fd5, 0xffc1, 0x8000};
    case CONCORD_FLOAT32:
      return {0x7fc00000, 0x7fc00015, 0xffc00001, 0x80000000};
    default:
      return {0x7ff8000000000000, 0x7ff8000000000015, 0xfff8000000000001, 0x8000000000000000};
  }
}

// Runs one allreduce (in place) or reduce (to the last rank, out of place) of `in` and returns
// this rank's result (the reduce's on the root only: elsewhere nothing to check).
bool Run(concord_comm_t comm, const std::string& name, concord_dtype_t dt, concord_reduce_op_t op,
         bool reduce, int root, std::vector<unsigned char>* in, std::vector<unsigned char>* out,
         int64_t n) {
  int64_t shape[1] = {n};
  concord_tensor_t tin = CpuTensor(in->data(), dt, 1, shape);
  concord_status_t s;
  if (reduce) {
    out->assign(in->size(), 0xAB);
    concord_tensor_t tout = CpuTensor(out->data(), dt, 1, shape);
    concord_reduce_opts_t o;
    concord_reduce_opts_init(&o);
    o.op = op;
    s = concord_reduce(comm, name.c_str(), &tin, &tout, root, &o);
  } else {
    concord_allreduce_opts_t o;
    concord_allreduce_opts_init(&o);
    o.op = op;
    s = concord_allreduce(comm, name.c_str(), &tin, nullptr, &o);
    *out = *in;
  }
  if (s != CONCORD_SUCCESS) {
    FAILF("%s: %s: %s", name.c_str(), concord_status_string(s), concord_comm_last_error(comm));
    return false;
  }
  return true;
}

// Compares every element's bits with want(i); reports the first difference.
template <typename Want>
void Compare(const std::string& name, const std::vector<unsigned char>& got, size_t es, int64_t n,
             Want want, mp_exchange::Counts* counts) {
  for (int64_t i = 0; i < n; ++i) {
    ++counts->checks;
    const uint64_t g = Bits(got, es, i), w = want(i);
    if (g != w) {
      FAILF("%s [%lld]: got bits 0x%llx want 0x%llx", name.c_str(), static_cast<long long>(i),
            static_cast<unsigned long long>(g), static_cast<unsigned long long>(w));
      return;
    }
  }
}

// 8-bit values large enough that any two ranks' sum overflows, and factors whose product does.
int64_t IntInput(concord_dtype_t dt, concord_reduce_op_t op, int r, int64_t i) {
  const int64_t h = (i * 7 + r * 13) % 28;
  if (op == CONCORD_PRODUCT) return dt == CONCORD_UINT8 ? 3 + h : (i % 2 ? -3 - h : 3 + h);
  if (dt == CONCORD_UINT8) return 200 + h;
  return i % 2 ? -100 - h : 100 + h;
}

void IntCases(concord_comm_t comm, int rank, int size, int64_t n, mp_exchange::Counts* counts) {
  for (concord_dtype_t dt : {CONCORD_UINT8, CONCORD_INT8}) {
    for (concord_reduce_op_t op : {CONCORD_SUM, CONCORD_AVERAGE, CONCORD_PRODUCT}) {
      for (int reduce = 0; reduce < 2; ++reduce) {
        const std::string name = std::string("edge.wrap.") + mp::DTypeName(dt) + "." +
                                 (op == CONCORD_SUM       ? "sum"
                                  : op == CONCORD_AVERAGE ? "avg"
                                                          : "prod") +
                                 (reduce ? ".rd" : ".ar") + ".n" + std::to_string(n);
        std::vector<unsigned char> in(n), out;
        for (int64_t i = 0; i < n; ++i)
          in[i] = static_cast<unsigned char>(IntInput(dt, op, rank, i));
        ++counts->cases;
        const int root = size - 1;
        if (!Run(comm, name, dt, op, reduce, root, &in, &out, n) || (reduce && rank != root)) {
          continue;
        }
        Compare(
            name, out, 1, n,
            [&](int64_t i) {
              // The sum or product in 8 bits, wrapping; an average divides the wrapped sum.
              uint8_t acc = static_cast<uint8_t>(IntInput(dt, op, 0, i));
              for (int r = 1; r < size; ++r) {
                const uint8_t v = static_cast<uint8_t>(IntInput(dt, op, r, i));
                acc = static_cast<uint8_t>(op == CONCORD_PRODUCT ? unsigned{acc} * v : acc + v);
              }
              if (op == CONCORD_AVERAGE) {
                const int sum = dt == CONCORD_UINT8 ? acc : static_cast<int8_t>(acc);
                acc = static_cast<uint8_t>(sum / size);
              }
              return uint64_t{acc};
            },
            counts);
      }
    }
  }
}

// Element i of rank r: every third a NaN on nan_rank only (its sign and payload varying), every
// third after it -0 on nan_rank and +0 elsewhere, the rest small integers. With one rank nothing
// is combined: the result is the input, NaN payloads and all.
uint64_t FloatInput(concord_dtype_t dt, int r, int nan_rank, int64_t i) {
  const FloatBits b = BitsOf(dt);
  if (i % 3 == 0 && r == nan_rank) {
    return i % 2 ? b.minus_nan : (i % 4 ? b.other_nan : b.canonical_nan);
  }
  if (i % 3 == 1) return r == nan_rank ? b.minus_zero : 0;
  std::vector<unsigned char> one(8, 0);
  concord::harness::StoreElement(dt, one.data(), 0, static_cast<double>((i * 7 + r * 3) % 9) - 4);
  return Bits(one, ElementSize(dt), 0);
}

void NanCases(concord_comm_t comm, int rank, int size, int64_t n, mp_exchange::Counts* counts) {
  for (concord_dtype_t dt : {CONCORD_FLOAT16, CONCORD_BFLOAT16, CONCORD_FLOAT32, CONCORD_FLOAT64}) {
    const size_t es = ElementSize(dt);
    const FloatBits b = BitsOf(dt);
    for (concord_reduce_op_t op : {CONCORD_MIN, CONCORD_MAX}) {
      for (int nan_rank = 0; nan_rank < size; ++nan_rank) {
        for (int reduce = 0; reduce < 2; ++reduce) {
          const std::string name = std::string("edge.nan.") + mp::DTypeName(dt) + "." +
                                   (op == CONCORD_MIN ? "min" : "max") + ".on" +
                                   std::to_string(nan_rank) + (reduce ? ".rd" : ".ar") + ".n" +
                                   std::to_string(n);
          std::vector<unsigned char> in(n * es), out;
          for (int64_t i = 0; i < n; ++i) SetBits(&in, es, i, FloatInput(dt, rank, nan_rank, i));
          ++counts->cases;
          const int root = size - 1;
          if (!Run(comm, name, dt, op, reduce, root, &in, &out, n) || (reduce && rank != root)) {
            continue;
          }
          Compare(
              name, out, es, n,
              [&](int64_t i) -> uint64_t {
                if (size == 1) return FloatInput(dt, 0, nan_rank, i);  // nothing combined
                if (i % 3 == 0) return b.canonical_nan;
                if (i % 3 == 1) return op == CONCORD_MIN ? b.minus_zero : 0;
                double acc = static_cast<double>((i * 7) % 9) - 4;
                for (int r = 1; r < size; ++r) {
                  const double v = static_cast<double>((i * 7 + r * 3) % 9) - 4;
                  acc = op == CONCORD_MIN ? std::min(acc, v) : std::max(acc, v);
                }
                std::vector<unsigned char> one(8, 0);
                concord::harness::StoreElement(dt, one.data(), 0, acc);
                return Bits(one, es, 0);
              },
              counts);
        }
      }
    }
  }
}

}  // namespace

void RunCases(concord_comm_t comm, int rank, int size, int64_t n, mp_exchange::Counts* counts) {
  CheckSetContext("rank %d", rank);
  IntCases(comm, rank, size, n, counts);
  NanCases(comm, rank, size, n, counts);
  counts->failures = CheckFailures();
}

}  // namespace mp_edge
