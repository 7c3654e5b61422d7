// A float Conv's fused element-wise tail (kernels/fusion/conv_tail.py), applied in place to the conv output in
// chunks that stay in L1: per chunk, each instruction is one loop over it. Every instruction is the float32
// operation of the node it replaces, in the graph's order (no fused multiply-add), so the result is the unfused
// steps' bit for bit; except sigmoid, whose exp is Cephes' in lanes on AVX2/AVX-512 hosts (intrinsics.h, within
// 2 ulp, as SwiGLU's) and std::exp elsewhere, where the reference model calls numpy's. erf is Eigen's float32
// rational approximation and tanh MLAS's (Eigen's) (kernels/ops/elementwise.erf_f32 and tanh_f32 compute the same
// operations, so bit for bit too). The
// chunking depends on the size only, never on the thread count.
//
// The same instructions also run a standalone element-wise op (Erf, Gelu, LeakyRelu, Pow by 3, Exp, Elu, Softplus,
// ...) on a copy of its input: ``tail_of``, the element-wise engine of kernels/ops/elementwise.py and activation.py.
// log, elu (expm1), softplus, sin and cos are engine_math.h's Cephes float32 algorithms in plain operations (the
// loops vectorize in every clone: no-trapping-math lets GCC if-convert their selects; values stay IEEE's); exp, and
// elu's and softplus's exp, is exp_tanh.cc's (FMA, the same bits on every host).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "as_array.h"
#include "conv_tail.h"
#include "conv_tail_registers.h"
#include "cpu.h"
#include "exp_tanh.h"
#include "half.h"
#include "intrinsics.h"
#include "thread_pool.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("O3", "fp-contract=off", "no-trapping-math")  // O3: the per-instruction loops vectorize
#endif

#include "engine_math.h"  // after the pragma: its inline math compiles with the loops' options

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

using namespace tail_code;  // NOLINT: the instruction codes (conv_tail_registers.h)

static_assert(kSoftsign + 1 == kTailCodes && kClip == kTailClip, "conv_tail.h's kTailCodes, kTailClip");

constexpr int64_t kTailChunk = 2048;            // floats per inner pass (8 KiB, and as much saved)
constexpr int64_t kTailTask = int64_t{1} << 16;  // floats per parallel task

// sigmoid as the reference model's (kernels/ops/elementwise._sigmoid): 1 / (1 + exp(min(-v, 88))), NaN kept.
#if NPU_EP_X86
__attribute__((target("avx2,fma,avx512f"))) void SigmoidAvx512(float* v, int64_t n) {
  const __m512 cap = _mm512_set1_ps(88.0f), one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 neg = _mm512_sub_ps(zero, _mm512_maskz_loadu_ps(m, v + i));
    const __m512 e = _mm512_add_ps(ExpAvx512(_mm512_min_ps(cap, neg)), one);  // NaN: the second operand
    _mm512_mask_storeu_ps(v + i, m, _mm512_div_ps(one, e));
  }
}

__attribute__((target("avx2,fma"))) void SigmoidAvx2(float* v, int64_t n) {
  const __m256 cap = _mm256_set1_ps(88.0f), one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 neg = _mm256_sub_ps(zero, _mm256_loadu_ps(v + i));
    _mm256_storeu_ps(v + i, _mm256_div_ps(one, _mm256_add_ps(ExpAvx2(_mm256_min_ps(cap, neg)), one)));
  }
  if (i < n) {  // the last 1..7 through one masked vector, so every element takes the same exp
    const __m256i lanes =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 neg = _mm256_sub_ps(zero, _mm256_maskload_ps(v + i, lanes));
    _mm256_maskstore_ps(v + i, lanes, _mm256_div_ps(one, _mm256_add_ps(ExpAvx2(_mm256_min_ps(cap, neg)), one)));
  }
}
#endif

void Sigmoid(float* v, int64_t n) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) return SigmoidAvx512(v, n);
  if (ActiveIsa() >= Isa::kAvx2) return SigmoidAvx2(v, n);
#endif
  for (int64_t i = 0; i < n; ++i) {
    const float t = -v[i];
    v[i] = 1.0f / (std::exp(t < 88.0f || t != t ? t : 88.0f) + 1.0f);
  }
}

