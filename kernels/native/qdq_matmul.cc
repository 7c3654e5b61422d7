// npu::QdqMatMul of small products (`kernels.qdq_matmul_small`), for kernels/ops/qdq_matmul.py, whose reference it
// reproduces bit for bit: acc = (x - x_zp) @ W in float64 (exact: the check bounds every partial sum below 2^53,
// so the summation order does not matter), y = float32(acc * mult[n]), then QuantizeLinear in float32
// (nearest-even of y / y_scale, plus y_zp, fmax/fmin to the output range: NaN to its lowest value). One row of W
// per step of K, accumulated across N, so the inner loop vectorizes; it now serves weights whose |W - w_zp| is not
// int16, in small products (larger ones stay on the reference's float64 BLAS). Every other product runs
// `kernels.qdq_matmul_int` (below): the same values from an exact integer GEMM.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "as_array.h"
#include "broadcast.h"
#include "kernels/native/cpu.h"
#include "kernels/native/intrinsics.h"
#include "kernels/native/thread_pool.h"

#if !defined(__clang__)
#pragma GCC optimize("O3")  // the accumulation loop vectorizes (float64, exact integers: any order is the same)
#endif

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

using F64 = py::array_t<double, py::array::c_style>;

template <typename X, typename Y>
void Rows(const X* x, int64_t m, int64_t k, int64_t n, const double* w, double xzp, const double* mult, bool per_column,
          float ys, float yzp, float lo, float hi, Y* y) {
  std::vector<double> acc(static_cast<size_t>(n));
  for (int64_t r = 0; r < m; ++r) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t i = 0; i < k; ++i) {
      const double a = static_cast<double>(x[r * k + i]) - xzp;
      const double* wr = w + i * n;
      for (int64_t j = 0; j < n; ++j) acc[j] += a * wr[j];
    }
    for (int64_t j = 0; j < n; ++j) {
      const auto v = static_cast<float>(acc[j] * mult[per_column ? j : 0]);
      const float q = std::fmin(std::fmax(std::nearbyint(v / ys) + yzp, lo), hi);
      y[r * n + j] = static_cast<Y>(q);
    }
  }
}

template <typename X>
bool RunFor(const py::array& x, int64_t m, int64_t k, int64_t n, const F64& w, double xzp, const F64& mult, float ys,
            float yzp, float lo, float hi, py::array& y) {
  if (!x.dtype().equal(py::dtype::of<X>())) return false;
  const auto* px = static_cast<const X*>(x.data());
  const bool per_column = mult.size() > 1;
  const auto& dt = y.dtype();
  if (dt.equal(py::dtype::of<int8_t>()))
    Rows(px, m, k, n, w.data(), xzp, mult.data(), per_column, ys, yzp, lo, hi, static_cast<int8_t*>(y.mutable_data()));
  else if (dt.equal(py::dtype::of<uint8_t>()))
    Rows(px, m, k, n, w.data(), xzp, mult.data(), per_column, ys, yzp, lo, hi, static_cast<uint8_t*>(y.mutable_data()));
  else if (dt.equal(py::dtype::of<int16_t>()))
    Rows(px, m, k, n, w.data(), xzp, mult.data(), per_column, ys, yzp, lo, hi, static_cast<int16_t*>(y.mutable_data()));
  else
    Rows(px, m, k, n, w.data(), xzp, mult.data(), per_column, ys, yzp, lo, hi,
         static_cast<uint16_t*>(y.mutable_data()));
  return true;
}

py::array QdqMatMulSmallPy(const py::array& x, const F64& w, double xzp, const F64& mult, float ys, float yzp, float lo,
                           float hi, const py::dtype& out_dtype) {
  const char* fn = "qdq_matmul_small";
  const bool out_ok = out_dtype.equal(py::dtype::of<int8_t>()) || out_dtype.equal(py::dtype::of<uint8_t>()) ||
                      out_dtype.equal(py::dtype::of<int16_t>()) || out_dtype.equal(py::dtype::of<uint16_t>());
  if (!(x.flags() & py::array::c_style) || x.ndim() < 1 || w.ndim() != 2 || x.shape(x.ndim() - 1) != w.shape(0) ||
      !out_ok || (mult.size() != 1 && mult.size() != w.shape(1)))
    throw std::invalid_argument(std::string(fn) +
                                ": x [..., K] C-order, W [K, N] float64, mult of 1 or N, an 8- or "
                                "16-bit output; got x" +
                                ShapeText(x) + ", W" + ShapeText(w));
  const int64_t k = w.shape(0), n = w.shape(1), m = k ? x.size() / k : 0;
  std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim());
  shape.back() = n;
  py::array y(out_dtype, shape);
  const bool done = RunFor<int8_t>(x, m, k, n, w, xzp, mult, ys, yzp, lo, hi, y) ||
                    RunFor<uint8_t>(x, m, k, n, w, xzp, mult, ys, yzp, lo, hi, y) ||
                    RunFor<int16_t>(x, m, k, n, w, xzp, mult, ys, yzp, lo, hi, y) ||
                    RunFor<uint16_t>(x, m, k, n, w, xzp, mult, ys, yzp, lo, hi, y);
  if (!done) throw std::invalid_argument(std::string(fn) + ": x must be int8, uint8, int16 or uint16");
  return y;
}

}  // namespace

