// Native MaxPool and AveragePool: one task per (image, channel) plane. Float32 on AVX-512 (besides the 2x2 / 2
// register kernel and MaxPool of unit strides, which runs separably: rows' window maxima, then columns of them): 16
// outputs of a row per step, each window row's input span in registers (WindowBlocks), or tap
// by tap where the span is wider than three registers. Float32 on AVX2: 8 outputs per step, the 2x2 / 2 kernel in
// registers, MaxPool of unit strides and AveragePool separably, other MaxPools by rows then columns (the row maximum
// padded with `low`, so each column tap is a plain load). Bytes from AVX2 on the same way, 32 per step (AVX-512: only
// the 2x2 / 2 kernel). At the portable level per output row the window's input rows are folded into a row maximum,
// then each output takes the maximum of its columns. A NaN anywhere in the window wins, as numpy's max. A padded tap
// holds `low` (-FLT_MAX for float, as MLAS pads; the lowest value for bytes): a window of -inf values gives -inf, or
// -FLT_MAX where it reaches the padding, as ORT and the reference model. AveragePool adds the taps in the reference's
// order (pool.h): window-row sums, then their sum; below AVX-512 separably, each input row's sums once. Float16 planes
// are widened to float32 (exact), pooled by the float32 plane kernels and rounded once. The bits do not depend on the
// thread count.
#include "pool.h"

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <vector>

#include "conv_geometry.h"
#include "cpu.h"
#include "half.h"
#include "pairwise_sum.h"
#include "thread_pool.h"

#include "intrinsics.h"

namespace npu_ep::kern {
namespace {

// A NaN, once taken, stays: NaN > v and v > NaN are both false.
inline float Max(float m, float v) { return v > m || v != v ? v : m; }
inline uint8_t Max(uint8_t m, uint8_t v) { return v > m ? v : m; }

// The row pass (contiguous, the bulk of the work): acc[w] = Max(acc[w], row[w]).
void RowMaxScalar(float* acc, const float* row, int64_t n) {
  for (int64_t w = 0; w < n; ++w) acc[w] = Max(acc[w], row[w]);
}

#if NPU_EP_X86
// Max(v, w) lanewise with the scalar Max's rule (a NaN in w wins, a NaN in v stays, equal values keep v):
// vmaxps(w, v) is w > v ? w : v, NaN-free lanes and a NaN in v already right; a NaN in w is put back.
__attribute__((target("avx512f"))) inline __m512 MaxLanes(__m512 v, __m512 w) {
  return _mm512_mask_mov_ps(_mm512_max_ps(w, v), _mm512_cmp_ps_mask(w, w, _CMP_UNORD_Q), w);
}

// Lanes [0, n) of a vector (n clipped to [0, 16]).
inline __mmask16 Lanes16(int64_t n) { return static_cast<__mmask16>(n >= 16 ? 0xFFFF : n <= 0 ? 0 : (1u << n) - 1); }

// 16 outputs of a 2-wide, stride-2 window from the 32 values a:b: Max(Max(start, a:b[2o]), a:b[2o + 1]).
__attribute__((target("avx512f"))) inline __m512 PairMax(__m512 a, __m512 b, __m512 start) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  return MaxLanes(MaxLanes(start, _mm512_permutex2var_ps(a, even, b)), _mm512_permutex2var_ps(a, odd, b));
}

// 32 outputs of the same window on (flipped) bytes: max(v[2o], v[2o + 1]).
__attribute__((target("avx512f,avx512bw"))) inline __m256i PairMaxBytes(__m512i v) {
  const __m512i m = _mm512_max_epu16(_mm512_and_si512(v, _mm512_set1_epi16(0x00FF)), _mm512_srli_epi16(v, 8));
  return _mm512_cvtepi16_epi8(m);
}

__attribute__((target("avx512f"))) void RowMaxAvx512(float* acc, const float* row, int64_t n) {
  for (int64_t w = 0; w < n; w += 16) {
    const __mmask16 k = Lanes16(n - w);
    _mm512_mask_storeu_ps(acc + w, k, MaxLanes(_mm512_maskz_loadu_ps(k, acc + w), _mm512_maskz_loadu_ps(k, row + w)));
  }
}
#endif

void RowMax(float* acc, const float* row, int64_t n) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) return RowMaxAvx512(acc, row, n);
#endif
  RowMaxScalar(acc, row, n);
}

}  // namespace

namespace {

// Bytes compare as uint8; int8 is stored with its sign bit flipped (an order-preserving map) and flipped back.
void RowMaxBytesScalar(uint8_t* acc, const uint8_t* row, int64_t n, uint8_t flip) {
  for (int64_t w = 0; w < n; ++w) acc[w] = std::max<uint8_t>(acc[w], row[w] ^ flip);
}

#if NPU_EP_X86
// The first n (<= 16) of 16 taps at stride sw from p (p[l * sw], lane l): a load at stride 1, two loads and a
// permute at 2, a gather otherwise; lanes from n on are 0 and read nothing.
__attribute__((target("avx512f"))) inline __m512 StridedTaps(const float* p, int64_t sw, int64_t n) {
  const __mmask16 k = Lanes16(n);
  if (sw == 1) return _mm512_maskz_loadu_ps(k, p);
  if (sw == 2) {
    const int64_t span = 2 * n - 1;  // values p[0 .. 2n - 2]
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    return _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(Lanes16(span), p), even,
                                  _mm512_maskz_loadu_ps(Lanes16(span - 16), p + 16));
  }
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32(static_cast<int32_t>(sw)));
  return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), k, idx, p, 4);
}

#endif

#if NPU_EP_X86
// The usual 2x2 window at stride 2, no pads, wholly inside the plane: both input rows and both columns of 16
// outputs in registers, the row-then-column pass's operations in its order (no row-maximum buffer).
__attribute__((target("avx512f"))) void Pool2x2Avx512(const PoolShape& s, const float* in, float start, float* out) {
  const __m512 startv = _mm512_set1_ps(start);
  for (int64_t oh = 0; oh < s.OH; ++oh) {
    const float* r0 = in + 2 * oh * s.W;
    const float* r1 = r0 + s.W;
    for (int64_t o = 0; o < s.OW; o += 16) {
      const int64_t left = 2 * (s.OW - o);
      const __mmask16 k0 = Lanes16(left), k1 = Lanes16(left - 16);
      const __m512 a =
          MaxLanes(MaxLanes(startv, _mm512_maskz_loadu_ps(k0, r0 + 2 * o)), _mm512_maskz_loadu_ps(k0, r1 + 2 * o));
      const __m512 b = MaxLanes(MaxLanes(startv, _mm512_maskz_loadu_ps(k1, r0 + 2 * o + 16)),
                                _mm512_maskz_loadu_ps(k1, r1 + 2 * o + 16));
      _mm512_mask_storeu_ps(out + oh * s.OW + o, Lanes16(s.OW - o), PairMax(a, b, startv));
    }
  }
}
#endif

#if NPU_EP_X86
// The same 2x2 window for (flipped) bytes, 32 outputs per step: both rows' bytes folded, then the column pairs
// (the lowest value 0 drops out, as in the row-then-column pass), flipped back as stored.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void Pool2x2BytesAvx512(const PoolShape& s, const uint8_t* in,
                                                                             uint8_t flip, uint8_t* out) {
  const __m512i f = _mm512_set1_epi8(static_cast<char>(flip));
  for (int64_t oh = 0; oh < s.OH; ++oh) {
    const uint8_t* r0 = in + 2 * oh * s.W;
    const uint8_t* r1 = r0 + s.W;
    for (int64_t o = 0; o < s.OW; o += 32) {
      const int64_t left = 2 * (s.OW - o);
      const __mmask64 k = left >= 64 ? ~__mmask64{0} : (__mmask64{1} << left) - 1;
      const __m512i v = _mm512_max_epu8(_mm512_xor_si512(_mm512_maskz_loadu_epi8(k, r0 + 2 * o), f),
                                        _mm512_xor_si512(_mm512_maskz_loadu_epi8(k, r1 + 2 * o), f));
      const __mmask32 ko = s.OW - o >= 32 ? ~__mmask32{0} : (__mmask32{1} << (s.OW - o)) - 1;
      _mm256_mask_storeu_epi8(out + oh * s.OW + o, ko, _mm256_xor_si256(PairMaxBytes(v), _mm512_castsi512_si256(f)));
    }
  }
}
#endif

#if NPU_EP_X86
// One output of a window pooled tap by tap (rows i, then columns j), a tap outside the input holding `pad`: a sum
// (kSum: each window row summed from its first tap on, then the row sums from the first row on: pool.h's order) or
// the maximum from -inf (a NaN wins).
template <bool kSum>
float WindowTaps(const PoolShape& s, const float* in, float pad, int64_t oh, int64_t ow) {
  float acc = kSum ? 0.0f : -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < s.kh; ++i) {
    const int64_t ih = oh * s.sh - s.pt + i * s.dh;
    float row = 0.0f;
    for (int64_t j = 0; j < s.kw; ++j) {
      const int64_t iw = ow * s.sw - s.pl + j * s.dw;
      const float v = ih >= 0 && ih < s.H && iw >= 0 && iw < s.W ? in[ih * s.W + iw] : pad;
      if (!kSum)
        acc = Max(acc, v);
      else
        row = j == 0 ? v : row + v;
    }
    if (kSum) acc = i == 0 ? row : acc + row;
  }
  return acc;
}

// The input columns 16 outputs' windows span; up to kRegisterSpan of them are held in three registers.
constexpr int64_t kRegisterSpan = 48;
inline int64_t BlockSpan(const PoolShape& s) { return 15 * s.sw + (s.kw - 1) * s.dw + 1; }

// Lanes of 16 input columns from column c on that lie inside [0, W) (the others hold the pad value).
inline __mmask16 InsideLanes(int64_t c, int64_t W) {
  const int64_t lo = std::clamp<int64_t>(-c, 0, 16), hi = std::clamp<int64_t>(W - c, 0, 16);
  return static_cast<__mmask16>(Lanes16(hi) & ~Lanes16(lo));
}

// Where window column j's taps of 16 outputs lie in a 48-value span v0:v1:v2: q = j dw + l sw for lane l.
struct TapIndex {
  __m512i q, q_minus_16;
  __mmask16 in_v2;  // lanes with q >= 32
};