// erf(x) as Eigen's generic_fast_erf_float, rearranged as x * (P(x^2) / Q(x^2)) so a denormal x keeps its
// precision: x clamped to [-4, 4] (NaN kept), P odd degree 13 / Q even degree 8 in Horner form, plain float32
// multiplies and adds (no FMA: kernels/ops/elementwise.erf_f32 is the same operations in numpy). Within 7 ulp
// (4.1e-7 absolute) of the exact erf (tests/kernels/test_sweep_elementwise_engine.py).
inline float Erf(float x) {
  const float c = x < -4.0f ? -4.0f : (x > 4.0f ? 4.0f : x);
  const float x2 = c * c;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 + -2.10102402082508e-06f;
  p = p * x2 + -5.69250639462346e-05f;
  p = p * x2 + -7.34990630326855e-04f;
  p = p * x2 + -2.95459980854025e-03f;
  p = p * x2 + -1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * x2 + -2.13374055278905e-04f;
  q = q * x2 + -1.68282697438203e-03f;
  q = q * x2 + -7.37332916720468e-03f;
  q = q * x2 + -1.42647390514189e-02f;
  return c * (p / q);
}

// tanh(x) as MLAS's MlasTanhKernel (Eigen's float tanh), also as x * (P(x^2) / Q(x^2)): x clamped to [-9, 9] (NaN
// kept), P odd degree 13 / Q even degree 6, plain float32 multiplies and adds (elementwise.tanh_f32 is the same
// operations). Within 6 ulp (3.3e-7 absolute) of the exact tanh (tests/kernels/test_sweep_elementwise_engine.py).
inline float Tanh(float x) {
  const float c = x < -9.0f ? -9.0f : (x > 9.0f ? 9.0f : x);
  const float x2 = c * c;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  return c * (p / q);
}

// pow(x, 0.5): the correctly rounded sqrt (the same bits on every path), with pow's pow(-0, 0.5) = +0 (sqrt + 0)
// and pow(-inf, 0.5) = +inf; in lanes (std::sqrt's errno keeps GCC from vectorizing the plain loop).
#if NPU_EP_X86
__attribute__((target("avx2,fma,avx512f"))) void PowHalfAvx512(float* v, int64_t n) {
  const __m512 inf = _mm512_set1_ps(INFINITY), zero = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 x = _mm512_maskz_loadu_ps(m, v + i);
    const __m512 r = _mm512_add_ps(_mm512_sqrt_ps(x), zero);
    const __mmask16 neg_inf = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
    _mm512_mask_storeu_ps(v + i, m, _mm512_mask_blend_ps(neg_inf, r, inf));
  }
}

__attribute__((target("avx2,fma"))) void PowHalfAvx2(float* v, int64_t n) {
  const __m256 inf = _mm256_set1_ps(INFINITY), ninf = _mm256_set1_ps(-INFINITY), zero = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(v + i);
    const __m256 r = _mm256_add_ps(_mm256_sqrt_ps(x), zero);
    _mm256_storeu_ps(v + i, _mm256_blendv_ps(r, inf, _mm256_cmp_ps(x, ninf, _CMP_EQ_OQ)));
  }
  for (; i < n; ++i) v[i] = v[i] == -INFINITY ? INFINITY : std::sqrt(v[i]) + 0.0f;
}
#endif

void PowHalf(float* v, int64_t n) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) return PowHalfAvx512(v, n);
  if (ActiveIsa() >= Isa::kAvx2) return PowHalfAvx2(v, n);
#endif
  for (int64_t i = 0; i < n; ++i) v[i] = v[i] == -INFINITY ? INFINITY : std::sqrt(v[i]) + 0.0f;
}

