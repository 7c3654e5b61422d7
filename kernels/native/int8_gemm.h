// int8 GEMM with exact int32 accumulation (MatMulInteger, QLinearMatMul, MatMulIntegerToFloat).
#pragma once

#include <cstdint>

#include "cpu.h"
#include "tile_dma.h"

namespace npu_ep::kern {

// B is prepared once (compile time): B' = B with uint8 shifted by -128 (so every B is signed), K zero-padded to kp
// (a multiple of 64), N to np (a multiple of 16), laid out as bp[np / 16][kp / 4][16][4] - for each block of 16
// columns, 4 consecutive k of each column side by side (the vpdpbusd operand order); bsum[n] = sum_k B'[k, n];
// bzp[n] = B's zero point shifted the same way (bsum, bzp padded to np with zeros).
struct Int8Gemm {
  const uint8_t* a = nullptr;  // [M, K], uint8 or int8 (a_signed) bytes
  bool a_signed = false;
  const int32_t* azp = nullptr;  // A's zero point: one value, or one per row (azp_per_row)
  bool azp_per_row = false;
  int64_t M = 0, K = 0, N = 0, kp = 0;
  const int8_t* bp = nullptr;
  const int32_t* bsum = nullptr;
  const int32_t* bzp = nullptr;  // [N]
  int32_t* acc = nullptr;        // [M, N] exact (A - azp) @ (B - bzp), wrapping like int32 hardware
  // optional requantization (QLinearMatMul, QLinearConv):
  // y = saturate(rint(clip(float(acc + bias) * mult, lo - zp, hi - zp)) + zp), the bias add wrapping like int32
  const float* mult = nullptr;  // one value, or [N] (mult_per_col), or [M] (mult_per_row)
  bool mult_per_col = false, mult_per_row = false;
  const int32_t* bias_row = nullptr;  // [M] or null
  int32_t y_zp = 0;
  bool y_signed = false;
  uint8_t* y = nullptr;  // [M, N] uint8 / int8, rows ldy apart
  int64_t ldy = 0;       // 0: N
  int threads = 1;
  // optional: run the planner's output tiles (cut into pieces of 32 columns; plan->tn must be a multiple of 16)
  // and count their DMA into *dma
  const TilePlanArgs* plan = nullptr;
  DmaCount* dma = nullptr;
};

void Int8MatMul(const Int8Gemm& g);

// One int32 sum to an 8-bit code, the int8 unit's epilogue (Int8MatMul, QLinearConv): MLAS's clip, maxps(v, lo)
// then minps(v, hi), so a NaN (an infinite multiplier times 0) gives the lowest code, as the VNNI epilogue's vmaxps.
inline uint8_t Requantize(int32_t acc, float mult, int32_t zp, bool is_signed) {
  const float lo = is_signed ? -128.0f : 0.0f, hi = is_signed ? 127.0f : 255.0f;
  const float z = static_cast<float>(zp);
  float v = static_cast<float>(acc) * mult;
  v = v > lo - z ? v : lo - z;
  v = v < hi - z ? v : hi - z;
  v = RoundHalfEven(v) + z;  // |v| <= 255 + |zp| after the clip
  const int32_t q = static_cast<int32_t>(v);
  return is_signed ? static_cast<uint8_t>(static_cast<int8_t>(q)) : static_cast<uint8_t>(q);
}

}  // namespace npu_ep::kern
