// The native scaled-dot-product attention core (sdpa.h) and its binding `kernels.sdpa`, the bound step of ONNX
// Attention, com.microsoft Attention and com.microsoft MultiHeadAttention (kernels/ops/attention_*.py).
//
// Each task takes query rows of one (batch, head) and runs GroupQueryAttention's inner loops on them
// (gqa_internal.h: scores, exp with the row sum, P V divided by the sum), kRows rows per pass over K and V; K and V
// rows (the past's, then the new ones plus their projection bias) are widened to float32 once per task. The order
// of operations is the reference's (kernels/ops/_sdpa.py attend): the dot product, times the scale, softcap,
// plus the row's additive bias (built from the op's mask, causal and attention-bias terms in the reference's
// order), then the softmax; a row whose maximum is NaN or +inf comes out NaN, one whose every score is -inf gives
// zeros (ORT's rule, the reference's). Only the summation orders and exp differ from numpy's (float tolerance, not
// bits). Float16 is widened exactly and the float32 result rounded to nearest even once, as numpy's astype.
#include "sdpa.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings.h"
#include "cpu.h"
#include "gqa_internal.h"
#include "half.h"
#include "intrinsics.h"
#include "packed_sgemm.h"
#include "thread_pool.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")  // scale, softcap and bias: separate roundings, as the reference's
#endif

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

using gqa::kRows;
constexpr int64_t kTransposeRows = 16;  // from this many query rows on, K is transposed once per task
constexpr float kInf = std::numeric_limits<float>::infinity();

// n elements at `offset` of `base` (float, or half when fp16) as float32 into dst, plus bias[i] when given.
void LoadRow(const void* base, int64_t offset, bool fp16, int64_t n, const float* bias, float* dst) {
  if (fp16)
    HalfToFloatRow(static_cast<const uint16_t*>(base) + offset, dst, n);
  else
    std::memcpy(dst, static_cast<const float*>(base) + offset, n * sizeof(float));
  if (bias)
    for (int64_t i = 0; i < n; ++i) dst[i] += bias[i];
}

// Row j of head (b, h) of the keys (or values) seen: the past's row j < P, else new row j - P plus its bias.
void KeyRow(const SdpaArgs& a, const SdpaView& x, const void* past, int64_t w, int64_t b, int64_t h, int64_t j,
            float* dst) {
  if (j < a.P) return LoadRow(past, ((b * a.Nkv + h) * a.P + j) * w, a.fp16, w, nullptr, dst);
  LoadRow(x.data, b * x.sb + h * x.sn + (j - a.P) * x.sr, a.fp16, w, x.bias ? x.bias + h * w : nullptr, dst);
}

float ValueAt(const void* data, int64_t at, bool half) {
  if (!half) return static_cast<const float*>(data)[at];
  float f;
  HalfToFloatRow(static_cast<const uint16_t*>(data) + at, &f, 1);
  return f;
}

bool HasBias(const SdpaArgs& a) {
  return a.mask_kind != MaskKind::kNone || a.causal != CausalKind::kNone || a.attn_bias != nullptr;
}

// The additive bias of query row s of head (b, n) over the T keys, in the reference's order: the mask term (0 or
// the op's masked value, or the float mask), then the causal term, then + the attention bias.
void BuildBias(const SdpaArgs& a, int64_t b, int64_t n, int64_t s, float* row) {
  const int64_t T = a.P + a.L;
  const SdpaMask& m = a.mask;
  const int64_t at = b * m.s[0] + n * m.s[1] + s * m.s[2];
  switch (a.mask_kind) {
    case MaskKind::kNone: std::fill(row, row + T, 0.0f); break;
    case MaskKind::kBool: {
      const uint8_t* p = static_cast<const uint8_t*>(m.data) + at;
      for (int64_t j = 0; j < T; ++j) row[j] = p[j * m.s[3]] ? 0.0f : -kInf;
      break;
    }
    case MaskKind::kFloat:
      if (a.mask_half) {
        for (int64_t j = 0; j < T; ++j) row[j] = ValueAt(m.data, at + j * m.s[3], true);
      } else {
        const float* p = static_cast<const float*>(m.data) + at;
        for (int64_t j = 0; j < T; ++j) row[j] = p[j * m.s[3]];
      }
      break;
    case MaskKind::kLengths:
    case MaskKind::kEndStart: {
      const int32_t* p = static_cast<const int32_t*>(m.data);
      const int64_t end = p[b];
      const int64_t start = a.mask_kind == MaskKind::kEndStart ? std::min<int64_t>(p[a.B + b], T) : 0;
      for (int64_t j = 0; j < T; ++j) row[j] = j < end && j >= start ? 0.0f : a.fill;
      break;
    }
    case MaskKind::kPositive:
    case MaskKind::kNonzero: {
      const int32_t* p = static_cast<const int32_t*>(m.data) + at;
      const bool positive = a.mask_kind == MaskKind::kPositive;
      for (int64_t j = 0; j < T; ++j) {
        const int32_t x = p[j * m.s[3]];
        row[j] = (positive ? x > 0 : x != 0) ? 0.0f : a.fill;
      }
      break;
    }
  }
  const int64_t first_future = std::max<int64_t>(0, std::min<int64_t>(T, s + a.P + 1));
  for (int64_t j = first_future; j < T && a.causal != CausalKind::kNone; ++j) {
    if (a.causal == CausalKind::kAddInf) row[j] += -kInf;
    if (a.causal == CausalKind::kLowest) row[j] = std::numeric_limits<float>::lowest();
    if (a.causal == CausalKind::kAddFill) row[j] += a.fill;
  }
  if (a.attn_bias) {
    const SdpaMask& ab = a.bias;
    const int64_t bat = b * ab.s[0] + n * ab.s[1] + s * ab.s[2];
    for (int64_t j = 0; j < T; ++j) row[j] += ValueAt(a.attn_bias, bat + j * ab.s[3], a.bias_half);
  }
}

// row[j] = softcap(row[j] * scale) [+ bias[j]] for j < n; returns the row's maximum, or NaN when it holds a NaN.
float ScaleBiasMax(float* row, int64_t n, float scale, float softcap, const float* bias) {
  float m = -kInf;
  bool nan = false;
  for (int64_t j = 0; j < n; ++j) {
    float x = row[j] * scale;
    if (softcap > 0.0f) x = std::tanh(x / softcap) * softcap;
    if (bias) x += bias[j];
    row[j] = x;
    nan |= x != x;
    m = x > m ? x : m;
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

#if NPU_EP_X86
__attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"))) float ScaleBiasMax512(float* row, int64_t n,
                                                                                             float scale, float softcap,
                                                                                             const float* bias) {
  if (softcap > 0.0f) return ScaleBiasMax(row, n, scale, softcap, bias);
  const __m512 vc = _mm512_set1_ps(scale);
  __m512 vm = _mm512_set1_ps(-kInf);
  __mmask16 nan = 0;
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 lanes = n - j >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - j)) - 1);
    __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, row + j), vc);
    if (bias) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(lanes, bias + j));
    _mm512_mask_storeu_ps(row + j, lanes, x);
    nan |= _mm512_mask_cmp_ps_mask(lanes, x, x, _CMP_UNORD_Q);
    vm = _mm512_mask_max_ps(vm, lanes, vm, x);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(vm);
}
#endif

