// Native MaxPool / AveragePool of NHWC tensors (npu::PoolNhwc, kernels/ops/pool_nhwc.py): x [N, H, W, C] ->
// y [N, OH, OW, C] over a geometry the reference resolved (PoolShape, pool.h; C is the innermost axis here).
// Each output pixel's window taps are C-contiguous vectors, so the channels fill the lanes.
#pragma once

#include <cstdint>

#include "pool.h"

namespace npu_ep::kern {

// y[n, oh, ow, c] = max of the window's taps (NaN if any is NaN), a tap outside the input holding `low`.
void MaxPoolNhwcFloat(const PoolShape& s, const float* x, float low, float* y, int threads);
// y[n, oh, ow, c] = (each window row's taps summed from the first on, then the row sums from the first row on, in
// float32, a tap outside the input counting as 0.0f) / divisor[oh, ow]: pool.h's AvgPoolFloat order, its bits.
void AvgPoolNhwcFloat(const PoolShape& s, const float* x, const float* divisor, float* y, int threads);
// The float16 forms: x widened to float32 (exact), pooled as above, rounded once to float16.
void MaxPoolNhwcHalf(const PoolShape& s, const uint16_t* x, float low, uint16_t* y, int threads);
void AvgPoolNhwcHalf(const PoolShape& s, const uint16_t* x, const float* divisor, uint16_t* y, int threads);

}  // namespace npu_ep::kern