__attribute__((target("avx512f"))) inline TapIndex TapIndexOf(int64_t j, const PoolShape& s) {
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i q = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(j * s.dw)),
                                     _mm512_mullo_epi32(lanes, _mm512_set1_epi32(static_cast<int32_t>(s.sw))));
  return {q, _mm512_sub_epi32(q, _mm512_set1_epi32(16)), _mm512_cmpge_epi32_mask(q, _mm512_set1_epi32(32))};
}

// The 16 taps of one window column from the span v0:v1:v2 (one or two permutes).
__attribute__((target("avx512f"))) inline __m512 SpanTaps(__m512 v0, __m512 v1, __m512 v2, const TapIndex& t) {
  const __m512 r = _mm512_permutex2var_ps(v0, t.q, v1);
  return t.in_v2 ? _mm512_mask_mov_ps(r, t.in_v2, _mm512_permutex2var_ps(v1, t.q_minus_16, v2)) : r;
}

// kB blocks of 16 outputs of row oh from output column o on (up to four independent chains of additions or maxima
// in flight), each window's input span (at most kRegisterSpan columns) in three registers, read once per
// window row; a tap outside the input holds padv. Sums (kSum) add the taps in WindowTaps' order (row sums, then
// columns, from the first tap on): its bits. Maxima fold the rows first, then the columns: the same maximum in
// another order (a NaN wins).
template <bool kSum, int kB>
__attribute__((target("avx512f"), always_inline)) inline void WindowBlocks(const PoolShape& s, const float* in,
                                                                           __m512 padv, const TapIndex* taps,
                                                                           bool third, int64_t oh, int64_t o,
                                                                           float* out) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t c[kB];
  __mmask16 k[kB][3];
  __m512 acc[kB], v[kB][3];
#pragma GCC unroll 4
  for (int b = 0; b < kB; ++b) {
    c[b] = (o + 16 * b) * s.sw - s.pl;
    k[b][0] = InsideLanes(c[b], s.W), k[b][1] = InsideLanes(c[b] + 16, s.W);
    k[b][2] = third ? InsideLanes(c[b] + 32, s.W) : 0;
    acc[b] = v[b][0] = v[b][1] = v[b][2] = ninf;
  }
  for (int64_t i = 0; i < s.kh; ++i) {
    const int64_t ih = oh * s.sh - s.pt + i * s.dh;
    const bool inside = ih >= 0 && ih < s.H;
    __m512 r[kB][3];
#pragma GCC unroll 4
    for (int b = 0; b < kB; ++b) {
      const float* row = in + ih * s.W + c[b];  // masked loads: nothing read outside the row
      r[b][0] = inside ? _mm512_mask_loadu_ps(padv, k[b][0], row) : padv;
      r[b][1] = inside ? _mm512_mask_loadu_ps(padv, k[b][1], row + 16) : padv;
      r[b][2] = inside && third ? _mm512_mask_loadu_ps(padv, k[b][2], row + 32) : padv;
      if (!kSum)
        v[b][0] = MaxLanes(v[b][0], r[b][0]), v[b][1] = MaxLanes(v[b][1], r[b][1]),
        v[b][2] = MaxLanes(v[b][2], r[b][2]);
    }
    if (!kSum) continue;
    __m512 row[kB];
    for (int64_t j = 0; j < s.kw; ++j) {
#pragma GCC unroll 4
      for (int b = 0; b < kB; ++b) {
        const __m512 t = SpanTaps(r[b][0], r[b][1], r[b][2], taps[j]);
        row[b] = j == 0 ? t : _mm512_add_ps(row[b], t);
      }
    }
#pragma GCC unroll 4
    for (int b = 0; b < kB; ++b) acc[b] = i == 0 ? row[b] : _mm512_add_ps(acc[b], row[b]);
  }
  for (int64_t j = 0; !kSum && j < s.kw; ++j) {
#pragma GCC unroll 4
    for (int b = 0; b < kB; ++b) acc[b] = MaxLanes(acc[b], SpanTaps(v[b][0], v[b][1], v[b][2], taps[j]));
  }
#pragma GCC unroll 4
  for (int b = 0; b < kB; ++b) _mm512_mask_storeu_ps(out + oh * s.OW + o + 16 * b, Lanes16(s.OW - o - 16 * b), acc[b]);
}

// A plane pooled by WindowBlocks, up to four blocks of a row at a time.
template <bool kSum>
__attribute__((target("avx512f"))) void RegisterWindowsAvx512(const PoolShape& s, const float* in, float pad,
                                                              float* out) {
  TapIndex taps[kRegisterSpan];
  for (int64_t j = 0; j < s.kw; ++j) taps[j] = TapIndexOf(j, s);
  const bool third = BlockSpan(s) > 32;
  const __m512 padv = _mm512_set1_ps(pad);
  for (int64_t oh = 0; oh < s.OH; ++oh)
    for (int64_t o = 0; o < s.OW; o += 64) {
      const int64_t left = s.OW - o;
      if (left > 48)
        WindowBlocks<kSum, 4>(s, in, padv, taps, third, oh, o, out);
      else if (left > 32)
        WindowBlocks<kSum, 3>(s, in, padv, taps, third, oh, o, out);
      else if (left > 16)
        WindowBlocks<kSum, 2>(s, in, padv, taps, third, oh, o, out);
      else
        WindowBlocks<kSum, 1>(s, in, padv, taps, third, oh, o, out);
    }
}

// A plane pooled window by window, 16 outputs of a row per step with the taps loaded straight from the input rows
// (StridedTaps: any stride and dilation), in WindowTaps' order and with its values; the outputs whose windows
// cross the left or right edge take WindowTaps itself. A window row outside the input folds in `pad` per tap.
template <bool kSum>
__attribute__((target("avx512f"))) void WindowPlaneAvx512(const PoolShape& s, const float* in, float pad, float* out) {
  const conv_detail::Span first = conv_detail::Valid(-s.pl, s.sw, s.W, s.OW);
  const conv_detail::Span last = conv_detail::Valid((s.kw - 1) * s.dw - s.pl, s.sw, s.W, s.OW);
  const int64_t lo = std::max(first.lo, last.lo), hi = std::max(lo, std::min(first.hi, last.hi));
  const __m512 padv = _mm512_set1_ps(pad), start = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t oh = 0; oh < s.OH; ++oh) {
    float* dst = out + oh * s.OW;
    for (int64_t ow = 0; ow < lo; ++ow) dst[ow] = WindowTaps<kSum>(s, in, pad, oh, ow);
    for (int64_t ow = hi; ow < s.OW; ++ow) dst[ow] = WindowTaps<kSum>(s, in, pad, oh, ow);
    for (int64_t o = lo; o < hi; o += 16) {
      const int64_t n = std::min<int64_t>(16, hi - o);
      __m512 acc = start;
      for (int64_t i = 0; i < s.kh; ++i) {
        const int64_t ih = oh * s.sh - s.pt + i * s.dh;
        const float* row = ih >= 0 && ih < s.H ? in + ih * s.W + o * s.sw - s.pl : nullptr;
        __m512 sum = padv;
        for (int64_t j = 0; j < s.kw; ++j) {
          const __m512 v = row ? StridedTaps(row + j * s.dw, s.sw, n) : padv;
          if (!kSum)
            acc = MaxLanes(acc, v);
          else
            sum = j == 0 ? v : _mm512_add_ps(sum, v);
        }
        if (kSum) acc = i == 0 ? sum : _mm512_add_ps(acc, sum);
      }
      _mm512_mask_storeu_ps(dst + o, Lanes16(n), acc);
    }
  }
}

// Whether a plane of n floats holds a NaN.
__attribute__((target("avx512f"))) bool HasNan(const float* in, int64_t n) {
  __mmask16 nan = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(Lanes16(n - i), in + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  }
  return nan != 0;
}

// The maximum of two vectors: vmaxps alone where the plane holds no NaN, else MaxLanes (a NaN wins).
template <bool kNan>
__attribute__((target("avx512f"), always_inline)) inline __m512 MaxOf(__m512 acc, __m512 v) {
  return kNan ? MaxLanes(acc, v) : _mm512_max_ps(v, acc);
}

// A max pool of unit strides, separably: each input row's window-row maxima (16 outputs per step, a tap outside the
// row holding `pad`) into a buffer of H rows, then each output the maximum of its window's rows there (`pad` once
// where the window leaves the input). The same maximum as the window's taps in any order (a NaN wins); kw + kh
// operations per 16 outputs instead of the register kernel's kh spans and kw permutes.
constexpr size_t kKeptBuffer = size_t{1} << 20;  // floats of row results a thread keeps between calls

// The window rows i of output row oh (unit row stride) that lie inside the input: [lo, hi).
inline conv_detail::Span InsideRows(const PoolShape& s, int64_t oh) {
  int64_t lo = 0, hi = s.kh;
  while (lo < hi && oh - s.pt + lo * s.dh < 0) ++lo;
  while (hi > lo && oh - s.pt + (hi - 1) * s.dh >= s.H) --hi;
  return {lo, hi};
}

// The separable pools' per-thread row buffer (H rows of the output width rounded up to 16) and per-tap column masks
// ([block][j]: the lanes of tap j's 16 columns inside the row); a huge plane's buffer is not kept past the call.
class SeparableRows {
 public:
  explicit SeparableRows(const PoolShape& s) : stride((s.OW + 15) / 16 * 16), blocks(stride / 16) {
    buffer_.resize(static_cast<size_t>(s.H * stride));
    masks_.resize(static_cast<size_t>(blocks * s.kw));
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t j = 0; j < s.kw; ++j) masks_[b * s.kw + j] = InsideLanes(16 * b - s.pl + j * s.dw, s.W);
    rows = buffer_.data();
    mask = masks_.data();
  }
  ~SeparableRows() {
    if (buffer_.size() > kKeptBuffer) std::vector<float>().swap(buffer_);
  }
  SeparableRows(const SeparableRows&) = delete;
  SeparableRows& operator=(const SeparableRows&) = delete;

  const int64_t stride, blocks;
  float* rows = nullptr;
  const __mmask16* mask = nullptr;

 private:
  static thread_local std::vector<float> buffer_;
  static thread_local std::vector<__mmask16> masks_;
};
thread_local std::vector<float> SeparableRows::buffer_;
thread_local std::vector<__mmask16> SeparableRows::masks_;

