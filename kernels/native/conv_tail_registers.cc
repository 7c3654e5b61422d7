// The element-wise engine's register interpreter: a conv tail's (or a standalone chain's) instructions applied to
// a block of a few vectors held in registers, all of them before the next block is loaded, so a tail of five
// instructions costs one pass over the data instead of five passes over an L1 chunk (HardSwish after a conv was
// as slow as the conv). Each instruction is the chunk interpreter's float32 operation per element (conv_tail.cc's
// TailChunk), in lanes: the same bits (tests/kernels/test_sweep_tail_registers.py compares the two bit for bit on
// every ISA). Instructions with a long body of their own (exp, log, elu, softplus, sin, cos; floor, ceil, round,
// sign) keep the chunk interpreter, and hosts without AVX2 (aarch64 too) run the chunk interpreter only.
#include "conv_tail_registers.h"

#include <cmath>
#include <cstdint>

#include "cpu.h"
#include "intrinsics.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("O3", "fp-contract=off")  // the instructions' own roundings: no multiply-add
#endif

namespace npu_ep::kern::tail_code {
namespace {

// The codes RunInRegisters knows, as a bit set.
constexpr uint32_t Bit(Code c) { return uint32_t{1} << c; }
constexpr uint32_t kRegisterCodes = Bit(kMul) | Bit(kAdd) | Bit(kSub) | Bit(kRsub) | Bit(kDiv) | Bit(kRdiv) |
                                    Bit(kClip) | Bit(kSave) | Bit(kMulSaved) | Bit(kAddSaved) | Bit(kSigmoid) |
                                    Bit(kErf) | Bit(kLeakyRelu) | Bit(kTanh) | Bit(kPowHalf) | Bit(kAbs) |
                                    Bit(kDivSaved) | Bit(kSoftsign);

#if NPU_EP_X86
constexpr int kVectors = 4;  // vectors per block: 64 floats on AVX-512, 32 on AVX2 (v and s: 8 registers)

// ---- AVX-512: 16 lanes ----

#define NPU_AVX512 __attribute__((target("avx2,fma,avx512f"), always_inline)) inline

// x < lo ? lo : (x > hi ? hi : x), NaN kept (the chunk interpreter's clip, and erf's and tanh's clamps)
NPU_AVX512 __m512 Clip512(__m512 x, __m512 lo, __m512 hi) {
  const __m512 r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ), x, hi);
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), r, lo);
}

NPU_AVX512 __m512 Abs512(__m512 x) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)));
}

// p = p * x2 + k per coefficient (Horner without multiply-add), as conv_tail.cc's Erf and Tanh
template <int N>
NPU_AVX512 __m512 Horner512(__m512 x2, const float (&k)[N]) {
  __m512 p = _mm512_set1_ps(k[0]);
  for (int j = 1; j < N; ++j) p = _mm512_add_ps(_mm512_mul_ps(p, x2), _mm512_set1_ps(k[j]));
  return p;
}

constexpr float kErfP[] = {-2.72614225801306e-10f, 2.77068142495902e-08f,  -2.10102402082508e-06f,
                           -5.69250639462346e-05f, -7.34990630326855e-04f, -2.95459980854025e-03f,
                           -1.60960333262415e-02f};
constexpr float kErfQ[] = {-1.45660718464996e-05f, -2.13374055278905e-04f, -1.68282697438203e-03f,
                           -7.37332916720468e-03f, -1.42647390514189e-02f};
constexpr float kTanhP[] = {-2.76076847742355e-16f, 2.00018790482477e-13f, -8.60467152213735e-11f,
                            5.12229709037114e-08f,  1.48572235717979e-05f, 6.37261928875436e-04f,
                            4.89352455891786e-03f};
constexpr float kTanhQ[] = {1.19825839466702e-06f, 1.18534705686654e-04f, 2.26843463243900e-03f, 4.89352518554385e-03f};

// c * (P(c^2) / Q(c^2)) with c = x clamped to [-bound, bound]: erf (bound 4) or tanh (bound 9)
template <int NP, int NQ>
NPU_AVX512 __m512 Rational512(__m512 x, float bound, const float (&p)[NP], const float (&q)[NQ]) {
  const __m512 c = Clip512(x, _mm512_set1_ps(-bound), _mm512_set1_ps(bound));
  const __m512 x2 = _mm512_mul_ps(c, c);
  return _mm512_mul_ps(c, _mm512_div_ps(Horner512(x2, p), Horner512(x2, q)));
}

