// ConvTranspose of float32 / float16 [N, C, H, W] (`kernels.conv_transpose`) for kernels/ops/conv_transpose.py: the
// reference's GEMM then col2im. The product W^T x per group is a pointwise conv on the conv kernels' GEMM
// (DenseFloat: [N, g * Mg * kh * kw, H, W]); then per output plane (n, g, m) the taps are scatter-added in the
// reference's order (from 0.0, tap (i, j) after tap (i, j - 1), row-major) into the full plane, which is cropped
// by the pads (rows and columns past it are 0), + bias, and rounded once to float16 for a float16 node. A unit-stride
// one whose pads crop no more than the taps reach runs as the equivalent Conv on the same kernels (no col2im).
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("O3", "fp-contract=off")  // the strided adds vectorize; adds only, as numpy's
#endif
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings.h"
#include "conv.h"
#include "half.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

using Floats = py::array_t<float, py::array::c_style>;

// The transposed conv's geometry: the input, Mg output channels per group, the taps, and the output window on the
// full (uncropped) plane [FH, FW]: output row oy is full row oy + top (0 outside the full plane).
struct Geometry {
  int64_t N = 0, C = 0, H = 0, W = 0, group = 1, Mg = 0, kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1;
  int64_t top = 0, left = 0, FH = 0, FW = 0, OH = 0, OW = 0;
};

// Plane (n, g, m) of the full output: the taps of prod [N, g * Mg * kh * kw, H * W] added tap by tap.
void FullPlane(const Geometry& s, const float* prod, int64_t n, int64_t gm, float* full) {
  std::fill(full, full + s.FH * s.FW, 0.0f);
  const int64_t taps = s.kh * s.kw;
  const float* base = prod + (n * s.group * s.Mg + gm) * taps * s.H * s.W;
  for (int64_t i = 0; i < s.kh; ++i)
    for (int64_t j = 0; j < s.kw; ++j) {
      const float* tap = base + (i * s.kw + j) * s.H * s.W;
      for (int64_t y = 0; y < s.H; ++y) {
        float* row = full + (i * s.dh + y * s.sh) * s.FW + j * s.dw;
        const float* src = tap + y * s.W;
        if (s.sw == 1)
          for (int64_t x = 0; x < s.W; ++x) row[x] += src[x];
        else
          for (int64_t x = 0; x < s.W; ++x) row[x * s.sw] += src[x];
      }
    }
}

// Output row oy of a plane from its full plane, + bias, into dst (float32 or float16 bits).
template <typename T>
void CropRow(const Geometry& s, const float* full, int64_t oy, float bias, float* scratch, T* dst) {
  const int64_t fy = oy + s.top;
  for (int64_t ox = 0; ox < s.OW; ++ox) {
    const int64_t fx = ox + s.left;
    const float v = fy >= 0 && fy < s.FH && fx >= 0 && fx < s.FW ? full[fy * s.FW + fx] : 0.0f;
    scratch[ox] = v + bias;
  }
  if constexpr (sizeof(T) == 2)
    FloatToHalfRow(scratch, dst, s.OW);
  else
    std::copy(scratch, scratch + s.OW, dst);
}

template <typename T>
void Col2Im(const Geometry& s, const float* prod, const float* bias, T* y, int threads) {
  const int64_t planes = s.N * s.group * s.Mg;
  conv_detail::ParallelItems(threads, planes, s.kh * s.kw * s.H * s.W + s.OH * s.OW, [&](int64_t p) {
    thread_local std::vector<float> full, scratch;
    full.resize(static_cast<size_t>(s.FH * s.FW));
    scratch.resize(static_cast<size_t>(s.OW));
    const int64_t n = p / (s.group * s.Mg), gm = p % (s.group * s.Mg);
    FullPlane(s, prod, n, gm, full.data());
    const float b = bias ? bias[gm] : 0.0f;
    for (int64_t oy = 0; oy < s.OH; ++oy) CropRow(s, full.data(), oy, b, scratch.data(), y + (p * s.OH + oy) * s.OW);
  });
}

// A unit-stride ConvTranspose is the Conv of x with each group's weights swapped (c <-> m) and flipped (i, j), padded
// by (k - 1) d minus the transposed pads: that conv's shape, or none where a pad would be negative (cropping).
std::optional<ConvShape> UnitStrideConv(const Geometry& s) {
  if (s.sh != 1 || s.sw != 1) return std::nullopt;
  ConvShape c;
  c.N = s.N, c.C = s.C, c.H = s.H, c.W = s.W, c.M = s.group * s.Mg, c.group = s.group;
  c.kh = s.kh, c.kw = s.kw, c.dh = s.dh, c.dw = s.dw;
  c.pt = (s.kh - 1) * s.dh - s.top, c.pl = (s.kw - 1) * s.dw - s.left;
  c.pb = s.OH - s.H - c.pt + (s.kh - 1) * s.dh, c.pr = s.OW - s.W - c.pl + (s.kw - 1) * s.dw;
  if (c.pt < 0 || c.pl < 0 || c.pb < 0 || c.pr < 0) return std::nullopt;
  c.Finish();
  if (c.OH != s.OH || c.OW != s.OW) return std::nullopt;
  return c;
}

