// Float32 Exp and Tanh (and float16 Exp and Tanh: widened, this exp or tanh, rounded once to float16) on contiguous
// chunks over the threads (`kernels.exp_tanh`), into ORT's buffer. numpy's float32 loop is the reference; these are
// polynomials of their own, the same operations in every path (AVX-512, AVX2 + FMA, scalar std::fma: the same bits on
// every host, every thread count and every chunk; a vector tail is a masked load of the same math):
//   exp(x): x clamped to [-104, 89], n = rint(x / ln 2), r = x - n ln 2 (ln 2 in two parts, two fma), exp(r) a
//     degree-6 polynomial (1 + r + r^2 Q(r), Q a least-squares fit on |r| <= 0.354), times 2^n with one rounding
//     (overflow to inf, denormal results, underflow to 0). Over all 2^32 float32 patterns within 3 ulp of numpy's
//     float32 exp, which is itself up to 2.4 ulp off the correctly rounded result (this one 0.9 ulp on every 7th
//     pattern with a normal result); inf, 0 and NaN exactly where numpy gives them.
//   tanh(x): sign(x) * -u / (2 + u), u = expm1(-2|x|) = 2^n expm1(r) + (2^n - 1) with -2|x| clamped to -20 (where
//     tanh rounds to 1), expm1(r) = r + r^2 P(r) of degree 7; tanh(-0) = -0. Over all 2^32 float32 patterns within
//     3 ulp of numpy's float32 tanh (2.5 ulp off the correctly rounded result on every 7th pattern, numpy
//     1.4); +-1 from |x| = 8.49 (numpy from 10, the correctly rounded result from 9.01).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu.h"
#include "exp_tanh.h"
#include "half.h"
#include "intrinsics.h"
#include "movement.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr int kExp = 0, kTanh = 1;
constexpr int64_t kTaskElems = 16384;  // elements per parallel task at most (64 KB in, 64 KB out)
constexpr int64_t kHalfBlock = 1024;   // float16 elements widened per row call (4 KB of float32 each way)

constexpr float kLog2e = 1.442695022e+00f, kLn2Hi = 6.931471825e-01f, kLn2Lo = -1.904654323e-09f;
constexpr float kExpLo = -104.0f, kExpHi = 89.0f;  // exp rounds to 0 below -103.98 and to inf above 88.73
constexpr float kTanhLo = -20.0f;                  // -2|x| clamped there: tanh rounds to 1 from |x| = 9.02
// exp(r) = 1 + r + r^2 (kE2 + kE3 r + ... + kE6 r^4)
constexpr float kE2 = 4.999998808e-01f, kE3 = 1.666650623e-01f, kE4 = 4.166976362e-02f, kE5 = 8.370347321e-03f,
                kE6 = 1.374621876e-03f;
// expm1(r) = r + r^2 (kM2 + kM3 r + ... + kM7 r^5)
constexpr float kM2 = 5.000000000e-01f, kM3 = 1.666666567e-01f, kM4 = 4.166632891e-02f, kM5 = 8.333382197e-03f,
                kM6 = 1.394308289e-03f, kM7 = 1.985199488e-04f;

float Pow2(int e) {  // 2^e for e in [-126, 127]
  const uint32_t bits = static_cast<uint32_t>(e + 127) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float ExpScalar(float x) {
  if (!(x == x)) return x + x;
  x = std::min(kExpHi, std::max(kExpLo, x));
  const float n = RoundHalfEven(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float q = std::fma(kE6, r, kE5);
  q = std::fma(q, r, kE4);
  q = std::fma(q, r, kE3);
  q = std::fma(q, r, kE2);
  q = std::fma(q, r, 1.0f);
  const float p = std::fma(q, r, 1.0f);
  // p 2^n with one rounding (as AVX-512's scalef): 2^(n/2) exactly, then the rest
  const int ni = static_cast<int>(n), n1 = ni >> 1;
  return p * Pow2(n1) * Pow2(ni - n1);
}

float TanhScalar(float x) {
  if (!(x == x)) return x + x;
  const float y = std::max(kTanhLo, -2.0f * std::fabs(x));
  const float n = RoundHalfEven(y * kLog2e);
  float r = std::fma(n, -kLn2Hi, y);
  r = std::fma(n, -kLn2Lo, r);
  float q = std::fma(kM7, r, kM6);
  q = std::fma(q, r, kM5);
  q = std::fma(q, r, kM4);
  q = std::fma(q, r, kM3);
  q = std::fma(q, r, kM2);
  const float em = std::fma(r * r, q, r);
  const float s = Pow2(static_cast<int>(n));
  const float u = std::fma(s, em, s - 1.0f);
  return std::copysign(std::fabs(-u / (2.0f + u)), x);
}

template <int Op>
void RowScalar(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Op == kExp ? ExpScalar(x[i]) : TanhScalar(x[i]);
}

#if NPU_EP_X86
__attribute__((target("avx512f"))) inline __m512 Exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(kExpHi), _mm512_max_ps(_mm512_set1_ps(kExpLo), x));  // NaN stays NaN
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Hi), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Lo), r);
  __m512 q = _mm512_fmadd_ps(_mm512_set1_ps(kE6), r, _mm512_set1_ps(kE5));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(kE4));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(kE3));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(kE2));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(_mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f)), n);
}

