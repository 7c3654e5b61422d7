// Resize of the last two axes of [N, C, H, W] (`kernels.resize_nearest`, `kernels.resize_linear`), and of axes 1
// and 2 of [N, H, W, C] (`kernels.resize_nearest_nhwc`, `kernels.resize_linear_nhwc`), for
// kernels/ops/resize.py, which computes the per-axis tables with its own functions (every coordinate transformation
// and nearest mode: the source index of each output row and column; for linear the two neighbours and the float32
// weight), so the kernels only walk them. Nearest copies the chosen elements' bits (any 1, 2, 4 or 8-byte dtype).
// Linear follows the reference's passes in float32: the H pass t = lo + (hi - lo) * wh over whole rows, then the W
// pass y = t[w0] + (t[w1] - t[w0]) * ww, each a rounded multiply then a rounded add (no fused multiply-add), float16
// widened exactly before and rounded once after; an axis the reference leaves alone (identity) is not passed over.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("O3", "fp-contract=off")  // the row blends vectorize; a multiply, then an add, as numpy
#endif
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "conv_geometry.h"
#include "cpu.h"
#include "half.h"
#include "intrinsics.h"
#include "movement.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

using Index = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using Weights = py::array_t<float, py::array::c_style | py::array::forcecast>;

// The input's [N * C, H, W] and the output's [OH, OW].
struct Plan {
  int64_t planes = 0, H = 0, W = 0, OH = 0, OW = 0;
};

#if NPU_EP_X86
// 4-byte nearest on AVX-512, an output row at a time in 16-column blocks: each block's sources lie within 16
// consecutive input columns (one masked load from `base`, the columns readable from it in `lanes`) and one permute
// (`idx`) puts them in place. A run of output rows with one source row is stored from the same registers.
struct NearestBlocks {
  std::vector<int64_t> base;
  std::vector<__mmask16> lanes;
  std::vector<int32_t> idx;  // 16 per block
};

// Block k's first output column: 16 k, the last block of a row of 16 and more ending at the row's end (it overlaps
// the one before: every store is a whole one).
inline int64_t Start(int64_t OW, int64_t k) { return OW >= 16 ? std::min(16 * k, OW - 16) : 0; }

// The row's blocks, or false where some block's sources span more than 16 columns (a downsample).
bool PlanBlocks(const Plan& p, const int64_t* cols, NearestBlocks& b) {
  const int64_t blocks = (p.OW + 15) / 16;
  b.base.resize(static_cast<size_t>(blocks));
  b.lanes.resize(static_cast<size_t>(blocks));
  b.idx.assign(static_cast<size_t>(blocks) * 16, 0);
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t lo = Start(p.OW, k), hi = std::min(p.OW, lo + 16);
    const int64_t first = *std::min_element(cols + lo, cols + hi), last = *std::max_element(cols + lo, cols + hi);
    if (last - first >= 16) return false;
    b.base[k] = first;
    b.lanes[k] = static_cast<__mmask16>((1u << std::min<int64_t>(16, p.W - first)) - 1);
    for (int64_t o = lo; o < hi; ++o) b.idx[k * 16 + (o - lo)] = static_cast<int32_t>(cols[o] - first);
  }
  return true;
}

// One plane (locals only: the stores cannot alias the tables).
__attribute__((target("avx512f"))) void NearestPlaneAvx512(const uint32_t* in, const int64_t* rows, int64_t OH,
                                                           int64_t OW, int64_t W, int64_t blocks, const int64_t* base,
                                                           const __mmask16* lanes, const int32_t* idx, uint32_t* out) {
  const __mmask16 m = static_cast<__mmask16>(OW >= 16 ? 0xFFFF : (1u << OW) - 1);
  for (int64_t oh = 0; oh < OH;) {
    int64_t run = 1;
    while (oh + run < OH && rows[oh + run] == rows[oh]) ++run;
    const uint32_t* src = in + rows[oh] * W;
    uint32_t* dst = out + oh * OW;
    for (int64_t k = 0; k < blocks; ++k) {
      const __m512i r =
          _mm512_permutexvar_epi32(_mm512_loadu_si512(idx + k * 16), _mm512_maskz_loadu_epi32(lanes[k], src + base[k]));
      const int64_t o = Start(OW, k);
      for (int64_t i = 0; i < run; ++i) _mm512_mask_storeu_epi32(dst + i * OW + o, m, r);
    }
    oh += run;
  }
}

