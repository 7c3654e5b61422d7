// The packed-B float GEMM on AVX-512 (packed_sgemm.h). Register tile: 8 rows x one 32-column panel (16
// accumulators); per k two loads of B and eight broadcasts of A, which a task packs per depth chunk (PackA). The
// panel's chunk stays in L1 while every row block of the task meets it; later chunks add onto the stored sums.
#include <algorithm>
#include <cstring>
#include <vector>

#include "intrinsics.h"
#include "packed_sgemm.h"
#include "scratch.h"

namespace npu_ep::kern {

#if NPU_EP_X86
namespace {

#define NPU_AVX512F "avx2,fma,avx512f,avx512dq"

constexpr int kRows = 8;  // 12 and 14 rows, and 6 or 7 rows x 4 vectors, measured no faster here
constexpr int64_t kKc = kSgemmDepthChunk;
thread_local std::vector<float> t_packed_a;  // a pool thread's packed A chunk, kept between calls

inline __mmask16 Lanes(int64_t n) { return n >= 16 ? 0xFFFF : n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1u); }

struct Epilogue {
  const float* bias;  // the panel's bias, or null
  bool relu;
};

__attribute__((target(NPU_AVX512F))) inline void Store(float* dst, __mmask16 m, __m512 sum, bool add, const Epilogue* e,
                                                       int v) {
  if (add) sum = _mm512_add_ps(_mm512_maskz_loadu_ps(m, dst), sum);
  if (e != nullptr) {
    if (e->bias != nullptr) sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(m, e->bias + 16 * v));
    // np.maximum(y, 0): y where y > 0 or y is NaN, else +0 (so -0 becomes +0)
    if (e->relu) sum = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(sum, _mm512_setzero_ps(), _CMP_NLE_UQ), sum);
  }
  _mm512_mask_storeu_ps(dst, m, sum);
}

// at: the row block's packed A chunk, kRows floats per k (rows past R are never read).
template <int R>
__attribute__((target(NPU_AVX512F))) inline void Tile(const float* at, const float* bp, int64_t kc, float* c,
                                                      int64_t ldc, const __mmask16* m, bool add, const Epilogue* e) {
  __m512 acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k, bp += kSgemmPanel, at += kRows) {
    const __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(at[r]);
      acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    Store(c + r * ldc, m[0], acc[r][0], add, e, 0);
    if (m[1]) Store(c + r * ldc + 16, m[1], acc[r][1], add, e, 1);
  }
}

template <int R>
__attribute__((target(NPU_AVX512F))) void TileOf(int rows, const float* at, const float* bp, int64_t kc, float* c,
                                                 int64_t ldc, const __mmask16* m, bool add, const Epilogue* e) {
  if constexpr (R > 1) {
    if (rows < R) return TileOf<R - 1>(rows, at, bp, kc, c, ldc, m, add, e);
  }
  Tile<R>(at, bp, kc, c, ldc, m, add, e);
}

// One or two rows against np panels at once (np <= 4): the same FMAs per output as Tile, in the same order, but
// 2 * np independent chains per row instead of two. A decode step's single row through Tile waits on each FMA's
// latency (two chains: a quarter of the unit's rate); through this it is bound by the loads of B.
template <int R, int P>
__attribute__((target(NPU_AVX512F))) inline void WideTile(const float* at, const float* bp, int64_t pitch, int64_t kc,
                                                          float* c, int64_t ldc, const __mmask16* m, bool add,
                                                          const Epilogue* e) {
  __m512 acc[R][P][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int q = 0; q < P; ++q) acc[r][q][0] = acc[r][q][1] = _mm512_setzero_ps();
  const float* bq[P];
#pragma GCC unroll 4
  for (int q = 0; q < P; ++q) bq[q] = bp + q * pitch;
  for (int64_t k = 0; k < kc; ++k, at += kRows) {
#pragma GCC unroll 4
    for (int q = 0; q < P; ++q) {
      const __m512 b0 = _mm512_loadu_ps(bq[q]), b1 = _mm512_loadu_ps(bq[q] + 16);
      bq[q] += kSgemmPanel;
#pragma GCC unroll 2
      for (int r = 0; r < R; ++r) {
        const __m512 av = _mm512_set1_ps(at[r]);
        acc[r][q][0] = _mm512_fmadd_ps(av, b0, acc[r][q][0]);
        acc[r][q][1] = _mm512_fmadd_ps(av, b1, acc[r][q][1]);
      }
    }
  }
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int q = 0; q < P; ++q) {
      const Epilogue eq{e != nullptr && e->bias != nullptr ? e->bias + q * kSgemmPanel : nullptr,
                        e != nullptr && e->relu};
      const Epilogue* ep = e != nullptr ? &eq : nullptr;
      float* cq = c + r * ldc + q * kSgemmPanel;
      Store(cq, m[2 * q], acc[r][q][0], add, ep, 0);
      if (m[2 * q + 1]) Store(cq + 16, m[2 * q + 1], acc[r][q][1], add, ep, 1);
    }
}

