// GroupQueryAttention, float32 (see gqa.h). One task per (batch, kv head) writes that head's present rows (past
// prefix, rotated new K and new V, zeroed stale tail) and then attends its G query heads token by token:
// up to kRows heads of one token share one pass over K (scores) and one over V (P V), since they see the same
// keys [lo, hi). Only visible keys are read, so there is no mask. The softmax is the reference's: scores =
// (scale * q) . k, softcap c * tanh(x / c), subtract the row max, exp, output = (P V) / sum.
#include "gqa.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu.h"
#include "gqa_internal.h"
#include "thread_pool.h"

#if NPU_EP_X86
#include <immintrin.h>
#endif

namespace npu_ep::kern {
namespace {

using gqa::kRows;
using gqa::Ops;
constexpr int64_t kTransposeRows = 16;  // rows per task from which K is transposed once (costs T*H moves)

// Rotary as the reference computes it (x0 c + x1 (-s), x1 c + x0 s; two roundings, no fused multiply-add) on the
// first 2 * half channels; the rest is copied. y may alias x.
void Rotate(const float* x, float* y, const float* c, const float* sn, int64_t half, int64_t h, bool interleaved) {
  for (int64_t i = 0; i < half; ++i) {
    const int64_t i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
    const float x0 = x[i0], x1 = x[i1];
    const float a0 = x0 * c[i], b0 = x1 * -sn[i];
    const float a1 = x1 * c[i], b1 = x0 * sn[i];
    y[i0] = a0 + b0;
    y[i1] = a1 + b1;
  }
  if (y != x) std::memcpy(y + 2 * half, x + 2 * half, sizeof(float) * (h - 2 * half));
}

int64_t Position(const GqaArgs& a, int64_t b, int64_t s) {
  return a.position_ids ? a.position_ids[b * a.S + s] : a.past_len[b] + s;
}

// ---- float16 rows (stored as IEEE binary16 bits; math is float32, as the reference's) ----

using Half = uint16_t;

float HalfToFloat(Half h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float32
    const float f = static_cast<float>(man) * (1.0f / 16777216.0f);
    return sign ? -f : f;
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

Half FloatToHalf(float f) {  // round to nearest, ties to even (numpy's astype, F16C's vcvtps2ph)
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return static_cast<Half>(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));  // Inf, NaN
  if (ax >= 0x477ff000u) return static_cast<Half>(sign | 0x7c00);  // >= 65520 rounds to Inf
  if (ax < 0x38800000u) {  // below 2^-14: a subnormal half, |f| * 2^24 rounded to an integer (exact scaling)
    return static_cast<Half>(sign | static_cast<uint32_t>(RoundHalfEven(std::fabs(f) * 16777216.0f)));
  }
  const uint32_t r = ax - 0x38000000u + 0x0fff + ((ax >> 13) & 1);  // rebias, round the 13 dropped bits
  return static_cast<Half>(sign | (r >> 13));
}

#if NPU_EP_X86
__attribute__((target("avx2,f16c"))) void HalfRowF16c(const Half* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) d[i] = HalfToFloat(s[i]);
}

__attribute__((target("avx2,f16c"))) void FloatRowF16c(const float* s, Half* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) d[i] = FloatToHalf(s[i]);
}
#endif

void ToFloat(const float* s, float* d, int64_t n) { std::memcpy(d, s, sizeof(float) * n); }
void ToFloat(const Half* s, float* d, int64_t n) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx2 && HasF16c()) return HalfRowF16c(s, d, n);
#endif
  for (int64_t i = 0; i < n; ++i) d[i] = HalfToFloat(s[i]);
}
void FromFloat(const float* s, float* d, int64_t n) { std::memcpy(d, s, sizeof(float) * n); }
void FromFloat(const float* s, Half* d, int64_t n) {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx2 && HasF16c()) return FloatRowF16c(s, d, n);
#endif
  for (int64_t i = 0; i < n; ++i) d[i] = FloatToHalf(s[i]);
}

// The visible keys [lo, hi) of the query at token s of batch b (hi <= lo: none).
struct KeyRange {
  int64_t lo, hi;
};
KeyRange Visible(const GqaArgs& a, int64_t b, int64_t s) {
  const int64_t pos = a.past_len[b] + s;  // the query's own key
  return {a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0, std::min<int64_t>(pos + 1, a.total_len[b])};
}

