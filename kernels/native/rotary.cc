// com.microsoft RotaryEmbedding (`kernels.rotary_embedding`), for kernels/ops/rotary.py, whose reference it
// reproduces bit for bit: per (batch, token, head) row of H channels, the first R = 2 * half rotate with the cache
// rows of the token's position (half: pairs (j, j + half); interleaved: pairs (2j, 2j + 1)),
//   out0 = x0 * c + x1 * (-s),  out1 = x1 * c + x0 * s
// in float32 (two products, then their sum; no multiply-add contraction), float16 widened exactly and the result
// rounded once; channels R..H pass through. Rows are x's own layout ([B, N, S, H] or [B, S, N * H]); x is read
// where it lies when its channels have unit stride (a column slice of a fused QKV product: a prefill's query and
// key), else from a C-order copy. The result is a new C-order array, or ORT's buffer when given. On AVX-512 a row is
// rotated in registers (AVX2: 8 lanes, the last channels one by one), float16 widened and rounded in the lanes by
// the F16C conversions (no scratch rows); without AVX2 rows go through float32 scratch rows.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "as_array.h"
#include "cpu.h"
#include "half.h"
#include "movement.h"
#include "thread_pool.h"

#if NPU_EP_X86
#include <immintrin.h>
#endif

#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("O3", "fp-contract=off")  // O3: the row loops vectorize; no FMA, so the bits are the reference's
// GCC 12 at O3 takes the AVX-512 conversions' undefined pass-through operands (_mm512_undefined_*) for uninitialized
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr int64_t kTaskElems = 16384;  // channels per parallel task (whole rows)

struct Geometry {
  int64_t batch, seq, heads, head, half;
  bool four_d, interleaved;
};

inline __attribute__((always_inline)) void RotateBody(const float* x, const float* c, const float* s, int64_t half,
                                                      bool interleaved, float* y) {
  if (interleaved) {
    for (int64_t j = 0; j < half; ++j) {
      const float x0 = x[2 * j], x1 = x[2 * j + 1];
      const float a = x0 * c[j], b = x1 * -s[j], d = x1 * c[j], e = x0 * s[j];
      y[2 * j] = a + b;
      y[2 * j + 1] = d + e;
    }
    return;
  }
  for (int64_t j = 0; j < half; ++j) {
    const float a = x[j] * c[j], b = x[j + half] * -s[j];
    y[j] = a + b;
  }
  for (int64_t j = 0; j < half; ++j) {
    const float a = x[j + half] * c[j], b = x[j] * s[j];
    y[j + half] = a + b;
  }
}

using RowFn = void (*)(const float*, const float*, const float*, int64_t, bool, float*);

void RotateRowScalar(const float* x, const float* c, const float* s, int64_t half, bool interleaved, float* y) {
  RotateBody(x, c, s, half, interleaved, y);
}

#if NPU_EP_X86
__attribute__((target("avx2"))) void RotateRowAvx2(const float* x, const float* c, const float* s, int64_t half,
                                                   bool interleaved, float* y) {
  RotateBody(x, c, s, half, interleaved, y);
}

__attribute__((target("avx512f,avx512vl"))) void RotateRowAvx512(const float* x, const float* c, const float* s,
                                                                 int64_t half, bool interleaved, float* y) {
  RotateBody(x, c, s, half, interleaved, y);
}
#endif

// The row compiled for the widest instruction set this host runs (the same operations: no fma on any).
RowFn RowFor() {
#if NPU_EP_X86
  const Isa isa = ActiveIsa();
  if (isa >= Isa::kAvx512) return RotateRowAvx512;
  if (isa >= Isa::kAvx2) return RotateRowAvx2;
#endif
  return RotateRowScalar;
}

