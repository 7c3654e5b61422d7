// The float conv's GEMM on AVX-512 without the BLAS: C[M x pixels] = A^T B with A the packed weights [K x M] and
// B's row k found at koff[k] (a patch matrix's row, or a tap's offset into a zero-padded input, read in place).
// A register tile of up to 12 output channels x 2 slots of 16 pixels keeps 24 accumulators: per k two loads of B
// and twelve broadcasts of A, no horizontal sums. K is cut into chunks of kKc so a row block's A stays in L1 while
// it meets every slot; later chunks add onto the stored partial sums. Numpy's OpenBLAS ran a small net's convs
// (M 16-64, K 27-288) at 8-50 GFLOP/s here and woke its own threads for them; this runs on the calling thread only.
#include <algorithm>
#include <vector>

#include "conv_gemm.h"
#include "intrinsics.h"

#if NPU_EP_X86

namespace npu_ep::kern {
namespace {

#define NPU_AVX512F "avx2,fma,avx512f,avx512dq"

// Output channels per tile, at most: M is cut into ceil(M / kRows) blocks of near-equal rows (64: six of 10-11,
// 16: two of 8, no short last tile). Each B vector loaded feeds kRows multiply-adds; 14 rows spill registers.
constexpr int kRows = 12;
constexpr int kSlots = 2;  // 16-pixel slots per tile
constexpr int64_t kKc = 256;  // depth per pass over a tile

inline __mmask16 Lanes(int n) { return static_cast<__mmask16>((1u << n) - 1u); }  // n <= 16

// The last pass's epilogue: + bias, then the conv tail's clip (v < lo ? lo : v > hi ? hi : v; NaN stays).
struct Epilogue {
  const float* bias = nullptr;  // this row block's bias, or null
  const float* clip = nullptr;  // {lo, hi}, or null
  const float* hswish = nullptr;  // {a, b, lo, hi} (conv_tail.h's HardSwishTail), or null
};

// v clipped to [clip[0], clip[1]]: lo wins, also when lo > hi; NaN stays.
__attribute__((target(NPU_AVX512F))) inline __m512 Clip(__m512 v, const float* clip) {
  const __m512 lo = _mm512_set1_ps(clip[0]), hi = _mm512_set1_ps(clip[1]);
  const __mmask16 below = _mm512_cmp_ps_mask(v, lo, _CMP_LT_OQ), above = _mm512_cmp_ps_mask(v, hi, _CMP_GT_OQ);
  return _mm512_mask_mov_ps(_mm512_mask_mov_ps(v, above, hi), below, lo);
}

// v * max(lo, min(hi, v * a + b)) for hs = {a, b, lo, hi}: the tail's register interpreter's HardSwish, its
// operations in its order (the same bits); the empty asm keeps the compiler from fusing v * a + b (this file is not
// built with fp-contract off: its sums are fused on purpose).
__attribute__((target(NPU_AVX512F))) inline __m512 HardSwish(__m512 v, const float* hs) {
  __m512 product = _mm512_mul_ps(v, _mm512_set1_ps(hs[0]));
  __asm__("" : "+v"(product));
  const __m512 t = _mm512_add_ps(product, _mm512_set1_ps(hs[1]));
  return _mm512_mul_ps(v, _mm512_max_ps(_mm512_set1_ps(hs[2]), _mm512_min_ps(_mm512_set1_ps(hs[3]), t)));
}

__attribute__((target(NPU_AVX512F))) inline void Store(float* dst, __mmask16 m, __m512 sum, bool add, const Epilogue* e,
                                                       int r) {
  if (add) sum = _mm512_add_ps(_mm512_maskz_loadu_ps(m, dst), sum);
  if (e != nullptr) {
    if (e->bias != nullptr) sum = _mm512_add_ps(sum, _mm512_set1_ps(e->bias[r]));
    if (e->clip != nullptr) sum = Clip(sum, e->clip);
    if (e->hswish != nullptr) sum = HardSwish(sum, e->hswish);
  }
  _mm512_mask_storeu_ps(dst, m, sum);
}

// How a tile loads its slots' B vectors: kFull, every slot 16 lanes of one run (no masks: a masked load also takes
// a uop on the FMA ports, ~12% of the loop's cycles in perf); kMasked, one run each, any lanes; kSplit, some slot
// crosses into the next output row: two whole vectors, the second `jump` floats further on, blended (one uop where
// two masked loads took two); the lanes past n hold whatever B has there and are never stored, so B must have 16
// readable floats past the last one a split slot reads.
enum class Loads { kFull, kMasked, kSplit };

// R rows x S slots (slots[0, ns), ns <= S; missing ones load nothing); add: C += the sum (later K chunks); e (last
// chunk only, else null): the epilogue after the sum, in the order of the BLAS path's separate passes.
template <int R, int S, Loads kLoads>
__attribute__((target(NPU_AVX512F))) inline void Tile(const float* at, int64_t lda, const float* b, const int64_t* koff,
                                                      int64_t kc, const GemmSlot* slots, int ns, float* c, int64_t ldc,
                                                      bool add, const Epilogue* e) {
  __mmask16 m[S], second[S];
  const float* bs[S];
  const float* bj[S];
#pragma GCC unroll 4
  for (int v = 0; v < S; ++v) {
    const GemmSlot& sl = slots[v < ns ? v : 0];
    m[v] = v < ns ? Lanes(sl.n) : 0;
    second[v] = static_cast<__mmask16>(~Lanes(std::min(sl.split, 16)));
    bs[v] = b + sl.in;
    bj[v] = b + sl.in + sl.jump;
  }
  __m512 acc[R][S];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < S; ++v) acc[r][v] = _mm512_setzero_ps();
  // unrolled twice: the loop's own offset load, pointer steps and branch once per two depths
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k, at += lda) {
    const int64_t o = koff[k];
    __m512 bv[S];
#pragma GCC unroll 4
    for (int v = 0; v < S; ++v) {
      if constexpr (kLoads == Loads::kFull) {
        bv[v] = _mm512_loadu_ps(bs[v] + o);
      } else if constexpr (kLoads == Loads::kMasked) {
        bv[v] = _mm512_maskz_loadu_ps(m[v], bs[v] + o);
      } else {
        bv[v] = _mm512_mask_blend_ps(second[v], _mm512_loadu_ps(bs[v] + o), _mm512_loadu_ps(bj[v] + o));
      }
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(at[r]);
#pragma GCC unroll 4
      for (int v = 0; v < S; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < S; ++v)
      if (v < ns) Store(c + r * ldc + slots[v].out, m[v], acc[r][v], add, e, r);
}

// Tile<rows, kSlots> for a run-time rows <= R (a row block of M).
template <int R>
__attribute__((target(NPU_AVX512F))) void TileOf(int rows, const float* at, int64_t lda, const float* b,
                                                 const int64_t* koff, int64_t kc, const GemmSlot* slots, int ns,
                                                 float* c, int64_t ldc, bool add, const Epilogue* e) {
  if constexpr (R > 1) {
    if (rows < R) return TileOf<R - 1>(rows, at, lda, b, koff, kc, slots, ns, c, ldc, add, e);
  }
  bool full = true, split = false;
  for (int v = 0; v < ns; ++v) {
    full = full && slots[v].n == 16 && slots[v].split >= 16;
    split = split || slots[v].split < slots[v].n;
  }
  if (ns < kSlots) {  // the last slot alone: a one-slot tile, not a pair's FMAs on an empty vector
    if (full) return Tile<R, 1, Loads::kFull>(at, lda, b, koff, kc, slots, ns, c, ldc, add, e);
    if (split) return Tile<R, 1, Loads::kSplit>(at, lda, b, koff, kc, slots, ns, c, ldc, add, e);
    return Tile<R, 1, Loads::kMasked>(at, lda, b, koff, kc, slots, ns, c, ldc, add, e);
  }
  if (full) return Tile<R, kSlots, Loads::kFull>(at, lda, b, koff, kc, slots, ns, c, ldc, add, e);
  if (split) return Tile<R, kSlots, Loads::kSplit>(at, lda, b, koff, kc, slots, ns, c, ldc, add, e);
  Tile<R, kSlots, Loads::kMasked>(at, lda, b, koff, kc, slots, ns, c, ldc, add, e);
}

}  // namespace

// Per depth chunk, each row block meets every group of kSlots slots while its A rows are in L1.
__attribute__((target(NPU_AVX512F))) void GemmAvx512(int64_t M, int64_t K, const float* at, int64_t lda, const float* b,
                                                     const int64_t* koff, const GemmSlot* slots, int64_t n_slots,
                                                     float* c, int64_t ldc, const float* bias, const float* clip,
                                                     const float* hswish) {
  for (int64_t k0 = 0; k0 < K; k0 += kKc) {
    const int64_t kc = std::min(kKc, K - k0);
    const bool add = k0 > 0, last = k0 + kc == K;
    const int64_t blocks = (M + kRows - 1) / kRows;
    for (int64_t bi = 0; bi < blocks; ++bi) {
      const int64_t i = bi * M / blocks;
      const int rows = static_cast<int>((bi + 1) * M / blocks - i);
      const Epilogue e{bias == nullptr ? nullptr : bias + i, clip, hswish};
      for (int64_t s0 = 0; s0 < n_slots; s0 += kSlots) {
        const int ns = static_cast<int>(std::min<int64_t>(kSlots, n_slots - s0));
        TileOf<kRows>(rows, at + k0 * lda + i, lda, b, koff + k0, kc, slots + s0, ns, c + i * ldc, ldc, add,
                      last && (bias || clip || hswish) ? &e : nullptr);
      }
    }
  }
}

namespace {

// V vectors of 16 output channels x PX pixels (pixel p's B column pin[p], C column pout[p]): per k V loads of A's
// row, PX broadcasts of B, V * PX fused multiply-adds; per depth pass of kKc the sums from zero, the passes added
// in order, then + bias and the clip: each output's arithmetic as Tile's. kAhead (the first tile of a channel
// block, which meets A's rows first): A's rows prefetched kAheadRows ahead, as the hardware prefetchers do not
// follow rows read in strided pieces out of memory.
constexpr int64_t kAheadRows = 16;
template <int V, int PX, bool kAhead>
__attribute__((target(NPU_AVX512F))) void ChannelTile(int64_t K, const float* at, int64_t lda, const float* b,
                                                      const int64_t* koff, const int64_t* pin, const int64_t* pout,
                                                      float* c, int64_t ldc, const float* bias, const float* clip,
                                                      const float* hswish) {
  __m512 acc[PX][V];
  alignas(64) float total[PX][V][16];
  for (int64_t k0 = 0; k0 < K; k0 += kKc) {
    const int64_t k1 = std::min(K, k0 + kKc);
#pragma GCC unroll 6
    for (int p = 0; p < PX; ++p)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[p][v] = _mm512_setzero_ps();
    for (int64_t k = k0; k < k1; ++k) {
      const float* a = at + k * lda;
      const float* bk = b + koff[k];
      if constexpr (kAhead) {
        if (k + kAheadRows < K)
#pragma GCC unroll 4
          for (int v = 0; v < V; ++v)
            _mm_prefetch(reinterpret_cast<const char*>(a + kAheadRows * lda + 16 * v), _MM_HINT_T0);
      }
      __m512 av[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) av[v] = _mm512_loadu_ps(a + 16 * v);
#pragma GCC unroll 6
      for (int p = 0; p < PX; ++p) {
        const __m512 bp = _mm512_set1_ps(bk[pin[p]]);
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[p][v] = _mm512_fmadd_ps(av[v], bp, acc[p][v]);
      }
    }
#pragma GCC unroll 6
    for (int p = 0; p < PX; ++p)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        _mm512_store_ps(total[p][v], k0 == 0 ? acc[p][v] : _mm512_add_ps(_mm512_load_ps(total[p][v]), acc[p][v]));
  }
  const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(static_cast<int32_t>(ldc)));
  for (int p = 0; p < PX; ++p)
    for (int v = 0; v < V; ++v) {
      __m512 sum = _mm512_load_ps(total[p][v]);
      if (bias != nullptr) sum = _mm512_add_ps(sum, _mm512_loadu_ps(bias + 16 * v));
      if (clip != nullptr) sum = Clip(sum, clip);
      if (hswish != nullptr) sum = HardSwish(sum, hswish);
      _mm512_i32scatter_ps(c + 16 * v * ldc + pout[p], rows, sum, 4);
    }
}

// ChannelTile<V, px> for a run-time px <= PX (the last pixels).
template <int V, int PX, bool kAhead>
__attribute__((target(NPU_AVX512F))) void ChannelTileOf(int px, int64_t K, const float* at, int64_t lda, const float* b,
                                                        const int64_t* koff, const int64_t* pin, const int64_t* pout,
                                                        float* c, int64_t ldc, const float* bias, const float* clip,
                                                        const float* hswish) {
  if constexpr (PX > 1) {
    if (px < PX)
      return ChannelTileOf<V, PX - 1, kAhead>(px, K, at, lda, b, koff, pin, pout, c, ldc, bias, clip, hswish);
  }
  ChannelTile<V, PX, kAhead>(K, at, lda, b, koff, pin, pout, c, ldc, bias, clip, hswish);
}

template <int V>
__attribute__((target(NPU_AVX512F))) void ChannelColumns(int64_t K, const float* at, int64_t lda, const float* b,
                                                         const int64_t* koff, const int64_t* pin, const int64_t* pout,
                                                         int64_t n_pix, float* c, int64_t ldc, const float* bias,
                                                         const float* clip, const float* hswish) {
  constexpr int kPx = 6;  // 6 x 4 accumulators, 4 of A, 1 of B: 29 of 32 registers
  for (int64_t p = 0; p < n_pix; p += kPx) {
    const int px = static_cast<int>(std::min<int64_t>(kPx, n_pix - p));
    if (p == 0) {
      ChannelTileOf<V, kPx, true>(px, K, at, lda, b, koff, pin + p, pout + p, c, ldc, bias, clip, hswish);
    } else {
      ChannelTileOf<V, kPx, false>(px, K, at, lda, b, koff, pin + p, pout + p, c, ldc, bias, clip, hswish);
    }
  }
}

}  // namespace