template <bool kNan>
__attribute__((target("avx512f"))) void SeparableMaxAvx512(const PoolShape& s, const float* in, float pad, float* out) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), padv = _mm512_set1_ps(pad);
  const SeparableRows sep(s);
  const int64_t stride = sep.stride, blocks = sep.blocks;
  float* rows = sep.rows;
  const __mmask16* mask = sep.mask;
  for (int64_t ih = 0; ih < s.H; ++ih) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* taps = in + ih * s.W + 16 * b - s.pl;  // masked loads: nothing read outside the row
      __m512 acc = ninf;
      for (int64_t j = 0; j < s.kw; ++j)
        acc = MaxOf<kNan>(acc, _mm512_mask_loadu_ps(padv, mask[b * s.kw + j], taps + j * s.dw));
      _mm512_storeu_ps(rows + ih * stride + 16 * b, acc);
    }
  }
  for (int64_t oh = 0; oh < s.OH; ++oh) {
    const conv_detail::Span inside = InsideRows(s, oh);  // window rows i in [lo, hi) lie inside the input
    const int64_t lo = inside.lo, hi = inside.hi;
    const bool padded = lo > 0 || hi < s.kh;
    const float* first = rows + (oh - s.pt + lo * s.dh) * stride;
    for (int64_t o = 0; o < s.OW; o += 16) {
      __m512 acc = padded ? padv : ninf;
      for (int64_t i = 0; i < hi - lo; ++i) acc = MaxOf<kNan>(acc, _mm512_loadu_ps(first + i * s.dh * stride + o));
      _mm512_mask_storeu_ps(out + oh * s.OW + o, Lanes16(s.OW - o), acc);
    }
  }
}

// An average pool of unit strides, separably in the reference's order: each input row's window-row sums (taps from
// the first on, 0.0 outside the row) into a buffer as SeparableMaxAvx512's, then per output the window's row sums
// from the first row on (a row outside the input sums to 0.0), divided by the divisor.
__attribute__((target("avx512f"))) void SeparableAvgAvx512(const PoolShape& s, const float* in, const float* divisor,
                                                           float* out) {
  const SeparableRows sep(s);
  const int64_t stride = sep.stride, blocks = sep.blocks;
  float* rows = sep.rows;
  const __mmask16* mask = sep.mask;
  for (int64_t ih = 0; ih < s.H; ++ih) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* taps = in + ih * s.W + 16 * b - s.pl;  // masked loads: nothing read outside the row
      __m512 acc = _mm512_maskz_loadu_ps(mask[b * s.kw], taps);
      for (int64_t j = 1; j < s.kw; ++j)
        acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(mask[b * s.kw + j], taps + j * s.dw));
      _mm512_storeu_ps(rows + ih * stride + 16 * b, acc);
    }
  }
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t oh = 0; oh < s.OH; ++oh) {
    for (int64_t o = 0; o < s.OW; o += 16) {
      __m512 acc = zero;
      for (int64_t i = 0; i < s.kh; ++i) {
        const int64_t ih = oh - s.pt + i * s.dh;
        const __m512 r = ih >= 0 && ih < s.H ? _mm512_loadu_ps(rows + ih * stride + o) : zero;
        acc = i == 0 ? r : _mm512_add_ps(acc, r);
      }
      const __mmask16 k = Lanes16(s.OW - o);
      const __m512 d = _mm512_mask_loadu_ps(_mm512_set1_ps(1.0f), k, divisor + oh * s.OW + o);
      _mm512_mask_storeu_ps(out + oh * s.OW + o, k, _mm512_div_ps(acc, d));
    }
  }
}

void SeparableMax(const PoolShape& s, const float* in, float pad, float* out) {
  if (HasNan(in, s.H * s.W)) return SeparableMaxAvx512<true>(s, in, pad, out);
  SeparableMaxAvx512<false>(s, in, pad, out);
}

// A plane through RegisterWindowsAvx512 where the windows' span fits its registers, else WindowPlaneAvx512.
template <bool kSum>
void PoolPlaneAvx512(const PoolShape& s, const float* in, float pad, float* out) {
  if (BlockSpan(s) <= kRegisterSpan) return RegisterWindowsAvx512<kSum>(s, in, pad, out);
  WindowPlaneAvx512<kSum>(s, in, pad, out);
}

// y[i] /= divisor[i]: one correctly rounded division each, as the scalar pass.
__attribute__((target("avx512f"))) void DivideAvx512(float* y, const float* divisor, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = Lanes16(n - i);
    _mm512_mask_storeu_ps(
        y + i, k,
        _mm512_div_ps(_mm512_maskz_loadu_ps(k, y + i), _mm512_mask_loadu_ps(_mm512_set1_ps(1.0f), k, divisor + i)));
  }
}
#endif

// One plane of a max pool for every element type: RowPass(acc, row) folds an input row; ColPass(dst, rowmax)
// writes an output row and returns true where it has a fast path for the geometry (else the scalar pass runs).
// Maxima start at `start` (the type's -inf, or its lowest value); a padded tap folds in `low`.
template <typename T, typename RowPass, typename ColPass>
void MaxPoolRows(const PoolShape& s, const T* in, T start, T low, T* out, RowPass row_pass, ColPass col_pass) {
  std::vector<T> rowmax(s.W);
  for (int64_t oh = 0; oh < s.OH; ++oh) {
    // rows of the window first (whole input rows, in tap order), then the columns of each output
    std::fill(rowmax.begin(), rowmax.end(), start);
    bool padded_row = false;
    for (int64_t i = 0; i < s.kh; ++i) {
      const int64_t ih = oh * s.sh - s.pt + i * s.dh;
      if (ih >= 0 && ih < s.H)
        row_pass(rowmax.data(), in + ih * s.W);
      else
        padded_row = true;
    }
    if (padded_row)
      for (T& v : rowmax) v = Max(v, low);
    T* dst = out + oh * s.OW;
    if (col_pass(dst, rowmax.data())) continue;
    for (int64_t ow = 0; ow < s.OW; ++ow) {
      T m = start;
      for (int64_t j = 0; j < s.kw; ++j) {
        const int64_t iw = ow * s.sw - s.pl + j * s.dw;
        m = Max(m, iw >= 0 && iw < s.W ? rowmax[iw] : low);
      }
      dst[ow] = m;
    }
  }
}

// MaxPoolRows over every plane, one task per plane.
template <typename T, typename RowPass, typename ColPass>
void MaxPoolPlanes(const PoolShape& s, const T* x, T start, T low, T* y, int threads, RowPass row_pass,
                   ColPass col_pass) {
  conv_detail::ParallelItems(threads, s.N * s.C, s.OH * s.OW * s.kh * s.kw, [&](int64_t plane) {
    MaxPoolRows<T>(s, x + plane * s.H * s.W, start, low, y + plane * s.OH * s.OW, row_pass, col_pass);
  });
}

}  // namespace

// 2-wide, stride-2 windows wholly inside each row.
static bool Pairs(const PoolShape& s) { return s.kw == 2 && s.sw == 2 && s.dw == 1 && s.pl == 0 && 2 * s.OW <= s.W; }

// The same on a host with the AVX-512 column pass.
static bool VectorPairs(const PoolShape& s) {
#if NPU_EP_X86
  return Pairs(s) && ActiveIsa() >= Isa::kAvx512;
#else
  (void)s;
  return false;
#endif
}

// The usual 2x2 window at stride 2, no pads, wholly inside the plane.
static bool Window2x2(const PoolShape& s) {
  return Pairs(s) && s.kh == 2 && s.sh == 2 && s.dh == 1 && s.pt == 0 && 2 * s.OH <= s.H;
}

// The same on AVX-512: the register kernels above.
static bool Pool2x2(const PoolShape& s) { return VectorPairs(s) && Window2x2(s); }

// Any window on a host with the AVX-512 window kernel (WindowPlaneAvx512).
static bool VectorWindows() {
#if NPU_EP_X86
  return ActiveIsa() >= Isa::kAvx512;
#else
  return false;
#endif
}

namespace {

#if NPU_EP_X86
// The AVX2 float32 kernels (8 lanes; hosts below AVX-512): the same values and NaN rule as the scalar passes.

// Lanes [0, n) of 8 (n clipped to [0, 8]), as a maskload / maskstore mask.
__attribute__((target("avx2"))) inline __m256i Lanes8(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(std::clamp<int64_t>(n, 0, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// MaxLanes' rule in 8 lanes: vmaxps(w, v), a NaN in w put back.
__attribute__((target("avx2"))) inline __m256 MaxLanes8(__m256 v, __m256 w) {
  return _mm256_blendv_ps(_mm256_max_ps(w, v), w, _mm256_cmp_ps(w, w, _CMP_UNORD_Q));
}

// The divisors of lanes k from d, 1.0 in the others (their quotients are not stored).
__attribute__((target("avx2"))) inline __m256 DivisorTail8(const float* d, __m256i k) {
  return _mm256_blendv_ps(_mm256_set1_ps(1.0f), _mm256_maskload_ps(d, k), _mm256_castsi256_ps(k));
}

// The even values of a:b, or the odd ones, in one shuffle: a0 a2 b0 b2 a4 a6 b4 b6 (lanes 0 1 4 5 2 3 6 7 of the
// deinterleaved row). Lanewise operations do not care; InOrder8 puts the result in order once.
template <bool kOdd>
__attribute__((target("avx2"))) inline __m256 EvenOdd8(__m256 a, __m256 b) {
  return kOdd ? _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)) : _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
}

__attribute__((target("avx2"))) inline __m256 InOrder8(__m256 v) {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v), _MM_SHUFFLE(3, 1, 2, 0)));
}

// 8 taps at stride kSw from p (p[l kSw], lane l): a load at stride 1, two loads and a shuffle at 2 (reading
// p[0, 16): one value past the last tap; lanes in EvenOdd8's order), a gather at `idx` (l sw) for kSw 0 (any stride).
template <int kSw>
__attribute__((target("avx2"), always_inline)) inline __m256 StridedTaps8(const float* p, __m256i idx) {
  if (kSw == 1) return _mm256_loadu_ps(p);
  if (kSw == 2) return EvenOdd8<false>(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8));
  return _mm256_i32gather_ps(p, idx, 4);
}

// StridedTaps8's lanes (or a lanewise result of them) in order.
template <int kSw>
__attribute__((target("avx2"), always_inline)) inline __m256 TapsInOrder8(__m256 v) {
  return kSw == 2 ? InOrder8(v) : v;
}

// The kSw of StridedTaps8 for stride sw.
inline int TapKind8(int64_t sw) { return sw == 1 || sw == 2 ? static_cast<int>(sw) : 0; }

// The input columns StridedTaps8 reads past the last tap.
inline int64_t OverRead8(int64_t sw) { return sw == 2 ? 1 : 0; }