void NearestBlocksAvx512(const Plan& p, const uint32_t* x, const int64_t* rows, const NearestBlocks& b, uint32_t* y,
                         int threads) {
  const int64_t blocks = static_cast<int64_t>(b.base.size());
  conv_detail::ParallelItems(threads, p.planes, p.OH * p.OW, [&](int64_t plane) {
    NearestPlaneAvx512(x + plane * p.H * p.W, rows, p.OH, p.OW, p.W, blocks, b.base.data(), b.lanes.data(),
                       b.idx.data(), y + plane * p.OH * p.OW);
  });
}
#endif

template <typename T>
void NearestPlanes(const Plan& p, const T* x, const int64_t* rows, const int64_t* cols, T* y, int threads) {
#if NPU_EP_X86
  if constexpr (sizeof(T) == 4) {
    NearestBlocks b;
    if (ActiveIsa() >= Isa::kAvx512 && PlanBlocks(p, cols, b)) {
      NearestBlocksAvx512(p, reinterpret_cast<const uint32_t*>(x), rows, b, reinterpret_cast<uint32_t*>(y), threads);
      return;
    }
  }
#endif
  conv_detail::ParallelItems(threads, p.planes, p.OH * p.OW, [&](int64_t plane) {
    const T* in = x + plane * p.H * p.W;
    T* out = y + plane * p.OH * p.OW;
    for (int64_t oh = 0; oh < p.OH; ++oh) {
      T* dst = out + oh * p.OW;
      if (oh && rows[oh] == rows[oh - 1]) {  // the same source row: the row just written
        std::memcpy(dst, dst - p.OW, static_cast<size_t>(p.OW) * sizeof(T));
        continue;
      }
      const T* src = in + rows[oh] * p.W;
      for (int64_t ow = 0; ow < p.OW; ++ow) dst[ow] = src[cols[ow]];
    }
  });
}

// The float32 blends of both layouts: the H pass over a row of n elements, the W pass over OW pixels of C (C == 1:
// the planes' columns), compiled for each ISA level (fp-contract off in all: the wider vectors change no bits).
__attribute__((always_inline)) inline void BlendRowsBody(const float* __restrict lo, const float* __restrict hi,
                                                         float w, float* __restrict t, int64_t n) {
  for (int64_t i = 0; i < n; ++i) t[i] = lo[i] + (hi[i] - lo[i]) * w;
}

__attribute__((always_inline)) inline void BlendPixelsBody(const float* __restrict row, const int64_t* w0,
                                                           const int64_t* w1, const float* ww, int64_t OW, int64_t C,
                                                           float* __restrict dst) {
  for (int64_t o = 0; o < OW; ++o) {
    const float* __restrict a = row + w0[o] * C;
    const float* __restrict b = row + w1[o] * C;
    const float w = ww[o];
    float* __restrict d = dst + o * C;
    for (int64_t c = 0; c < C; ++c) d[c] = a[c] + (b[c] - a[c]) * w;
  }
}

#define NPU_RESIZE_BLENDS(suffix, attr)                                                                              \
  attr void BlendRows##suffix(const float* lo, const float* hi, float w, float* t, int64_t n) {                      \
    BlendRowsBody(lo, hi, w, t, n);                                                                                  \
  }                                                                                                                  \
  attr void BlendPixels##suffix(const float* row, const int64_t* w0, const int64_t* w1, const float* ww, int64_t OW, \
                                int64_t C, float* dst) {                                                             \
    BlendPixelsBody(row, w0, w1, ww, OW, C, dst);                                                                    \
  }
NPU_RESIZE_BLENDS(Default, )
#if NPU_EP_X86
NPU_RESIZE_BLENDS(Avx2, __attribute__((target("avx2"))))
NPU_RESIZE_BLENDS(Avx512, __attribute__((target("avx512f,avx512bw,avx512vl"))))
#endif
#undef NPU_RESIZE_BLENDS

