// MatMulNBits (4-bit weights in ORT's packed layout) as native kernels: the weights stay packed and are
// dequantized per chunk in registers, never as a whole float copy.
#pragma once

#include <cstdint>

#include "sgemm.h"
#include "tile_dma.h"

namespace npu_ep::kern {

// Columns [n0, the next segment's n0) of B read one member matrix of npu::MatMulGroup, in ORT's layout, where
// ORT keeps it: the group's weights are never concatenated.
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
  const uint8_t* b = nullptr;       // [N, kb, block_size / 2], element 2j in the low nibble of byte j
  const float* scales = nullptr;    // [N, kb]
  const uint8_t* zero_points = nullptr;  // [N, ceil(kb / 2)] packed nibbles, or null (= 8)
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

}  // namespace npu_ep::kern
