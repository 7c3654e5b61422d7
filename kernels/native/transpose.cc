// Transpose (`kernels.transpose`) for kernels/ops/movement.py: numpy's transpose of x by `perm`, materialized in C
// order (into ORT's buffer when given), for every dtype of 1, 2, 4 or 8 bytes (bits moved, never computed).
//
// The permutation is reduced first, as ORT's and MLAS's Transpose do: size-1 axes dropped, axes that stay
// neighbours in both orders merged. What is left is one of three copies: nothing moves (one memcpy); the innermost
// axis stays innermost (a memcpy per run); or the innermost axes differ, a blocked 2-D transpose of the input's
// innermost axis against the output's, repeated over the remaining axes. The 2-D transpose walks strips of 8 rows
// or columns (16 for 1- and 2-byte elements; see Block) in 8 x 8 register tiles (16 x 16 for those; AVX2/SSE2 unpacks
// on x86 hosts that run AVX2; element copies on the others and at the strips' tails), the strips split over threads.
#if !defined(__clang__)  // clang unrolls these at -O2 and warns on the GCC pragma
#pragma GCC optimize("O3")  // the register tiles' loops unroll, their arrays stay in registers
#endif
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu.h"
#include "intrinsics.h"
#include "movement.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

// Rows or columns a strip of the 2-D transpose covers: a register tile's side.
template <typename T>
constexpr int64_t kStrip = sizeof(T) <= 2 ? 16 : 8;
constexpr int64_t kCachedBytes = int64_t{1} << 18;  // a 2-D block up to this size is walked by columns
constexpr int64_t kTaskBytes = int64_t{1} << 17;  // bytes a parallel task copies, at least

// The permutation with size-1 axes dropped and neighbouring axes merged: input extents (C order) and, per output
// axis, the input axis it reads.
struct Reduced {
  SmallDims dims, perm;
};

Reduced Reduce(const SmallDims& dims, const SmallDims& perm) {
  const size_t rank = dims.size();
  SmallDims kept_index(rank, -1), kept_dims;
  for (size_t i = 0; i < rank; ++i)
    if (dims[i] != 1) {
      kept_index[i] = static_cast<int64_t>(kept_dims.size());
      kept_dims.push_back(dims[i]);
    }
  SmallDims first, count;  // groups of merged axes in output order: first input axis, axes
  for (const int64_t a : perm) {
    const int64_t k = kept_index[static_cast<size_t>(a)];
    if (k < 0) continue;
    if (!first.empty() && first.back() + count.back() == k) {
      ++count.back();
    } else {
      first.push_back(k);
      count.push_back(1);
    }
  }
  SmallDims by_input(first.size());
  for (size_t g = 0; g < first.size(); ++g) by_input[g] = static_cast<int64_t>(g);
  std::sort(by_input.begin(), by_input.end(),
            [&](int64_t a, int64_t b) { return first[static_cast<size_t>(a)] < first[static_cast<size_t>(b)]; });
  Reduced r;
  r.perm.assign(first.size(), 0);
  for (size_t i = 0; i < by_input.size(); ++i) {
    const auto g = static_cast<size_t>(by_input[i]);
    int64_t d = 1;
    for (int64_t k = first[g]; k < first[g] + count[g]; ++k) d *= kept_dims[static_cast<size_t>(k)];
    r.dims.push_back(d);
    r.perm[g] = static_cast<int64_t>(i);
  }
  return r;
}

// The axes outside the copied block, in output order: extents and input/output strides in elements.
struct Outer {
  SmallDims dims, in_strides, out_strides;
  int64_t count = 1;

  // Input and output offsets (elements) of outer index `o`.
  void Offsets(int64_t o, int64_t& in, int64_t& out) const {
    in = out = 0;
    for (size_t ax = dims.size(); ax-- > 0;) {
      const int64_t idx = o % dims[ax];
      o /= dims[ax];
      in += idx * in_strides[ax];
      out += idx * out_strides[ax];
    }
  }
};

