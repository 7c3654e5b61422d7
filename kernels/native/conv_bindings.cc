// Python bindings of the conv-net kernels (conv.h, pool.h). Geometry arrives as one list of 12 ints
// [M, group, kh, kw, sh, sw, dh, dw, pad_top, pad_left, pad_bottom, pad_right]; arrays are checked here (dtype,
// size, contiguity) so a wrong call is a ValueError naming the argument, never a crash; kernels run without the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "as_array.h"
#include "conv.h"
#include "conv_gemm.h"
#include "conv_panels.h"
#include "conv_tail_arg.h"
#include "cpu.h"
#include "half.h"
#include "pool.h"

namespace py = pybind11;

namespace npu_ep::kern {

namespace {

template <typename T>
using Arr = py::array_t<T, py::array::c_style>;

ConvShape Shape(const py::array& x, const std::vector<int64_t>& geom, const char* op) {
  if (geom.size() != 12)
    throw std::invalid_argument(std::string(op) +
                                ": geometry must be 12 ints [M, group, kh, kw, sh, sw, dh, dw, "
                                "pt, pl, pb, pr], got " +
                                std::to_string(geom.size()));
  if (x.ndim() != 4 || !(x.flags() & py::array::c_style))
    throw std::invalid_argument(std::string(op) + ": x must be a C-contiguous [N, C, H, W] array");
  ConvShape s;
  s.N = x.shape(0);
  s.C = x.shape(1);
  s.H = x.shape(2);
  s.W = x.shape(3);
  s.M = geom[0];
  s.group = geom[1];
  s.kh = geom[2];
  s.kw = geom[3];
  s.sh = geom[4];
  s.sw = geom[5];
  s.dh = geom[6];
  s.dw = geom[7];
  s.pt = geom[8];
  s.pl = geom[9];
  s.pb = geom[10];
  s.pr = geom[11];
  s.Finish();
  return s;
}

void ExpectSize(const py::array& a, int64_t n, const char* op, const char* what) {
  if (a.size() != n)
    throw std::invalid_argument(std::string(op) + ": " + what + " has " + std::to_string(a.size()) +
                                " elements, expected " + std::to_string(n));
}

bool IsByteArray(const py::array& a, const char* op, const char* what) {
  if (py::isinstance<py::array_t<int8_t>>(a)) return true;
  if (!py::isinstance<py::array_t<uint8_t>>(a))
    throw std::invalid_argument(std::string(op) + ": " + what + " must be uint8 or int8");
  return false;
}

// The tail's optional per-output-channel operand (a PRelu's slopes: one per output channel, the constant of
// instruction `at`), checked against the tail and the conv's M.
void ChannelArg(ConvTail& tail, const std::optional<Arr<float>>& consts, int64_t at, int64_t M, const char* op) {
  if (!consts) return;
  if (at < 0 || at >= tail.n)
    throw std::invalid_argument(std::string(op) + ": tail_channel_at " + std::to_string(at) + " is not one of the " +
                                std::to_string(tail.n) + " tail instructions");
  if (tail.n > kMaxChannelTail)
    throw std::invalid_argument(std::string(op) + ": a tail with a per-channel operand has at most " +
                                std::to_string(kMaxChannelTail) + " instructions, got " + std::to_string(tail.n));
  ExpectSize(*consts, M, op, "tail_channel_consts (one per output channel)");
  tail.channel_consts = consts->data();
  tail.channel_at = at;
}

py::array_t<float> Im2ColPy(const Arr<float>& x, int64_t n, const std::vector<int64_t>& geom, int threads) {
  const ConvShape s = Shape(x, geom, "conv_im2col");
  if (n < 0 || n >= s.N) throw std::invalid_argument("conv_im2col: image index out of range");
  py::array_t<float> cols({s.group, s.Cg() * s.kh * s.kw, s.P()});
  float* out = cols.mutable_data();
  {
    py::gil_scoped_release release;
    Im2ColFloat(s, x.data(), n, out, threads);
  }
  return cols;
}

// A float conv on x of float32 or float16 (the reference's float16 path: x widened exactly, the float32 conv,
// rounded once to float16); run(xf, yf) is the float32 kernel, called without the GIL. Into `out` (ORT's buffer
// for a bound step) when given: x's dtype, C order, writeable, N*M*OH*OW elements.
template <typename Run>
py::array FloatConv(const py::array& x, const ConvShape& s, const char* op, const py::object& out, Run run) {
  const bool half = x.dtype().kind() == 'f' && x.itemsize() == 2;
  if (!half && !py::isinstance<Arr<float>>(x))
    throw std::invalid_argument(std::string(op) + ": x must be float32 or float16, got " +
                                std::string(py::str(x.dtype())));
  py::array y = NullArray();
  if (out.is_none()) {
    y = py::array(x.dtype(), std::vector<py::ssize_t>{s.N, s.M, s.OH, s.OW});
  } else {
    if (py::isinstance<py::array>(out)) y = py::reinterpret_borrow<py::array>(out);
    if (!y || !y.dtype().equal(x.dtype()) || !(y.flags() & py::array::c_style) || !y.writeable() ||
        y.size() != s.N * s.M * s.OH * s.OW)
      throw std::invalid_argument(std::string(op) + ": out must be a writeable C-order array of x's dtype and " +
                                  std::to_string(s.N * s.M * s.OH * s.OW) + " elements");
  }
  const void* in = x.data();
  void* dst = y.mutable_data();
  {
    py::gil_scoped_release release;
    if (!half) {
      run(static_cast<const float*>(in), static_cast<float*>(dst));
    } else {
      const int64_t nx = s.N * s.C * s.H * s.W, ny = s.N * s.M * s.OH * s.OW;
      std::unique_ptr<float[]> xf(new float[static_cast<size_t>(nx)]);  // uninitialized: written whole
      std::unique_ptr<float[]> yf(new float[static_cast<size_t>(ny)]);
      HalfToFloatRow(static_cast<const uint16_t*>(in), xf.get(), nx);
      run(xf.get(), yf.get());
      FloatToHalfRow(yf.get(), static_cast<uint16_t*>(dst), ny);
    }
  }
  return y;
}

// A float conv's checked arrays, shape and fused tail (op names the binding in messages); it holds the arrays
// the tail points into.
struct FloatConvArgs {
  std::optional<Arr<float>> w, bias, consts, channel_consts;
  std::optional<Arr<int32_t>> codes;
  ConvShape s;
  ConvTail tail;
};

FloatConvArgs FloatArgs(const py::array& x, const py::object& w_in, const py::object& bias_in,
                        const std::vector<int64_t>& geom, const py::object& codes_in, const py::object& consts_in,
                        const py::object& channel_in, int64_t tail_channel_at, const char* op) {
  if (w_in.is_none()) throw py::type_error(std::string(op) + ": w must be an array of float32");
  FloatConvArgs a;
  a.w = AsOptionalArray<float>(w_in, op, "w");
  a.bias = AsOptionalArray<float>(bias_in, op, "bias");
  a.codes = AsOptionalArray<int32_t>(codes_in, op, "tail_codes");
  a.consts = AsOptionalArray<float>(consts_in, op, "tail_consts");
  a.channel_consts = AsOptionalArray<float>(channel_in, op, "tail_channel_consts");
  a.s = Shape(x, geom, op);
  a.tail = TailArg(a.codes, a.consts, op);
  ChannelArg(a.tail, a.channel_consts, tail_channel_at, a.s.M, op);
  if (a.bias) ExpectSize(*a.bias, a.s.M, op, "bias");
  return a;
}

py::array DepthwisePy(const py::array& x, const py::object& w_in, const py::object& bias_in,
                      const std::vector<int64_t>& geom, int threads, const py::object& codes_in,
                      const py::object& consts_in, const py::object& channel_in, int64_t tail_channel_at,
                      const py::object& out) {
  const FloatConvArgs a =
      FloatArgs(x, w_in, bias_in, geom, codes_in, consts_in, channel_in, tail_channel_at, "conv_depthwise");
  const ConvShape& s = a.s;
  if (s.group != s.C) throw std::invalid_argument("conv_depthwise: group must equal the input channels");
  ExpectSize(*a.w, s.M * s.kh * s.kw, "conv_depthwise", "w");
  const float* b = a.bias ? a.bias->data() : nullptr;
  const float* wd = a.w->data();
  return FloatConv(x, s, "conv_depthwise", out,
                   [&](const float* xf, float* yf) { DepthwiseFloat(s, xf, wd, b, yf, threads, a.tail); });
}

py::array DensePy(const py::array& x, const py::object& w_in, const py::object& bias_in,
                  const std::vector<int64_t>& geom, uintptr_t sgemm, int threads, const py::object& codes_in,
                  const py::object& consts_in, const py::object& channel_in, int64_t tail_channel_at,
                  const py::object& out) {
  const FloatConvArgs a =
      FloatArgs(x, w_in, bias_in, geom, codes_in, consts_in, channel_in, tail_channel_at, "conv_dense");
  const ConvShape& s = a.s;
  ExpectSize(*a.w, s.M * s.Cg() * s.kh * s.kw, "conv_dense", "w");
  if (sgemm == 0) throw std::invalid_argument("conv_dense: no sgemm address");
  const float* b = a.bias ? a.bias->data() : nullptr;
  const float* wd = a.w->data();
  const auto gemm = reinterpret_cast<Sgemm64>(sgemm);
  return FloatConv(x, s, "conv_dense", out,
                   [&](const float* xf, float* yf) { DenseFloat(s, xf, wd, b, yf, gemm, threads, a.tail); });
}

py::array PanelsPy(const py::array& x, const py::object& w_in, const py::object& bias_in,
                   const std::vector<int64_t>& geom, int threads, const py::object& codes_in,
                   const py::object& consts_in, const py::object& channel_in, int64_t tail_channel_at,
                   const py::object& out) {
  const char* op = "conv_panels";
  const FloatConvArgs a = FloatArgs(x, w_in, bias_in, geom, codes_in, consts_in, channel_in, tail_channel_at, op);
  const ConvShape& s = a.s;
#if NPU_EP_X86
  if (ActiveIsa() < Isa::kAvx512) throw std::invalid_argument("conv_panels: needs AVX-512F");
  ExpectSize(*a.w, s.group * ((s.Mg() + kPanel - 1) / kPanel) * kPanel * s.Cg() * s.kh * s.kw, op, "w (packed panels)");
  const float* b = a.bias ? a.bias->data() : nullptr;
  const float* wp = a.w->data();
  return FloatConv(x, s, op, out, [&](const float* xf, float* yf) { PanelsFloat(s, xf, wp, b, yf, threads, a.tail); });
#else
  (void)s;
  throw std::invalid_argument("conv_panels: needs AVX-512F");
#endif
}

// The integer conv's inputs as QConv takes them, checked (op names the binding in messages).
QConv IntConvArgs(const py::array& x, int x_zp, const py::array& w, const Arr<int32_t>& w_zp,
                  const std::vector<int64_t>& geom, bool depthwise, int threads, const char* op) {
  QConv q;
  q.s = Shape(x, geom, op);
  const ConvShape& s = q.s;
  q.x_signed = IsByteArray(x, op, "x");
  q.w_signed = IsByteArray(w, op, "w");
  if (!(w.flags() & py::array::c_style)) throw std::invalid_argument(std::string(op) + ": w must be C-contiguous");
  if (x_zp < (q.x_signed ? -128 : 0) || x_zp > (q.x_signed ? 127 : 255))
    throw std::invalid_argument(std::string(op) + ": x_zero_point outside x's type");
  if (depthwise) {
    if (s.group != s.C) throw std::invalid_argument(std::string(op) + ": depthwise needs group == input channels");
    ExpectSize(w, s.M * s.kh * s.kw, op, "w");
  } else {
    ExpectSize(w, s.M * s.kh * s.kw * ((s.Cg() + 3) / 4 * 4), op, "w");
  }
  ExpectSize(w_zp, s.M, op, "w_zero_point");
  q.x = static_cast<const uint8_t*>(x.data());
  q.x_zp = x_zp;
  q.w = static_cast<const uint8_t*>(w.data());
  q.w_zp = w_zp.data();
  q.depthwise = depthwise;
  q.threads = threads;
  return q;
}

// QLinearConv into `out` (ORT's buffer, when a bound step writes a partition output) or a new array.
py::array QLinearConvPy(const py::array& x, int x_zp, const py::array& w, const Arr<int32_t>& w_zp,
                        const std::optional<Arr<int32_t>>& bias, const Arr<float>& mult, int y_zp, bool y_signed,
                        const std::vector<int64_t>& geom, bool depthwise, int threads,
                        const std::optional<py::array>& lut, const std::optional<Arr<int32_t>>& w_sums,
                        const py::object& out) {
  const char* op = "qlinear_conv";
  QConv q = IntConvArgs(x, x_zp, w, w_zp, geom, depthwise, threads, op);
  const ConvShape& s = q.s;
  ExpectSize(mult, s.M, op, "multiplier");
  if (bias) ExpectSize(*bias, s.M, op, "bias");
  q.bias = bias ? bias->data() : nullptr;
  q.mult = mult.data();
  q.y_zp = y_zp;
  q.y_signed = y_signed;
  if (lut) {
    IsByteArray(*lut, op, "lut");
    if (lut->size() != 256 || !(lut->flags() & py::array::c_style))
      throw std::invalid_argument("qlinear_conv: lut must be 256 contiguous bytes");
    q.lut = static_cast<const uint8_t*>(lut->data());
  }
  if (w_sums) {
    ExpectSize(*w_sums, s.M, op, "w_sums");
    q.w_sums = w_sums->data();
  }
  const int64_t n_out = s.N * s.M * s.OH * s.OW;
  py::array y = NullArray();
  if (out.is_none()) {
    y = y_signed ? py::array(py::array_t<int8_t>({s.N, s.M, s.OH, s.OW}))
                 : py::array(py::array_t<uint8_t>({s.N, s.M, s.OH, s.OW}));
  } else {
    const bool typed = y_signed ? py::isinstance<py::array_t<int8_t>>(out) : py::isinstance<py::array_t<uint8_t>>(out);
    if (typed) y = py::reinterpret_borrow<py::array>(out);
    if (!y || y.size() != n_out || !(y.flags() & py::array::c_style) || !y.writeable())
      throw std::invalid_argument(std::string("qlinear_conv: out must be a writeable C-order ") +
                                  (y_signed ? "int8" : "uint8") + " array of " + std::to_string(n_out) + " elements");
  }
  q.y = static_cast<uint8_t*>(y.mutable_data());
  {
    py::gil_scoped_release release;
    QLinearConv(q);
  }
  return y;
}

// ConvInteger's x_zero_point: an int, or the one-element 8-bit array a bound step passes (DynamicQuantizeLinear
// computes it per call).
int ConvIntegerZeroPoint(const py::object& z) {
  if (!py::isinstance<py::array>(z)) return z.cast<int>();
  auto a = py::reinterpret_borrow<py::array>(z);
  if (a.size() != 1 ||
      (a.dtype().num() != py::dtype::of<uint8_t>().num() && a.dtype().num() != py::dtype::of<int8_t>().num()))
    throw std::invalid_argument("conv_integer: x_zero_point must be an int or one uint8/int8 value, got " +
                                std::string(py::str(a.dtype())) + " of " + std::to_string(a.size()) + " elements");
  const uint8_t byte = *static_cast<const uint8_t*>(a.data());
  return a.dtype().num() == py::dtype::of<int8_t>().num() ? static_cast<int8_t>(byte) : byte;
}

// ConvInteger: the exact int32 sums of (x - x_zp) * (w - w_zp), as int32 hardware (wrapping) gives them; into `out`
// (ORT's buffer, when a bound step writes a partition output) or a new array.
py::array ConvIntegerPy(const py::array& x, const py::object& x_zp, const py::array& w, const Arr<int32_t>& w_zp,
                        const std::vector<int64_t>& geom, bool depthwise, int threads, const py::object& out) {
  QConv q = IntConvArgs(x, ConvIntegerZeroPoint(x_zp), w, w_zp, geom, depthwise, threads, "conv_integer");
  const ConvShape& s = q.s;
  const int64_t n_out = s.N * s.M * s.OH * s.OW;
  py::array y = NullArray();
  if (out.is_none()) {
    y = py::array_t<int32_t>({s.N, s.M, s.OH, s.OW});
  } else {
    if (!py::isinstance<py::array_t<int32_t>>(out))
      throw std::invalid_argument("conv_integer: out must be an int32 array or None");
    y = py::reinterpret_borrow<py::array>(out);
    if (y.size() != n_out || !(y.flags() & py::array::c_style) || !y.writeable())
      throw std::invalid_argument("conv_integer: out must be a writable C-order int32 array of " +
                                  std::to_string(n_out) + " elements");
  }
  q.acc_out = static_cast<int32_t*>(y.mutable_data());
  {
    py::gil_scoped_release release;
    QLinearConv(q);
  }
  return y;
}

// x's [N, C, H, W] and a geometry the reference resolved: [OH, OW, kh, kw, sh, sw, dh, dw, pt, pl].
PoolShape PoolGeometry(const py::array& x, const std::vector<int64_t>& geom, const std::string& op) {
  if (geom.size() != 10)
    throw std::invalid_argument(op + ": geometry must be 10 ints [OH, OW, kh, kw, sh, sw, dh, dw, pt, pl]");
  PoolShape s;
  s.N = x.shape(0);
  s.C = x.shape(1);
  s.H = x.shape(2);
  s.W = x.shape(3);
  s.OH = geom[0];
  s.OW = geom[1];
  s.kh = geom[2];
  s.kw = geom[3];
  s.sh = geom[4];
  s.sw = geom[5];
  s.dh = geom[6];
  s.dw = geom[7];
  s.pt = geom[8];
  s.pl = geom[9];
  if (s.OH < 0 || s.OW < 0 || s.kh <= 0 || s.kw <= 0 || s.sh <= 0 || s.sw <= 0 || s.dh <= 0 || s.dw <= 0)
    throw std::invalid_argument(op + ": output size must be >= 0 and kernel, strides, dilations positive");
  return s;
}

py::array MaxPoolPy(const py::array& x, const std::vector<int64_t>& geom, float low, int threads) {
  if (x.ndim() != 4 || !(x.flags() & py::array::c_style))
    throw std::invalid_argument("max_pool: x must be a C-contiguous [N, C, H, W] array");
  const bool is_float = py::isinstance<py::array_t<float>>(x);
  const bool is_signed = !is_float && IsByteArray(x, "max_pool", "x (not float32)");
  const PoolShape s = PoolGeometry(x, geom, "max_pool");
  std::vector<py::ssize_t> shape{s.N, s.C, s.OH, s.OW};
  py::array y = is_float    ? py::array(py::array_t<float>(shape))
                : is_signed ? py::array(py::array_t<int8_t>(shape))
                            : py::array(py::array_t<uint8_t>(shape));
  void* out = y.mutable_data();
  const void* in = x.data();
  {
    py::gil_scoped_release release;
    if (is_float)
      MaxPoolFloat(s, static_cast<const float*>(in), low, static_cast<float*>(out), threads);
    else
      MaxPoolBytes(s, static_cast<const uint8_t*>(in), is_signed, static_cast<uint8_t*>(out), threads);
  }
  return y;
}

py::array_t<float> AvgPoolPy(const py::array& x, const std::vector<int64_t>& geom,
                             const py::array_t<float, py::array::c_style>& divisor, int threads) {
  if (!py::isinstance<py::array_t<float>>(x) || x.ndim() != 4 || !(x.flags() & py::array::c_style))
    throw std::invalid_argument("avg_pool: x must be a C-contiguous float32 [N, C, H, W] array");
  const PoolShape s = PoolGeometry(x, geom, "avg_pool");
  if (divisor.ndim() != 2 || divisor.shape(0) != s.OH || divisor.shape(1) != s.OW)
    throw std::invalid_argument("avg_pool: divisor must be [OH, OW] = [" + std::to_string(s.OH) + ", " +
                                std::to_string(s.OW) + "]");
  py::array_t<float> y({s.N, s.C, s.OH, s.OW});
  float* out = y.mutable_data();
  {
    py::gil_scoped_release release;
    AvgPoolFloat(s, static_cast<const float*>(x.data()), divisor.data(), out, threads);
  }
  return y;
}

}  // namespace

void BindConv(py::module_& m) {
  m.def("conv_im2col", &Im2ColPy, py::arg("x"), py::arg("n"), py::arg("geometry"), py::arg("threads") = 1,
        "float patches of image n: [group, C/group*kh*kw, OH*OW], rows (c, i, j), zeros where padded");
  m.def(
      "conv_dense", &DensePy, py::arg("x"), py::arg("w"), py::arg("bias"), py::arg("geometry"), py::arg("sgemm"),
      py::arg("threads") = 1, py::arg("tail_codes") = py::none(), py::arg("tail_consts") = py::none(),
      py::arg("tail_channel_consts") = py::none(), py::arg("tail_channel_at") = -1, py::arg("out") = py::none(),
      "float conv as blocked implicit GEMM on a CBLAS sgemm with 64-bit ints (its address: "
      "kernels.host_blas.sgemm_address()); w [group, C/group*kh*kw, M/group]; a pointwise conv reads x's rows "
      "directly; tail: a fused element-wise tail (conv_tail codes) applied per finished block, tail_channel_consts [M] "
      "the first constant of instruction tail_channel_at per output channel (a PRelu's slopes); float16 x widened, "
      "the float32 conv, rounded once; out: the result's buffer (x's dtype) instead of a new array");
  m.def("conv_panels", &PanelsPy, py::arg("x"), py::arg("w"), py::arg("bias"), py::arg("geometry"),
        py::arg("threads") = 1, py::arg("tail_codes") = py::none(), py::arg("tail_consts") = py::none(),
        py::arg("tail_channel_consts") = py::none(), py::arg("tail_channel_at") = -1, py::arg("out") = py::none(),
        "a float conv over a few output pixels (any kernel, strides, dilations, pads, groups) on weights packed in "
        "panels: w [group, Mg/64 rounded up, C/group*kh*kw, 64] (zeros past Mg); AVX-512F hosts only (isa()); tail, "
        "float16 and out as conv_dense's");
  m.def("conv_depthwise", &DepthwisePy, py::arg("x"), py::arg("w"), py::arg("bias"), py::arg("geometry"),
        py::arg("threads") = 1, py::arg("tail_codes") = py::none(), py::arg("tail_consts") = py::none(),
        py::arg("tail_channel_consts") = py::none(), py::arg("tail_channel_at") = -1, py::arg("out") = py::none(),
        "float depthwise conv, w [C, kh*kw, M/C]; the reference's float32 order; float16 x widened and rounded once");
  m.def("qlinear_conv", &QLinearConvPy, py::arg("x"), py::arg("x_zero_point"), py::arg("w"), py::arg("w_zero_point"),
        py::arg("bias"), py::arg("multiplier"), py::arg("y_zero_point"), py::arg("y_signed"), py::arg("geometry"),
        py::arg("depthwise"), py::arg("threads") = 1, py::arg("lut") = py::none(), py::arg("w_sums") = py::none(),
        py::arg("out") = py::none(),
        "QLinearConv, exact int32 sums and MLAS requantization; w [M, kh, kw, C/group rounded up to 4] "
        "(depthwise: [M, kh*kw]); lut: a fused 256-entry output table applied to each requantized row; w_sums: the "
        "int32 sums of w's rows (the weights as their type, wrapping), made once for constant weights, else summed "
        "per call; into out (ORT's buffer, of y's byte type) or a new array");
  m.def("conv_integer", &ConvIntegerPy, py::arg("x"), py::arg("x_zero_point"), py::arg("w"), py::arg("w_zero_point"),
        py::arg("geometry"), py::arg("depthwise"), py::arg("threads") = 1, py::arg("out") = py::none(),
        "ConvInteger: int32 sums of (x - x_zp) * (w - w_zp[m]); w laid out as qlinear_conv's; x_zero_point an int "
        "or one 8-bit value; into out (ORT's buffer) or a new array");
  m.def("max_pool", &MaxPoolPy, py::arg("x"), py::arg("geometry"), py::arg("low"), py::arg("threads") = 1,
        "MaxPool (float32, uint8, int8) over a geometry the reference resolved: [OH, OW, kh, kw, sh, sw, dh, dw, "
        "pt, pl]; low (float32 only) is the value of a window wholly outside the input");
  m.def("avg_pool", &AvgPoolPy, py::arg("x"), py::arg("geometry"), py::arg("divisor"), py::arg("threads") = 1,
        "AveragePool of float32 x [N, C, H, W] over a geometry as max_pool's: each window summed in float32 in tap "
        "order (0.0 outside the input), divided by divisor [OH, OW] (the reference's counts)");
}

}  // namespace npu_ep::kern