using Prologue = float (*)(float*, int64_t, float, float, const float*);

Prologue SelectPrologue() {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) return ScaleBiasMax512;
#endif
  return ScaleBiasMax;
}

#if NPU_EP_X86
#define SDPA_UNROLL _Pragma("GCC unroll 16")

// gqa_ops.cc's ScoresT512R products (the same multiply-adds in the same order), then ScaleBiasMax512's operations.
template <int R>
__attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"))) void ScoresPrologue512R(
    const float* q, int64_t lq, const float* kt, int64_t ldk, int64_t kp, int64_t nk, int64_t h, float scale,
    const float* bias, int64_t ldb, float* sc, int64_t ld, float* max) {
  constexpr int kVec = 4;  // 64 keys x R rows of accumulators
  const __m512 vc = _mm512_set1_ps(scale);
  __m512 vm[R];
  __mmask16 nan[R];
  SDPA_UNROLL for (int r = 0; r < R; ++r) vm[r] = _mm512_set1_ps(-kInf), nan[r] = 0;
  for (int64_t j0 = 0; j0 < nk; j0 += 16 * kVec) {
    __mmask16 lanes[kVec];
    SDPA_UNROLL for (int u = 0; u < kVec; ++u) {
      const int64_t left = nk - j0 - 16 * u;
      lanes[u] = left >= 16 ? static_cast<__mmask16>(0xFFFF) : left <= 0 ? 0 : static_cast<__mmask16>((1u << left) - 1);
    }
    __m512 acc[R][kVec];
    SDPA_UNROLL for (int r = 0; r < R; ++r) SDPA_UNROLL for (int u = 0; u < kVec; ++u) acc[r][u] = _mm512_setzero_ps();
    for (int64_t i = 0; i < h; ++i) {
      const float* kr = kt + j0 / 64 * kp + i * ldk;
      __m512 kv[kVec];
      SDPA_UNROLL for (int u = 0; u < kVec; ++u) kv[u] = _mm512_maskz_loadu_ps(lanes[u], kr + 16 * u);
      SDPA_UNROLL for (int r = 0; r < R; ++r) {
        const __m512 w = _mm512_set1_ps(q[r * lq + i]);
        SDPA_UNROLL for (int u = 0; u < kVec; ++u) acc[r][u] = _mm512_fmadd_ps(w, kv[u], acc[r][u]);
      }
    }
    SDPA_UNROLL for (int r = 0; r < R; ++r) SDPA_UNROLL for (int u = 0; u < kVec; ++u) {
      __m512 x = _mm512_mul_ps(acc[r][u], vc);
      if (bias) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(lanes[u], bias + r * ldb + j0 + 16 * u));
      _mm512_mask_storeu_ps(sc + r * ld + j0 + 16 * u, lanes[u], x);
      nan[r] |= _mm512_mask_cmp_ps_mask(lanes[u], x, x, _CMP_UNORD_Q);
      vm[r] = _mm512_mask_max_ps(vm[r], lanes[u], vm[r], x);
    }
  }
  SDPA_UNROLL for (int r = 0; r < R; ++r) max[r] =
      nan[r] ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(vm[r]);
}

void ScoresPrologue512(const float* q, int64_t lq, int rows, const float* kt, int64_t ldk, int64_t kp, int64_t nk,
                       int64_t h, float scale, const float* bias, int64_t ldb, float* sc, int64_t ld, float* max) {
  switch (rows) {
    case 1: return ScoresPrologue512R<1>(q, lq, kt, ldk, kp, nk, h, scale, bias, ldb, sc, ld, max);
    case 2: return ScoresPrologue512R<2>(q, lq, kt, ldk, kp, nk, h, scale, bias, ldb, sc, ld, max);
    case 3: return ScoresPrologue512R<3>(q, lq, kt, ldk, kp, nk, h, scale, bias, ldb, sc, ld, max);
    default: return ScoresPrologue512R<4>(q, lq, kt, ldk, kp, nk, h, scale, bias, ldb, sc, ld, max);
  }
}

// gqa_ops.cc's Pv512R over keys [0, nk) of a longer row: the same multiply-adds in the same order, the
// accumulators continued from acc[r * la ..] unless `first`; unless `last` they are stored back there, else
// divided by div[r] into out[r].
template <int R, int kVec>
__attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"))) void PvPart512R(
    const float* p, int64_t ld, const float* v, int64_t nk, int64_t h, float* acc_rows, int64_t la, bool first,
    bool last, const float* div, float* const* out) {
  for (int64_t c = 0; c < h; c += 16 * kVec) {
    __mmask16 lanes[kVec];
    SDPA_UNROLL for (int u = 0; u < kVec; ++u) {
      const int64_t left = h - c - 16 * u;
      lanes[u] = left >= 16 ? static_cast<__mmask16>(0xFFFF) : left <= 0 ? 0 : static_cast<__mmask16>((1u << left) - 1);
    }
    __m512 acc[R][kVec];
    SDPA_UNROLL for (int r = 0; r < R; ++r) SDPA_UNROLL for (int u = 0; u < kVec; ++u) acc[r][u] =
        first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(lanes[u], acc_rows + r * la + c + 16 * u);
    for (int64_t j = 0; j < nk; ++j) {
      const float* vj = v + j * h + c;
      __m512 vv[kVec];
      SDPA_UNROLL for (int u = 0; u < kVec; ++u) vv[u] = _mm512_maskz_loadu_ps(lanes[u], vj + 16 * u);
      SDPA_UNROLL for (int r = 0; r < R; ++r) {
        const __m512 w = _mm512_set1_ps(p[r * ld + j]);
        SDPA_UNROLL for (int u = 0; u < kVec; ++u) acc[r][u] = _mm512_fmadd_ps(w, vv[u], acc[r][u]);
      }
    }
    SDPA_UNROLL for (int r = 0; r < R; ++r) SDPA_UNROLL for (int u = 0; u < kVec; ++u) {
      if (last)
        _mm512_mask_storeu_ps(out[r] + c + 16 * u, lanes[u], _mm512_div_ps(acc[r][u], _mm512_set1_ps(div[r])));
      else
        _mm512_mask_storeu_ps(acc_rows + r * la + c + 16 * u, lanes[u], acc[r][u]);
    }
  }
}