// dst[m * ds + n] = src[n * ss + m] for n < bn, m < bm.
template <typename T>
void TileByElement(const T* src, int64_t ss, T* dst, int64_t ds, int64_t bn, int64_t bm) {
  for (int64_t m = 0; m < bm; ++m)
    for (int64_t n = 0; n < bn; ++n) dst[m * ds + n] = src[n * ss + m];
}

#if NPU_EP_X86
__attribute__((target("avx2"))) void Tile8x8(const uint32_t* src, int64_t ss, uint32_t* dst, int64_t ds) {
  const auto* s = reinterpret_cast<const float*>(src);
  auto* d = reinterpret_cast<float*>(dst);
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(s + i * ss);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(d + i * ds, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(d + (i + 4) * ds, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

__attribute__((target("avx2"))) void Tile8x8(const uint16_t* src, int64_t ss, uint16_t* dst, int64_t ds) {
  __m128i r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * ss));
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm_unpacklo_epi16(r[i], r[i + 1]);
    t[i + 1] = _mm_unpackhi_epi16(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {  // columns 0-1, 2-3 (from the low halves), 4-5, 6-7 of four rows
    r[i] = _mm_unpacklo_epi32(t[i], t[i + 2]);
    r[i + 1] = _mm_unpackhi_epi32(t[i], t[i + 2]);
    r[i + 2] = _mm_unpacklo_epi32(t[i + 1], t[i + 3]);
    r[i + 3] = _mm_unpackhi_epi32(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i * ds), _mm_unpacklo_epi64(r[i], r[i + 4]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (2 * i + 1) * ds), _mm_unpackhi_epi64(r[i], r[i + 4]));
  }
}

__attribute__((target("avx2"))) void Tile8x8(const uint8_t* src, int64_t ss, uint8_t* dst, int64_t ds) {
  __m128i r[8], t[4], u[4];
  for (int i = 0; i < 8; ++i) r[i] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i * ss));
  for (int i = 0; i < 4; ++i) t[i] = _mm_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
  u[0] = _mm_unpacklo_epi16(t[0], t[1]);  // columns 0-3 of rows 0-3
  u[1] = _mm_unpackhi_epi16(t[0], t[1]);  // columns 4-7 of rows 0-3
  u[2] = _mm_unpacklo_epi16(t[2], t[3]);
  u[3] = _mm_unpackhi_epi16(t[2], t[3]);
  const __m128i cols[4] = {_mm_unpacklo_epi32(u[0], u[2]), _mm_unpackhi_epi32(u[0], u[2]),
                           _mm_unpacklo_epi32(u[1], u[3]), _mm_unpackhi_epi32(u[1], u[3])};
  for (int i = 0; i < 4; ++i) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + 2 * i * ds), cols[i]);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + (2 * i + 1) * ds), _mm_unpackhi_epi64(cols[i], cols[i]));
  }
}

void Tile8x8(const uint64_t* src, int64_t ss, uint64_t* dst, int64_t ds) { TileByElement(src, ss, dst, ds, 8, 8); }

// 16 x 16 bytes: whole 16-byte lines loaded and stored (an 8 x 8 byte tile moves 8 bytes per access).
__attribute__((target("avx2"))) void Tile16x16(const uint8_t* src, int64_t ss, uint8_t* dst, int64_t ds) {
  __m128i r[16], a[16], b[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * ss));
  for (int i = 0; i < 16; i += 2) {  // pairs of rows: columns 0-7 and 8-15
    a[i] = _mm_unpacklo_epi8(r[i], r[i + 1]);
    a[i + 1] = _mm_unpackhi_epi8(r[i], r[i + 1]);
  }
  for (int q = 0; q < 16; q += 4) {  // quads of rows: columns 0-3, 4-7, 8-11, 12-15
    b[q] = _mm_unpacklo_epi16(a[q], a[q + 2]);
    b[q + 1] = _mm_unpackhi_epi16(a[q], a[q + 2]);
    b[q + 2] = _mm_unpacklo_epi16(a[q + 1], a[q + 3]);
    b[q + 3] = _mm_unpackhi_epi16(a[q + 1], a[q + 3]);
  }
  for (int h = 0; h < 16; h += 8)  // rows 0-7 (h 0) and 8-15 (h 8): column pairs 2j, 2j + 1 in r[h + j]
    for (int g = 0; g < 4; ++g) {
      r[h + 2 * g] = _mm_unpacklo_epi32(b[h + g], b[h + 4 + g]);
      r[h + 2 * g + 1] = _mm_unpackhi_epi32(b[h + g], b[h + 4 + g]);
    }
  for (int j = 0; j < 8; ++j) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * j * ds), _mm_unpacklo_epi64(r[j], r[8 + j]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (2 * j + 1) * ds), _mm_unpackhi_epi64(r[j], r[8 + j]));
  }
}