struct Blends {
  void (*rows)(const float*, const float*, float, float*, int64_t) = BlendRowsDefault;
  void (*pixels)(const float*, const int64_t*, const int64_t*, const float*, int64_t, int64_t,
                 float*) = BlendPixelsDefault;
};

Blends BlendsFor() {
#if NPU_EP_X86
  const Isa isa = ActiveIsa();
  if (isa >= Isa::kAvx512) return {BlendRowsAvx512, BlendPixelsAvx512};
  if (isa >= Isa::kAvx2) return {BlendRowsAvx2, BlendPixelsAvx2};
#endif
  return {};
}

#if NPU_EP_X86
// The planes' W pass on AVX-512 in 16-column blocks (as NearestBlocks): both neighbours of every column of a block
// lie within 16 consecutive input columns (an upsample, a mild downsample), so one masked load and two permutes
// give them, and the blend is the same multiply and add.
struct LinearBlocks {
  std::vector<int64_t> base;
  std::vector<__mmask16> lanes;
  std::vector<int32_t> lo, hi;  // 16 per block
};

bool PlanLinearBlocks(const Plan& p, const int64_t* w0, const int64_t* w1, LinearBlocks& b) {
  const int64_t blocks = (p.OW + 15) / 16;
  b.base.resize(static_cast<size_t>(blocks));
  b.lanes.resize(static_cast<size_t>(blocks));
  b.lo.assign(static_cast<size_t>(blocks) * 16, 0);
  b.hi.assign(static_cast<size_t>(blocks) * 16, 0);
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t s = Start(p.OW, k), e = std::min(p.OW, s + 16);
    const int64_t first = *std::min_element(w0 + s, w0 + e), last = *std::max_element(w1 + s, w1 + e);
    if (last - first >= 16) return false;
    b.base[k] = first;
    b.lanes[k] = static_cast<__mmask16>((1u << std::min<int64_t>(16, p.W - first)) - 1);
    for (int64_t o = s; o < e; ++o) {
      b.lo[k * 16 + (o - s)] = static_cast<int32_t>(w0[o] - first);
      b.hi[k * 16 + (o - s)] = static_cast<int32_t>(w1[o] - first);
    }
  }
  return true;
}

__attribute__((target("avx512f"))) void BlendColumnsAvx512(const float* row, const LinearBlocks& b, const float* ww,
                                                           int64_t OW, float* dst) {
  const __mmask16 m = static_cast<__mmask16>(OW >= 16 ? 0xFFFF : (1u << OW) - 1);
  const int64_t blocks = static_cast<int64_t>(b.base.size());
  for (int64_t k = 0; k < blocks; ++k) {
    const __m512 v = _mm512_maskz_loadu_ps(b.lanes[k], row + b.base[k]);
    const __m512 lo = _mm512_permutexvar_ps(_mm512_loadu_si512(b.lo.data() + k * 16), v);
    const __m512 hi = _mm512_permutexvar_ps(_mm512_loadu_si512(b.hi.data() + k * 16), v);
    const int64_t o = Start(OW, k);
    const __m512 w = _mm512_maskz_loadu_ps(m, ww + o);
    _mm512_mask_storeu_ps(dst + o, m, _mm512_add_ps(lo, _mm512_mul_ps(_mm512_sub_ps(hi, lo), w)));
  }
}
#endif

// How the planes' rows are blended: the ISA level's blends, and the W pass's AVX-512 blocks where they apply.
struct PlaneBlends {
  Blends blend = BlendsFor();
  bool blocks = false;
#if NPU_EP_X86
  LinearBlocks columns;
#endif
  PlaneBlends(const Plan& p, const int64_t* w0, const int64_t* w1) {
#if NPU_EP_X86
    blocks = w0 && ActiveIsa() >= Isa::kAvx512 && PlanLinearBlocks(p, w0, w1, columns);
#endif
  }
};

