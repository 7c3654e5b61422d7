// The gate math of the native recurrent cells (recurrent_gates.h), kept apart from the cells and their time loop.
#include "recurrent_gates.h"

#include <algorithm>
#include <cmath>

#include "intrinsics.h"

namespace npu_ep::kern {

// The gate math rounds each operation as the reference model does: no a * b + c contracted into one FMA.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

static inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(std::min(-x, 88.0f))); }

// tanh through expf (glibc's tanhf costs ~5x an expf): an odd Taylor polynomial below |x| = 1/16 (error < 1e-9
// relative), else 1 - 2 / (exp(2|x|) + 1) with x's sign (a few ulps relative); exp's argument capped where the
// result is 1 in float anyway.
static inline float Tanh(float x) {
  const float a = std::fabs(x);
  if (a < 0.0625f) {
    const float x2 = x * x;
    return x * (1.0f + x2 * (-1.0f / 3.0f + x2 * (2.0f / 15.0f)));
  }
  const float t = 1.0f - 2.0f / (std::exp(std::min(2.0f * a, 88.0f)) + 1.0f);
  return std::copysign(t, x);
}
static inline float Clip(float x, bool has_clip, float clip) {
  return has_clip ? std::min(std::max(x, -clip), clip) : x;
}

void GateRow(const GateArgs& a, float* c, float* y) {
  const int64_t H = a.H;
  const float* x = a.x;
  const float* gb = a.g;
  for (int64_t j = 0; j < H; ++j) {
    float gi = x[j] + gb[j], go = x[H + j] + gb[H + j];
    float gf = x[2 * H + j] + gb[2 * H + j], gc = x[3 * H + j] + gb[3 * H + j];
    if (a.peep != nullptr) gi += a.peep[j] * c[j], gf += a.peep[2 * H + j] * c[j];
    if (a.bias != nullptr) gi += a.bias[j], gf += a.bias[2 * H + j], gc += a.bias[3 * H + j];
    const float i = Sigmoid(Clip(gi, a.has_clip, a.clip)), f = Sigmoid(Clip(gf, a.has_clip, a.clip));
    const float c_new = f * c[j] + i * Tanh(Clip(gc, a.has_clip, a.clip));
    if (a.peep != nullptr) go += a.peep[H + j] * c_new;
    if (a.bias != nullptr) go += a.bias[H + j];
    c[j] = c_new;
    y[j] = Sigmoid(Clip(go, a.has_clip, a.clip)) * Tanh(c_new);
  }
}

#if NPU_EP_X86
// Sigmoid and Tanh of 16 lanes: the scalar functions' formulas and NaN behaviour, with exp in lanes (intrinsics.h,
// within 2 ulp of std::exp).
__attribute__((target("avx2,fma,avx512f"))) static inline __m512 SigmoidAvx512(__m512 x) {
  const __m512 neg = _mm512_sub_ps(_mm512_setzero_ps(), x);
  const __m512 e = ExpAvx512(_mm512_min_ps(_mm512_set1_ps(88.0f), neg));  // NaN: the second operand
  return _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

__attribute__((target("avx2,fma,avx512f"))) static inline __m512 TanhAvx512(__m512 x) {
  const __m512 a = _mm512_abs_ps(x);
  const __m512 x2 = _mm512_mul_ps(x, x);
  const __m512 poly = _mm512_mul_ps(
      x, _mm512_add_ps(_mm512_set1_ps(1.0f),
                       _mm512_mul_ps(x2, _mm512_add_ps(_mm512_set1_ps(-1.0f / 3.0f),
                                                       _mm512_mul_ps(x2, _mm512_set1_ps(2.0f / 15.0f))))));
  const __m512 e = ExpAvx512(_mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_add_ps(a, a)));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 t = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
  const __m512 signed_t = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), sign));  // copysign
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(0.0625f), _CMP_LT_OQ), signed_t, poly);
}

__attribute__((target("avx2,fma,avx512f"))) static inline __m512 ClipAvx512(__m512 v, bool has_clip, float clip) {
  if (!has_clip) return v;
  return _mm512_min_ps(_mm512_set1_ps(clip), _mm512_max_ps(_mm512_set1_ps(-clip), v));  // NaN stays
}
__attribute__((target("avx2,fma,avx512f"))) static inline __m512 ClipAvx512(__m512 v, const GateArgs& a) {
  return ClipAvx512(v, a.has_clip, a.clip);
}

// GateRow 16 lanes at a time (the last ones masked).
__attribute__((target("avx2,fma,avx512f"))) void GateRowAvx512(const GateArgs& a, float* c, float* y) {
  const int64_t H = a.H;
  for (int64_t j = 0; j < H; j += 16) {
    const __mmask16 k = static_cast<__mmask16>(H - j >= 16 ? 0xFFFF : (1u << (H - j)) - 1);
    const auto at = [&](const float* p, int64_t gate) { return _mm512_maskz_loadu_ps(k, p + gate * H + j); };
    __m512 gi = _mm512_add_ps(at(a.x, 0), at(a.g, 0)), go = _mm512_add_ps(at(a.x, 1), at(a.g, 1));
    __m512 gf = _mm512_add_ps(at(a.x, 2), at(a.g, 2)), gc = _mm512_add_ps(at(a.x, 3), at(a.g, 3));
    const __m512 cv = at(c, 0);
    if (a.peep != nullptr) {
      gi = _mm512_add_ps(gi, _mm512_mul_ps(at(a.peep, 0), cv));
      gf = _mm512_add_ps(gf, _mm512_mul_ps(at(a.peep, 2), cv));
    }
    if (a.bias != nullptr) {
      gi = _mm512_add_ps(gi, at(a.bias, 0));
      gf = _mm512_add_ps(gf, at(a.bias, 2));
      gc = _mm512_add_ps(gc, at(a.bias, 3));
    }
    const __m512 i = SigmoidAvx512(ClipAvx512(gi, a)), f = SigmoidAvx512(ClipAvx512(gf, a));
    const __m512 c_new = _mm512_add_ps(_mm512_mul_ps(f, cv), _mm512_mul_ps(i, TanhAvx512(ClipAvx512(gc, a))));
    if (a.peep != nullptr) go = _mm512_add_ps(go, _mm512_mul_ps(at(a.peep, 1), c_new));
    if (a.bias != nullptr) go = _mm512_add_ps(go, at(a.bias, 1));
    _mm512_mask_storeu_ps(c + j, k, c_new);
    _mm512_mask_storeu_ps(y + j, k, _mm512_mul_ps(SigmoidAvx512(ClipAvx512(go, a)), TanhAvx512(c_new)));
  }
}
#endif

