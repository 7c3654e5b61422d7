// int8 GEMM, exact: every operand is mapped to u8 A' x s8 B' (int8 A +128, uint8 B -128, zero points shifted
// alike), so one integer dot product serves all four sign combinations:
//   sum_k (A' - azp')(B' - bzp') = dot(A', B') - bzp' * sum(A') - azp' * sum(B') + K * azp' * bzp'
// evaluated in wrapping 32-bit arithmetic, which equals the exact result whenever that fits int32 (as int32
// hardware accumulators do). VNNI hosts: vpdpbusd (4 products per lane, no intermediate saturation) on a register
// tile of 8 rows x 32 columns, columns in lanes, so the epilogue (zero-point terms, MLAS requantization) is
// vectorized too; AMX hosts: tdpbusd on 16 x 16 tiles, then the same epilogue. Other hosts: bytes widened to
// int16 and vpmaddwd (pair sums <= 2 * 255 * 128, exact) - never vpmaddubsw, whose int16 saturation is the
// inexactness ORT's AVX2 u8s8 path has - or plain C++.
// Tasks are fixed blocks of columns (with a tile plan: of its output tiles), so the bits do not depend on the
// thread count.
#include "int8_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu.h"
#include "thread_pool.h"

#include "intrinsics.h"

namespace npu_ep::kern {
namespace {

constexpr int64_t kBlock = 16;        // columns per packed block
constexpr int64_t kColsPerTask = 32;  // two blocks
#define UNROLL _Pragma("GCC unroll 16")

inline int8_t PackedB(const Int8Gemm& g, int64_t k, int64_t n) {
  return g.bp[((n / kBlock) * (g.kp / 4) + k / 4) * 64 + (n % kBlock) * 4 + (k % 4)];
}

struct Prep {
  std::vector<uint8_t> a;         // [M, kp] A' rows, when A itself cannot serve (int8, or K not a multiple of 64)
  const uint8_t* rows = nullptr;  // A' rows [M, kp]: a.data() or A itself
  std::vector<int32_t> asum;      // [M]
  // The zero-point terms split by what they depend on, once per call, so the VNNI epilogue adds two vectors where
  // it would multiply three (all wrapping):
  //   Finish = dot + row[m] + (azp_per_row ? azp'[m] * col[n] : col[n]) - (bzp_uniform ? 0 : bzp'[n] * asum[m])
  bool bzp_uniform = false;  // one B zero point for every column (folded into row[])
  std::vector<int32_t> row;  // [M]: - bzp' * asum[m] when bzp_uniform, plus the requantizing bias_row[m]
  std::vector<int32_t> col;  // [np]: K * bzp'[n] - bsum[n], times azp' unless azp_per_row
};

inline int32_t Finish(const Int8Gemm& g, const Prep& p, int64_t m, int64_t n, uint32_t dot) {
  const uint32_t col = static_cast<uint32_t>(p.col[n]);
  uint32_t v = dot + static_cast<uint32_t>(p.row[m]) +
               (g.azp_per_row ? static_cast<uint32_t>(g.azp[m] + (g.a_signed ? 128 : 0)) * col : col);
  if (!p.bzp_uniform) v -= static_cast<uint32_t>(g.bzp[n]) * static_cast<uint32_t>(p.asum[m]);
  return static_cast<int32_t>(v);
}

inline float Mult(const Int8Gemm& g, int64_t m, int64_t n) {
  return g.mult[g.mult_per_col ? n : g.mult_per_row ? m : 0];
}

inline void Store(const Int8Gemm& g, int64_t m, int64_t n, int32_t acc) {
  if (g.y != nullptr) {
    g.y[m * (g.ldy ? g.ldy : g.N) + n] = Requantize(acc, Mult(g, m, n), g.y_zp, g.y_signed);
  } else {
    g.acc[m * g.N + n] = acc;
  }
}

// Portable: one (row, column) at a time.
void ColumnsScalar(const Int8Gemm& g, const Prep& p, int64_t r0, int64_t r1, int64_t n0, int64_t n1) {
  for (int64_t m = r0; m < r1; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      uint32_t dot = 0;
      for (int64_t k = 0; k < g.K; ++k) dot += static_cast<uint32_t>(p.rows[m * g.kp + k] * PackedB(g, k, n));
      Store(g, m, n, Finish(g, p, m, n, dot));
    }
}

#if NPU_EP_X86
// AVX2: one row x one block of 16 columns; a 16-byte piece (4 columns x 4 k) widened to int16, vpmaddwd with the
// row's 4 bytes repeated, giving per column two partial sums that are added at the end.
__attribute__((target("avx2,fma"))) void ColumnsAvx2(const Int8Gemm& g, const Prep& p, int64_t r0, int64_t r1,
                                                     int64_t n0, int64_t n1) {
  const int64_t kg_count = g.kp / 4;
  for (int64_t m = r0; m < r1; ++m) {
    const uint8_t* a = p.rows + m * g.kp;
    for (int64_t nb = n0; nb < n1; nb += kBlock) {
      const int8_t* b = g.bp + (nb / kBlock) * kg_count * 64;
      __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
      for (int64_t kg = 0; kg < kg_count; ++kg) {
        int32_t a4;
        std::memcpy(&a4, a + 4 * kg, 4);
        const __m256i av = _mm256_broadcastq_epi64(_mm_cvtepu8_epi16(_mm_cvtsi32_si128(a4)));
        UNROLL for (int q = 0; q < 4; ++q) {
          const __m256i bv =
              _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kg * 64 + 16 * q)));
          acc[q] = _mm256_add_epi32(acc[q], _mm256_madd_epi16(av, bv));
        }
      }
      alignas(32) int32_t part[4][8];
      UNROLL for (int q = 0; q < 4; ++q) _mm256_store_si256(reinterpret_cast<__m256i*>(part[q]), acc[q]);
      for (int c = 0; c < kBlock && nb + c < n1; ++c) {
        const uint32_t dot =
            static_cast<uint32_t>(part[c / 4][2 * (c % 4)]) + static_cast<uint32_t>(part[c / 4][2 * (c % 4) + 1]);
        Store(g, m, nb + c, Finish(g, p, m, nb + c, dot));
      }
    }
  }
}