__attribute__((target("avx2"))) inline __m256i TapStrides8(int64_t sw) {
  return _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(static_cast<int32_t>(sw)));
}

// acc[w] = Max(acc[w], row[w]) (RowMaxScalar), 8 at a time.
__attribute__((target("avx2"))) void RowMaxAvx2(float* acc, const float* row, int64_t n) {
  int64_t w = 0;
  for (; w + 8 <= n; w += 8) _mm256_storeu_ps(acc + w, MaxLanes8(_mm256_loadu_ps(acc + w), _mm256_loadu_ps(row + w)));
  if (w == n) return;
  const __m256i k = Lanes8(n - w);
  _mm256_maskstore_ps(acc + w, k, MaxLanes8(_mm256_maskload_ps(acc + w, k), _mm256_maskload_ps(row + w, k)));
}

// The 2x2 window at stride 2 (Window2x2), 8 outputs per step from both input rows' 16 columns in registers, even and
// odd columns split by shuffles: maxima (a NaN wins) or (kSum) (r0[2o] + r0[2o + 1]) + (r1[2o] + r1[2o + 1]) /
// divisor, the separable pass's operations in its order.
template <bool kSum>
__attribute__((target("avx2"))) void Pool2x2Avx2(const PoolShape& s, const float* in, const float* divisor,
                                                 float* out) {
  for (int64_t oh = 0; oh < s.OH; ++oh) {
    const float* r0 = in + 2 * oh * s.W;
    const float* r1 = r0 + s.W;
    for (int64_t o = 0; o < s.OW; o += 8) {
      const bool whole = o + 8 <= s.OW;
      const __m256i k0 = Lanes8(2 * (s.OW - o)), k1 = Lanes8(2 * (s.OW - o) - 8), ko = Lanes8(s.OW - o);
      const __m256 a0 = whole ? _mm256_loadu_ps(r0 + 2 * o) : _mm256_maskload_ps(r0 + 2 * o, k0);
      const __m256 a1 = whole ? _mm256_loadu_ps(r0 + 2 * o + 8) : _mm256_maskload_ps(r0 + 2 * o + 8, k1);
      const __m256 b0 = whole ? _mm256_loadu_ps(r1 + 2 * o) : _mm256_maskload_ps(r1 + 2 * o, k0);
      const __m256 b1 = whole ? _mm256_loadu_ps(r1 + 2 * o + 8) : _mm256_maskload_ps(r1 + 2 * o + 8, k1);
      __m256 v;
      if (kSum) {
        const __m256 ra = _mm256_add_ps(EvenOdd8<false>(a0, a1), EvenOdd8<true>(a0, a1));
        const __m256 rb = _mm256_add_ps(EvenOdd8<false>(b0, b1), EvenOdd8<true>(b0, b1));
        const float* d = divisor + oh * s.OW + o;
        const __m256 dv = whole ? _mm256_loadu_ps(d) : DivisorTail8(d, ko);
        v = _mm256_div_ps(InOrder8(_mm256_add_ps(ra, rb)), dv);
      } else {
        const __m256 a = MaxLanes8(a0, b0), b = MaxLanes8(a1, b1);  // Max(-inf, x) is x
        v = InOrder8(MaxLanes8(EvenOdd8<false>(a, b), EvenOdd8<true>(a, b)));
      }
      if (whole)
        _mm256_storeu_ps(out + oh * s.OW + o, v);
      else
        _mm256_maskstore_ps(out + oh * s.OW + o, ko, v);
    }
  }
}

// Lanes l of 8 with column c + l sw inside [0, W), as a maskload / gather mask.
__attribute__((target("avx2"))) inline __m256i InsideLanes8(int64_t c, int64_t W, __m256i steps) {
  const __m256i col = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(c)), steps);
  return _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_setzero_si256(), col),
                             _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(W)), col));
}

// StridedTaps8 from input column c of a row of W values, a tap outside the row 0.0 (masked loads and gathers: nothing
// read outside the row).
template <int kSw>
__attribute__((target("avx2"), always_inline)) inline __m256 RowTaps8(const float* row, int64_t c, int64_t W,
                                                                      __m256i idx) {
  const __m256i ones = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  if (kSw == 1) return _mm256_maskload_ps(row + c, InsideLanes8(c, W, ones));
  if (kSw == 2)
    return EvenOdd8<false>(_mm256_maskload_ps(row + c, InsideLanes8(c, W, ones)),
                           _mm256_maskload_ps(row + c + 8, InsideLanes8(c + 8, W, ones)));
  return _mm256_mask_i32gather_ps(_mm256_setzero_ps(), row + c, idx, _mm256_castsi256_ps(InsideLanes8(c, W, idx)), 4);
}

// 8 consecutive taps from input column c of a row of W values, a tap outside the row `padv`.
__attribute__((target("avx2"), always_inline)) inline __m256 PaddedTaps8(const float* row, int64_t c, int64_t W,
                                                                         __m256 padv) {
  const __m256i k = InsideLanes8(c, W, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_blendv_ps(padv, _mm256_maskload_ps(row + c, k), _mm256_castsi256_ps(k));
}

// One output row of MaxPoolRows' column pass from the row maximum (columns outside the input holding `low`).
template <int kSw>
__attribute__((target("avx2"))) void MaxColumnsAvx2(const PoolShape& s, const float* rowmax, float* dst) {
  const __m256i idx = TapStrides8(s.sw);
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t o = 0; o < s.OW; o += 8) {
    const float* p = rowmax + o * s.sw - s.pl;
    __m256 acc = ninf;
    for (int64_t j = 0; j < s.kw; ++j) acc = MaxLanes8(acc, StridedTaps8<kSw>(p + j * s.dw, idx));
    acc = TapsInOrder8<kSw>(acc);
    if (o + 8 <= s.OW)
      _mm256_storeu_ps(dst + o, acc);
    else
      _mm256_maskstore_ps(dst + o, Lanes8(s.OW - o), acc);
  }
}

// A max pool plane as MaxPoolRows (each output row's window rows folded into a row maximum, then each output the
// maximum of its columns there), 8 outputs per step: the row maximum sits in a buffer whose columns outside the
// input hold `low`, so every tap of the column pass is a plain load (StridedTaps8).
__attribute__((target("avx2"))) void MaxPlaneAvx2(const PoolShape& s, const float* in, float low, float* out) {
  thread_local std::vector<float> buf;
  const int64_t ow8 = (s.OW + 7) / 8 * 8, left = std::max<int64_t>(s.pl, 0);
  const int64_t reach = (ow8 - 1) * s.sw - s.pl + (s.kw - 1) * s.dw + 1 + OverRead8(s.sw);  // columns read
  buf.assign(static_cast<size_t>(left + std::max(s.W + 8, reach)), low);
  float* rowmax = buf.data() + left;  // input column iw at rowmax[iw]
  const __m256 lowv = _mm256_set1_ps(low);
  const int kind = TapKind8(s.sw);
  for (int64_t oh = 0; oh < s.OH; ++oh) {
    bool first = true, padded_row = false;
    for (int64_t i = 0; i < s.kh; ++i) {
      const int64_t ih = oh * s.sh - s.pt + i * s.dh;
      if (ih < 0 || ih >= s.H)
        padded_row = true;
      else if (first)
        std::copy(in + ih * s.W, in + (ih + 1) * s.W, rowmax), first = false;  // Max(-inf, v) is v
      else
        RowMaxAvx2(rowmax, in + ih * s.W, s.W);
    }
    if (first)
      std::fill(rowmax, rowmax + s.W, low);
    else if (padded_row)
      for (int64_t w = 0; w < s.W; w += 8) {
        const __m256 v = MaxLanes8(_mm256_loadu_ps(rowmax + w), lowv);  // the buffer holds 8 columns past W
        if (w + 8 <= s.W)
          _mm256_storeu_ps(rowmax + w, v);
        else
          _mm256_maskstore_ps(rowmax + w, Lanes8(s.W - w), v);
      }
    float* dst = out + oh * s.OW;
    if (kind == 1)
      MaxColumnsAvx2<1>(s, rowmax, dst);
    else if (kind == 2)
      MaxColumnsAvx2<2>(s, rowmax, dst);
    else
      MaxColumnsAvx2<0>(s, rowmax, dst);
  }
}

// A max pool of unit strides separably (as SeparableMaxAvx512): each input row's window-row maxima, 8 per step (a tap
// outside the row `low`), into a buffer of H rows, then each output the maximum of its window's rows there (`low`
// once where the window leaves the input).
__attribute__((target("avx2"))) void SeparableMaxAvx2(const PoolShape& s, const float* in, float low, float* out) {
  thread_local std::vector<float> buffer;
  const int64_t pitch = (s.OW + 7) / 8 * 8, span = 8 + (s.kw - 1) * s.dw;  // columns a block reads
  buffer.resize(static_cast<size_t>(s.H * pitch));
  float* rows = buffer.data();
  const __m256 lowv = _mm256_set1_ps(low);
  for (int64_t ih = 0; ih < s.H; ++ih) {
    const float* row = in + ih * s.W;
    for (int64_t o = 0; o < s.OW; o += 8) {
      const int64_t c = o - s.pl;
      __m256 acc;
      if (c >= 0 && c + span <= s.W) {
        acc = _mm256_loadu_ps(row + c);
        for (int64_t j = 1; j < s.kw; ++j) acc = MaxLanes8(acc, _mm256_loadu_ps(row + c + j * s.dw));
      } else {
        acc = PaddedTaps8(row, c, s.W, lowv);
        for (int64_t j = 1; j < s.kw; ++j) acc = MaxLanes8(acc, PaddedTaps8(row, c + j * s.dw, s.W, lowv));
      }
      _mm256_storeu_ps(rows + ih * pitch + o, acc);
    }
  }
  for (int64_t oh = 0; oh < s.OH; ++oh) {
    const conv_detail::Span inside = InsideRows(s, oh);  // window rows i in [lo, hi) lie inside the input
    const int64_t lo = inside.lo, hi = inside.hi;
    const bool padded = lo > 0 || hi < s.kh;
    const float* first = rows + (oh - s.pt + lo * s.dh) * pitch;
    for (int64_t o = 0; o < s.OW; o += 8) {
      __m256 acc = padded ? lowv : _mm256_set1_ps(-std::numeric_limits<float>::infinity());
      for (int64_t i = 0; i < hi - lo; ++i) acc = MaxLanes8(acc, _mm256_loadu_ps(first + i * s.dh * pitch + o));
      if (o + 8 <= s.OW)
        _mm256_storeu_ps(out + oh * s.OW + o, acc);
      else
        _mm256_maskstore_ps(out + oh * s.OW + o, Lanes8(s.OW - o), acc);
    }
  }
  if (buffer.size() > kKeptBuffer) std::vector<float>().swap(buffer);  // a huge plane's rows are not kept
}
#endif

