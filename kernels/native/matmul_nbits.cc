// MatMulNBits kernels, one family: fp32 math (accuracy_level 0..3) and int8 A x int4 B (accuracy_level 4).
//
// fp32 levels on ORT's layout (shared by every ISA path): byte i of a packed B row holds elements 2i (low nibble)
// and 2i+1 (high nibble) of the zero-padded K axis, whatever the block size. The row is walked in chunks of 64
// bytes; per chunk the low nibbles give the even elements and the high nibbles the odd ones. A is re-laid out once
// per call to match ("perm" layout: per chunk, 64 even elements then 64 odd ones), so the kernels never interleave
// nibbles.
//
// accuracy_level 4, as ORT's CompInt8: per block of A, scale = max|a| / 127, codes = round_half_even(a * (127 /
// max|a|)), in natural order, max|a| and the codes as MLAS finds them (nbits::MlasBlockMax, MlasCode: NaN and Inf
// as on the CPU EP); outputs meeting a non-finite block scale are NaN (NonFiniteAsOrt). B is in the tiles the
// compiler stored (matmul_nbits.h). Every path (scalar, AVX2 here, AVX-512 in matmul_nbits_int8_avx512.cc) sums
// each block exactly in int32 (sum(code_a * code_b) - zp * sum(code_a)) and accumulates the blocks in order,
// y = fma(float(dot), scale_a * scale_b, y): the same bits on all of them.
// accuracy_level 0..3: weights dequantized per 8-byte group ((q - zp) * scale, one rounding, like ORT's
// dequantize-then-SGEMM) into a per-column buffer, then float32 dot products; on AVX-512, from two rows of A on,
// dequantized k-major and multiplied as outer products in MLAS's order (matmul_nbits_panel_avx512.cc), and one row
// of A on its own GEMV (matmul_nbits_gemv_avx512.cc).
#include "matmul_nbits.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu.h"
#include "half.h"
#include "matmul_nbits_internal.h"
#include "scratch.h"
#include "thread_pool.h"

#include "intrinsics.h"

