// The element-wise compressors: "none" (the tensor as it is) and the 16-bit casts "fp16" and
// "bf16". Their encoded form is summable, so they travel through an allreduce of the encoded
// buffer.
#pragma once

#include <memory>

#include "compression/cast_kernels.h"
#include "compression/compressor.h"

namespace concord {
namespace compression {

// "none": accepts every dtype; the encoded buffer is the tensor itself, count elements of its own
// dtype, times the scale (as CopyScaled does: integer types truncate toward zero). Exact: decode
// gives back the (scaled) input bit for bit.
std::unique_ptr<Compressor> MakeNoneCompressor();

// "fp16" / "bf16": accepts float32 and float64 (refuses the 16-bit and integer types: nothing to
// gain, or no meaning); the encoded buffer is count 16-bit elements, summed as float16/bfloat16 by
// the allreduce. Rounding as cast_kernels.h promises: relative error at most 2^-11 (fp16, normal
// range 2^-14 .. 65504) or 2^-8 (bf16, normal floats); fp16 values from 65520 up become inf,
// up to 2^-24 / 2 become zero, and between lose relative precision (subnormals); bf16 values from
// 0x1.ffp127 (about 3.39e38, halfway between its largest and 2^128) up become inf.
std::unique_ptr<Compressor> MakeCastCompressor(HalfFormat format);

}  // namespace compression
}  // namespace concord
