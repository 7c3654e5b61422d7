// MatMulNBits kernels, one family: fp32 math (accuracy_level 0..3) and int8 A x int4 B (accuracy_level 4).
//
// Layout trick (shared by every ISA path): byte i of a packed B row holds elements 2i (low nibble) and 2i+1
// (high nibble) of the zero-padded K axis, whatever the block size. The row is walked in chunks of 64 bytes; per
// chunk the low nibbles give the even elements and the high nibbles the odd ones. A is re-laid out once per call
// to match ("perm" layout: per chunk, 64 even elements then 64 odd ones), so the kernels never interleave
// nibbles. An int32 lane of a chunk covers 4 bytes = 8 elements, always inside one block (blocks >= 16).
//
// accuracy_level 4, as ORT's CompInt8: per block of A, scale = max|a| / 127, codes = round_half_even(a * (127 /
// max|a|)). The scalar and AVX-512 paths sum each block exactly in int32 (sum(code_a * code_b) - zp *
// sum(code_a)) and accumulate the blocks in order, y = fma(float(dot), scale_a * scale_b, y): the same bits on
// both (the AVX-512 kernels are qnbit_gemv_avx512.cc below 8 rows and qnbit_int8_panel_avx512.cc from 8 on, which
// reads A in natural order). The AVX2 path scales per lane (8 elements) and sums the lanes at the end.
// accuracy_level 0..3: weights dequantized per 8-byte group ((q - zp) * scale, one rounding, like ORT's
// dequantize-then-SGEMM) into a per-column buffer, then float32 dot products.
#include "qnbit_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu.h"
#include "qnbit_gemm_internal.h"
#include "scratch.h"
#include "thread_pool.h"

#include "intrinsics.h"

