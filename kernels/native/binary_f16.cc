// float16 Add/Sub/Mul/Div with ONNX (numpy) broadcasting (`kernels.binary_f16`), for kernels/ops/elementwise.py.
// The reference model computes a float16 op in float32 and rounds once on store (numpy's half loops do the same);
// both operands widen exactly and float32's 24-bit significand is at least 2 * 11 + 2 bits, so the rounded result
// is the correctly rounded float16 one either way and this kernel gives the reference's bits (NaN for NaN).
// Broadcasting: the shapes are aligned from the right, size-1 output axes dropped and neighbouring axes that
// broadcast alike merged, so the innermost run is contiguous in the output and either contiguous or one repeated
// element in each operand ([N,C,H,W] + [1,C,1,1] is C rows of H*W against one value each).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu.h"
#include "intrinsics.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

enum BinaryOp : int { kAdd = 0, kSub = 1, kMul = 2, kDiv = 3 };

constexpr int64_t kTaskElems = 16384;  // output elements per parallel task

template <int Op>
inline float Apply(float a, float b) {
  if constexpr (Op == kAdd) return a + b;
  if constexpr (Op == kSub) return a - b;
  if constexpr (Op == kMul) return a * b;
  return a / b;
}

inline float Widen(uint16_t h) {
  _Float16 v;
  std::memcpy(&v, &h, sizeof v);
  return static_cast<float>(v);
}

inline uint16_t Narrow(float f) {  // round to nearest, ties to even (numpy's astype, F16C's vcvtps2ph)
  const _Float16 v = static_cast<_Float16>(f);
  uint16_t h;
  std::memcpy(&h, &v, sizeof h);
  return h;
}

// y[i] = a[i * sa] op b[i * sb] for i < n; sa, sb in {0, 1} (0: one element repeated).
template <int Op>
void RowScalar(const uint16_t* a, int64_t sa, const uint16_t* b, int64_t sb, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Narrow(Apply<Op>(Widen(a[i * sa]), Widen(b[i * sb])));
}

#if NPU_EP_X86
bool HasF16c() {
  static const bool yes = __builtin_cpu_supports("f16c");
  return yes;
}

constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

template <int Op>
__attribute__((target("avx2,f16c"))) inline __m256 ApplyAvx2(__m256 a, __m256 b) {
  if constexpr (Op == kAdd) return _mm256_add_ps(a, b);
  if constexpr (Op == kSub) return _mm256_sub_ps(a, b);
  if constexpr (Op == kMul) return _mm256_mul_ps(a, b);
  return _mm256_div_ps(a, b);
}

__attribute__((target("avx2,f16c"))) inline __m256 Load8(const uint16_t* p, int64_t stride) {
  return stride ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))
                : _mm256_set1_ps(_cvtsh_ss(*p));
}

template <int Op>
__attribute__((target("avx2,f16c"))) void RowF16c(const uint16_t* a, int64_t sa, const uint16_t* b, int64_t sb,
                                                  uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = ApplyAvx2<Op>(Load8(a + i * sa, sa), Load8(b + i * sb, sb));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(v, kNearest));
  }
  for (; i < n; ++i) y[i] = _cvtss_sh(Apply<Op>(_cvtsh_ss(a[i * sa]), _cvtsh_ss(b[i * sb])), kNearest);
}
#endif

using RowFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, uint16_t*, int64_t);

template <int Op>
RowFn RowFor() {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx2 && HasF16c()) return &RowF16c<Op>;
#endif
  return &RowScalar<Op>;
}

RowFn RowFor(int op) {
  switch (op) {
    case kAdd: return RowFor<kAdd>();
    case kSub: return RowFor<kSub>();
    case kMul: return RowFor<kMul>();
    case kDiv: return RowFor<kDiv>();
    default: throw std::invalid_argument("binary_f16: op must be 0 (Add), 1 (Sub), 2 (Mul) or 3 (Div), got " +
                                         std::to_string(op));
  }
}

std::string ShapeText(const py::array& a) {
  std::string s = "[";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? "," : "") + std::to_string(a.shape(i));
  return s + "]";
}

// The broadcast as merged axes: extents (outermost first) and each operand's element stride per axis (0 where it
// repeats), plus the output shape.
struct Broadcast {
  std::vector<py::ssize_t> out_shape;
  std::vector<int64_t> dims, sa, sb;
};