// 8 rows of 16 halves: per 128-bit lane the 8 x 8 network of the 16-bit Tile8x8, so out[k] holds column k of the
// rows in its low lane and column 8 + k in its high lane.
__attribute__((target("avx2"), always_inline)) inline void HalfRows8(const uint16_t* src, int64_t ss, __m256i out[8]) {
  __m256i r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i * ss));
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi16(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi16(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_unpacklo_epi32(t[i], t[i + 2]);
    r[i + 1] = _mm256_unpackhi_epi32(t[i], t[i + 2]);
    r[i + 2] = _mm256_unpacklo_epi32(t[i + 1], t[i + 3]);
    r[i + 3] = _mm256_unpackhi_epi32(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = _mm256_unpacklo_epi64(r[i], r[i + 4]);
    out[2 * i + 1] = _mm256_unpackhi_epi64(r[i], r[i + 4]);
  }
}

// 16 x 16 halves: 32-byte lines loaded and stored (the 8 x 8 tile moves 16 bytes per access).
__attribute__((target("avx2"))) void Tile16x16(const uint16_t* src, int64_t ss, uint16_t* dst, int64_t ds) {
  __m256i a[8], b[8];
  HalfRows8(src, ss, a);
  HalfRows8(src + 8 * ss, ss, b);
  for (int k = 0; k < 8; ++k) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k * ds), _mm256_permute2x128_si256(a[k], b[k], 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (8 + k) * ds), _mm256_permute2x128_si256(a[k], b[k], 0x31));
  }
}

// One cache tile with 8 x 8 register tiles where they fit, element copies at its tails.
template <typename T>
__attribute__((target("avx2"))) void TileSimd(const T* src, int64_t ss, T* dst, int64_t ds, int64_t bn, int64_t bm) {
  const int64_t n8 = bn & ~int64_t{7}, m8 = bm & ~int64_t{7};
  for (int64_t n = 0; n < n8; n += 8)
    for (int64_t m = 0; m < m8; m += 8) Tile8x8(src + n * ss + m, ss, dst + m * ds + n, ds);
  if (m8 < bm) TileByElement(src + m8, ss, dst + m8 * ds, ds, bn, bm - m8);
  if (n8 < bn) TileByElement(src + n8 * ss, ss, dst + n8, ds, bn - n8, m8);
}

// Bytes and halves: 16 x 16 register tiles where they fit, the 8 x 8 tiles and element copies at the tails.
template <typename T>
__attribute__((target("avx2"))) void TileSimd16(const T* src, int64_t ss, T* dst, int64_t ds, int64_t bn, int64_t bm) {
  const int64_t n16 = bn & ~int64_t{15}, m16 = bm & ~int64_t{15};
  if (n16 == 0 || m16 == 0) return TileSimd<T>(src, ss, dst, ds, bn, bm);
  for (int64_t n = 0; n < n16; n += 16)
    for (int64_t m = 0; m < m16; m += 16) Tile16x16(src + n * ss + m, ss, dst + m * ds + n, ds);
  if (m16 < bm) TileSimd<T>(src + m16, ss, dst + m16 * ds, ds, bn, bm - m16);
  if (n16 < bn) TileSimd<T>(src + n16 * ss, ss, dst + n16, ds, bn - n16, m16);
}
#endif