namespace npu_ep::kern {
namespace {

using nbits::kChunkBytes;
using nbits::kChunkElems;
using nbits::Shape;
using nbits::Column;
using nbits::ColumnOf;
using nbits::Symmetric;
constexpr int64_t kColsPerTask = 16;
constexpr int64_t kInt8PanelCols = 32;  // level 4 on AVX-512: one re-laid-out pass of columns per task
// Below this many rows level 4 runs row by row on the decode kernel: the panel's re-layout of B costs what several
// rows' products do (PERF.md: 2048 x 2048, M = 2 and 4 ran faster row by row, from M = 8 on the panel won).
constexpr int64_t kInt8PanelMinRows = 8;
// From this M on, fp32 levels multiply dequantized column panels (qnbit_panel_avx512.cc on AVX-512, else the BLAS).
constexpr int64_t kSgemmMinRows = 16;
constexpr int64_t kSgemmPanelBytes = 512 << 10;  // float panel per task (columns x kc), L2-sized
constexpr int64_t kSgemmTasks = 4;  // panels a product is cut into at least, so both threads get work
// ...and at most about this many multiply-adds each: ORT's worker joins late (it spun idle for 11-16% of a
// prefill's samples), and four large tasks left it little to take (a 128 x 256 x 1024 product: 1.5x MLAS's time
// with four tasks, 1.3x with these).
constexpr int64_t kSgemmTaskMacs = int64_t{1} << 20;
// Decode (M = 1): a task is at least this many packed weight bytes, so ORT's per-task dispatch is amortized.
constexpr int64_t kGemvTaskBytes = 128 * 1024;

inline int64_t PermPos(int64_t e) {
  const int64_t byte = e >> 1;
  return (byte / kChunkBytes) * kChunkElems + (e & 1) * kChunkBytes + (byte % kChunkBytes);
}

// Per-call re-layout of A (level 0) or its int8 quantization (level 4).
struct PreparedA {
  std::vector<float> a;        // [M, kc] perm layout (level 0)
  std::vector<int8_t> q;       // [M, kc] level 4: perm layout, or natural order (AVX-512, M >= 8)
  std::vector<float> scale;    // [M, kb]
  std::vector<int32_t> lane;   // [M, kc / 8] sum of codes per lane (4 bytes = 8 elements; AVX2 only)
  std::vector<int32_t> block;  // [M, kb] sum of codes per block
};

void PermuteRow(const float* a, const Shape& s, float* out) {
  std::fill(out, out + s.kc, 0.0f);
  for (int64_t k = 0; k < s.K; ++k) out[PermPos(k)] = a[k];
}

void QuantizeRow(const float* a, const Shape& s, int8_t* q, float* scale, int32_t* lane, int32_t* block) {
  std::fill(q, q + s.kc, int8_t{0});
  std::fill(lane, lane + s.kc / 8, 0);
  for (int64_t b = 0; b < s.kb; ++b) {
    const int64_t k0 = b * s.bs, k1 = std::min<int64_t>(s.K, k0 + s.bs);
    float amax = 0.0f;
    bool nan = false;
    for (int64_t k = k0; k < k1; ++k) {
      amax = std::max(amax, std::fabs(a[k]));
      nan |= std::isnan(a[k]);
    }
    if (nan) amax = std::nanf("");  // as numpy's max: a NaN makes the block's scale NaN
    scale[b] = amax / 127.0f;  // NaN or Inf scale: the block's codes are 0 and its products NaN, as the reference
    const float inv = std::isfinite(amax) && amax != 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int64_t k = k0; k < k1; ++k) {
      const float r = inv == 0.0f ? 0.0f : RoundHalfEven(a[k] * inv);  // |a * inv| <= 127
      const int32_t c = static_cast<int32_t>(std::min(127.0f, std::max(-128.0f, r)));
      q[PermPos(k)] = static_cast<int8_t>(c);
      lane[k >> 3] += c;
      sum += c;
    }
    block[b] = sum;
  }
}

inline int ZeroPoint(const uint8_t* zp_row, int64_t b) {
  return zp_row == nullptr ? 8 : (zp_row[b >> 1] >> ((b & 1) * 4)) & 0x0F;
}

void UnpackZeroPoints(const uint8_t* zp_row, const Shape& s, int32_t* out) {
  for (int64_t b = 0; b < s.kb; ++b) out[b] = ZeroPoint(zp_row, b);
}

// ---- scalar (portable) -------------------------------------------------------------------------------------
void DequantColScalar(const uint8_t* brow, const float* sw, const int32_t* zpc, const Shape& s, float* w) {
  for (int64_t i = 0; i < s.row_bytes; ++i) {
    const int64_t blk = (2 * i) >> s.bs_log2;
    const float sc = sw[blk];
    const int z = zpc[blk];
    const int64_t pos = (i / kChunkBytes) * kChunkElems + (i % kChunkBytes);
    w[pos] = static_cast<float>((brow[i] & 0x0F) - z) * sc;
    w[pos + kChunkBytes] = static_cast<float>((brow[i] >> 4) - z) * sc;
  }
}

float DotScalar(const float* a, const float* w, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * w[i + j];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

float Int8ColScalar(const uint8_t* brow, const float* sw, const int32_t* zpc, const Shape& s, const int8_t* q,
                    const float* sa, const int32_t* qblock) {
  float acc = 0.0f;
  const int64_t bytes_per_block = s.bs / 2;
  for (int64_t b = 0; b < s.kb; ++b) {
    int32_t dot = 0;
    for (int64_t i = b * bytes_per_block; i < (b + 1) * bytes_per_block; ++i) {
      const int64_t pos = (i / kChunkBytes) * kChunkElems + (i % kChunkBytes);
      dot += (brow[i] & 0x0F) * q[pos] + (brow[i] >> 4) * q[pos + kChunkBytes];
    }
    dot -= zpc[b] * qblock[b];
    acc = std::fma(static_cast<float>(dot), sa[b] * sw[b], acc);
  }
  return acc;
}

#if NPU_EP_X86
// ---- AVX2 + FMA --------------------------------------------------------------------------------------------
__attribute__((target("avx2,fma"))) void DequantColAvx2(const uint8_t* brow, const float* sw, const int32_t* zpc,
                                                        const Shape& s, float* w) {
  const __m128i m0f = _mm_set1_epi8(0x0F);
  const int64_t block_bytes = s.bs / 2;
  for (int64_t blk = 0; blk < s.kb; ++blk) {
   const __m256 sc = _mm256_set1_ps(sw[blk]);
   const __m256i z = _mm256_set1_epi32(zpc[blk]);
   for (int64_t g = blk * block_bytes; g < (blk + 1) * block_bytes; g += 8) {  // 8 bytes = 16 elements
    const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(brow + g));
    const __m256i lo = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_and_si128(raw, m0f)), z);
    const __m256i hi = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(raw, 4), m0f)), z);
    float* dst = w + (g / kChunkBytes) * kChunkElems + (g % kChunkBytes);
    _mm256_storeu_ps(dst, _mm256_mul_ps(_mm256_cvtepi32_ps(lo), sc));
    _mm256_storeu_ps(dst + kChunkBytes, _mm256_mul_ps(_mm256_cvtepi32_ps(hi), sc));
   }
  }
}

