// Shared between the MatMulNBits kernel files: the problem shape and the per-call prepared A (see qnbit_gemm.cc
// for the "perm" layout both use).
#pragma once

#include <cstdint>

#include "cpu.h"
#include "qnbit_gemm.h"

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
inline Column ColumnOf(const NBitsGemm& g, const Shape& s, int64_t n) {
  if (g.segments == nullptr)
    return {g.b + n * s.row_bytes, g.scales + n * s.kb, g.zero_points ? g.zero_points + n * s.zp_bytes : nullptr};
  int j = g.n_segments - 1;
  while (j > 0 && g.segments[j].n0 > n) --j;
  const NBitsSegment& seg = g.segments[j];
  const int64_t r = n - seg.n0;
  return {seg.b + r * s.row_bytes, seg.scales + r * s.kb, seg.zero_points ? seg.zero_points + r * s.zp_bytes : nullptr};
}
inline bool Symmetric(const NBitsGemm& g) {
  return g.segments != nullptr ? g.segments[0].zero_points == nullptr : g.zero_points == nullptr;
}

// One row of A, prepared once per call: int8 codes, block scales and lane sums (level 4) or the float row in
// perm layout (level 0..3).
struct GemvA {
  const int8_t* q = nullptr;       // [kc]
  const float* scale = nullptr;    // [kb]
  const int32_t* lane = nullptr;   // [kc / 8]
  const float* a = nullptr;        // [kc]
};

#if NPU_EP_X86
// accuracy_level 4's per-block int8 quantization of one row of A on AVX-512: the same bits as the scalar
// QuantizeRow of qnbit_gemm.cc (codes q in perm layout, zero beyond K; block scales; lane sums). No block sums.
void QuantizeRowAvx512(const float* a, const Shape& s, int8_t* q, float* scale, int32_t* lane);
// M = 1, columns [n0, n1) of g.y (bias added). Same bits as the AVX-512 Cols4/Tile4 (level 4) and
// dequantize-then-dot (level 0) paths of qnbit_gemm.cc: the same per-lane products and summation order.
void GemvInt8Avx512(const NBitsGemm& g, const Shape& s, const GemvA& a, bool vnni, int64_t n0, int64_t n1);
// Level 0..3, block_size >= 32.
void GemvFp32Avx512(const NBitsGemm& g, const Shape& s, const GemvA& a, int64_t n0, int64_t n1);
// Level 0..3, M >= 16: y[r, c] = dot(a row r, panel column c) over kc (a multiple of 16) for `rows` rows of A
// ([rows, kc]) and `cols` dequantized columns ([cols, kc]), into y with row stride ldy (qnbit_panel_avx512.cc).
void PanelGemmAvx512(const float* a, int64_t rows, const float* panel, int64_t cols, int64_t kc, float* y,
                     int64_t ldy);
#endif

}  // namespace npu_ep::kern::nbits
