// Native MaxPool / AveragePool of NHWC tensors (pool_nhwc.h). Per output pixel the window's taps are C-contiguous
// vectors: the channels fill the lanes (AVX-512: up to four 16-lane vectors in flight, of one pixel or, up to 32
// channels, of two or four pixels; AVX2: four 8-lane ones; the channel tail masked; portable: channel by channel).
// Each output takes pool.cc's values in its order: a MaxPool folds every tap from -inf, a tap outside the input
// holding `low` (a NaN wins); an AveragePool adds each window row's taps from the first on (0.0f outside the
// input), then the row sums from the first row on, then divides. Where output rows share input rows (stride 1),
// separably: each input row's window-row results once, then each output's column of them (the same operations).
// Tasks are runs of output rows of one image; an output's bits do not depend on its task or the thread count.
#include "pool_nhwc.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "cpu.h"
#include "half.h"
#include "intrinsics.h"
#include "thread_pool.h"

namespace npu_ep::kern {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A NaN, once taken, stays: NaN > v and v > NaN are both false.
inline float Max(float m, float v) { return v > m || v != v ? v : m; }

// A row of OW outputs of C channels, each folding a grid of kh x kw taps: tap (i, j) of output ow at
// rows[i] + cols[ow * kw + j] (rows[i] null or cols[...] -1: outside the input, the tap holds the pad value). The
// direct pool's grid is the window; the separable pool runs two: each input row's window rows (kh = 1), then each
// output's column of those row results (kw = 1).
struct Grid {
  int64_t kh, kw, C, OW;
};

// One output pixel, channel by channel.
template <bool kSum>
void PixelScalar(const Grid& s, const float* const* rows, const int64_t* cols, float pad, float div, float* dst) {
  for (int64_t c = 0; c < s.C; ++c) {
    float acc = kSum ? 0.0f : kNegInf;
    for (int64_t i = 0; i < s.kh; ++i) {
      float row = 0.0f;
      for (int64_t j = 0; j < s.kw; ++j) {
        const float v = rows[i] && cols[j] >= 0 ? rows[i][cols[j] + c] : pad;
        if (kSum)
          row = j == 0 ? v : row + v;
        else
          acc = Max(acc, v);
      }
      if (kSum) acc = i == 0 ? row : acc + row;
    }
    dst[c] = kSum ? acc / div : acc;  // x / 1.0f is x
  }
}

#if NPU_EP_X86
inline __mmask16 Lanes16(int64_t n) { return static_cast<__mmask16>(n >= 16 ? 0xFFFF : n <= 0 ? 0 : (1u << n) - 1); }

// Max(v, w) lanewise with the scalar rule: vmaxps(w, v) is w > v ? w : v; a NaN in w is put back.
__attribute__((target("avx512f"))) inline __m512 MaxLanes(__m512 v, __m512 w) {
  return _mm512_mask_mov_ps(_mm512_max_ps(w, v), _mm512_cmp_ps_mask(w, w, _CMP_UNORD_Q), w);
}

// Channels [c0, c0 + 16 kB) of kP consecutive output pixels (pixel q's taps at cols[q kw + j], its divisor div[q]):
// PixelScalar's operations per lane, kP kB chains in flight. kTail: the last vector's lanes past C are masked (the
// others load and store whole: masked loads cost this host's pools 10-20%).
template <bool kSum, int kB, int kP, bool kTail>
__attribute__((target("avx512f"), always_inline)) inline void ChunkAvx512(const Grid& s, const float* const* rows,
                                                                          const int64_t* cols, __m512 padv,
                                                                          const float* div, int64_t c0, float* dst) {
  __mmask16 k[kB];
  __m512 acc[kP][kB], row[kP][kB];
#pragma GCC unroll 4
  for (int b = 0; b < kB; ++b) k[b] = Lanes16(s.C - c0 - 16 * b);
#pragma GCC unroll 4
  for (int q = 0; q < kP; ++q)
#pragma GCC unroll 4
    for (int b = 0; b < kB; ++b) acc[q][b] = kSum ? _mm512_setzero_ps() : _mm512_set1_ps(kNegInf);
  for (int64_t i = 0; i < s.kh; ++i) {
    for (int64_t j = 0; j < s.kw; ++j) {
#pragma GCC unroll 4
      for (int q = 0; q < kP; ++q) {
        const int64_t col = cols[q * s.kw + j];
        const float* p = rows[i] && col >= 0 ? rows[i] + col + c0 : nullptr;
#pragma GCC unroll 4
        for (int b = 0; b < kB; ++b) {
          const bool whole = !kTail || b + 1 < kB;
          const __m512 v = !p ? padv : whole ? _mm512_loadu_ps(p + 16 * b) : _mm512_maskz_loadu_ps(k[b], p + 16 * b);
          if (kSum)
            row[q][b] = j == 0 ? v : _mm512_add_ps(row[q][b], v);
          else
            acc[q][b] = MaxLanes(acc[q][b], v);
        }
      }
    }
    if (kSum) {
#pragma GCC unroll 4
      for (int q = 0; q < kP; ++q)
#pragma GCC unroll 4
        for (int b = 0; b < kB; ++b) acc[q][b] = i == 0 ? row[q][b] : _mm512_add_ps(acc[q][b], row[q][b]);
    }
  }
#pragma GCC unroll 4
  for (int q = 0; q < kP; ++q)
#pragma GCC unroll 4
    for (int b = 0; b < kB; ++b) {
      const __m512 y = kSum && div ? _mm512_div_ps(acc[q][b], _mm512_set1_ps(div[q])) : acc[q][b];
      if (!kTail || b + 1 < kB)
        _mm512_storeu_ps(dst + q * s.C + c0 + 16 * b, y);
      else
        _mm512_mask_storeu_ps(dst + q * s.C + c0 + 16 * b, k[b], y);
    }
}

// ChunkAvx512 of the channels from c0 on, kB vectors of which the last holds the channel tail (whole or not).
template <bool kSum, int kB, int kP = 1>
__attribute__((target("avx512f"), always_inline)) inline void TailAvx512(const Grid& s, const float* const* rows,
                                                                         const int64_t* cols, __m512 padv,
                                                                         const float* div, int64_t c0, float* dst) {
  if (s.C - c0 == 16 * kB)
    ChunkAvx512<kSum, kB, kP, false>(s, rows, cols, padv, div, c0, dst);
  else
    ChunkAvx512<kSum, kB, kP, true>(s, rows, cols, padv, div, c0, dst);
}

template <bool kSum>
__attribute__((target("avx512f"))) void RowAvx512(const Grid& s, const float* const* rows, const int64_t* cols,
                                                  float pad, const float* divisor, float* dst) {
  const __m512 padv = _mm512_set1_ps(pad);
  int64_t ow = 0;
  // up to 32 channels: pixels in pairs or fours, so four vectors' chains are in flight
  if (s.C <= 16)
    for (; ow + 4 <= s.OW; ow += 4)
      TailAvx512<kSum, 1, 4>(s, rows, cols + ow * s.kw, padv, divisor ? divisor + ow : nullptr, 0, dst + ow * s.C);
  else if (s.C <= 32)
    for (; ow + 2 <= s.OW; ow += 2)
      TailAvx512<kSum, 2, 2>(s, rows, cols + ow * s.kw, padv, divisor ? divisor + ow : nullptr, 0, dst + ow * s.C);
  for (dst += ow * s.C; ow < s.OW; ++ow, dst += s.C) {
    const int64_t* cj = cols + ow * s.kw;
    const float* div = divisor ? divisor + ow : nullptr;
    int64_t c0 = 0;
    for (; c0 + 64 < s.C; c0 += 64) ChunkAvx512<kSum, 4, 1, false>(s, rows, cj, padv, div, c0, dst);
    const int64_t left = s.C - c0;
    if (left > 48)
      TailAvx512<kSum, 4>(s, rows, cj, padv, div, c0, dst);
    else if (left > 32)
      TailAvx512<kSum, 3>(s, rows, cj, padv, div, c0, dst);
    else if (left > 16)
      TailAvx512<kSum, 2>(s, rows, cj, padv, div, c0, dst);
    else if (left > 0)
      TailAvx512<kSum, 1>(s, rows, cj, padv, div, c0, dst);
  }
}

// The same in 8 lanes.
__attribute__((target("avx2"))) inline __m256i Lanes8(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(std::clamp<int64_t>(n, 0, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

__attribute__((target("avx2"))) inline __m256 MaxLanes8(__m256 v, __m256 w) {
  return _mm256_blendv_ps(_mm256_max_ps(w, v), w, _mm256_cmp_ps(w, w, _CMP_UNORD_Q));
}

// kTail: the lanes past C are masked (else whole vectors load and store).
template <bool kSum, int kB, bool kTail = true>
__attribute__((target("avx2"), always_inline)) inline void ChunkAvx2(const Grid& s, const float* const* rows,
                                                                     const int64_t* cols, __m256 padv, const float* div,
                                                                     int64_t c0, float* dst) {
  __m256i k[kB];
  __m256 acc[kB], row[kB];
#pragma GCC unroll 4
  for (int b = 0; b < kB; ++b) {
    k[b] = Lanes8(s.C - c0 - 8 * b);
    acc[b] = kSum ? _mm256_setzero_ps() : _mm256_set1_ps(kNegInf);
  }
  for (int64_t i = 0; i < s.kh; ++i) {
    for (int64_t j = 0; j < s.kw; ++j) {
      const float* p = rows[i] && cols[j] >= 0 ? rows[i] + cols[j] + c0 : nullptr;
#pragma GCC unroll 4
      for (int b = 0; b < kB; ++b) {
        const __m256 v = !p ? padv : kTail ? _mm256_maskload_ps(p + 8 * b, k[b]) : _mm256_loadu_ps(p + 8 * b);
        if (kSum)
          row[b] = j == 0 ? v : _mm256_add_ps(row[b], v);
        else
          acc[b] = MaxLanes8(acc[b], v);
      }
    }
    if (kSum) {
#pragma GCC unroll 4
      for (int b = 0; b < kB; ++b) acc[b] = i == 0 ? row[b] : _mm256_add_ps(acc[b], row[b]);
    }
  }
#pragma GCC unroll 4
  for (int b = 0; b < kB; ++b) {
    const __m256 y = kSum && div ? _mm256_div_ps(acc[b], _mm256_set1_ps(*div)) : acc[b];
    if (kTail)
      _mm256_maskstore_ps(dst + c0 + 8 * b, k[b], y);
    else
      _mm256_storeu_ps(dst + c0 + 8 * b, y);
  }
}

template <bool kSum>
__attribute__((target("avx2"))) void RowAvx2(const Grid& s, const float* const* rows, const int64_t* cols, float pad,
                                             const float* divisor, float* dst) {
  const __m256 padv = _mm256_set1_ps(pad);
  for (int64_t ow = 0; ow < s.OW; ++ow, dst += s.C) {
    const int64_t* cj = cols + ow * s.kw;
    const float* div = divisor ? divisor + ow : nullptr;
    int64_t c0 = 0;
    for (; c0 + 32 <= s.C; c0 += 32) ChunkAvx2<kSum, 4, false>(s, rows, cj, padv, div, c0, dst);
    const int64_t left = s.C - c0;
    if (left > 24)
      ChunkAvx2<kSum, 4>(s, rows, cj, padv, div, c0, dst);
    else if (left > 16)
      ChunkAvx2<kSum, 3>(s, rows, cj, padv, div, c0, dst);
    else if (left > 8)
      ChunkAvx2<kSum, 2>(s, rows, cj, padv, div, c0, dst);
    else if (left > 0)
      ChunkAvx2<kSum, 1>(s, rows, cj, padv, div, c0, dst);
  }
}
#endif

template <bool kSum>
void RowScalar(const Grid& s, const float* const* rows, const int64_t* cols, float pad, const float* divisor,
               float* dst) {
  for (int64_t ow = 0; ow < s.OW; ++ow, dst += s.C)
    PixelScalar<kSum>(s, rows, cols + ow * s.kw, pad, divisor ? divisor[ow] : 1.0f, dst);
}

// One row of a grid's outputs on the widest path the host has (divisor null: no division).
template <bool kSum>
void GridRow(Isa isa, const Grid& g, const float* const* rows, const int64_t* cols, float pad, const float* divisor,
             float* dst) {
#if NPU_EP_X86
  if (isa >= Isa::kAvx512) return RowAvx512<kSum>(g, rows, cols, pad, divisor, dst);
  if (isa >= Isa::kAvx2) return RowAvx2<kSum>(g, rows, cols, pad, divisor, dst);
#endif
  (void)isa;
  RowScalar<kSum>(g, rows, cols, pad, divisor, dst);
}

constexpr int64_t kTaskWork = int64_t{1} << 15;  // window taps (times channels) per task
constexpr size_t kKeptFloats = size_t{1} << 20;  // separable row results a thread keeps between calls

// Whether the pool runs separably (each input row's window-row results once, then each output's column of them):
// kw + kh / sh operations per output channel instead of kh kw, where output rows share input rows.
bool Separable(const PoolShape& s) { return s.kh > 1 && s.sh * s.kw + s.kh < s.kh * s.kw; }

// The pool over tasks of output rows of one image; divisor [OH, OW] for sums.
template <bool kSum>
void PoolRows(const PoolShape& s, const float* x, float pad, const float* divisor, float* y, int threads) {
  if (s.N <= 0 || s.OH <= 0 || s.OW <= 0 || s.C <= 0) return;
  std::vector<int64_t> cols(static_cast<size_t>(s.OW * s.kw));  // [ow][j]: a tap's offset in its row, -1 outside
  for (int64_t ow = 0; ow < s.OW; ++ow)
    for (int64_t j = 0; j < s.kw; ++j) {
      const int64_t iw = ow * s.sw - s.pl + j * s.dw;
      cols[ow * s.kw + j] = iw >= 0 && iw < s.W ? iw * s.C : -1;
    }
  std::vector<int64_t> pixels(static_cast<size_t>(s.OW));  // the separable column pass's: [ow] = ow C
  for (int64_t ow = 0; ow < s.OW; ++ow) pixels[ow] = ow * s.C;
  const bool separable = Separable(s);
  const int64_t work = s.N * s.OH * s.OW * s.C * s.kh * s.kw;
  const int team = ThreadsFor(threads, work * 8);
  // a separable task recomputes the row results its first output rows share with the task before: one per thread
  const int64_t per = separable ? (s.OH + team - 1) / team
                                : std::clamp<int64_t>(s.OH * kTaskWork / std::max<int64_t>(work / s.N, 1), 1, s.OH);
  const int64_t blocks = (s.OH + per - 1) / per;  // tasks per image
  const Isa isa = ActiveIsa();
  ParallelFor(team, s.N * blocks, [&](int64_t t) {
    const int64_t n = t / blocks, oh0 = t % blocks * per, oh1 = std::min(s.OH, oh0 + per);
    const float* img = x + n * s.H * s.W * s.C;
    std::vector<const float*> rows(static_cast<size_t>(s.kh));
    // separably: the window-row results of input rows [lo, hi] (Grid kh = 1), then columns of them (kw = 1)
    thread_local std::vector<float> kept;
    const int64_t lo = std::max<int64_t>(0, oh0 * s.sh - s.pt);
    const int64_t hi = std::min(s.H - 1, (oh1 - 1) * s.sh - s.pt + (s.kh - 1) * s.dh), row_size = s.OW * s.C;
    if (separable && hi >= lo) {
      kept.resize(static_cast<size_t>((hi - lo + 1) * row_size));
      const Grid g{1, s.kw, s.C, s.OW};
      for (int64_t ih = lo; ih <= hi; ++ih) {
        const float* r = img + ih * s.W * s.C;
        GridRow<kSum>(isa, g, &r, cols.data(), pad, nullptr, kept.data() + (ih - lo) * row_size);
      }
    }
    const Grid g = separable ? Grid{s.kh, 1, s.C, s.OW} : Grid{s.kh, s.kw, s.C, s.OW};
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      for (int64_t i = 0; i < s.kh; ++i) {
        const int64_t ih = oh * s.sh - s.pt + i * s.dh;
        rows[i] = ih < 0 || ih >= s.H ? nullptr : separable ? kept.data() + (ih - lo) * row_size : img + ih * s.W * s.C;
      }
      GridRow<kSum>(isa, g, rows.data(), separable ? pixels.data() : cols.data(), pad,
                    kSum ? divisor + oh * s.OW : nullptr, y + (n * s.OH + oh) * row_size);
    }
    if (kept.size() > kKeptFloats) std::vector<float>().swap(kept);
  });
}

// A float16 pool: x widened to float32 (exact), pooled, rounded once.
template <bool kSum>
void PoolRowsHalf(const PoolShape& s, const uint16_t* x, float pad, const float* divisor, uint16_t* y, int threads) {
  const int64_t in_size = s.N * s.H * s.W * s.C, out_size = s.N * s.OH * s.OW * s.C;
  std::vector<float> in(static_cast<size_t>(in_size)), out(static_cast<size_t>(out_size));
  HalfToFloatRow(x, in.data(), in_size);
  PoolRows<kSum>(s, in.data(), pad, divisor, out.data(), threads);
  FloatToHalfRow(out.data(), y, out_size);
}

}  // namespace

void MaxPoolNhwcFloat(const PoolShape& s, const float* x, float low, float* y, int threads) {
  PoolRows<false>(s, x, low, nullptr, y, threads);
}

void AvgPoolNhwcFloat(const PoolShape& s, const float* x, const float* divisor, float* y, int threads) {
  PoolRows<true>(s, x, 0.0f, divisor, y, threads);
}

void MaxPoolNhwcHalf(const PoolShape& s, const uint16_t* x, float low, uint16_t* y, int threads) {
  PoolRowsHalf<false>(s, x, low, nullptr, y, threads);
}

void AvgPoolNhwcHalf(const PoolShape& s, const uint16_t* x, const float* divisor, uint16_t* y, int threads) {
  PoolRowsHalf<true>(s, x, 0.0f, divisor, y, threads);
}

}  // namespace npu_ep::kern
