// GroupQueryAttention's inner loops: scores (dot products, or broadcast FMAs over a transposed K), exp with the
// row sum, and P V divided by the sum; portable, AVX2 + FMA and AVX-512 versions (gqa_internal.h).
#include <algorithm>
#include <cmath>

#include "cpu.h"
#include "gqa_internal.h"

#include "intrinsics.h"

namespace npu_ep::kern::gqa {
namespace {

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

template <int R>
__attribute__((target("avx2,fma"))) void ScoresAvx2R(const float* q, const float* k, int64_t nk, int64_t h, float* sc,
                                                     int64_t ld) {
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
    UNROLL for (int r = 0; r < R; ++r) UNROLL for (int u = 0; u < kVec; ++u) acc[r][u] = _mm256_setzero_ps();
    for (int64_t i = 0; i < h; ++i) {
      const float* kr = kt + i * ldk + j0;
      __m256 kv[kVec];
      UNROLL for (int u = 0; u < kVec; ++u) kv[u] = _mm256_maskload_ps(kr + 8 * u, lanes[u]);
      UNROLL for (int r = 0; r < R; ++r) {
        const __m256 w = _mm256_broadcast_ss(q + r * h + i);
        UNROLL for (int u = 0; u < kVec; ++u) acc[r][u] = _mm256_fmadd_ps(w, kv[u], acc[r][u]);
      }
    }
    UNROLL for (int r = 0; r < R; ++r) UNROLL for (int u = 0; u < kVec; ++u)
        _mm256_maskstore_ps(sc + r * ld + j0 + 8 * u, lanes[u], acc[r][u]);
  }
}

void ScoresTAvx2(const float* q, int rows, const float* kt, int64_t ldk, int64_t nk, int64_t h, float* sc, int64_t ld) {
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
    const __m256 e =
        _mm256_and_ps(_mm256_castsi256_ps(lanes), ExpAvx2(_mm256_sub_ps(_mm256_maskload_ps(x + j, lanes), mv)));
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
    UNROLL for (int r = 0; r < R; ++r) UNROLL for (int u = 0; u < kVec; ++u) acc[r][u] = _mm256_setzero_ps();
    for (int64_t j = 0; j < nk; ++j) {
      const float* vj = v + j * h + c;
      __m256 vv[kVec];
      UNROLL for (int u = 0; u < kVec; ++u) vv[u] = _mm256_maskload_ps(vj + 8 * u, lanes[u]);
      UNROLL for (int r = 0; r < R; ++r) {
        const __m256 w = _mm256_broadcast_ss(p + r * ld + j);
        UNROLL for (int u = 0; u < kVec; ++u) acc[r][u] = _mm256_fmadd_ps(w, vv[u], acc[r][u]);
      }
    }
    UNROLL for (int r = 0; r < R; ++r) UNROLL for (int u = 0; u < kVec; ++u)
        _mm256_maskstore_ps(out[r] + c + 8 * u, lanes[u], _mm256_div_ps(acc[r][u], _mm256_set1_ps(div[r])));
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
      UNROLL for (int r = 0; r < R; ++r) acc[r] =
          _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q + r * h + hv), kv, acc[r]);
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
    UNROLL for (int r = 0; r < R; ++r) UNROLL for (int u = 0; u < kVec; ++u) acc[r][u] = _mm512_setzero_ps();
    for (int64_t i = 0; i < h; ++i) {
      const float* kr = kt + i * ldk + j0;
      __m512 kv[kVec];
      UNROLL for (int u = 0; u < kVec; ++u) kv[u] = _mm512_maskz_loadu_ps(lanes[u], kr + 16 * u);
      UNROLL for (int r = 0; r < R; ++r) {
        const __m512 w = _mm512_set1_ps(q[r * h + i]);
        UNROLL for (int u = 0; u < kVec; ++u) acc[r][u] = _mm512_fmadd_ps(w, kv[u], acc[r][u]);
      }
    }
    UNROLL for (int r = 0; r < R; ++r) UNROLL for (int u = 0; u < kVec; ++u)
        _mm512_mask_storeu_ps(sc + r * ld + j0 + 16 * u, lanes[u], acc[r][u]);
  }
}

void ScoresT512(const float* q, int rows, const float* kt, int64_t ldk, int64_t nk, int64_t h, float* sc, int64_t ld) {
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
    const __m512 e = ExpAvx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, x + j), mv));
    _mm512_mask_storeu_ps(x + j, lanes, e);
    sum = _mm512_mask_add_ps(sum, lanes, sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

template <int R, int kVec>  // kVec x 16 channels x R rows of accumulators
__attribute__((target(NPU_GQA_AVX512))) void Pv512R(const float* p, int64_t ld, const float* v, int64_t nk, int64_t h,
                                                    const float* div, float* const* out) {
  for (int64_t c = 0; c < h; c += 16 * kVec) {
    __mmask16 lanes[kVec];
    UNROLL for (int u = 0; u < kVec; ++u) lanes[u] = Lanes512(h - c - 16 * u);
    __m512 acc[R][kVec];
    UNROLL for (int r = 0; r < R; ++r) UNROLL for (int u = 0; u < kVec; ++u) acc[r][u] = _mm512_setzero_ps();
    for (int64_t j = 0; j < nk; ++j) {
      const float* vj = v + j * h + c;
      __m512 vv[kVec];
      UNROLL for (int u = 0; u < kVec; ++u) vv[u] = _mm512_maskz_loadu_ps(lanes[u], vj + 16 * u);
      UNROLL for (int r = 0; r < R; ++r) {
        const __m512 w = _mm512_set1_ps(p[r * ld + j]);
        UNROLL for (int u = 0; u < kVec; ++u) acc[r][u] = _mm512_fmadd_ps(w, vv[u], acc[r][u]);
      }
    }
    UNROLL for (int r = 0; r < R; ++r) UNROLL for (int u = 0; u < kVec; ++u)
        _mm512_mask_storeu_ps(out[r] + c + 16 * u, lanes[u], _mm512_div_ps(acc[r][u], _mm512_set1_ps(div[r])));
  }
}

template <int kVec>
void Pv512V(const float* p, int rows, int64_t ld, const float* v, int64_t nk, int64_t h, const float* div,
            float* const* out) {
  switch (rows) {
    case 1: return Pv512R<1, kVec>(p, ld, v, nk, h, div, out);
    case 2: return Pv512R<2, kVec>(p, ld, v, nk, h, div, out);
    case 3: return Pv512R<3, kVec>(p, ld, v, nk, h, div, out);
    default: return Pv512R<4, kVec>(p, ld, v, nk, h, div, out);
  }
}

// Heads of up to 32 channels take two vectors per row (four would multiply-add masked-off lanes half the time).
// Each channel's sum is the same sequence of FMAs either way.
void Pv512(const float* p, int rows, int64_t ld, const float* v, int64_t nk, int64_t h, const float* div,
           float* const* out) {
  return h <= 32 ? Pv512V<2>(p, rows, ld, v, nk, h, div, out) : Pv512V<4>(p, rows, ld, v, nk, h, div, out);
}
#endif  // NPU_EP_X86

}  // namespace

Ops SelectOps() {
#if NPU_EP_X86
  const Isa isa = ActiveIsa();
  if (isa >= Isa::kAvx512) return {Scores512, ScoresT512, ExpSum512, Pv512};
  if (isa >= Isa::kAvx2) return {ScoresAvx2, ScoresTAvx2, ExpSumAvx2, PvAvx2};
#endif
  return {ScoresScalar, ScoresTScalar, ExpSumScalar, PvScalar};
}

}  // namespace npu_ep::kern::gqa
