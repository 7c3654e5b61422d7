// MatMulNBits (4-bit weights) as native kernels: the weights stay packed and are dequantized per chunk in
// registers, never as a whole float copy.
//
// Layouts (kb = ceil(K / block_size), row = kb * block_size / 2 bytes per column):
// - accuracy_level 0..3: ORT's. B [N, row] (element 2j in the low nibble of byte j), scales [N, kb], zero points
//   [N, ceil(kb / 2)] (block 2i in the low nibble).
// - accuracy_level 4: the int8 unit's tiles, chosen at compile time (npu_ep.quantization.matmul_nbits.int8_tiles):
//   B [ceil(N / 32), kb * block_size / 4, 64]: per group of 32 columns and 4 elements of K, byte 4j + i holds
//   element i of column j (low nibble) and of column 16 + j (high nibble), so one load and two nibble masks give
//   the two 16-column operands of VPDPBUSD; columns past N are code 0. Scales and zero points come in the same
//   column groups: per group its [kb, w] ([ceil(kb / 2), w]) block of ORT's arrays transposed (w = 32, or what is
//   left of N), so a pass over a group reads one run of tiles and one of scales.
#pragma once

#include <cstdint>

#include "sgemm.h"
#include "tile_dma.h"

namespace npu_ep::kern {

// Columns [n0, the next segment's n0) of B read one member matrix of npu::MatMulGroup, in the level's layout,
// where the program keeps it: the group's weights are never concatenated.
struct NBitsSegment {
  int64_t n0 = 0;
  const uint8_t* b = nullptr;
  const float* scales = nullptr;
  const uint8_t* zero_points = nullptr;  // null in every segment or in none
};

struct NBitsGemm {
  const float* a = nullptr;         // [M, K] float32
  int64_t M = 0, K = 0, N = 0;
  int block_size = 32;              // power of two, 16..256
  int accuracy_level = 0;           // 4: A quantized per block to int8 (ORT CompInt8); else fp32 math
  const uint8_t* b = nullptr;       // in the level's layout (above)
  const float* scales = nullptr;
  const uint8_t* zero_points = nullptr;  // packed nibbles, or null (= 8)
  const NBitsSegment* segments = nullptr;  // optional, ascending n0 from 0: B as side-by-side members (b, scales
  int n_segments = 0;                      // and zero_points unused)
  const float* bias = nullptr;      // [N] or null
  float* y = nullptr;               // [M, N]
  int threads = 1;
  // optional, fp32 levels (0-3) with M >= kSgemmMinRows: each task dequantizes its columns into a float panel
  // and multiplies it on this BLAS (MLAS's CompFp32 scheme) instead of one dot product per output
  Sgemm64 sgemm = nullptr;
  // optional: run the planner's output tiles (cut into column pieces) and count their DMA into *dma
  const TilePlanArgs* plan = nullptr;
  DmaCount* dma = nullptr;
};

// y = A @ dequant(B) (+ bias). Each output element is computed by one thread in a fixed order, so the bits do
// not depend on the thread count.
void MatMulNBits(const NBitsGemm& g);

// The float16 node (float16 A and y, the reference's float16 path): a [M, K] widened exactly, MatMulNBits on g (its
// a and y are this call's float32 copies), the result rounded once to float16 (nearest even, as numpy's astype)
// into y [M, N]. So the bits of the float32 kernel on the widened A, rounded.
void MatMulNBitsHalf(const NBitsGemm& g, const uint16_t* a, uint16_t* y);

// ORT's B [N, row_bytes] -> accuracy_level 4's tiles [ceil(N / 32), row_bytes / 2, 64] (layouts above), on up to
// `threads` threads (a little-endian host: the tiles are bytes, built from 16-bit words).
void TileInt4(const uint8_t* b, int64_t N, int64_t row_bytes, uint8_t* tiles, int threads);

}  // namespace npu_ep::kern
