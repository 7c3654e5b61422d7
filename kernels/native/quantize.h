// Native per-tensor QuantizeLinear (float32 -> uint8/int8) and DequantizeLinear (uint8/int8 -> float32), the
// element-wise steps between the integer units of a QDQ graph. kernels/ops/quantize.py is the reference:
// q = saturate(round_half_even(x / scale) + zp) (the division, NaN to the type's lowest value, as ORT) and
// y = (float(x) - zp) * scale.
#pragma once

#include <cstdint>

namespace npu_ep::kern {

void QuantizeTensor(const float* x, int64_t n, float scale, int32_t zp, bool is_signed, uint8_t* y, int threads);
void DequantizeTensor(const uint8_t* x, int64_t n, bool is_signed, int32_t zp, float scale, float* y, int threads);

}  // namespace npu_ep::kern