// float16 cache rows widened once per token ([B * S, half] each), before the rows that share them
template <typename T>
void WidenTokenRows(const T* cache, const int64_t* pos, bool offset, int64_t cache_width, const Geometry& g,
                    std::vector<float>& out) {
  out.resize(static_cast<size_t>(g.batch * g.seq * g.half));
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t s = 0; s < g.seq; ++s) {
      const int64_t p = offset ? pos[0] + s : pos[b * g.seq + s];
      HalfToFloatRow(reinterpret_cast<const uint16_t*>(cache + p * cache_width), out.data() + (b * g.seq + s) * g.half,
                     g.half);
    }
}

// Byte strides of x's row axes: 3-D (b, s, head) with head = the head size, 4-D (b, n, s); x[.., c] at unit stride.
struct RowStrides {
  int64_t batch, first, second;
};

// The start of row r = (b, s, n) (3-D) or (b, n, s) (4-D) of x, and its token b * S + s.
inline const char* RowOf(const char* x, const RowStrides& st, const Geometry& g, int64_t r, int64_t* token) {
  if (g.four_d) {
    const int64_t b = r / (g.heads * g.seq), n = (r / g.seq) % g.heads, s = r % g.seq;
    *token = b * g.seq + s;
    return x + b * st.batch + n * st.first + s * st.second;
  }
  const int64_t b = r / (g.heads * g.seq), s = (r / g.heads) % g.seq, n = r % g.heads;
  *token = b * g.seq + s;
  return x + b * st.batch + s * st.first + n * st.second;
}

// ---- AVX-512: a row in registers (float16 widened and rounded in the lanes, no scratch rows) ----

#if NPU_EP_X86
#define NPU_ROTARY_512 __attribute__((target("avx512f,avx512bw,avx512vl,f16c")))

NPU_ROTARY_512 inline __m512 Load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
NPU_ROTARY_512 inline __m512 Load16(const uint16_t* p, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
NPU_ROTARY_512 inline void Store16(float* p, __mmask16 m, __m512 v) { _mm512_mask_storeu_ps(p, m, v); }
NPU_ROTARY_512 inline void Store16(uint16_t* p, __mmask16 m, __m512 v) {
  _mm256_mask_storeu_epi16(p, m, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
// 8 cache values, each twice: (c0, c0, c1, c1, ..., c7, c7) for interleaved pairs
NPU_ROTARY_512 inline __m512 LoadPairs(const float* p, __mmask8 m, __m512i dup) {
  return _mm512_permutexvar_ps(dup, _mm512_zextps256_ps512(_mm256_maskz_loadu_ps(m, p)));
}
NPU_ROTARY_512 inline __m512 LoadPairs(const uint16_t* p, __mmask8 m, __m512i dup) {
  return _mm512_permutexvar_ps(dup, _mm512_zextps256_ps512(_mm256_cvtph_ps(_mm_maskz_loadu_epi16(m, p))));
}
NPU_ROTARY_512 inline __mmask16 Lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1);
}
NPU_ROTARY_512 inline __m512 Negate(__m512 v, __m512i sign) {
  return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), sign));
}