// 1 / (exp(min(88, 0 - v)) + 1), as SigmoidAvx512
NPU_AVX512 __m512 Sigmoid512(__m512 v) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e = ExpAvx512(_mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_sub_ps(_mm512_setzero_ps(), v)));
  return _mm512_div_ps(one, _mm512_add_ps(e, one));
}

// v >= 0 ? v : v * a, NaN kept
NPU_AVX512 __m512 LeakyRelu512(__m512 v, __m512 a) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GE_OQ), _mm512_mul_ps(v, a), v);
}

// sqrt(v) + 0, +inf for -inf, as PowHalfAvx512
NPU_AVX512 __m512 PowHalf512(__m512 v) {
  const __m512 r = _mm512_add_ps(_mm512_sqrt_ps(v), _mm512_setzero_ps());
  const __mmask16 neg_inf = _mm512_cmp_ps_mask(v, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
  return _mm512_mask_blend_ps(neg_inf, r, _mm512_set1_ps(INFINITY));
}

// One instruction on every vector of a block (s: the saved copies), as TailChunk's case of the same code.
// ordered: a <= b, where clip is max(a, min(b, v)) in two instructions: min(b, v) is b < v ? b : v (v when NaN) and
// max(a, r) is a > r ? a : r, which with a <= b give v < a ? a : (v > b ? b : v), NaN and the sign of zero included.
NPU_AVX512 void Step512(int32_t code, __m512 (&v)[kVectors], __m512 (&s)[kVectors], __m512 a, __m512 b, bool ordered) {
  switch (code) {
    case kMul:
      for (int u = 0; u < kVectors; ++u) v[u] = _mm512_mul_ps(v[u], a);
      break;
    case kAdd:
      for (int u = 0; u < kVectors; ++u) v[u] = _mm512_add_ps(v[u], a);
      break;
    case kSub:
      for (int u = 0; u < kVectors; ++u) v[u] = _mm512_sub_ps(v[u], a);
      break;
    case kRsub:
      for (int u = 0; u < kVectors; ++u) v[u] = _mm512_sub_ps(a, v[u]);
      break;
    case kDiv:
      for (int u = 0; u < kVectors; ++u) v[u] = _mm512_div_ps(v[u], a);
      break;
    case kRdiv:
      for (int u = 0; u < kVectors; ++u) v[u] = _mm512_div_ps(a, v[u]);
      break;
    case kClip:
      if (ordered) {
        for (int u = 0; u < kVectors; ++u) v[u] = _mm512_max_ps(a, _mm512_min_ps(b, v[u]));
      } else {
        for (int u = 0; u < kVectors; ++u) v[u] = Clip512(v[u], a, b);
      }
      break;
    case kSave:
      for (int u = 0; u < kVectors; ++u) s[u] = v[u];
      break;
    case kMulSaved:
      for (int u = 0; u < kVectors; ++u) v[u] = _mm512_mul_ps(s[u], v[u]);
      break;
    case kAddSaved:
      for (int u = 0; u < kVectors; ++u) v[u] = _mm512_add_ps(s[u], v[u]);
      break;
    case kDivSaved:
      for (int u = 0; u < kVectors; ++u) v[u] = _mm512_div_ps(s[u], v[u]);
      break;
    case kSigmoid:
      for (int u = 0; u < kVectors; ++u) v[u] = Sigmoid512(v[u]);
      break;
    case kErf:
      for (int u = 0; u < kVectors; ++u) v[u] = Rational512(v[u], 4.0f, kErfP, kErfQ);
      break;
    case kTanh:
      for (int u = 0; u < kVectors; ++u) v[u] = Rational512(v[u], 9.0f, kTanhP, kTanhQ);
      break;
    case kLeakyRelu:
      for (int u = 0; u < kVectors; ++u) v[u] = LeakyRelu512(v[u], a);
      break;
    case kPowHalf:
      for (int u = 0; u < kVectors; ++u) v[u] = PowHalf512(v[u]);
      break;
    case kAbs:
      for (int u = 0; u < kVectors; ++u) v[u] = Abs512(v[u]);
      break;
    case kSoftsign:
      for (int u = 0; u < kVectors; ++u) v[u] = _mm512_div_ps(v[u], _mm512_add_ps(_mm512_set1_ps(1.0f), Abs512(v[u])));
      break;
    default: break;  // not in kRegisterCodes: FitsRegisters keeps such programs away
  }
}

// The program on a block of kVectors vectors: instruction by instruction, each on every vector.
NPU_AVX512 void Block512(__m512 (&v)[kVectors], __m512 (&s)[kVectors], const int32_t* codes, const float* c,
                         int64_t n_codes) {
  for (int64_t k = 0; k < n_codes; ++k) {
    const float a = c[2 * k], b = c[2 * k + 1];
    Step512(codes[k], v, s, _mm512_set1_ps(a), _mm512_set1_ps(b), a <= b);
  }
}

// HardSwish's program (save; mul a; add b; clip lo hi with lo <= hi; mul_saved) without the per-instruction
// dispatch: Step512's operations for those codes, in order.
NPU_AVX512 void HardSwish512(__m512 (&v)[kVectors], const float* c) {
  const __m512 a = _mm512_set1_ps(c[2]), b = _mm512_set1_ps(c[4]), lo = _mm512_set1_ps(c[6]), hi = _mm512_set1_ps(c[7]);
  for (int u = 0; u < kVectors; ++u)
    v[u] = _mm512_mul_ps(v[u], _mm512_max_ps(lo, _mm512_min_ps(hi, _mm512_add_ps(_mm512_mul_ps(v[u], a), b))));
}

#undef NPU_AVX512

// bias: nullptr, or bias[i] added to in[i] as it is loaded (a float32 add: BiasGelu's x + bias).
template <bool kHardSwish, bool kBias>
__attribute__((target("avx2,fma,avx512f"))) void Run512(const float* in, const float* bias, float* out, int64_t n,
                                                        const int32_t* codes, const float* c, int64_t n_codes) {
  constexpr int64_t kBlock = 16 * kVectors;
  __m512 v[kVectors], s[kVectors];
#pragma GCC unroll 4
  for (int u = 0; u < kVectors; ++u) s[u] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
#pragma GCC unroll 4
    for (int u = 0; u < kVectors; ++u) {
      v[u] = _mm512_loadu_ps(in + i + 16 * u);
      if constexpr (kBias) v[u] = _mm512_add_ps(v[u], _mm512_loadu_ps(bias + i + 16 * u));
    }
    if constexpr (kHardSwish) {
      HardSwish512(v, c);
    } else {
      Block512(v, s, codes, c, n_codes);
    }
#pragma GCC unroll 4
    for (int u = 0; u < kVectors; ++u) _mm512_storeu_ps(out + i + 16 * u, v[u]);
  }
  if (i == n) return;
  __mmask16 m[kVectors];  // the last 1 .. kBlock - 1 through masked vectors (zeros in the unused lanes)
#pragma GCC unroll 4
  for (int u = 0; u < kVectors; ++u) {
    const int64_t left = n - i - 16 * u;
    m[u] = left >= 16 ? 0xFFFF : left <= 0 ? 0 : static_cast<__mmask16>((1u << left) - 1u);
    v[u] = _mm512_maskz_loadu_ps(m[u], in + i + 16 * u);
    if constexpr (kBias) v[u] = _mm512_add_ps(v[u], _mm512_maskz_loadu_ps(m[u], bias + i + 16 * u));
  }
  if constexpr (kHardSwish) {
    HardSwish512(v, c);
  } else {
    Block512(v, s, codes, c, n_codes);
  }
#pragma GCC unroll 4
  for (int u = 0; u < kVectors; ++u) _mm512_mask_storeu_ps(out + i + 16 * u, m[u], v[u]);
}