// A' rows [m0, m1): sums by SAD (8 bytes per 64-bit lane), the sign flip and zero padding when copying.
__attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"))) void PrepRowsAvx512(const Int8Gemm& g, Prep& p,
                                                                                           uint8_t flip, bool copy,
                                                                                           int64_t m0, int64_t m1) {
  const __m512i vflip = _mm512_set1_epi8(static_cast<char>(flip));
  for (int64_t m = m0; m < m1; ++m) {
    const uint8_t* src = g.a + m * g.K;
    __m512i sum = _mm512_setzero_si512();
    for (int64_t k = 0; k < g.kp; k += 64) {
      const int64_t n = std::max<int64_t>(0, std::min<int64_t>(64, g.K - k));
      const __mmask64 mask = n == 64 ? ~0ull : (1ull << n) - 1;
      const __m512i v = _mm512_maskz_mov_epi8(mask, _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, src + k), vflip));
      sum = _mm512_add_epi64(sum, _mm512_sad_epu8(v, _mm512_setzero_si512()));
      if (copy) _mm512_storeu_si512(p.a.data() + m * g.kp + k, v);
    }
    p.asum[m] = static_cast<int32_t>(_mm512_reduce_add_epi64(sum));
  }
}

// VNNI: 8 rows x 2 blocks of 16 columns in 16 zmm accumulators; epilogue on whole vectors.
constexpr int kRows = 8;
#define NPU_VNNI "avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"

struct RequantVnni {
  __m512 lo, hi;  // the clip, less the zero point
  __m512i zp;
};