void GruRow(const GruArgs& a, float* y) {
  const int64_t H = a.H;
  for (int64_t j = 0; j < H; ++j) {
    const float z = Sigmoid(Clip(a.x[j] + a.gzr[j], a.has_clip, a.clip));
    float gh;
    if (a.linear_before_reset) {
      const float r = Sigmoid(Clip(a.x[H + j] + a.gzr[H + j], a.has_clip, a.clip));
      gh = a.x[2 * H + j] + r * (a.gh[j] + a.rbh[j]);
    } else {
      gh = a.x[2 * H + j] + a.gh[j] + a.rbh[j];
    }
    y[j] = (1.0f - z) * Tanh(Clip(gh, a.has_clip, a.clip)) + z * a.h[j];
  }
}

// GRU's reset gate applied to the state (linear_before_reset 0): out [H] = sigmoid(clip(xr + gr)) * h.
void ResetRow(const float* xr, const float* gr, const float* h, bool has_clip, float clip, int64_t H, float* out) {
  for (int64_t j = 0; j < H; ++j) out[j] = Sigmoid(Clip(xr[j] + gr[j], has_clip, clip)) * h[j];
}

// RNN (Tanh): y [H] = tanh(clip(x + g)), x X's product plus Wb + Rb, g the step's h @ R^T.
void RnnRow(const float* x, const float* g, bool has_clip, float clip, int64_t H, float* y) {
  for (int64_t j = 0; j < H; ++j) y[j] = Tanh(Clip(x[j] + g[j], has_clip, clip));
}

#if NPU_EP_X86
__attribute__((target("avx2,fma,avx512f"))) static inline __mmask16 TailMask(int64_t H, int64_t j) {
  return static_cast<__mmask16>(H - j >= 16 ? 0xFFFF : (1u << (H - j)) - 1);
}

__attribute__((target("avx2,fma,avx512f"))) void GruRowAvx512(const GruArgs& a, float* y) {
  const int64_t H = a.H;
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t j = 0; j < H; j += 16) {
    const __mmask16 k = TailMask(H, j);
    const auto at = [&](const float* p, int64_t off) { return _mm512_maskz_loadu_ps(k, p + off + j); };
    const __m512 z = SigmoidAvx512(ClipAvx512(_mm512_add_ps(at(a.x, 0), at(a.gzr, 0)), a.has_clip, a.clip));
    __m512 gh;
    if (a.linear_before_reset) {
      const __m512 r = SigmoidAvx512(ClipAvx512(_mm512_add_ps(at(a.x, H), at(a.gzr, H)), a.has_clip, a.clip));
      gh = _mm512_add_ps(at(a.x, 2 * H), _mm512_mul_ps(r, _mm512_add_ps(at(a.gh, 0), at(a.rbh, 0))));
    } else {
      gh = _mm512_add_ps(_mm512_add_ps(at(a.x, 2 * H), at(a.gh, 0)), at(a.rbh, 0));
    }
    const __m512 tanh_gh = TanhAvx512(ClipAvx512(gh, a.has_clip, a.clip));
    const __m512 out = _mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(one, z), tanh_gh), _mm512_mul_ps(z, at(a.h, 0)));
    _mm512_mask_storeu_ps(y + j, k, out);
  }
}

__attribute__((target("avx2,fma,avx512f"))) void ResetRowAvx512(const float* xr, const float* gr, const float* h,
                                                                bool has_clip, float clip, int64_t H, float* out) {
  for (int64_t j = 0; j < H; j += 16) {
    const __mmask16 k = TailMask(H, j);
    const __m512 r = SigmoidAvx512(
        ClipAvx512(_mm512_add_ps(_mm512_maskz_loadu_ps(k, xr + j), _mm512_maskz_loadu_ps(k, gr + j)), has_clip, clip));
    _mm512_mask_storeu_ps(out + j, k, _mm512_mul_ps(r, _mm512_maskz_loadu_ps(k, h + j)));
  }
}

__attribute__((target("avx2,fma,avx512f"))) void RnnRowAvx512(const float* x, const float* g, bool has_clip, float clip,
                                                              int64_t H, float* y) {
  for (int64_t j = 0; j < H; j += 16) {
    const __mmask16 k = TailMask(H, j);
    const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(k, x + j), _mm512_maskz_loadu_ps(k, g + j));
    _mm512_mask_storeu_ps(y + j, k, TanhAvx512(ClipAvx512(v, has_clip, clip)));
  }
}
#endif

}  // namespace npu_ep::kern
