// GroupQueryAttention, float32 (see gqa.h). One task per (batch, kv head) writes that head's present rows (past
// prefix, rotated new K and new V, zeroed stale tail) and then attends its G query heads token by token:
// up to kRows heads of one token share one pass over K (scores) and one over V (P V), since they see the same
// keys [lo, hi). Only visible keys are read, so there is no mask. The softmax is the reference's: scores =
// (scale * q) . k, softcap c * tanh(x / c), subtract the row max, exp, output = (P V) / sum.
#include "gqa.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu.h"
#include "thread_pool.h"

#if NPU_EP_X86
#include <immintrin.h>
// GCC 12 flags the deliberately undefined pass-through operand inside AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace npu_ep::kern {
namespace {

constexpr int kRows = 4;             // query rows per pass over K and V
constexpr int64_t kTransposeRows = 16;  // rows per task from which K is transposed once (costs T*H moves)

struct Ops {
  // sc[r * ld + j] = q[r * h ..] . k[j * h ..] for r < rows, j < nk
  void (*scores)(const float* q, int rows, const float* k, int64_t nk, int64_t h, float* sc, int64_t ld);
  // the same from K transposed: kt[i * ldk + j] is key j's channel i
  void (*scores_t)(const float* q, int rows, const float* kt, int64_t ldk, int64_t nk, int64_t h, float* sc,
                   int64_t ld);
  // x[j] = exp(x[j] - m) for j < n; returns their sum
  float (*exp_sum)(float* x, int64_t n, float m);
  // out[r][i] = (sum_j p[r * ld + j] * v[j * h + i]) / div[r]
  void (*pv)(const float* p, int rows, int64_t ld, const float* v, int64_t nk, int64_t h, const float* div,
             float* const* out);
};

// ---- portable path ----

void ScoresScalar(const float* q, int rows, const float* k, int64_t nk, int64_t h, float* sc, int64_t ld) {
  for (int64_t j = 0; j < nk; ++j) {
    const float* kj = k + j * h;
    for (int r = 0; r < rows; ++r) {
      const float* qr = q + r * h;
      float acc = 0.0f;
      for (int64_t i = 0; i < h; ++i) acc += qr[i] * kj[i];
      sc[r * ld + j] = acc;
    }
  }
}

float ExpSumScalar(float* x, int64_t n, float m) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum += (x[j] = std::exp(x[j] - m));
  return sum;
}

void ScoresTScalar(const float* q, int rows, const float* kt, int64_t ldk, int64_t nk, int64_t h, float* sc,
                   int64_t ld) {
  for (int r = 0; r < rows; ++r) {
    float* row = sc + r * ld;
    std::fill(row, row + nk, 0.0f);
    for (int64_t i = 0; i < h; ++i) {
      const float w = q[r * h + i];
      const float* kr = kt + i * ldk;
      for (int64_t j = 0; j < nk; ++j) row[j] += w * kr[j];
    }
  }
}

void PvScalar(const float* p, int rows, int64_t ld, const float* v, int64_t nk, int64_t h, const float* div,
              float* const* out) {
  for (int r = 0; r < rows; ++r) {
    float* o = out[r];
    std::fill(o, o + h, 0.0f);
    for (int64_t j = 0; j < nk; ++j) {
      const float w = p[r * ld + j];
      const float* vj = v + j * h;
      for (int64_t i = 0; i < h; ++i) o[i] += w * vj[i];
    }
    for (int64_t i = 0; i < h; ++i) o[i] /= div[r];
  }
}

#if NPU_EP_X86
#define NPU_GQA_AVX512 "avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"
// Register blocking needs the row/vector loops fully unrolled (else GCC keeps the accumulators on the stack).
#define UNROLL _Pragma("GCC unroll 16")

// ---- AVX2 + FMA ----