// A's rows a multiple of 512 bytes apart, 1 KiB or more (M = 256, 384, 512), map a channel block's K rows onto a
// few cache sets, where they evict each other between the pixel tiles that re-read them: such blocks are copied
// into contiguous panels first (the same values in the same order: the same bits).
inline bool PackPanels(int64_t lda, int64_t n_pix) { return lda >= 256 && lda % 128 == 0 && n_pix > 12; }

__attribute__((target(NPU_AVX512F))) void ChannelGemmAvx512(int64_t M, int64_t K, const float* at, int64_t lda,
                                                            const float* b, const int64_t* koff, const int64_t* pin,
                                                            const int64_t* pout, int64_t n_pix, float* c, int64_t ldc,
                                                            const float* bias, const float* clip, const float* hswish) {
  static thread_local std::vector<float> t_panel;
  const bool pack = PackPanels(lda, n_pix);  // (a tile or two of pixels read A once: no copy)
  for (int64_t m0 = 0; m0 < M; m0 += 64) {
    const int64_t vectors = std::min<int64_t>(4, (M - m0) / 16);
    const float* bm = bias == nullptr ? nullptr : bias + m0;
    float* cm = c + m0 * ldc;
    if (pack) {
      const int64_t width = vectors * 16;
      if (static_cast<int64_t>(t_panel.size()) < K * width) t_panel.resize(K * width);
      float* panel = t_panel.data();
      for (int64_t k = 0; k < K; ++k)
        for (int64_t v = 0; v < vectors; ++v)
          _mm512_storeu_ps(panel + k * width + 16 * v, _mm512_loadu_ps(at + k * lda + m0 + 16 * v));
      if (vectors == 4) ChannelColumns<4>(K, panel, width, b, koff, pin, pout, n_pix, cm, ldc, bm, clip, hswish);
      if (vectors == 3) ChannelColumns<3>(K, panel, width, b, koff, pin, pout, n_pix, cm, ldc, bm, clip, hswish);
      if (vectors == 2) ChannelColumns<2>(K, panel, width, b, koff, pin, pout, n_pix, cm, ldc, bm, clip, hswish);
      if (vectors == 1) ChannelColumns<1>(K, panel, width, b, koff, pin, pout, n_pix, cm, ldc, bm, clip, hswish);
      continue;
    }
    if (vectors == 4) ChannelColumns<4>(K, at + m0, lda, b, koff, pin, pout, n_pix, cm, ldc, bm, clip, hswish);
    if (vectors == 3) ChannelColumns<3>(K, at + m0, lda, b, koff, pin, pout, n_pix, cm, ldc, bm, clip, hswish);
    if (vectors == 2) ChannelColumns<2>(K, at + m0, lda, b, koff, pin, pout, n_pix, cm, ldc, bm, clip, hswish);
    if (vectors == 1) ChannelColumns<1>(K, at + m0, lda, b, koff, pin, pout, n_pix, cm, ldc, bm, clip, hswish);
  }
}