// One row: the reference's x0 c + x1 (-s), x1 c + x0 s (each product rounded, then the sum), channels rot..h
// through float32 as the scratch-row path takes them.
template <typename T>
NPU_ROTARY_512 void RotateRow512(const T* x, const T* c, const T* s, int64_t half, int64_t h, bool interleaved, T* y) {
  const int64_t rot = 2 * half;
  if (interleaved) {
    const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i even_sign = _mm512_set_epi32(0, INT32_MIN, 0, INT32_MIN, 0, INT32_MIN, 0, INT32_MIN, 0, INT32_MIN, 0,
                                               INT32_MIN, 0, INT32_MIN, 0, INT32_MIN);
    for (int64_t j = 0; j < rot; j += 16) {
      const __mmask16 m = Lanes(rot - j);
      const __mmask8 mp = static_cast<__mmask8>(Lanes((rot - j) / 2));
      const __m512 xv = Load16(x + j, m), cw = LoadPairs(c + j / 2, mp, dup);
      const __m512 sw = Negate(LoadPairs(s + j / 2, mp, dup), even_sign);  // (-s0, s0, -s1, s1, ...)
      const __m512 xs = _mm512_permute_ps(xv, 0xb1);  // (x1, x0) of each pair
      Store16(y + j, m, _mm512_add_ps(_mm512_mul_ps(xv, cw), _mm512_mul_ps(xs, sw)));
    }
  } else {
    const __m512i sign = _mm512_set1_epi32(INT32_MIN);
    for (int64_t j = 0; j < half; j += 16) {
      const __mmask16 m = Lanes(half - j);
      const __m512 x0 = Load16(x + j, m), x1 = Load16(x + half + j, m);
      const __m512 cv = Load16(c + j, m), sv = Load16(s + j, m);
      Store16(y + j, m, _mm512_add_ps(_mm512_mul_ps(x0, cv), _mm512_mul_ps(x1, Negate(sv, sign))));
      Store16(y + half + j, m, _mm512_add_ps(_mm512_mul_ps(x1, cv), _mm512_mul_ps(x0, sv)));
    }
  }
  if constexpr (sizeof(T) == 4) {
    if (rot < h) std::memcpy(y + rot, x + rot, sizeof(float) * (h - rot));
  } else {
    for (int64_t j = rot; j < h; j += 16) {
      const __mmask16 m = Lanes(h - j);
      Store16(y + j, m, Load16(x + j, m));
    }
  }
}

// A task's rows [first, end) walked by counters (no division per row): 4-D rows (b, n, s), 3-D rows (b, s, n).
template <typename T>
NPU_ROTARY_512 void RotateRows512(const char* base, const RowStrides& st, const int64_t* pos, bool offset, const T* cos,
                                  const T* sin, int64_t cache_width, const Geometry& g, T* y, int64_t first,
                                  int64_t end) {
  const int64_t inner = g.four_d ? g.seq : g.heads, mid = g.four_d ? g.heads : g.seq;
  int64_t i2 = first % inner, i1 = (first / inner) % mid, b = first / (inner * mid);
  for (int64_t r = first; r < end; ++r) {
    const T* xr = reinterpret_cast<const T*>(base + b * st.batch + i1 * st.first + i2 * st.second);
    const int64_t s = g.four_d ? i2 : i1;
    const int64_t p = offset ? pos[0] + s : pos[b * g.seq + s];
    RotateRow512(xr, cos + p * cache_width, sin + p * cache_width, g.half, g.head, g.interleaved, y + r * g.head);
    if (++i2 == inner) {
      i2 = 0;
      if (++i1 == mid) i1 = 0, ++b;
    }
  }
}

// ---- AVX2: the same row in 8-lane registers, a chunk of fewer lanes one channel (pair) at a time ----

#define NPU_ROTARY_256 __attribute__((target("avx2,f16c")))