__attribute__((target("avx2,fma"))) inline float HsumAvx2(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

__attribute__((target("avx2,fma"))) float DotAvx2(const float* a, const float* w, int64_t n) {
  __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
  for (int64_t i = 0; i < n; i += 32) {  // n is a multiple of 128
    c0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(w + i), c0);
    c1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(w + i + 8), c1);
    c2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(w + i + 16), c2);
    c3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(w + i + 24), c3);
  }
  return HsumAvx2(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)));
}

__attribute__((target("avx2,fma"))) float Int8ColAvx2(const uint8_t* brow, const uint8_t* tail, const float* sw,
                                                      const int32_t* zpc, const Shape& s, const int8_t* q,
                                                      const float* sa, const int32_t* qlane) {
  const __m256i m0f = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const int bs = s.bs;
  const __m256i idx = _mm256_setr_epi32(0, 8 / bs, 16 / bs, 24 / bs, 32 / bs, 40 / bs, 48 / bs, 56 / bs);
  const int64_t full = s.row_bytes / kChunkBytes;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t c = 0; c < s.n_chunks; ++c) {
    const uint8_t* src = c < full ? brow + c * kChunkBytes : tail;
    for (int h = 0; h < 2; ++h) {
      const int64_t first = c * kChunkElems + h * 64;  // first (even) element of this half
      if (first >= 2 * s.row_bytes) break;
      const __m256i bv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32 * h));
      const __m256i lo = _mm256_and_si256(bv, m0f);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bv, 4), m0f);
      const int8_t* qc = q + c * kChunkElems + 32 * h;
      const __m256i p = _mm256_add_epi16(
          _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qc))),
          _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qc + kChunkBytes))));
      __m256i d = _mm256_madd_epi16(p, ones);  // |pair sums| <= 2 * 2 * 15 * 128: no int16 saturation
      const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qlane + c * 16 + 8 * h));
      __m256 sv;
      __m256i zv;
      const int64_t b0 = first >> s.bs_log2;
      if (bs >= 64) {
        sv = _mm256_set1_ps(sa[b0] * sw[b0]);
        zv = _mm256_set1_epi32(zpc[b0]);
      } else {
        const int64_t nb = std::min<int64_t>(64 >> s.bs_log2, s.kb - b0);
        const __m128i mask = _mm_cmpgt_epi32(_mm_set1_epi32(static_cast<int>(nb)), _mm_setr_epi32(0, 1, 2, 3));
        const __m128 s4 = _mm_mul_ps(_mm_maskload_ps(sw + b0, mask), _mm_maskload_ps(sa + b0, mask));
        sv = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s4), idx);
        zv = _mm256_permutevar8x32_epi32(
            _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(zpc + b0))), idx);
      }
      d = _mm256_sub_epi32(d, _mm256_mullo_epi32(zv, ql));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sv, acc);
    }
  }
  return HsumAvx2(acc);
}

// ---- AVX-512 (BW, optionally VNNI) -------------------------------------------------------------------------
#define NPU_AVX512 "avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"