// The rows in 16-column masked moves, the pads' zeros from the masks, which are the same for every row: made once.
// One call for all of a plane's rows, where a memcpy call per row of a few dozen floats costs more than its copy
// (small maps: 10x10 in YOLO's necks).
__attribute__((target(NPU_AVX512F))) void PaddedRowsAvx512(const float* plane, int64_t H, int64_t W, int64_t ih0,
                                                           int64_t rows, int64_t pl, int64_t wq, float* dst) {
  constexpr int kMaxVectors = 4;  // wq <= 64
  __mmask16 in[kMaxVectors], out[kMaxVectors];
  const int vectors = static_cast<int>((wq + 15) / 16);
  for (int i = 0; i < vectors; ++i) {
    // lanes l with 0 <= 16i + l - pl < W read the row; the others (masked off: no access) are zeros
    const int64_t q = 16 * i, lo = std::clamp<int64_t>(pl - q, 0, 16), hi = std::clamp<int64_t>(pl + W - q, 0, 16);
    in[i] = static_cast<__mmask16>(Lanes(static_cast<int>(hi)) & ~Lanes(static_cast<int>(lo)));
    out[i] = Lanes(static_cast<int>(std::min<int64_t>(16, wq - q)));
  }
  for (int64_t r = 0; r < rows; ++r, dst += wq) {
    const int64_t ih = ih0 + r;
    if (ih < 0 || ih >= H) {
      for (int i = 0; i < vectors; ++i) _mm512_mask_storeu_ps(dst + 16 * i, out[i], _mm512_setzero_ps());
      continue;
    }
    const float* row = plane + ih * W - pl;
    for (int i = 0; i < vectors; ++i)
      _mm512_mask_storeu_ps(dst + 16 * i, out[i], _mm512_maskz_loadu_ps(in[i], row + 16 * i));
  }
}

