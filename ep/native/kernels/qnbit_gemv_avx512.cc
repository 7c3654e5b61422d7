// MatMulNBits decode (M = 1, and at level 4 M < 8) on AVX-512: one pass over the packed weights, nothing staged
// in memory.
//
// accuracy_level 4 (M < 8): sixteen columns and one or two rows of A per pass. Per chunk, two DPBUSDs per column
// and row give 16 lane sums (8 elements each); shuffles add them up into block sums with the columns in the lanes,
// and per block one zero-point term, convert, scale and FMA update all sixteen outputs: the block-exact order of
// the prefill kernel (qnbit_int8_panel_avx512.cc). Scales and zero points are transposed 16 blocks at a time. The
// last partial chunk is a masked load, so no tail copy is made.
// accuracy_level 0..3: the 16 possible weights of a block ((q - zp) * scale, rounded once) form a 16-entry table;
// a permute by the nibbles dequantizes 16 elements at once, and an FMA multiplies them with A in place.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "intrinsics.h"
#include "qnbit_gemm_internal.h"

#if NPU_EP_X86

namespace npu_ep::kern::nbits {
namespace {

constexpr int kCols = 16;  // columns per pass: one per lane of the accumulator

#define NPU_AVX512 "avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"


// Zero points of blocks [b0, b0 + 16) as 16 int32 (8 packed bytes, masked at the row's end).
__attribute__((target(NPU_AVX512))) inline __m512i ZeroPoints16(const uint8_t* zp_row, int64_t b0, int64_t kb) {
  const int64_t bytes = std::min<int64_t>(8, (kb - b0 + 1) / 2);
  const __m128i raw = _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << bytes) - 1), zp_row + b0 / 2);
  const __m128i m0f = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(raw, m0f), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m0f);
  return _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
}

#define NPU_INLINE __attribute__((target(NPU_AVX512), always_inline)) inline

// The 128-bit lanes of w[0..3] transposed: w[L] gets lane L of each, in order.
NPU_INLINE void Lanes4x4(__m512i w[4]) {
  const __m512i a0 = _mm512_shuffle_i32x4(w[0], w[1], 0x44), a1 = _mm512_shuffle_i32x4(w[0], w[1], 0xEE);
  const __m512i a2 = _mm512_shuffle_i32x4(w[2], w[3], 0x44), a3 = _mm512_shuffle_i32x4(w[2], w[3], 0xEE);
  w[0] = _mm512_shuffle_i32x4(a0, a2, 0x88);
  w[1] = _mm512_shuffle_i32x4(a0, a2, 0xDD);
  w[2] = _mm512_shuffle_i32x4(a1, a3, 0x88);
  w[3] = _mm512_shuffle_i32x4(a1, a3, 0xDD);
}

// Within every 128-bit lane: the sums of adjacent int32 pairs of x, then of y. Exact while the int32 values fit in
// int16 (|x| <= 16 elements * 15 * 128 = 30720 here): pack to int16, multiply-add pairs with 1.
NPU_INLINE __m512i PairSums(__m512i x, __m512i y) {
  return _mm512_madd_epi16(_mm512_packs_epi32(x, y), _mm512_set1_epi16(1));
}

// Picks (0x88: lanes 0, 2 of each source; 0xDD: lanes 1, 3) within every 128-bit lane, on int32 data.
template <int kImm>
NPU_INLINE __m512i Pick(__m512i x, __m512i y) {
  return _mm512_castps_si512(_mm512_shuffle_ps(_mm512_castsi512_ps(x), _mm512_castsi512_ps(y), kImm));
}

// d[0..3]: columns 4q..4q+3's 16 lane sums of one chunk (lane l: elements 8l..8l+7). Per 128-bit lane L (elements
// 32L..32L+31) -> u: the four columns' sums of all 32 elements (bs >= 32), or of the first 16 (bs = 16, with v
// taking the second 16).
NPU_INLINE void QuadSums(const __m512i d[4], int bs, __m512i& u, __m512i& v) {
  const __m512i x0 = PairSums(d[0], d[1]), x1 = PairSums(d[2], d[3]);  // per column: elements 0-15, 16-31
  if (bs == 16) {
    u = Pick<0x88>(x0, x1);
    v = Pick<0xDD>(x0, x1);
  } else {
    u = PairSums(x0, x1);
  }
}

