// Float32 math of the element-wise engine's transcendental instructions (conv_tail.cc's TailChunk): log, expm1,
// log1p, sin, cos, round-half-even and sign (exp: Cephes' below, which the engine's exp, elu and softplus loops no
// longer call: they take exp_tanh.cc's exp, a quarter of its time), written as plain float32 operations, integer bit
// moves and selects, with no library call, so each loop over them vectorizes in every instruction-set clone of
// TailChunk and gives the same bits on every host (no FMA: conv_tail.cc compiles with fp-contract off). The
// algorithms are Cephes' single-precision ones; the error bounds against the exact (float64) function are measured
// by tests/kernels/test_sweep_unary_engine.py.
#pragma once

#include <cstdint>
#include <cstring>

namespace npu_ep::kern::engine {

inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint32_t ToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float Abs(float x) { return FromBits(ToBits(x) & 0x7fffffffu); }  // fabs, as a bit mask: it vectorizes

inline float Pow2(int32_t k) { return FromBits(static_cast<uint32_t>(k + 127) << 23); }  // 2^k, -126 <= k <= 127

// Round to the nearest integer, ties to even, for |x| < 2^22: adding and subtracting 1.5 * 2^23 (the default
// rounding mode does the rounding).
inline float RoundSmall(float x) {
  const float magic = 12582912.0f;
  return (x + magic) - magic;
}

// exp(x): n = round(x / ln 2), r = x - n ln 2 (Cody-Waite, the high part exact), Cephes' degree-6 polynomial, then
// 2^n as two exact power-of-two factors so subnormal results round once. exp(x) = +inf above ln(FLT_MAX), 0 below
// -104 (where it rounds to 0), NaN kept.
inline float Exp(float x) {
  const float hi = 88.72283935546875f, lo = -104.0f;
  const float c = x > hi ? hi : (x < lo ? lo : (x == x ? x : 0.0f));
  const float n = RoundSmall(c * 1.44269504088896341f);
  const float r = (c - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = (p * (r * r) + r) + 1.0f;
  const int32_t k = static_cast<int32_t>(n), k1 = k / 2;
  const float e = (y * Pow2(k1)) * Pow2(k - k1);
  return x > hi ? FromBits(0x7f800000u) : (x == x ? e : x);
}

// log(x): x = m 2^e with m in [sqrt(1/2), sqrt 2), Cephes' degree-9 polynomial in m - 1, e ln 2 added in two
// parts; subnormal x scaled by 2^23 first. log(0) = -inf, log(x < 0) = NaN, log(+inf) = +inf, NaN kept.
inline float Log(float x) {
  const bool tiny = x < 1.17549435e-38f;
  const float s = tiny ? x * 8388608.0f : x;
  const uint32_t u = ToBits(s);
  float e = static_cast<float>(static_cast<int32_t>(u >> 23) - 126) - (tiny ? 23.0f : 0.0f);
  float m = FromBits((u & 0x007fffffu) | 0x3f000000u);  // [0.5, 1)
  const bool low = m < 0.707106781186547524f;
  e = low ? e - 1.0f : e;
  m = low ? (m + m) - 1.0f : m - 1.0f;
  const float z = m * m;
  float p = 7.0376836292e-2f;
  p = p * m + -1.1514610310e-1f;
  p = p * m + 1.1676998740e-1f;
  p = p * m + -1.2420140846e-1f;
  p = p * m + 1.4249322787e-1f;
  p = p * m + -1.6668057665e-1f;
  p = p * m + 2.0000714765e-1f;
  p = p * m + -2.4999993993e-1f;
  p = p * m + 3.3333331174e-1f;
  float y = (p * m) * z;
  y = y + e * -2.12194440e-4f;
  y = y - 0.5f * z;
  const float r = (m + y) + e * 0.693359375f;
  const float inf = FromBits(0x7f800000u), nan = FromBits(0x7fc00000u);
  return x == 0.0f ? -inf : (x < 0.0f ? nan : (x == inf || x != x ? x + 0.0f : r));
}

// expm1(x): the Taylor polynomial to x^9 for |x| < 0.5 (its remainder is below 2^-30 of the result), exp(x) - 1
// beyond (no cancellation worth a bit there); -1 below -17 (exp rounds away), NaN and +-0 kept. Expm1From takes
// exp(x) computed apart (conv_tail.cc's loops: exp_tanh.cc's exp).
inline float Expm1From(float x, float exp_x) {
  float p = 1.0f / 362880.0f;
  p = p * x + 1.0f / 40320.0f;
  p = p * x + 1.0f / 5040.0f;
  p = p * x + 1.0f / 720.0f;
  p = p * x + 1.0f / 120.0f;
  p = p * x + 1.0f / 24.0f;
  p = p * x + 1.0f / 6.0f;
  p = p * x + 0.5f;
  const float small = x + (x * x) * p, big = exp_x - 1.0f;  // both computed: the select vectorizes
  const bool near = x < 0.5f && x > -0.5f;
  return near ? (x == 0.0f ? x : small) : big;
}

inline float Expm1(float x) { return Expm1From(x, Exp(x)); }

// log(1 + t) for t >= 0: Kahan's log(u) * (t / (u - 1)) with u = 1 + t rounded, which cancels u's rounding
// error; t itself where 1 + t rounds to 1; +inf for +inf.
// Log1pFrom takes log(1 + t) computed apart (conv_tail.cc's loops).
inline float Log1pFrom(float t, float log_u) {
  const float d = (1.0f + t) - 1.0f;
  const float r = log_u * (t / (d == 0.0f ? 1.0f : d));
  return d == 0.0f ? t : r;
}

inline float Log1p(float t) { return Log1pFrom(t, Log(1.0f + t)); }

// Softplus log(1 + exp(x)) as max(x, 0) + log1p(exp(-|x|)) (no overflow; numpy's logaddexp(0, x) form), NaN kept:
// SoftplusFrom takes log1p(exp(-|x|)) computed apart (conv_tail.cc's loops).
inline float SoftplusFrom(float x, float log1p_exp) {
  const float m = x > 0.0f ? x : 0.0f;
  const float r = m + log1p_exp;
  return x == x ? r : x;
}

inline float Softplus(float x) { return SoftplusFrom(x, Log1p(Exp(-Abs(x)))); }

// sin and cos: j = the octant of |x| (4/pi |x|, rounded up to even), |x| - j pi/4 in three exact parts
// (Cody-Waite), Cephes' sin/cos polynomials on [-pi/4, pi/4]. Exact reduction needs |x| < 8192: the engine leaves
// larger |x| (and +-inf: NaN) to the caller (SinCosFits).
inline bool SinCosFits(float x) { return x < 8192.0f && x > -8192.0f; }

__attribute__((always_inline)) inline float SinCos(float x, bool cosine) {
  const float a = SinCosFits(x) ? (x < 0.0f ? -x : x) : 0.0f;  // the caller's values elsewhere: no NaN to convert
  int32_t j = static_cast<int32_t>(a * 1.27323954473516f);
  j += j & 1;
  const float y = static_cast<float>(j);
  const float r = ((a - y * 0.78515625f) - y * 2.4187564849853515625e-4f) - y * 3.77489497744594108e-8f;
  const float z = r * r;
  const float sp = ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f) * (z * r) + r;
  const float cp =
      ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f) * (z * z) - 0.5f * z + 1.0f;
  const int32_t oct = j & 7;
  // sin: octants 0/4 sin poly, 2/6 cos poly; 4 and 6 negate, and x's sign bit flips the result (sin(-0) = -0 as the
  // +0 polynomial's value flipped). cos: 0/4 cos poly, 2/6 sin poly; 2 and 4 negate. The negation as a sign-bit
  // xor: a select on x == 0 kept sin's loop scalar.
  const bool use_cos = (oct == 2 || oct == 6) != cosine;
  const float v = use_cos ? cp : sp;
  const uint32_t flip = cosine ? ((oct == 2 || oct == 4) ? 0x80000000u : 0u)
                               : ((static_cast<uint32_t>(oct & 4) << 29) ^ (ToBits(x) & 0x80000000u));
  return FromBits(ToBits(v) ^ flip);
}