__attribute__((target("avx2,fma"))) inline __m256i LanesAvx2(int64_t n) {  // first min(n, 8) lanes set
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(n, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

__attribute__((target("avx2,fma"))) inline float HsumAvx2(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// Cephes expf: 2^n * p(r), n = round(x log2 e), |r| <= ln2 / 2; below -87.3 (2^n would be subnormal) gives 0.
__attribute__((target("avx2,fma"))) inline __m256 ExpAvx2(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3365f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(lo, x));  // NaN passes through (second operand)
  const __m256 fn = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(fn, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(fn, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fn), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

template <int R>
__attribute__((target("avx2,fma"))) void ScoresAvx2R(const float* q, const float* k, int64_t nk, int64_t h,
                                                     float* sc, int64_t ld) {
  const int64_t hv = h / 8 * 8;
  const __m256i tail = LanesAvx2(h - hv);
  for (int64_t j = 0; j < nk; ++j) {
    const float* kj = k + j * h;
    __m256 acc[R];
    UNROLL for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < hv; i += 8) {
      const __m256 kv = _mm256_loadu_ps(kj + i);
      UNROLL for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * h + i), kv, acc[r]);
    }
    if (hv < h) {
      const __m256 kv = _mm256_maskload_ps(kj + hv, tail);
      UNROLL for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_maskload_ps(q + r * h + hv, tail), kv, acc[r]);
    }
    UNROLL for (int r = 0; r < R; ++r) sc[r * ld + j] = HsumAvx2(acc[r]);
  }
}

void ScoresAvx2(const float* q, int rows, const float* k, int64_t nk, int64_t h, float* sc, int64_t ld) {
  switch (rows) {
    case 1: return ScoresAvx2R<1>(q, k, nk, h, sc, ld);
    case 2: return ScoresAvx2R<2>(q, k, nk, h, sc, ld);
    case 3: return ScoresAvx2R<3>(q, k, nk, h, sc, ld);
    default: return ScoresAvx2R<4>(q, k, nk, h, sc, ld);
  }
}

template <int R>
__attribute__((target("avx2,fma"))) void ScoresTAvx2R(const float* q, const float* kt, int64_t ldk, int64_t nk,
                                                      int64_t h, float* sc, int64_t ld) {
  constexpr int kVec = 3;  // 24 keys x R rows of accumulators
  for (int64_t j0 = 0; j0 < nk; j0 += 8 * kVec) {
    __m256i lanes[kVec];
    UNROLL for (int u = 0; u < kVec; ++u) lanes[u] = LanesAvx2(std::max<int64_t>(0, nk - j0 - 8 * u));
    __m256 acc[R][kVec];
    UNROLL for (int r = 0; r < R; ++r)
      UNROLL for (int u = 0; u < kVec; ++u) acc[r][u] = _mm256_setzero_ps();
    for (int64_t i = 0; i < h; ++i) {
      const float* kr = kt + i * ldk + j0;
      __m256 kv[kVec];
      UNROLL for (int u = 0; u < kVec; ++u) kv[u] = _mm256_maskload_ps(kr + 8 * u, lanes[u]);
      UNROLL for (int r = 0; r < R; ++r) {
        const __m256 w = _mm256_broadcast_ss(q + r * h + i);
        UNROLL for (int u = 0; u < kVec; ++u) acc[r][u] = _mm256_fmadd_ps(w, kv[u], acc[r][u]);
      }
    }
    UNROLL for (int r = 0; r < R; ++r)
      UNROLL for (int u = 0; u < kVec; ++u) _mm256_maskstore_ps(sc + r * ld + j0 + 8 * u, lanes[u], acc[r][u]);
  }
}

void ScoresTAvx2(const float* q, int rows, const float* kt, int64_t ldk, int64_t nk, int64_t h, float* sc,
                 int64_t ld) {
  switch (rows) {
    case 1: return ScoresTAvx2R<1>(q, kt, ldk, nk, h, sc, ld);
    case 2: return ScoresTAvx2R<2>(q, kt, ldk, nk, h, sc, ld);
    case 3: return ScoresTAvx2R<3>(q, kt, ldk, nk, h, sc, ld);
    default: return ScoresTAvx2R<4>(q, kt, ldk, nk, h, sc, ld);
  }
}