#if NPU_EP_X86
// The AVX2 byte kernels: 32 flipped bytes (x ^ flip, uint8 order) per step, max_epu8; results flipped back as stored.
// Bytes have no masked loads or stores here: a row's last partial block redoes the last whole 32 (a maximum is
// idempotent); rows under 32 take two overlapping blocks of 16 or 8, under 8 one by one (or a stack buffer).

// dst[w] = the maximum of rows[i][w] over i in [0, count) (count >= 1), flipped (^ flip), for w in [0, n): int8
// (kSigned) compared signed, flipped to uint8 order once. The rows are folded in registers, each block stored once
// (folding into dst in memory reloads the overlapping tail's stores: a store-forwarding stall per block).
template <bool kSigned>
__attribute__((target("avx2"))) void RowsMaxBytesAvx2(uint8_t* dst, const uint8_t* const* rows, int64_t count,
                                                      int64_t n) {
  const uint8_t flip = kSigned ? 0x80 : 0x00;
  if (n < 8) {
    for (int64_t w = 0; w < n; ++w) {
      uint8_t m = rows[0][w] ^ flip;
      for (int64_t i = 1; i < count; ++i) m = std::max<uint8_t>(m, rows[i][w] ^ flip);
      dst[w] = m;
    }
    return;
  }
  if (n < 16) {
    const __m128i f = _mm_set1_epi8(static_cast<char>(flip));
    for (const int64_t w : {int64_t{0}, n - 8}) {
      __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(rows[0] + w));
      for (int64_t i = 1; i < count; ++i) {
        const __m128i r = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(rows[i] + w));
        v = kSigned ? _mm_max_epi8(v, r) : _mm_max_epu8(v, r);
      }
      _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + w), _mm_xor_si128(v, f));
    }
    return;
  }
  if (n < 32) {
    const __m128i f = _mm_set1_epi8(static_cast<char>(flip));
    for (const int64_t w : {int64_t{0}, n - 16}) {
      __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[0] + w));
      for (int64_t i = 1; i < count; ++i) {
        const __m128i r = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[i] + w));
        v = kSigned ? _mm_max_epi8(v, r) : _mm_max_epu8(v, r);
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + w), _mm_xor_si128(v, f));
    }
    return;
  }
  const __m256i f = _mm256_set1_epi8(static_cast<char>(flip));
  for (int64_t w = 0;; w += 32) {
    w = std::min(w, n - 32);
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[0] + w));
    for (int64_t i = 1; i < count; ++i) {
      const __m256i r = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[i] + w));
      v = kSigned ? _mm256_max_epi8(v, r) : _mm256_max_epu8(v, r);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + w), _mm256_xor_si256(v, f));
    if (w + 32 >= n) return;
  }
}

// Out[l] = max(e[2l], o[2l + 1]) for the 64 bytes e0:e1 and o0:o1, l in [0, 32), in order: 16-bit lanes' low and
// high bytes, packed back (per 128-bit half) and the halves' quarters put in order.
__attribute__((target("avx2"))) inline __m256i EvenOddMaxBytes(__m256i e0, __m256i e1, __m256i o0, __m256i o1) {
  const __m256i low = _mm256_set1_epi16(0x00FF);
  const __m256i a = _mm256_max_epu16(_mm256_and_si256(e0, low), _mm256_srli_epi16(o0, 8));
  const __m256i b = _mm256_max_epu16(_mm256_and_si256(e1, low), _mm256_srli_epi16(o1, 8));
  return _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), _MM_SHUFFLE(3, 1, 2, 0));
}

__attribute__((target("avx2"))) inline __m256i LoadBytes(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// 32 outputs of the column pass from p (input column o sw - pl of a row maximum): the maximum of taps p[l kSw + j dw]
// over j. At stride 2 the taps at even offsets are folded bytewise on loads from p + j dw, the odd ones on loads from
// p + j dw - 1 (their taps then in the odd bytes), and the two split once; p[0, 64 + (kw - 1) dw) is read.
template <int kSw>
__attribute__((target("avx2"), always_inline)) inline __m256i ColumnBlockBytes(const PoolShape& s, const uint8_t* p) {
  if (kSw == 1) {
    __m256i acc = LoadBytes(p);
    for (int64_t j = 1; j < s.kw; ++j) acc = _mm256_max_epu8(acc, LoadBytes(p + j * s.dw));
    return acc;
  }
  __m256i e0 = _mm256_setzero_si256(), e1 = e0, o0 = e0, o1 = e0;  // 0: the lowest value drops out
  for (int64_t j = 0; j < s.kw; ++j) {
    const int64_t d = j * s.dw;
    if (d % 2 == 0)
      e0 = _mm256_max_epu8(e0, LoadBytes(p + d)), e1 = _mm256_max_epu8(e1, LoadBytes(p + d + 32));
    else
      o0 = _mm256_max_epu8(o0, LoadBytes(p + d - 1)), o1 = _mm256_max_epu8(o1, LoadBytes(p + d + 31));
  }
  return EvenOddMaxBytes(e0, e1, o0, o1);
}

// One output row of the column pass (strides 1 and 2; others one output at a time) from a row maximum whose columns
// outside the input hold 0, every block's reads inside the buffer; stored flipped back.
template <int kSw>
__attribute__((target("avx2"))) void MaxColumnsBytesAvx2(const PoolShape& s, const uint8_t* rowmax, uint8_t flip,
                                                         uint8_t* dst) {
  if (kSw == 0) {
    for (int64_t ow = 0; ow < s.OW; ++ow) {
      const uint8_t* p = rowmax + ow * s.sw - s.pl;
      uint8_t m = p[0];
      for (int64_t j = 1; j < s.kw; ++j) m = std::max(m, p[j * s.dw]);
      dst[ow] = m ^ flip;
    }
    return;
  }
  const __m256i f = _mm256_set1_epi8(static_cast<char>(flip));
  if (s.OW < 32) {  // two overlapping 16 or 8 of the blocks' outputs, or one block through a stack buffer
    const int64_t part = s.OW >= 16 ? 16 : s.OW >= 8 ? 8 : 0;
    if (part == 0) {
      alignas(32) uint8_t tmp[32];
      _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), _mm256_xor_si256(ColumnBlockBytes<kSw>(s, rowmax - s.pl), f));
      for (int64_t o = 0; o < s.OW; ++o) dst[o] = tmp[o];
      return;
    }
    for (const int64_t o : {int64_t{0}, s.OW - part}) {
      const __m128i v = _mm256_castsi256_si128(_mm256_xor_si256(ColumnBlockBytes<kSw>(s, rowmax + o * kSw - s.pl), f));
      if (part == 16)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + o), v);
      else
        _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + o), v);
    }
    return;
  }
  for (int64_t o = 0;; o += 32) {
    o = std::min(o, s.OW - 32);
    const __m256i v = ColumnBlockBytes<kSw>(s, rowmax + o * kSw - s.pl);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + o), _mm256_xor_si256(v, f));
    if (o + 32 >= s.OW) return;
  }
}

// A byte max pool plane as MaxPoolRows (each output row's window rows folded into a row maximum, then each output the
// maximum of its columns there), 32 outputs per step; the row maxima sit in a buffer whose columns outside the
// input hold 0 (the padding's value, flipped), so every column tap is a plain load. A padded window row adds 0:
// nothing. Four output rows' maxima are written before their columns are read (a column load right after the row
// pass's stores waits for them: it spans two).
__attribute__((target("avx2"))) void MaxPlaneBytesAvx2(const PoolShape& s, const uint8_t* in, uint8_t flip,
                                                       uint8_t* out) {
  constexpr int64_t kBatch = 4;
  thread_local std::vector<uint8_t> buf;
  const int64_t left = std::max<int64_t>(s.pl, 0), blocks = std::max<int64_t>(s.OW, 32);
  const int64_t reach = (blocks - 1) * s.sw - s.pl + (s.kw - 1) * s.dw + 1 + (s.sw == 2 ? 1 : 0);  // columns read
  const int64_t pitch = left + std::max(s.W, reach);
  buf.assign(static_cast<size_t>(kBatch * pitch), 0);
  thread_local std::vector<const uint8_t*> rows;
  rows.resize(static_cast<size_t>(s.kh));
  for (int64_t oh0 = 0; oh0 < s.OH; oh0 += kBatch) {
    const int64_t n = std::min(kBatch, s.OH - oh0);
    for (int64_t b = 0; b < n; ++b) {
      uint8_t* rowmax = buf.data() + b * pitch + left;  // input column iw at rowmax[iw]
      int64_t count = 0;
      for (int64_t i = 0; i < s.kh; ++i) {
        const int64_t ih = (oh0 + b) * s.sh - s.pt + i * s.dh;
        if (ih >= 0 && ih < s.H) rows[count++] = in + ih * s.W;
      }
      if (count == 0)
        std::fill(rowmax, rowmax + s.W, uint8_t{0});
      else if (flip)
        RowsMaxBytesAvx2<true>(rowmax, rows.data(), count, s.W);
      else
        RowsMaxBytesAvx2<false>(rowmax, rows.data(), count, s.W);
    }
    for (int64_t b = 0; b < n; ++b) {
      const uint8_t* rowmax = buf.data() + b * pitch + left;
      uint8_t* dst = out + (oh0 + b) * s.OW;
      if (s.sw == 1)
        MaxColumnsBytesAvx2<1>(s, rowmax, flip, dst);
      else if (s.sw == 2)
        MaxColumnsBytesAvx2<2>(s, rowmax, flip, dst);
      else
        MaxColumnsBytesAvx2<0>(s, rowmax, flip, dst);
    }
  }
  if (buf.size() > kKeptBuffer) std::vector<uint8_t>().swap(buf);
}

// 32 outputs of the 2x2 / 2 window from 64 bytes of rows r0 and r1, flipped back.
__attribute__((target("avx2"))) inline __m256i Block2x2Bytes(const uint8_t* r0, const uint8_t* r1, __m256i f) {
  const __m256i a = _mm256_max_epu8(_mm256_xor_si256(LoadBytes(r0), f), _mm256_xor_si256(LoadBytes(r1), f));
  const __m256i b = _mm256_max_epu8(_mm256_xor_si256(LoadBytes(r0 + 32), f), _mm256_xor_si256(LoadBytes(r1 + 32), f));
  return _mm256_xor_si256(EvenOddMaxBytes(a, b, a, b), f);
}

