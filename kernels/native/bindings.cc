// Python bindings of the native kernels (`npu_ep.ep._native.kernels`). Arrays are checked here (dtype, size,
// contiguity) so a wrong call is a clear ValueError, never a crash; the kernels then run without the GIL.
#include "as_array.h"
#include "bindings.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <optional>

#include <stdexcept>
#include <string>
#include <vector>

#include "conv.h"
#include "cpu.h"
#include "int8_gemm.h"
#include "norm_matmul.h"
#include "matmul_nbits.h"

namespace py = pybind11;

namespace npu_ep::kern {

// A tile plan from Python: (tm, tn, tk, resident 0 none | 1 a | 2 b | 3 weights, half-bytes per element of A, B
// and the output, half-bytes of the scales per (block, column) or per column, block size or 0); None: no plan.
std::optional<TilePlanArgs> PlanArgs(const std::optional<py::tuple>& t, const char* op) {
  if (!t) return std::nullopt;
  if (t->size() != 9) throw std::invalid_argument(std::string(op) + ": plan must be a 9-tuple");
  TilePlanArgs p;
  int64_t v[9];
  for (int i = 0; i < 9; ++i) v[i] = (*t)[i].cast<int64_t>();
  p.tm = v[0], p.tn = v[1], p.tk = v[2];
  if (v[0] <= 0 || v[1] <= 0 || v[2] <= 0 || v[3] < 0 || v[3] > 3)
    throw std::invalid_argument(std::string(op) + ": plan tiles must be positive and resident 0..3");
  p.resident = static_cast<Resident>(v[3]);
  p.a_half = v[4], p.b_half = v[5], p.out_half = v[6], p.scale_half = v[7], p.block = v[8];
  return p;
}

py::object WithDma(py::object y, bool count, const DmaCount& c) {
  if (!count) return y;
  py::dict d;
  d["a"] = c.a, d["b"] = c.b, d["scales"] = c.scales, d["out"] = c.out, d["transfers"] = c.transfers;
  return py::make_tuple(y, d);
}

void MatMulNBitsSwiGlu(const NBitsGemm& g, const void* a, bool half, void* y);  // nbits_swiglu.cc

namespace {

template <typename T>
using Arr = py::array_t<T, py::array::c_style>;

template <typename T>
const T* Data(const Arr<T>& a, int64_t expect, const char* what) {
  if (a.size() != expect)
    throw std::invalid_argument(std::string("native kernel: ") + what + " has " + std::to_string(a.size()) +
                                " elements, expected " + std::to_string(expect));
  return a.data();
}

template <typename T>
const T* Raw(const py::handle& h, int64_t expect, const char* what, std::vector<py::object>& keep) {
  Arr<T> a = Arr<T>::ensure(h);
  if (!a) {
    PyErr_Clear();
    throw std::invalid_argument(std::string("native kernel: ") + what + " must be a C-contiguous " +
                                py::str(py::dtype::of<T>()).cast<std::string>() + " array");
  }
  keep.push_back(a);
  return Data(a, expect, what);
}

// B's bytes for `cols` columns in the level's layout (matmul_nbits.h): level 4's tiles pad to groups of 32.
int64_t BBytes(const NBitsGemm& g, int64_t cols, int64_t row) {
  return (g.accuracy_level == 4 ? (cols + 31) / 32 * 32 : cols) * row;
}

// B, scales and zero points (None: symmetric) of the N columns in the level's layout (matmul_nbits.h): one matrix
// each, or lists of member matrices side by side (npu::MatMulGroup's members, read where the program keeps them;
// a member's width is its scales' size / kb). `keep` holds what the pointers point into for the call.
void SetWeights(NBitsGemm& g, const py::handle& b, const py::handle& scales, const py::handle& zp,
                std::vector<NBitsSegment>& segs, std::vector<py::object>& keep) {
  const int64_t kb = (g.K + g.block_size - 1) / g.block_size, row = kb * g.block_size / 2, zb = (kb + 1) / 2;
  if (!py::isinstance<py::list>(b) && !py::isinstance<py::tuple>(b)) {
    g.b = Raw<uint8_t>(b, BBytes(g, g.N, row), "B", keep);
    g.scales = Raw<float>(scales, g.N * kb, "scales", keep);
    if (!zp.is_none()) g.zero_points = Raw<uint8_t>(zp, g.N * zb, "zero_points", keep);
    return;
  }
  const py::sequence bl = py::reinterpret_borrow<py::sequence>(b), sl = py::reinterpret_borrow<py::sequence>(scales);
  const bool has_zp = !zp.is_none();
  if (sl.size() != bl.size() || (has_zp && py::len(zp) != bl.size()) || bl.size() == 0)
    throw std::invalid_argument("native kernel: B, scales and zero_points must list the same members");
  int64_t n0 = 0;
  for (size_t i = 0; i < bl.size(); ++i) {
    const Arr<float> si = Arr<float>::ensure(sl[i]);
    if (!si) {
      PyErr_Clear();
      throw std::invalid_argument("native kernel: scales must be a C-contiguous float32 array");
    }
    if (si.size() == 0 || si.size() % kb)
      throw std::invalid_argument("native kernel: member " + std::to_string(i) + "'s scales are not " +
                                  std::to_string(kb) + " blocks per column");
    const int64_t rows = si.size() / kb;
    NBitsSegment seg;
    seg.n0 = n0;
    seg.b = Raw<uint8_t>(bl[i], BBytes(g, rows, row), "B", keep);
    seg.scales = Raw<float>(si, rows * kb, "scales", keep);
    if (has_zp)
      seg.zero_points = Raw<uint8_t>(py::reinterpret_borrow<py::sequence>(zp)[i], rows * zb, "zero_points", keep);
    segs.push_back(seg);
    n0 += rows;
  }
  if (n0 != g.N)
    throw std::invalid_argument("native kernel: the members have " + std::to_string(n0) + " columns, N is " +
                                std::to_string(g.N));
  g.segments = segs.data();
  g.n_segments = static_cast<int>(segs.size());
}

// One MatMulNBits call's problem (A, shape, level, threads, BLAS, weights, bias); y, plan and DMA are the caller's.
NBitsGemm NBitsCall(const char* op, const float* a, int64_t M, int64_t K, int64_t N, int block_size, int level,
                    int threads, uintptr_t sgemm, const py::object& b, const py::object& scales,
                    const py::object& zero_points, const std::optional<Arr<float>>& bias,
                    std::vector<NBitsSegment>& segs, std::vector<py::object>& keep) {
  if (block_size < 16 || block_size > 256 || (block_size & (block_size - 1)))
    throw std::invalid_argument(std::string(op) + ": block_size " + std::to_string(block_size) +
                                " is not a power of two in 16..256");
  NBitsGemm g;
  g.M = M;
  g.K = K;
  g.N = N;
  g.block_size = block_size;
  g.accuracy_level = level;
  g.threads = threads;
  g.sgemm = reinterpret_cast<Sgemm64>(sgemm);
  g.a = a;
  SetWeights(g, b, scales, zero_points, segs, keep);
  if (bias) g.bias = Data(*bias, N, "bias");
  return g;
}

// y[M, N] = a @ dequant(B) (+ bias) for the call template g (weights, shape but M, level, threads).
py::object RunMatMulNBits(NBitsGemm g, const Arr<float>& a, const std::optional<py::tuple>& plan, bool count_dma) {
  if (a.ndim() != 2 || a.shape(1) != g.K)
    throw std::invalid_argument("matmul_nbits: A must be [M, K=" + std::to_string(g.K) + "]");
  g.a = a.data();
  g.M = a.shape(0);
  py::array_t<float> y({g.M, g.N});
  g.y = y.mutable_data();
  const std::optional<TilePlanArgs> tiles = PlanArgs(plan, "matmul_nbits");
  DmaCount dma;
  g.plan = tiles ? &*tiles : nullptr;
  g.dma = count_dma ? &dma : nullptr;
  {
    py::gil_scoped_release release;
    MatMulNBits(g);
  }
  return WithDma(y, count_dma, dma);
}

py::object MatMulNBitsPy(const Arr<float>& a, const py::object& b, const py::object& scales,
                         const py::object& zero_points, const std::optional<Arr<float>>& bias, int64_t K, int64_t N,
                         int block_size, int accuracy_level, int threads, const std::optional<py::tuple>& plan,
                         bool count_dma, uintptr_t sgemm) {
  std::vector<NBitsSegment> segs;
  std::vector<py::object> keep;
  NBitsGemm g = NBitsCall("matmul_nbits", nullptr, 0, K, N, block_size, accuracy_level, threads, sgemm, b, scales,
                          zero_points, bias, segs, keep);
  return RunMatMulNBits(g, a, plan, count_dma);
}

// npu::NormMatMul's norm constants (everything of the prologue but x, skip, M and the outputs).
struct NormArgs {
  RmsPrologue pro;  // norm_bias, gamma, K, eps, sdot
  bool want_sum = false, swiglu = false;
};

NormArgs NormCall(int64_t K, int64_t N, const std::optional<Arr<float>>& norm_bias,
                  const std::optional<Arr<float>>& gamma, double eps, bool want_sum, bool swiglu, uintptr_t sdot) {
  if (swiglu && N % 2)
    throw std::invalid_argument("norm_matmul_nbits: SwiGLU needs an even N, got " + std::to_string(N));
  NormArgs n;
  n.pro.K = K;
  n.pro.eps = eps;
  n.pro.sdot = reinterpret_cast<Sdot64>(sdot);
  if (norm_bias) n.pro.norm_bias = Data(*norm_bias, K, "norm_bias");
  if (gamma) n.pro.gamma = Data(*gamma, K, "gamma");
  n.want_sum = want_sum;
  n.swiglu = swiglu;
  return n;
}

// (y, sum) of npu::NormMatMul for x [M, K] (and skip) with the call templates g and norm.
py::object RunNormMatMul(NBitsGemm g, const NormArgs& norm, const Arr<float>& x, const std::optional<Arr<float>>& skip,
                         const std::optional<py::tuple>& plan, bool count_dma) {
  const int64_t K = g.K, N = g.N;
  if (x.ndim() != 2 || x.shape(1) != K)
    throw std::invalid_argument("norm_matmul_nbits: x must be [M, K=" + std::to_string(K) + "]");
  if (norm.want_sum && !skip) throw std::invalid_argument("norm_matmul_nbits: the sum output needs a skip input");
  const int64_t M = x.shape(0);
  RmsPrologue pro = norm.pro;
  pro.x = x.data();
  pro.M = M;
  if (skip) pro.skip = Data(*skip, M * K, "skip");
  py::array_t<float> a({M, K});
  pro.a = a.mutable_data();
  py::object sum = py::none();
  if (norm.want_sum) {
    py::array_t<float> s({M, K});
    pro.sum = s.mutable_data();
    sum = s;
  }
  g.a = pro.a;
  g.M = M;
  py::array_t<float> acc({M, N});
  g.y = acc.mutable_data();
  py::array_t<float> y = norm.swiglu ? py::array_t<float>({M, N / 2}) : acc;
  float* out = y.mutable_data();
  const std::optional<TilePlanArgs> tiles = PlanArgs(plan, "norm_matmul_nbits");
  DmaCount dma;
  g.plan = tiles ? &*tiles : nullptr;
  g.dma = count_dma ? &dma : nullptr;
  {
    py::gil_scoped_release release;
    RunRmsPrologue(pro, g.threads);
    MatMulNBits(g);
    if (norm.swiglu) SwiGlu(g.y, M, N / 2, out, g.threads);
  }
  return WithDma(py::make_tuple(y, sum), count_dma, dma);
}

// npu::NormMatMul over int4 weights in one call: the RMS-norm prologue, MatMulNBits (its bias), then an optional
// SwiGLU epilogue (a {gate, up} MatMulGroup). Returns (y, sum) where sum is Skip*'s input + skip (+ bias) when
// asked for, else None.
py::object NormMatMulNBitsPy(const Arr<float>& x, const std::optional<Arr<float>>& skip,
                             const std::optional<Arr<float>>& norm_bias, const std::optional<Arr<float>>& gamma,
                             double eps, bool want_sum, const py::object& b, const py::object& scales,
                             const py::object& zero_points, const std::optional<Arr<float>>& bias, int64_t K, int64_t N,
                             int block_size, int accuracy_level, bool swiglu, int threads,
                             const std::optional<py::tuple>& plan, bool count_dma, uintptr_t sgemm, uintptr_t sdot) {
  const NormArgs norm = NormCall(K, N, norm_bias, gamma, eps, want_sum, swiglu, sdot);
  std::vector<NBitsSegment> segs;
  std::vector<py::object> keep;
  NBitsGemm g = NBitsCall("norm_matmul_nbits", nullptr, 0, K, N, block_size, accuracy_level, threads, sgemm, b, scales,
                          zero_points, bias, segs, keep);
  return RunNormMatMul(g, norm, x, skip, plan, count_dma);
}

// A matmul_nbits or norm_matmul_nbits call with everything but the activations converted once, for a program's
// bound step (kernels/ops/matmul_nbits.py, norm_matmul.py): at a small decoder's sizes converting the 20
// arguments of norm_matmul_nbits took ~3 of its 3.7 us. Holds its weights' arrays while it lives.
class BoundNBits {
 public:
  BoundNBits(const py::object& b, const py::object& scales, const py::object& zero_points,
             const std::optional<Arr<float>>& bias, int64_t K, int64_t N, int block_size, int accuracy_level,
             int threads, uintptr_t sgemm, const std::optional<py::tuple>& norm) {
    g_ = NBitsCall("bound nbits", nullptr, 0, K, N, block_size, accuracy_level, threads, sgemm, b, scales, zero_points,
                   bias, segs_, keep_);
    if (bias) keep_.push_back(*bias);
    if (norm) {  // (norm_bias | None, gamma | None, eps, want_sum, swiglu, sdot)
      const py::tuple& t = *norm;
      if (t.size() != 6)
        throw std::invalid_argument("bound nbits: norm is (norm_bias, gamma, eps, want_sum, swiglu, sdot)");
      auto nb = t[0].cast<std::optional<Arr<float>>>();
      auto gamma = t[1].cast<std::optional<Arr<float>>>();
      norm_ =
          NormCall(K, N, nb, gamma, t[2].cast<double>(), t[3].cast<bool>(), t[4].cast<bool>(), t[5].cast<uintptr_t>());
      if (nb) keep_.push_back(*nb);
      if (gamma) keep_.push_back(*gamma);
    }
  }
  BoundNBits(const BoundNBits&) = delete;  // g_ points into segs_
  BoundNBits& operator=(const BoundNBits&) = delete;