// The exact int32 result of 16 columns of row m: Finish on whole vectors.
__attribute__((target(NPU_VNNI), always_inline)) inline __m512i FinishVnni(const Int8Gemm& g, const Prep& p, int64_t m,
                                                                           __m512i dot, __m512i col, __m512i bzp) {
  __m512i v = _mm512_add_epi32(dot, _mm512_set1_epi32(p.row[m]));
  if (g.azp_per_row)
    v = _mm512_add_epi32(v, _mm512_mullo_epi32(_mm512_set1_epi32(g.azp[m] + (g.a_signed ? 128 : 0)), col));
  else
    v = _mm512_add_epi32(v, col);
  if (!p.bzp_uniform) v = _mm512_sub_epi32(v, _mm512_mullo_epi32(bzp, _mm512_set1_epi32(p.asum[m])));
  return v;
}

// Requantize (Requantize's steps; the clip leaves no NaN, so rounding straight to int32 then adding the zero point
// equals rounding in float first), to int32 lanes in [lo, hi].
__attribute__((target(NPU_VNNI), always_inline)) inline __m512i RequantizeVnni(__m512i v, __m512 mult,
                                                                               const RequantVnni& q) {
  __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(v), mult);
  f = _mm512_min_ps(_mm512_max_ps(f, q.lo), q.hi);
  return _mm512_add_epi32(_mm512_cvt_roundps_epi32(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), q.zp);
}

__attribute__((target(NPU_VNNI), always_inline)) inline __m512 MultVnni(const Int8Gemm& g, int64_t m, int64_t n,
                                                                        __mmask16 mask) {
  return g.mult_per_col ? _mm512_maskz_loadu_ps(mask, g.mult + n) : _mm512_set1_ps(Mult(g, m, n));
}

// The epilogue of an 8-row x 32-column tile, columns [n0, n1), rows [m0, m0 + rows): the column terms are loaded
// once. A whole tile of bytes is packed two rows at a time (packs, then one permute restores the column order);
// tails take one masked vector at a time.
__attribute__((target(NPU_VNNI), always_inline)) inline void EpilogueVnni(const Int8Gemm& g, const Prep& p, int64_t m0,
                                                                          int rows, int64_t n0, int64_t n1,
                                                                          const __m512i* acc0, const __m512i* acc1) {
  const bool two = n0 + kBlock < n1;
  const __mmask16 mask0 = static_cast<__mmask16>(n0 + kBlock <= n1 ? 0xFFFF : (1u << (n1 - n0)) - 1);
  const __mmask16 mask1 = static_cast<__mmask16>(!two                    ? 0
                                                 : n0 + 2 * kBlock <= n1 ? 0xFFFF
                                                                         : (1u << (n1 - n0 - kBlock)) - 1);
  const __m512i col0 = _mm512_loadu_si512(p.col.data() + n0);
  const __m512i col1 = two ? _mm512_loadu_si512(p.col.data() + n0 + kBlock) : col0;
  const __m512i bzp0 = _mm512_loadu_si512(g.bzp + n0);
  const __m512i bzp1 = two ? _mm512_loadu_si512(g.bzp + n0 + kBlock) : bzp0;
  __m512i v0[kRows], v1[kRows];
  UNROLL for (int r = 0; r < kRows; ++r) if (r < rows) {
    v0[r] = FinishVnni(g, p, m0 + r, acc0[r], col0, bzp0);
    v1[r] = FinishVnni(g, p, m0 + r, acc1[r], col1, bzp1);
  }
  if (g.y == nullptr) {
    for (int r = 0; r < rows; ++r) {
      _mm512_mask_storeu_epi32(g.acc + (m0 + r) * g.N + n0, mask0, v0[r]);
      if (two) _mm512_mask_storeu_epi32(g.acc + (m0 + r) * g.N + n0 + kBlock, mask1, v1[r]);
    }
    return;
  }
  const float z = static_cast<float>(g.y_zp);
  const RequantVnni q{_mm512_set1_ps((g.y_signed ? -128.0f : 0.0f) - z),
                      _mm512_set1_ps((g.y_signed ? 127.0f : 255.0f) - z), _mm512_set1_epi32(g.y_zp)};
  const int64_t ldy = g.ldy ? g.ldy : g.N;
  uint8_t* y = g.y + m0 * ldy + n0;
  if (mask1 == 0xFFFF) {  // a whole 32 columns
    const __m512 mult0 = MultVnni(g, m0, n0, mask0), mult1 = MultVnni(g, m0, n0 + kBlock, mask1);
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    UNROLL for (int r = 0; r < kRows; r += 2) if (r < rows) {
      const int r2 = r + 1 < rows ? r + 1 : r;
      const __m512 m_a = g.mult_per_row ? _mm512_set1_ps(g.mult[m0 + r]) : mult0;
      const __m512 m_b = g.mult_per_row ? _mm512_set1_ps(g.mult[m0 + r2]) : mult0;
      const __m512 m_a1 = g.mult_per_row ? m_a : mult1, m_b1 = g.mult_per_row ? m_b : mult1;
      const __m512i wa = _mm512_packs_epi32(RequantizeVnni(v0[r], m_a, q), RequantizeVnni(v1[r], m_a1, q));
      const __m512i wb = _mm512_packs_epi32(RequantizeVnni(v0[r2], m_b, q), RequantizeVnni(v1[r2], m_b1, q));
      const __m512i bytes =
          _mm512_permutexvar_epi32(order, g.y_signed ? _mm512_packs_epi16(wa, wb) : _mm512_packus_epi16(wa, wb));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + r * ldy), _mm512_castsi512_si256(bytes));
      if (r2 != r) _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + r2 * ldy), _mm512_extracti64x4_epi64(bytes, 1));
    }
    return;
  }
  for (int r = 0; r < rows; ++r) {
    const __m512i q0 = RequantizeVnni(v0[r], MultVnni(g, m0 + r, n0, mask0), q);
    _mm_mask_storeu_epi8(y + r * ldy, mask0, _mm512_cvtepi32_epi8(q0));
    if (two) {
      const __m512i q1 = RequantizeVnni(v1[r], MultVnni(g, m0 + r, n0 + kBlock, mask1), q);
      _mm_mask_storeu_epi8(y + r * ldy + kBlock, mask1, _mm512_cvtepi32_epi8(q1));
    }
  }
}