// The 2x2 window at stride 2 (Window2x2) on bytes: both input rows' 64 bytes folded, then the column pairs, 32
// outputs per step; rows under 32 outputs through a stack buffer.
__attribute__((target("avx2"))) void Pool2x2BytesAvx2(const PoolShape& s, const uint8_t* in, uint8_t flip,
                                                      uint8_t* out) {
  if (s.OW < 8 && s.W == 2 * s.OW) {  // small rows: the row pairs' maxima end to end, then their column pairs at once
    thread_local std::vector<uint8_t> buf;
    PoolShape flat;
    flat.OW = s.OH * s.OW, flat.kw = 2, flat.sw = 2;
    buf.assign(static_cast<size_t>(2 * std::max<int64_t>(flat.OW, 32) + 2), 0);
    for (int64_t oh = 0; oh < s.OH; ++oh) {
      const uint8_t* rows[2] = {in + 2 * oh * s.W, in + (2 * oh + 1) * s.W};
      if (flip)
        RowsMaxBytesAvx2<true>(buf.data() + oh * s.W, rows, 2, s.W);
      else
        RowsMaxBytesAvx2<false>(buf.data() + oh * s.W, rows, 2, s.W);
    }
    return MaxColumnsBytesAvx2<2>(flat, buf.data(), flip, out);
  }
  const __m256i f = _mm256_set1_epi8(static_cast<char>(flip));
  for (int64_t oh = 0; oh < s.OH; ++oh) {
    const uint8_t* r0 = in + 2 * oh * s.W;
    const uint8_t* r1 = r0 + s.W;
    uint8_t* dst = out + oh * s.OW;
    if (s.OW < 32) {  // two overlapping blocks of 16 or 8 outputs (32 or 16 bytes of each row), else scalar
      if (s.OW >= 16) {
        for (const int64_t o : {int64_t{0}, s.OW - 16}) {
          const __m256i a =
              _mm256_max_epu8(_mm256_xor_si256(LoadBytes(r0 + 2 * o), f), _mm256_xor_si256(LoadBytes(r1 + 2 * o), f));
          const __m128i v = _mm256_castsi256_si128(_mm256_xor_si256(EvenOddMaxBytes(a, a, a, a), f));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + o), v);
        }
      } else if (s.OW >= 8) {
        const __m128i f8 = _mm256_castsi256_si128(f), low = _mm_set1_epi16(0x00FF);
        for (const int64_t o : {int64_t{0}, s.OW - 8}) {
          const __m128i a =
              _mm_max_epu8(_mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + 2 * o)), f8),
                           _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r1 + 2 * o)), f8));
          const __m128i w = _mm_max_epu16(_mm_and_si128(a, low), _mm_srli_epi16(a, 8));
          _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + o), _mm_xor_si128(_mm_packus_epi16(w, w), f8));
        }
      } else {
        for (int64_t o = 0; o < s.OW; ++o)
          dst[o] = std::max({static_cast<uint8_t>(r0[2 * o] ^ flip), static_cast<uint8_t>(r0[2 * o + 1] ^ flip),
                             static_cast<uint8_t>(r1[2 * o] ^ flip), static_cast<uint8_t>(r1[2 * o + 1] ^ flip)}) ^
                   flip;
      }
      continue;
    }
    for (int64_t o = 0;; o += 32) {
      o = std::min(o, s.OW - 32);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + o), Block2x2Bytes(r0 + 2 * o, r1 + 2 * o, f));
      if (o + 32 >= s.OW) break;
    }
  }
}
#endif

}  // namespace

// One float32 plane of MaxPool: the 2x2 register kernel, the AVX-512 window kernels, the AVX2
// row-then-column pass, else its scalar form.
static void MaxPlaneFloat(const PoolShape& s, const float* in, float low, float* out) {
  const float start = -std::numeric_limits<float>::infinity();
#if NPU_EP_X86
  if (Pool2x2(s)) return Pool2x2Avx512(s, in, start, out);  // no padding
  if (VectorWindows() && s.sw == 1 && s.sh == 1) return SeparableMax(s, in, low, out);
  if (VectorWindows()) return PoolPlaneAvx512<false>(s, in, low, out);
  if (ActiveIsa() >= Isa::kAvx2 && Window2x2(s)) return Pool2x2Avx2<false>(s, in, nullptr, out);
  if (ActiveIsa() >= Isa::kAvx2 && s.sw == 1 && s.sh == 1) return SeparableMaxAvx2(s, in, low, out);
  if (ActiveIsa() >= Isa::kAvx2) return MaxPlaneAvx2(s, in, low, out);
#endif
  MaxPoolRows<float>(
      s, in, start, low, out, [&](float* acc, const float* row) { RowMax(acc, row, s.W); },
      [](float*, const float*) { return false; });
}

// A float32 pool's planes in tasks of about kFloatTaskWork window taps (ParallelItems' 2^20 per task kept a 128-plane
// 56x56 2x2 pool, 400K taps, on one thread while ORT's CPU EP splits it); threads from 128K taps.
constexpr int64_t kFloatTaskWork = int64_t{1} << 15;

template <typename Fn>
void ForFloatPlanes(const PoolShape& s, int threads, const Fn& plane_fn) {
  const int64_t planes = s.N * s.C, work = planes * s.OH * s.OW * s.kh * s.kw;
  if (planes <= 0) return;
  const int64_t tasks = std::clamp<int64_t>(work / kFloatTaskWork, 1, planes), per = (planes + tasks - 1) / tasks;
  ParallelFor(ThreadsFor(threads, work * 8), (planes + per - 1) / per, [&](int64_t t) {
    for (int64_t plane = t * per; plane < std::min(planes, (t + 1) * per); ++plane) plane_fn(plane);
  });
}

void MaxPoolFloat(const PoolShape& s, const float* x, float low, float* y, int threads) {
  ForFloatPlanes(s, threads,
                 [&](int64_t plane) { MaxPlaneFloat(s, x + plane * s.H * s.W, low, y + plane * s.OH * s.OW); });
}

void MaxPoolBytes(const PoolShape& s, const uint8_t* x, bool is_signed, uint8_t* y, int threads) {
  // computed on flipped bytes for int8 (x ^ 0x80 orders like x), flipped back as stored (the scalar pass: at the end)
  const uint8_t flip = is_signed ? 0x80 : 0x00;
#if NPU_EP_X86
  if (Pool2x2(s)) {  // the vector kernels flip back as they store
    conv_detail::ParallelItems(threads, s.N * s.C, s.OH * s.OW * 4, [&](int64_t plane) {
      Pool2x2BytesAvx512(s, x + plane * s.H * s.W, flip, y + plane * s.OH * s.OW);
    });
    return;
  }
  if (ActiveIsa() >= Isa::kAvx2) {
    const bool two = Window2x2(s);
    conv_detail::ParallelItems(threads, s.N * s.C, s.OH * s.OW * s.kh * s.kw, [&](int64_t plane) {
      const uint8_t* in = x + plane * s.H * s.W;
      uint8_t* out = y + plane * s.OH * s.OW;
      if (two) return Pool2x2BytesAvx2(s, in, flip, out);
      MaxPlaneBytesAvx2(s, in, flip, out);
    });
    return;
  }
#endif
  MaxPoolPlanes<uint8_t>(
      s, x, 0, 0, y, threads, [&](uint8_t* acc, const uint8_t* row) { RowMaxBytesScalar(acc, row, s.W, flip); },
      [](uint8_t*, const uint8_t*) { return false; });
  if (flip)
    for (int64_t i = 0, n = s.N * s.C * s.OH * s.OW; i < n; ++i) y[i] ^= flip;
}

namespace {

// One window-row sum (taps j = 0, 1, ... from the first on; 0.0 outside the input) of output column ow on input
// row `row` (null: a row outside the input).
float RowSumAt(const PoolShape& s, const float* row, int64_t ow) {
  float acc = 0.0f;
  for (int64_t j = 0; j < s.kw; ++j) {
    const int64_t iw = ow * s.sw - s.pl + j * s.dw;
    const float v = row && iw >= 0 && iw < s.W ? row[iw] : 0.0f;
    acc = j == 0 ? v : acc + v;
  }
  return acc;
}

// The output columns [lo, hi) whose window taps all lie inside a row.
conv_detail::Span InteriorColumns(const PoolShape& s) {
  const conv_detail::Span first = conv_detail::Valid(-s.pl, s.sw, s.W, s.OW);
  const conv_detail::Span last = conv_detail::Valid((s.kw - 1) * s.dw - s.pl, s.sw, s.W, s.OW);
  const int64_t lo = std::max(first.lo, last.lo);
  return {lo, std::max(lo, std::min(first.hi, last.hi))};
}

#if NPU_EP_X86
// RowSums of an input row for all OW outputs and up to 7 past them, 8 per step, each window row's taps added from the
// first on (RowSumAt's operations): blocks whose reads lie inside the row by StridedTaps8, the others by RowTaps8.
template <int kSw>
__attribute__((target("avx2"))) void RowSumsAvx2(const PoolShape& s, const float* row, float* sums) {
  const __m256i idx = TapStrides8(s.sw);
  const int64_t span = 7 * s.sw + (s.kw - 1) * s.dw + 1 + OverRead8(s.sw);  // columns a block reads
  for (int64_t ow = 0; ow < s.OW; ow += 8) {
    const int64_t c = ow * s.sw - s.pl;
    __m256 acc;
    if (c >= 0 && c + span <= s.W) {
      acc = StridedTaps8<kSw>(row + c, idx);
      for (int64_t j = 1; j < s.kw; ++j) acc = _mm256_add_ps(acc, StridedTaps8<kSw>(row + c + j * s.dw, idx));
    } else {
      acc = RowTaps8<kSw>(row, c, s.W, idx);
      for (int64_t j = 1; j < s.kw; ++j) acc = _mm256_add_ps(acc, RowTaps8<kSw>(row, c + j * s.dw, s.W, idx));
    }
    acc = TapsInOrder8<kSw>(acc);
    _mm256_storeu_ps(sums + ow, acc);
  }
}

// ColumnSums 8 outputs at a time (the tail masked).
__attribute__((target("avx2"))) void ColumnSumsAvx2(const float* const* rows, int64_t kh, const float* divisor,
                                                    int64_t n, float* out) {
  for (int64_t o = 0; o < n; o += 8) {
    if (o + 8 <= n) {
      __m256 acc = _mm256_loadu_ps(rows[0] + o);
      for (int64_t i = 1; i < kh; ++i) acc = _mm256_add_ps(acc, _mm256_loadu_ps(rows[i] + o));
      _mm256_storeu_ps(out + o, _mm256_div_ps(acc, _mm256_loadu_ps(divisor + o)));
      continue;
    }
    const __m256i k = Lanes8(n - o);
    __m256 acc = _mm256_maskload_ps(rows[0] + o, k);
    for (int64_t i = 1; i < kh; ++i) acc = _mm256_add_ps(acc, _mm256_maskload_ps(rows[i] + o, k));
    _mm256_maskstore_ps(out + o, k, _mm256_div_ps(acc, DivisorTail8(divisor + o, k)));
  }
}
#endif

// The window-row sums of one input row for every output column (row null: a row outside the input); `inner`:
// InteriorColumns(s). On AVX2 sums[OW, OW rounded up to 8) are written too.
void RowSums(const PoolShape& s, const float* row, conv_detail::Span inner, float* sums) {
#if NPU_EP_X86
  if (row && ActiveIsa() >= Isa::kAvx2) {
    if (s.sw == 1) return RowSumsAvx2<1>(s, row, sums);
    if (s.sw == 2) return RowSumsAvx2<2>(s, row, sums);
    return RowSumsAvx2<0>(s, row, sums);
  }
#endif
  const int64_t lo = row ? inner.lo : s.OW, hi = row ? inner.hi : s.OW;
  for (int64_t ow = 0; ow < lo; ++ow) sums[ow] = RowSumAt(s, row, ow);
  for (int64_t ow = hi; ow < s.OW; ++ow) sums[ow] = RowSumAt(s, row, ow);
  for (int64_t ow = lo; ow < hi; ++ow) {
    const float* p = row + ow * s.sw - s.pl;
    float acc = p[0];
    for (int64_t j = 1; j < s.kw; ++j) acc += p[j * s.dw];
    sums[ow] = acc;
  }
}

// out[o] = the sum of rows[i][o] from the first row on, / divisor[o].
void ColumnSums(const float* const* rows, int64_t kh, const float* divisor, int64_t n, float* out) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx2) return ColumnSumsAvx2(rows, kh, divisor, n, out);
#endif
  for (int64_t o = 0; o < n; ++o) {
    float acc = rows[0][o];
    for (int64_t i = 1; i < kh; ++i) acc += rows[i][o];
    out[o] = acc / divisor[o];
  }
}

}  // namespace