// Attention of kv head kh's query heads in batch b against its present rows pk/pv. Rows are (token, head) pairs
// in token-major order, taken kRows at a time: the heads of one token, or several tokens when G < kRows. A group
// scores the union of its rows' key ranges; keys outside a row's own range get probability 0. With many rows
// (prefill), K is transposed once per task so scores are broadcast FMAs over keys instead of reduced dot products.
// float16 presents are widened once per task (the reference attends the rounded present rows too).
template <typename T>
void Attend(const GqaArgs& a, const Ops& ops, int64_t b, int64_t kh, const T* pk, const T* pv) {
  const int64_t H = a.H, S = a.S, G = a.N / a.Nkv, rows_total = G * S;
  const bool transposed = rows_total >= kTransposeRows;
  const float scale = a.scale;
  thread_local std::vector<float> qbuf, sc, kt, kf, vf, obuf;
  const KeyRange first = Visible(a, b, 0), last = Visible(a, b, S - 1);
  const int64_t t0 = std::min(first.lo, last.lo), t1 = std::max<int64_t>(t0, std::max(first.hi, last.hi));
  const int64_t ld = std::max<int64_t>((t1 - t0 + 15) / 16 * 16, 16);  // score row / transposed K row length
  qbuf.resize(kRows * H);
  sc.resize(kRows * ld);
  const float* kbase;  // key t's float32 row at kbase + (t - t0) * H
  const float* vbase;
  if constexpr (std::is_same_v<T, float>) {
    kbase = pk + t0 * H;
    vbase = pv + t0 * H;
  } else {
    kf.resize((t1 - t0) * H);
    vf.resize((t1 - t0) * H);
    obuf.resize(kRows * H);
    ToFloat(pk + t0 * H, kf.data(), (t1 - t0) * H);
    ToFloat(pv + t0 * H, vf.data(), (t1 - t0) * H);
    kbase = kf.data();
    vbase = vf.data();
  }
  if (transposed) {
    kt.resize(H * ld);
    for (int64_t tb = 0; tb < t1 - t0; tb += 16) {  // 16 keys at a time: 64-byte runs on both sides
      const int64_t te = std::min(tb + 16, t1 - t0);
      for (int64_t i = 0; i < H; ++i)
        for (int64_t t = tb; t < te; ++t) kt[i * ld + t] = kbase[t * H + i];
    }
  }
  float sums[kRows];
  KeyRange range[kRows];
  float* orow[kRows];
  T* dst[kRows];
  for (int64_t r0 = 0; r0 < rows_total; r0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, rows_total - r0));
    int64_t lo = t1, hi = t0;
    for (int r = 0; r < rows; ++r) {
      const int64_t s = (r0 + r) / G, n = kh * G + (r0 + r) % G;
      range[r] = Visible(a, b, s);
      if (range[r].hi > range[r].lo) lo = std::min(lo, range[r].lo), hi = std::max(hi, range[r].hi);
      dst[r] = static_cast<T*>(a.out) + ((b * S + s) * a.N + n) * H;
      if constexpr (std::is_same_v<T, float>)
        orow[r] = dst[r];
      else
        orow[r] = obuf.data() + r * H;
      float* qr = qbuf.data() + r * H;
      ToFloat(static_cast<const T*>(a.q) + (b * S + s) * a.q_tok + n * H, qr, H);
      if (a.cos) {
        const int64_t p = Position(a, b, s);
        Rotate(qr, qr, a.cos + p * a.half, a.sin + p * a.half, a.half, H, a.interleaved);
      }
      for (int64_t i = 0; i < H; ++i) qr[i] *= scale;
    }
    const int64_t nk = std::max<int64_t>(hi - lo, 0);  // 0: no row of the group sees a key
    if (nk > 0) {
      if (transposed)
        ops.scores_t(qbuf.data(), rows, kt.data() + (lo - t0), ld, nk, H, sc.data(), ld);
      else
        ops.scores(qbuf.data(), rows, kbase + (lo - t0) * H, nk, H, sc.data(), ld);
    }
    for (int r = 0; r < rows; ++r) {
      float* row = sc.data() + r * ld;
      const int64_t j0 = range[r].lo - lo, j1 = range[r].hi - lo;
      if (j1 <= j0) {  // no visible key: the reference's softmax over all -inf gives NaN
        std::fill(row, row + nk, 0.0f);
        sums[r] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      if (a.softcap > 0.0f)
        for (int64_t j = j0; j < j1; ++j) row[j] = std::tanh(row[j] / a.softcap) * a.softcap;
      float m = row[j0];
      for (int64_t j = j0 + 1; j < j1; ++j) m = row[j] > m ? row[j] : m;
      sums[r] = ops.exp_sum(row + j0, j1 - j0, m);
      std::fill(row, row + j0, 0.0f);
      std::fill(row + j1, row + nk, 0.0f);
    }
    if (nk > 0)
      ops.pv(sc.data(), rows, ld, vbase + (lo - t0) * H, nk, H, sums, orow);
    else
      for (int r = 0; r < rows; ++r) std::fill(orow[r], orow[r] + H, std::numeric_limits<float>::quiet_NaN());
    if constexpr (!std::is_same_v<T, float>)
      for (int r = 0; r < rows; ++r) FromFloat(orow[r], dst[r], H);
  }
}