NPU_ROTARY_256 inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
NPU_ROTARY_256 inline __m256 Load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
NPU_ROTARY_256 inline void Store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
NPU_ROTARY_256 inline void Store8(uint16_t* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
// 4 cache values, each twice: (c0, c0, c1, c1, c2, c2, c3, c3)
NPU_ROTARY_256 inline __m256 LoadPairs8(const float* p, __m256i dup) {
  return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(p)), dup);
}
NPU_ROTARY_256 inline __m256 LoadPairs8(const uint16_t* p, __m256i dup) {
  return _mm256_permutevar8x32_ps(
      _mm256_castps128_ps256(_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))), dup);
}
NPU_ROTARY_256 inline float Wide(float v) { return v; }
NPU_ROTARY_256 inline float Wide(uint16_t v) { return _cvtsh_ss(v); }
NPU_ROTARY_256 inline void Put(float* p, float v) { *p = v; }
NPU_ROTARY_256 inline void Put(uint16_t* p, float v) {
  *p = _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

template <typename T>
NPU_ROTARY_256 void RotateRow256(const T* x, const T* c, const T* s, int64_t half, int64_t h, bool interleaved, T* y) {
  const int64_t rot = 2 * half;
  if (interleaved) {
    const __m256i dup = _mm256_set_epi32(3, 3, 2, 2, 1, 1, 0, 0);
    const __m256 even_sign =
        _mm256_castsi256_ps(_mm256_set_epi32(0, INT32_MIN, 0, INT32_MIN, 0, INT32_MIN, 0, INT32_MIN));
    int64_t j = 0;
    for (; j + 8 <= rot; j += 8) {
      const __m256 xv = Load8(x + j), cw = LoadPairs8(c + j / 2, dup);
      const __m256 sw = _mm256_xor_ps(LoadPairs8(s + j / 2, dup), even_sign);
      const __m256 xs = _mm256_permute_ps(xv, 0xb1);
      Store8(y + j, _mm256_add_ps(_mm256_mul_ps(xv, cw), _mm256_mul_ps(xs, sw)));
    }
    for (; j < rot; j += 2) {
      const float x0 = Wide(x[j]), x1 = Wide(x[j + 1]), cv = Wide(c[j / 2]), sv = Wide(s[j / 2]);
      const float a = x0 * cv, b = x1 * -sv, d = x1 * cv, e = x0 * sv;
      Put(y + j, a + b);
      Put(y + j + 1, d + e);
    }
  } else {
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN));
    int64_t j = 0;
    for (; j + 8 <= half; j += 8) {
      const __m256 x0 = Load8(x + j), x1 = Load8(x + half + j), cv = Load8(c + j), sv = Load8(s + j);
      Store8(y + j, _mm256_add_ps(_mm256_mul_ps(x0, cv), _mm256_mul_ps(x1, _mm256_xor_ps(sv, sign))));
      Store8(y + half + j, _mm256_add_ps(_mm256_mul_ps(x1, cv), _mm256_mul_ps(x0, sv)));
    }
    for (; j < half; ++j) {
      const float x0 = Wide(x[j]), x1 = Wide(x[j + half]), cv = Wide(c[j]), sv = Wide(s[j]);
      const float a = x0 * cv, b = x1 * -sv, d = x1 * cv, e = x0 * sv;
      Put(y + j, a + b);
      Put(y + half + j, d + e);
    }
  }
  if constexpr (sizeof(T) == 4) {
    if (rot < h) std::memcpy(y + rot, x + rot, sizeof(float) * (h - rot));
  } else {
    int64_t j = rot;
    for (; j + 8 <= h; j += 8) Store8(y + j, Load8(x + j));
    for (; j < h; ++j) Put(y + j, Wide(x[j]));
  }
}

template <typename T>
NPU_ROTARY_256 void RotateRows256(const char* base, const RowStrides& st, const int64_t* pos, bool offset, const T* cos,
                                  const T* sin, int64_t cache_width, const Geometry& g, T* y, int64_t first,
                                  int64_t end) {
  const int64_t inner = g.four_d ? g.seq : g.heads, mid = g.four_d ? g.heads : g.seq;
  int64_t i2 = first % inner, i1 = (first / inner) % mid, b = first / (inner * mid);
  for (int64_t r = first; r < end; ++r) {
    const T* xr = reinterpret_cast<const T*>(base + b * st.batch + i1 * st.first + i2 * st.second);
    const int64_t s = g.four_d ? i2 : i1;
    const int64_t p = offset ? pos[0] + s : pos[b * g.seq + s];
    RotateRow256(xr, cos + p * cache_width, sin + p * cache_width, g.half, g.head, g.interleaved, y + r * g.head);
    if (++i2 == inner) {
      i2 = 0;
      if (++i1 == mid) i1 = 0, ++b;
    }
  }
}
#endif

