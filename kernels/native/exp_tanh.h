// exp_tanh.cc's float32 exp and tanh rows for other kernels (the element-wise engine's exp, elu and softplus).
#pragma once

#include <cstdint>

namespace npu_ep::kern {

// y[i] = exp(x[i]) or tanh(x[i]) for i in [0, n) (y == x: in place), the polynomials exp_tanh.cc states: the same
// bits on every ISA, whatever the row's length and position.
void ExpRow(const float* x, float* y, int64_t n);
void TanhRow(const float* x, float* y, int64_t n);

}  // namespace npu_ep::kern
