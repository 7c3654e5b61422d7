// Python bindings of the NHWC chain convs (conv_nhwc.h): `kernels.conv_nhwc_depthwise`, `kernels.conv_nhwc_pointwise`.
// Arrays are taken as objects (AsArray: a bound step's arrays pass without a numpy conversion call).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "as_array.h"
#include "conv_nhwc.h"
#include "conv_tail_arg.h"
#include "packed_sgemm.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

template <typename T>
using Arr = py::array_t<T, py::array::c_style>;

Arr<float> Nhwc(py::handle x_in, const char* op) {
  Arr<float> x = AsArray<float>(x_in, op, "x");
  if (x.ndim() != 4) throw std::invalid_argument(std::string(op) + ": x must be [N, H, W, C]");
  return x;
}

// geometry: [kh, kw, sh, sw, pad top, left, bottom, right]; w [kh * kw, C] or grouped [C / 32 groups, kh * kw, 32]
py::array DepthwisePy(py::handle x_in, py::handle w_in, py::handle bias_in, const std::vector<int64_t>& geom,
                      int threads, py::handle codes_in, py::handle consts_in, bool nchw_in) {
  const char* op = "conv_nhwc_depthwise";
  const Arr<float> x = Nhwc(x_in, op);
  const Arr<float> w = AsArray<float>(w_in, op, "w");
  const auto bias = AsOptionalArray<float>(bias_in, op, "bias");
  const auto codes = AsOptionalArray<int32_t>(codes_in, op, "tail_codes");
  const auto consts = AsOptionalArray<float>(consts_in, op, "tail_consts");
  if (geom.size() != 8) throw std::invalid_argument(std::string(op) + ": geometry has 8 values");
  NhwcDepthwise d{};
  d.nchw_in = nchw_in;
  d.N = x.shape(0), d.H = x.shape(nchw_in ? 2 : 1), d.W = x.shape(nchw_in ? 3 : 2), d.C = x.shape(nchw_in ? 1 : 3);
  d.kh = geom[0], d.kw = geom[1], d.sh = geom[2], d.sw = geom[3], d.pt = geom[4], d.pl = geom[5];
  if (d.kh < 1 || d.kw < 1 || d.kh > kNhwcMaxKernel || d.sh < 1 || d.sw < 1 || geom[4] < 0 || geom[5] < 0 ||
      geom[6] < 0 || geom[7] < 0)
    throw std::invalid_argument(std::string(op) + ": bad geometry");
  const int64_t taps = d.kh * d.kw, groups = (d.C + kNhwcGroup - 1) / kNhwcGroup;
  const bool grouped = w.ndim() == 3 && w.shape(0) == groups && w.shape(1) == taps && w.shape(2) == kNhwcGroup;
  if (!grouped && (w.ndim() != 2 || w.shape(0) != taps || w.shape(1) != d.C))
    throw std::invalid_argument(std::string(op) + ": w must be [kh * kw, C] or [C / 32 groups, kh * kw, 32]");
  std::vector<float> regrouped;  // w [kh * kw, C] in the kernel's groups (conv_nhwc.py passes them grouped)
  if (!grouped) {
    regrouped.assign(static_cast<size_t>(groups * taps * kNhwcGroup), 0.0f);
    for (int64_t t = 0; t < taps; ++t)
      for (int64_t c = 0; c < d.C; ++c)
        regrouped[static_cast<size_t>((c / kNhwcGroup * taps + t) * kNhwcGroup + c % kNhwcGroup)] =
            w.data()[t * d.C + c];
  }
  if (bias && bias->size() != d.C) throw std::invalid_argument(std::string(op) + ": bias must have C values");
  d.OH = (d.H + geom[4] + geom[6] - d.kh) / d.sh + 1;
  d.OW = (d.W + geom[5] + geom[7] - d.kw) / d.sw + 1;
  if (d.H + geom[4] + geom[6] < d.kh || d.W + geom[5] + geom[7] < d.kw)
    throw std::invalid_argument(std::string(op) + ": the kernel is larger than the padded input");
  Arr<float> y({d.N, d.OH, d.OW, d.C});
  d.x = x.data(), d.w = grouped ? w.data() : regrouped.data(), d.bias = bias ? bias->data() : nullptr;
  d.tail = TailArg(codes, consts, op);
  d.y = y.mutable_data();
  {
    py::gil_scoped_release release;
    DepthwiseNhwc(d, threads);
  }
  return std::move(y);
}

// packed: B [C, M] in pack_sgemm_b's panels
py::array PointwisePy(py::handle x_in, py::handle packed_in, int64_t m, py::handle bias_in, int threads,
                      py::handle codes_in, py::handle consts_in) {
  const char* op = "conv_nhwc_pointwise";
  const Arr<float> x = Nhwc(x_in, op);
  const Arr<float> packed = AsArray<float>(packed_in, op, "packed");
  const auto bias = AsOptionalArray<float>(bias_in, op, "bias");
  const auto codes = AsOptionalArray<int32_t>(codes_in, op, "tail_codes");
  const auto consts = AsOptionalArray<float>(consts_in, op, "tail_consts");
  const int64_t c = x.shape(3), p = x.shape(0) * x.shape(1) * x.shape(2);
  if (m < 1 || packed.ndim() != 3 || packed.shape(0) != (m + kSgemmPanel - 1) / kSgemmPanel || packed.shape(1) != c ||
      packed.shape(2) != kSgemmPanel)
    throw std::invalid_argument(std::string(op) + ": packed must be B [C, M] in pack_sgemm_b's panels");
  if (bias && bias->size() != m) throw std::invalid_argument(std::string(op) + ": bias must have M values");
  const ConvTail tail = TailArg(codes, consts, op);
  Arr<float> y({x.shape(0), x.shape(1), x.shape(2), static_cast<py::ssize_t>(m)});
  float* yd = y.mutable_data();
  {
    py::gil_scoped_release release;
    PointwiseNhwc(x.data(), p, c, packed.data(), m, bias ? bias->data() : nullptr, tail, yd, threads);
  }
  return std::move(y);
}

}  // namespace

void BindConvNhwc(py::module_& m) {
  m.attr("nhwc_depthwise_group") = kNhwcGroup;
  m.def("conv_nhwc_depthwise", &DepthwisePy, py::arg("x"), py::arg("w"), py::arg("bias"), py::arg("geometry"),
        py::arg("threads") = 1, py::arg("tail_codes") = py::none(), py::arg("tail_consts") = py::none(),
        py::arg("nchw_in") = false,
        "depthwise float32 conv into NHWC: x [N, H, W, C] (nchw_in: [N, C, H, W]), w [kh * kw, C] or grouped "
        "[ceil(C / 32), kh * kw, 32] (nhwc_depthwise_group), geometry "
        "[kh, kw, sh, sw, pads t l b r]; the reference's operations in its order, then the fused tail");
  m.def("conv_nhwc_pointwise", &PointwisePy, py::arg("x"), py::arg("packed"), py::arg("m"), py::arg("bias"),
        py::arg("threads") = 1, py::arg("tail_codes") = py::none(), py::arg("tail_consts") = py::none(),
        "1x1 float32 conv in NHWC: x [N, H, W, C] times B [C, M] packed by pack_sgemm_b, + bias, then the tail");
}

}  // namespace npu_ep::kern