__attribute__((target("avx2,fma"))) float ExpSumAvx2(float* x, int64_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = ExpAvx2(_mm256_sub_ps(_mm256_loadu_ps(x + j), mv));
    _mm256_storeu_ps(x + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (j < n) {
    const __m256i lanes = LanesAvx2(n - j);
    const __m256 e = _mm256_and_ps(_mm256_castsi256_ps(lanes),
                                   ExpAvx2(_mm256_sub_ps(_mm256_maskload_ps(x + j, lanes), mv)));
    _mm256_maskstore_ps(x + j, lanes, e);
    sum = _mm256_add_ps(sum, e);
  }
  return HsumAvx2(sum);
}

template <int R>
__attribute__((target("avx2,fma"))) void PvAvx2R(const float* p, int64_t ld, const float* v, int64_t nk, int64_t h,
                                                 const float* div, float* const* out) {
  constexpr int kVec = 3;  // 3 x 8 channels x R rows of accumulators stay in the 16 ymm registers
  for (int64_t c = 0; c < h; c += 8 * kVec) {
    __m256i lanes[kVec];
    UNROLL for (int u = 0; u < kVec; ++u) lanes[u] = LanesAvx2(std::max<int64_t>(0, h - c - 8 * u));
    __m256 acc[R][kVec];
    UNROLL for (int r = 0; r < R; ++r)
      UNROLL for (int u = 0; u < kVec; ++u) acc[r][u] = _mm256_setzero_ps();
    for (int64_t j = 0; j < nk; ++j) {
      const float* vj = v + j * h + c;
      __m256 vv[kVec];
      UNROLL for (int u = 0; u < kVec; ++u) vv[u] = _mm256_maskload_ps(vj + 8 * u, lanes[u]);
      UNROLL for (int r = 0; r < R; ++r) {
        const __m256 w = _mm256_broadcast_ss(p + r * ld + j);
        UNROLL for (int u = 0; u < kVec; ++u) acc[r][u] = _mm256_fmadd_ps(w, vv[u], acc[r][u]);
      }
    }
    UNROLL for (int r = 0; r < R; ++r)
      UNROLL for (int u = 0; u < kVec; ++u) _mm256_maskstore_ps(out[r] + c + 8 * u, lanes[u], _mm256_div_ps(acc[r][u], _mm256_set1_ps(div[r])));
  }
}

void PvAvx2(const float* p, int rows, int64_t ld, const float* v, int64_t nk, int64_t h, const float* div,
            float* const* out) {
  switch (rows) {
    case 1: return PvAvx2R<1>(p, ld, v, nk, h, div, out);
    case 2: return PvAvx2R<2>(p, ld, v, nk, h, div, out);
    case 3: return PvAvx2R<3>(p, ld, v, nk, h, div, out);
    default: return PvAvx2R<4>(p, ld, v, nk, h, div, out);
  }
}

// ---- AVX-512 ----

__attribute__((target(NPU_GQA_AVX512))) inline __mmask16 Lanes512(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1);
}

// Cephes expf with scalef for 2^n (subnormal results and underflow to 0 come out right).
__attribute__((target(NPU_GQA_AVX512))) inline __m512 Exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));  // NaN passes through
  const __m512 fn = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, fn);
}

template <int R>
__attribute__((target(NPU_GQA_AVX512))) void Scores512R(const float* q, const float* k, int64_t nk, int64_t h,
                                                        float* sc, int64_t ld) {
  const int64_t hv = h / 16 * 16;
  const __mmask16 tail = Lanes512(h - hv);
  for (int64_t j = 0; j < nk; ++j) {
    const float* kj = k + j * h;
    __m512 acc[R];
    UNROLL for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < hv; i += 16) {
      const __m512 kv = _mm512_loadu_ps(kj + i);
      UNROLL for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(q + r * h + i), kv, acc[r]);
    }
    if (tail) {
      const __m512 kv = _mm512_maskz_loadu_ps(tail, kj + hv);
      UNROLL for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q + r * h + hv), kv, acc[r]);
    }
    UNROLL for (int r = 0; r < R; ++r) sc[r * ld + j] = _mm512_reduce_add_ps(acc[r]);
  }
}

void Scores512(const float* q, int rows, const float* k, int64_t nk, int64_t h, float* sc, int64_t ld) {
  switch (rows) {
    case 1: return Scores512R<1>(q, k, nk, h, sc, ld);
    case 2: return Scores512R<2>(q, k, nk, h, sc, ld);
    case 3: return Scores512R<3>(q, k, nk, h, sc, ld);
    default: return Scores512R<4>(q, k, nk, h, sc, ld);
  }
}