// sin or cos of v[0, n) in place: the engine's polynomial where the reduction is exact (|x| < 8192), the C library's
// beyond it (and for +-inf, NaN), element by element, so a value's bits do not depend on its neighbours.
template <bool Cosine>
__attribute__((always_inline)) inline void SinCosRun(float* v, int64_t n) {
  int32_t misfits = 0;
  for (int64_t i = 0; i < n; ++i) misfits += engine::SinCosFits(v[i]) ? 0 : 1;
  if (misfits == 0) {
    for (int64_t i = 0; i < n; ++i) v[i] = engine::SinCos(v[i], Cosine);
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    v[i] = engine::SinCosFits(v[i]) ? engine::SinCos(v[i], Cosine) : (Cosine ? std::cos(v[i]) : std::sin(v[i]));
}

// sin and cos each in its own cloned function, as exp and log below (inside TailChunk's switch the loop is slower).
__attribute__((target_clones("avx512f", "avx2", "default"), noinline)) void SinRun(float* v, int64_t n) {
  SinCosRun<false>(v, n);
}

__attribute__((target_clones("avx512f", "avx2", "default"), noinline)) void CosRun(float* v, int64_t n) {
  SinCosRun<true>(v, n);
}

// log and elu's select of v[0, n) in place, each its own cloned function: inside TailChunk's switch the same loops
// ran 5-10x slower (measured on 2048 floats in L1), as softplus's did.
__attribute__((target_clones("avx512f", "avx2", "default"), noinline)) void LogRun(float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) v[i] = engine::Log(v[i]);
}

// Elu alpha: x >= 0 ? x : expm1(x) * alpha, NaN kept; e[i] = exp(v[i]) computed apart
__attribute__((target_clones("avx512f", "avx2", "default"), noinline)) void EluFrom(float* v, const float* e, int64_t n,
                                                                                    float a) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = v[i], m = engine::Expm1From(x, e[i]) * a;
    v[i] = x >= 0.0f ? x : m;
  }
}

// exp of v[0, n <= kTailChunk) is exp_tanh.cc's (FMA and 2^n in one rounding, in lanes on AVX2/AVX-512; the same
// bits on every host): a quarter of the time of Cephes' loop vectorized by GCC
void EluRun(float* v, int64_t n, float a) {
  float e[kTailChunk];
  ExpRow(v, e, n);
  EluFrom(v, e, n, a);
}

// softplus of v[0, n <= kTailChunk) in place: max(x, 0) + log1p(exp(-|x|)) in loops GCC if-converts (as one, it
// does not); its own function, so TailChunk's frame stays small (its loops ran slower with these arrays in it).
__attribute__((target_clones("avx512f", "avx2", "default"), noinline)) void SoftplusRun(float* v, int64_t n) {
  float t[kTailChunk], l[kTailChunk];
  for (int64_t i = 0; i < n; ++i) t[i] = -engine::Abs(v[i]);
  ExpRow(t, t, n);
  for (int64_t i = 0; i < n; ++i) l[i] = 1.0f + t[i];
  for (int64_t i = 0; i < n; ++i) l[i] = engine::Log(l[i]);
  for (int64_t i = 0; i < n; ++i) t[i] = engine::Log1pFrom(t[i], l[i]);
  for (int64_t i = 0; i < n; ++i) v[i] = engine::SoftplusFrom(v[i], t[i]);
}