template <typename T>
void Task(const GqaArgs& a, const Ops& ops, int64_t b, int64_t kh) {
  const int64_t H = a.H, S = a.S, T_ = a.T;
  const int64_t pb = a.past_len[b];
  T* pk = static_cast<T*>(a.present_k) + (b * a.Nkv + kh) * T_ * H;
  T* pv = static_cast<T*>(a.present_v) + (b * a.Nkv + kh) * T_ * H;
  const size_t row_bytes = sizeof(T) * H;
  if (pb > 0) {  // the valid past prefix
    if (a.past_k) {
      const int64_t src = (b * a.Nkv + kh) * a.P * H;
      const T* past_k = static_cast<const T*>(a.past_k) + src;
      const T* past_v = static_cast<const T*>(a.past_v) + src;
      if (past_k != pk) std::memcpy(pk, past_k, row_bytes * pb);
      if (past_v != pv) std::memcpy(pv, past_v, row_bytes * pb);
    } else {
      std::memset(pk, 0, row_bytes * pb);
      std::memset(pv, 0, row_bytes * pb);
    }
  }
  thread_local std::vector<float> krow;
  krow.resize(H);
  for (int64_t s = 0; s < S; ++s) {  // the new rows (K rotated in float32, then stored)
    const T* kin = static_cast<const T*>(a.k) + (b * S + s) * a.k_tok + kh * H;
    T* kout = pk + (pb + s) * H;
    if (a.cos) {
      const int64_t pos = Position(a, b, s);
      ToFloat(kin, krow.data(), H);
      Rotate(krow.data(), krow.data(), a.cos + pos * a.half, a.sin + pos * a.half, a.half, H, a.interleaved);
      FromFloat(krow.data(), kout, H);
    } else {
      std::memcpy(kout, kin, row_bytes);
    }
    std::memcpy(pv + (pb + s) * H, static_cast<const T*>(a.v) + (b * S + s) * a.v_tok + kh * H, row_bytes);
  }
  // rows a previous use of the buffer left nonzero; a present that is the past buffer itself (IOBinding, genai's
  // past_present_share_buffer) keeps its other rows, as ORT's CPU EP leaves them
  const bool shared = a.past_k != nullptr && a.past_k == a.present_k && a.past_v == a.present_v;
  if (!shared && pb + S < a.dirty) {
    std::memset(pk + (pb + S) * H, 0, row_bytes * (a.dirty - pb - S));
    std::memset(pv + (pb + S) * H, 0, row_bytes * (a.dirty - pb - S));
  }
  Attend<T>(a, ops, b, kh, pk, pv);
}

}  // namespace

KvTraffic TrafficOf(const GqaArgs& a) {
  KvTraffic t;
  const int64_t row = 2 * a.Nkv * a.H * (a.fp16 ? 2 : 4);  // one position's K and V rows, every kv head
  t.in_place = a.past_k != nullptr && a.past_k == a.present_k && a.past_v == a.present_v;
  t.appended_bytes = a.B * a.S * row;
  for (int64_t b = 0; a.past_k != nullptr && !t.in_place && b < a.B; ++b) t.copied_bytes += a.past_len[b] * row;
  return t;
}

void GroupQueryAttention(const GqaArgs& a) {
  if (a.N <= 0 || a.Nkv <= 0 || a.N % a.Nkv || a.H <= 0)
    throw std::invalid_argument("GroupQueryAttention: num_heads " + std::to_string(a.N) +
                                " must be a positive multiple of kv_num_heads " + std::to_string(a.Nkv));
  if (a.cos && 2 * a.half > a.H)
    throw std::invalid_argument("GroupQueryAttention: cos/sin cache width " + std::to_string(a.half) +
                                " rotates more than the head size " + std::to_string(a.H));
  for (int64_t b = 0; b < a.B; ++b) {
    const int64_t pb = a.past_len[b];
    if (pb < 0 || pb + a.S > a.T || (a.past_k && pb > a.P))
      throw std::invalid_argument("GroupQueryAttention: batch " + std::to_string(b) + " writes rows [" +
                                  std::to_string(pb) + ", " + std::to_string(pb + a.S) +
                                  ") outside the present buffer of " + std::to_string(a.T));
    for (int64_t s = 0; a.cos && s < a.S; ++s) {
      const int64_t pos = Position(a, b, s);
      if (pos < 0 || pos >= a.max_pos)
        throw std::out_of_range("GroupQueryAttention: rotary position " + std::to_string(pos) + " (batch " +
                                std::to_string(b) + ", token " + std::to_string(s) +
                                ") outside the cos/sin cache [0, " + std::to_string(a.max_pos) + ")");
    }
  }
  const Ops ops = gqa::SelectOps();
  const auto task = a.fp16 ? Task<Half> : Task<float>;
  const int64_t work = a.B * a.N * a.S * (a.P + a.S) * a.H * 2;  // scores and weighted sum, every query head
  ParallelFor(ThreadsFor(a.threads, work), a.B * a.Nkv, [&](int64_t i) { task(a, ops, i / a.Nkv, i % a.Nkv); });
}

}  // namespace npu_ep::kern
