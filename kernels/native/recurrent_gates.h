// The gate math of the native LSTM, GRU and RNN (recurrent.cc's cells call it once per batch row and step): the
// reference model's operations in its order (kernels/ops/recurrent.py), 16 AVX-512 lanes at a time (the last ones
// masked) or scalar.
#pragma once

#include <cstdint>

#include "cpu.h"

namespace npu_ep::kern {

// The gates of one batch entry: x, g [4H] (X's and the step's products), c [H] updated in place, y [H] written.
// The order of operations is the reference model's (kernels/ops/recurrent.py), bias (DynamicQuantizeLSTM) after
// the product and the peepholes.
struct GateArgs {
  const float* x;
  const float* g;
  const float* peep;  // [3H] or null
  const float* bias;  // [4H] or null
  bool has_clip;
  float clip;
  int64_t H;
};

void GateRow(const GateArgs& a, float* c, float* y);

// GRU's gates of one batch entry (order z, r, h): x [3H] X's product plus Wb + Rb for z and r and Wb for h; gzr [2H]
// the step's h @ R_zr^T; gh [H] the step's h @ R_h^T (linear_before_reset) or (r * h) @ R_h^T; rbh [H] Rb for h;
// h [H] the previous state. The reference model's order (kernels/ops/recurrent.py): Rb_h inside r * (...) with
// linear_before_reset, after the product without.
struct GruArgs {
  const float* x;
  const float* gzr;
  const float* gh;
  const float* rbh;
  const float* h;
  bool linear_before_reset;
  bool has_clip;
  float clip;
  int64_t H;
};

void GruRow(const GruArgs& a, float* y);

// GRU's reset gate applied to the state (linear_before_reset 0): out [H] = sigmoid(clip(xr + gr)) * h.
void ResetRow(const float* xr, const float* gr, const float* h, bool has_clip, float clip, int64_t H, float* out);

// RNN (Tanh): y [H] = tanh(clip(x + g)), x X's product plus Wb + Rb, g the step's h @ R^T.
void RnnRow(const float* x, const float* g, bool has_clip, float clip, int64_t H, float* y);

#if NPU_EP_X86
__attribute__((target("avx2,fma,avx512f"))) void GateRowAvx512(const GateArgs& a, float* c, float* y);
__attribute__((target("avx2,fma,avx512f"))) void GruRowAvx512(const GruArgs& a, float* y);
__attribute__((target("avx2,fma,avx512f"))) void ResetRowAvx512(const float* xr, const float* gr, const float* h,
                                                                bool has_clip, float clip, int64_t H, float* out);
__attribute__((target("avx2,fma,avx512f"))) void RnnRowAvx512(const float* x, const float* g, bool has_clip, float clip,
                                                              int64_t H, float* y);
#endif

// The gates' shared arithmetic, 16 lanes at a time on AVX-512 (the last ones masked), scalar elsewhere.
inline bool VectorGates() {
#if NPU_EP_X86
  return ActiveIsa() >= Isa::kAvx512;
#else
  return false;
#endif
}

}  // namespace npu_ep::kern
