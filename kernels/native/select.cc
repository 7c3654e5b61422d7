// TopK over one axis (`kernels.topk`) and CumSum along one axis (`kernels.cumsum`, below), for kernels/ops/select.py.
// x is viewed as [outer, n, inner]; a column (inner > 1) is gathered into a row first.
// TopK: the k best of each row by value (largest or smallest), equal values by ascending index, NaN after every
// number (the reference's stable argsort: NaN sorts last either way): up to k 32 a sorted insertion list, blocks of 16
// compared with the list's last at once (one mask: AVX-512 compares) and only their beaters inserted, above it a heap
// selection (std::partial_sort over the row's indices); the values are the input's own bits, the indices int64.
// Exact.
#if !defined(__clang__)  // clang vectorizes at -O2 and warns on the GCC pragma
#pragma GCC optimize("O3")  // the scalar block compare and CumSum's loops
#endif
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu.h"
#include "half.h"
#include "intrinsics.h"
#include "movement.h"
#include "ordered_dtypes.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

constexpr int64_t kTaskElems = 32768;

// Whether a ranks before b (values va, vb at indices a < b or not): the better value, then the lower index; NaN
// after every number.
template <bool Largest, typename A>
inline bool Before(A va, A vb, int64_t a, int64_t b) {
  const bool na = va != va, nb = vb != vb;
  if (na || nb) return na == nb ? a < b : nb;
  if (va != vb) return Largest ? va > vb : va < vb;
  return a < b;
}

constexpr int64_t kSmallK = 32;  // up to this k, an insertion list beats a heap over index order

// The first k (<= kSmallK) of row[0, n) in rank order into order[0, k): a sorted list of the k best so far; an
// element that does not beat the list's last (one comparison while that is a number: a NaN never beats one, an
// equal value comes later) is passed over, the rest are inserted. Once the list is full, a block of kBlock elements
// is compared with the list's last at once: only the ones beating it (a mask) are looked at, each against the
// list's last as it is then (the last only gets better, so the others cannot beat it).
constexpr int64_t kBlock = 16;

// The bits of the elements of x[0, kBlock) that beat `worst` (a number), element i at bit i.
template <bool Largest, typename A>
inline uint32_t BeatersScalar(const A* x, A worst) {
  uint32_t m = 0;
  for (int64_t i = 0; i < kBlock; ++i) m |= static_cast<uint32_t>(Largest ? x[i] > worst : x[i] < worst) << i;
  return m;
}

#if NPU_EP_X86
// The same in one or two vector compares (A: float, int32, int64, int8 or uint8: the dtypes TopK takes).
template <bool Largest, typename A>
__attribute__((target("avx512f,avx512bw,avx512vl"))) uint32_t BeatersAvx512(const A* x, A worst) {
  if constexpr (std::is_same_v<A, float>) {
    return _mm512_cmp_ps_mask(_mm512_loadu_ps(x), _mm512_set1_ps(worst), Largest ? _CMP_GT_OQ : _CMP_LT_OQ);
  } else if constexpr (std::is_same_v<A, int32_t>) {
    const __m512i v = _mm512_loadu_si512(x), w = _mm512_set1_epi32(worst);
    return Largest ? _mm512_cmpgt_epi32_mask(v, w) : _mm512_cmplt_epi32_mask(v, w);
  } else if constexpr (std::is_same_v<A, int64_t>) {
    const __m512i lo = _mm512_loadu_si512(x), hi = _mm512_loadu_si512(x + 8), w = _mm512_set1_epi64(worst);
    return Largest ? _mm512_cmpgt_epi64_mask(lo, w) | (uint32_t{_mm512_cmpgt_epi64_mask(hi, w)} << 8)
                   : _mm512_cmplt_epi64_mask(lo, w) | (uint32_t{_mm512_cmplt_epi64_mask(hi, w)} << 8);
  } else if constexpr (std::is_same_v<A, int8_t>) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x)), w = _mm_set1_epi8(worst);
    return Largest ? _mm_cmpgt_epi8_mask(v, w) : _mm_cmplt_epi8_mask(v, w);
  } else if constexpr (std::is_same_v<A, uint8_t>) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x)), w = _mm_set1_epi8(static_cast<char>(worst));
    return Largest ? _mm_cmpgt_epu8_mask(v, w) : _mm_cmplt_epu8_mask(v, w);
  } else {
    return BeatersScalar<Largest>(x, worst);
  }
}
#endif

template <bool Largest, typename A>
inline uint32_t Beaters(const A* x, A worst, bool avx512) {
#if NPU_EP_X86
  if (avx512) return BeatersAvx512<Largest>(x, worst);
#endif
  (void)avx512;
  return BeatersScalar<Largest>(x, worst);
}

