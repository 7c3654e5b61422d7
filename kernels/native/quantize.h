// Native per-tensor QuantizeLinear (float32 -> uint8/int8), the element-wise step into the integer units of a QDQ
// graph. kernels/ops/quantize.py is the reference: q = saturate(round_half_even(x / scale) + zp) (the division, NaN
// to the type's lowest value, as ORT). DequantizeLinear of every integer type is quantize.cc's dequantize_into.
#pragma once

#include <cstdint>

namespace npu_ep::kern {

void QuantizeTensor(const float* x, int64_t n, float scale, int32_t zp, bool is_signed, uint8_t* y, int threads);

}  // namespace npu_ep::kern