// Floor and ceil from the rounded value (no library call: the loops vectorize), a zero result with x's sign.
inline float WithZeroSign(float r, float x) { return r == 0.0f ? FromBits(ToBits(r) | (ToBits(x) & 0x80000000u)) : r; }

inline float RoundEven(float x);

inline float Floor(float x) {
  const float t = RoundEven(x), down = t - 1.0f;
  return WithZeroSign(t > x ? down : t, x);
}

inline float Ceil(float x) {
  const float t = RoundEven(x), up = t + 1.0f;
  return WithZeroSign(t < x ? up : t, x);
}

// ONNX Round: half to even, the sign of a zero result x's (rint); |x| >= 2^23, +-inf and NaN are integral already.
// |x| + 2^23 - 2^23 rounds |x| < 2^23 (the default rounding mode does it).
inline float RoundEven(float x) {
  const float a = x < 0.0f ? -x : x;
  const float r = (a + 8388608.0f) - 8388608.0f;
  return a < 8388608.0f ? FromBits(ToBits(r) | (ToBits(x) & 0x80000000u)) : x;
}

// Sign: 1, -1, +0 for +-0 (as ORT's); NaN kept, or 0 when nan_to_zero (ORT's float16 Sign compares with 0).
inline float Sign(float x, bool nan_to_zero) {
  return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : (x == x || nan_to_zero ? 0.0f : x));
}

}  // namespace npu_ep::kern::engine