// Puts v (index j) into the sorted list best/order at `pos` or before it, shifting the later ones down.
template <bool Largest, typename A>
inline void Insert(A* best, int64_t* order, int64_t pos, A v, int64_t j) {
  for (; pos > 0 && Before<Largest>(v, best[pos - 1], j, order[pos - 1]); --pos) {
    best[pos] = best[pos - 1];
    order[pos] = order[pos - 1];
  }
  best[pos] = v;
  order[pos] = j;
}

// Insert for a list of numbers and a number v with a later index than all of them: v goes before each it beats.
template <bool Largest, typename A>
inline void InsertNumber(A* best, int64_t* order, int64_t pos, A v, int64_t j) {
  for (; pos > 0 && (Largest ? v > best[pos - 1] : v < best[pos - 1]); --pos) {
    best[pos] = best[pos - 1];
    order[pos] = order[pos - 1];
  }
  best[pos] = v;
  order[pos] = j;
}

template <bool Largest, typename A>
void SelectSmallK(const A* row, int64_t n, int64_t k, int64_t* order, bool avx512) {
  A best[kSmallK];
  int64_t j = 0;
  for (; j < std::min(n, k); ++j) Insert<Largest>(best, order, j, row[j], j);
  for (; j < n; ++j) {
    const A worst = best[k - 1];
    if (worst == worst) {  // a number: a block's candidates by its mask
      if (j % kBlock == 0 && j + kBlock <= n) {
        for (uint32_t m = Beaters<Largest>(row + j, worst, avx512); m != 0; m &= m - 1) {
          const int64_t i = j + __builtin_ctz(m);
          const A v = row[i], last = best[k - 1];
          if (Largest ? v > last : v < last) InsertNumber<Largest>(best, order, k - 1, v, i);
        }
        j += kBlock - 1;
        continue;
      }
      if (Largest ? row[j] > worst : row[j] < worst) InsertNumber<Largest>(best, order, k - 1, row[j], j);
    } else if (Before<Largest>(row[j], worst, j, order[k - 1])) {
      Insert<Largest>(best, order, k - 1, row[j], j);
    }
  }
}

// The first k indices of row[0, n) in rank order into order[0, k) (order: scratch of n).
template <bool Largest, typename A>
void SelectRow(const A* row, int64_t n, int64_t k, int64_t* order, bool avx512) {
  if (k == 0) return;
  if (k <= kSmallK) return SelectSmallK<Largest>(row, n, k, order, avx512);
  std::iota(order, order + n, int64_t{0});
  auto before = [row](int64_t a, int64_t b) { return Before<Largest>(row[a], row[b], a, b); };
  if (k < n)
    std::partial_sort(order, order + k, order + n, before);
  else
    std::sort(order, order + n, before);
}

template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, uint16_t>, float, T>;

template <typename T>
void TopKView(const T* x, int64_t outer, int64_t n, int64_t inner, int64_t k, bool largest, int threads, T* values,
              int64_t* indices) {
  using A = Acc<T>;
  const int64_t lines = outer * inner, per_task = std::max<int64_t>(1, kTaskElems / n);
  const bool avx512 = ActiveIsa() >= Isa::kAvx512;
  ParallelFor(ThreadsFor(threads, lines * n), (lines + per_task - 1) / per_task, [&](int64_t t) {
    std::vector<A> row(std::is_same_v<T, A> ? 0 : n);
    std::vector<T> raw(inner > 1 ? n : 0);
    std::vector<int64_t> order(n);
    for (int64_t line = t * per_task; line < std::min(lines, (t + 1) * per_task); ++line) {
      const int64_t o = line / inner, c = line % inner;
      const T* src = x + o * n * inner + c;
      if (inner > 1) {
        for (int64_t j = 0; j < n; ++j) raw[j] = src[j * inner];
        src = raw.data();
      }
      const A* values_of = reinterpret_cast<const A*>(src);  // T is A but for float16
      if constexpr (std::is_same_v<T, uint16_t>) {
        HalfToFloatRow(src, row.data(), n);
        values_of = row.data();
      }
      (largest ? SelectRow<true, A> : SelectRow<false, A>)(values_of, n, k, order.data(), avx512);
      const int64_t at = o * k * inner + c;
      for (int64_t j = 0; j < k; ++j) {
        values[at + j * inner] = src[order[j]];
        indices[at + j * inner] = order[j];
      }
    }
  });
}