// u[q], v[q] from QuadSums of the four column quads -> the chunk's sums per 16 elements (bs = 16: 8 vectors), 32
// (bs = 32: 4), 64 (2) or all 128 (1), each with column j in lane j, in k order.
NPU_INLINE int ColumnsToLanes(__m512i u[4], __m512i v[4], int bs, __m512i out[8]) {
  Lanes4x4(u);
  if (bs == 16) {
    Lanes4x4(v);
#pragma GCC unroll 4
    for (int l = 0; l < 4; ++l) out[2 * l] = u[l], out[2 * l + 1] = v[l];
    return 8;
  }
  if (bs == 32) {
#pragma GCC unroll 4
    for (int l = 0; l < 4; ++l) out[l] = u[l];
    return 4;
  }
  out[0] = _mm512_add_epi32(u[0], u[1]);
  out[1] = _mm512_add_epi32(u[2], u[3]);
  if (bs == 64) return 2;
  out[0] = _mm512_add_epi32(out[0], out[1]);
  return 1;
}

// kCols columns per pass (pointers repeat the last real column when fewer remain) for R rows of A, which share the
// loads and nibble splits of B and the transposed scales -> out[r][kCols]; the weights of the columns `ahead` further
// are prefetched into L2. HI_NIBBLES(bv) gives each byte's high nibble: one GF(2) affine op (a bit shift inside
// bytes) on GFNI hosts, shift+mask else. Each row's operations are those of R = 1.
#define NPU_GEMV_INT8_COLS(NAME, TARGET, DPBUSD, HI_NIBBLES)                                                          \
  template <int R>                                                                                                    \
  __attribute__((target(TARGET))) void NAME(const Shape& s, const GemvA* a, const uint8_t* const bp[kCols],           \
                                            const float* const sw[kCols], const uint8_t* const zp[kCols],             \
                                            int64_t ahead, float out[][kCols]) {                                      \
    const __m512i m0f = _mm512_set1_epi8(0x0F);                                                                       \
    const int64_t chunks_per_sup = s.bs / 8; /* 16 blocks = 16 * bs elements = bs / 8 chunks */                       \
    const int64_t rem = s.row_bytes % kChunkBytes;                                                                    \
    const __mmask64 tail = rem ? (~0ull >> (64 - rem)) : ~0ull;                                                       \
    const bool symmetric = zp[0] == nullptr;                                                                          \
    __m512 acc[R];                                                                                                    \
    __m512i open[R]; /* bs > 128: the sum of the block's chunks so far */                                             \
    _Pragma("GCC unroll 2") for (int r = 0; r < R; ++r) {                                                             \
      acc[r] = _mm512_setzero_ps();                                                                                   \
      open[r] = _mm512_setzero_si512();                                                                               \
    }                                                                                                                 \
    alignas(64) float swt[16][kCols];                                                                                 \
    alignas(64) int32_t zpt[16][kCols];                                                                               \
    for (int64_t b0 = 0; b0 < s.kb; b0 += 16) {                                                                       \
      const __mmask16 bmask = static_cast<__mmask16>((1u << std::min<int64_t>(16, s.kb - b0)) - 1);                   \
      __m512i t[16];                                                                                                  \
      _Pragma("GCC unroll 16") for (int j = 0; j < kCols; ++j) {                                                      \
        _mm_prefetch(reinterpret_cast<const char*>(sw[j] + ahead * s.kb + b0), _MM_HINT_T1);                          \
        t[j] = _mm512_castps_si512(_mm512_maskz_loadu_ps(bmask, sw[j] + b0));                                         \
      }                                                                                                               \
      Transpose16x16(t);                                                                                              \
      _Pragma("GCC unroll 16") for (int i = 0; i < 16; ++i) _mm512_store_si512(swt[i], t[i]);                         \
      if (!symmetric) {                                                                                               \
        _Pragma("GCC unroll 16") for (int j = 0; j < kCols; ++j) {                                                    \
          _mm_prefetch(reinterpret_cast<const char*>(zp[j] + ahead * s.zp_bytes + b0 / 2), _MM_HINT_T1);              \
          t[j] = ZeroPoints16(zp[j], b0, s.kb);                                                                       \
        }                                                                                                             \
        Transpose16x16(t);                                                                                            \
        _Pragma("GCC unroll 16") for (int i = 0; i < 16; ++i) _mm512_store_si512(zpt[i], t[i]);                       \
      }                                                                                                               \
      const int64_t c_begin = (b0 / 16) * chunks_per_sup;                                                             \
      const int64_t c_end = std::min(s.n_chunks, c_begin + chunks_per_sup);                                           \
      for (int64_t c = c_begin; c < c_end; ++c) {                                                                     \
        const __mmask64 bytes = c == s.n_chunks - 1 ? tail : ~0ull;                                                   \
        __m512i qlo[R], qhi[R];                                                                                       \
        _Pragma("GCC unroll 2") for (int r = 0; r < R; ++r) {                                                         \
          qlo[r] = _mm512_loadu_si512(a[r].q + c * kChunkElems);                                                      \
          qhi[r] = _mm512_loadu_si512(a[r].q + c * kChunkElems + kChunkBytes);                                        \
        }                                                                                                             \
        __m512i u[R][4], v[R][4];                                                                                     \
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; ++q) {                                                         \
          __m512i d[R][4];                                                                                            \
          _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) {                                                       \
            const uint8_t* col = bp[4 * q + i] + c * kChunkBytes;                                                     \
            _mm_prefetch(reinterpret_cast<const char*>(col + ahead * s.row_bytes), _MM_HINT_T1);                      \
            const __m512i bv = _mm512_maskz_loadu_epi8(bytes, col);                                                   \
            const __m512i lo = _mm512_and_si512(bv, m0f), hi = HI_NIBBLES(bv);                                        \
            _Pragma("GCC unroll 2") for (int r = 0; r < R; ++r)                                                       \
              d[r][i] = DPBUSD(DPBUSD(_mm512_setzero_si512(), lo, qlo[r]), hi, qhi[r]);                              \
          }                                                                                                           \
          _Pragma("GCC unroll 2") for (int r = 0; r < R; ++r) QuadSums(d[r], s.bs, u[r][q], v[r][q]);                 \
        }                                                                                                             \
        _Pragma("GCC unroll 2") for (int r = 0; r < R; ++r) {                                                         \
          __m512i sums[8];                                                                                            \
          const int n = ColumnsToLanes(u[r], v[r], s.bs, sums);                                                       \
          int64_t blk = (c * kChunkElems) >> s.bs_log2;                                                               \
          if (s.bs > kChunkElems) {                                                                                   \
            open[r] = _mm512_add_epi32(open[r], sums[0]);                                                             \
            if (((c + 1) * kChunkElems) % s.bs != 0) continue; /* the block goes on in the next chunk */              \
            sums[0] = open[r];                                                                                        \
            open[r] = _mm512_setzero_si512();                                                                         \
          }                                                                                                           \
          for (int i = 0; i < n && blk < s.kb; ++i, ++blk) {                                                          \
            const __m512i sum_a = _mm512_set1_epi32(a[r].block[blk]);                                                 \
            const __m512i dot = _mm512_sub_epi32(                                                                     \
                sums[i], symmetric ? _mm512_slli_epi32(sum_a, 3)                                                      \
                                   : _mm512_mullo_epi32(_mm512_load_si512(zpt[blk - b0]), sum_a));                    \
            const __m512 scale = _mm512_mul_ps(_mm512_load_ps(swt[blk - b0]), _mm512_set1_ps(a[r].scale[blk]));      \
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r]);                                         \
          }                                                                                                           \
        }                                                                                                             \
      }                                                                                                               \
    }                                                                                                                 \
    _Pragma("GCC unroll 2") for (int r = 0; r < R; ++r) _mm512_storeu_ps(out[r], acc[r]);                             \
  }