// A task's rows: float16 x widened and the result narrowed once per task (whole rows, so a row's passed-through
// channels round-trip exactly), float32 read where it lies and its cache rows read where they are.
template <typename T>
void Rotate(const T* x, const RowStrides& st, const int64_t* pos, bool offset, const T* cos, const T* sin,
            int64_t cache_width, const Geometry& g, T* y, int threads) {
  constexpr bool kHalf = sizeof(T) == 2;
  const int64_t rows = g.batch * g.seq * g.heads, h = g.head, rot = 2 * g.half;
  const int64_t per_task = std::max<int64_t>(1, kTaskElems / std::max<int64_t>(1, h));
  const char* base = reinterpret_cast<const char*>(x);
  const int n_threads = ThreadsFor(threads, rows * h);
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) {
    ParallelFor(n_threads, (rows + per_task - 1) / per_task, [&](int64_t t) {
      RotateRows512(base, st, pos, offset, cos, sin, cache_width, g, y, t * per_task,
                    std::min(rows, (t + 1) * per_task));
    });
    return;
  }
  if (ActiveIsa() >= Isa::kAvx2 && HasF16c()) {
    ParallelFor(n_threads, (rows + per_task - 1) / per_task, [&](int64_t t) {
      RotateRows256(base, st, pos, offset, cos, sin, cache_width, g, y, t * per_task,
                    std::min(rows, (t + 1) * per_task));
    });
    return;
  }
#endif
  const RowFn rotate_row = RowFor();
  std::vector<float> cos_rows, sin_rows;
  if constexpr (kHalf) {
    WidenTokenRows(cos, pos, offset, cache_width, g, cos_rows);
    WidenTokenRows(sin, pos, offset, cache_width, g, sin_rows);
  }
  ParallelFor(n_threads, (rows + per_task - 1) / per_task, [&](int64_t t) {
    const int64_t first = t * per_task, end = std::min(rows, first + per_task), count = end - first;
    std::vector<float> xb(kHalf ? static_cast<size_t>(count * h) : 0), yb(xb.size());
    for (int64_t r = first; r < end; ++r) {
      int64_t token = 0;
      const T* xr = reinterpret_cast<const T*>(RowOf(base, st, g, r, &token));
      const int64_t p = offset ? pos[0] + token % g.seq : pos[token];
      const float* xf = reinterpret_cast<const float*>(xr);
      if constexpr (kHalf) {
        float* row = xb.data() + (r - first) * h;
        HalfToFloatRow(reinterpret_cast<const uint16_t*>(xr), row, h);
        xf = row;
      }
      float* yf = kHalf ? yb.data() + (r - first) * h : reinterpret_cast<float*>(y + r * h);
      const float* cf =
          kHalf ? cos_rows.data() + token * g.half : reinterpret_cast<const float*>(cos + p * cache_width);
      const float* sf =
          kHalf ? sin_rows.data() + token * g.half : reinterpret_cast<const float*>(sin + p * cache_width);
      rotate_row(xf, cf, sf, g.half, g.interleaved, yf);
      if (rot < h) std::memcpy(yf + rot, xf + rot, sizeof(float) * (h - rot));
    }
    if constexpr (kHalf) FloatToHalfRow(yb.data(), reinterpret_cast<uint16_t*>(y + first * h), count * h);
  });
}

// x's row strides when its channels (and a 3-D token's heads) lie at unit stride, so rows are read in place.
bool InPlaceRows(const py::array& x, const Geometry& g, RowStrides* st) {
  const py::ssize_t item = x.itemsize(), last = x.ndim() - 1;
  if (x.shape(last) > 1 && x.strides(last) != item) return false;
  if (g.four_d) {
    *st = {x.strides(0), x.strides(1), x.strides(2)};
  } else {
    *st = {x.strides(0), x.strides(1), g.head * item};
  }
  return true;
}

void CheckPositions(const int64_t* pos, int64_t n, bool offset, int64_t seq, int64_t max_pos) {
  int64_t lo = 0, hi = 0;
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, pos[i]);
    hi = std::max(hi, offset ? pos[i] + seq - 1 : pos[i]);
  }
  if (lo < 0 || hi >= max_pos)
    throw py::index_error("RotaryEmbedding: position ids outside the cos/sin cache [0, " + std::to_string(max_pos) +
                          ")");
}