// `out` when given (ORT's buffer: a writeable C-order array of `dtype` and `size` elements), else a new [outer, k,
// inner] array.
py::array TopKOutput(const char* what, const py::dtype& dtype, int64_t outer, int64_t k, int64_t inner,
                     const py::object& out) {
  if (out.is_none()) return py::array(dtype, std::vector<py::ssize_t>{outer, k, inner});
  const auto y = py::reinterpret_borrow<py::array>(py::isinstance<py::array>(out) ? py::handle(out) : py::handle());
  if (!y || !y.dtype().equal(dtype) || !(y.flags() & py::array::c_style) || !y.writeable() ||
      y.size() != outer * k * inner)
    throw std::invalid_argument(std::string("topk: ") + what + " must be a writeable C-order " +
                                std::string(py::str(dtype)) + " array of " + std::to_string(outer * k * inner) +
                                " elements");
  return y;
}

py::tuple TopKPy(const py::array& x, int64_t outer, int64_t n, int64_t inner, int64_t k, bool largest, int threads,
                 const py::object& values_out, const py::object& indices_out) {
  const py::dtype dt = x.dtype();
  if (!(x.flags() & py::array::c_style) || outer < 0 || n <= 0 || inner <= 0 || k < 0 || k > n ||
      outer * n * inner != static_cast<int64_t>(x.size()))
    throw std::invalid_argument("topk: x (" + std::string(py::str(dt)) + ", " + std::to_string(x.size()) +
                                " elements) must be C-contiguous, [outer, n, inner] = [" + std::to_string(outer) +
                                ", " + std::to_string(n) + ", " + std::to_string(inner) + "] cover it and 0 <= k " +
                                std::to_string(k) + " <= n");
  py::array values = TopKOutput("values_out", dt, outer, k, inner, values_out);
  py::array indices = TopKOutput("indices_out", py::dtype::of<int64_t>(), outer, k, inner, indices_out);
  const void* src = x.data();
  void* dst = values.mutable_data();
  auto* idx = static_cast<int64_t*>(indices.mutable_data());
  auto run = [&](auto* typed) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(typed)>>;
    RunMoving(static_cast<size_t>(x.nbytes()), [&] {
      if (k > 0) TopKView<T>(typed, outer, n, inner, k, largest, threads, static_cast<T*>(dst), idx);
    });
  };
  ForOrderedDtype(dt, src, true, "topk", run);
  return py::make_tuple(values, indices);
}

// --- CumSum ---------------------------------------------------------------------------------------------------------
// Sequential sums along n (from the end with `reverse`), each output the sum up to and including its element (before
// it with `exclusive`: the first is 0), as the reference's add.accumulate: float32 in float32 (its bits), float16
// accumulated in float32 and rounded once per output (its bits: the reference's float32 cumsum and astype), int32 and
// int64 wrapping (two's complement, as numpy and ORT). Rows (inner 1) one at a time; columns (inner > 1) in blocks of
// 256 walked down the n rows.

template <typename A>
inline A Add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

constexpr int64_t kScanColumns = 256;

template <typename T>
void Widen(const T* s, Acc<T>* d, int64_t len) {
  if constexpr (std::is_same_v<T, uint16_t>)
    HalfToFloatRow(s, d, len);
  else
    std::copy(s, s + len, d);
}

template <typename T>
void Narrow(const Acc<T>* s, T* d, int64_t len) {
  if constexpr (std::is_same_v<T, uint16_t>)
    FloatToHalfRow(s, d, len);
  else
    std::copy(s, s + len, d);
}

// One [n, len] block (rows `stride` apart) of x scanned down its rows into y; `in`, `sum`, `out`: scratch of len.
template <typename T>
void ScanBlock(const T* x, int64_t n, int64_t stride, int64_t len, bool exclusive, bool reverse, Acc<T>* in,
               Acc<T>* sum, Acc<T>* out, T* y) {
  for (int64_t t = 0; t < n; ++t) {
    const int64_t r = reverse ? n - 1 - t : t;
    Widen(x + r * stride, in, len);
    for (int64_t c = 0; c < len; ++c) {
      const Acc<T> before = t == 0 ? Acc<T>{0} : sum[c];
      sum[c] = t == 0 ? in[c] : Add(sum[c], in[c]);
      out[c] = exclusive ? before : sum[c];
    }
    Narrow(out, y + r * stride, len);
  }
}

