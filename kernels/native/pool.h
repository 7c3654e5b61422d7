// Native MaxPool (float32, float16, uint8, int8), AveragePool (float32, float16) and float16 GlobalMaxPool; NCHW,
// a 1-D pool is a 2-D one of height 1. kernels/ops/pool.py is the reference and resolves the geometry (ORT's
// PoolAttributes: auto_pad, ceil_mode, negative SAME pads); these kernels only walk it.
#pragma once

#include <cstdint>

namespace npu_ep::kern {

struct PoolShape {
  int64_t N = 0, C = 0, H = 0, W = 0;  // input [N, C, H, W]
  int64_t OH = 0, OW = 0;              // output size as the reference computed it
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1;
  int64_t pt = 0, pl = 0;  // leading pads (may be negative: windows start inside the input)
};

// y[n, c, oh, ow] = max of x over the window positions inside the input (NaN if any is NaN), `low` when none is.
void MaxPoolFloat(const PoolShape& s, const float* x, float low, float* y, int threads);
// The same over uint8 or int8 bytes (is_signed); `low` is the type's lowest value.
void MaxPoolBytes(const PoolShape& s, const uint8_t* x, bool is_signed, uint8_t* y, int threads);
// y[n, c, oh, ow] = (the window's values summed in float32: each window row i's taps j from the first on, then
// those row sums from the first row on; a position outside the input counting as 0.0f) / divisor[oh, ow]: the
// reference's float32 operations in its order.
void AvgPoolFloat(const PoolShape& s, const float* x, const float* divisor, float* y, int threads);
// The float16 forms (x, y: float16 bits): each plane widened to float32, pooled as above, rounded once to float16.
void MaxPoolHalf(const PoolShape& s, const uint16_t* x, float low, uint16_t* y, int threads);
void AvgPoolHalf(const PoolShape& s, const uint16_t* x, const float* divisor, uint16_t* y, int threads);
// y[r] = the mean of float16 row r of x [rows, count]: widened, summed in numpy's pairwise order from 0.0 (the
// reference's np.add.reduce in float32), divided by count in float32, rounded once.
void GlobalAvgHalf(const uint16_t* x, int64_t rows, int64_t count, uint16_t* y, int threads);
// The same for float32 rows (the reference's np.add.reduce and division: its bits), tasks of whole rows.
void GlobalAvgFloat(const float* x, int64_t rows, int64_t count, float* y, int threads);
// y[r] = the maximum of float16 row r of x [rows, count] (NaN if any is NaN).
void GlobalMaxHalf(const uint16_t* x, int64_t rows, int64_t count, uint16_t* y, int threads);

}  // namespace npu_ep::kern