Geometry GeometryOf(const py::array& x, const std::vector<int64_t>& g) {
  if (x.ndim() != 4 || !(x.flags() & py::array::c_style))
    throw std::invalid_argument("conv_transpose: x must be a C-contiguous [N, C, H, W] array");
  if (g.size() != 14)
    throw std::invalid_argument(
        "conv_transpose: geometry must be 14 ints [group, Mg, kh, kw, sh, sw, dh, dw, top, left, FH, FW, OH, OW]");
  Geometry s;
  s.N = x.shape(0), s.C = x.shape(1), s.H = x.shape(2), s.W = x.shape(3);
  s.group = g[0], s.Mg = g[1], s.kh = g[2], s.kw = g[3], s.sh = g[4], s.sw = g[5], s.dh = g[6], s.dw = g[7];
  s.top = g[8], s.left = g[9], s.FH = g[10], s.FW = g[11], s.OH = g[12], s.OW = g[13];
  const bool positive = s.group > 0 && s.Mg > 0 && s.kh > 0 && s.kw > 0 && s.sh > 0 && s.sw > 0 && s.dh > 0 && s.dw > 0;
  if (!positive || s.C % s.group || s.OH < 0 || s.OW < 0 || s.FH < s.sh * (s.H - 1) + (s.kh - 1) * s.dh + 1 ||
      s.FW < s.sw * (s.W - 1) + (s.kw - 1) * s.dw + 1)
    throw std::invalid_argument("conv_transpose: inconsistent geometry for x " + Dims(x));
  return s;
}

py::array ConvTransposePy(const py::array& x, const Floats& w, const std::optional<Floats>& bias,
                          const std::vector<int64_t>& geom, uintptr_t sgemm, int threads, const Floats& w_conv) {
  const Geometry s = GeometryOf(x, geom);
  const bool half = x.dtype().kind() == 'f' && x.itemsize() == 2;
  if (!half && !py::isinstance<py::array_t<float>>(x))
    throw std::invalid_argument("conv_transpose: x must be float32 or float16");
  const int64_t cols = s.Mg * s.kh * s.kw;
  if (w.size() != s.C * cols || w_conv.size() != w.size())
    throw std::invalid_argument("conv_transpose: w must be [group, C/group, Mg*kh*kw], w_conv as many values");
  if (bias && bias->size() != s.group * s.Mg) throw std::invalid_argument("conv_transpose: bias must hold M values");
  if (sgemm == 0) throw std::invalid_argument("conv_transpose: no sgemm address");
  py::array y(x.dtype(), std::vector<py::ssize_t>{s.N, s.group * s.Mg, s.OH, s.OW});
  const float* b = bias ? bias->data() : nullptr;
  const void* in = x.data();
  void* out = y.mutable_data();
  py::gil_scoped_release release;
  std::unique_ptr<float[]> wide;  // uninitialized: every element is written
  const float* xf = static_cast<const float*>(in);
  if (half) {
    wide.reset(new float[static_cast<size_t>(s.N * s.C * s.H * s.W)]);
    HalfToFloatRow(static_cast<const uint16_t*>(in), wide.get(), s.N * s.C * s.H * s.W);
    xf = wide.get();
  }
  if (const std::optional<ConvShape> conv = UnitStrideConv(s)) {
    const Sgemm64 gemm = reinterpret_cast<Sgemm64>(sgemm);
    if (!half) {
      DenseFloat(*conv, xf, w_conv.data(), b, static_cast<float*>(out), gemm, threads);
      return y;
    }
    std::unique_ptr<float[]> yf(new float[static_cast<size_t>(s.N * conv->M * s.OH * s.OW)]);
    DenseFloat(*conv, xf, w_conv.data(), b, yf.get(), gemm, threads);
    FloatToHalfRow(yf.get(), static_cast<uint16_t*>(out), s.N * conv->M * s.OH * s.OW);
    return y;
  }
  ConvShape pw;  // the product as a pointwise conv: [N, group * cols, H, W]
  pw.N = s.N, pw.C = s.C, pw.H = s.H, pw.W = s.W, pw.M = s.group * cols, pw.group = s.group;
  pw.Finish();
  std::unique_ptr<float[]> prod(new float[static_cast<size_t>(s.N * pw.M * s.H * s.W)]);  // written whole
  DenseFloat(pw, xf, w.data(), nullptr, prod.get(), reinterpret_cast<Sgemm64>(sgemm), threads);
  if (half)
    Col2Im(s, prod.get(), b, static_cast<uint16_t*>(out), threads);
  else
    Col2Im(s, prod.get(), b, static_cast<float*>(out), threads);
  return y;
}

}  // namespace

void BindConvTranspose(py::module_& m) {
  m.def("conv_transpose", &ConvTransposePy, py::arg("x"), py::arg("w"), py::arg("bias"), py::arg("geometry"),
        py::arg("sgemm"), py::arg("threads"), py::arg("w_conv"),
        "ConvTranspose of float32/float16 x [N, C, H, W]: w [group, C/group, Mg*kh*kw] (columns (m, i, j)) on the "
        "conv GEMM (a pointwise conv; sgemm: kernels.host_blas.sgemm_address()), then the taps scatter-added in "
        "row-major order into each full plane, cropped (geometry [group, Mg, kh, kw, sh, sw, dh, dw, top, left, FH, "
        "FW, OH, OW]), + bias [M] or None; float16 widened and rounded once. w_conv [group, C/group*kh*kw, Mg]: the "
        "weights swapped and flipped, for a unit stride run as the equivalent Conv");
}

}  // namespace npu_ep::kern