template <int R>
__attribute__((target(NPU_GQA_AVX512))) void ScoresT512R(const float* q, const float* kt, int64_t ldk, int64_t nk,
                                                         int64_t h, float* sc, int64_t ld) {
  constexpr int kVec = 4;  // 64 keys x R rows of accumulators
  for (int64_t j0 = 0; j0 < nk; j0 += 16 * kVec) {
    __mmask16 lanes[kVec];
    UNROLL for (int u = 0; u < kVec; ++u) lanes[u] = Lanes512(nk - j0 - 16 * u);
    __m512 acc[R][kVec];
    UNROLL for (int r = 0; r < R; ++r)
      UNROLL for (int u = 0; u < kVec; ++u) acc[r][u] = _mm512_setzero_ps();
    for (int64_t i = 0; i < h; ++i) {
      const float* kr = kt + i * ldk + j0;
      __m512 kv[kVec];
      UNROLL for (int u = 0; u < kVec; ++u) kv[u] = _mm512_maskz_loadu_ps(lanes[u], kr + 16 * u);
      UNROLL for (int r = 0; r < R; ++r) {
        const __m512 w = _mm512_set1_ps(q[r * h + i]);
        UNROLL for (int u = 0; u < kVec; ++u) acc[r][u] = _mm512_fmadd_ps(w, kv[u], acc[r][u]);
      }
    }
    UNROLL for (int r = 0; r < R; ++r)
      UNROLL for (int u = 0; u < kVec; ++u) _mm512_mask_storeu_ps(sc + r * ld + j0 + 16 * u, lanes[u], acc[r][u]);
  }
}

void ScoresT512(const float* q, int rows, const float* kt, int64_t ldk, int64_t nk, int64_t h, float* sc,
                int64_t ld) {
  switch (rows) {
    case 1: return ScoresT512R<1>(q, kt, ldk, nk, h, sc, ld);
    case 2: return ScoresT512R<2>(q, kt, ldk, nk, h, sc, ld);
    case 3: return ScoresT512R<3>(q, kt, ldk, nk, h, sc, ld);
    default: return ScoresT512R<4>(q, kt, ldk, nk, h, sc, ld);
  }
}

__attribute__((target(NPU_GQA_AVX512))) float ExpSum512(float* x, int64_t n, float m) {
  const __m512 mv = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 lanes = Lanes512(n - j);
    const __m512 e = Exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, x + j), mv));
    _mm512_mask_storeu_ps(x + j, lanes, e);
    sum = _mm512_mask_add_ps(sum, lanes, sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

template <int R>
__attribute__((target(NPU_GQA_AVX512))) void Pv512R(const float* p, int64_t ld, const float* v, int64_t nk,
                                                    int64_t h, const float* div, float* const* out) {
  constexpr int kVec = 4;  // 64 channels x R rows of accumulators
  for (int64_t c = 0; c < h; c += 16 * kVec) {
    __mmask16 lanes[kVec];
    UNROLL for (int u = 0; u < kVec; ++u) lanes[u] = Lanes512(h - c - 16 * u);
    __m512 acc[R][kVec];
    UNROLL for (int r = 0; r < R; ++r)
      UNROLL for (int u = 0; u < kVec; ++u) acc[r][u] = _mm512_setzero_ps();
    for (int64_t j = 0; j < nk; ++j) {
      const float* vj = v + j * h + c;
      __m512 vv[kVec];
      UNROLL for (int u = 0; u < kVec; ++u) vv[u] = _mm512_maskz_loadu_ps(lanes[u], vj + 16 * u);
      UNROLL for (int r = 0; r < R; ++r) {
        const __m512 w = _mm512_set1_ps(p[r * ld + j]);
        UNROLL for (int u = 0; u < kVec; ++u) acc[r][u] = _mm512_fmadd_ps(w, vv[u], acc[r][u]);
      }
    }
    UNROLL for (int r = 0; r < R; ++r)
      UNROLL for (int u = 0; u < kVec; ++u) _mm512_mask_storeu_ps(out[r] + c + 16 * u, lanes[u], _mm512_div_ps(acc[r][u], _mm512_set1_ps(div[r])));
  }
}

void Pv512(const float* p, int rows, int64_t ld, const float* v, int64_t nk, int64_t h, const float* div,
           float* const* out) {
  switch (rows) {
    case 1: return Pv512R<1>(p, ld, v, nk, h, div, out);
    case 2: return Pv512R<2>(p, ld, v, nk, h, div, out);
    case 3: return Pv512R<3>(p, ld, v, nk, h, div, out);
    default: return Pv512R<4>(p, ld, v, nk, h, div, out);
  }
}
#endif  // NPU_EP_X86

Ops SelectOps() {
#if NPU_EP_X86
  const Isa isa = ActiveIsa();
  if (isa >= Isa::kAvx512) return {Scores512, ScoresT512, ExpSum512, Pv512};
  if (isa >= Isa::kAvx2) return {ScoresAvx2, ScoresTAvx2, ExpSumAvx2, PvAvx2};
#endif
  return {ScoresScalar, ScoresTScalar, ExpSumScalar, PvScalar};
}

// Rotary as the reference computes it (x0 c + x1 (-s), x1 c + x0 s; two roundings, no fused multiply-add) on the
// first 2 * half channels; the rest is copied. y may alias x.
void Rotate(const float* x, float* y, const float* c, const float* sn, int64_t half, int64_t h, bool interleaved) {
  for (int64_t i = 0; i < half; ++i) {
    const int64_t i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
    const float x0 = x[i0], x1 = x[i1];
    const float a0 = x0 * c[i], b0 = x1 * -sn[i];
    const float a1 = x1 * c[i], b1 = x0 * sn[i];
    y[i0] = a0 + b0;
    y[i1] = a1 + b1;
  }
  if (y != x) std::memcpy(y + 2 * half, x + 2 * half, sizeof(float) * (h - 2 * half));
}

int64_t Position(const GqaArgs& a, int64_t b, int64_t s) {
  return a.position_ids ? a.position_ids[b * a.S + s] : a.past_len[b] + s;
}

// ---- float16 rows (stored as IEEE binary16 bits; math is float32, as the reference's) ----

using Half = uint16_t;

float HalfToFloat(Half h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float32
    const float f = static_cast<float>(man) * (1.0f / 16777216.0f);
    return sign ? -f : f;
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

Half FloatToHalf(float f) {  // round to nearest, ties to even (numpy's astype, F16C's vcvtps2ph)
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return static_cast<Half>(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));  // Inf, NaN
  if (ax >= 0x477ff000u) return static_cast<Half>(sign | 0x7c00);  // >= 65520 rounds to Inf
  if (ax < 0x38800000u) {  // below 2^-14: a subnormal half, |f| * 2^24 rounded to an integer (exact scaling)
    return static_cast<Half>(sign | static_cast<uint32_t>(RoundHalfEven(std::fabs(f) * 16777216.0f)));
  }
  const uint32_t r = ax - 0x38000000u + 0x0fff + ((ax >> 13) & 1);  // rebias, round the 13 dropped bits
  return static_cast<Half>(sign | (r >> 13));
}

#if NPU_EP_X86
bool HasF16c() {
  static const bool yes = __builtin_cpu_supports("f16c");
  return yes;
}

__attribute__((target("avx2,f16c"))) void HalfRowF16c(const Half* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) d[i] = HalfToFloat(s[i]);
}