// One float32 plane of AveragePool (hosts below AVX-512), separably in pool.h's order: each input row's window-row sums
// once (a row serves up to kh output rows at stride 1), then per output row its window rows' sums added from the first
// on and divided. Rows outside the input take the sums of 0.0 taps.
static void AvgPlaneSeparable(const PoolShape& s, const float* in, const float* divisor, float* out) {
  struct Buffers {
    std::vector<float> sums;  // [H + 1, pitch]: input row ih's sums, then those of a row outside
    std::vector<char> done;
    std::vector<const float*> rows;
  };
  thread_local Buffers buffers;
  std::vector<float>& sums = buffers.sums;
  std::vector<char>& done = buffers.done;
  std::vector<const float*>& rows = buffers.rows;
  const int64_t pitch = (s.OW + 7) / 8 * 8;
  sums.resize(static_cast<size_t>((s.H + 1) * pitch));
  done.assign(static_cast<size_t>(s.H), 0);
  rows.resize(static_cast<size_t>(s.kh));
  float* outside = sums.data() + s.H * pitch;
  const conv_detail::Span inner = InteriorColumns(s);
  std::fill(outside, outside + s.OW, 0.0f);  // RowSums of a row outside: 0.0f + 0.0f + ... is +0.0f
  for (int64_t oh = 0; oh < s.OH; ++oh) {
    for (int64_t i = 0; i < s.kh; ++i) {
      const int64_t ih = oh * s.sh - s.pt + i * s.dh;
      rows[i] = outside;
      if (ih >= 0 && ih < s.H) {
        rows[i] = sums.data() + ih * pitch;
        if (!done[ih]) RowSums(s, in + ih * s.W, inner, sums.data() + ih * pitch), done[ih] = 1;
      }
    }
    ColumnSums(rows.data(), s.kh, divisor + oh * s.OW, s.OW, out + oh * s.OW);
  }
}

#if NPU_EP_X86
// AvgPlaneSeparable on AVX2 where windows leave no input row unread (sh <= kh): every input row's window-row sums
// (RowSumsAvx2), then per output its window's row sums from the first row on (a row outside the input sums to
// +0.0f), divided.
template <int kSw>
__attribute__((target("avx2"))) void SeparableAvgAvx2(const PoolShape& s, const float* in, const float* divisor,
                                                      float* out) {
  thread_local std::vector<float> buffer;
  const int64_t pitch = (s.OW + 7) / 8 * 8;
  buffer.resize(static_cast<size_t>(s.H * pitch));
  float* rows = buffer.data();
  for (int64_t ih = 0; ih < s.H; ++ih) RowSumsAvx2<kSw>(s, in + ih * s.W, rows + ih * pitch);
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t oh = 0; oh < s.OH; ++oh) {
    const float* d = divisor + oh * s.OW;
    float* dst = out + oh * s.OW;
    for (int64_t o = 0; o < s.OW; o += 8) {
      __m256 acc = zero;
      for (int64_t i = 0; i < s.kh; ++i) {
        const int64_t ih = oh * s.sh - s.pt + i * s.dh;
        const __m256 r = ih >= 0 && ih < s.H ? _mm256_loadu_ps(rows + ih * pitch + o) : zero;
        acc = i == 0 ? r : _mm256_add_ps(acc, r);
      }
      if (o + 8 <= s.OW) {
        _mm256_storeu_ps(dst + o, _mm256_div_ps(acc, _mm256_loadu_ps(d + o)));
      } else {
        const __m256i k = Lanes8(s.OW - o);
        _mm256_maskstore_ps(dst + o, k, _mm256_div_ps(acc, DivisorTail8(d + o, k)));
      }
    }
  }
  if (buffer.size() > kKeptBuffer) std::vector<float>().swap(buffer);  // a huge plane's rows are not kept
}

// AveragePool's 2x2 window at stride 2, no pads (Pool2x2): 16 outputs per step from both input rows in registers,
// each row's even and odd columns split by permutes; (r0[2o] + r0[2o + 1]) + (r1[2o] + r1[2o + 1]), / divisor: the
// separable pass's operations in its order, so its bits.
__attribute__((target("avx512f"))) void AvgPool2x2Avx512(const PoolShape& s, const float* in, const float* divisor,
                                                         float* out) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (int64_t oh = 0; oh < s.OH; ++oh) {
    const float* r0 = in + 2 * oh * s.W;
    const float* r1 = r0 + s.W;
    for (int64_t o = 0; o < s.OW; o += 16) {
      const int64_t left = 2 * (s.OW - o);
      const __mmask16 k0 = Lanes16(left), k1 = Lanes16(left - 16), ko = Lanes16(s.OW - o);
      const __m512 a0 = _mm512_maskz_loadu_ps(k0, r0 + 2 * o), a1 = _mm512_maskz_loadu_ps(k1, r0 + 2 * o + 16);
      const __m512 b0 = _mm512_maskz_loadu_ps(k0, r1 + 2 * o), b1 = _mm512_maskz_loadu_ps(k1, r1 + 2 * o + 16);
      const __m512 ra = _mm512_add_ps(_mm512_permutex2var_ps(a0, even, a1), _mm512_permutex2var_ps(a0, odd, a1));
      const __m512 rb = _mm512_add_ps(_mm512_permutex2var_ps(b0, even, b1), _mm512_permutex2var_ps(b0, odd, b1));
      const __m512 d = _mm512_mask_loadu_ps(_mm512_set1_ps(1.0f), ko, divisor + oh * s.OW + o);
      _mm512_mask_storeu_ps(out + oh * s.OW + o, ko, _mm512_div_ps(_mm512_add_ps(ra, rb), d));
    }
  }
}
#endif

// One float32 plane of AveragePool: unit strides separably on AVX-512, other windows through the AVX-512 window
// kernels and the division, else separably (below AVX-512).
static void AvgPlaneFloat(const PoolShape& s, const float* in, const float* divisor, float* out) {
#if NPU_EP_X86
  if (Pool2x2(s)) return AvgPool2x2Avx512(s, in, divisor, out);
  if (VectorWindows() && s.sw == 1 && s.sh == 1) return SeparableAvgAvx512(s, in, divisor, out);
  if (VectorWindows()) {
    PoolPlaneAvx512<true>(s, in, 0.0f, out);
    return DivideAvx512(out, divisor, s.OH * s.OW);
  }
  if (ActiveIsa() >= Isa::kAvx2 && Window2x2(s)) return Pool2x2Avx2<true>(s, in, divisor, out);
  if (ActiveIsa() >= Isa::kAvx2 && s.sh <= s.kh) {
    if (s.sw == 1) return SeparableAvgAvx2<1>(s, in, divisor, out);
    if (s.sw == 2) return SeparableAvgAvx2<2>(s, in, divisor, out);
    return SeparableAvgAvx2<0>(s, in, divisor, out);
  }
#endif
  AvgPlaneSeparable(s, in, divisor, out);
}

void AvgPoolFloat(const PoolShape& s, const float* x, const float* divisor, float* y, int threads) {
  ForFloatPlanes(s, threads,
                 [&](int64_t plane) { AvgPlaneFloat(s, x + plane * s.H * s.W, divisor, y + plane * s.OH * s.OW); });
}

constexpr int64_t kHalfChunkElems = 2048;  // input values widened per step (in L1): small planes share one conversion