// npu::QdqMatMul of any size (`kernels.qdq_matmul_int`): the same values as Rows above, from an exact integer
// product. W' = W - w_zp is packed once at prepare as int16 column panels [ceil(N / 16), ceil(K / 2), 16, 2]
// (zeros past K and N) with its column sums; each row of x is made int16 as xs = x (8-bit, int16) or x ^ 0x8000
// (uint16, i.e. x - 32768), so acc = xs @ W' + (offset - x_zp) * colsum(W') with offset 0 or 32768, exactly. The
// inner product runs two k at a time (vpdpwssd on VNNI hosts, madd_epi16 + add on AVX-512 / AVX2, a scalar loop
// elsewhere) into int32 lanes that are flushed to int64 every `chunk_pairs` pairs: the caller picks chunk_pairs so
// that 2 * chunk_pairs * 32768 * max|W'| < 2^31 (no int32 partial sum can wrap), the int64 sum is exact.
namespace {

constexpr int kRowTile = 4;      // rows of x per register tile
constexpr int kPanelTile = 2;    // 16-column panels per register tile
constexpr int64_t kTaskRows = 32;
constexpr int64_t kTaskPanels = 8;

struct IntGemm {
  int64_t m = 0, k = 0, n = 0, kp2 = 0, panels = 0, chunk_pairs = 0;
  const int16_t* wp = nullptr;   // [panels, kp2, 16, 2]
  const int64_t* colsum = nullptr;
  int64_t corr_scale = 0;        // offset - x_zp
  const double* mult = nullptr;
  bool per_column = false;
  float ys = 1, yzp = 0, lo = 0, hi = 0;
  bool avx512 = false;  // requantize with RequantizeAvx512
};

// acc[r][p * 16 + c] += sum over pairs [q0, q1) of xs[r] pair q times panel (p0 + p)'s pair q, column c.
template <int R, int P>
void TileScalar(const IntGemm& g, const int16_t* xs, int64_t p0, int64_t q0, int64_t q1, int32_t* acc) {
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) {
      const int16_t* w = g.wp + ((p0 + p) * g.kp2 + q0) * 32;
      const int16_t* a = xs + r * g.kp2 * 2 + q0 * 2;
      int32_t* out = acc + r * 32 + p * 16;
      for (int64_t q = q0; q < q1; ++q, w += 32, a += 2)
        for (int c = 0; c < 16; ++c) out[c] += int32_t{a[0]} * w[2 * c] + int32_t{a[1]} * w[2 * c + 1];
    }
}

#if NPU_EP_X86
template <int R, int P>
__attribute__((target("avx2,fma"))) void TileAvx2(const IntGemm& g, const int16_t* xs, int64_t p0, int64_t q0,
                                                  int64_t q1, int32_t* acc) {
  for (int p = 0; p < P; ++p) {
    __m256i lo[R], hi[R];
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_si256();
    const int16_t* w = g.wp + ((p0 + p) * g.kp2 + q0) * 32;
    for (int64_t q = q0; q < q1; ++q, w += 32) {
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16));
      for (int r = 0; r < R; ++r) {
        int32_t pair;
        std::memcpy(&pair, xs + r * g.kp2 * 2 + q * 2, 4);
        const __m256i a = _mm256_set1_epi32(pair);
        lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(a, w0));
        hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(a, w1));
      }
    }
    for (int r = 0; r < R; ++r) {
      auto* out = reinterpret_cast<__m256i*>(acc + r * 32 + p * 16);
      _mm256_storeu_si256(out, _mm256_add_epi32(_mm256_loadu_si256(out), lo[r]));
      _mm256_storeu_si256(out + 1, _mm256_add_epi32(_mm256_loadu_si256(out + 1), hi[r]));
    }
  }
}