// Cloned per instruction set (the loops are plain IEEE float32 operations and compares: every clone gives the same
// bits).
__attribute__((target_clones("avx512f", "avx2", "default"))) void TailChunk(float* __restrict v, float* __restrict s,
                                                                            int64_t n, const int32_t* codes,
                                                                            const float* c, int64_t n_codes) {
  for (int64_t k = 0; k < n_codes; ++k) {
    const float a = c[2 * k], b = c[2 * k + 1];
    switch (codes[k]) {
      case kMul:
        for (int64_t i = 0; i < n; ++i) v[i] = v[i] * a;
        break;
      case kAdd:
        for (int64_t i = 0; i < n; ++i) v[i] = v[i] + a;
        break;
      case kSub:
        for (int64_t i = 0; i < n; ++i) v[i] = v[i] - a;
        break;
      case kRsub:
        for (int64_t i = 0; i < n; ++i) v[i] = a - v[i];
        break;
      case kDiv:
        for (int64_t i = 0; i < n; ++i) v[i] = v[i] / a;
        break;
      case kRdiv:
        for (int64_t i = 0; i < n; ++i) v[i] = a / v[i];
        break;
      case kClip:  // np.clip: NaN stays NaN, -0.0 stays where it is in range
        for (int64_t i = 0; i < n; ++i) v[i] = v[i] < a ? a : (v[i] > b ? b : v[i]);
        break;
      case kSave: std::copy(v, v + n, s); break;
      case kMulSaved:
        for (int64_t i = 0; i < n; ++i) v[i] = s[i] * v[i];
        break;
      case kAddSaved:
        for (int64_t i = 0; i < n; ++i) v[i] = s[i] + v[i];
        break;
      case kSigmoid: Sigmoid(v, n); break;
      case kErf:
        for (int64_t i = 0; i < n; ++i) v[i] = Erf(v[i]);
        break;
      case kTanh:
        for (int64_t i = 0; i < n; ++i) v[i] = Tanh(v[i]);
        break;
      case kPowHalf: PowHalf(v, n); break;
      case kLeakyRelu:  // LeakyRelu alpha (and PRelu of one slope): x >= 0 ? x : x * alpha, NaN kept
        for (int64_t i = 0; i < n; ++i) v[i] = v[i] >= 0.0f ? v[i] : v[i] * a;
        break;
      case kExp: ExpRow(v, v, n); break;
      case kLog: LogRun(v, n); break;
      case kAbs:
        for (int64_t i = 0; i < n; ++i) v[i] = engine::Abs(v[i]);
        break;
      case kFloor:
        for (int64_t i = 0; i < n; ++i) v[i] = engine::Floor(v[i]);
        break;
      case kCeil:
        for (int64_t i = 0; i < n; ++i) v[i] = engine::Ceil(v[i]);
        break;
      case kRound:
        for (int64_t i = 0; i < n; ++i) v[i] = engine::RoundEven(v[i]);
        break;
      case kSign:  // b != 0: NaN gives 0 (ORT's float16 Sign)
        for (int64_t i = 0; i < n; ++i) v[i] = engine::Sign(v[i], b != 0.0f);
        break;
      case kDivSaved:
        for (int64_t i = 0; i < n; ++i) v[i] = s[i] / v[i];
        break;
      case kElu: EluRun(v, n, a); break;
      case kSoftplus: SoftplusRun(v, n); break;
      case kSin: SinRun(v, n); break;
      case kCos: CosRun(v, n); break;
      case kSoftsign:  // x / (1 + |x|) in one loop: the bits of save, abs, add 1, div_saved
        for (int64_t i = 0; i < n; ++i) v[i] = v[i] / (1.0f + engine::Abs(v[i]));
        break;
    }
  }
}

// y = x + b, the float32 add (y may be x)
__attribute__((target_clones("avx512f", "avx2", "default"))) void AddRow(const float* x, const float* b, float* y,
                                                                         int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] + b[i];
}

void CheckTail(const char* fn, const py::array_t<int32_t, py::array::c_style>& codes,
               const py::array_t<float, py::array::c_style>& consts) {
  const int64_t n_codes = codes.size();
  if (consts.size() != 2 * n_codes)
    throw std::invalid_argument(std::string(fn) + ": consts must hold 2 floats per instruction (" +
                                std::to_string(2 * n_codes) + "), got " + std::to_string(consts.size()));
  for (int64_t k = 0; k < n_codes; ++k)
    if (codes.data()[k] < 0 || codes.data()[k] >= kTailCodes)
      throw std::invalid_argument(std::string(fn) + ": unknown instruction code " + std::to_string(codes.data()[k]));
}

// The program over v[0, len <= kTailChunk) in place: in registers when `registers` (FitsRegisters said so), else
// instruction by instruction over the chunk (saved: kTailChunk floats).
void RunChunk(float* v, float* saved, int64_t len, const int32_t* cd, const float* cs, int64_t n_codes,
              bool registers) {
  if (registers) return RunInRegisters(v, v, len, cd, cs, n_codes);
  TailChunk(v, saved, len, cd, cs, n_codes);
}