namespace npu_ep::kern {
namespace {

using nbits::Column;
using nbits::ColumnOf;
using nbits::kChunkBytes;
using nbits::kChunkElems;
using nbits::kTileCols;
using nbits::Shape;
using nbits::TileGroup;
using nbits::TileGroupOf;
using nbits::ZeroPoint;
constexpr int64_t kColsPerTask = 16;
// From this M on, fp32 levels multiply dequantized column panels on the BLAS (AVX-512: nbits::kOuterMinRows).
constexpr int64_t kSgemmMinRows = 16;
constexpr int64_t kSgemmPanelBytes = 512 << 10;  // float panel per task (columns x kc), L2-sized
constexpr int64_t kSgemmTasks = 4;  // panels a product is cut into at least, so both threads get work
// ...and at most about this many multiply-adds each: ORT's worker joins late (it spun idle for 11-16% of a
// prefill's samples), and four large tasks left it little to take (a 128 x 256 x 1024 product: 1.5x MLAS's time
// with four tasks, 1.3x with these).
constexpr int64_t kSgemmTaskMacs = int64_t{1} << 20;
// Decode (M = 1) and level 4 with few rows: a task is at least this many packed weight bytes per row of A, so
// ORT's per-task dispatch is amortized.
constexpr int64_t kGemvTaskBytes = 128 * 1024;

inline int64_t PermPos(int64_t e) {
  const int64_t byte = e >> 1;
  return (byte / kChunkBytes) * kChunkElems + (e & 1) * kChunkBytes + (byte % kChunkBytes);
}

// Per-call re-layout of A (level 0) or its int8 quantization (level 4).
struct PreparedA {
  std::vector<float> a;        // [M, kc] perm layout (level 0)
  std::vector<int8_t> q;       // [M, kc] level 4, natural order, zero past K
  std::vector<float> scale;    // [M, kb]
  std::vector<int32_t> block;  // [M, kb] sum of codes per block
};

void PermuteRow(const float* a, const Shape& s, float* out) {
  std::fill(out, out + s.kc, 0.0f);
  for (int64_t k = 0; k < s.K; ++k) out[PermPos(k)] = a[k];
}

void QuantizeRow(const float* a, const Shape& s, int8_t* q, float* scale, int32_t* block) {
  std::fill(q, q + s.kc, int8_t{0});
  for (int64_t b = 0; b < s.kb; ++b) {
    const int64_t k0 = b * s.bs, n = std::min<int64_t>(s.K, k0 + s.bs) - k0;
    const float amax = nbits::MlasBlockMax(a + k0, n);
    scale[b] = amax / 127.0f;
    const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;  // NaN amax: NaN; Inf: 0
    int32_t sum = 0;
    for (int64_t k = k0; k < k0 + n; ++k) {
      q[k] = nbits::MlasCode(a[k] * inv);
      sum += q[k];
    }
    block[b] = sum;
  }
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

// Level 4, one output from the tiles: the definition the vector paths reproduce bit for bit.
float Int8TileScalar(const TileGroup& t, int lane, const Shape& s, const int8_t* q, const float* sa,
                     const int32_t* qblock) {
  const int shift = lane < 16 ? 0 : 4;
  const int64_t steps = s.bs / 4;
  float acc = 0.0f;
  for (int64_t b = 0; b < s.kb; ++b) {
    int32_t dot = 0;
    for (int64_t i = 0; i < steps; ++i) {
      const uint8_t* p = t.b + (b * steps + i) * 64 + 4 * (lane & 15);
      for (int c = 0; c < 4; ++c) dot += ((p[c] >> shift) & 0x0F) * q[b * s.bs + 4 * i + c];
    }
    const int zp = t.zp == nullptr ? 8 : (t.zp[(b >> 1) * t.stride + lane] >> ((b & 1) * 4)) & 0x0F;
    dot -= zp * qblock[b];
    acc = std::fma(static_cast<float>(dot), sa[b] * t.sw[b * t.stride + lane], acc);
  }
  return acc;
}

// Level 4's NaN rule of ORT's CompInt8 kernel (measured on ORT 1.31, AVX-512): an output whose row and column meet
// a block where scale_a * scale_w is not finite (an infinite or NaN weight scale, an infinite or NaN scale of A) is
// NaN, whatever the signs; the one-term sum above gives an infinity there when the block's integer sum is not 0.
// Such an output is already Inf or NaN, so only those are looked at: finite outputs keep their bits, and the cost
// is a scan. matmul_nbits._non_finite_as_ort is the reference model's same rule. Not matched: for a few such
// outputs ORT gives an infinity instead, by its kernel's partial sums (seen at block size 16, and in one row of a
// 17-row product at 32).
void NonFiniteAsOrt(const NBitsGemm& g, const Shape& s, const nbits::Int8A& a, int64_t r0, int64_t r1, int64_t n0,
                    int64_t n1) {
  for (int64_t m = r0; m < r1; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      float& y = g.y[m * s.N + n];
      if (std::isfinite(y)) continue;
      const TileGroup t = TileGroupOf(g, s, n);
      const float* sa = a.scale + m * s.kb;
      for (int64_t b = 0; b < s.kb; ++b)
        if (!std::isfinite(sa[b] * t.sw[b * t.stride + (n - t.first)])) {
          y = std::nanf("");
          break;
        }
    }
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

// Level 4, lanes 16 * half .. + 15 of a tile group for R rows of A (sharing B's loads and nibble masks) into
// out[r][16]: Int8TileScalar's operations, 8 columns per vector (the products of 4 elements summed in int16 pairs,
// exact: |2 * 15 * 128| < 2^15).
template <int R>
__attribute__((target("avx2,fma"))) void Int8HalfAvx2(const TileGroup& t, int half, const Shape& s,
                                                      const int8_t* const q[], const float* const sa[],
                                                      const int32_t* const qblock[], float out[][16]) {
  const __m256i m0f = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const int64_t steps = s.bs / 4;
  const bool full = t.lanes == kTileCols;
  alignas(32) float swp[16];
  alignas(16) uint8_t zpp[16];
  __m256 f[R][2];
  for (int r = 0; r < R; ++r) f[r][0] = f[r][1] = _mm256_setzero_ps();
  const uint8_t* pb = t.b;
  for (int64_t b = 0; b < s.kb; ++b) {
    const float* sw = t.sw + b * t.stride + 16 * half;
    if (!full) {  // columns past the matrix: scale 0
      for (int j = 0; j < 16; ++j) swp[j] = 16 * half + j < t.lanes ? sw[j] : 0.0f;
      sw = swp;
    }
    __m256i z0 = _mm256_set1_epi32(8), z1 = z0;
    if (t.zp != nullptr) {
      const uint8_t* zp = t.zp + (b >> 1) * t.stride + 16 * half;
      if (!full) {  // columns past the matrix: zero point 0
        for (int j = 0; j < 16; ++j) zpp[j] = 16 * half + j < t.lanes ? zp[j] : 0;
        zp = zpp;
      }
      const __m128i raw = _mm_srl_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(zp)),
                                        _mm_cvtsi32_si128(static_cast<int>(b & 1) * 4));
      const __m128i nib = _mm_and_si128(raw, _mm_set1_epi8(0x0F));
      z0 = _mm256_cvtepu8_epi32(nib);
      z1 = _mm256_cvtepu8_epi32(_mm_srli_si128(nib, 8));
    }
    __m256i d[R][2];
    for (int r = 0; r < R; ++r) {
      const __m256i nsum = _mm256_set1_epi32(-qblock[r][b]);
      d[r][0] = _mm256_mullo_epi32(z0, nsum);
      d[r][1] = _mm256_mullo_epi32(z1, nsum);
    }
    for (int64_t i = 0; i < steps; ++i, pb += 64) {
      __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb));
      __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 32));
      if (half) b0 = _mm256_srli_epi16(b0, 4), b1 = _mm256_srli_epi16(b1, 4);
      b0 = _mm256_and_si256(b0, m0f), b1 = _mm256_and_si256(b1, m0f);
      for (int r = 0; r < R; ++r) {
        int32_t codes;
        std::memcpy(&codes, q[r] + b * s.bs + 4 * i, 4);
        const __m256i a = _mm256_set1_epi32(codes);
        d[r][0] = _mm256_add_epi32(d[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(b0, a), ones));
        d[r][1] = _mm256_add_epi32(d[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(b1, a), ones));
      }
    }
    const __m256 s0 = _mm256_loadu_ps(sw), s1 = _mm256_loadu_ps(sw + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 sr = _mm256_set1_ps(sa[r][b]);
      f[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[r][0]), _mm256_mul_ps(s0, sr), f[r][0]);
      f[r][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[r][1]), _mm256_mul_ps(s1, sr), f[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(out[r], f[r][0]);
    _mm256_storeu_ps(out[r] + 8, f[r][1]);
  }
}