#define NPU_QDQ_AVX512 "avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"

// acc + vpdpwssd(a, w) in asm (the function itself is compiled without VNNI, so GCC cannot turn the madd + add of
// the non-VNNI variant into it either); the accumulator stays in its register as in intrinsics.h's DpbusdTied.
__attribute__((target(NPU_QDQ_AVX512), always_inline)) inline __m512i DpwssdTied(__m512i acc, __m512i a, __m512i w) {
  asm("vpdpwssd %[w], %[a], %[acc]" : [acc] "+v"(acc) : [a] "v"(a), [w] "v"(w));
  return acc;
}

template <int R, int P, bool kVnni>
__attribute__((target(NPU_QDQ_AVX512))) void TileAvx512(const IntGemm& g, const int16_t* xs, int64_t p0, int64_t q0,
                                                        int64_t q1, int32_t* acc) {
  __m512i sum[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) sum[r][p] = _mm512_setzero_si512();
  const int16_t* w = g.wp + (p0 * g.kp2 + q0) * 32;
  const int64_t panel = g.kp2 * 32;
  for (int64_t q = q0; q < q1; ++q, w += 32) {
    __m512i wv[P];
    for (int p = 0; p < P; ++p) wv[p] = _mm512_loadu_si512(w + p * panel);
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, xs + r * g.kp2 * 2 + q * 2, 4);
      const __m512i a = _mm512_set1_epi32(pair);
      for (int p = 0; p < P; ++p) {
        if constexpr (kVnni)
          sum[r][p] = DpwssdTied(sum[r][p], a, wv[p]);
        else
          sum[r][p] = _mm512_add_epi32(sum[r][p], _mm512_madd_epi16(a, wv[p]));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) {
      int32_t* out = acc + r * 32 + p * 16;
      _mm512_storeu_si512(out, _mm512_add_epi32(_mm512_loadu_si512(out), sum[r][p]));
    }
}
#endif

using TileFn = void (*)(const IntGemm&, const int16_t*, int64_t, int64_t, int64_t, int32_t*);

template <int R, int P>
TileFn PickTile(Isa isa) {
#if NPU_EP_X86
  if (isa >= Isa::kAvx512Vnni) return &TileAvx512<R, P, true>;
  if (isa == Isa::kAvx512) return &TileAvx512<R, P, false>;
  if (isa == Isa::kAvx2) return &TileAvx2<R, P>;
#endif
  (void)isa;
  return &TileScalar<R, P>;
}

struct TileTable {
  TileFn fn[kRowTile][kPanelTile];
  explicit TileTable(Isa isa)
      : fn{{PickTile<1, 1>(isa), PickTile<1, 2>(isa)},
           {PickTile<2, 1>(isa), PickTile<2, 2>(isa)},
           {PickTile<3, 1>(isa), PickTile<3, 2>(isa)},
           {PickTile<4, 1>(isa), PickTile<4, 2>(isa)}} {}
};

// xs rows [r0, r0 + rows) of x as int16 (x ^ 0x8000 for uint16), zero past K.
template <typename X>
void WidenRows(const X* x, const IntGemm& g, int64_t r0, int64_t rows, int16_t* xs) {
  const int64_t kp = g.kp2 * 2;
  for (int64_t r = 0; r < rows; ++r) {
    const X* src = x + (r0 + r) * g.k;
    int16_t* dst = xs + r * kp;
    for (int64_t i = 0; i < g.k; ++i) {
      if constexpr (std::is_same_v<X, uint16_t>)
        dst[i] = static_cast<int16_t>(src[i] ^ 0x8000u);
      else
        dst[i] = static_cast<int16_t>(src[i]);
    }
    for (int64_t i = g.k; i < kp; ++i) dst[i] = 0;
  }
}