template <int kVec>
void PvPart512V(const float* p, int rows, int64_t ld, const float* v, int64_t nk, int64_t h, float* acc, int64_t la,
                bool first, bool last, const float* div, float* const* out) {
  switch (rows) {
    case 1: return PvPart512R<1, kVec>(p, ld, v, nk, h, acc, la, first, last, div, out);
    case 2: return PvPart512R<2, kVec>(p, ld, v, nk, h, acc, la, first, last, div, out);
    case 3: return PvPart512R<3, kVec>(p, ld, v, nk, h, acc, la, first, last, div, out);
    default: return PvPart512R<4, kVec>(p, ld, v, nk, h, acc, la, first, last, div, out);
  }
}

// Heads of up to 32 channels take two vectors per row, as gqa_ops.cc's Pv512.
void PvPart512(const float* p, int rows, int64_t ld, const float* v, int64_t nk, int64_t h, float* acc, int64_t la,
               bool first, bool last, const float* div, float* const* out) {
  if (h <= 32) return PvPart512V<2>(p, rows, ld, v, nk, h, acc, la, first, last, div, out);
  PvPart512V<4>(p, rows, ld, v, nk, h, acc, la, first, last, div, out);
}
#undef SDPA_UNROLL
#endif

struct Buffers {
  std::vector<float> q, sc, k, v, bias, o, out, stage, acc;
};