// ---- AVX-512 (BW, optionally VNNI) -------------------------------------------------------------------------
#define NPU_AVX512 "avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"

// 16 bytes (32 elements) per step; a step covers one block (bs >= 32) or two (bs = 16: lanes 0-7 and 8-15).
// Same products as the AVX2 and scalar versions: (q - zp) * scale, rounded once, in the perm layout A is re-laid
// out to.
__attribute__((target(NPU_AVX512))) void DequantColAvx512(const uint8_t* brow, const float* sw, const int32_t* zpc,
                                                          const Shape& s, float* w) {
  const __m128i m0f = _mm_set1_epi8(0x0F);
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
    float* dst = w + (g / kChunkBytes) * kChunkElems + (g % kChunkBytes);
    _mm512_storeu_ps(dst, even);
    _mm512_storeu_ps(dst + kChunkBytes, odd);
  }
  for (int64_t g = steps * 16; g < s.row_bytes; ++g) {  // a last 8-byte group (bs = 16, odd number of blocks)
    const int64_t blk = (2 * g) >> s.bs_log2;
    const int64_t pos = (g / kChunkBytes) * kChunkElems + (g % kChunkBytes);
    w[pos] = static_cast<float>((brow[g] & 0x0F) - zpc[blk]) * sw[blk];
    w[pos + kChunkBytes] = static_cast<float>((brow[g] >> 4) - zpc[blk]) * sw[blk];
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

using DequantFn = void (*)(const uint8_t*, const float*, const int32_t*, const Shape&, float*);
using DotFn = float (*)(const float*, const float*, int64_t);

// Level 4 without AVX-512, rows [r0, r1) x columns [n0, n1) from the tiles: AVX2 takes 16 columns and two rows
// per vector pass.
void Int8Tiles(const NBitsGemm& g, const Shape& s, const nbits::Int8A& a, Isa isa, int64_t r0, int64_t r1, int64_t n0,
               int64_t n1) {
  for (int64_t n = n0; n < n1;) {
    const TileGroup t = TileGroupOf(g, s, n);
    const int l0 = static_cast<int>(n - t.first), l1 = static_cast<int>(std::min<int64_t>(t.lanes, n1 - t.first));
    for (int64_t m = r0; m < r1;) {
      const int rows = r1 - m >= 2 ? 2 : 1;
      const int8_t* q[2];
      const float* sa[2];
      const int32_t* asum[2];
      for (int r = 0; r < rows; ++r) {
        q[r] = a.q + (m + r) * s.kc;
        sa[r] = a.scale + (m + r) * s.kb;
        asum[r] = a.block + (m + r) * s.kb;
      }
      float out[2][kTileCols];
#if NPU_EP_X86
      if (isa >= Isa::kAvx2) {
        for (int half = l0 / 16; half * 16 < l1; ++half) {
          float part[2][16];
          (rows == 2 ? Int8HalfAvx2<2> : Int8HalfAvx2<1>)(t, half, s, q, sa, asum, part);
          for (int r = 0; r < rows; ++r) std::copy(part[r], part[r] + 16, out[r] + 16 * half);
        }
      } else
#endif
        for (int r = 0; r < rows; ++r)
          for (int lane = l0; lane < l1; ++lane) out[r][lane] = Int8TileScalar(t, lane, s, q[r], sa[r], asum[r]);
      for (int r = 0; r < rows; ++r)
        for (int lane = l0; lane < l1; ++lane)
          g.y[(m + r) * s.N + t.first + lane] = out[r][lane] + (g.bias == nullptr ? 0.0f : g.bias[t.first + lane]);
      m += rows;
    }
    n = t.first + l1;
  }
}

void PrepareA(const NBitsGemm& g, const Shape& s, Isa isa, PreparedA& pa) {
  const bool int8 = g.accuracy_level == 4;
  [[maybe_unused]] const bool vector_quant = NPU_EP_X86 && int8 && isa >= Isa::kAvx512;  // x86 only
  if (int8) {
    pa.q.resize(s.M * s.kc);
    pa.scale.resize(s.M * s.kb);
    pa.block.resize(s.M * s.kb);
  } else {
    pa.a.resize(s.M * s.kc);
  }
  ParallelFor(
      ThreadsFor(g.threads, s.M * s.K), s.M, [&](int64_t m) {  // rows are independent: same bits at any thread count
#if NPU_EP_X86
        if (vector_quant) {
          nbits::QuantizeRowAvx512(g.a + m * s.K, s, pa.q.data() + m * s.kc, pa.scale.data() + m * s.kb,
                                   pa.block.data() + m * s.kb);
          return;
        }
#endif
        if (int8)
          QuantizeRow(g.a + m * s.K, s, pa.q.data() + m * s.kc, pa.scale.data() + m * s.kb, pa.block.data() + m * s.kb);
        else
          PermuteRow(g.a + m * s.K, s, pa.a.data() + m * s.kc);
      });
}

// y[m, n] += bias[n] over rows [r0, r1) and columns [n0, n1), after the panel product.
void AddBias(const NBitsGemm& g, const Shape& s, int64_t r0, int64_t r1, int64_t n0, int64_t n1) {
  if (g.bias == nullptr) return;
  for (int64_t m = r0; m < r1; ++m)
    for (int64_t n = n0; n < n1; ++n) g.y[m * s.N + n] += g.bias[n];
}

// A's rows for the outer-product kernel, which reads them in k order: A itself when its rows are kc long, else a copy
// zero-padded to kc.
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
  // AVX-512's own outer-product GEMM (matmul_nbits_panel_avx512.cc) reads A's rows where they are; the BLAS panel path
  // and the per-column dot products read them re-laid out (perm layout)
  const bool outer = NPU_EP_X86 && !int8 && isa >= Isa::kAvx512 && s.M >= nbits::kOuterMinRows;
  const bool panel = !outer && !int8 && g.sgemm != nullptr && s.M >= kSgemmMinRows;
  if (!outer) PrepareA(g, s, isa, pa);
  DequantFn dequant = DequantColScalar;
  DotFn dot = DotScalar;
#if NPU_EP_X86
  if (isa >= Isa::kAvx2) dequant = DequantColAvx2;
  if (isa >= Isa::kAvx2) dot = DotAvx2;
  if (isa >= Isa::kAvx512) dot = DotAvx512;
  if (isa >= Isa::kAvx512) dequant = DequantColAvx512;
#else
  (void)isa;
#endif
  if (int8) {
    // Tile groups of 32 columns; a task holds whole groups (one at least), kGemvTaskBytes of weights per row of A.
    const int64_t cols = std::max<int64_t>(1, kGemvTaskBytes / (s.row_bytes * s.M) / kTileCols) * kTileCols;
    const nbits::Int8A ia{pa.q.data(), pa.scale.data(), pa.block.data()};
    RunTiles(g.threads, g.plan, g.dma, s.M, s.N, s.K, cols, [&](int64_t r0, int64_t r1, int64_t n0, int64_t n1) {
#if NPU_EP_X86
      if (isa >= Isa::kAvx512)
        nbits::Int8TilesAvx512(g, s, ia, isa >= Isa::kAvx512Vnni, r0, r1, n0, n1);
      else
#endif
        Int8Tiles(g, s, ia, isa, r0, r1, n0, n1);
      NonFiniteAsOrt(g, s, ia, r0, r1, n0, n1);
    });
    return;
  }
#if NPU_EP_X86
  if (s.M == 1 && isa >= Isa::kAvx512 && s.bs >= 32) {
    // Every column is computed whole by one task, so the split changes no bits.
    const int64_t cols = std::max<int64_t>(16, (kGemvTaskBytes / std::max<int64_t>(1, s.row_bytes) + 15) / 16 * 16);
    RunTiles(g.threads, g.plan, g.dma, s.M, s.N, s.K, cols,
             [&](int64_t, int64_t, int64_t n0, int64_t n1) { nbits::GemvFp32Avx512(g, s, pa.a.data(), n0, n1); });
    return;
  }
#endif
  if (outer || panel) {
    // Each task owns whole columns (a shape-only split): the same bits at any thread count.
    // at most an L2-sized panel, and at least kSgemmTasks tasks where N allows (a shape-only split)
    // in whole 32-column tiles for the outer form: a 16-column task ran its tile at half width
    const int64_t unit = outer ? 32 : 16;
    const int64_t even = ((s.N + kSgemmTasks - 1) / kSgemmTasks + unit - 1) / unit * unit;
    const int64_t by_work = kSgemmTaskMacs / (s.M * s.kc) / unit * unit;
    const int64_t cols = std::max(unit, std::min({kSgemmPanelBytes / (4 * s.kc) / unit * unit, even, by_work}));
    const float* a_rows = outer ? NaturalRows(g, s, pa) : pa.a.data();
    RunTiles(g.threads, g.plan, g.dma, s.M, s.N, s.K, cols, [&](int64_t r0, int64_t r1, int64_t n0, int64_t n1) {
      static thread_local std::vector<float> scratch;  // the pool thread's panel: grown, never cleared
      float* y = g.y + r0 * s.N + n0;
#if NPU_EP_X86
      if (outer) {
        float* packed = Grow(scratch, (n1 - n0 + 15) / 16 * 16 * s.kc);
        nbits::DequantKMajorAvx512(g, s, n0, n1, packed);
        nbits::OuterGemmAvx512(a_rows + r0 * s.kc, r1 - r0, packed, n1 - n0, s.kc, y, s.N);
        AddBias(g, s, r0, r1, n0, n1);
        return;
      }
#endif
      std::vector<int32_t> zpc(s.kb + 16, 0);
      float* w = Grow(scratch, (n1 - n0) * s.kc);
      if (2 * s.row_bytes < s.kc) std::fill(w, w + (n1 - n0) * s.kc, 0.0f);  // dequant leaves pads
      for (int64_t n = n0; n < n1; ++n) {
        const Column col = ColumnOf(g, s, n);
        UnpackZeroPoints(col.zp, s, zpc.data());
        dequant(col.b, col.sw, zpc.data(), s, w + (n - n0) * s.kc);
      }
      g.sgemm(kCblasRowMajor, kCblasNoTrans, kCblasTrans, r1 - r0, n1 - n0, s.kc, 1.0f, a_rows + r0 * s.kc, s.kc, w,
              s.kc, 0.0f, y, s.N);
      AddBias(g, s, r0, r1, n0, n1);
    });
    return;
  }
  RunTiles(g.threads, g.plan, g.dma, s.M, s.N, s.K, kColsPerTask, [&](int64_t r0, int64_t r1, int64_t n0, int64_t n1) {
    std::vector<int32_t> zpc(s.kb + 16, 0);
    std::vector<float> w(s.kc, 0.0f);
    for (int64_t n = n0; n < n1; ++n) {
      const Column col = ColumnOf(g, s, n);
      UnpackZeroPoints(col.zp, s, zpc.data());
      const float bias = g.bias == nullptr ? 0.0f : g.bias[n];
      dequant(col.b, col.sw, zpc.data(), s, w.data());
      for (int64_t m = r0; m < r1; ++m) g.y[m * s.N + n] = dot(pa.a.data() + m * s.kc, w.data(), s.kc) + bias;
    }
  });
}