// R rows (the tile's first `rows` of them real; a short tile repeats its last row) x 2 blocks of 16 columns.
template <int R>
__attribute__((target(NPU_VNNI))) void TileVnni(const Int8Gemm& g, const Prep& p, int64_t m0, int rows, int64_t n0,
                                                int64_t n1) {
  const int64_t kg_count = g.kp / 4;
  const int8_t* b0 = g.bp + (n0 / kBlock) * kg_count * 64;
  const int8_t* b1 = n0 + kBlock < n1 ? b0 + kg_count * 64 : b0;
  const uint8_t* a[R];
  UNROLL for (int r = 0; r < R; ++r) a[r] = p.rows + (m0 + std::min(r, rows - 1)) * g.kp;
  __m512i acc0[kRows], acc1[kRows];
  UNROLL for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_si512();
  _Pragma("GCC unroll 2") for (int64_t kg = 0; kg < kg_count; ++kg) {
    const __m512i bv0 = _mm512_loadu_si512(b0 + kg * 64), bv1 = _mm512_loadu_si512(b1 + kg * 64);
    UNROLL for (int r = 0; r < R; ++r) {
      int32_t a4;
      std::memcpy(&a4, a[r] + 4 * kg, 4);
      const __m512i av = _mm512_set1_epi32(a4);
      acc0[r] = _mm512_dpbusd_epi32(acc0[r], av, bv0);
      acc1[r] = _mm512_dpbusd_epi32(acc1[r], av, bv1);
    }
  }
  EpilogueVnni(g, p, m0, rows, n0, n1, acc0, acc1);
}