// A float16 pool: each plane widened to float32 (exact), pooled by the float32 plane kernel, rounded once to
// float16 (the reference's float32 operations, then its astype). The planes split over the threads as
// ParallelItems', a task's planes widened and narrowed a chunk of consecutive planes at a time.
template <typename PlaneFn>
void HalfPlanes(const PoolShape& s, const uint16_t* x, uint16_t* y, int threads, PlaneFn plane_fn) {
  const int64_t planes = s.N * s.C, in_size = s.H * s.W, out_size = s.OH * s.OW;
  if (planes <= 0) return;
  const int64_t per = std::clamp<int64_t>(kMinParallelWork / std::max<int64_t>(out_size * s.kh * s.kw, 1), 1, planes);
  const int64_t tasks = (planes + per - 1) / per;
  const int64_t chunk = std::max<int64_t>(1, kHalfChunkElems / std::max<int64_t>(in_size, 1));
  ParallelFor(tasks > 1 ? threads : 1, tasks, [&](int64_t t) {
    thread_local std::vector<float> in, out;
    const int64_t end = std::min(planes, (t + 1) * per);
    for (int64_t p0 = t * per; p0 < end; p0 += chunk) {
      const int64_t n = std::min(chunk, end - p0);
      in.resize(static_cast<size_t>(n * in_size));
      out.resize(static_cast<size_t>(n * out_size));
      HalfToFloatRow(x + p0 * in_size, in.data(), n * in_size);
      for (int64_t i = 0; i < n; ++i) plane_fn(in.data() + i * in_size, out.data() + i * out_size);
      FloatToHalfRow(out.data(), y + p0 * out_size, n * out_size);
    }
  });
}

void MaxPoolHalf(const PoolShape& s, const uint16_t* x, float low, uint16_t* y, int threads) {
  HalfPlanes(s, x, y, threads, [&](const float* in, float* out) { MaxPlaneFloat(s, in, low, out); });
}

void AvgPoolHalf(const PoolShape& s, const uint16_t* x, const float* divisor, uint16_t* y, int threads) {
  HalfPlanes(s, x, y, threads, [&](const float* in, float* out) { AvgPlaneFloat(s, in, divisor, out); });
}

#if NPU_EP_X86
// The maximum of m and v[0, n) with Max's rule (a NaN wins), 16 lanes at a time.
static __attribute__((target("avx512f"))) float MaxOfRowAvx512(const float* v, int64_t n, float m) {
  __m512 acc = _mm512_set1_ps(m);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = Lanes16(n - i);
    acc = _mm512_mask_mov_ps(acc, k, MaxLanes(acc, _mm512_maskz_loadu_ps(k, v + i)));
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc);
  for (float l : lanes) m = Max(m, l);
  return m;
}
#endif

static float MaxOfRow(const float* v, int64_t n, float m) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) return MaxOfRowAvx512(v, n, m);
#endif
  for (int64_t i = 0; i < n; ++i) m = Max(m, v[i]);
  return m;
}

constexpr int64_t kGlobalTaskElems = 16384;  // a task's channels: at least one, about this many pixels

namespace {

#if NPU_EP_X86
// A leaf of numpy's pairwise sum over a row (pairwise_sum.h): values [off, off + len), len <= 128.
struct SumLeaf {
  int64_t off, len;
};

// The leaves of PairwiseSum's tree over n values from off, in order.
void PairwiseLeaves(int64_t off, int64_t n, std::vector<SumLeaf>& leaves) {
  if (n <= 128) return leaves.push_back({off, n});
  int64_t half = n / 2;
  half -= half % 8;
  PairwiseLeaves(off, half, leaves);
  PairwiseLeaves(off + half, n - half, leaves);
}

// PairwiseSum's combination of its leaves' sums (consumed in order) over n values, for eight rows at once (lane k:
// row k).
__attribute__((target("avx2"))) __m256 PairwiseCombine8(int64_t n, const float*& sums) {
  if (n <= 128) {
    const __m256 s = _mm256_loadu_ps(sums);
    sums += 8;
    return s;
  }
  int64_t half = n / 2;
  half -= half % 8;
  const __m256 a = PairwiseCombine8(half, sums);
  return _mm256_add_ps(a, PairwiseCombine8(n - half, sums));
}

__attribute__((target("avx2,f16c"))) inline __m256 Widen8(const uint16_t* x) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
}

// Value i of eight rows (lane k: row p[k]), widened.
__attribute__((target("avx2,f16c"))) inline __m256 Column8(const uint16_t* const* p, int64_t i) {
  return _mm256_cvtph_ps(_mm_setr_epi16(static_cast<short>(p[0][i]), static_cast<short>(p[1][i]),
                                        static_cast<short>(p[2][i]), static_cast<short>(p[3][i]),
                                        static_cast<short>(p[4][i]), static_cast<short>(p[5][i]),
                                        static_cast<short>(p[6][i]), static_cast<short>(p[7][i])));
}

// Lanes 2j and 2j + 1 of a, b paired: [a0 + a1, a2 + a3, b0 + b1, b2 + b3] per 128-bit half, each sum with its
// even lane first (the scalar code's operand order, which picks a NaN's sign where two meet).
__attribute__((target("avx2"))) inline __m256 PairSums(__m256 a, __m256 b) {
  return _mm256_add_ps(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

// GlobalAvgHalf of rows [r0, r0 + nr), nr <= 8, one row per lane: each leaf's eight running sums per row (eight
// independent chains), folded as PairwiseSum's ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)) across the rows'
// registers, its tail added one by one, the leaves combined by PairwiseSum's tree: every row's own bits.
__attribute__((target("avx2,f16c"))) void GlobalAvgRows8(const uint16_t* x, int64_t r0, int64_t nr, int64_t count,
                                                         const std::vector<SumLeaf>& leaves, float* sums, uint16_t* y) {
  const uint16_t* p[8];
  for (int k = 0; k < 8; ++k) p[k] = x + (r0 + std::min<int64_t>(k, nr - 1)) * count;  // spare lanes repeat a row
  for (size_t l = 0; l < leaves.size(); ++l) {
    const int64_t len = leaves[l].len, full = len - len % 8;
    const uint16_t* q[8];
    for (int k = 0; k < 8; ++k) q[k] = p[k] + leaves[l].off;
    __m256 s = _mm256_set1_ps(-0.0f);  // a leaf under 8 values: one by one from -0.0
    if (len >= 8) {
      __m256 a[8];
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) a[k] = Widen8(q[k]);
      for (int64_t i = 8; i < full; i += 8) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) a[k] = _mm256_add_ps(a[k], Widen8(q[k] + i));
      }
      const __m256 g0 = PairSums(PairSums(a[0], a[1]), PairSums(a[2], a[3]));  // rows 0-3: lows | highs
      const __m256 g1 = PairSums(PairSums(a[4], a[5]), PairSums(a[6], a[7]));
      s = _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
    }
    for (int64_t i = full; i < len; ++i) s = _mm256_add_ps(s, Column8(q, i));
    _mm256_storeu_ps(sums + 8 * l, s);
  }
  const float* next = sums;
  const __m256 total = PairwiseCombine8(count, next);
  alignas(32) float mean[8];
  _mm256_store_ps(mean,
                  _mm256_div_ps(_mm256_add_ps(_mm256_setzero_ps(), total), _mm256_set1_ps(static_cast<float>(count))));
  FloatToHalfRow(mean, y + r0, nr);
}
#endif

}  // namespace

void GlobalAvgHalf(const uint16_t* x, int64_t rows, int64_t count, uint16_t* y, int threads) {
  int64_t per = std::max<int64_t>(1, kGlobalTaskElems / count), tasks = (rows + per - 1) / per;
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx2 && HasF16c()) {
    std::vector<SumLeaf> leaves;  // the same tree for every row
    leaves.reserve(static_cast<size_t>(count / 64 + 2));
    PairwiseLeaves(0, count, leaves);
    per = (per + 7) / 8 * 8, tasks = (rows + per - 1) / per;  // whole groups of 8 rows
    ParallelFor(ThreadsFor(threads, rows * count * 8), tasks, [&](int64_t t) {
      thread_local std::vector<float> sums;  // [leaf][row of 8]
      sums.resize(8 * leaves.size());
      for (int64_t r = t * per; r < std::min(rows, (t + 1) * per); r += 8)
        GlobalAvgRows8(x, r, std::min<int64_t>(8, rows - r), count, leaves, sums.data(), y);
    });
    return;
  }
#endif
  ParallelFor(ThreadsFor(threads, rows * count * 8), tasks, [&](int64_t t) {
    thread_local std::vector<float> row;
    row.resize(static_cast<size_t>(count));
    for (int64_t r = t * per; r < std::min(rows, (t + 1) * per); ++r) {
      HalfToFloatRow(x + r * count, row.data(), count);
      const float mean = (0.0f + PairwiseSum(row.data(), count)) / static_cast<float>(count);
      FloatToHalfRow(&mean, y + r, 1);
    }
  });
}

void GlobalAvgFloat(const float* x, int64_t rows, int64_t count, float* y, int threads) {
  const int64_t per = std::max<int64_t>(1, kGlobalTaskElems / count), tasks = (rows + per - 1) / per;
  ParallelFor(ThreadsFor(threads, rows * count * 8), tasks, [&](int64_t t) {
    for (int64_t r = t * per; r < std::min(rows, (t + 1) * per); ++r)
      y[r] = (0.0f + PairwiseSum(x + r * count, count)) / static_cast<float>(count);
  });
}

#if NPU_EP_X86
// The maximum of float16 row x[0, n) (Max's rule: a NaN wins), widened 16 at a time in registers, two chains.
static __attribute__((target("avx512f,avx512bw,avx512vl"))) float HalfRowMaxAvx512(const uint16_t* x, int64_t n) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 a = ninf, b = ninf;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a = MaxLanes(a, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i))));
    b = MaxLanes(b, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 16))));
  }
  for (; i < n; i += 16) {
    const __mmask16 k = Lanes16(n - i);
    a = _mm512_mask_mov_ps(a, k, MaxLanes(a, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, x + i))));
  }
  alignas(64) float lanes[32];
  _mm512_store_ps(lanes, a);
  _mm512_store_ps(lanes + 16, b);
  float m = -std::numeric_limits<float>::infinity();
  for (float l : lanes) m = Max(m, l);
  return m;
}
#endif

void GlobalMaxHalf(const uint16_t* x, int64_t rows, int64_t count, uint16_t* y, int threads) {
  constexpr int64_t kChunk = 1024;
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) {
    conv_detail::ParallelItems(threads, rows, count, [&](int64_t r) {
      const float m = HalfRowMaxAvx512(x + r * count, count);
      FloatToHalfRow(&m, y + r, 1);
    });
    return;
  }
#endif
  conv_detail::ParallelItems(threads, rows, count, [&](int64_t r) {
    float buf[kChunk];
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < count; c += kChunk) {
      const int64_t n = std::min(kChunk, count - c);
      HalfToFloatRow(x + r * count + c, buf, n);
      m = MaxOfRow(buf, n, m);
    }
    FloatToHalfRow(&m, y + r, 1);
  });
}

}  // namespace npu_ep::kern