// ---- AVX2: 8 lanes ----

#define NPU_AVX2 __attribute__((target("avx2,fma"), always_inline)) inline

NPU_AVX2 __m256 Clip256(__m256 x, __m256 lo, __m256 hi) {
  const __m256 r = _mm256_blendv_ps(x, hi, _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
  return _mm256_blendv_ps(r, lo, _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
}

NPU_AVX2 __m256 Abs256(__m256 x) { return _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }

template <int N>
NPU_AVX2 __m256 Horner256(__m256 x2, const float (&k)[N]) {
  __m256 p = _mm256_set1_ps(k[0]);
  for (int j = 1; j < N; ++j) p = _mm256_add_ps(_mm256_mul_ps(p, x2), _mm256_set1_ps(k[j]));
  return p;
}

template <int NP, int NQ>
NPU_AVX2 __m256 Rational256(__m256 x, float bound, const float (&p)[NP], const float (&q)[NQ]) {
  const __m256 c = Clip256(x, _mm256_set1_ps(-bound), _mm256_set1_ps(bound));
  const __m256 x2 = _mm256_mul_ps(c, c);
  return _mm256_mul_ps(c, _mm256_div_ps(Horner256(x2, p), Horner256(x2, q)));
}

NPU_AVX2 __m256 Sigmoid256(__m256 v) {  // as SigmoidAvx2
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = ExpAvx2(_mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_sub_ps(_mm256_setzero_ps(), v)));
  return _mm256_div_ps(one, _mm256_add_ps(e, one));
}

NPU_AVX2 __m256 LeakyRelu256(__m256 v, __m256 a) {
  return _mm256_blendv_ps(_mm256_mul_ps(v, a), v, _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GE_OQ));
}