  py::object Call(const py::object& x_in, const std::optional<Arr<float>>& skip, const py::object& into) const {
    const Arr<float> x = AsArray<float>(x_in, "bound nbits", "x");
    if (norm_) return RunNormMatMul(g_, *norm_, x, skip, std::nullopt, false);
    return Product(x, into);
  }
  // x [..., K] -> y [..., N] (x's leading dims; a bound step's x comes as the node's input, no [M, K] view made),
  // written into `into` when it is a writeable C-order float32 array of M x N elements (ORT's output buffer).
  py::object Product(const Arr<float>& x, const py::object& into) const {
    if (x.ndim() < 1 || x.shape(x.ndim() - 1) != g_.K)
      throw std::invalid_argument("bound nbits: x must be [..., K=" + std::to_string(g_.K) + "]");
    NBitsGemm g = g_;
    g.M = x.size() / g_.K;
    g.a = x.data();
    const bool fits = Arr<float>::check_(into) && py::reinterpret_borrow<py::array>(into).writeable() &&
                      py::reinterpret_borrow<Arr<float>>(into).size() == g.M * g.N;
    py::array_t<float> y = fits ? py::reinterpret_borrow<py::array_t<float>>(into) : py::array_t<float>(OutDims(x));
    g.y = y.mutable_data();
    {
      py::gil_scoped_release release;
      MatMulNBits(g);
    }
    return std::move(y);
  }
  // x's dims with the last one N (the product's shape)
  std::vector<py::ssize_t> OutDims(const Arr<float>& x) const {
    std::vector<py::ssize_t> dims(x.shape(), x.shape() + x.ndim());
    dims.back() = g_.N;
    return dims;
  }
  // A float16 node's call (no norm): x [M, K] float16 -> y [M, N] float16 (MatMulNBitsHalf).
  py::array CallHalf(const py::array& x) const {
    if (norm_ || x.dtype().kind() != 'f' || x.itemsize() != 2 || !(x.flags() & py::array::c_style) || x.ndim() != 2 ||
        x.shape(1) != g_.K)
      throw std::invalid_argument("bound nbits: half takes a C-contiguous float16 x [M, K=" + std::to_string(g_.K) +
                                  "] and no norm");
    NBitsGemm g = g_;
    g.M = x.shape(0);
    py::array y(x.dtype(), std::vector<py::ssize_t>{g.M, g.N});
    const auto* a = static_cast<const uint16_t*>(x.data());
    auto* out = static_cast<uint16_t*>(y.mutable_data());
    {
      py::gil_scoped_release release;
      MatMulNBitsHalf(g, a, out);
    }
    return y;
  }
  // A {gate, up} group's SwiGLU (no norm): x [M, K] float32 or float16 -> [M, N / 2] of x's dtype
  // (MatMulNBitsSwiGlu, nbits_swiglu.cc).
  py::array CallSwiGlu(const py::array& x) const {
    const bool half = x.dtype().kind() == 'f' && x.itemsize() == 2;
    if (norm_ || (!half && !py::isinstance<py::array_t<float>>(x)) || !(x.flags() & py::array::c_style) ||
        x.ndim() != 2 || x.shape(1) != g_.K || g_.N % 2)
      throw std::invalid_argument("bound nbits: swiglu takes a C-contiguous float32 or float16 x [M, K=" +
                                  std::to_string(g_.K) + "], an even N and no norm");
    NBitsGemm g = g_;
    g.M = x.shape(0);
    py::array y(x.dtype(), std::vector<py::ssize_t>{g.M, g.N / 2});
    const void* a = x.data();
    void* out = y.mutable_data();
    {
      py::gil_scoped_release release;
      MatMulNBitsSwiGlu(g, a, half, out);
    }
    return y;
  }

