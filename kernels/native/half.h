// float16 <-> float32 rows, shared by the kernels that take float16 (the float16 engine, Cast): F16C in 8 lanes on
// AVX2 hosts that have it, _Float16's conversions elsewhere; exact widening and round-to-nearest-even narrowing,
// as numpy's astype.
#pragma once

#include <cstdint>

namespace npu_ep::kern {

void HalfToFloatRow(const uint16_t* s, float* d, int64_t n);
void FloatToHalfRow(const float* s, uint16_t* d, int64_t n);

}  // namespace npu_ep::kern