// One float32 output row of the linear resize from the float32 plane `in` [H, W]: the H pass (skipped when h0 is
// null: the row is input row oh) into `t`, or straight into dst without a W pass; then the W pass.
void LinearRow(const Plan& p, const PlaneBlends& b, const float* in, int64_t oh, const int64_t* h0, const int64_t* h1,
               const float* hw, const int64_t* w0, const int64_t* w1, const float* ww, float* t, float* dst) {
  const float* row = in + oh * p.W;
  if (h0) {
    b.blend.rows(in + h0[oh] * p.W, in + h1[oh] * p.W, hw[oh], w0 ? t : dst, p.W);
    if (!w0) return;
    row = t;
  }
  if (!w0) {
    std::copy(row, row + p.W, dst);
    return;
  }
#if NPU_EP_X86
  if (b.blocks) return BlendColumnsAvx512(row, b.columns, ww, p.OW, dst);
#endif
  b.blend.pixels(row, w0, w1, ww, p.OW, 1, dst);
}

// Linear over every plane; T is float or uint16_t (float16 bits: each plane widened first, each row rounded once).
template <typename T>
void LinearPlanes(const Plan& p, const T* x, const int64_t* h0, const int64_t* h1, const float* hw, const int64_t* w0,
                  const int64_t* w1, const float* ww, T* y, int threads) {
  const PlaneBlends b(p, w0, w1);
  conv_detail::ParallelItems(threads, p.planes, p.OH * p.OW * 3, [&](int64_t plane) {
    thread_local std::vector<float> wide, t, row;
    t.resize(static_cast<size_t>(p.W));
    const float* in;
    if constexpr (sizeof(T) == 2) {
      wide.resize(static_cast<size_t>(p.H * p.W));
      HalfToFloatRow(x + plane * p.H * p.W, wide.data(), p.H * p.W);
      in = wide.data();
      row.resize(static_cast<size_t>(p.OW));
    } else {
      in = x + plane * p.H * p.W;
    }
    for (int64_t oh = 0; oh < p.OH; ++oh) {
      T* dst = y + (plane * p.OH + oh) * p.OW;
      if constexpr (sizeof(T) == 2) {
        LinearRow(p, b, in, oh, h0, h1, hw, w0, w1, ww, t.data(), row.data());
        FloatToHalfRow(row.data(), dst, p.OW);
      } else {
        LinearRow(p, b, in, oh, h0, h1, hw, w0, w1, ww, t.data(), dst);
      }
    }
  });
}

Plan PlanOf(const py::array& x, int64_t oh, int64_t ow, const char* fn) {
  if (x.ndim() != 4 || !(x.flags() & py::array::c_style))
    throw std::invalid_argument(std::string(fn) + ": x must be a C-order [N, C, H, W] array");
  if (oh < 0 || ow < 0) throw std::invalid_argument(std::string(fn) + ": output sizes must be >= 0");
  return {x.shape(0) * x.shape(1), x.shape(2), x.shape(3), oh, ow};
}

// An index table of n entries, each in [0, bound).
const int64_t* Table(const Index& a, int64_t n, int64_t bound, const char* what) {
  if (a.size() != n) throw std::invalid_argument(std::string("resize: ") + what + " must hold " + std::to_string(n));
  const int64_t* d = a.data();
  for (int64_t i = 0; i < n; ++i)
    if (d[i] < 0 || d[i] >= bound) throw std::invalid_argument(std::string("resize: ") + what + " leaves the input");
  return d;
}

// The result: `out` when given (ORT's buffer for it), else a new array.
py::array ResultOf(const char* fn, const py::array& x, const Plan& p, const py::object& out) {
  return MovementResult(fn, x.dtype(), {x.shape(0), x.shape(1), p.OH, p.OW}, out);
}