__attribute__((target("avx512f"))) inline __m512 Tanh16(__m512 x) {
  const __m512i sign = _mm512_set1_epi32(INT32_MIN);
  const __m512 a = _mm512_castsi512_ps(_mm512_andnot_si512(sign, _mm512_castps_si512(x)));
  const __m512 y = _mm512_max_ps(_mm512_set1_ps(kTanhLo), _mm512_mul_ps(a, _mm512_set1_ps(-2.0f)));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(y, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Hi), y);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Lo), r);
  __m512 q = _mm512_fmadd_ps(_mm512_set1_ps(kM7), r, _mm512_set1_ps(kM6));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(kM5));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(kM4));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(kM3));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(kM2));
  const __m512 em = _mm512_fmadd_ps(_mm512_mul_ps(r, r), q, r);
  const __m512 s = _mm512_scalef_ps(_mm512_set1_ps(1.0f), n);
  const __m512 u = _mm512_fmadd_ps(s, em, _mm512_sub_ps(s, _mm512_set1_ps(1.0f)));
  const __m512 t = _mm512_div_ps(u, _mm512_add_ps(_mm512_set1_ps(2.0f), u));  // -tanh|x|: the sign is x's below
  return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(sign, _mm512_castps_si512(t), _mm512_castps_si512(x), 0xAC));
}

template <int Op>
__attribute__((target("avx512f"))) void RowAvx512(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    _mm512_storeu_ps(y + i, Op == kExp ? Exp16(v) : Tanh16(v));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    _mm512_mask_storeu_ps(y + i, m, Op == kExp ? Exp16(v) : Tanh16(v));
  }
}

// float16 in and out, widened and rounded (to nearest even, as FloatToHalfRow's F16C) in registers: the same bits
// as the blocked widen / row / round, without the float32 buffer's store and reload
template <int Op>
__attribute__((target("avx512f"))) void HalfRowAvx512(const uint16_t* x, uint16_t* y, int64_t n) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), _mm512_cvtps_ph(Op == kExp ? Exp16(v) : Tanh16(v), kRound));
  }
  if (i < n) {
    alignas(32) uint16_t in[16] = {}, out[16];
    std::memcpy(in, x + i, static_cast<size_t>(n - i) * 2);
    const __m512 v = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(in)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtps_ph(Op == kExp ? Exp16(v) : Tanh16(v), kRound));
    std::memcpy(y + i, out, static_cast<size_t>(n - i) * 2);
  }
}

// 2^n for integral float n in [-252, 254] as two factors' product (scalef's one rounding, without AVX-512)
__attribute__((target("avx2,fma"))) inline __m256 Scale8(__m256 p, __m256 n) {
  const __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

__attribute__((target("avx2,fma"))) inline __m256 Exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(kExpHi), _mm256_max_ps(_mm256_set1_ps(kExpLo), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
  __m256 q = _mm256_fmadd_ps(_mm256_set1_ps(kE6), r, _mm256_set1_ps(kE5));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(kE4));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(kE3));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(kE2));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f));
  return Scale8(_mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f)), n);
}

__attribute__((target("avx2,fma"))) inline __m256 Tanh8(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 a = _mm256_andnot_ps(sign, x);
  const __m256 y = _mm256_max_ps(_mm256_set1_ps(kTanhLo), _mm256_mul_ps(a, _mm256_set1_ps(-2.0f)));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(y, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), y);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
  __m256 q = _mm256_fmadd_ps(_mm256_set1_ps(kM7), r, _mm256_set1_ps(kM6));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(kM5));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(kM4));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(kM3));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(kM2));
  const __m256 em = _mm256_fmadd_ps(_mm256_mul_ps(r, r), q, r);
  const __m256 s =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  const __m256 u = _mm256_fmadd_ps(s, em, _mm256_sub_ps(s, _mm256_set1_ps(1.0f)));
  const __m256 t = _mm256_div_ps(u, _mm256_add_ps(_mm256_set1_ps(2.0f), u));
  return _mm256_or_ps(_mm256_andnot_ps(sign, t), _mm256_and_ps(sign, x));
}