// The prologue with qk_matmul_output's stage of the row kept in `stage` (qk_mode 0: the scaled scores, 1: after the
// softcap, 2: after the bias, -inf as float32's lowest value): the same operations as ScaleBiasMax.
float StagedRow(const SdpaArgs& a, float* row, int64_t n, const float* bias, float* stage) {
  float m = -kInf;
  bool nan = false;
  for (int64_t j = 0; j < n; ++j) {
    float x = row[j] * a.scale;
    if (a.qk_mode == 0) stage[j] = x;
    if (a.softcap > 0.0f) x = std::tanh(x / a.softcap) * a.softcap;
    if (a.qk_mode == 1) stage[j] = x;
    if (bias) x += bias[j];
    if (a.qk_mode == 2)
      stage[j] = x > std::numeric_limits<float>::lowest() || x != x ? x : std::numeric_limits<float>::lowest();
    row[j] = x;
    nan |= x != x;
    m = x > m ? x : m;
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

// The softmax stage (qk_mode 3) of a row whose maximum is NaN or infinite, as the reference computes it: exp of
// the scores unshifted, divided by their sum (1 when the sum is 0).
void SpecialProbabilities(const float* row, int64_t n, float* stage) {
  float total = 0.0f;
  for (int64_t j = 0; j < n; ++j) total += (stage[j] = std::exp(row[j]));
  if (total == 0.0f) total = 1.0f;
  for (int64_t j = 0; j < n; ++j) stage[j] /= total;
}

// Row s of head (b, n) of the qk_matmul_output [B, N, S, T] from `stage`, rounded once to the storage dtype.
void StoreStage(const SdpaArgs& a, const float* stage, int64_t b, int64_t n, int64_t s) {
  const int64_t T = a.P + a.L, at = ((b * a.N + n) * a.S + s) * T;
  if (a.fp16)
    FloatToHalfRow(stage, static_cast<uint16_t*>(a.qk) + at, T);
  else
    std::memcpy(static_cast<float*>(a.qk) + at, stage, T * sizeof(float));
}

#if NPU_EP_X86
// dst[i * ld + k] = src[k * ls + i] (float32, or half widened exactly) for the 16 rows k of src and its H columns i
// (H a multiple of 16): 16 x 16 tiles transposed in registers (flatten and GCC's complete unrolling keep the tile in
// registers, not on the stack).
template <bool kHalf>
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3")))
#endif
__attribute__((target("avx512f"), flatten)) void Transpose16Rows512(const void* src, int64_t ls, int64_t H, float* dst,
                                                                    int64_t ld) {
  for (int64_t i0 = 0; i0 < H; i0 += 16) {
    __m512 r[16];
    for (int k = 0; k < 16; ++k)
      r[k] = kHalf ? _mm512_cvtph_ps(_mm256_loadu_si256(
                         reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(src) + k * ls + i0)))
                   : _mm512_loadu_ps(static_cast<const float*>(src) + k * ls + i0);
    Transpose16x16Ps(r);
    for (int k = 0; k < 16; ++k) _mm512_storeu_ps(dst + (i0 + k) * ld, r[k]);
  }
}
#endif

// K of head (b, h) as float32 rows [T, H], transposed [H, ld], or with `panels` transposed per kPanel keys (key j's
// channel i at (j / kPanel) * H * kPanel + i * kPanel + j % kPanel: a panel's channel rows are adjacent); returns
// the data and sets *ldk to the pitch of a channel's row.
const float* GatherKeys(const SdpaArgs& a, int64_t b, int64_t h, bool transposed, int64_t ld, Buffers& buf,
                        int64_t* ldk, bool panels = false) {
  const int64_t T = a.P + a.L, H = a.H;
  *ldk = ld;
  if (!transposed && !a.fp16 && a.P == 0 && !a.k.bias && a.k.sr == H)
    return static_cast<const float*>(a.k.data) + b * a.k.sb + h * a.k.sn;
  if (!transposed) {
    buf.k.resize(T * H);
    for (int64_t j = 0; j < T; ++j) KeyRow(a, a.k, a.past_k, H, b, h, j, buf.k.data() + j * H);
    return buf.k.data();
  }
  if (panels) *ldk = kPanel;
  const int64_t pitch = *ldk;
  buf.k.resize(panels ? (T + kPanel - 1) / kPanel * kPanel * H : H * ld);
  float tmp[16 * 256];
  const int64_t step = H <= 256 ? 16 : 1;
#if NPU_EP_X86
  const bool tiles = H % 16 == 0 && ActiveIsa() >= Isa::kAvx512;
  const int64_t item = a.fp16 ? 2 : 4;
#endif
  for (int64_t j0 = 0; j0 < T; j0 += step) {  // a few keys at a time: short runs on both sides
    const int64_t j1 = std::min(T, j0 + step);
    float* col = buf.k.data() + (panels ? j0 / kPanel * H * kPanel + j0 % kPanel : j0);  // key j0's channel 0
#if NPU_EP_X86
    // 16 past rows, or 16 new rows without a bias, transposed from where they are stored
    const bool past = j1 <= a.P, direct = past || (j0 >= a.P && !a.k.bias);
    if (tiles && direct && j1 - j0 == 16) {
      const char* src =
          past ? static_cast<const char*>(a.past_k) + ((b * a.Nkv + h) * a.P + j0) * H * item
               : static_cast<const char*>(a.k.data) + (b * a.k.sb + h * a.k.sn + (j0 - a.P) * a.k.sr) * item;
      const int64_t ls = past ? H : a.k.sr;
      if (a.fp16)
        Transpose16Rows512<true>(src, ls, H, col, pitch);
      else
        Transpose16Rows512<false>(src, ls, H, col, pitch);
      continue;
    }
#endif
    if (H > 256) {
      std::vector<float>& wide = buf.o;
      wide.resize(H);
      KeyRow(a, a.k, a.past_k, H, b, h, j0, wide.data());
      for (int64_t i = 0; i < H; ++i) col[i * pitch] = wide[i];
      continue;
    }
    for (int64_t j = j0; j < j1; ++j) KeyRow(a, a.k, a.past_k, H, b, h, j, tmp + (j - j0) * H);
#if NPU_EP_X86
    if (tiles && j1 - j0 == 16) {
      Transpose16Rows512<false>(tmp, H, H, col, pitch);
      continue;
    }
#endif
    for (int64_t i = 0; i < H; ++i)
      for (int64_t j = j0; j < j1; ++j) col[i * pitch + j - j0] = tmp[(j - j0) * H + i];
  }
  return buf.k.data();
}

const float* GatherValues(const SdpaArgs& a, int64_t b, int64_t h, Buffers& buf) {
  const int64_t T = a.P + a.L, Hv = a.Hv;
  if (!a.fp16 && a.P == 0 && !a.v.bias && a.v.sr == Hv)
    return static_cast<const float*>(a.v.data) + b * a.v.sb + h * a.v.sn;
  buf.v.resize(T * Hv);
  for (int64_t j = 0; j < T; ++j) KeyRow(a, a.v, a.past_v, Hv, b, h, j, buf.v.data() + j * Hv);
  return buf.v.data();
}

// Rows [s0, s1) of head (b, n) without the fused scores: kRows rows per pass over K and V.
void Task(const SdpaArgs& a, const gqa::Ops& ops, Prologue prologue, int64_t b, int64_t n, int64_t s0, int64_t s1) {
  const int64_t H = a.H, Hv = a.Hv, T = a.P + a.L, ld = std::max<int64_t>((T + 15) / 16 * 16, 16);
  const bool transposed = a.S >= kTransposeRows, bias = HasBias(a);
  const int64_t h = n / (a.N / a.Nkv);
  thread_local Buffers buf;
  buf.q.resize(kRows * H);
  buf.sc.resize(kRows * ld);
  if (bias) buf.bias.resize(T);
  int64_t ldk = ld;
  const float* kuse = GatherKeys(a, b, h, transposed, ld, buf, &ldk);
  const float* vuse = GatherValues(a, b, h, buf);
  if (a.fp16) buf.out.resize(kRows * Hv);
  if (a.qk) buf.stage.resize(T);
  float* stage = buf.stage.data();
  float sums[kRows];
  float* orow[kRows];
  for (int64_t r0 = s0; r0 < s1; r0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, s1 - r0));
    for (int r = 0; r < rows; ++r) {
      LoadRow(a.q.data, b * a.q.sb + n * a.q.sn + (r0 + r) * a.q.sr, a.fp16, H, a.q.bias ? a.q.bias + n * H : nullptr,
              buf.q.data() + r * H);
      orow[r] = a.fp16 ? buf.out.data() + r * Hv : static_cast<float*>(a.out) + b * a.ob + n * a.on + (r0 + r) * a.os;
    }
    if (transposed)
      ops.scores_t(buf.q.data(), rows, kuse, ldk, T, H, buf.sc.data(), ld);
    else
      ops.scores(buf.q.data(), rows, kuse, T, H, buf.sc.data(), ld);
    for (int r = 0; r < rows; ++r) {
      float* row = buf.sc.data() + r * ld;
      if (bias) BuildBias(a, b, n, r0 + r, buf.bias.data());
      const float* br = bias ? buf.bias.data() : nullptr;
      const float m = a.qk ? StagedRow(a, row, T, br, stage) : prologue(row, T, a.scale, a.softcap, br);
      if (std::isnan(m) || std::isinf(m)) {  // every score -inf: zeros (ORT's rule); a NaN or +inf: NaN
        if (a.qk_mode == 3) SpecialProbabilities(row, T, stage);
        if (a.qk) StoreStage(a, stage, b, n, r0 + r);
        std::fill(row, row + T, 0.0f);
        sums[r] = m < 0.0f ? 1.0f : std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      sums[r] = ops.exp_sum(row, T, m);
      if (a.qk_mode == 3)
        for (int64_t j = 0; j < T; ++j) stage[j] = row[j] / sums[r];
      if (a.qk) StoreStage(a, stage, b, n, r0 + r);
    }
    ops.pv(buf.sc.data(), rows, ld, vuse, T, Hv, sums, orow);
    if (a.fp16)
      for (int r = 0; r < rows; ++r)
        FloatToHalfRow(orow[r], static_cast<uint16_t*>(a.out) + b * a.ob + n * a.on + (r0 + r) * a.os, Hv);
  }
}

