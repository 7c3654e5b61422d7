// The packed-B float GEMM on AVX-512 (packed_sgemm.h). Register tile: 8 rows x one 32-column panel (16
// accumulators); per k two loads of B and eight broadcasts of A, read in place (a row pitch apart). Order: panel,
// then depth chunk, then row blocks: the panel's chunk (32 KB) stays in L1 while every row block of the task meets
// it, and the panel's output block stays in L1 / L2 while its later chunks add onto the stored sums.
#include <algorithm>

#include "intrinsics.h"
#include "packed_sgemm.h"

namespace npu_ep::kern {

#if NPU_EP_X86
namespace {

#define NPU_AVX512F "avx2,fma,avx512f,avx512dq"

constexpr int kRows = 8;  // 12 and 14 rows, and 6 or 7 rows x 4 vectors, measured no faster here
constexpr int64_t kKc = kSgemmDepthChunk;
// how far ahead the tile prefetches B: a product whose B is far past L2 (128 x 1024 x 4096, 128 x 4096 x 1024)
// waited on its panels' chunks from L3; 8 rows ahead gained less, and it costs nothing where B is in L2
constexpr int64_t kPrefetchK = 32;

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

// a: the row block's first row at the chunk's first k, rows lda apart. Read in place: packing A (8x8 transposes)
// cost each thread ~2% of a 128x1024x1024 product, and the eight rows' lines, 4 KB apart at K = 1024, share one
// L1 set without cost on a 12-way L1.
template <int R>
__attribute__((target(NPU_AVX512F))) inline void Tile(const float* a, int64_t lda, const float* bp, int64_t kc,
                                                      float* c, int64_t ldc, const __mmask16* m, bool add,
                                                      const Epilogue* e) {
  __m512 acc[R][2];
  const float* row[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    row[r] = a + r * lda;
  }
  for (int64_t k = 0; k < kc; ++k, bp += kSgemmPanel) {
    const __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
    // B's lines kPrefetchK rows ahead (past the chunk: the panel's next chunk, this order's next); a prefetch
    // never faults, so past the last panel's end is harmless
    _mm_prefetch(reinterpret_cast<const char*>(bp + kPrefetchK * kSgemmPanel), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(bp + kPrefetchK * kSgemmPanel + 16), _MM_HINT_T0);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(row[r][k]);
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
__attribute__((target(NPU_AVX512F))) void TileOf(int rows, const float* a, int64_t lda, const float* bp, int64_t kc,
                                                 float* c, int64_t ldc, const __mmask16* m, bool add,
                                                 const Epilogue* e) {
  if constexpr (R > 1) {
    if (rows < R) return TileOf<R - 1>(rows, a, lda, bp, kc, c, ldc, m, add, e);
  }
  Tile<R>(a, lda, bp, kc, c, ldc, m, add, e);
}

// One or two rows against np panels at once (np <= 4): the same FMAs per output as Tile, in the same order, but
// 2 * np independent chains per row instead of two. A decode step's single row through Tile waits on each FMA's
// latency (two chains: a quarter of the unit's rate); through this it is bound by the loads of B.
template <int R, int P>
__attribute__((target(NPU_AVX512F))) inline void WideTile(const float* a, int64_t lda, const float* bp, int64_t pitch,
                                                          int64_t kc, float* c, int64_t ldc, const __mmask16* m,
                                                          bool add, const Epilogue* e) {
  __m512 acc[R][P][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int q = 0; q < P; ++q) acc[r][q][0] = acc[r][q][1] = _mm512_setzero_ps();
  const float* bq[P];
#pragma GCC unroll 4
  for (int q = 0; q < P; ++q) bq[q] = bp + q * pitch;
  for (int64_t k = 0; k < kc; ++k) {
#pragma GCC unroll 4
    for (int q = 0; q < P; ++q) {
      const __m512 b0 = _mm512_loadu_ps(bq[q]), b1 = _mm512_loadu_ps(bq[q] + 16);
      bq[q] += kSgemmPanel;
#pragma GCC unroll 2
      for (int r = 0; r < R; ++r) {
        const __m512 av = _mm512_set1_ps(a[r * lda + k]);
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
__attribute__((target(NPU_AVX512F))) void WideTileOf(int panels, const float* a, int64_t lda, const float* bp,
                                                     int64_t pitch, int64_t kc, float* c, int64_t ldc,
                                                     const __mmask16* m, bool add, const Epilogue* e) {
  switch (panels) {
    case 1: return WideTile<R, 1>(a, lda, bp, pitch, kc, c, ldc, m, add, e);
    case 2: return WideTile<R, 2>(a, lda, bp, pitch, kc, c, ldc, m, add, e);
    case 3: return WideTile<R, 3>(a, lda, bp, pitch, kc, c, ldc, m, add, e);
    default: return WideTile<R, 4>(a, lda, bp, pitch, kc, c, ldc, m, add, e);
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

}  // namespace

__attribute__((target(NPU_AVX512F))) void PackedSgemmBlockAvx512(const PackedSgemmArgs& g, int64_t m0, int64_t m1,
                                                                 int64_t p0, int64_t p1, float* out, int64_t ldo) {
  const int64_t rows = m1 - m0;
  const float* a = g.a + m0 * g.lda;
  if (rows <= 2 && p1 - p0 < 4 && g.K > kKc) return DeepRows(g, m0, m1, p0, p1, out, ldo);
  if (rows <= 2) {  // four panels at a time (WideTile)
    for (int64_t k0 = 0; k0 == 0 || k0 < g.K; k0 += kKc) {  // K = 0: one empty chunk (zeros + epilogue)
      const int64_t kc = std::min(kKc, g.K - k0);
      const bool add = k0 > 0, last = k0 + kc >= g.K;
      for (int64_t p = p0; p < p1; p += 4) {
        const int panels = static_cast<int>(std::min<int64_t>(4, p1 - p));
        __mmask16 m[8];
        for (int q = 0; q < 8; ++q) m[q] = Lanes(g.N - p * kSgemmPanel - 16 * q);
        const Epilogue e{g.bias == nullptr ? nullptr : g.bias + p * kSgemmPanel, g.relu};
        const float* bp = g.packed + (p * g.K + k0) * kSgemmPanel;
        float* c = out + (p - p0) * kSgemmPanel;
        const Epilogue* ep = last && (g.bias || g.relu) ? &e : nullptr;
        if (rows == 1)
          WideTileOf<1>(panels, a + k0, g.lda, bp, g.K * kSgemmPanel, kc, c, ldo, m, add, ep);
        else
          WideTileOf<2>(panels, a + k0, g.lda, bp, g.K * kSgemmPanel, kc, c, ldo, m, add, ep);
      }
    }
    return;
  }
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n0 = p * kSgemmPanel;
    const __mmask16 m[2] = {Lanes(g.N - n0), Lanes(g.N - n0 - 16)};
    const Epilogue e{g.bias == nullptr ? nullptr : g.bias + n0, g.relu};
    float* c = out + (p - p0) * kSgemmPanel;
    for (int64_t k0 = 0; k0 == 0 || k0 < g.K; k0 += kKc) {  // K = 0: one empty chunk (zeros + epilogue)
      const int64_t kc = std::min(kKc, g.K - k0);
      const bool add = k0 > 0, last = k0 + kc >= g.K;
      const Epilogue* ep = last && (g.bias || g.relu) ? &e : nullptr;
      const float* bp = g.packed + (p * g.K + k0) * kSgemmPanel;
      for (int64_t i = 0; i < rows; i += kRows)
        TileOf<kRows>(static_cast<int>(std::min<int64_t>(kRows, rows - i)), a + i * g.lda + k0, g.lda, bp, kc,
                      c + i * ldo, ldo, m, add, ep);
    }
  }
}

#endif

}  // namespace npu_ep::kern