py::array NearestPy(const py::array& x, const Index& rows, const Index& cols, int threads, const py::object& out) {
  const Plan p = PlanOf(x, rows.size(), cols.size(), "resize_nearest");
  const int64_t* r = Table(rows, p.OH, p.H, "rows");
  const int64_t* c = Table(cols, p.OW, p.W, "cols");
  py::array y = ResultOf("resize_nearest", x, p, out);
  const void* in = x.data();
  void* dst = y.mutable_data();
  const auto size = x.itemsize();
  py::gil_scoped_release release;
  if (size == 1)
    NearestPlanes(p, static_cast<const uint8_t*>(in), r, c, static_cast<uint8_t*>(dst), threads);
  else if (size == 2)
    NearestPlanes(p, static_cast<const uint16_t*>(in), r, c, static_cast<uint16_t*>(dst), threads);
  else if (size == 4)
    NearestPlanes(p, static_cast<const uint32_t*>(in), r, c, static_cast<uint32_t*>(dst), threads);
  else if (size == 8)
    NearestPlanes(p, static_cast<const uint64_t*>(in), r, c, static_cast<uint64_t*>(dst), threads);
  else
    throw std::invalid_argument("resize_nearest: elements of " + std::to_string(size) + " bytes");
  return y;
}

// A linear axis: (lo, hi, weight) tables of n entries, or three Nones where the axis stays as it is (n == size).
struct Axis {
  const int64_t* lo = nullptr;
  const int64_t* hi = nullptr;
  const float* w = nullptr;
};

Axis AxisOf(const py::object& lo, const py::object& hi, const py::object& w, int64_t n, int64_t size, const char* name,
            std::vector<py::object>& keep) {
  if (lo.is_none()) {
    if (n != size) throw std::invalid_argument(std::string("resize_linear: ") + name + " resized without tables");
    return {};
  }
  auto l = Index::ensure(lo), h = Index::ensure(hi);
  auto wt = Weights::ensure(w);
  if (!l || !h || !wt || wt.size() != n) throw std::invalid_argument(std::string("resize_linear: bad ") + name);
  keep.insert(keep.end(), {l, h, wt});
  return {Table(l, n, size, name), Table(h, n, size, name), wt.data()};
}

py::array LinearPy(const py::array& x, int64_t oh, int64_t ow, const py::object& h0, const py::object& h1,
                   const py::object& hw, const py::object& w0, const py::object& w1, const py::object& ww, int threads,
                   const py::object& out) {
  const Plan p = PlanOf(x, oh, ow, "resize_linear");
  const bool half = x.dtype().kind() == 'f' && x.itemsize() == 2;
  if (!half && !py::isinstance<py::array_t<float>>(x))
    throw std::invalid_argument("resize_linear: x must be float32 or float16");
  std::vector<py::object> keep;
  const Axis h = AxisOf(h0, h1, hw, p.OH, p.H, "rows", keep), w = AxisOf(w0, w1, ww, p.OW, p.W, "cols", keep);
  py::array y = ResultOf("resize_linear", x, p, out);
  const void* in = x.data();
  void* dst = y.mutable_data();
  py::gil_scoped_release release;
  if (half)
    LinearPlanes(p, static_cast<const uint16_t*>(in), h.lo, h.hi, h.w, w.lo, w.hi, w.w, static_cast<uint16_t*>(dst),
                 threads);
  else
    LinearPlanes(p, static_cast<const float*>(in), h.lo, h.hi, h.w, w.lo, w.hi, w.w, static_cast<float*>(dst), threads);
  return y;
}

// ---- [N, H, W, C]: axes 1 and 2 (an NHWC tensor's H and W) on the same tables ----
// A pixel is C consecutive elements: nearest copies whole pixels (a repeated source row: the output row just
// written), linear's H pass blends whole rows of W * C and its W pass the C values of two neighbour pixels, each
// element by the same float32 multiply and add as the planes above (the same bits). One channel is the planes' case.

struct PlanNhwc {
  int64_t N = 0, H = 0, W = 0, C = 0, OH = 0, OW = 0;
  Plan Planes() const { return {N, H, W, OH, OW}; }  // C == 1: the same bytes as [N, 1, H, W]
};

// fn(lo, hi) over the ranges of the items [0, n) ParallelItems makes (so a row may copy the one before in its range)
template <typename Fn>
void ParallelRanges(int threads, int64_t n, int64_t work_per_item, const Fn& fn) {
  if (n <= 0) return;
  const int64_t per = std::clamp<int64_t>(kMinParallelWork / std::max<int64_t>(work_per_item, 1), 1, n);
  const int64_t tasks = (n + per - 1) / per;
  ParallelFor(tasks > 1 ? threads : 1, tasks, [&](int64_t t) { fn(t * per, std::min(n, (t + 1) * per)); });
}