NPU_AVX2 __m256 PowHalf256(__m256 v) {  // as PowHalfAvx2
  const __m256 r = _mm256_add_ps(_mm256_sqrt_ps(v), _mm256_setzero_ps());
  return _mm256_blendv_ps(r, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(v, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ));
}

NPU_AVX2 void Step256(int32_t code, __m256 (&v)[kVectors], __m256 (&s)[kVectors], __m256 a, __m256 b, bool ordered) {
  switch (code) {
    case kMul:
      for (int u = 0; u < kVectors; ++u) v[u] = _mm256_mul_ps(v[u], a);
      break;
    case kAdd:
      for (int u = 0; u < kVectors; ++u) v[u] = _mm256_add_ps(v[u], a);
      break;
    case kSub:
      for (int u = 0; u < kVectors; ++u) v[u] = _mm256_sub_ps(v[u], a);
      break;
    case kRsub:
      for (int u = 0; u < kVectors; ++u) v[u] = _mm256_sub_ps(a, v[u]);
      break;
    case kDiv:
      for (int u = 0; u < kVectors; ++u) v[u] = _mm256_div_ps(v[u], a);
      break;
    case kRdiv:
      for (int u = 0; u < kVectors; ++u) v[u] = _mm256_div_ps(a, v[u]);
      break;
    case kClip:
      if (ordered) {
        for (int u = 0; u < kVectors; ++u) v[u] = _mm256_max_ps(a, _mm256_min_ps(b, v[u]));
      } else {
        for (int u = 0; u < kVectors; ++u) v[u] = Clip256(v[u], a, b);
      }
      break;
    case kSave:
      for (int u = 0; u < kVectors; ++u) s[u] = v[u];
      break;
    case kMulSaved:
      for (int u = 0; u < kVectors; ++u) v[u] = _mm256_mul_ps(s[u], v[u]);
      break;
    case kAddSaved:
      for (int u = 0; u < kVectors; ++u) v[u] = _mm256_add_ps(s[u], v[u]);
      break;
    case kDivSaved:
      for (int u = 0; u < kVectors; ++u) v[u] = _mm256_div_ps(s[u], v[u]);
      break;
    case kSigmoid:
      for (int u = 0; u < kVectors; ++u) v[u] = Sigmoid256(v[u]);
      break;
    case kErf:
      for (int u = 0; u < kVectors; ++u) v[u] = Rational256(v[u], 4.0f, kErfP, kErfQ);
      break;
    case kTanh:
      for (int u = 0; u < kVectors; ++u) v[u] = Rational256(v[u], 9.0f, kTanhP, kTanhQ);
      break;
    case kLeakyRelu:
      for (int u = 0; u < kVectors; ++u) v[u] = LeakyRelu256(v[u], a);
      break;
    case kPowHalf:
      for (int u = 0; u < kVectors; ++u) v[u] = PowHalf256(v[u]);
      break;
    case kAbs:
      for (int u = 0; u < kVectors; ++u) v[u] = Abs256(v[u]);
      break;
    case kSoftsign:
      for (int u = 0; u < kVectors; ++u) v[u] = _mm256_div_ps(v[u], _mm256_add_ps(_mm256_set1_ps(1.0f), Abs256(v[u])));
      break;
    default: break;  // not in kRegisterCodes: FitsRegisters keeps such programs away
  }
}