__attribute__((target("avx2,f16c"))) void FloatRowF16c(const float* s, Half* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) d[i] = FloatToHalf(s[i]);
}
#endif

void ToFloat(const float* s, float* d, int64_t n) { std::memcpy(d, s, sizeof(float) * n); }
void ToFloat(const Half* s, float* d, int64_t n) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx2 && HasF16c()) return HalfRowF16c(s, d, n);
#endif
  for (int64_t i = 0; i < n; ++i) d[i] = HalfToFloat(s[i]);
}
void FromFloat(const float* s, float* d, int64_t n) { std::memcpy(d, s, sizeof(float) * n); }
void FromFloat(const float* s, Half* d, int64_t n) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx2 && HasF16c()) return FloatRowF16c(s, d, n);
#endif
  for (int64_t i = 0; i < n; ++i) d[i] = FloatToHalf(s[i]);
}

// The visible keys [lo, hi) of the query at token s of batch b (hi <= lo: none).
struct KeyRange {
  int64_t lo, hi;
};
KeyRange Visible(const GqaArgs& a, int64_t b, int64_t s) {
  const int64_t pos = a.past_len[b] + s;  // the query's own key
  return {a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0, std::min<int64_t>(pos + 1, a.total_len[b])};
}

// Attention of kv head kh's query heads in batch b against its present rows pk/pv. Rows are (token, head) pairs
// in token-major order, taken kRows at a time: the heads of one token, or several tokens when G < kRows. A group
// scores the union of its rows' key ranges; keys outside a row's own range get probability 0. With many rows
// (prefill), K is transposed once per task so scores are broadcast FMAs over keys instead of reduced dot products.
// float16 presents are widened once per task (the reference attends the rounded present rows too).
template <typename T>
void Attend(const GqaArgs& a, const Ops& ops, int64_t b, int64_t kh, const T* pk, const T* pv) {
  const int64_t H = a.H, S = a.S, G = a.N / a.Nkv, rows_total = G * S;
  const bool transposed = rows_total >= kTransposeRows;
  const float scale = a.scale;
  thread_local std::vector<float> qbuf, sc, kt, kf, vf, obuf;
  const KeyRange first = Visible(a, b, 0), last = Visible(a, b, S - 1);
  const int64_t t0 = std::min(first.lo, last.lo), t1 = std::max<int64_t>(t0, std::max(first.hi, last.hi));
  const int64_t ld = std::max<int64_t>((t1 - t0 + 15) / 16 * 16, 16);  // score row / transposed K row length
  qbuf.resize(kRows * H);
  sc.resize(kRows * ld);
  const float* kbase;  // key t's float32 row at kbase + (t - t0) * H
  const float* vbase;
  if constexpr (std::is_same_v<T, float>) {
    kbase = pk + t0 * H;
    vbase = pv + t0 * H;
  } else {
    kf.resize((t1 - t0) * H);
    vf.resize((t1 - t0) * H);
    obuf.resize(kRows * H);
    ToFloat(pk + t0 * H, kf.data(), (t1 - t0) * H);
    ToFloat(pv + t0 * H, vf.data(), (t1 - t0) * H);
    kbase = kf.data();
    vbase = vf.data();
  }
  if (transposed) {
    kt.resize(H * ld);
    for (int64_t tb = 0; tb < t1 - t0; tb += 16) {  // 16 keys at a time: 64-byte runs on both sides
      const int64_t te = std::min(tb + 16, t1 - t0);
      for (int64_t i = 0; i < H; ++i)
        for (int64_t t = tb; t < te; ++t) kt[i * ld + t] = kbase[t * H + i];
    }
  }
  float sums[kRows];
  KeyRange range[kRows];
  float* orow[kRows];
  T* dst[kRows];
  for (int64_t r0 = 0; r0 < rows_total; r0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, rows_total - r0));
    int64_t lo = t1, hi = t0;
    for (int r = 0; r < rows; ++r) {
      const int64_t s = (r0 + r) / G, n = kh * G + (r0 + r) % G;
      range[r] = Visible(a, b, s);
      if (range[r].hi > range[r].lo) lo = std::min(lo, range[r].lo), hi = std::max(hi, range[r].hi);
      dst[r] = static_cast<T*>(a.out) + ((b * S + s) * a.N + n) * H;
      if constexpr (std::is_same_v<T, float>)
        orow[r] = dst[r];
      else
        orow[r] = obuf.data() + r * H;
      float* qr = qbuf.data() + r * H;
      ToFloat(static_cast<const T*>(a.q) + (b * S + s) * a.q_tok + n * H, qr, H);
      if (a.cos) {
        const int64_t p = Position(a, b, s);
        Rotate(qr, qr, a.cos + p * a.half, a.sin + p * a.half, a.half, H, a.interleaved);
      }
      for (int64_t i = 0; i < H; ++i) qr[i] *= scale;
    }
    const int64_t nk = std::max<int64_t>(hi - lo, 0);  // 0: no row of the group sees a key
    if (nk > 0) {
      if (transposed)
        ops.scores_t(qbuf.data(), rows, kt.data() + (lo - t0), ld, nk, H, sc.data(), ld);
      else
        ops.scores(qbuf.data(), rows, kbase + (lo - t0) * H, nk, H, sc.data(), ld);
    }
    for (int r = 0; r < rows; ++r) {
      float* row = sc.data() + r * ld;
      const int64_t j0 = range[r].lo - lo, j1 = range[r].hi - lo;
      if (j1 <= j0) {  // no visible key: the reference's softmax over all -inf gives NaN
        std::fill(row, row + nk, 0.0f);
        sums[r] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      if (a.softcap > 0.0f)
        for (int64_t j = j0; j < j1; ++j) row[j] = std::tanh(row[j] / a.softcap) * a.softcap;
      float m = row[j0];
      for (int64_t j = j0 + 1; j < j1; ++j) m = row[j] > m ? row[j] : m;
      sums[r] = ops.exp_sum(row + j0, j1 - j0, m);
      std::fill(row, row + j0, 0.0f);
      std::fill(row + j1, row + nk, 0.0f);
    }
    if (nk > 0)
      ops.pv(sc.data(), rows, ld, vbase + (lo - t0) * H, nk, H, sums, orow);
    else
      for (int r = 0; r < rows; ++r) std::fill(orow[r], orow[r] + H, std::numeric_limits<float>::quiet_NaN());
    if constexpr (!std::is_same_v<T, float>)
      for (int r = 0; r < rows; ++r) FromFloat(orow[r], dst[r], H);
  }
}