// even[q] = src[2q], odd[q] = src[2q + 1] for q < n: a padded input row split into a stride-2 conv's column
// phases, 16 of each from 32 loaded floats. The caller splits an input plane's rows in memory order, a few hundred
// bytes each, too short for the hardware prefetchers (between pixel blocks the GEMM has evicted the input): the
// row two ahead (about 4n floats on) is fetched while this one is split.
__attribute__((target(NPU_AVX512F))) void EvenOddAvx512(const float* src, int64_t n, float* even, float* odd) {
  const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
  int64_t q = 0;
  for (; q + 16 <= n; q += 16) {  // whole vectors: no masks to make
    _mm_prefetch(reinterpret_cast<const char*>(src + 2 * q + 4 * n), _MM_HINT_T0);  // never faults
    _mm_prefetch(reinterpret_cast<const char*>(src + 2 * q + 16 + 4 * n), _MM_HINT_T0);
    const __m512 lo = _mm512_loadu_ps(src + 2 * q), hi = _mm512_loadu_ps(src + 2 * q + 16);
    _mm512_storeu_ps(even + q, _mm512_permutex2var_ps(lo, ev, hi));
    _mm512_storeu_ps(odd + q, _mm512_permutex2var_ps(lo, od, hi));
  }
  for (; q < n; q += 16) {  // the last, short one
    const int64_t left = 2 * (n - q);  // source floats from src + 2q on
    const __mmask16 k0 = Lanes(static_cast<int>(std::min<int64_t>(left, 16)));
    const __mmask16 k1 = Lanes(static_cast<int>(std::clamp<int64_t>(left - 16, 0, 16)));
    const __mmask16 k = Lanes(static_cast<int>(std::min<int64_t>(n - q, 16)));
    _mm_prefetch(reinterpret_cast<const char*>(src + 2 * q + 4 * n), _MM_HINT_T0);  // never faults
    _mm_prefetch(reinterpret_cast<const char*>(src + 2 * q + 16 + 4 * n), _MM_HINT_T0);
    const __m512 lo = _mm512_maskz_loadu_ps(k0, src + 2 * q), hi = _mm512_maskz_loadu_ps(k1, src + 2 * q + 16);
    _mm512_mask_storeu_ps(even + q, k, _mm512_permutex2var_ps(lo, ev, hi));
    _mm512_mask_storeu_ps(odd + q, k, _mm512_permutex2var_ps(lo, od, hi));
  }
}

}  // namespace npu_ep::kern

#endif