// The tail over out[0, n), parallel over kTailTask runs; from ``in`` when given (copied per chunk), else in place.
// A program the register interpreter takes makes one pass per task, reading ``in`` and writing ``out`` directly.
void RunTail(const float* in, float* out, int64_t n, const int32_t* cd, const float* cs, int64_t n_codes, int threads,
             bool per_instruction = false) {
  const int64_t tasks = (n + kTailTask - 1) / kTailTask;
  const bool registers = !per_instruction && FitsRegisters(cd, n_codes);
  ParallelFor(ThreadsFor(threads, n * std::max<int64_t>(n_codes, 1)), tasks, [&](int64_t t) {
    const int64_t begin = t * kTailTask, end = std::min(n, (t + 1) * kTailTask);
    if (registers) return RunInRegisters((in != nullptr ? in : out) + begin, out + begin, end - begin, cd, cs, n_codes);
    float saved[kTailChunk];
    for (int64_t i = t * kTailTask; i < end; i += kTailChunk) {
      const int64_t len = std::min(kTailChunk, end - i);
      if (in != nullptr) std::copy(in + i, in + i + len, out + i);
      TailChunk(out + i, saved, len, cd, cs, n_codes);
    }
  });
}

void ConvTailPy(py::array_t<float, py::array::c_style> y, const py::array_t<int32_t, py::array::c_style>& codes,
                const py::array_t<float, py::array::c_style>& consts, int threads, bool per_instruction) {
  CheckTail("conv_tail", codes, consts);
  if (!y.writeable()) throw std::invalid_argument("conv_tail: y must be writeable");
  float* v = y.mutable_data();
  py::gil_scoped_release release;
  RunTail(nullptr, v, y.size(), codes.data(), consts.data(), codes.size(), threads, per_instruction);
}

bool IsHalf(const py::array& a) { return a.dtype().kind() == 'f' && a.itemsize() == 2; }