// A pixel of N bytes (any alignment): a gather of these is fixed-size moves, no memcpy call per pixel.
template <size_t N>
struct Bytes {
  uint8_t b[N];
};

// One output row's pixels from input row `src`: P is a pixel's Bytes<N>, or void (any size: a memcpy each).
template <typename P>
void GatherPixels(const void* src, const int64_t* cols, int64_t OW, size_t pixel, void* dst) {
  if constexpr (std::is_void_v<P>) {
    const auto* s = static_cast<const uint8_t*>(src);
    auto* d = static_cast<uint8_t*>(dst);
    for (int64_t o = 0; o < OW; ++o) std::memcpy(d + o * pixel, s + cols[o] * static_cast<int64_t>(pixel), pixel);
  } else {
    const P* s = static_cast<const P*>(src);
    P* d = static_cast<P*>(dst);
    for (int64_t o = 0; o < OW; ++o) d[o] = s[cols[o]];
  }
}

template <typename P>
void NearestRows(const PlanNhwc& p, const uint8_t* x, size_t pixel, const int64_t* rows, const int64_t* cols,
                 uint8_t* y, int threads) {
  const size_t in_row = static_cast<size_t>(p.W) * pixel, out_row = static_cast<size_t>(p.OW) * pixel;
  ParallelRanges(threads, p.N * p.OH, p.OW * p.C, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t n = r / p.OH, oh = r % p.OH;
      uint8_t* dst = y + static_cast<size_t>(r) * out_row;
      if (r > lo && oh && rows[oh] == rows[oh - 1])
        std::memcpy(dst, dst - out_row, out_row);
      else
        GatherPixels<P>(x + static_cast<size_t>(n * p.H + rows[oh]) * in_row, cols, p.OW, pixel, dst);
    }
  });
}

template <typename T>
void NearestNhwc(const PlanNhwc& p, const T* x, const int64_t* rows, const int64_t* cols, T* y, int threads) {
  if (p.C == 1) return NearestPlanes(p.Planes(), x, rows, cols, y, threads);
  const size_t pixel = static_cast<size_t>(p.C) * sizeof(T);
  const auto* in = reinterpret_cast<const uint8_t*>(x);
  auto* out = reinterpret_cast<uint8_t*>(y);
  switch (pixel) {  // the small pixels (RGB images' 3 channels of 1, 2 or 4 bytes among them)
    case 2: return NearestRows<Bytes<2>>(p, in, pixel, rows, cols, out, threads);
    case 3: return NearestRows<Bytes<3>>(p, in, pixel, rows, cols, out, threads);
    case 4: return NearestRows<Bytes<4>>(p, in, pixel, rows, cols, out, threads);
    case 6: return NearestRows<Bytes<6>>(p, in, pixel, rows, cols, out, threads);
    case 8: return NearestRows<Bytes<8>>(p, in, pixel, rows, cols, out, threads);
    case 12: return NearestRows<Bytes<12>>(p, in, pixel, rows, cols, out, threads);
    case 16: return NearestRows<Bytes<16>>(p, in, pixel, rows, cols, out, threads);
    default: return NearestRows<void>(p, in, pixel, rows, cols, out, threads);
  }
}

// The float16 input rows a task of output rows reads, each widened once: two slots, so the two neighbour rows an
// output row blends stay while the next output rows read them too (a task's rows advance through the input).
struct WideRows {
  int64_t key[2] = {-1, -1};  // the slot's input row (n * H + ih), -1: none
  std::vector<float>* buf[2];

  int Find(int64_t row) const { return key[0] == row ? 0 : key[1] == row ? 1 : -1; }
  // The slot holding `row`, widened into the slot other than `keep` when no slot holds it.
  int Get(const uint16_t* x, int64_t row, int64_t n, int keep) {
    const int found = Find(row);
    if (found >= 0) return found;
    const int s = keep == 0 ? 1 : 0;
    buf[s]->resize(static_cast<size_t>(n));
    HalfToFloatRow(x + row * n, buf[s]->data(), n);
    key[s] = row;
    return s;
  }
};