py::array RotaryEmbeddingPy(const py::array& x, const py::object& position_ids_in, const py::array& cos,
                            const py::array& sin, int64_t heads, int64_t head, int64_t half, bool interleaved,
                            int threads, const py::object& out) {
  const char* fn = "rotary_embedding";
  const py::array_t<int64_t, py::array::c_style> position_ids =
      AsArray<int64_t>(position_ids_in, "rotary_embedding", "position_ids");
  const bool f32 = x.dtype().equal(py::dtype::of<float>());
  const bool f16 = x.dtype().kind() == 'f' && x.itemsize() == 2;
  const bool c_order = (cos.flags() & py::array::c_style) && (sin.flags() & py::array::c_style);
  if (!(f32 || f16) || !c_order || !cos.dtype().equal(x.dtype()) || !sin.dtype().equal(x.dtype()) ||
      (x.ndim() != 3 && x.ndim() != 4) || cos.ndim() != 2 || sin.ndim() != 2 || cos.shape(1) != sin.shape(1) ||
      cos.shape(0) != sin.shape(0) || half > cos.shape(1) || 2 * half > head)
    throw std::invalid_argument(std::string(fn) +
                                ": x must be a float32 or float16 [B, N, S, H] or [B, S, N * H] array and cos, "
                                "sin C-order [max_pos, >= half] caches of its dtype");
  const bool four_d = x.ndim() == 4;
  const Geometry g{x.shape(0), four_d ? x.shape(2) : x.shape(1), heads, head, half, four_d, interleaved};
  if (g.batch * g.seq * heads * head != x.size() || (four_d && (x.shape(1) != heads || x.shape(3) != head)))
    throw std::invalid_argument(std::string(fn) + ": x does not hold heads x head_size channels per token");
  const bool offset = position_ids.size() == 1;
  if (!offset && position_ids.size() != g.batch * g.seq)
    throw std::invalid_argument(std::string(fn) + ": position_ids must hold one offset or B * S ids");
  CheckPositions(position_ids.data(), position_ids.size(), offset, g.seq, cos.shape(0));
  py::array y = MovementResult(fn, x.dtype(), DimsOf(x), out);
  if (x.size() == 0) return y;
  RowStrides st{};
  py::array xs = x;
  if (!InPlaceRows(xs, g, &st)) {
    xs = py::array::ensure(x, py::array::c_style);
    InPlaceRows(xs, g, &st);
  }
  RunMoving(2 * static_cast<size_t>(x.nbytes()), [&] {
    if (f32)
      Rotate(static_cast<const float*>(xs.data()), st, position_ids.data(), offset,
             static_cast<const float*>(cos.data()), static_cast<const float*>(sin.data()), cos.shape(1), g,
             static_cast<float*>(y.mutable_data()), threads);
    else
      Rotate(static_cast<const uint16_t*>(xs.data()), st, position_ids.data(), offset,
             static_cast<const uint16_t*>(cos.data()), static_cast<const uint16_t*>(sin.data()), cos.shape(1), g,
             static_cast<uint16_t*>(y.mutable_data()), threads);
  });
  return y;
}

}  // namespace

void BindRotary(py::module_& m) {
  m.def("rotary_embedding", &RotaryEmbeddingPy, py::arg("x"), py::arg("position_ids"), py::arg("cos"), py::arg("sin"),
        py::arg("heads"), py::arg("head"), py::arg("half"), py::arg("interleaved"), py::arg("threads") = 1,
        py::arg("out") = py::none(),
        "com.microsoft RotaryEmbedding of float32/float16 x [B, N, S, H] or [B, S, N * H]: each head's first 2 * half "
        "channels rotated by the cache rows of its token's position (B * S ids, or one offset p0 meaning p0 + s), in "
        "float32 (kernels/ops/rotary.py); into out (ORT's buffer: writeable, C-order, x's dtype and size) when given");
}

}  // namespace npu_ep::kern
