// A float conv over a few output pixels on weights packed once in panels of output channels (conv_panels.cc).
#pragma once

#include <cstdint>

#include "conv_geometry.h"
#include "conv_tail.h"
#include "cpu.h"

namespace npu_ep::kern {

#if NPU_EP_X86
// Any dense or grouped float conv (DenseFloat's geometry and tail) on weights packed in panels: wp [group,
// Mg / kPanel rounded up, K, kPanel] (conv_gemm.h's kPanel), panel q's row k holding w[g, k, q * kPanel + l] (zeros
// past Mg), K ordered (c, i, j). The output channels run in the lanes (ChannelGemmAvx512), so a conv over fewer than
// 16 output pixels fills its vectors; B is x's planes read in place through the taps' offsets (a padded conv: a
// zero-padded copy of the group's planes). Each output summed as ChannelGemmAvx512 sums it, whatever the thread
// count; AVX-512F only.
void PanelsFloat(const ConvShape& s, const float* x, const float* wp, const float* bias, float* y, int threads,
                 const ConvTail& tail);
#endif

}  // namespace npu_ep::kern