// 16 bytes (32 elements) per step; a step covers one block (bs >= 32) or two (bs = 16: lanes 0-7 and 8-15).
// Same products as the AVX2 and scalar versions: (q - zp) * scale, rounded once. kNatural: element k at w[k] (for
// the panel product, which then reads A's rows where they are); else the perm layout A is re-laid out to.
template <bool kNatural>
__attribute__((target(NPU_AVX512))) void DequantColAvx512(const uint8_t* brow, const float* sw,
                                                           const int32_t* zpc, const Shape& s, float* w) {
  const __m128i m0f = _mm_set1_epi8(0x0F);
  const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
  const int64_t steps = s.row_bytes / 16;
  for (int64_t i = 0; i < steps; ++i) {
    const int64_t g = 16 * i, blk = (2 * g) >> s.bs_log2;
    __m512 sc = _mm512_set1_ps(sw[blk]);
    __m512i z = _mm512_set1_epi32(zpc[blk]);
    if (s.bs == 16) {
      sc = _mm512_mask_blend_ps(0xFF00, sc, _mm512_set1_ps(sw[blk + 1]));
      z = _mm512_mask_blend_epi32(0xFF00, z, _mm512_set1_epi32(zpc[blk + 1]));
    }
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(brow + g));
    const __m512i lo = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(raw, m0f)), z);
    const __m512i hi = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(raw, 4), m0f)), z);
    const __m512 even = _mm512_mul_ps(_mm512_cvtepi32_ps(lo), sc), odd = _mm512_mul_ps(_mm512_cvtepi32_ps(hi), sc);
    if constexpr (kNatural) {
      _mm512_storeu_ps(w + 2 * g, _mm512_permutex2var_ps(even, first, odd));
      _mm512_storeu_ps(w + 2 * g + 16, _mm512_permutex2var_ps(even, second, odd));
    } else {
      float* dst = w + (g / kChunkBytes) * kChunkElems + (g % kChunkBytes);
      _mm512_storeu_ps(dst, even);
      _mm512_storeu_ps(dst + kChunkBytes, odd);
    }
  }
  for (int64_t g = steps * 16; g < s.row_bytes; ++g) {  // a last 8-byte group (bs = 16, odd number of blocks)
    const int64_t blk = (2 * g) >> s.bs_log2;
    const int64_t pos = kNatural ? 2 * g : (g / kChunkBytes) * kChunkElems + (g % kChunkBytes);
    w[pos] = static_cast<float>((brow[g] & 0x0F) - zpc[blk]) * sw[blk];
    w[pos + (kNatural ? 1 : kChunkBytes)] = static_cast<float>((brow[g] >> 4) - zpc[blk]) * sw[blk];
  }
}

__attribute__((target(NPU_AVX512))) float DotAvx512(const float* a, const float* w, int64_t n) {
  __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
  for (int64_t i = 0; i < n; i += 64) {  // n is a multiple of 128
    c0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(w + i), c0);
    c1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(w + i + 16), c1);
    c2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(w + i + 32), c2);
    c3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(w + i + 48), c3);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)));
}

#endif  // NPU_EP_X86

using Int8ColFn = float (*)(const uint8_t*, const uint8_t*, const float*, const int32_t*, const Shape&,
                            const int8_t*, const float*, const int32_t*);
using DequantFn = void (*)(const uint8_t*, const float*, const int32_t*, const Shape&, float*);
using DotFn = float (*)(const float*, const float*, int64_t);

void PrepareA(const NBitsGemm& g, const Shape& s, Isa isa, PreparedA& pa) {
  const bool int8 = g.accuracy_level == 4;
  const bool vector_quant = NPU_EP_X86 && int8 && isa >= Isa::kAvx512;
  if (int8) {
    pa.q.resize(s.M * s.kc);
    pa.scale.resize(s.M * s.kb);
    pa.lane.resize(vector_quant ? 0 : s.M * s.kc / 8);
    pa.block.resize(s.M * s.kb);
  } else {
    pa.a.resize(s.M * s.kc);
  }
  ParallelFor(ThreadsFor(g.threads, s.M * s.K), s.M, [&](int64_t m) {  // rows are independent: same bits at any thread count
#if NPU_EP_X86
    if (vector_quant) {
      nbits::QuantizeRowAvx512(g.a + m * s.K, s, pa.q.data() + m * s.kc, pa.scale.data() + m * s.kb,
                               pa.block.data() + m * s.kb, /*perm=*/s.M < kInt8PanelMinRows);
      return;
    }
#endif
    if (int8)
      QuantizeRow(g.a + m * s.K, s, pa.q.data() + m * s.kc, pa.scale.data() + m * s.kb,
                  pa.lane.data() + m * s.kc / 8, pa.block.data() + m * s.kb);
    else
      PermuteRow(g.a + m * s.K, s, pa.a.data() + m * s.kc);
  });
}