// Linear over every output row (n, oh); T is float or uint16_t (float16 bits: the rows read widened exactly, each
// output row rounded once).
template <typename T>
void LinearNhwc(const PlanNhwc& p, const T* x, const int64_t* h0, const int64_t* h1, const float* hw, const int64_t* w0,
                const int64_t* w1, const float* ww, T* y, int threads) {
  if (p.C == 1) return LinearPlanes(p.Planes(), x, h0, h1, hw, w0, w1, ww, y, threads);
  const Blends blend = BlendsFor();
  const int64_t in_row = p.W * p.C, out_row = p.OW * p.C;
  ParallelRanges(threads, p.N * p.OH, out_row * 3, [&](int64_t first, int64_t last) {
    thread_local std::vector<float> a, b, t, wide_out;
    WideRows wide{{-1, -1}, {&a, &b}};
    for (int64_t r = first; r < last; ++r) {
      const int64_t n = r / p.OH, oh = r % p.OH;
      T* dst = y + r * out_row;
      // input row ih of image n in float32 (`keep`: the slot the other row of this output row holds)
      auto row = [&](int64_t ih, int keep, int* slot) -> const float* {
        if constexpr (sizeof(T) == 2) {
          *slot = wide.Get(x, n * p.H + ih, in_row, keep);
          return wide.buf[*slot]->data();
        } else {
          return x + (n * p.H + ih) * in_row;
        }
      };
      float* out;
      if constexpr (sizeof(T) == 2) {
        wide_out.resize(static_cast<size_t>(out_row));
        out = wide_out.data();
      } else {
        out = dst;
      }
      int lo_slot = -1, hi_slot = -1;
      const float* src;
      if (h0) {
        float* blended = w0 ? (t.resize(static_cast<size_t>(in_row)), t.data()) : out;  // no W pass: straight out
        const float* lo = row(h0[oh], wide.Find(n * p.H + h1[oh]), &lo_slot);
        const float* hi = row(h1[oh], lo_slot, &hi_slot);
        blend.rows(lo, hi, hw[oh], blended, in_row);
        src = blended;
      } else {
        src = row(oh, -1, &lo_slot);
      }
      if (w0)
        blend.pixels(src, w0, w1, ww, p.OW, p.C, out);
      else if (src != out)
        std::copy(src, src + out_row, out);
      if constexpr (sizeof(T) == 2) FloatToHalfRow(out, dst, out_row);
    }
  });
}

PlanNhwc PlanNhwcOf(const py::array& x, int64_t oh, int64_t ow, const char* fn) {
  if (x.ndim() != 4 || !(x.flags() & py::array::c_style))
    throw std::invalid_argument(std::string(fn) + ": x must be a C-order [N, H, W, C] array");
  if (oh < 0 || ow < 0) throw std::invalid_argument(std::string(fn) + ": output sizes must be >= 0");
  return {x.shape(0), x.shape(1), x.shape(2), x.shape(3), oh, ow};
}

py::array NhwcResultOf(const char* fn, const py::array& x, const PlanNhwc& p, const py::object& out) {
  return MovementResult(fn, x.dtype(), {p.N, p.OH, p.OW, p.C}, out);
}

py::array NearestNhwcPy(const py::array& x, const Index& rows, const Index& cols, int threads, const py::object& out) {
  const PlanNhwc p = PlanNhwcOf(x, rows.size(), cols.size(), "resize_nearest_nhwc");
  const int64_t* r = Table(rows, p.OH, p.H, "rows");
  const int64_t* c = Table(cols, p.OW, p.W, "cols");
  py::array y = NhwcResultOf("resize_nearest_nhwc", x, p, out);
  const void* in = x.data();
  void* dst = y.mutable_data();
  const auto size = x.itemsize();
  py::gil_scoped_release release;
  if (size == 1)
    NearestNhwc(p, static_cast<const uint8_t*>(in), r, c, static_cast<uint8_t*>(dst), threads);
  else if (size == 2)
    NearestNhwc(p, static_cast<const uint16_t*>(in), r, c, static_cast<uint16_t*>(dst), threads);
  else if (size == 4)
    NearestNhwc(p, static_cast<const uint32_t*>(in), r, c, static_cast<uint32_t*>(dst), threads);
  else if (size == 8)
    NearestNhwc(p, static_cast<const uint64_t*>(in), r, c, static_cast<uint64_t*>(dst), threads);
  else
    throw std::invalid_argument("resize_nearest_nhwc: elements of " + std::to_string(size) + " bytes");
  return y;
}