// Tiles of 8 rows; the last one of 4, 2 or 1 when fewer remain (a GEMV's one row took 8 rows' work).
__attribute__((target(NPU_VNNI))) void ColumnsVnni(const Int8Gemm& g, const Prep& p, int64_t r0, int64_t r1, int64_t n0,
                                                   int64_t n1) {
  for (int64_t m0 = r0; m0 < r1; m0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, r1 - m0));
    if (rows > 4)
      TileVnni<kRows>(g, p, m0, rows, n0, n1);
    else if (rows > 2)
      TileVnni<4>(g, p, m0, rows, n0, n1);
    else if (rows == 2)
      TileVnni<2>(g, p, m0, rows, n0, n1);
    else
      TileVnni<1>(g, p, m0, rows, n0, n1);
  }
}

// AMX: the same exact dot products (tdpbusd, u8 x s8 into int32, no intermediate saturation) on 16 x 16 tiles,
// 32 rows x 32 columns per pass: C tiles 0-3, A' tiles 4-5 (16 rows x 64 k, rows kp apart), B tiles 6-7 (16 k-quads x
// 16 columns: a packed block's next 1 KiB as it lies). The sums go through a small buffer into the VNNI epilogue,
// 8 rows at a time. Rows past the last 16 take the VNNI tile. tdpbusd sums in another order than vpdpbusd, which
// wrapping int32 addition makes irrelevant: the bits are the same.
#if NPU_EP_AMX
#define NPU_AMX NPU_VNNI ",amx-tile,amx-int8"

struct alignas(64) AmxConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

__attribute__((target(NPU_AMX))) void ColumnsAmx(const Int8Gemm& g, const Prep& p, int64_t r0, int64_t r1, int64_t n0,
                                                 int64_t n1) {
  const int64_t full = r0 + (r1 - r0) / 16 * 16;
  if (full > r0) {
    AmxConfig cfg;
    for (int t = 0; t < 8; ++t) {
      cfg.colsb[t] = 64;
      cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
    const int64_t kg_count = g.kp / 4;
    const int8_t* b0 = g.bp + (n0 / kBlock) * kg_count * 64;
    const bool two = n0 + kBlock < n1;
    const int8_t* b1 = two ? b0 + kg_count * 64 : b0;
    alignas(64) int32_t c[4][16][16];  // [A tile * 2 + B tile][row][column]
    for (int64_t m0 = r0; m0 < full; m0 += 32) {
      const bool pair = m0 + 16 < full;  // a second 16 rows
      const uint8_t* a0 = p.rows + m0 * g.kp;
      const uint8_t* a1 = pair ? a0 + 16 * g.kp : a0;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t k = 0; k < g.kp; k += 64) {
        _tile_loadd(4, a0 + k, g.kp);
        _tile_loadd(6, b0 + k * 16, 64);
        _tile_loadd(7, b1 + k * 16, 64);
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 4, 7);
        if (pair) {
          _tile_loadd(5, a1 + k, g.kp);
          _tile_dpbusd(2, 5, 6);
          _tile_dpbusd(3, 5, 7);
        }
      }
      _tile_stored(0, c[0], 64);
      _tile_stored(1, c[1], 64);
      _tile_stored(2, c[2], 64);
      _tile_stored(3, c[3], 64);
      for (int h = 0; h < (pair ? 4 : 2); ++h) {  // 8-row halves of the 16-row tiles
        __m512i acc0[kRows], acc1[kRows];
        UNROLL for (int r = 0; r < kRows; ++r) {
          acc0[r] = _mm512_load_si512(c[h / 2 * 2][h % 2 * kRows + r]);
          acc1[r] = _mm512_load_si512(c[h / 2 * 2 + 1][h % 2 * kRows + r]);
        }
        EpilogueVnni(g, p, m0 + h * kRows, kRows, n0, n1, acc0, acc1);
      }
    }
    _tile_release();
  }
  if (full < r1) ColumnsVnni(g, p, full, r1, n0, n1);
}
#endif  // NPU_EP_AMX
#endif