template <int Op>
__attribute__((target("avx2,fma"))) void RowAvx2(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(y + i, Op == kExp ? Exp8(v) : Tanh8(v));
  }
  if (i < n) {
    alignas(32) float in[8] = {}, out[8];
    std::memcpy(in, x + i, static_cast<size_t>(n - i) * 4);
    _mm256_store_ps(out, Op == kExp ? Exp8(_mm256_load_ps(in)) : Tanh8(_mm256_load_ps(in)));
    std::memcpy(y + i, out, static_cast<size_t>(n - i) * 4);
  }
}

template <int Op>
__attribute__((target("avx2,fma,f16c"))) void HalfRowAvx2(const uint16_t* x, uint16_t* y, int64_t n) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(Op == kExp ? Exp8(v) : Tanh8(v), kRound));
  }
  if (i < n) {
    alignas(16) uint16_t in[8] = {}, out[8];
    std::memcpy(in, x + i, static_cast<size_t>(n - i) * 2);
    const __m256 v = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(in)));
    _mm_store_si128(reinterpret_cast<__m128i*>(out), _mm256_cvtps_ph(Op == kExp ? Exp8(v) : Tanh8(v), kRound));
    std::memcpy(y + i, out, static_cast<size_t>(n - i) * 2);
  }
}
#endif

using Row = void (*)(const float*, float*, int64_t);
using HalfRow = void (*)(const uint16_t*, uint16_t*, int64_t);

template <int Op>
Row RowFor() {
#if NPU_EP_X86
  const Isa isa = ActiveIsa();
  if (isa >= Isa::kAvx512) return &RowAvx512<Op>;
  if (isa >= Isa::kAvx2) return &RowAvx2<Op>;
#endif
  return &RowScalar<Op>;
}

// The fused float16 row where the host converts in registers, else null (the blocked widen / row / round)
template <int Op>
HalfRow HalfRowFor() {
#if NPU_EP_X86
  const Isa isa = ActiveIsa();
  if (isa >= Isa::kAvx512) return &HalfRowAvx512<Op>;
  if (isa >= Isa::kAvx2 && HasF16c()) return &HalfRowAvx2<Op>;
#endif
  return nullptr;
}

py::array ExpTanhPy(int op, const py::array& x, const py::object& out, int threads) {
  if (op != kExp && op != kTanh) throw std::invalid_argument("exp_tanh: op must be 0 (Exp) or 1 (Tanh)");
  const bool half = x.dtype().kind() == 'f' && x.itemsize() == 2;
  if (!(half || x.dtype().equal(py::dtype::of<float>())) || !(x.flags() & py::array::c_style))
    throw std::invalid_argument("exp_tanh: x must be a C-order float32 or float16 array, got " +
                                std::string(py::str(x.dtype())));
  const Row row = op == kExp ? RowFor<kExp>() : RowFor<kTanh>();
  const HalfRow half_row = op == kExp ? HalfRowFor<kExp>() : HalfRowFor<kTanh>();
  const std::vector<int64_t> dims(x.shape(), x.shape() + x.ndim());
  py::array y = MovementResult("exp_tanh", x.dtype(), dims, out);
  const auto* src = static_cast<const char*>(x.data());
  auto* dst = static_cast<char*>(y.mutable_data());
  const int64_t n = x.size(), size = x.itemsize();
  if (n == 0) return y;
  RunMoving(static_cast<size_t>(n * size), [&] {
    ForEvenChunks(threads, n, kTaskElems, [&](int64_t begin, int64_t end) {
      if (!half) {
        row(reinterpret_cast<const float*>(src) + begin, reinterpret_cast<float*>(dst) + begin, end - begin);
        return;
      }
      if (half_row != nullptr) {
        half_row(reinterpret_cast<const uint16_t*>(src) + begin, reinterpret_cast<uint16_t*>(dst) + begin, end - begin);
        return;
      }
      float wide[kHalfBlock];
      for (int64_t i = begin; i < end; i += kHalfBlock) {
        const int64_t len = std::min(kHalfBlock, end - i);
        HalfToFloatRow(reinterpret_cast<const uint16_t*>(src) + i, wide, len);
        row(wide, wide, len);
        FloatToHalfRow(wide, reinterpret_cast<uint16_t*>(dst) + i, len);
      }
    });
  });
  return y;
}

}  // namespace

void ExpRow(const float* x, float* y, int64_t n) { RowFor<kExp>()(x, y, n); }

void TanhRow(const float* x, float* y, int64_t n) { RowFor<kTanh>()(x, y, n); }

void BindExpTanh(py::module_& m) {
  m.def("exp_tanh", &ExpTanhPy, py::arg("op"), py::arg("x"), py::arg("out") = py::none(), py::arg("threads") = 1,
        "float32 Exp (op 0) or Tanh (op 1), float16 widened and rounded once, on a C-order array in chunks "
        "over the threads (a polynomial of its own: kernels/native/exp_tanh.cc states its bound against numpy), into "
        "out (ORT's buffer) or a new array of x's shape and dtype");
}

}  // namespace npu_ep::kern