template <int R>
__attribute__((target(NPU_AVX512F))) void WideTileOf(int panels, const float* at, const float* bp, int64_t pitch,
                                                     int64_t kc, float* c, int64_t ldc, const __mmask16* m, bool add,
                                                     const Epilogue* e) {
  switch (panels) {
    case 1: return WideTile<R, 1>(at, bp, pitch, kc, c, ldc, m, add, e);
    case 2: return WideTile<R, 2>(at, bp, pitch, kc, c, ldc, m, add, e);
    case 3: return WideTile<R, 3>(at, bp, pitch, kc, c, ldc, m, add, e);
    default: return WideTile<R, 4>(at, bp, pitch, kc, c, ldc, m, add, e);
  }
}

// One or two rows against one panel, J full depth chunks at once, each summed from zero in its own accumulators
// and stored in order (the first as it is, each later one added onto C): the same sums in the same order as the
// chunk-by-chunk loop. A product of few columns (a classifier's 1x4096x10) through WideTile has two chains per
// row and waits on FMA latency; this keeps 2 * J. A is read in place (at most two rows: no packing).
template <int R, int J, bool kWide>
__attribute__((target(NPU_AVX512F))) inline void DeepTile(const float* a, int64_t lda, const float* bp, int64_t kc,
                                                          float* c, int64_t ldc, const __mmask16* m, bool add,
                                                          const Epilogue* e) {
  __m512 acc[R][J][2];
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < J; ++j) acc[r][j][0] = acc[r][j][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k, bp += kSgemmPanel) {
#pragma GCC unroll 4
    for (int j = 0; j < J; ++j) {
      const float* bj = bp + j * kKc * kSgemmPanel;
      const __m512 b0 = _mm512_loadu_ps(bj), b1 = kWide ? _mm512_loadu_ps(bj + 16) : b0;
#pragma GCC unroll 2
      for (int r = 0; r < R; ++r) {
        const __m512 av = _mm512_set1_ps(a[r * lda + j * kKc + k]);
        acc[r][j][0] = _mm512_fmadd_ps(av, b0, acc[r][j][0]);
        if (kWide) acc[r][j][1] = _mm512_fmadd_ps(av, b1, acc[r][j][1]);
      }
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < J; ++j)
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r) {
      const Epilogue* ej = j == J - 1 ? e : nullptr;
      Store(c + r * ldc, m[0], acc[r][j][0], add || j > 0, ej, 0);
      if (kWide) Store(c + r * ldc + 16, m[1], acc[r][j][1], add || j > 0, ej, 1);
    }
}

template <int R>
__attribute__((target(NPU_AVX512F))) void DeepTileOf(int chunks, const float* a, int64_t lda, const float* bp,
                                                     int64_t kc, float* c, int64_t ldc, const __mmask16* m, bool add,
                                                     const Epilogue* e) {
  if (!m[1]) {  // the panel's second half is past N
    switch (chunks) {
      case 1: return DeepTile<R, 1, false>(a, lda, bp, kc, c, ldc, m, add, e);
      case 2: return DeepTile<R, 2, false>(a, lda, bp, kc, c, ldc, m, add, e);
      case 3: return DeepTile<R, 3, false>(a, lda, bp, kc, c, ldc, m, add, e);
      default: return DeepTile<R, 4, false>(a, lda, bp, kc, c, ldc, m, add, e);
    }
  }
  switch (chunks) {
    case 1: return DeepTile<R, 1, true>(a, lda, bp, kc, c, ldc, m, add, e);
    case 2: return DeepTile<R, 2, true>(a, lda, bp, kc, c, ldc, m, add, e);
    case 3: return DeepTile<R, 3, true>(a, lda, bp, kc, c, ldc, m, add, e);
    default: return DeepTile<R, 4, true>(a, lda, bp, kc, c, ldc, m, add, e);
  }
}

// Rows [m0, m1) (at most two) x panels [p0, p1) through DeepTile: up to four full chunks at a time, then the
// short last chunk alone.
__attribute__((target(NPU_AVX512F))) void DeepRows(const PackedSgemmArgs& g, int64_t m0, int64_t m1, int64_t p0,
                                                   int64_t p1, float* out, int64_t ldo) {
  const int64_t full = g.K / kKc, tail = g.K - full * kKc;
  const float* a = g.a + m0 * g.lda;
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n0 = p * kSgemmPanel;
    const __mmask16 m[2] = {Lanes(g.N - n0), Lanes(g.N - n0 - 16)};
    const Epilogue e{g.bias == nullptr ? nullptr : g.bias + n0, g.relu};
    const Epilogue* ep = g.bias || g.relu ? &e : nullptr;
    float* c = out + (p - p0) * kSgemmPanel;
    const float* bp = g.packed + p * g.K * kSgemmPanel;
    for (int64_t j0 = 0; j0 < full; j0 += 4) {
      const int chunks = static_cast<int>(std::min<int64_t>(4, full - j0));
      const Epilogue* last = j0 + chunks == full && tail == 0 ? ep : nullptr;
      if (m1 - m0 == 1)
        DeepTileOf<1>(chunks, a + j0 * kKc, g.lda, bp + j0 * kKc * kSgemmPanel, kKc, c, ldo, m, j0 > 0, last);
      else
        DeepTileOf<2>(chunks, a + j0 * kKc, g.lda, bp + j0 * kKc * kSgemmPanel, kKc, c, ldo, m, j0 > 0, last);
    }
    if (tail == 0) continue;
    if (m1 - m0 == 1)
      DeepTileOf<1>(1, a + full * kKc, g.lda, bp + full * kKc * kSgemmPanel, tail, c, ldo, m, full > 0, ep);
    else
      DeepTileOf<2>(1, a + full * kKc, g.lda, bp + full * kKc * kSgemmPanel, tail, c, ldo, m, full > 0, ep);
  }
}

