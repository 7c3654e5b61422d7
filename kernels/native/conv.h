// Native convolution kernels (Conv fp32, QLinearConv u8/s8), NCHW; a 1-D conv is a 2-D one of height 1.
// The numpy kernels in kernels/ops/conv.py are the reference they are tested against.
#pragma once

#include <cstdint>

#include "conv_geometry.h"
#include "conv_tail.h"
#include "sgemm.h"

namespace pybind11 {
class module_;
}

namespace npu_ep::kern {

// Patches of image n for every group: cols [group, Cg*kh*kw, OH*OW], rows ordered (c, i, j), zeros where padded
// (the K-major patch matrix of W[Mg, K] @ cols).
void Im2ColFloat(const ConvShape& s, const float* x, int64_t n, float* cols, int threads);

// Dense or grouped float conv as blocked implicit GEMM: on AVX-512 hosts our own GEMM (conv_gemm.h); else per
// (group, block of output pixels) the block's patch matrix [K, pixels] is built in a cache-sized buffer and
// multiplied by W on `sgemm` (one BLAS thread per task), straight into y [N, M, OH, OW]; then + bias. w [group, K, Mg]
// (K ordered (c, i, j)), bias [M] or null. A pointwise conv (1x1, stride 1, no pads) multiplies W by x's own rows: no
// patch matrix. Then the tail.
void DenseFloat(const ConvShape& s, const float* x, const float* w, const float* bias, float* y, Sgemm64 sgemm,
                int threads, const ConvTail& tail = {});

// Depthwise conv (group == C): w [C, kh*kw, mult] with mult = M / C, bias [M] or null, y [N, M, OH, OW].
// Per output: x_0 * w_0, then + x_t * w_t tap by tap (padded taps multiply 0), then + bias: the reference's
// float32 operations in its order, no fused multiply-add.
void DepthwiseFloat(const ConvShape& s, const float* x, const float* w, const float* bias, float* y, int threads,
                    const ConvTail& tail = {});

// QLinearConv with exact int32 accumulation: acc = sum (x - x_zp)(w - w_zp[m]) + bias[m] (wrapping int32),
// y = saturate(round_half_even(clip(float(acc) * mult[m], lo - y_zp, hi - y_zp)) + y_zp), as MLAS requantizes.
// Weights as QConvWeights lays them out (dense: [M, kh, kw, Cg4] with Cg4 = Cg rounded up to 4, padding zero;
// depthwise: [M, kh*kw]).
struct QConv {
  ConvShape s;
  const uint8_t* x = nullptr;  // [N, C, H, W] uint8, or int8 bytes (x_signed)
  bool x_signed = false;
  int32_t x_zp = 0;
  const uint8_t* w = nullptr;  // uint8, or int8 bytes (w_signed)
  bool w_signed = false;
  const int32_t* w_zp = nullptr;  // [M]
  const int32_t* bias = nullptr;  // [M] or null
  const float* mult = nullptr;    // [M]: x_scale * w_scale[m] / y_scale
  int32_t y_zp = 0;
  bool y_signed = false;
  uint8_t* y = nullptr;  // [N, M, OH, OW]
  bool depthwise = false;
  int threads = 1;
  const uint8_t* lut = nullptr;  // [256] or null: y = lut[y] after requantization (a fused npu::QdqLut)
  int32_t* acc_out = nullptr;  // [N, M, OH, OW] or null: the exact int32 sums instead of y (ConvInteger)
  // [M] or null: the sums of w's rows (each row's weights as their type, wrapping int32), made once where the weights
  // are constant; null: the dense VNNI path sums them per call
  const int32_t* w_sums = nullptr;
};
void QLinearConv(const QConv& q);

// Python bindings (conv_bindings.cc), added to the `kernels` submodule.
void BindConv(pybind11::module_& m);

}  // namespace npu_ep::kern