void MatMulNBitsHalf(const NBitsGemm& g, const uint16_t* a, uint16_t* y) {
  if (g.M == 0 || g.N == 0) return;
  // The calling thread's float copies (grown, never cleared: each call writes all it reads); not MatMulNBits' own
  // scratch, which it fills from them.
  static thread_local std::vector<float> a32, y32;
  NBitsGemm f = g;
  f.a = Grow(a32, g.M * g.K);
  f.y = Grow(y32, g.M * g.N);
  float* af = a32.data();
  ParallelFor(ThreadsFor(g.threads, g.M * g.K), g.M,
              [&](int64_t m) { HalfToFloatRow(a + m * g.K, af + m * g.K, g.K); });
  MatMulNBits(f);
  const float* yf = y32.data();
  ParallelFor(ThreadsFor(g.threads, g.M * g.N), g.M,
              [&](int64_t m) { FloatToHalfRow(yf + m * g.N, y + m * g.N, g.N); });
}

namespace {

// Elements 4t..4t+3 of columns lo and hi (two bytes of each row) as one tile word: byte i holds element i of lo in
// its low nibble and of hi in its high one.
uint32_t TileWord(const uint8_t* lo, const uint8_t* hi) {
  uint16_t u, v;
  std::memcpy(&u, lo, 2);
  std::memcpy(&v, hi, 2);
  const uint32_t a = u, c = v;
  return (a & 0x000F) | ((c & 0x000F) << 4) | ((a & 0x00F0) << 4) | ((c & 0x00F0) << 8) | ((a & 0x0F00) << 8) |
         ((c & 0x0F00) << 12) | ((a & 0xF000) << 12) | ((c & 0xF000) << 16);
}

#if NPU_EP_X86
// Words of four neighbouring column pairs for the 8 steps in 16 bytes of their rows, stored as 16-byte runs: the
// nibbles are merged and put in element order on 16 bytes at a time, then a 4x4 word transpose gives each step's
// four words side by side (SSE2, in every x86-64).
void TileFourPairs(const uint8_t* const x[4], const uint8_t* const y[4], int64_t c, uint8_t* out) {
  const __m128i m = _mm_set1_epi8(0x0F);
  __m128i lo[4], hi[4];
  for (int r = 0; r < 4; ++r) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[r] + 16 * c));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(y[r] + 16 * c));
    const __m128i even = _mm_or_si128(_mm_and_si128(a, m), _mm_slli_epi16(_mm_and_si128(b, m), 4));
    const __m128i odd = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(a, 4), m), _mm_andnot_si128(m, b));
    lo[r] = _mm_unpacklo_epi8(even, odd);  // steps 8c..8c+3
    hi[r] = _mm_unpackhi_epi8(even, odd);  // steps 8c+4..8c+7
  }
  for (int h = 0; h < 2; ++h) {
    const __m128i* w = h == 0 ? lo : hi;
    const __m128i t0 = _mm_unpacklo_epi32(w[0], w[1]), t1 = _mm_unpacklo_epi32(w[2], w[3]);
    const __m128i t2 = _mm_unpackhi_epi32(w[0], w[1]), t3 = _mm_unpackhi_epi32(w[2], w[3]);
    const __m128i step[4] = {_mm_unpacklo_epi64(t0, t1), _mm_unpackhi_epi64(t0, t1), _mm_unpacklo_epi64(t2, t3),
                             _mm_unpackhi_epi64(t2, t3)};
    for (int s = 0; s < 4; ++s) _mm_storeu_si128(reinterpret_cast<__m128i*>(out + (8 * c + 4 * h + s) * 64), step[s]);
  }
}
#endif

}  // namespace