// The reference's float steps on the exact integer sums of one register tile: y = float32(acc * mult), then
// QuantizeLinear as Rows does, with the rounding as RoundHalfEven (no libm call: std::nearbyint was most of a
// medium product's time) after clamping y / y_scale to +-2^22, where it is exact; past that every output saturates
// anyway, and NaN goes to the lowest value as fmax does in Rows.
template <typename Y>
void Requantize(const IntGemm& g, const int64_t* acc, int64_t r0, int rows, int64_t c0, int64_t cols, Y* y) {
  constexpr float kRoundable = 4194304.0f;  // 2^22
  for (int r = 0; r < rows; ++r) {
    Y* out = y + (r0 + r) * g.n + c0;
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t exact = acc[r * 32 + j] + g.corr_scale * g.colsum[c0 + j];
      const auto v = static_cast<float>(static_cast<double>(exact) * g.mult[g.per_column ? c0 + j : 0]);
      const float t = std::fmin(std::fmax(v / g.ys, -kRoundable), kRoundable);
      out[j] = static_cast<Y>(std::fmin(std::fmax(RoundHalfEven(t) + g.yzp, g.lo), g.hi));
    }
  }
}

#if NPU_EP_X86
// Requantize on 16 columns a step: the same operations lane by lane (int64 -> double and double -> float round as
// the casts do, the clamps keep fmax's NaN rule: _mm512_max_ps returns its second operand for a NaN), stored
// through vpmovdb/vpmovdw, exact because every value is already an integer in Y's range.
template <typename Y>
__attribute__((target(NPU_QDQ_AVX512))) void RequantizeAvx512(const IntGemm& g, const int64_t* acc, int64_t r0,
                                                              int rows, int64_t c0, int64_t cols, Y* y) {
  const __m512 ys = _mm512_set1_ps(g.ys), yzp = _mm512_set1_ps(g.yzp), lo = _mm512_set1_ps(g.lo);
  const __m512 hi = _mm512_set1_ps(g.hi), bound = _mm512_set1_ps(4194304.0f), magic = _mm512_set1_ps(12582912.0f);
  const __m512 neg_bound = _mm512_set1_ps(-4194304.0f);
  const __m512i corr = _mm512_set1_epi64(g.corr_scale);
  for (int r = 0; r < rows; ++r) {
    Y* out = y + (r0 + r) * g.n + c0;
    for (int64_t j = 0; j < cols; j += 16) {
      const auto m16 = static_cast<__mmask16>((1u << std::min<int64_t>(16, cols - j)) - 1);
      __m256 half[2];
      for (int h = 0; h < 2; ++h) {
        const auto mk = static_cast<__mmask8>(h ? m16 >> 8 : m16 & 0xFF);
        const int64_t o = j + 8 * h;
        __m512i a = _mm512_maskz_loadu_epi64(mk, acc + r * 32 + o);
        a = _mm512_add_epi64(a, _mm512_mullo_epi64(corr, _mm512_maskz_loadu_epi64(mk, g.colsum + c0 + o)));
        const __m512d mult = g.per_column ? _mm512_maskz_loadu_pd(mk, g.mult + c0 + o) : _mm512_set1_pd(g.mult[0]);
        half[h] = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtepi64_pd(a), mult));
      }
      const __m512 v = _mm512_insertf32x8(_mm512_castps256_ps512(half[0]), half[1], 1);
      const __m512 t = _mm512_min_ps(_mm512_max_ps(_mm512_div_ps(v, ys), neg_bound), bound);
      const __m512 q = _mm512_add_ps(_mm512_sub_ps(_mm512_add_ps(t, magic), magic), yzp);
      const __m512i iv = _mm512_cvttps_epi32(_mm512_min_ps(_mm512_max_ps(q, lo), hi));
      if constexpr (sizeof(Y) == 1)
        _mm512_mask_cvtepi32_storeu_epi8(out + j, m16, iv);
      else
        _mm512_mask_cvtepi32_storeu_epi16(out + j, m16, iv);
    }
  }
}
#endif

template <typename X, typename Y>
void IntTask(const IntGemm& g, const TileTable& tiles, const X* x, Y* y, int64_t r0, int64_t r1, int64_t pa,
             int64_t pb) {
  std::vector<int16_t> xs(static_cast<size_t>((r1 - r0) * g.kp2 * 2));
  WidenRows(x, g, r0, r1 - r0, xs.data());
  int32_t acc32[kRowTile * 32];
  int64_t acc64[kRowTile * 32];
  for (int64_t r = r0; r < r1; r += kRowTile) {
    const int rows = static_cast<int>(std::min<int64_t>(kRowTile, r1 - r));
    const int16_t* xr = xs.data() + (r - r0) * g.kp2 * 2;
    for (int64_t p = pa; p < pb; p += kPanelTile) {
      const int ps = static_cast<int>(std::min<int64_t>(kPanelTile, pb - p));
      const TileFn fn = tiles.fn[rows - 1][ps - 1];
      std::fill(acc64, acc64 + kRowTile * 32, int64_t{0});
      for (int64_t q = 0; q < g.kp2; q += g.chunk_pairs) {
        std::fill(acc32, acc32 + kRowTile * 32, 0);
        fn(g, xr, p, q, std::min(g.kp2, q + g.chunk_pairs), acc32);
        for (int i = 0; i < kRowTile * 32; ++i) acc64[i] += acc32[i];
      }
      const int64_t c0 = p * 16, cols = std::min<int64_t>(ps * 16, g.n - c0);
#if NPU_EP_X86
      if (g.avx512) {
        RequantizeAvx512(g, acc64, r, rows, c0, cols, y);
        continue;
      }
#endif
      Requantize(g, acc64, r, rows, c0, cols, y);
    }
  }
}