// One row's scan (n >= 1): the first element as it is (its sign of zero kept, as the reference's copy), then
// running sums; Exclusive: each output the sum before it (the first 0); Reverse: from the end.
template <bool Exclusive, bool Reverse, typename A>
void ScanRow(const A* x, int64_t n, A* y) {
  const int64_t first = Reverse ? n - 1 : 0, step = Reverse ? -1 : 1;
  A sum = x[first];
  y[first] = Exclusive ? A{0} : sum;
  for (int64_t i = 1, j = first + step; i < n; ++i, j += step) {
    const A next = Add(sum, x[j]);
    y[j] = Exclusive ? sum : next;
    sum = next;
  }
}

template <typename A>
using ScanRowFn = void (*)(const A*, int64_t, A*);

template <typename T>
void CumSumView(const T* x, int64_t outer, int64_t n, int64_t inner, bool exclusive, bool reverse, int threads, T* y) {
  using A = Acc<T>;
  if (inner == 1) {  // rows: float16 widened into `in`, scanned into `out`, narrowed; the other types in place
    static constexpr ScanRowFn<A> kRows[4] = {ScanRow<false, false, A>, ScanRow<false, true, A>,
                                              ScanRow<true, false, A>, ScanRow<true, true, A>};
    const ScanRowFn<A> scan = kRows[(exclusive ? 2 : 0) + (reverse ? 1 : 0)];
    const int64_t per_task = std::max<int64_t>(1, kTaskElems / n);
    ParallelFor(ThreadsFor(threads, outer * n), (outer + per_task - 1) / per_task, [&](int64_t t) {
      std::vector<A> in(std::is_same_v<T, A> ? 0 : n), out(in.size());
      for (int64_t r = t * per_task; r < std::min(outer, (t + 1) * per_task); ++r) {
        if constexpr (std::is_same_v<T, A>) {
          scan(x + r * n, n, y + r * n);
        } else {
          Widen(x + r * n, in.data(), n);
          scan(in.data(), n, out.data());
          Narrow(out.data(), y + r * n, n);
        }
      }
    });
    return;
  }
  const int64_t blocks = (inner + kScanColumns - 1) / kScanColumns;
  ParallelFor(ThreadsFor(threads, outer * n * inner), outer * blocks, [&](int64_t t) {
    const int64_t o = t / blocks, c = (t % blocks) * kScanColumns, len = std::min(kScanColumns, inner - c);
    A in[kScanColumns], sum[kScanColumns], out[kScanColumns];
    const int64_t at = o * n * inner + c;
    ScanBlock(x + at, n, inner, len, exclusive, reverse, in, sum, out, y + at);
  });
}

py::array CumSumPy(const py::array& x, int64_t outer, int64_t n, int64_t inner, bool exclusive, bool reverse,
                   int threads) {
  const py::dtype dt = x.dtype();
  if (!(x.flags() & py::array::c_style) || outer < 0 || n <= 0 || inner <= 0 ||
      outer * n * inner != static_cast<int64_t>(x.size()))
    throw std::invalid_argument("cumsum: x (" + std::string(py::str(dt)) + ", " + std::to_string(x.size()) +
                                " elements) must be C-contiguous and [outer, n, inner] = [" + std::to_string(outer) +
                                ", " + std::to_string(n) + ", " + std::to_string(inner) + "] cover it, n >= 1");
  py::array y(dt, std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  const void* src = x.data();
  void* dst = y.mutable_data();
  auto run = [&](auto* typed) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(typed)>>;
    py::gil_scoped_release release;
    CumSumView<T>(typed, outer, n, inner, exclusive, reverse, threads, static_cast<T*>(dst));
  };
  ForOrderedDtype(dt, src, false, "cumsum", run);
  return y;
}

}  // namespace

void BindSelect(py::module_& m) {
  m.def("cumsum", &CumSumPy, py::arg("x"), py::arg("outer"), py::arg("n"), py::arg("inner"),
        py::arg("exclusive") = false, py::arg("reverse") = false, py::arg("threads") = 1,
        "CumSum of C-contiguous float32/float16/int32/int64 x viewed as [outer, n, inner] along n, in x's shape: "
        "sequential float32 sums (float16: rounded once per output), wrapping integer sums; the reference's bits");
  m.def("topk", &TopKPy, py::arg("x"), py::arg("outer"), py::arg("n"), py::arg("inner"), py::arg("k"),
        py::arg("largest") = true, py::arg("threads") = 1, py::arg("values_out") = py::none(),
        py::arg("indices_out") = py::none(),
        "(values [outer, k, inner] of x's dtype, int64 indices) of the k largest (smallest) of C-contiguous x viewed "
        "as [outer, n, inner] over n, sorted, equal values by ascending index, NaN after every number; into "
        "values_out/indices_out (ORT's buffers: C-order, of outer * k * inner elements, returned as they are) when "
        "given");
}

}  // namespace npu_ep::kern