// A float16 op on the engine: each chunk widened to float32, the instructions, rounded once to float16 on store
// (the reference model's widen / compute / store), into ``out`` (ORT's buffer, or x: in place) or a new array.
py::array TailOfF16Py(const py::array& x, const py::object& codes_in, const py::object& consts_in, int threads,
                      const py::object& out) {
  const auto codes = AsArray<int32_t>(codes_in, "tail_of_f16", "codes");
  const auto consts = AsArray<float>(consts_in, "tail_of_f16", "consts");
  CheckTail("tail_of_f16", codes, consts);
  if (!IsHalf(x) || !(x.flags() & py::array::c_style))
    throw std::invalid_argument("tail_of_f16: x must be a C-order float16 array");
  // out, or null when it is not an array (a default py::array would be a new empty numpy array per call)
  py::array y = py::reinterpret_borrow<py::array>(py::isinstance<py::array>(out) ? py::handle(out) : py::handle());
  if (out.is_none()) {
    y = py::array(x.dtype(), std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  } else {
    if (!y || !IsHalf(y) || !(y.flags() & py::array::c_style) || !y.writeable() || y.size() != x.size())
      throw std::invalid_argument("tail_of_f16: out must be a writeable C-order float16 array of x's " +
                                  std::to_string(x.size()) + " elements");
  }
  const auto* in = static_cast<const uint16_t*>(x.data());
  auto* dst = static_cast<uint16_t*>(y.mutable_data());
  const int64_t n = x.size(), n_codes = codes.size(), tasks = (n + kTailTask - 1) / kTailTask;
  const int32_t* cd = codes.data();
  const float* cs = consts.data();
  const bool registers = FitsRegisters(cd, n_codes);
  {
    py::gil_scoped_release release;
    ParallelFor(ThreadsFor(threads, n * std::max<int64_t>(n_codes, 1)), tasks, [&](int64_t t) {
      float v[kTailChunk], saved[kTailChunk];
      const int64_t end = std::min(n, (t + 1) * kTailTask);
      for (int64_t i = t * kTailTask; i < end; i += kTailChunk) {
        const int64_t len = std::min(kTailChunk, end - i);
        HalfToFloatRow(in + i, v, len);
        RunChunk(v, saved, len, cd, cs, n_codes, registers);
        FloatToHalfRow(v, dst + i, len);
      }
    });
  }
  return y;
}

// The array a standalone op of float32 x writes: ``out`` when given (ORT's output buffer, or x itself: checked to
// be a writeable C-order float32 array of x's size), else a new array of x's shape.
py::array_t<float> OutputFor(const char* fn, const py::array& x, const py::object& out) {
  if (out.is_none()) return py::array_t<float>(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  auto o = py::reinterpret_borrow<py::array>(out);
  if (!py::isinstance<py::array_t<float>>(out) || !(o.flags() & py::array::c_style) || !o.writeable() ||
      o.size() != x.size())
    throw std::invalid_argument(std::string(fn) + ": out must be a writeable C-order float32 array of x's " +
                                std::to_string(x.size()) + " elements");
  return py::reinterpret_borrow<py::array_t<float>>(out);
}

// A standalone element-wise op of float32 x as tail instructions, into ``out`` (ORT's output buffer: float32, C
// order, x's size; x itself: in place) or a new array of x's shape.
py::array_t<float> TailOfPy(const py::object& x_in, const py::object& codes_in, const py::object& consts_in,
                            int threads, const py::object& out) {
  const auto x = AsArray<float>(x_in, "tail_of", "x");
  const auto codes = AsArray<int32_t>(codes_in, "tail_of", "codes");
  const auto consts = AsArray<float>(consts_in, "tail_of", "consts");
  CheckTail("tail_of", codes, consts);
  py::array_t<float> y = OutputFor("tail_of", x, out);
  const float* in = x.data();
  float* dst = y.mutable_data();
  {
    py::gil_scoped_release release;
    RunTail(in == dst ? nullptr : in, dst, x.size(), codes.data(), consts.data(), codes.size(), threads);
  }
  return y;
}

// x + bias (bias along x's last axis, D = bias.size elements, x.size a multiple of D) then the instructions, in
// float32 (float16 x and bias widened per chunk, rounded once on store), into ``out`` or a new array: BiasGelu,
// and a chain whose first link adds a per-channel constant. The sum is the reference's float32 add.
py::array TailOfBiasPy(const py::array& x, const py::array& bias, const py::object& codes_in,
                       const py::object& consts_in, int threads, const py::object& out) {
  const auto codes = AsArray<int32_t>(codes_in, "tail_of_bias", "codes");
  const auto consts = AsArray<float>(consts_in, "tail_of_bias", "consts");
  CheckTail("tail_of_bias", codes, consts);
  const bool half = IsHalf(x);
  const bool f32 = x.dtype().is(py::dtype::of<float>());
  if (!(half || f32) || !(x.flags() & py::array::c_style) || !bias.dtype().is(x.dtype()) ||
      !(bias.flags() & py::array::c_style))
    throw std::invalid_argument("tail_of_bias: x and bias must be C-order arrays of one dtype, float32 or float16");
  const int64_t n = x.size(), d = bias.size();
  if (d <= 0 || n % d != 0 || x.ndim() < 1 || x.shape(x.ndim() - 1) != d)
    throw std::invalid_argument("tail_of_bias: bias of " + std::to_string(d) + " elements is not x's last axis");
  py::array y = NullArray();
  if (out.is_none()) {
    y = py::array(x.dtype(), std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  } else {
    if (py::isinstance<py::array>(out)) y = py::reinterpret_borrow<py::array>(out);
    if (!y || !y.dtype().is(x.dtype()) || !(y.flags() & py::array::c_style) || !y.writeable() || y.size() != n)
      throw std::invalid_argument("tail_of_bias: out must be a writeable C-order array of x's dtype and " +
                                  std::to_string(n) + " elements");
  }
  const void* in = x.data();
  const void* bp = bias.data();
  void* dst = y.mutable_data();
  const int64_t n_codes = codes.size();
  const int32_t* cd = codes.data();
  const float* cs = consts.data();
  const bool registers = FitsRegisters(cd, n_codes);
  {
    py::gil_scoped_release release;
    // The bias row in float32, repeated when shorter than a chunk so that row[k, k + len) is the bias of any chunk
    // of len <= kTailChunk elements that starts at row offset k (one run per chunk); a longer row is used as it is
    // (float32: in place) and a chunk splits at its end.
    const int64_t row_len = d < kTailChunk ? d + kTailChunk : d;
    std::vector<float> row_f;
    const float* row = static_cast<const float*>(bp);
    if (half || row_len != d) {
      row_f.resize(static_cast<size_t>(row_len));
      if (half) {
        HalfToFloatRow(static_cast<const uint16_t*>(bp), row_f.data(), d);
      } else {
        std::copy_n(static_cast<const float*>(bp), d, row_f.data());
      }
      for (int64_t j = d; j < row_len; j += std::min(j, row_len - j))  // j stays a multiple of d
        std::copy_n(row_f.data(), std::min(j, row_len - j), row_f.data() + j);
      row = row_f.data();
    }
    const auto* x32 = static_cast<const float*>(in);
    auto* y32 = static_cast<float*>(dst);
    const int64_t tasks = (n + kTailTask - 1) / kTailTask;
    ParallelFor(ThreadsFor(threads, n * (std::max<int64_t>(n_codes, 1) + 1)), tasks, [&](int64_t t) {
      float v[kTailChunk], saved[kTailChunk];
      const int64_t end = std::min(n, (t + 1) * kTailTask);
      for (int64_t i = t * kTailTask; i < end; i += kTailChunk) {
        const int64_t len = std::min(kTailChunk, end - i);
        // float32: straight from x into y (the add in the register interpreter's loads); float16 through v
        const float* src = half ? v : x32 + i;
        float* out = half ? v : y32 + i;
        if (half) HalfToFloatRow(static_cast<const uint16_t*>(in) + i, v, len);
        for (int64_t j = 0, k = i % d; j < len; k = 0) {  // the chunk's runs of the bias row
          const int64_t run = std::min(len - j, row_len - k);
          if (registers) {
            RunInRegistersBias(src + j, row + k, out + j, run, cd, cs, n_codes);
          } else {
            AddRow(src + j, row + k, out + j, run);
          }
          j += run;
        }
        if (!registers) TailChunk(out, saved, len, cd, cs, n_codes);
        if (half) FloatToHalfRow(v, static_cast<uint16_t*>(dst) + i, len);
      }
    });
  }
  return y;
}

}  // namespace

void ApplyTail(const ConvTail& tail, float* v, int64_t n) {
  if (FitsRegisters(tail.codes, tail.n)) return RunInRegisters(v, v, n, tail.codes, tail.consts, tail.n);
  float saved[kTailChunk];
  for (int64_t i = 0; i < n; i += kTailChunk)
    TailChunk(v + i, saved, std::min(kTailChunk, n - i), tail.codes, tail.consts, tail.n);
}

// PRelu of float32 x viewed as [rows, inner] with one slope per row (slope[row % C]: a per-channel slope), as the
// leaky_relu instruction computes it per row (x >= 0 ? x : x * slope), into ``out`` (ORT's buffer) or a new array.
py::array_t<float> PreluRowsPy(const py::object& x_in, const py::object& slope_in, int64_t inner, int threads,
                               const py::object& out) {
  const auto x = AsArray<float>(x_in, "prelu_rows", "x");
  const auto slope = AsArray<float>(slope_in, "prelu_rows", "slope");
  const int64_t n = x.size(), c = slope.size();
  if (inner <= 0 || c <= 0 || n % inner != 0 || (n / inner) % c != 0)
    throw std::invalid_argument("prelu_rows: x of " + std::to_string(n) + " elements is not rows of " +
                                std::to_string(inner) + " with a multiple of the slope's " + std::to_string(c) +
                                " channels");
  py::array_t<float> y = OutputFor("prelu_rows", x, out);
  const float* in = x.data();
  const float* s = slope.data();
  float* dst = y.mutable_data();
  const int32_t code = kLeakyRelu;
  const bool registers = FitsRegisters(&code, 1);
  {
    py::gil_scoped_release release;
    const int64_t tasks = (n + kTailTask - 1) / kTailTask;
    ParallelFor(ThreadsFor(threads, n), tasks, [&](int64_t t) {
      const int64_t end = std::min(n, (t + 1) * kTailTask);
      for (int64_t i = t * kTailTask; i < end;) {  // the task's part of each row it meets, in L1-sized chunks
        const int64_t row = i / inner, len = std::min({end, (row + 1) * inner, i + kTailChunk}) - i;
        const float consts[2] = {s[row % c], 0.0f};
        if (registers) {
          RunInRegisters(in + i, dst + i, len, &code, consts, 1);
        } else {
          std::copy(in + i, in + i + len, dst + i);
          TailChunk(dst + i, nullptr, len, &code, consts, 1);
        }
        i += len;
      }
    });
  }
  return y;
}

// ONNX Sigmoid of float32 x as the tail's sigmoid instruction computes it, into ``out`` (ORT's buffer) or a new
// array of x's shape.
py::array_t<float> SigmoidPy(const py::object& x_in, int threads, const py::object& out_) {
  const auto x = AsArray<float>(x_in, "sigmoid", "x");
  py::array_t<float> y = OutputFor("sigmoid", x, out_);
  const float* in = x.data();
  float* out = y.mutable_data();
  const int64_t n = x.size(), tasks = (n + kTailTask - 1) / kTailTask;
  const int32_t code = kSigmoid;
  const float consts[2] = {0.0f, 0.0f};
  const bool registers = FitsRegisters(&code, 1);
  {
    py::gil_scoped_release release;
    ParallelFor(ThreadsFor(threads, n), tasks, [&](int64_t t) {
      const int64_t begin = t * kTailTask, len = std::min(n, begin + kTailTask) - begin;
      if (registers) return RunInRegisters(in + begin, out + begin, len, &code, consts, 1);  // one pass
      if (in != out) std::copy(in + begin, in + begin + len, out + begin);
      Sigmoid(out + begin, len);
    });
  }
  return y;
}

void BindConvTail(py::module_& m) {
  m.def("conv_tail", &ConvTailPy, py::arg("y"), py::arg("codes"), py::arg("consts"), py::arg("threads") = 1,
        py::arg("per_instruction") = false,
        "a fused Conv's element-wise tail applied in place to float32 y: codes as kernels/fusion/conv_tail.CODES, "
        "consts [n, 2]; per_instruction: always one pass per instruction over L1 chunks (the interpreter the "
        "register one is checked against), else in registers where the program allows");
  m.def("tail_of", &TailOfPy, py::arg("x"), py::arg("codes"), py::arg("consts"), py::arg("threads") = 1,
        py::arg("out") = py::none(),
        "an element-wise op of float32 x as conv-tail instructions (codes as kernels/fusion/conv_tail.CODES, consts "
        "[n, 2]) applied to a copy of x (into out when given: ORT's buffer): the element-wise engine of Erf, Gelu, "
        "LeakyRelu, Pow by 3, ...");
  m.def("prelu_rows", &PreluRowsPy, py::arg("x"), py::arg("slope"), py::arg("inner"), py::arg("threads") = 1,
        py::arg("out") = py::none(),
        "PRelu of float32 x viewed as [rows, inner], row r's slope slope[r % slope.size] (a per-channel slope), as "
        "the leaky_relu tail instruction (into out when given: ORT's buffer)");
  m.def("tail_of_f16", &TailOfF16Py, py::arg("x"), py::arg("codes"), py::arg("consts"), py::arg("threads") = 1,
        py::arg("out") = py::none(),
        "tail_of for float16 x: each chunk widened to float32, the instructions, rounded once to float16 on store "
        "(into out when given: ORT's buffer)");
  m.def("tail_of_bias", &TailOfBiasPy, py::arg("x"), py::arg("bias"), py::arg("codes"), py::arg("consts"),
        py::arg("threads") = 1, py::arg("out") = py::none(),
        "x + bias (bias along x's last axis) then the engine's instructions, float32 or float16 (widened per chunk, "
        "rounded once on store), into out when given (ORT's buffer): BiasGelu");
  m.def(
      "tail_in_registers",
      [](const py::array_t<int32_t, py::array::c_style>& codes) { return FitsRegisters(codes.data(), codes.size()); },
      py::arg("codes"),
      "whether the engine runs these instruction codes in registers (one pass) on this host at the active ISA, "
      "rather than one pass per instruction over L1 chunks");
  m.def("sigmoid", &SigmoidPy, py::arg("x"), py::arg("threads") = 1, py::arg("out") = py::none(),
        "ONNX Sigmoid of float32 x: 1 / (1 + exp(min(-x, 88))), exp in lanes on AVX2/AVX-512 hosts (within 2 ulp of "
        "numpy's, as the conv tail's sigmoid), into out when given (ORT's buffer)");
}

}  // namespace npu_ep::kern