template <typename X, typename Y>
void IntGemmRun(const IntGemm& g_in, const X* x, Y* y, int threads) {
  IntGemm g = g_in;
  g.avx512 = ActiveIsa() >= Isa::kAvx512;
  const TileTable tiles(ActiveIsa());
  const int64_t row_tasks = (g.m + kTaskRows - 1) / kTaskRows;
  const int64_t col_tasks = (g.panels + kTaskPanels - 1) / kTaskPanels;
  ParallelFor(ThreadsFor(threads, g.m * g.kp2 * 2 * g.panels * 16), row_tasks * col_tasks, [&](int64_t t) {
    const int64_t rt = t / col_tasks, ct = t % col_tasks;
    IntTask(g, tiles, x, y, rt * kTaskRows, std::min(g.m, (rt + 1) * kTaskRows), ct * kTaskPanels,
            std::min(g.panels, (ct + 1) * kTaskPanels));
  });
}

template <typename X>
bool IntFor(const py::array& x, const IntGemm& g, py::array& y, int threads) {
  if (!x.dtype().equal(py::dtype::of<X>())) return false;
  const auto* px = static_cast<const X*>(x.data());
  void* py_ = y.mutable_data();
  const auto& dt = y.dtype();
  const int out = dt.equal(py::dtype::of<int8_t>())    ? 0
                  : dt.equal(py::dtype::of<uint8_t>()) ? 1
                  : dt.equal(py::dtype::of<int16_t>()) ? 2
                                                       : 3;
  py::gil_scoped_release release;  // the dtypes above are Python objects: compared before this
  if (out == 0)
    IntGemmRun(g, px, static_cast<int8_t*>(py_), threads);
  else if (out == 1)
    IntGemmRun(g, px, static_cast<uint8_t*>(py_), threads);
  else if (out == 2)
    IntGemmRun(g, px, static_cast<int16_t*>(py_), threads);
  else
    IntGemmRun(g, px, static_cast<uint16_t*>(py_), threads);
  return true;
}

using I16 = py::array_t<int16_t, py::array::c_style>;
using I64 = py::array_t<int64_t, py::array::c_style>;