// The 2-D transpose of rows [n0, n1) of an N x M block: src(n, m) = src[n * ss + m] -> dst[m * ds + n]. A block
// that stays in cache is walked in strips of 8 columns, each filling 8 output rows front to back (MLAS's order); a
// larger one in strips of 8 input rows read front to back, whose partial output lines the next strip completes
// while they are still in cache (column strips there read each input line once per strip from memory).
template <typename T>
void Block(const T* src, int64_t ss, T* dst, int64_t ds, int64_t n0, int64_t n1, int64_t m_total, bool simd,
           bool by_columns) {
  auto tile = [&](const T* s, T* d, int64_t bn, int64_t bm) {
#if NPU_EP_X86
    if constexpr (sizeof(T) <= 2) {
      if (simd) return TileSimd16(s, ss, d, ds, bn, bm);
    } else {
      if (simd) return TileSimd(s, ss, d, ds, bn, bm);
    }
#endif
    (void)simd;
    TileByElement(s, ss, d, ds, bn, bm);
  };
  if (by_columns) {
    for (int64_t m = 0; m < m_total; m += kStrip<T>)
      tile(src + n0 * ss + m, dst + m * ds + n0, n1 - n0, std::min(kStrip<T>, m_total - m));
    return;
  }
  for (int64_t n = n0; n < n1; n += kStrip<T>) tile(src + n * ss, dst + n, std::min(kStrip<T>, n1 - n), m_total);
}

struct Copy {
  Reduced r;
  const char* src;
  char* dst;
  size_t item;
  int threads;
};

// The innermost axis stays innermost: one memcpy per run of it.
void CopyRuns(const Copy& c) {
  const size_t rank = c.r.dims.size();
  const int64_t run = c.r.dims[rank - 1];
  SmallDims in_strides(rank, 1);
  for (size_t i = rank - 1; i-- > 0;) in_strides[i] = in_strides[i + 1] * c.r.dims[i + 1];
  Outer outer;
  for (size_t i = 0; i + 1 < rank; ++i) {
    outer.dims.push_back(c.r.dims[static_cast<size_t>(c.r.perm[i])]);
    outer.in_strides.push_back(in_strides[static_cast<size_t>(c.r.perm[i])]);
    outer.count *= outer.dims.back();
  }
  outer.out_strides.assign(outer.dims.size(), run);
  for (size_t i = outer.dims.size() - 1; i-- > 0;) outer.out_strides[i] = outer.out_strides[i + 1] * outer.dims[i + 1];
  const size_t bytes = static_cast<size_t>(run) * c.item;
  const int64_t per_task = std::max<int64_t>(1, kTaskBytes / static_cast<int64_t>(bytes));
  const int64_t tasks = (outer.count + per_task - 1) / per_task;
  ParallelFor(ThreadsFor(c.threads, outer.count * run), tasks, [&](int64_t t) {
    for (int64_t o = t * per_task; o < std::min(outer.count, (t + 1) * per_task); ++o) {
      int64_t in, out;
      outer.Offsets(o, in, out);
      std::memcpy(c.dst + out * static_cast<int64_t>(c.item), c.src + in * static_cast<int64_t>(c.item), bytes);
    }
  });
}