// 8 rows x 8 k of A (row pitch lda) to dst as 8 k x 8 rows: the classic in-register 8x8 transpose.
__attribute__((target(NPU_AVX512F))) inline void Transpose8x8(const float* a, int64_t lda, float* dst) {
  __m256 r[8], t[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(a + i * lda);
#pragma GCC unroll 4
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + 8 * i, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + 8 * (i + 4), _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

// A[rows, kc] (row pitch lda) into dst as row blocks of kRows, each kc x kRows (k-major; a short block's missing
// rows are left unwritten and never read): the tile's eight broadcasts per k then read one 32-byte line instead of
// eight rows a row pitch apart (4 KB apart at K = 1024, all in one L1 set with each other and with the B panel).
__attribute__((target(NPU_AVX512F))) void PackA(const float* a, int64_t lda, int64_t rows, int64_t kc, float* dst) {
  static_assert(kRows == 8, "PackA transposes 8x8 blocks");
  for (int64_t i = 0; i < rows; i += kRows, dst += kc * kRows) {
    const int64_t n = std::min<int64_t>(kRows, rows - i);
    int64_t k = 0;
    if (n == kRows)
      for (; k + 8 <= kc; k += 8) Transpose8x8(a + i * lda + k, lda, dst + k * kRows);
    for (int64_t r = 0; r < n; ++r) {
      const float* src = a + (i + r) * lda;
      for (int64_t j = k; j < kc; ++j) dst[j * kRows + r] = src[j];
    }
  }
}

}  // namespace

__attribute__((target(NPU_AVX512F))) void PackedSgemmBlockAvx512(const PackedSgemmArgs& g, int64_t m0, int64_t m1,
                                                                 int64_t p0, int64_t p1, float* out, int64_t ldo) {
  const int64_t rows = m1 - m0;
  if (rows <= 2 && p1 - p0 < 4 && g.K > kKc) return DeepRows(g, m0, m1, p0, p1, out, ldo);
  float* at = Grow(t_packed_a, (rows + kRows - 1) / kRows * kRows * std::min(kKc, g.K));
  for (int64_t k0 = 0; k0 == 0 || k0 < g.K; k0 += kKc) {  // K = 0: one empty chunk (zeros + epilogue)
    const int64_t kc = std::min(kKc, g.K - k0);
    const bool add = k0 > 0, last = k0 + kc >= g.K;
    PackA(g.a + m0 * g.lda + k0, g.lda, rows, kc, at);
    if (rows <= 2) {  // four panels at a time (WideTile)
      for (int64_t p = p0; p < p1; p += 4) {
        const int panels = static_cast<int>(std::min<int64_t>(4, p1 - p));
        __mmask16 m[8];
        for (int q = 0; q < 8; ++q) m[q] = Lanes(g.N - p * kSgemmPanel - 16 * q);
        const Epilogue e{g.bias == nullptr ? nullptr : g.bias + p * kSgemmPanel, g.relu};
        const float* bp = g.packed + (p * g.K + k0) * kSgemmPanel;
        float* c = out + (p - p0) * kSgemmPanel;
        const Epilogue* ep = last && (g.bias || g.relu) ? &e : nullptr;
        if (rows == 1)
          WideTileOf<1>(panels, at, bp, g.K * kSgemmPanel, kc, c, ldo, m, add, ep);
        else
          WideTileOf<2>(panels, at, bp, g.K * kSgemmPanel, kc, c, ldo, m, add, ep);
      }
      continue;
    }
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * kSgemmPanel;
      const __mmask16 m[2] = {Lanes(g.N - n0), Lanes(g.N - n0 - 16)};
      const Epilogue e{g.bias == nullptr ? nullptr : g.bias + n0, g.relu};
      const float* bp = g.packed + (p * g.K + k0) * kSgemmPanel;
      for (int64_t i = 0; i < rows; i += kRows)
        TileOf<kRows>(static_cast<int>(std::min<int64_t>(kRows, rows - i)), at + i * kc, bp, kc,
                      out + i * ldo + (p - p0) * kSgemmPanel, ldo, m, add, last && (g.bias || g.relu) ? &e : nullptr);
    }
  }
}

#endif

}  // namespace npu_ep::kern