void ZeroPointTerms(const Int8Gemm& g, Prep& p) {
  const int64_t np = (g.N + kBlock - 1) / kBlock * kBlock;
  p.bzp_uniform = std::all_of(g.bzp, g.bzp + g.N, [&](int32_t z) { return z == g.bzp[0]; });
  const uint32_t bzp0 = p.bzp_uniform ? static_cast<uint32_t>(g.bzp[0]) : 0;
  const bool bias = g.y != nullptr && g.bias_row != nullptr;
  p.row.resize(g.M);
  for (int64_t m = 0; m < g.M; ++m)
    p.row[m] = static_cast<int32_t>((bias ? static_cast<uint32_t>(g.bias_row[m]) : 0) -
                                    bzp0 * static_cast<uint32_t>(p.asum[m]));
  const uint32_t azp = g.azp_per_row ? 1 : static_cast<uint32_t>(g.azp[0] + (g.a_signed ? 128 : 0));
  p.col.resize(np);
  for (int64_t n = 0; n < np; ++n)
    p.col[n] = static_cast<int32_t>(
        azp * (static_cast<uint32_t>(g.K) * static_cast<uint32_t>(g.bzp[n]) - static_cast<uint32_t>(g.bsum[n])));
}

}  // namespace

void Int8MatMul(const Int8Gemm& g) {
  if (g.M == 0 || g.N == 0) return;
  // A' = u8 rows padded to kp, and their sums: the thread's own buffers, grown to its largest call (scratch.h's
  // rule; every element read below is written first), so a small call makes no allocation. A call's tasks never
  // call Int8MatMul, so no call on this thread overwrites them while they are read. The tasks below read them
  // through p: the name of a thread_local would be each worker's own.
  thread_local Prep buffers;
  Prep& p = buffers;
  const uint8_t flip = g.a_signed ? 0x80 : 0x00;  // int8 x + 128 == the bits of x with the sign bit flipped
  const bool copy = g.a_signed || g.kp != g.K;    // else A's rows are A' rows already
  if (copy) p.a.resize(g.M * g.kp);
  p.rows = copy ? p.a.data() : g.a;
  p.asum.assign(g.M, 0);
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) {
    // Rows are independent: the split changes no bits. A small A (a few us of work) is not worth waking threads.
    constexpr int64_t kRowsPerTask = 16;
    const int prep_threads = g.M * g.kp >= (int64_t{1} << 20) ? g.threads : 1;
    ParallelFor(prep_threads, (g.M + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t t) {
      PrepRowsAvx512(g, p, flip, copy, t * kRowsPerTask, std::min(g.M, (t + 1) * kRowsPerTask));
    });
  } else
#endif
  {
    if (copy) std::fill(p.a.begin(), p.a.end(), uint8_t{0});
    for (int64_t m = 0; m < g.M; ++m) {
      int32_t s = 0;
      for (int64_t k = 0; k < g.K; ++k) {
        const uint8_t v = g.a[m * g.K + k] ^ flip;
        if (copy) p.a[m * g.kp + k] = v;
        s += v;
      }
      p.asum[m] = s;
    }
  }
  ZeroPointTerms(g, p);
  using ColumnsFn = void (*)(const Int8Gemm&, const Prep&, int64_t, int64_t, int64_t, int64_t);
  ColumnsFn columns = ColumnsScalar;
#if NPU_EP_X86
  const Isa isa = ActiveIsa();
  if (isa >= Isa::kAvx2) columns = ColumnsAvx2;
  if (isa >= Isa::kAvx512Vnni) columns = ColumnsVnni;
#if NPU_EP_AMX
  if (isa == Isa::kAmxInt8) columns = ColumnsAmx;
#endif
#endif
  RunTiles(g.threads, g.plan, g.dma, g.M, g.N, g.K, kColsPerTask,
           [&](int64_t r0, int64_t r1, int64_t n0, int64_t n1) { columns(g, p, r0, r1, n0, n1); });
}

}  // namespace npu_ep::kern
