// numpy's pairwise float32 sum of a contiguous row, for kernels that give the reference's bits where it sums with
// np.add.reduce: under 8 values one by one; up to 128 in eight running sums combined as
// ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)), then the rest one by one; longer rows split at half rounded down to a
// multiple of 8.
#pragma once

#include <cstdint>

namespace npu_ep::kern {

inline float PairwiseSum(const float* a, int64_t n) {
  if (n < 8) {
    float r = -0.0f;
    for (int64_t i = 0; i < n; ++i) r += a[i];
    return r;
  }
  if (n <= 128) {
    float r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - n % 8; i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t half = n / 2;
  half -= half % 8;
  return PairwiseSum(a, half) + PairwiseSum(a + half, n - half);
}

}  // namespace npu_ep::kern