#if NPU_EP_X86
// Rows [s0, s1) of head (b, n) with the fused scores (AVX-512), K transposed in panels: PanelPass over passes of
// query rows.
void FusedTask(const SdpaArgs& a, const gqa::Ops& ops, ScoresPrologue fused_scores, int64_t b, int64_t n, int64_t s0,
               int64_t s1) {
  const int64_t H = a.H, Hv = a.Hv, T = a.P + a.L, ld = std::max<int64_t>((T + 15) / 16 * 16, 16);
  const bool bias = HasBias(a), q_direct = !a.fp16 && !a.q.bias;  // float32 Q rows are read where they are
  const int64_t h = n / (a.N / a.Nkv), pass = PassRows(T);
  thread_local Buffers buf;
  buf.q.resize(pass * H);
  buf.sc.resize(pass * ld);
  if (bias) buf.bias.resize(pass * T);
  int64_t ldk = ld;
  PanelArgs p;
  p.kt = GatherKeys(a, b, h, true, ld, buf, &ldk, true);
  p.v = GatherValues(a, b, h, buf);
  p.h = H, p.hv = Hv, p.t = T, p.scale = a.scale, p.ldb = T, p.masked_rows_zero = true;
  buf.acc.resize(pass * Hv);
  if (a.fp16) buf.out.resize(pass * Hv);
  float* orow[kPassRows];
  p.out = orow;
  for (int64_t r0 = s0; r0 < s1; r0 += pass) {
    const int64_t rows = std::min(pass, s1 - r0);
    p.q = buf.q.data(), p.lq = H;
    if (q_direct) p.q = static_cast<const float*>(a.q.data) + b * a.q.sb + n * a.q.sn + r0 * a.q.sr, p.lq = a.q.sr;
    for (int64_t r = 0; r < rows; ++r) {
      if (!q_direct)
        LoadRow(a.q.data, b * a.q.sb + n * a.q.sn + (r0 + r) * a.q.sr, a.fp16, H, a.q.bias ? a.q.bias + n * H : nullptr,
                buf.q.data() + r * H);
      if (bias) BuildBias(a, b, n, r0 + r, buf.bias.data() + r * T);
      orow[r] = a.fp16 ? buf.out.data() + r * Hv : static_cast<float*>(a.out) + b * a.ob + n * a.on + (r0 + r) * a.os;
    }
    p.bias = bias ? buf.bias.data() : nullptr;
    PanelPass(p, rows, fused_scores, ops, buf.sc.data(), ld, buf.acc.data());
    if (a.fp16)
      for (int64_t r = 0; r < rows; ++r)
        FloatToHalfRow(orow[r], static_cast<uint16_t*>(a.out) + b * a.ob + n * a.on + (r0 + r) * a.os, Hv);
  }
}
#endif

// present[b, h] = the past's rows then the new rows (plus their bias, rounded to the storage dtype once).
void WritePresent(const SdpaArgs& a, const SdpaView& x, const void* past, void* present, int64_t w, int64_t b,
                  int64_t h) {
  const int64_t T = a.P + a.L, item = a.fp16 ? 2 : 4;
  char* dst = static_cast<char*>(present) + (b * a.Nkv + h) * T * w * item;
  if (a.P) std::memcpy(dst, static_cast<const char*>(past) + (b * a.Nkv + h) * a.P * w * item, a.P * w * item);
  std::vector<float> row(x.bias ? w : 0);
  for (int64_t j = 0; j < a.L; ++j) {
    const int64_t at = b * x.sb + h * x.sn + j * x.sr;
    char* d = dst + (a.P + j) * w * item;
    if (!x.bias) {
      std::memcpy(d, static_cast<const char*>(x.data) + at * item, w * item);
      continue;
    }
    LoadRow(x.data, at, a.fp16, w, x.bias + h * w, row.data());
    if (a.fp16)
      FloatToHalfRow(row.data(), reinterpret_cast<uint16_t*>(d), w);
    else
      std::memcpy(d, row.data(), w * sizeof(float));
  }
}

}  // namespace

ScoresPrologue SelectScoresPrologue() {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) return ScoresPrologue512;
#endif
  return nullptr;
}

#if NPU_EP_X86
void TransposeKeys16x512(const float* src, int64_t ls, int64_t H, float* dst, int64_t ld) {
  Transpose16Rows512<false>(src, ls, H, dst, ld);
}