void TileInt4(const uint8_t* b, int64_t N, int64_t row_bytes, uint8_t* tiles, int threads) {
  const int64_t groups = (N + kTileCols - 1) / kTileCols, steps = row_bytes / 2;
  const std::vector<uint8_t> zeros(row_bytes, 0);  // columns past N: code 0
  ParallelFor(ThreadsFor(threads, groups * kTileCols * row_bytes), groups, [&](int64_t grp) {
    auto row = [&](int64_t n) { return n < N ? b + n * row_bytes : zeros.data(); };
    uint8_t* group = tiles + grp * steps * 64;
    int64_t vector_steps = 0;
#if NPU_EP_X86
    vector_steps = row_bytes / 16 * 8;
    for (int j = 0; j < 16; j += 4) {
      const uint8_t* x[4];
      const uint8_t* y[4];
      for (int r = 0; r < 4; ++r) x[r] = row(grp * kTileCols + j + r), y[r] = row(grp * kTileCols + j + r + 16);
      for (int64_t c = 0; c < row_bytes / 16; ++c) TileFourPairs(x, y, c, group + 4 * j);
    }
#endif
    for (int j = 0; j < 16; ++j) {  // the steps past the last 16 bytes, or all of them
      const uint8_t* x = row(grp * kTileCols + j);
      const uint8_t* y = row(grp * kTileCols + j + 16);
      for (int64_t t = vector_steps; t < steps; ++t) {
        const uint32_t word = TileWord(x + 2 * t, y + 2 * t);
        std::memcpy(group + t * 64 + 4 * j, &word, 4);  // little-endian: byte i is element i
      }
    }
  });
}

}  // namespace npu_ep::kern