template <typename T>
void Task(const GqaArgs& a, const Ops& ops, int64_t b, int64_t kh) {
  const int64_t H = a.H, S = a.S, T_ = a.T;
  const int64_t pb = a.past_len[b];
  T* present = static_cast<T*>(a.present);
  T* pk = present + (b * a.Nkv + kh) * T_ * H;
  T* pv = present + ((a.B + b) * a.Nkv + kh) * T_ * H;
  const size_t row_bytes = sizeof(T) * H;
  if (pb > 0) {  // the valid past prefix
    if (a.past_k) {
      const int64_t src = (b * a.Nkv + kh) * a.P * H;
      const T* past_k = static_cast<const T*>(a.past_k) + src;
      const T* past_v = static_cast<const T*>(a.past_v) + src;
      if (past_k != pk) std::memcpy(pk, past_k, row_bytes * pb);
      if (past_v != pv) std::memcpy(pv, past_v, row_bytes * pb);
    } else {
      std::memset(pk, 0, row_bytes * pb);
      std::memset(pv, 0, row_bytes * pb);
    }
  }
  thread_local std::vector<float> krow;
  krow.resize(H);
  for (int64_t s = 0; s < S; ++s) {  // the new rows (K rotated in float32, then stored)
    const T* kin = static_cast<const T*>(a.k) + (b * S + s) * a.kv_tok + kh * H;
    T* kout = pk + (pb + s) * H;
    if (a.cos) {
      const int64_t pos = Position(a, b, s);
      ToFloat(kin, krow.data(), H);
      Rotate(krow.data(), krow.data(), a.cos + pos * a.half, a.sin + pos * a.half, a.half, H, a.interleaved);
      FromFloat(krow.data(), kout, H);
    } else {
      std::memcpy(kout, kin, row_bytes);
    }
    std::memcpy(pv + (pb + s) * H, static_cast<const T*>(a.v) + (b * S + s) * a.kv_tok + kh * H, row_bytes);
  }
  if (pb + S < a.dirty) {  // rows a previous use of the buffer left nonzero
    std::memset(pk + (pb + S) * H, 0, row_bytes * (a.dirty - pb - S));
    std::memset(pv + (pb + S) * H, 0, row_bytes * (a.dirty - pb - S));
  }
  Attend<T>(a, ops, b, kh, pk, pv);
}

}  // namespace