Broadcast Plan(const py::array& a, const py::array& b) {
  const py::ssize_t rank = std::max(a.ndim(), b.ndim());
  Broadcast p;
  p.out_shape.resize(static_cast<size_t>(rank));
  std::vector<int64_t> ea(rank), eb(rank);
  for (py::ssize_t i = 0; i < rank; ++i) {
    const py::ssize_t ia = i - (rank - a.ndim()), ib = i - (rank - b.ndim());
    ea[i] = ia >= 0 ? a.shape(ia) : 1, eb[i] = ib >= 0 ? b.shape(ib) : 1;
    if (ea[i] != eb[i] && ea[i] != 1 && eb[i] != 1)
      throw std::invalid_argument("binary_f16: shapes " + ShapeText(a) + " and " + ShapeText(b) +
                                  " do not broadcast (axis " + std::to_string(i) + ")");
    p.out_shape[i] = ea[i] == 1 ? eb[i] : ea[i];
  }
  // Merge from the innermost axis out; an operand's stride is the product of its extents inside the axis.
  int64_t stride_a = 1, stride_b = 1;
  std::vector<int64_t> dims, sa, sb;
  for (py::ssize_t i = rank - 1; i >= 0; --i) {
    const int64_t d = p.out_shape[i];
    if (d == 1) continue;
    const int64_t ka = ea[i] == 1 ? 0 : stride_a, kb = eb[i] == 1 ? 0 : stride_b;
    const bool same = !dims.empty() && ((ka == 0) == (sa.back() == 0)) && ((kb == 0) == (sb.back() == 0));
    if (same) {
      dims.back() *= d;
    } else {
      dims.push_back(d), sa.push_back(ka), sb.push_back(kb);
    }
    if (ka) stride_a *= d;
    if (kb) stride_b *= d;
  }
  p.dims.assign(dims.rbegin(), dims.rend());
  p.sa.assign(sa.rbegin(), sa.rend());
  p.sb.assign(sb.rbegin(), sb.rend());
  return p;
}

// Output elements [begin, end) of the merged broadcast: whole or partial inner runs, each operand's offset from the
// run's outer index.
void RunRange(RowFn row, const Broadcast& p, const uint16_t* a, const uint16_t* b, uint16_t* y, int64_t begin,
              int64_t end) {
  const size_t inner = p.dims.size() - 1;
  const int64_t n = p.dims[inner], ua = p.sa[inner] ? 1 : 0, ub = p.sb[inner] ? 1 : 0;
  for (int64_t at = begin; at < end;) {
    int64_t outer = at / n, oa = 0, ob = 0;
    const int64_t col = at - outer * n, len = std::min(n - col, end - at);
    for (size_t k = inner; k-- > 0;) {
      const int64_t idx = outer % p.dims[k];
      outer /= p.dims[k];
      oa += idx * p.sa[k], ob += idx * p.sb[k];
    }
    row(a + oa + col * ua, ua, b + ob + col * ub, ub, y + at, len);
    at += len;
  }
}

bool IsHalf(const py::array& x) { return x.dtype().kind() == 'f' && x.itemsize() == 2; }

py::array BinaryF16Py(int op, const py::array& a, const py::array& b, const py::object& out, int threads) {
  if (!IsHalf(a) || !IsHalf(b) || !(a.flags() & py::array::c_style) || !(b.flags() & py::array::c_style))
    throw std::invalid_argument("binary_f16: a and b must be C-order float16 arrays, got " +
                                std::string(py::str(a.dtype())) + ShapeText(a) + " and " +
                                std::string(py::str(b.dtype())) + ShapeText(b));
  const RowFn row = RowFor(op);
  const Broadcast p = Plan(a, b);
  py::array y;
  if (out.is_none()) {
    y = py::array(a.dtype(), p.out_shape);
  } else {
    if (py::isinstance<py::array>(out)) y = py::reinterpret_borrow<py::array>(out);
    int64_t want = 1;
    for (const py::ssize_t d : p.out_shape) want *= d;
    if (!y || !IsHalf(y) || !(y.flags() & py::array::c_style) || !y.writeable() || y.size() != want)
      throw std::invalid_argument("binary_f16: out must be a writeable C-order float16 array of " +
                                  std::to_string(want) + " elements");
  }
  const int64_t total = y.size();
  if (total == 0) return y;
  const auto* pa = static_cast<const uint16_t*>(a.data());
  const auto* pb = static_cast<const uint16_t*>(b.data());
  auto* py_ = static_cast<uint16_t*>(y.mutable_data());
  Broadcast merged = p;
  if (merged.dims.empty()) merged.dims = {1}, merged.sa = {0}, merged.sb = {0};  // one element
  {
    py::gil_scoped_release release;
    const int64_t tasks = (total + kTaskElems - 1) / kTaskElems;
    ParallelFor(ThreadsFor(threads, total), tasks, [&](int64_t t) {
      RunRange(row, merged, pa, pb, py_, t * kTaskElems, std::min(total, (t + 1) * kTaskElems));
    });
  }
  return y;
}

}  // namespace

void BindBinaryF16(py::module_& m) {
  m.def("binary_f16", &BinaryF16Py, py::arg("op"), py::arg("a"), py::arg("b"), py::arg("out") = py::none(),
        py::arg("threads") = 1,
        "float16 a op b (op 0 Add, 1 Sub, 2 Mul, 3 Div) with numpy broadcasting, computed in float32 and rounded "
        "once (the reference's bits), into out (a writeable C-order float16 array of the result's size: ORT's "
        "buffer) or a new array; a and b C-order");
}

}  // namespace npu_ep::kern