NPU_AVX2 void Block256(__m256 (&v)[kVectors], __m256 (&s)[kVectors], const int32_t* codes, const float* c,
                       int64_t n_codes) {
  for (int64_t k = 0; k < n_codes; ++k) {
    const float a = c[2 * k], b = c[2 * k + 1];
    Step256(codes[k], v, s, _mm256_set1_ps(a), _mm256_set1_ps(b), a <= b);
  }
}

#undef NPU_AVX2

template <bool kBias>
__attribute__((target("avx2,fma"))) void Run256(const float* in, const float* bias, float* out, int64_t n,
                                                const int32_t* codes, const float* c, int64_t n_codes) {
  constexpr int64_t kBlock = 8 * kVectors;
  __m256 v[kVectors], s[kVectors];
#pragma GCC unroll 4
  for (int u = 0; u < kVectors; ++u) s[u] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
#pragma GCC unroll 4
    for (int u = 0; u < kVectors; ++u) {
      v[u] = _mm256_loadu_ps(in + i + 8 * u);
      if constexpr (kBias) v[u] = _mm256_add_ps(v[u], _mm256_loadu_ps(bias + i + 8 * u));
    }
    Block256(v, s, codes, c, n_codes);
#pragma GCC unroll 4
    for (int u = 0; u < kVectors; ++u) _mm256_storeu_ps(out + i + 8 * u, v[u]);
  }
  if (i == n) return;
  __m256i m[kVectors];  // the last 1 .. kBlock - 1 through masked vectors (zeros in the unused lanes)
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
#pragma GCC unroll 4
  for (int u = 0; u < kVectors; ++u) {
    const int64_t left = n - i - 8 * u;
    m[u] = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left < 0 ? 0 : left > 8 ? 8 : left)), lane);
    v[u] = _mm256_maskload_ps(in + i + 8 * u, m[u]);
    if constexpr (kBias) v[u] = _mm256_add_ps(v[u], _mm256_maskload_ps(bias + i + 8 * u, m[u]));
  }
  Block256(v, s, codes, c, n_codes);
#pragma GCC unroll 4
  for (int u = 0; u < kVectors; ++u) _mm256_maskstore_ps(out + i + 8 * u, m[u], v[u]);
}
#endif

}  // namespace

bool FitsRegisters(const int32_t* codes, int64_t n_codes) {
#if NPU_EP_X86
  if (ActiveIsa() < Isa::kAvx2) return false;
  for (int64_t k = 0; k < n_codes; ++k)
    if (codes[k] < 0 || codes[k] >= 32 || !((kRegisterCodes >> codes[k]) & 1u)) return false;
  return true;
#else
  (void)codes;
  (void)n_codes;
  (void)kRegisterCodes;
  return false;
#endif
}

namespace {
// The widest register interpreter this host has; kBias: in + bias[...] as each chunk is loaded (RunInRegistersBias).
template <bool kBias>
void RunWidest(const float* in, const float* bias, float* out, int64_t n, const int32_t* codes, const float* consts,
               int64_t n_codes) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) {
    float hs[4];
    if (HardSwishProgram(codes, consts, n_codes, hs))
      return Run512<true, kBias>(in, bias, out, n, codes, consts, n_codes);
    return Run512<false, kBias>(in, bias, out, n, codes, consts, n_codes);
  }
  return Run256<kBias>(in, bias, out, n, codes, consts, n_codes);
#else
  (void)in, (void)bias, (void)out, (void)n, (void)codes, (void)consts, (void)n_codes;
#endif
}
}  // namespace

void RunInRegisters(const float* in, float* out, int64_t n, const int32_t* codes, const float* consts,
                    int64_t n_codes) {
  RunWidest<false>(in, nullptr, out, n, codes, consts, n_codes);
}

void RunInRegistersBias(const float* in, const float* bias, float* out, int64_t n, const int32_t* codes,
                        const float* consts, int64_t n_codes) {
  RunWidest<true>(in, bias, out, n, codes, consts, n_codes);
}

bool HardSwishProgram(const int32_t* codes, const float* consts, int64_t n_codes, float* hs) {
  if (n_codes != 5 || codes[0] != kSave || codes[1] != kMul || codes[2] != kAdd || codes[3] != kClip ||
      codes[4] != kMulSaved || !(consts[6] <= consts[7]))
    return false;
  hs[0] = consts[2], hs[1] = consts[4], hs[2] = consts[6], hs[3] = consts[7];
  return true;
}

}  // namespace npu_ep::kern::tail_code