// A's rows for the natural-order panel path: A itself when its rows are kc long, else a copy zero-padded to kc.
const float* NaturalRows(const NBitsGemm& g, const Shape& s, PreparedA& pa) {
  if (s.K == s.kc) return g.a;
  pa.a.resize(s.M * s.kc);
  for (int64_t m = 0; m < s.M; ++m) {
    std::copy(g.a + m * s.K, g.a + (m + 1) * s.K, pa.a.data() + m * s.kc);
    std::fill(pa.a.data() + m * s.kc + s.K, pa.a.data() + (m + 1) * s.kc, 0.0f);
  }
  return pa.a.data();
}

}  // namespace

void MatMulNBits(const NBitsGemm& g) {
  Shape s;
  s.M = g.M;
  s.K = g.K;
  s.N = g.N;
  s.bs = g.block_size;
  s.bs_log2 = __builtin_ctz(static_cast<unsigned>(g.block_size));
  s.kb = (g.K + g.block_size - 1) / g.block_size;
  s.row_bytes = s.kb * g.block_size / 2;
  s.n_chunks = (s.row_bytes + kChunkBytes - 1) / kChunkBytes;
  s.kc = s.n_chunks * kChunkElems;
  s.zp_bytes = (s.kb + 1) / 2;
  if (s.M == 0 || s.N == 0) return;
  const Isa isa = ActiveIsa();
  // The calling thread's scratch: grown, never cleared (every element a call reads, it writes first). Tasks on
  // other threads reach it through this reference (a lambda naming a thread_local would get its own thread's).
  static thread_local PreparedA scratch_a;
  PreparedA& pa = scratch_a;
  const bool int8 = g.accuracy_level == 4;
  const bool panel = !int8 && g.sgemm != nullptr && s.M >= kSgemmMinRows;
  const bool natural = NPU_EP_X86 && panel && isa >= Isa::kAvx512;  // B in natural order: A read in place
  if (!natural) PrepareA(g, s, isa, pa);
  Int8ColFn int8_col = nullptr;
  DequantFn dequant = DequantColScalar;
  DotFn dot = DotScalar;
#if NPU_EP_X86
  if (isa == Isa::kAvx2) int8_col = Int8ColAvx2;
  if (isa >= Isa::kAvx2) dequant = DequantColAvx2;
  if (isa >= Isa::kAvx2) dot = DotAvx2;
  if (isa >= Isa::kAvx512) dot = DotAvx512;
  if (isa >= Isa::kAvx512) dequant = DequantColAvx512<false>;
#else
  (void)isa;
#endif
#if NPU_EP_X86
  if ((s.M == 1 || (int8 && s.M < kInt8PanelMinRows)) && isa >= Isa::kAvx512 && (int8 || s.bs >= 32)) {
    // Every column is computed whole by one task, so the split changes no bits.
    const int64_t cols = std::max<int64_t>(16, (kGemvTaskBytes / std::max<int64_t>(1, s.row_bytes) + 15) / 16 * 16);
    const bool vnni = isa == Isa::kAvx512Vnni;
    RunTiles(g.threads, g.plan, g.dma, s.M, s.N, s.K, cols, [&](int64_t r0, int64_t r1, int64_t n0, int64_t n1) {
      nbits::GemvA rows[kInt8PanelMinRows];
      for (int64_t m = r0; m < r1; ++m) {
        nbits::GemvA& row = rows[m - r0];
        row.q = pa.q.data() + m * s.kc;
        row.scale = pa.scale.data() + m * s.kb;
        row.block = pa.block.data() + m * s.kb;
        row.a = pa.a.data();
        row.y = g.y + m * s.N;
      }
      if (int8)
        nbits::GemvInt8Avx512(g, s, rows, static_cast<int>(r1 - r0), vnni, n0, n1);
      else
        nbits::GemvFp32Avx512(g, s, rows[0], n0, n1);
    });
    return;
  }
  if (int8 && isa >= Isa::kAvx512) {
    const nbits::Int8A ia{pa.q.data(), pa.scale.data(), pa.block.data()};
    const bool vnni = isa == Isa::kAvx512Vnni;
    const auto task = [&](int64_t r0, int64_t r1, int64_t n0, int64_t n1) {
      nbits::Int8PanelAvx512(g, s, ia, vnni, r0, r1, n0, n1);
    };
    RunTiles(g.threads, g.plan, g.dma, s.M, s.N, s.K, kInt8PanelCols, task);
    return;
  }
#endif
  if (panel) {
    // Each task owns whole columns (a shape-only split): the same bits at any thread count.
    const float* a_rows = natural ? NaturalRows(g, s, pa) : pa.a.data();
#if NPU_EP_X86
    if (natural) dequant = DequantColAvx512<true>;
#endif
    // at most an L2-sized panel, and at least kSgemmTasks tasks where N allows (a shape-only split)
    const int64_t even = ((s.N + kSgemmTasks - 1) / kSgemmTasks + 15) / 16 * 16;
    const int64_t by_work = kSgemmTaskMacs / (s.M * s.kc) / 16 * 16;
    const int64_t cols = std::max<int64_t>(16, std::min({kSgemmPanelBytes / (4 * s.kc) / 16 * 16, even, by_work}));
    RunTiles(g.threads, g.plan, g.dma, s.M, s.N, s.K, cols, [&](int64_t r0, int64_t r1, int64_t n0, int64_t n1) {
      std::vector<int32_t> zpc(s.kb + 16, 0);
      static thread_local std::vector<float> scratch;  // the pool thread's panel: grown, never cleared
      float* w = Grow(scratch, (n1 - n0) * s.kc);
      if (2 * s.row_bytes < s.kc) std::fill(w, w + (n1 - n0) * s.kc, 0.0f);  // dequant leaves pads
      for (int64_t n = n0; n < n1; ++n) {
        const Column col = ColumnOf(g, s, n);
        UnpackZeroPoints(col.zp, s, zpc.data());
        dequant(col.b, col.sw, zpc.data(), s, w + (n - n0) * s.kc);
      }
      float* y = g.y + r0 * s.N + n0;
#if NPU_EP_X86
      if (isa >= Isa::kAvx512) {
        nbits::PanelGemmAvx512(a_rows + r0 * s.kc, r1 - r0, w, n1 - n0, s.kc, y, s.N);
      } else
#endif
        g.sgemm(kCblasRowMajor, kCblasNoTrans, kCblasTrans, r1 - r0, n1 - n0, s.kc, 1.0f, pa.a.data() + r0 * s.kc,
                s.kc, w, s.kc, 0.0f, y, s.N);
      if (g.bias != nullptr)
        for (int64_t m = r0; m < r1; ++m)
          for (int64_t n = n0; n < n1; ++n) g.y[m * s.N + n] += g.bias[n];
    });
    return;
  }
  RunTiles(g.threads, g.plan, g.dma, s.M, s.N, s.K, kColsPerTask, [&](int64_t r0, int64_t r1, int64_t n0, int64_t n1) {
    std::vector<int32_t> zpc(s.kb + 16, 0);
    std::vector<float> w(int8 ? 0 : s.kc, 0.0f);
    alignas(64) uint8_t tail[kChunkBytes];
    for (int64_t n = n0; n < n1; ++n) {
      const Column col = ColumnOf(g, s, n);
      const uint8_t* brow = col.b;
      const float* sw = col.sw;
      UnpackZeroPoints(col.zp, s, zpc.data());
      const float bias = g.bias == nullptr ? 0.0f : g.bias[n];
      if (!int8) {
        dequant(brow, sw, zpc.data(), s, w.data());
        for (int64_t m = r0; m < r1; ++m) g.y[m * s.N + n] = dot(pa.a.data() + m * s.kc, w.data(), s.kc) + bias;
        continue;
      }
      if (int8_col == nullptr) {
        for (int64_t m = r0; m < r1; ++m)
          g.y[m * s.N + n] = Int8ColScalar(brow, sw, zpc.data(), s, pa.q.data() + m * s.kc,
                                           pa.scale.data() + m * s.kb, pa.block.data() + m * s.kb) + bias;
        continue;
      }
      const int64_t full = s.row_bytes / kChunkBytes, rem = s.row_bytes % kChunkBytes;
      std::memset(tail, 0, sizeof(tail));
      if (rem) std::memcpy(tail, brow + full * kChunkBytes, rem);
      for (int64_t m = r0; m < r1; ++m)
        g.y[m * s.N + n] = int8_col(brow, tail, sw, zpc.data(), s, pa.q.data() + m * s.kc,
                                    pa.scale.data() + m * s.kb, pa.lane.data() + m * s.kc / 8) + bias;
    }
  });
}

}  // namespace npu_ep::kern
