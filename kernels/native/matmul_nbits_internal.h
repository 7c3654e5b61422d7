// Shared between the MatMulNBits kernel files: the problem shape and the per-call prepared A (see matmul_nbits.cc
// for the "perm" layout both use).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu.h"
#include "intrinsics.h"
#include "matmul_nbits.h"

namespace npu_ep::kern::nbits {

constexpr int64_t kChunkBytes = 64;
constexpr int64_t kChunkElems = 128;

struct Shape {
  int64_t M, K, N, kb, row_bytes, n_chunks, kc, zp_bytes;
  int bs, bs_log2;  // block size is a power of two: block of element e is e >> bs_log2
};

// Column n of B: its packed row, block scales and packed zero points (null: symmetric, 8), from the one matrix or
// from the member segment holding it.
struct Column {
  const uint8_t* b;
  const float* sw;
  const uint8_t* zp;
};
// The matrix holding column n: the one B, or the member segment it falls in, and that matrix's width.
inline NBitsSegment SegmentOf(const NBitsGemm& g, int64_t n, int64_t& width) {
  if (g.segments == nullptr) {
    width = g.N;
    return {0, g.b, g.scales, g.zero_points};
  }
  int j = g.n_segments - 1;
  while (j > 0 && g.segments[j].n0 > n) --j;
  width = (j + 1 < g.n_segments ? g.segments[j + 1].n0 : g.N) - g.segments[j].n0;
  return g.segments[j];
}
// Block b's zero point of a column's packed zero points (null: symmetric, 8).
inline int ZeroPoint(const uint8_t* zp_row, int64_t b) {
  return zp_row == nullptr ? 8 : (zp_row[b >> 1] >> ((b & 1) * 4)) & 0x0F;
}
inline Column ColumnOf(const NBitsGemm& g, const Shape& s, int64_t n) {
  int64_t width;
  const NBitsSegment m = SegmentOf(g, n, width);
  const int64_t r = n - m.n0;
  return {m.b + r * s.row_bytes, m.scales + r * s.kb, m.zero_points ? m.zero_points + r * s.zp_bytes : nullptr};
}

// From this many rows on, AVX-512 hosts run the fp32 levels as outer products on k-major dequantized columns
// (matmul_nbits_panel_avx512.cc), summed as MLAS's fp32 kernel sums (ORT's bits); below it the per-column dot products.
constexpr int64_t kOuterMinRows = 2;

// Level 4's rows of A: int8 codes in natural order [M, kc] (zero past K), block scales and code sums [M, kb].
struct Int8A {
  const int8_t* q = nullptr;
  const float* scale = nullptr;
  const int32_t* block = nullptr;
};

// Level 4: the tile group (32 columns) holding column n, in the one matrix or in the member segment holding it.
constexpr int kTileCols = 32;
struct TileGroup {
  const uint8_t* b;   // [kb * bs / 4][64]
  const float* sw;    // [kb][stride]
  const uint8_t* zp;  // [ceil(kb / 2)][stride] packed pairs of blocks, or null: symmetric (8)
  int64_t stride;     // = lanes
  int64_t first;      // the column of lane 0
  int lanes;          // real columns: 32, or fewer in a matrix's last group
};
inline TileGroup TileGroupOf(const NBitsGemm& g, const Shape& s, int64_t n) {
  int64_t width;
  const NBitsSegment m = SegmentOf(g, n, width);
  const int64_t grp = (n - m.n0) / kTileCols, lanes = std::min<int64_t>(kTileCols, width - grp * kTileCols);
  return {m.b + grp * kTileCols * s.row_bytes,
          m.scales + grp * kTileCols * s.kb,
          m.zero_points ? m.zero_points + grp * kTileCols * s.zp_bytes : nullptr,
          lanes,
          m.n0 + grp * kTileCols,
          static_cast<int>(lanes)};
}

// Level 4: max|a| over one block's n elements as MLAS's AVX-512 QuantizeARow_CompInt8 finds it (ORT's CompInt8 on
// x86), NaN rule included: 16 lanes, each the running MAXPS (a > b ? a : b: a NaN operand gives b) of its |a| over
// the 16-element chunks that start before n (lanes past n read 0), then reduced 16 -> 8 -> 4 -> 2 -> 1 with MAXPS
// (upper half first). A NaN is so kept or dropped by where it sits, as on the CPU EP (matmul_nbits.mlas_block_max,
// the reference model's, is the same).
inline float MaxPs(float a, float b) { return a > b ? a : b; }
inline float MlasBlockMax(const float* a, int64_t n) {
  float lane[16] = {};
  for (int64_t k0 = 0; k0 < n; k0 += 16)
    for (int l = 0; l < 16; ++l) lane[l] = MaxPs(lane[l], k0 + l < n ? std::fabs(a[k0 + l]) : 0.0f);
  for (int l = 0; l < 8; ++l) lane[l] = MaxPs(lane[8 + l], lane[l]);
  for (int l = 0; l < 4; ++l) lane[l] = MaxPs(lane[4 + l], lane[l]);
  return MaxPs(MaxPs(lane[0], lane[2]), MaxPs(lane[1], lane[3]));
}
// Level 4: one scaled element's int8 code as MLAS converts it: rounded half to even, to int32 (NaN and values
// outside int32: INT_MIN), then its low byte (VPMOVDB truncates). So NaN is 0, and a code past 127 (a block whose
// NaN dropped its largest values from the maximum) wraps as on the CPU EP.
inline int8_t MlasCode(float x) {
  const float r = std::nearbyint(x);  // the default rounding mode: half to even, any magnitude
  const int32_t i = r >= -2147483648.0f && r < 2147483648.0f ? static_cast<int32_t>(r) : INT32_MIN;
  return static_cast<int8_t>(static_cast<uint8_t>(static_cast<uint32_t>(i) & 0xFF));
}

#if NPU_EP_X86
// accuracy_level 4's per-block int8 quantization of one row of A on AVX-512: the same codes and scales as the
// scalar QuantizeRow of matmul_nbits.cc (natural order, zero beyond K) and the per-block code sums.
void QuantizeRowAvx512(const float* a, const Shape& s, int8_t* q, float* scale, int32_t* block);
// Level 4, rows [r0, r1) x columns [n0, n1) of g.y (bias added), on the stored tiles (matmul_nbits_int8_avx512.cc).
// Every output is summed exactly in int32 per block and accumulated over the blocks in order,
// y = fma(float(dot_b - zp_b * sum_b(a)), sw_b * sa_b, y): one definition, the scalar and AVX2 paths' too, so a
// row has the same bits alone and in a prefill.
void Int8TilesAvx512(const NBitsGemm& g, const Shape& s, const Int8A& a, bool vnni, int64_t r0, int64_t r1, int64_t n0,
                     int64_t n1);
// Level 0..3, block_size >= 32, M = 1: columns [n0, n1) of g.y from A's row in perm layout ([kc]).
void GemvFp32Avx512(const NBitsGemm& g, const Shape& s, const float* a, int64_t n0, int64_t n1);
// Columns [n0, n1) of B dequantized k-major for OuterGemmAvx512: groups of 16 columns, [kc][16] each (group v at
// out + v * 16 * kc), the floats of DequantColAvx512; zero past the blocks and past n1 in the last group.
// block_size >= 16 (MatMulNBits' own minimum): a dword of nibbles lies in one block.
void DequantKMajorAvx512(const NBitsGemm& g, const Shape& s, int64_t n0, int64_t n1, float* out);
// y[r, c] = sum over k in order of a[r * kc + k] * column c's element k, for `rows` rows of A ([rows, kc]) and
// `cols` columns in DequantKMajorAvx512's groups, into y with row stride ldy.
void OuterGemmAvx512(const float* a, int64_t rows, const float* packed, int64_t cols, int64_t kc, float* y,
                     int64_t ldy);
#endif

}  // namespace npu_ep::kern::nbits