#define NPU_HI_SHIFT(bv) _mm512_and_si512(_mm512_srli_epi16(bv, 4), m0f)
#define NPU_HI_GFNI(bv) _mm512_gf2p8affine_epi64_epi8(bv, _mm512_set1_epi64(0x1020408000000000ll), 0)
NPU_GEMV_INT8_COLS(GemvInt8Cols, NPU_AVX512, DpbusdBw, NPU_HI_SHIFT)
NPU_GEMV_INT8_COLS(GemvInt8ColsVnni, NPU_AVX512 ",avx512vnni", DpbusdTied, NPU_HI_SHIFT)
NPU_GEMV_INT8_COLS(GemvInt8ColsVnniGfni, NPU_AVX512 ",avx512vnni,gfni", DpbusdTied, NPU_HI_GFNI)

// One column, level 0..3, bs >= 32 (a 16-byte group lies in one block). Accumulator k takes the groups at byte
// offset 16k of every chunk, low nibbles then high ones: the order of the dequantize-then-dot path.
__attribute__((target(NPU_AVX512))) float GemvFp32Col(const Shape& s, const float* a, const uint8_t* brow,
                                                       const float* sw, const uint8_t* zp_row) {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 iota8 = _mm512_sub_ps(iota, _mm512_set1_ps(8.0f));
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t c = 0; c < s.n_chunks; ++c) {
    const float* ac = a + c * kChunkElems;
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; ++k) {
      const int64_t g = c * kChunkBytes + 16 * k;
      __m512 wlo = _mm512_setzero_ps(), whi = wlo;
      if (g < s.row_bytes) {
        const int64_t blk = (2 * g) >> s.bs_log2;
        const __m512 zq = zp_row == nullptr
                              ? iota8
                              : _mm512_sub_ps(iota, _mm512_set1_ps(static_cast<float>(
                                                        (zp_row[blk >> 1] >> ((blk & 1) * 4)) & 0x0F)));
        const __m512 table = _mm512_mul_ps(zq, _mm512_set1_ps(sw[blk]));
        const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(brow + g)));
        wlo = _mm512_permutexvar_ps(x, table);  // only the index's low 4 bits count: the low nibble
        whi = _mm512_permutexvar_ps(_mm512_srli_epi32(x, 4), table);
      }
      acc[k] = _mm512_fmadd_ps(_mm512_loadu_ps(ac + 16 * k), wlo, acc[k]);
      acc[k] = _mm512_fmadd_ps(_mm512_loadu_ps(ac + kChunkBytes + 16 * k), whi, acc[k]);
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

