// Float convs of a layout chain in NHWC (conv_nhwc.cc; kernels/layout.py chooses the chain, kernels/ops/conv_nhwc.py
// runs its steps).
#pragma once

#include <cstdint>

#include "conv_tail.h"

namespace npu_ep::kern {

constexpr int64_t kNhwcMaxKernel = 16;  // kernel rows a depthwise conv may have
constexpr int64_t kNhwcGroup = 32;      // channels of a depthwise weight group

// y [N, OH, OW, C] = the depthwise conv of x [N, H, W, C] with w [ceil(C / kNhwcGroup), kh * kw, kNhwcGroup] (each
// group's taps, channels in the lanes, the last group's missing channels zero), + bias [C] if given,
// then the tail; unit dilation, pads top/left (bottom/right follow from OH, OW). nchw_in: x is [N, C, H, W] (a chain's
// first conv reads its NCHW input in place of a Transpose before it).
struct NhwcDepthwise {
  const float* x;
  int64_t N, H, W, C;
  const float* w;
  int64_t kh, kw, sh, sw, pt, pl;
  const float* bias;
  ConvTail tail;
  float* y;
  int64_t OH, OW;
  bool nchw_in = false;
};
void DepthwiseNhwc(const NhwcDepthwise& d, int threads);

// y [P, M] = x [P, C] times B [C, M] packed by PackSgemmB, + bias [M] if given, then the tail.
void PointwiseNhwc(const float* x, int64_t P, int64_t C, const float* packed, int64_t M, const float* bias,
                   const ConvTail& tail, float* y, int threads);

}  // namespace npu_ep::kern