void GroupQueryAttention(const GqaArgs& a) {
  if (a.N <= 0 || a.Nkv <= 0 || a.N % a.Nkv || a.H <= 0)
    throw std::invalid_argument("GroupQueryAttention: num_heads " + std::to_string(a.N) +
                                " must be a positive multiple of kv_num_heads " + std::to_string(a.Nkv));
  if (a.cos && 2 * a.half > a.H)
    throw std::invalid_argument("GroupQueryAttention: cos/sin cache width " + std::to_string(a.half) +
                                " rotates more than the head size " + std::to_string(a.H));
  for (int64_t b = 0; b < a.B; ++b) {
    const int64_t pb = a.past_len[b];
    if (pb < 0 || pb + a.S > a.T || (a.past_k && pb > a.P))
      throw std::invalid_argument("GroupQueryAttention: batch " + std::to_string(b) + " writes rows [" +
                                  std::to_string(pb) + ", " + std::to_string(pb + a.S) +
                                  ") outside the present buffer of " + std::to_string(a.T));
    for (int64_t s = 0; a.cos && s < a.S; ++s) {
      const int64_t pos = Position(a, b, s);
      if (pos < 0 || pos >= a.max_pos)
        throw std::out_of_range("GroupQueryAttention: rotary position " + std::to_string(pos) + " (batch " +
                                std::to_string(b) + ", token " + std::to_string(s) +
                                ") outside the cos/sin cache [0, " + std::to_string(a.max_pos) + ")");
    }
  }
  const Ops ops = SelectOps();
  const auto task = a.fp16 ? Task<Half> : Task<float>;
  ParallelFor(a.threads, a.B * a.Nkv, [&](int64_t i) { task(a, ops, i / a.Nkv, i % a.Nkv); });
}

}  // namespace npu_ep::kern