// One row's codes are written in natural order; for the decode kernel each 128-element chunk is then split in
// place into its 64 even and 64 odd elements (perm layout): an in-lane byte shuffle puts each 16-byte lane's evens
// before its odds, a two-source qword permute gathers them.
__attribute__((target(NPU_AVX512))) void QuantizeRowImpl(const float* a, const Shape& s, int8_t* q, float* scale,
                                                         int32_t* block, bool perm) {
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  for (int64_t b = 0; b < s.kb; ++b) {
    const int64_t k0 = b * s.bs, k1 = std::min<int64_t>(s.K, k0 + s.bs);
    __m512 vmax = _mm512_setzero_ps();
    __mmask16 nan = 0;
    for (int64_t k = k0; k < k0 + s.bs; k += 16) {
      const int64_t n = std::max<int64_t>(0, std::min<int64_t>(16, k1 - k));
      const __m512 x = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), a + k);
      nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
      vmax = _mm512_max_ps(vmax, _mm512_and_ps(x, absmask));
    }
    const float amax = nan ? std::nanf("") : _mm512_reduce_max_ps(vmax);  // a NaN makes the scale NaN
    scale[b] = amax / 127.0f;
    const float inv = std::isfinite(amax) && amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m512 vinv = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-128.0f), hi = _mm512_set1_ps(127.0f);
    __m512i sum = _mm512_setzero_si512();
    for (int64_t k = k0; k < k0 + s.bs; k += 16) {
      __m128i c = _mm_setzero_si128();
      if (inv != 0.0f) {
        const int64_t n = std::max<int64_t>(0, std::min<int64_t>(16, k1 - k));
        const __m512 x = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), a + k);
        __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(x, vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm512_min_ps(hi, _mm512_max_ps(lo, r));
        const __m512i codes = _mm512_cvttps_epi32(r);
        sum = _mm512_add_epi32(sum, codes);
        c = _mm512_cvtepi32_epi8(codes);
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k), c);
    }
    block[b] = _mm512_reduce_add_epi32(sum);
  }
  std::memset(q + s.kb * s.bs, 0, s.kc - s.kb * s.bs);
  if (!perm) return;
  const __m512i split = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
  const __m512i evens = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), odds = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
  for (int64_t c = 0; c < s.n_chunks; ++c) {
    int8_t* qc = q + c * kChunkElems;
    const __m512i w0 = _mm512_shuffle_epi8(_mm512_loadu_si512(qc), split);
    const __m512i w1 = _mm512_shuffle_epi8(_mm512_loadu_si512(qc + 64), split);
    _mm512_storeu_si512(qc, _mm512_permutex2var_epi64(w0, evens, w1));
    _mm512_storeu_si512(qc + 64, _mm512_permutex2var_epi64(w0, odds, w1));
  }
}