py::array LinearNhwcPy(const py::array& x, int64_t oh, int64_t ow, const py::object& h0, const py::object& h1,
                       const py::object& hw, const py::object& w0, const py::object& w1, const py::object& ww,
                       int threads, const py::object& out) {
  const PlanNhwc p = PlanNhwcOf(x, oh, ow, "resize_linear_nhwc");
  const bool half = x.dtype().kind() == 'f' && x.itemsize() == 2;
  if (!half && !py::isinstance<py::array_t<float>>(x))
    throw std::invalid_argument("resize_linear_nhwc: x must be float32 or float16");
  std::vector<py::object> keep;
  const Axis h = AxisOf(h0, h1, hw, p.OH, p.H, "rows", keep), w = AxisOf(w0, w1, ww, p.OW, p.W, "cols", keep);
  py::array y = NhwcResultOf("resize_linear_nhwc", x, p, out);
  const void* in = x.data();
  void* dst = y.mutable_data();
  py::gil_scoped_release release;
  if (half)
    LinearNhwc(p, static_cast<const uint16_t*>(in), h.lo, h.hi, h.w, w.lo, w.hi, w.w, static_cast<uint16_t*>(dst),
               threads);
  else
    LinearNhwc(p, static_cast<const float*>(in), h.lo, h.hi, h.w, w.lo, w.hi, w.w, static_cast<float*>(dst), threads);
  return y;
}

}  // namespace

void BindResize(py::module_& m) {
  m.def("resize_nearest", &NearestPy, py::arg("x"), py::arg("rows"), py::arg("cols"), py::arg("threads") = 1,
        py::arg("out") = py::none(),
        "Resize nearest of [N, C, H, W]: y[n, c, i, j] = x[n, c, rows[i], cols[j]], bits copied (1/2/4/8-byte "
        "elements); rows / cols: int64 source indices; into out (ORT's buffer: writeable, C-order, x's dtype and "
        "the result's size) when given");
  m.def("resize_linear", &LinearPy, py::arg("x"), py::arg("out_h"), py::arg("out_w"), py::arg("h0"), py::arg("h1"),
        py::arg("hw"), py::arg("w0"), py::arg("w1"), py::arg("ww"), py::arg("threads") = 1, py::arg("out") = py::none(),
        "Resize linear of float32/float16 [N, C, H, W] in float32: the H pass lo + (hi - lo) * w over rows (h0, h1, "
        "hw), then the W pass over columns (w0, w1, ww); None tables leave that axis as it is; into out as "
        "resize_nearest's");
  m.def("resize_nearest_nhwc", &NearestNhwcPy, py::arg("x"), py::arg("rows"), py::arg("cols"), py::arg("threads") = 1,
        py::arg("out") = py::none(),
        "Resize nearest of axes 1 and 2 of [N, H, W, C]: y[n, i, j, :] = x[n, rows[i], cols[j], :], bits copied; "
        "as resize_nearest");
  m.def("resize_linear_nhwc", &LinearNhwcPy, py::arg("x"), py::arg("out_h"), py::arg("out_w"), py::arg("h0"),
        py::arg("h1"), py::arg("hw"), py::arg("w0"), py::arg("w1"), py::arg("ww"), py::arg("threads") = 1,
        py::arg("out") = py::none(),
        "Resize linear of axes 1 and 2 of float32/float16 [N, H, W, C]: resize_linear's passes and bits, the H pass "
        "over whole rows of W * C, the W pass over pixels of C");
}

}  // namespace npu_ep::kern
