// The 256-entry byte lookup of npu::QdqLut (qdq_lut.cc), shared with QLinearConv's fused output table.
#pragma once

#include <cstdint>

namespace npu_ep::kern {

// y[i] = row[x[i]] for i in [0, n); x may equal y (in place).
void LutRow(const uint8_t* x, int64_t n, const uint8_t* row, uint8_t* y);

}  // namespace npu_ep::kern
