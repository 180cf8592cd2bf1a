#include "compression/casts.h"

#include <cstring>

namespace concord {
namespace compression {
namespace {

class NoneCompressor final : public Compressor {
 public:
  std::string spec() const override { return "none"; }
  Exchange exchange() const override { return Exchange::kAllreduce; }
  Status CheckDType(DType dtype) const override {
    if (!IsValidDType(static_cast<int>(dtype))) return InvalidArgument("none: invalid dtype");
    return Status::Ok();
  }
  DType reduce_dtype(DType dtype) const override { return dtype; }
  size_t EncodedBytes(DType dtype, size_t count) const override { return count * DTypeSize(dtype); }
  bool uses_state() const override { return false; }

  Status Encode(const EncodeInput& in, void* out, CompressionState*) const override {
    CONCORD_RETURN_IF_ERROR(CheckDType(in.dtype));
    CONCORD_RETURN_IF_ERROR(CheckDenseBuffer(in.data, in.dtype, in.count, "none: input"));
    CONCORD_RETURN_IF_ERROR(
        CheckEncodedBuffer(out, EncodedBytes(in.dtype, in.count), "none: output"));
    CopyScaled(out, in.data, in.count, in.dtype, in.scale);
    return Status::Ok();
  }

  Status Decode(const void* encoded, DType dtype, size_t count, void* dense) const override {
    CONCORD_RETURN_IF_ERROR(CheckArgs(encoded, dtype, count, dense));
    if (count > 0 && dense != encoded) std::memmove(dense, encoded, count * DTypeSize(dtype));
    return Status::Ok();
  }

  Status DecodeAccumulate(const void* encoded, DType dtype, size_t count,
                          void* dense) const override {
    CONCORD_RETURN_IF_ERROR(CheckArgs(encoded, dtype, count, dense));
    ReduceElements(dense, dense, encoded, count, dtype, ReduceOp::kSum);
    return Status::Ok();
  }

 private:
  Status CheckArgs(const void* encoded, DType dtype, size_t count, const void* dense) const {
    CONCORD_RETURN_IF_ERROR(CheckDType(dtype));
    CONCORD_RETURN_IF_ERROR(
        CheckEncodedBuffer(encoded, EncodedBytes(dtype, count), "none: encoded"));
    return CheckDenseBuffer(dense, dtype, count, "none: output");
  }
};

class CastCompressor final : public Compressor {
 public:
  explicit CastCompressor(HalfFormat format) : format_(format), path_(BestCastPath(format)) {}

  std::string spec() const override { return HalfFormatName(format_); }
  Exchange exchange() const override { return Exchange::kAllreduce; }
  Status CheckDType(DType dtype) const override {
    if (dtype == DType::kFloat32 || dtype == DType::kFloat64) return Status::Ok();
    return InvalidArgument(
        spec() + " compression takes float32 or float64 tensors, not " +
        (IsValidDType(static_cast<int>(dtype)) ? DTypeName(dtype) : "an invalid dtype"));
  }
  // float16 and bfloat16 tensors are 2 bytes an element already: casting bfloat16 to float16 (or
  // back) would only lose range or precision.
  bool passes_through(DType dtype) const override { return IsHalfPrecision(dtype); }
  DType reduce_dtype(DType) const override {
    return format_ == HalfFormat::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
  }
  size_t EncodedBytes(DType, size_t count) const override { return 2 * count; }
  bool uses_state() const override { return false; }

  Status Encode(const EncodeInput& in, void* out, CompressionState*) const override {
    CONCORD_RETURN_IF_ERROR(CheckDType(in.dtype));
    CONCORD_RETURN_IF_ERROR(CheckDenseBuffer(in.data, in.dtype, in.count, "input"));
    CONCORD_RETURN_IF_ERROR(CheckEncodedBuffer(out, 2 * in.count, "output"));
    if (in.dtype == DType::kFloat32) {
      EncodeFloats(format_, static_cast<const float*>(in.data), in.count,
                   static_cast<float>(in.scale), out, path_);
    } else {
      EncodeDoubles(format_, static_cast<const double*>(in.data), in.count, in.scale, out, path_);
    }
    return Status::Ok();
  }

  Status Decode(const void* encoded, DType dtype, size_t count, void* dense) const override {
    CONCORD_RETURN_IF_ERROR(CheckArgs(encoded, dtype, count, dense));
    if (dtype == DType::kFloat32) {
      DecodeToFloats(format_, encoded, count, static_cast<float*>(dense), path_);
    } else {
      DecodeToDoubles(format_, encoded, count, static_cast<double*>(dense), path_);
    }
    return Status::Ok();
  }

  Status DecodeAccumulate(const void* encoded, DType dtype, size_t count,
                          void* dense) const override {
    CONCORD_RETURN_IF_ERROR(CheckArgs(encoded, dtype, count, dense));
    if (dtype == DType::kFloat32) {
      AccumulateFloats(format_, encoded, count, static_cast<float*>(dense), path_);
    } else {
      AccumulateDoubles(format_, encoded, count, static_cast<double*>(dense), path_);
    }
    return Status::Ok();
  }

 private:
  Status CheckArgs(const void* encoded, DType dtype, size_t count, const void* dense) const {
    CONCORD_RETURN_IF_ERROR(CheckDType(dtype));
    CONCORD_RETURN_IF_ERROR(CheckEncodedBuffer(encoded, 2 * count, "encoded"));
    return CheckDenseBuffer(dense, dtype, count, "output");
  }

  const HalfFormat format_;
  const CastPath path_;  // the best this CPU runs, found once
};

}  // namespace

std::unique_ptr<Compressor> MakeNoneCompressor() {
  return std::make_unique<NoneCompressor>();
}

std::unique_ptr<Compressor> MakeCastCompressor(HalfFormat format) {
  return std::make_unique<CastCompressor>(format);
}

}  // namespace compression
}  // namespace concord