void PanelPass(const PanelArgs& p, int64_t rows, ScoresPrologue fused_scores, const gqa::Ops& ops, float* sc,
               int64_t ld, float* acc) {
  const int64_t T = p.t;
  float maxes[kPassRows], sums[kPassRows];
  std::fill(maxes, maxes + rows, -kInf);
  for (int64_t j0 = 0; j0 < T; j0 += kPanel) {
    const int64_t nk = std::min(kPanel, T - j0);
    for (int64_t g = 0; g < rows; g += kRows) {
      const int gr = static_cast<int>(std::min<int64_t>(kRows, rows - g));
      float m[kRows];
      fused_scores(p.q + g * p.lq, p.lq, gr, p.kt + j0 * p.h, kPanel, kPanel * p.h, nk, p.h, p.scale,
                   p.bias ? p.bias + g * p.ldb + j0 : nullptr, p.ldb, sc + g * ld + j0, ld, m);
      for (int r = 0; r < gr; ++r) {
        float& x = maxes[g + r];
        x = std::isnan(x) || std::isnan(m[r]) ? std::numeric_limits<float>::quiet_NaN() : std::max(x, m[r]);
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* row = sc + r * ld;
    const float m = maxes[r];
    if (std::isnan(m) || std::isinf(m)) {  // NaN or +inf: a NaN row; every score -inf: zeros where asked
      const bool zero = p.nan_rows_zero || (p.masked_rows_zero && m < 0.0f);
      std::fill(row, row + T, 0.0f);
      sums[r] = zero ? 1.0f : std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    sums[r] = ops.exp_sum(row, T, m);
  }
  for (int64_t j0 = 0; j0 < T; j0 += kPanel) {
    const int64_t nk = std::min(kPanel, T - j0);
    for (int64_t g = 0; g < rows; g += kRows)
      PvPart512(sc + g * ld + j0, static_cast<int>(std::min<int64_t>(kRows, rows - g)), ld, p.v + j0 * p.hv, nk, p.hv,
                acc + g * p.hv, p.hv, j0 == 0, j0 + nk >= T, sums + g, p.out + g);
  }
}
#endif

void Sdpa(const SdpaArgs& a) {
  const int64_t T = a.P + a.L;
  if (a.present_k) {
    const int used = ThreadsFor(a.threads, a.B * a.Nkv * T * (a.H + a.Hv));
    ParallelFor(used, a.B * a.Nkv, [&](int64_t t) {
      WritePresent(a, a.k, a.past_k, a.present_k, a.H, t / a.Nkv, t % a.Nkv);
      WritePresent(a, a.v, a.past_v, a.present_v, a.Hv, t / a.Nkv, t % a.Nkv);
    });
  }
  const int64_t heads = a.B * a.N;
  if (heads == 0 || a.S == 0 || a.Hv == 0 || T == 0) return;
  const gqa::Ops ops = gqa::SelectOps();
  const Prologue prologue = SelectPrologue();
  const ScoresPrologue fused_scores = SelectScoresPrologue();
  [[maybe_unused]] const bool fused = fused_scores && a.S >= kTransposeRows && !a.qk && a.softcap <= 0.0f;
  const int used = ThreadsFor(a.threads, heads * a.S * T * (a.H + a.Hv));
  // A row's result does not depend on the task holding it, so the split may follow the thread count: whole heads
  // unless that leaves threads idle, then about two tasks per thread.
  const int64_t chunks = std::min(a.S, std::max<int64_t>(1, (2 * used + heads - 1) / heads));
  const int64_t rows = (a.S + chunks - 1) / chunks;
  ParallelFor(used, heads * chunks, [&](int64_t t) {
    const int64_t head = t / chunks, s0 = (t % chunks) * rows;
    if (s0 >= a.S) return;
#if NPU_EP_X86
    if (fused) return FusedTask(a, ops, fused_scores, head / a.N, head % a.N, s0, std::min(a.S, s0 + rows));
#endif
    Task(a, ops, prologue, head / a.N, head % a.N, s0, std::min(a.S, s0 + rows));
  });
}

namespace {

#define SDPA_EXPECT(ok, what)                                               \
  do {                                                                      \
    if (!(ok)) throw std::invalid_argument(std::string("sdpa: ") + (what)); \
  } while (0)

std::string Describe(const py::array& a) { return Dims(a) + " " + std::string(py::str(a.dtype())); }

bool IsFloat(const py::array& a, bool fp16) { return a.dtype().kind() == 'f' && a.itemsize() == (fp16 ? 2 : 4); }

void ExpectData(const py::array& a, const char* name, bool fp16) {
  SDPA_EXPECT(
      IsFloat(a, fp16) && (a.flags() & py::array::c_style),
      std::string(name) + " must be a C-contiguous " + (fp16 ? "float16" : "float32") + " array, got " + Describe(a));
}

// A [B, S, heads * W] (rank 3) or [B, heads, S, W] (rank 4) C-order array as a view; sets its dims.
SdpaView HeadsView(const void* data, int rank, int64_t d1, int64_t d2, int64_t d3, int64_t heads, int64_t* rows,
                   int64_t* width) {
  SdpaView v;
  v.data = data;
  if (rank == 3) {
    *rows = d1, *width = d2 / heads;
    v.sb = d1 * d2, v.sn = *width, v.sr = d2;
  } else {
    *rows = d2, *width = d3;
    v.sb = heads * d2 * d3, v.sn = d2 * d3, v.sr = d3;
  }
  return v;
}

// An operand broadcast to [B, N, S, T]: right-aligned (ONNX), or a key-padding mask's [B, T] / [B, S, T].
SdpaMask Broadcast(const py::array& m, const char* name, const int64_t (&full)[4], bool key_padding) {
  SdpaMask out;
  out.data = m.data();
  const int rank = static_cast<int>(m.ndim());
  int axis[4] = {0, 1, 2, 3};
  bool ok = rank >= 1 && rank <= 4 && (m.flags() & py::array::c_style);
  if (key_padding) {
    ok = ok && (rank == 2 || rank == 3);
    if (rank == 2) axis[0] = 0, axis[1] = 3;
    if (rank == 3) axis[0] = 0, axis[1] = 2, axis[2] = 3;
  } else {
    for (int i = 0; i < rank; ++i) axis[i] = 4 - rank + i;
  }
  for (int i = 0; ok && i < rank; ++i) {
    const int64_t d = m.shape(i), want = full[axis[i]];
    ok = d == 1 || d == want;
    out.s[axis[i]] = d == 1 ? 0 : m.strides(i) / m.itemsize();
  }
  SDPA_EXPECT(ok, std::string(name) + " " + Describe(m) + " does not broadcast to [" + std::to_string(full[0]) + ", " +
                      std::to_string(full[1]) + ", " + std::to_string(full[2]) + ", " + std::to_string(full[3]) + "]");
  return out;
}

void SetMask(SdpaArgs& a, const py::object& mask, int kind) {
  SDPA_EXPECT(kind >= 0 && kind <= 6, "mask_kind must be 0..6");
  a.mask_kind = static_cast<MaskKind>(kind);
  if (a.mask_kind == MaskKind::kNone) return;
  SDPA_EXPECT(!mask.is_none(), "mask_kind " + std::to_string(kind) + " needs a mask");
  const py::array m = mask.cast<py::array>();
  const int64_t full[4] = {a.B, a.N, a.S, a.P + a.L};
  const char kind_char = m.dtype().kind();
  switch (a.mask_kind) {
    case MaskKind::kBool:
      SDPA_EXPECT(kind_char == 'b', "a bool mask must be bool, got " + Describe(m));
      a.mask = Broadcast(m, "mask", full, false);
      break;
    case MaskKind::kFloat:
      SDPA_EXPECT(kind_char == 'f' && (m.itemsize() == 2 || m.itemsize() == 4),
                  "a float mask must be float16 or float32, got " + Describe(m));
      a.mask_half = m.itemsize() == 2;
      a.mask = Broadcast(m, "mask", full, false);
      break;
    case MaskKind::kLengths:
    case MaskKind::kEndStart: {
      const int64_t want = a.mask_kind == MaskKind::kLengths ? a.B : 2 * a.B;
      SDPA_EXPECT(kind_char == 'i' && m.itemsize() == 4 && m.ndim() == 1 && m.shape(0) == want &&
                      (m.flags() & py::array::c_style),
                  "a key-length mask must be C-order int32 [" + std::to_string(want) + "], got " + Describe(m));
      a.mask.data = m.data();
      break;
    }
    default:
      SDPA_EXPECT(kind_char == 'i' && m.itemsize() == 4, "a raw mask must be int32, got " + Describe(m));
      a.mask = Broadcast(m, "mask", full, true);
      break;
  }
}

// com.microsoft Attention's projection: x [B, S, Din] @ W (packed) + bias into `qkv` [B * S, Dq + Dk + Dv].
void Project(const py::array& x, const py::tuple& proj, int threads, std::vector<float>& qkv, int64_t* cols) {
  SDPA_EXPECT(proj.size() == 2, "projection must be (packed weights, bias)");
  ExpectData(x, "x", false);
  SDPA_EXPECT(x.ndim() == 3, "x must be [batch, sequence, hidden], got " + Describe(x));
  const py::array packed = proj[0].cast<py::array>(), bias = proj[1].cast<py::array>();
  ExpectData(bias, "projection bias", false);
  ExpectData(packed, "packed weights", false);
  const int64_t K = x.shape(2), N = bias.size(), panels = (N + kSgemmPanel - 1) / kSgemmPanel;
  SDPA_EXPECT(packed.size() == panels * K * kSgemmPanel,
              "packed weights " + Describe(packed) + " do not hold " + std::to_string(K) + " x " + std::to_string(N));
  const int64_t M = x.shape(0) * x.shape(1);
  qkv.resize(M * N);
  *cols = N;
  PackedSgemmArgs g{static_cast<const float*>(x.data()),      M,    K,          K,
                    static_cast<const float*>(packed.data()), N,    qkv.data(), N,
                    static_cast<const float*>(bias.data()),   false};
  py::gil_scoped_release release;
  PackedSgemm(g, threads, nullptr, nullptr);
}

// A new array of q's dtype (float16 or float32): no dtype parsed per call.
py::array NewLike(const py::dtype& dtype, const std::vector<py::ssize_t>& shape) { return py::array(dtype, shape); }

// Q, K, V of the call: q, k, v as given (rank 3 with `heads` / `kv_heads` heads, or rank 4), or com.microsoft
// Attention's projection of x (q) into `qkv`; sets the dims, views and dtype.
void SetOperands(SdpaArgs& a, const py::array& q, const py::object& k_obj, const py::object& v_obj, int64_t heads,
                 int64_t kv_heads, const py::object& projection, int threads, std::vector<float>& qkv) {
  const int rank = static_cast<int>(q.ndim());
  SDPA_EXPECT(rank == 3 || rank == 4, "q must be of rank 3 or 4, got " + Describe(q));
  SDPA_EXPECT(heads > 0 && kv_heads > 0, "heads and kv_heads must be positive");
  a.B = q.shape(0);
  if (!projection.is_none()) {
    const py::tuple proj = projection.cast<py::tuple>();
    SDPA_EXPECT(rank == 3 && k_obj.is_none() && v_obj.is_none() && proj.size() == 4,
                "with a projection (packed W, bias, Dq, Dk), q is x [B, S, Din] and k, v are None");
    int64_t cols = 0;
    Project(q, py::make_tuple(proj[0], proj[1]), threads, qkv, &cols);
    const int64_t dq = proj[2].cast<int64_t>(), dk = proj[3].cast<int64_t>(), dv = cols - dq - dk;
    SDPA_EXPECT(dq == dk && dq > 0 && dv > 0 && dq % heads == 0 && dv % heads == 0,
                "projection widths " + std::to_string(dq) + ", " + std::to_string(dk) + ", " + std::to_string(dv) +
                    " do not split into " + std::to_string(heads) + " heads with Dq == Dk");
    a.S = a.L = q.shape(1), a.N = a.Nkv = heads, a.H = dq / heads, a.Hv = dv / heads;
    const SdpaView base{qkv.data(), a.S * cols, 0, cols, nullptr};
    a.q = a.k = a.v = base;
    a.q.sn = a.k.sn = a.H, a.v.sn = a.Hv;
    a.k.data = qkv.data() + dq, a.v.data = qkv.data() + dq + dk;
    return;
  }
  a.fp16 = q.dtype().kind() == 'f' && q.itemsize() == 2;
  ExpectData(q, "q", a.fp16);
  SDPA_EXPECT(!k_obj.is_none() && !v_obj.is_none(), "k and v are required");
  const py::array k = k_obj.cast<py::array>(), v = v_obj.cast<py::array>();
  ExpectData(k, "k", a.fp16);
  ExpectData(v, "v", a.fp16);
  const int kr = static_cast<int>(k.ndim());
  SDPA_EXPECT((kr == 3 || kr == 4) && v.ndim() == kr,
              "k and v must be of one rank, 3 or 4, got " + Describe(k) + ", " + Describe(v));
  a.N = rank == 3 ? heads : q.shape(1);
  a.Nkv = kr == 3 ? kv_heads : k.shape(1);
  const bool widths =
      (rank == 4 || q.shape(2) % a.N == 0) && (kr == 4 || (k.shape(2) % a.Nkv == 0 && v.shape(2) % a.Nkv == 0));
  SDPA_EXPECT(widths && a.N % a.Nkv == 0, "q " + Describe(q) + ", k " + Describe(k) + " do not split into " +
                                              std::to_string(heads) + " / " + std::to_string(kv_heads) + " heads");
  int64_t Hq = 0, Lv = 0;
  a.q = HeadsView(q.data(), rank, q.shape(1), q.shape(2), rank == 4 ? q.shape(3) : 0, a.N, &a.S, &Hq);
  a.k = HeadsView(k.data(), kr, k.shape(1), k.shape(2), kr == 4 ? k.shape(3) : 0, a.Nkv, &a.L, &a.H);
  a.v = HeadsView(v.data(), kr, v.shape(1), v.shape(2), kr == 4 ? v.shape(3) : 0, a.Nkv, &Lv, &a.Hv);
  SDPA_EXPECT(k.shape(0) == a.B && v.shape(0) == a.B && Hq == a.H && Lv == a.L,
              "shapes do not attend: q " + Describe(q) + ", k " + Describe(k) + ", v " + Describe(v));
}

// MultiHeadAttention's bias [Dq + Dk + Dv]: Q's, then K's and V's (added to rank-3 K/V only), widened into `qb`.
void SetBias(SdpaArgs& a, const py::object& qkv_bias, bool kv_rows, std::vector<float>& qb) {
  if (qkv_bias.is_none()) return;
  const py::array bias = qkv_bias.cast<py::array>();
  ExpectData(bias, "qkv_bias", a.fp16);
  SDPA_EXPECT(bias.ndim() == 1 && bias.shape(0) >= a.N * a.H + (kv_rows ? a.Nkv * (a.H + a.Hv) : 0),
              "qkv_bias " + Describe(bias) + " is shorter than Q's, K's and V's widths");
  qb.resize(bias.shape(0));
  LoadRow(bias.data(), 0, a.fp16, bias.shape(0), nullptr, qb.data());
  a.q.bias = qb.data();
  if (kv_rows) a.k.bias = qb.data() + a.N * a.H, a.v.bias = qb.data() + a.N * a.H + a.Nkv * a.H;
}

// past_k/past_v [B, Nkv, P, H] each, or past_k [2, B, N, P, H] (key then value) with past_v None.
void SetPast(SdpaArgs& a, const py::object& past_k, const py::object& past_v) {
  if (past_k.is_none()) return;
  const py::array pk = past_k.cast<py::array>();
  ExpectData(pk, "past_k", a.fp16);
  const bool stacked = pk.ndim() == 5 && past_v.is_none();
  const int o = stacked ? 1 : 0;
  SDPA_EXPECT((pk.ndim() == 4 || stacked) && (!stacked || (pk.shape(0) == 2 && a.H == a.Hv)) && pk.shape(o) == a.B &&
                  pk.shape(o + 1) == a.Nkv && pk.shape(o + 3) == a.H,
              "past_k " + Describe(pk) + " is not [B, Nkv, P, H] (or [2, B, N, P, H] without past_v)");
  a.P = pk.shape(o + 2);
  a.past_k = pk.data();
  if (stacked) {
    a.past_v = static_cast<const char*>(pk.data()) + a.B * a.Nkv * a.P * a.H * pk.itemsize();
    return;
  }
  SDPA_EXPECT(!past_v.is_none(), "past_k needs past_v");
  const py::array pv = past_v.cast<py::array>();
  ExpectData(pv, "past_v", a.fp16);
  SDPA_EXPECT(pv.ndim() == 4 && pv.shape(0) == a.B && pv.shape(1) == a.Nkv && pv.shape(2) == a.P && pv.shape(3) == a.Hv,
              "past_v " + Describe(pv) + " does not match past_k " + Describe(pk));
  a.past_v = pv.data();
}

// The result: `out` (ORT's buffer) when given, else a new array; [B, S, N*Hv] for a rank-3 q, else [B, N, S, Hv].
py::array SetOutput(SdpaArgs& a, const py::dtype& dtype, int rank, const py::object& out) {
  const std::vector<py::ssize_t> shape =
      rank == 3 ? std::vector<py::ssize_t>{a.B, a.S, a.N * a.Hv} : std::vector<py::ssize_t>{a.B, a.N, a.S, a.Hv};
  py::array y = out.is_none() ? NewLike(dtype, shape) : out.cast<py::array>();
  SDPA_EXPECT(
      IsFloat(y, a.fp16) && (y.flags() & py::array::c_style) && y.writeable() && y.size() == a.B * a.S * a.N * a.Hv,
      "out " + Describe(y) + " cannot hold the result");
  a.out = y.mutable_data();
  if (rank == 3)
    a.ob = a.S * a.N * a.Hv, a.on = a.Hv, a.os = a.N * a.Hv;
  else
    a.ob = a.N * a.S * a.Hv, a.on = a.S * a.Hv, a.os = a.Hv;
  return y;
}

py::tuple SdpaPy(const py::array& q, const py::object& k, const py::object& v, const py::object& past_k,
                 const py::object& past_v, int64_t heads, int64_t kv_heads, float scale, float softcap,
                 const py::object& mask, int mask_kind, const py::object& attention_bias, int causal, float fill,
                 const py::object& qkv_bias, int present, int qk_mode, const py::object& out,
                 const py::object& projection, int threads) {
  SdpaArgs a;
  std::vector<float> qkv, qb;
  SetOperands(a, q, k, v, heads, kv_heads, projection, threads, qkv);
  SetBias(a, qkv_bias, !k.is_none() && k.cast<py::array>().ndim() == 3, qb);
  SetPast(a, past_k, past_v);
  SetMask(a, mask, mask_kind);
  if (!attention_bias.is_none()) {
    const py::array ab = attention_bias.cast<py::array>();
    SDPA_EXPECT(ab.dtype().kind() == 'f' && (ab.itemsize() == 2 || ab.itemsize() == 4),
                "attention_bias must be float16 or float32, got " + Describe(ab));
    const int64_t full[4] = {a.B, a.N, a.S, a.P + a.L};
    a.bias = Broadcast(ab, "attention_bias", full, false);
    a.bias_half = ab.itemsize() == 2;
    a.attn_bias = ab.data();
  }
  SDPA_EXPECT(causal >= 0 && causal <= 3, "causal must be 0..3");
  a.causal = static_cast<CausalKind>(causal);
  a.scale = scale, a.softcap = softcap, a.fill = fill, a.threads = threads;
  const py::dtype dtype = q.dtype();
  py::array y = SetOutput(a, dtype, static_cast<int>(q.ndim()), out);
  py::object pk = py::none(), pv = py::none();
  const int64_t T = a.P + a.L;
  SDPA_EXPECT(present >= 0 && present <= 2 && (present != 2 || a.H == a.Hv), "present must be 0, 1 or 2 (stacked)");
  if (present == 1) {
    pk = NewLike(dtype, {a.B, a.Nkv, T, a.H}), pv = NewLike(dtype, {a.B, a.Nkv, T, a.Hv});
    a.present_k = pk.cast<py::array>().mutable_data(), a.present_v = pv.cast<py::array>().mutable_data();
  } else if (present == 2) {
    py::array both = NewLike(dtype, {2, a.B, a.Nkv, T, a.H});
    a.present_k = both.mutable_data();
    a.present_v = static_cast<char*>(a.present_k) + a.B * a.Nkv * T * a.H * both.itemsize();
    pk = both;
  }
  py::object qk = py::none();
  SDPA_EXPECT(qk_mode >= -1 && qk_mode <= 3, "qk_mode must be -1 (none) or 0..3");
  if (qk_mode >= 0) {
    py::array scores = NewLike(dtype, {a.B, a.N, a.S, T});
    a.qk = scores.mutable_data(), a.qk_mode = qk_mode;
    qk = scores;
  }
  {
    py::gil_scoped_release release;
    Sdpa(a);
  }
  return py::make_tuple(y, pk, pv, qk);
}

}  // namespace

void BindSdpa(py::module_& m) {
  m.def("sdpa", &SdpaPy, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("past_k"), py::arg("past_v"),
        py::arg("heads"), py::arg("kv_heads"), py::arg("scale"), py::arg("softcap"), py::arg("mask"),
        py::arg("mask_kind"), py::arg("attention_bias"), py::arg("causal"), py::arg("fill"), py::arg("qkv_bias"),
        py::arg("present") = 0, py::arg("qk_mode") = -1, py::arg("out") = py::none(),
        py::arg("projection") = py::none(), py::arg("threads") = 1,
        "(y, present_k, present_v, qk): softmax(Q K^T * scale [softcap] + bias) V per (batch, head), float32 math over "
        "float32 or float16 q/k/v (rank 3 [B, S, heads * H] or rank 4 [B, heads, S, H]; query head n reads kv head "
        "n / (N / Nkv)); past_k/past_v [B, Nkv, P, H] prepended (or one [2, B, N, P, H] past_k); bias: the mask "
        "(mask_kind 1 bool, 2 float, 3 int32 key lengths [B], 4 int32 ends/starts [2B], 5/6 int32 [B, T] or "
        "[B, S, T] kept where > 0 / != 0; masked keys add -inf (1) or fill), then causal (1 adds -inf, 2 sets "
        "float32's lowest, 3 adds fill to keys j > i + P), then + attention_bias; qkv_bias: Q's, K's, V's bias "
        "(K's, V's for rank-3 k/v only); present 1: [B, Nkv, T, H] each, 2: one [2, B, N, T, H]; out: the result's "
        "buffer; projection (packed W, bias, Dq, Dk): q is x [B, S, Din] projected by the packed GEMM, k, v None. "
        "qk_mode 0..3: qk [B, N, S, T] holds the scaled scores, after softcap, after the bias (-inf as float32's "
        "lowest) or the softmax (ONNX Attention's qk_matmul_output). A row whose every score is -inf gives zeros; "
        "the reference's values within float tolerance");
}

}  // namespace npu_ep::kern