 private:
  std::vector<NBitsSegment> segs_;
  std::vector<py::object> keep_;
  NBitsGemm g_;
  std::optional<NormArgs> norm_;
};

// ORT's B [N, row_bytes] -> accuracy_level 4's tiles [ceil(N / 32), row_bytes / 2, 64] (matmul_nbits.h).
void TileInt4Py(const Arr<uint8_t>& b, int64_t N, int64_t row_bytes, Arr<uint8_t>& out, int threads) {
  if (N <= 0 || row_bytes <= 0 || row_bytes % 2)
    throw std::invalid_argument("tile_int4: N must be positive and row_bytes positive and even");
  const uint8_t* src = Data(b, N * row_bytes, "B");
  if (!out.writeable()) throw std::invalid_argument("tile_int4: out must be writeable");
  uint8_t* dst = out.mutable_data();
  Data(out, (N + 31) / 32 * 32 * row_bytes, "out");
  py::gil_scoped_release release;
  TileInt4(src, N, row_bytes, dst, threads);
}

// Its arrays borrowed as they are (AsArray): a bound step's call (MatMulInteger, QLinearMatMul, QGemm) makes no
// numpy conversion call per array.
py::object Int8MatMulPy(const py::array& a, const py::object& azp_in, const py::object& bp_in,
                        const py::object& bsum_in, const py::object& bzp_in, int64_t K, int64_t n, int threads,
                        const py::object& mult_in, int y_zero_point, bool y_signed,
                        const std::optional<py::tuple>& plan, bool count_dma, const py::object& out_into) {
  const char* op = "int8_matmul";
  const Arr<int32_t> azp = AsArray<int32_t>(azp_in, op, "a_zero_point");
  const Arr<int8_t> bp = AsArray<int8_t>(bp_in, op, "bp");
  const Arr<int32_t> bsum = AsArray<int32_t>(bsum_in, op, "bsum"), bzp = AsArray<int32_t>(bzp_in, op, "b_zero_point");
  const std::optional<Arr<float>> mult = AsOptionalArray<float>(mult_in, op, "multiplier");
  const bool a_signed = py::isinstance<py::array_t<int8_t>>(a);
  if (!a_signed && !py::isinstance<py::array_t<uint8_t>>(a))
    throw std::invalid_argument("int8_matmul: A must be uint8 or int8");
  if (a.ndim() != 2 || a.shape(1) != K || !(a.flags() & py::array::c_style))
    throw std::invalid_argument("int8_matmul: A must be C-contiguous [M, K=" + std::to_string(K) + "]");
  const int64_t kp = (K + 63) / 64 * 64;
  if (bp.ndim() != 4 || bp.shape(1) != kp / 4 || bp.shape(2) != 16 || bp.shape(3) != 4)
    throw std::invalid_argument("int8_matmul: packed B must be [np/16, kp/4, 16, 4] with kp = " + std::to_string(kp));
  Int8Gemm g;
  g.M = a.shape(0);
  g.K = K;
  g.N = n;
  g.kp = kp;
  g.a = static_cast<const uint8_t*>(a.data());
  g.a_signed = a_signed;
  g.azp_per_row = azp.size() != 1;
  g.azp = Data(azp, g.azp_per_row ? g.M : 1, "a_zero_point");
  g.bp = bp.data();
  const int64_t np16 = bp.shape(0) * 16;
  if (n > np16) throw std::invalid_argument("int8_matmul: N exceeds the packed B's columns");
  g.bsum = Data(bsum, np16, "bsum");
  g.bzp = Data(bzp, np16, "b_zero_point");
  g.threads = threads;
  // out_into: M x N elements of the output's dtype to write (ORT's own output buffer), else a new [M, N] array
  const py::dtype out_dtype =
      mult ? (y_signed ? py::dtype::of<int8_t>() : py::dtype::of<uint8_t>()) : py::dtype::of<int32_t>();
  bool fits = false;
  if (py::isinstance<py::array>(out_into)) {
    auto into = py::reinterpret_borrow<py::array>(out_into);
    fits = into.dtype().equal(out_dtype) && (into.flags() & py::array::c_style) && into.writeable() &&
           into.size() == g.M * g.N;
  }
  py::array out =
      fits ? py::reinterpret_borrow<py::array>(out_into) : py::array(out_dtype, std::vector<py::ssize_t>{g.M, g.N});
  if (mult) {
    g.mult_per_col = mult->size() != 1;
    g.mult = Data(*mult, g.mult_per_col ? g.N : 1, "multiplier");
    g.y_zp = y_zero_point;
    g.y_signed = y_signed;
    g.y = static_cast<uint8_t*>(out.mutable_data());
  } else {
    g.acc = static_cast<int32_t*>(out.mutable_data());
  }
  const std::optional<TilePlanArgs> tiles = PlanArgs(plan, "int8_matmul");
  if (tiles && tiles->tn % 16)
    throw std::invalid_argument("int8_matmul: plan tile n " + std::to_string(tiles->tn) +
                                " is not a multiple of 16 (the packed B's column blocks)");
  DmaCount dma;
  g.plan = tiles ? &*tiles : nullptr;
  g.dma = count_dma ? &dma : nullptr;
  {
    py::gil_scoped_release release;
    Int8MatMul(g);
  }
  return WithDma(out, count_dma, dma);
}

}  // namespace

void RegisterKernels(py::module_& parent) {
  py::module_ m = parent.def_submodule("kernels", "native tile kernels (the numpy kernels are the reference)");
  m.def("isa", [] { return std::string(IsaName(ActiveIsa())); }, "instruction set the kernels dispatch to");
  m.def("set_isa_cap", &SetIsaCap, py::arg("cap"),
        "cap the dispatch (0 scalar, 1 avx2, 2 avx512, 3 avx512_vnni, 4 amx_int8; -1 none): tests run every host path");
  m.def("matmul_nbits", &MatMulNBitsPy, py::arg("a"), py::arg("b"), py::arg("scales"), py::arg("zero_points"),
        py::arg("bias"), py::arg("K"), py::arg("N"), py::arg("block_size"), py::arg("accuracy_level"),
        py::arg("threads") = 1, py::arg("plan") = py::none(), py::arg("count_dma") = false, py::arg("sgemm") = 0,
        "MatMulNBits 4-bit: y[M, N] = a[M, K] @ dequant(B) (+ bias); B/scales/zero_points in ORT's layout "
        "(accuracy_level 0..3) or as int8_tiles gives them (level 4), or "
        "lists of member matrices side by side (npu::MatMulGroup; zero_points all or None). "
        "plan: a tile plan tuple (see PlanArgs) whose output tiles the kernel runs; count_dma: return (y, DMA "
        "half-bytes and transfers of that plan); sgemm: address of a CBLAS sgemm (kernels.host_blas."
        "sgemm_address()) that fp32 levels use from M >= 16 on");
  m.def("norm_matmul_nbits", &NormMatMulNBitsPy, py::arg("x"), py::arg("skip"), py::arg("norm_bias"), py::arg("gamma"),
        py::arg("eps"), py::arg("want_sum"), py::arg("b"), py::arg("scales"), py::arg("zero_points"), py::arg("bias"),
        py::arg("K"), py::arg("N"), py::arg("block_size"), py::arg("accuracy_level"), py::arg("swiglu") = false,
        py::arg("threads") = 1, py::arg("plan") = py::none(), py::arg("count_dma") = false, py::arg("sgemm") = 0,
        py::arg("sdot") = 0,
        "npu::NormMatMul on int4 weights: (y, sum) with y = [SwiGLU of] rms_norm(x [+ skip + norm_bias]) * gamma "
        "@ dequant(B) (+ bias); sum: Skip*'s x + skip (+ norm_bias) when want_sum, else None. sdot: address of a "
        "CBLAS sdot (kernels.host_blas.sdot_address()) for the Simplified statistics; plan / count_dma / sgemm: "
        "as matmul_nbits");
  m.def("tile_int4", &TileInt4Py, py::arg("b"), py::arg("N"), py::arg("row_bytes"), py::arg("out").noconvert(),
        py::arg("threads") = 1,
        "ORT's MatMulNBits B [N, row_bytes] as accuracy_level 4's tiles into out [ceil(N / 32), row_bytes / 2, 64] "
        "uint8 (npu_ep.quantization.matmul_nbits.int8_tiles is the definition)");
  py::class_<BoundNBits>(m, "BoundNBits",
                         "matmul_nbits (norm None) or norm_matmul_nbits (norm = (norm_bias, gamma, eps, want_sum, "
                         "swiglu, sdot)) with its weights converted once; called with (x, skip) per run")
      .def(py::init<const py::object&, const py::object&, const py::object&, const std::optional<Arr<float>>&, int64_t,
                    int64_t, int, int, int, uintptr_t, const std::optional<py::tuple>&>(),
           py::arg("b"), py::arg("scales"), py::arg("zero_points"), py::arg("bias"), py::arg("K"), py::arg("N"),
           py::arg("block_size"), py::arg("accuracy_level"), py::arg("threads"), py::arg("sgemm"), py::arg("norm"))
      .def("__call__", &BoundNBits::Call, py::arg("x"), py::arg("skip") = py::none(), py::arg("into") = py::none(),
           "x [..., K] float32 -> y [..., N] (into: ORT's buffer to write y in, when it fits); norm: (y, sum)")
      .def("half", &BoundNBits::CallHalf, py::arg("x"), "float16 x [M, K] -> float16 y (no norm)")
      .def("swiglu", &BoundNBits::CallSwiGlu, py::arg("x"),
           "float32 or float16 x [M, K] -> g * sigmoid(g) * u of y's halves [M, N / 2] (no norm)");
  m.def("int8_matmul", &Int8MatMulPy, py::arg("a"), py::arg("a_zero_point"), py::arg("bp"), py::arg("bsum"),
        py::arg("b_zero_point"), py::arg("K"), py::arg("N"), py::arg("threads") = 1, py::arg("multiplier") = py::none(),
        py::arg("y_zero_point") = 0, py::arg("y_signed") = false, py::arg("plan") = py::none(),
        py::arg("count_dma") = false, py::arg("out") = py::none(),
        "exact int32 (A - azp) @ (B - bzp) with B prepared by matmul_int.pack_b; with a multiplier, requantized "
        "to uint8/int8 as MLAS (round half to even, saturation). plan / count_dma: as matmul_nbits; out: an "
        "array of M x N elements of the result's dtype to write (returned), else a new [M, N] array");
  void BindGqa(py::module_&);
  BindGqa(m);  // gqa_bindings.cc: GroupQueryAttention
  void BindConv(py::module_&);
  BindConv(m);  // conv_bindings.cc: Conv, QLinearConv
  void BindPool(py::module_&);
  BindPool(m);  // pool_bindings.cc: float16 MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool
  void BindResize(py::module_&);
  BindResize(m);  // resize.cc: 2-D nearest / linear Resize
  void BindConvTranspose(py::module_&);
  BindConvTranspose(m);  // conv_transpose.cc: ConvTranspose
  void BindQdqLut(py::module_&);
  BindQdqLut(m);  // qdq_lut.cc: npu::QdqLut table reads
  void BindInt8MatMulFloat(py::module_&);
  BindInt8MatMulFloat(m);  // int8_matmul_float.cc: MatMulIntegerToFloat
  void BindQLinearBinary(py::module_&);
  BindQLinearBinary(m);  // qlinear_binary.cc: com.microsoft QLinearAdd, QLinearMul
  void BindQLinearPool(py::module_&);
  BindQLinearPool(m);  // qlinear_pool.cc: com.microsoft QLinearGlobalAveragePool
  void BindQLinearConcat(py::module_&);
  BindQLinearConcat(m);  // qlinear_concat.cc: com.microsoft QLinearConcat
  void BindQuantize(py::module_&);
  BindQuantize(m);  // quantize.cc: DequantizeLinear of any integer container
  void BindRotary(py::module_&);
  BindRotary(m);  // rotary.cc: com.microsoft RotaryEmbedding
  void BindQdqMatMul(py::module_&);
  BindQdqMatMul(m);  // qdq_matmul.cc: npu::QdqMatMul of small products
  void BindConvTail(py::module_&);
  BindConvTail(m);  // conv_tail.cc: a float Conv's fused element-wise tail
  void BindRecurrent(py::module_&);
  BindRecurrent(m);  // recurrent.cc: LSTM
  void BindReduce(py::module_&);
  BindReduce(m);  // reduce.cc: integer ReduceSum
  void BindBinary(py::module_&);
  BindBinary(m);  // binary.cc: float16 Add/Sub/Mul/Div, integer Div
  void BindWhere(py::module_&);
  BindWhere(m);  // where.cc: Where
  void BindMod(py::module_&);
  BindMod(m);  // mod.cc: Mod
  void BindCast(py::module_&);
  BindCast(m);  // cast.cc: Cast
  void BindUnaryF16(py::module_&);
  BindUnaryF16(m);  // unary_f16.cc: float16 Relu/Abs/Neg/Sqrt, Clip
  void BindUnaryNum(py::module_&);
  BindUnaryNum(m);  // unary.cc: Relu/Abs/Neg/Sqrt/Not and Clip of plain dtypes
  void BindUfuncSplit(py::module_&);
  BindUfuncSplit(m);  // ufunc_split.cc: a numpy ufunc's float32 loop over the threads
  void BindRange(py::module_&);
  BindRange(m);  // range.cc: Range
  void BindConstantOfShape(py::module_&);
  BindConstantOfShape(m);  // constant_of_shape.cc: ConstantOfShape
  void BindNBitsSwiGlu(py::module_&);
  BindNBitsSwiGlu(m);  // nbits_swiglu.cc: swiglu_halves
  void BindSelect(py::module_&);
  BindSelect(m);  // select.cc: TopK
  void BindSgemmColumns(py::module_&);
  BindSgemmColumns(m);  // sgemm_columns.cc: a float product's two halves
  void BindFloatMatmul(py::module_&);
  BindFloatMatmul(m);  // float_matmul.cc: a bound float MatMul / Gemm step
  void BindMovement(py::module_&);
  BindMovement(m);  // movement.cc: Expand, Tile; transpose.cc, pad.cc, trilu.cc
  void BindSoftmax(py::module_&);
  BindSoftmax(m);  // softmax.cc: Softmax over the last axis
  void BindAttentionChain(py::module_&);
  BindAttentionChain(m);  // attention_chain.cc: npu::AttentionChain
  void BindSdpa(py::module_&);
  BindSdpa(m);  // sdpa.cc: ONNX Attention, com.microsoft Attention and MultiHeadAttention
  void BindRotateHalf(py::module_&);
  BindRotateHalf(m);  // rotate_half.cc: npu::RotateHalf
  void BindIndexing(py::module_&);
  BindIndexing(m);  // indexing.cc: Gather, Slice, Split, Concat, GatherND, ScatterND
  void BindNorm(py::module_&);
  BindNorm(m);  // norm.cc: Layer/RMS/Skip*/Batch/Instance/GroupNormalization
  void BindEmbedLayerNorm(py::module_&);
  BindEmbedLayerNorm(m);  // embed_layernorm.cc: com.microsoft EmbedLayerNormalization
  void BindConvNhwc(py::module_&);
  BindConvNhwc(m);  // conv_nhwc_bindings.cc: the layout chain's NHWC convs
  void BindPoolNhwc(py::module_&);
  BindPoolNhwc(m);  // pool_nhwc_bindings.cc: the layout chain's NHWC MaxPool / AveragePool
}

}  // namespace npu_ep::kern