py::array QdqMatMulIntPy(const py::array& x, const I16& wp, const I64& colsum, int64_t n, int64_t x_zp,
                         int64_t chunk_pairs, const F64& mult, float ys, float yzp, float lo, float hi,
                         const py::dtype& out_dtype, int threads, const py::object& out_into) {
  const char* fn = "qdq_matmul_int";
  const bool out_ok = out_dtype.equal(py::dtype::of<int8_t>()) || out_dtype.equal(py::dtype::of<uint8_t>()) ||
                      out_dtype.equal(py::dtype::of<int16_t>()) || out_dtype.equal(py::dtype::of<uint16_t>());
  const int64_t k = x.ndim() ? x.shape(x.ndim() - 1) : 0;
  if (!(x.flags() & py::array::c_style) || x.ndim() < 1 || wp.ndim() != 4 || wp.shape(1) != (k + 1) / 2 ||
      wp.shape(2) != 16 || wp.shape(3) != 2 || wp.shape(0) != (n + 15) / 16 || colsum.size() != wp.shape(0) * 16 ||
      !out_ok || (mult.size() != 1 && mult.size() != n) || chunk_pairs < 1)
    throw std::invalid_argument(std::string(fn) +
                                ": x [..., K] C-order, packed W' [ceil(N/16), ceil(K/2), 16, 2] int16, colsum of "
                                "its columns, mult of 1 or N, chunk_pairs >= 1, an 8- or 16-bit output; got x" +
                                ShapeText(x) + ", W'" + ShapeText(wp) + ", N=" + std::to_string(n));
  IntGemm g;
  g.k = k;
  g.n = n;
  g.m = 1;
  for (py::ssize_t i = 0; i + 1 < x.ndim(); ++i) g.m *= x.shape(i);
  g.kp2 = wp.shape(1);
  g.panels = wp.shape(0);
  g.chunk_pairs = chunk_pairs;
  g.wp = wp.data();
  g.colsum = colsum.data();
  g.mult = mult.data();
  g.per_column = mult.size() > 1;
  g.ys = ys;
  g.yzp = yzp;
  g.lo = lo;
  g.hi = hi;
  std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim());
  shape.back() = n;
  bool fits = false;
  if (py::isinstance<py::array>(out_into)) {
    auto into = py::reinterpret_borrow<py::array>(out_into);
    fits = into.dtype().equal(out_dtype) && (into.flags() & py::array::c_style) && into.writeable() &&
           into.size() == g.m * n;
  }
  py::array y = fits ? py::reinterpret_borrow<py::array>(out_into) : py::array(out_dtype, shape);
  if (g.m == 0 || n == 0) return y;
  const bool wide_unsigned = x.dtype().equal(py::dtype::of<uint16_t>());
  g.corr_scale = (wide_unsigned ? 32768 : 0) - x_zp;
  const bool done = IntFor<int8_t>(x, g, y, threads) || IntFor<uint8_t>(x, g, y, threads) ||
                    IntFor<int16_t>(x, g, y, threads) || IntFor<uint16_t>(x, g, y, threads);
  if (!done) throw std::invalid_argument(std::string(fn) + ": x must be int8, uint8, int16 or uint16");
  return y;
}

// The bindings take their weight arrays as objects and borrow them (AsArray).
py::array QdqMatMulSmallEntry(const py::array& x, const py::object& w, double xzp, const py::object& mult, float ys,
                              float yzp, float lo, float hi, const py::dtype& out_dtype) {
  const char* fn = "qdq_matmul_small";
  return QdqMatMulSmallPy(x, AsArray<double>(w, fn, "w"), xzp, AsArray<double>(mult, fn, "mult"), ys, yzp, lo, hi,
                          out_dtype);
}

py::array QdqMatMulIntEntry(const py::array& x, const py::object& wp, const py::object& colsum, int64_t n, int64_t x_zp,
                            int64_t chunk_pairs, const py::object& mult, float ys, float yzp, float lo, float hi,
                            const py::dtype& out_dtype, int threads, const py::object& out_into) {
  const char* fn = "qdq_matmul_int";
  return QdqMatMulIntPy(x, AsArray<int16_t>(wp, fn, "wp"), AsArray<int64_t>(colsum, fn, "colsum"), n, x_zp, chunk_pairs,
                        AsArray<double>(mult, fn, "mult"), ys, yzp, lo, hi, out_dtype, threads, out_into);
}

}  // namespace

void BindQdqMatMul(py::module_& m) {
  m.def("qdq_matmul_small", &QdqMatMulSmallEntry, py::arg("x"), py::arg("w"), py::arg("x_zp"), py::arg("mult"),
        py::arg("y_scale"), py::arg("y_zp"), py::arg("lo"), py::arg("hi"), py::arg("out_dtype"),
        "npu::QdqMatMul of a small product: (x - x_zp) @ W exact in float64, times mult (per tensor or column) "
        "rounded to float32, quantized as QuantizeLinear to [lo, hi] in out_dtype (kernels/ops/qdq_matmul.py)");
  m.def("qdq_matmul_int", &QdqMatMulIntEntry, py::arg("x"), py::arg("wp"), py::arg("colsum"), py::arg("N"),
        py::arg("x_zp"), py::arg("chunk_pairs"), py::arg("mult"), py::arg("y_scale"), py::arg("y_zp"), py::arg("lo"),
        py::arg("hi"), py::arg("out_dtype"), py::arg("threads") = 1, py::arg("out") = py::none(),
        "npu::QdqMatMul as an exact integer GEMM: (x - x_zp) @ W' with W' packed by kernels/ops/qdq_matmul.py "
        "(int16 panels [ceil(N/16), ceil(K/2), 16, 2], colsum its column sums), int32 lanes flushed to int64 every "
        "chunk_pairs pairs of K, then qdq_matmul_small's float steps; into out when it is a C-order array of "
        "out_dtype and the output's size (ORT's buffer)");
}

}  // namespace npu_ep::kern