inline float Bias(const NBitsGemm& g, int64_t n) { return g.bias == nullptr ? 0.0f : g.bias[n]; }

}  // namespace

void QuantizeRowAvx512(const float* a, const Shape& s, int8_t* q, float* scale, int32_t* block, bool perm) {
  QuantizeRowImpl(a, s, q, scale, block, perm);
}

void GemvInt8Avx512(const NBitsGemm& g, const Shape& s, const GemvA* rows, int n_rows, bool vnni, int64_t n0,
                    int64_t n1) {
  static const bool gfni = __builtin_cpu_supports("gfni");
  const auto one = !vnni ? GemvInt8Cols<1> : gfni ? GemvInt8ColsVnniGfni<1> : GemvInt8ColsVnni<1>;
  const auto two = !vnni ? GemvInt8Cols<2> : gfni ? GemvInt8ColsVnniGfni<2> : GemvInt8ColsVnni<2>;
  for (int64_t c0 = n0; c0 < n1; c0 += kCols) {
    const uint8_t* bp[kCols];
    const float* sw[kCols];
    const uint8_t* zp[kCols];
    for (int j = 0; j < kCols; ++j) {
      const int64_t n = std::min(c0 + j, n1 - 1);
      const Column col = ColumnOf(g, s, n);
      bp[j] = col.b;
      sw[j] = col.sw;
      zp[j] = col.zp;
    }
    // Consecutive columns are consecutive rows of B, but a pass reads kCols of them chunk by chunk, which the
    // hardware prefetchers do not follow: the rows two passes ahead are prefetched into L2 (from DRAM, a decoder's
    // weights stream several times faster so; cached weights lose nothing). Prefetches never fault, but stop at N.
    const int64_t ahead = c0 + 3 * kCols <= s.N ? 2 * kCols : 0;
    for (int r0 = 0; r0 < n_rows; r0 += 2) {
      float out[2][kCols];
      const int r_count = std::min(2, n_rows - r0);
      (r_count == 2 ? two : one)(s, rows + r0, bp, sw, zp, ahead, out);
      for (int r = 0; r < r_count; ++r)
        for (int j = 0; j < kCols && c0 + j < n1; ++j) rows[r0 + r].y[c0 + j] = out[r][j] + Bias(g, c0 + j);
    }
  }
}

void GemvFp32Avx512(const NBitsGemm& g, const Shape& s, const GemvA& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const Column col = ColumnOf(g, s, n);
    g.y[n] = GemvFp32Col(s, a.a, col.b, col.sw, col.zp) + Bias(g, n);
  }
}

}  // namespace npu_ep::kern::nbits
#endif  // NPU_EP_X86