// The innermost axes differ: the input's innermost axis (output axis b) against the output's innermost axis (input
// axis a), a blocked 2-D transpose per index of the other axes.
template <typename T>
void Transpose2D(const Copy& c) {
  const size_t rank = c.r.dims.size();
  SmallDims in_strides(rank, 1), out_dims(rank), out_strides(rank, 1);
  for (size_t i = rank - 1; i-- > 0;) in_strides[i] = in_strides[i + 1] * c.r.dims[i + 1];
  for (size_t i = 0; i < rank; ++i) out_dims[i] = c.r.dims[static_cast<size_t>(c.r.perm[i])];
  for (size_t i = rank - 1; i-- > 0;) out_strides[i] = out_strides[i + 1] * out_dims[i + 1];
  const auto a = static_cast<size_t>(c.r.perm[rank - 1]);
  size_t b = 0;
  Outer outer;
  for (size_t i = 0; i < rank; ++i) {
    const auto in_axis = static_cast<size_t>(c.r.perm[i]);
    if (in_axis == rank - 1) b = i;
    if (in_axis == rank - 1 || i == rank - 1) continue;
    outer.dims.push_back(out_dims[i]);
    outer.in_strides.push_back(in_strides[in_axis]);
    outer.out_strides.push_back(out_strides[i]);
    outer.count *= out_dims[i];
  }
  const int64_t n_total = c.r.dims[a], m_total = c.r.dims[rank - 1], ss = in_strides[a], ds = out_strides[b];
  const int64_t rows_per_task =
      std::max<int64_t>(kStrip<T>, (kTaskBytes / static_cast<int64_t>(sizeof(T)) / std::max<int64_t>(m_total, 1)) /
                                       kStrip<T> * kStrip<T>);
  const int64_t row_tasks = (n_total + rows_per_task - 1) / rows_per_task;
  const auto* src = reinterpret_cast<const T*>(c.src);
  auto* dst = reinterpret_cast<T*>(c.dst);
  const bool simd = ActiveIsa() >= Isa::kAvx2;
  const bool by_columns = n_total * m_total * static_cast<int64_t>(sizeof(T)) <= kCachedBytes;
  ParallelFor(ThreadsFor(c.threads, outer.count * n_total * m_total), outer.count * row_tasks, [&](int64_t t) {
    const int64_t o = t / row_tasks, n0 = (t % row_tasks) * rows_per_task;
    int64_t in, out;
    outer.Offsets(o, in, out);
    Block(src + in, ss, dst + out, ds, n0, std::min(n_total, n0 + rows_per_task), m_total, simd, by_columns);
  });
}

SmallDims CheckedPerm(const py::array& x, const py::object& perm_in) {
  const auto rank = static_cast<int64_t>(x.ndim());
  SmallDims perm;
  if (perm_in.is_none()) {
    for (int64_t i = rank; i-- > 0;) perm.push_back(i);  // numpy's and ONNX's default: the axes reversed
    return perm;
  }
  perm = IntsOf<SmallDims>(perm_in);
  bool seen[kMaxAxes] = {};
  bool ok = static_cast<int64_t>(perm.size()) == rank;
  for (int64_t& p : perm) {
    if (p < 0) p += rank;
    ok = ok && p >= 0 && p < rank && !seen[static_cast<size_t>(p)];
    if (ok) seen[static_cast<size_t>(p)] = true;
  }
  if (!ok)
    throw std::invalid_argument("transpose: perm " + DimsText(perm_in.cast<std::vector<int64_t>>()) +
                                " is not a permutation of the axes of shape " + DimsText(SmallDimsOf(x)));
  return perm;
}

py::array TransposePy(const py::object& x_in, const py::object& perm_in, const py::object& out, int threads) {
  const py::array x = MovableInput("transpose", x_in);
  const SmallDims perm = CheckedPerm(x, perm_in), dims = SmallDimsOf(x);
  SmallDims out_dims(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) out_dims[i] = dims[static_cast<size_t>(perm[i])];
  py::array y = MovementResult("transpose", x.dtype(), out_dims.data(), out_dims.size(), out);
  if (x.size() == 0) return y;
  Copy c{Reduce(dims, perm), static_cast<const char*>(x.data()), static_cast<char*>(y.mutable_data()),
         static_cast<size_t>(x.itemsize()), threads};
  const size_t rank = c.r.dims.size();
  auto copy = [&] {
    if (rank <= 1)
      std::memcpy(c.dst, c.src, static_cast<size_t>(x.nbytes()));
    else if (c.r.perm[rank - 1] == static_cast<int64_t>(rank) - 1)
      CopyRuns(c);
    else
      ForItemSize(c.item, [&](auto t) { Transpose2D<decltype(t)>(c); });
  };
  RunMoving(static_cast<size_t>(x.nbytes()), copy);
  return y;
}

}  // namespace

void BindTranspose(py::module_& m) {
  m.def("transpose", &TransposePy, py::arg("x"), py::arg("perm") = py::none(), py::arg("out") = py::none(),
        py::arg("threads") = 1,
        "numpy's transpose(x, perm) (perm None: the axes reversed) as a C-order array, into out (ORT's buffer) or a "
        "new array; any dtype of 1, 2, 4 or 8 bytes, bits moved");
}

}  // namespace npu_ep::kern
