// npu::AttentionChain's native kernel (`kernels.attention_chain`): an exported graph's materialized attention,
// Y = softmax(Q K^T [* or / c] [+ mask]) V over the last axis, without the [S, T] scores in memory.
// kernels/fusion/attention.py forms the node; the numpy chain in kernels/ops/attention_chain.py is the reference.
//
// Each task takes query rows of one (batch, head) and runs GroupQueryAttention's inner loops on them
// (gqa_internal.h: scores, exp with the row sum, P V divided by the sum), kRows rows per pass over K and V. The
// order of operations is the chain's: the dot product, then the scale (one rounding), then the mask (another), then
// the softmax; rows holding a NaN or an infinite maximum come out NaN, as the chain's Softmax makes them (or their
// probabilities 0, as the exporters' Where(IsNaN(p), 0, p) guard makes them; or, for ONNX Attention and
// com.microsoft's attention ops, zeros where every score is -inf, as ORT's kernels). Only the
// summation orders differ from the reference's BLAS products and numpy reductions (float tolerance, not bits).
// Whether K is transposed for the pass depends only on S, and a row's result not on the task holding it, so the
// bits do not depend on the thread count.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "as_array.h"
#include "bindings.h"
#include "cpu.h"
#include "gqa_internal.h"
#include "intrinsics.h"
#include "sdpa.h"
#include "thread_pool.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")  // scale then mask: two roundings, as the chain's Mul and Add
#endif

namespace py = pybind11;

namespace npu_ep::kern {
namespace {

using gqa::kRows;
constexpr int64_t kTransposeRows = 16;   // from this many query rows on, K is transposed once per task

// A float32 operand right-aligned to 4 dims, strides in elements (0 along broadcast dims). K and V may hold each of
// their heads for `group` query heads (a repeat_kv not materialized): query head n reads head n / group.
struct Operand {
  const float* data = nullptr;
  int64_t dims[4] = {1, 1, 1, 1};
  int64_t strides[4] = {0, 0, 0, 0};
  int64_t group = 1;
  const float* At(int64_t b, int64_t n) const { return data + b * strides[0] + n / group * strides[1]; }
  int64_t Heads() const { return dims[1] * group; }  // the query heads it serves (1: broadcast)
};

Operand Wrap(const py::array& a, const char* name) {
  if (a.dtype().kind() != 'f' || a.itemsize() != 4 || a.ndim() < 2 || a.ndim() > 4)
    throw std::invalid_argument(std::string("attention_chain: ") + name +
                                " must be a float32 array of rank 2 to 4, got " + Dims(a) + " " +
                                std::string(py::str(a.dtype())));
  Operand o;
  o.data = static_cast<const float*>(a.data());
  const int pad = 4 - static_cast<int>(a.ndim());
  for (int i = 0; i < a.ndim(); ++i) {
    if (a.strides(i) % 4)
      throw std::invalid_argument(std::string("attention_chain: ") + name + " is not float-aligned");
    o.dims[pad + i] = a.shape(i);
    o.strides[pad + i] = a.shape(i) == 1 ? 0 : a.strides(i) / 4;
  }
  return o;
}

// row[j] = (row[j] [* or / c]) [+ mask[j * mj]] for j < n, two roundings as the chain's Mul and Add; returns the
// row's maximum, or NaN when the row holds a NaN. The vector version does the same operations lane by lane.
float ScaleMaskMax(float* row, int64_t n, int kind, float c, const float* mask, int64_t mj) {
  float m = -std::numeric_limits<float>::infinity();
  bool nan = false;
  for (int64_t j = 0; j < n; ++j) {
    float x = row[j];
    if (kind == 1) x *= c;
    if (kind == 2) x /= c;
    if (mask) x += mask[j * mj];
    row[j] = x;
    nan |= x != x;
    m = x > m ? x : m;
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

#if NPU_EP_X86
__attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"))) float ScaleMaskMax512(float* row, int64_t n,
                                                                                             int kind, float c,
                                                                                             const float* mask,
                                                                                             int64_t mj) {
  if (mask && mj != 1) return ScaleMaskMax(row, n, kind, c, mask, mj);
  const __m512 vc = _mm512_set1_ps(c);
  __m512 vm = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 nan = 0;
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 lanes = n - j >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - j)) - 1);
    __m512 x = _mm512_maskz_loadu_ps(lanes, row + j);
    if (kind == 1) x = _mm512_mul_ps(x, vc);
    if (kind == 2) x = _mm512_div_ps(x, vc);
    if (mask) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(lanes, mask + j));
    _mm512_mask_storeu_ps(row + j, lanes, x);
    nan |= _mm512_mask_cmp_ps_mask(lanes, x, x, _CMP_UNORD_Q);
    vm = _mm512_mask_max_ps(vm, lanes, vm, x);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(vm);
}
#endif

using RowPrologue = float (*)(float*, int64_t, int, float, const float*, int64_t);

RowPrologue SelectPrologue() {
#if NPU_EP_X86
  if (ActiveIsa() >= Isa::kAvx512) return ScaleMaskMax512;
#endif
  return ScaleMaskMax;
}

// The broadcast extent of one leading axis, or -1 when the operands disagree.
int64_t Lead(int axis, std::initializer_list<const Operand*> ops) {
  int64_t d = 1;
  for (const Operand* o : ops) {
    const int64_t x = axis == 1 ? o->Heads() : o->dims[axis];
    if (x == 1) continue;
    if (d != 1 && d != x) return -1;
    d = x;
  }
  return d;
}

struct Chain {
  Operand q, kt, v, mask;
  bool has_mask = false;
  int scale_kind = 0;  // 0 none, 1 multiply, 2 divide
  bool zero_nan_rows = false;     // Where(IsNaN(p), 0, p) after the Softmax
  bool masked_rows_zero = false;  // ORT's attention kernels: a row whose every score is -inf gives zeros
  float scale = 1.0f;
  int64_t L0 = 1, L1 = 1, S = 0, H = 0, T = 0, Hv = 0;
  float* out = nullptr;  // [L0, L1, S, Hv]
};

// Rows [s0, s1) of head (b, n) without the fused scores: kRows rows per pass over K and V.
void Task(const Chain& c, const gqa::Ops& ops, RowPrologue prologue, int64_t b, int64_t n, int64_t s0, int64_t s1) {
  const int64_t H = c.H, T = c.T, Hv = c.Hv, ld = std::max<int64_t>((T + 15) / 16 * 16, 16);
  const bool transposed = c.S >= kTransposeRows;
  thread_local std::vector<float> qbuf, sc, kbuf, vbuf;
  qbuf.resize(kRows * H);
  sc.resize(kRows * ld);
  const Operand& kt = c.kt;
  const float* k0 = kt.At(b, n);
  const int64_t ki = kt.strides[2], kj = kt.strides[3];  // element (i, j) of K^T: k0[i * ki + j * kj]
  const float* kuse;  // transposed: K^T rows of ld; else K rows of H
  int64_t ldk = ld;
  if (transposed && kj == 1) {
    kuse = k0, ldk = ki;
  } else if (!transposed && ki == 1 && kj == H) {
    kuse = k0;
  } else if (transposed) {
    kbuf.resize(H * ld);
#if NPU_EP_X86
    const bool tiles = ki == 1 && H % 16 == 0 && ActiveIsa() >= Isa::kAvx512;  // K rows: 16 x 16 register tiles
#endif
    for (int64_t jb = 0; jb < T; jb += 16) {  // 16 keys at a time: short runs on both sides
#if NPU_EP_X86
      if (tiles && jb + 16 <= T) {
        TransposeKeys16x512(k0 + jb * kj, kj, H, kbuf.data() + jb, ld);
        continue;
      }
#endif
      for (int64_t i = 0; i < H; ++i)
        for (int64_t j = jb; j < std::min(jb + 16, T); ++j) kbuf[i * ld + j] = k0[i * ki + j * kj];
    }
    kuse = kbuf.data();
  } else {
    kbuf.resize(T * H);
    for (int64_t j = 0; j < T; ++j)
      for (int64_t i = 0; i < H; ++i) kbuf[j * H + i] = k0[i * ki + j * kj];
    kuse = kbuf.data();
  }
  const float* v0 = c.v.At(b, n);
  const float* vuse = v0;
  if (c.v.strides[3] != 1 || c.v.strides[2] != Hv) {  // P V reads rows of Hv at a pitch of Hv
    vbuf.resize(T * Hv);
    for (int64_t j = 0; j < T; ++j)
      for (int64_t i = 0; i < Hv; ++i) vbuf[j * Hv + i] = v0[j * c.v.strides[2] + i * c.v.strides[3]];
    vuse = vbuf.data();
  }
  const float* q0 = c.q.At(b, n);
  const float* m0 = c.has_mask ? c.mask.At(b, n) : nullptr;
  float sums[kRows];
  float* orow[kRows];
  for (int64_t r0 = s0; r0 < s1; r0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, s1 - r0));
    for (int r = 0; r < rows; ++r) {
      orow[r] = c.out + (((b * c.L1 + n) * c.S) + r0 + r) * Hv;
      const float* qs = q0 + (r0 + r) * c.q.strides[2];
      if (c.q.strides[3] == 1) {
        std::memcpy(qbuf.data() + r * H, qs, H * sizeof(float));  // a strided copy loop was ~0.3 us of 8 x 64
      } else {
        for (int64_t i = 0; i < H; ++i) qbuf[r * H + i] = qs[i * c.q.strides[3]];
      }
    }
    if (transposed)
      ops.scores_t(qbuf.data(), rows, kuse, ldk, T, H, sc.data(), ld);
    else
      ops.scores(qbuf.data(), rows, kuse, T, H, sc.data(), ld);
    for (int r = 0; r < rows; ++r) {
      float* row = sc.data() + r * ld;
      const float* mr = m0 ? m0 + (r0 + r) * c.mask.strides[2] : nullptr;
      const float m = prologue(row, T, c.scale_kind, c.scale, mr, c.mask.strides[3]);
      if (std::isnan(m) || std::isinf(m)) {  // the chain's Softmax gives a NaN row: P V is NaN, or 0 P V guarded
        const bool zero = c.zero_nan_rows || (c.masked_rows_zero && m < 0.0f);
        std::fill(row, row + T, 0.0f);
        sums[r] = zero ? 1.0f : std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      sums[r] = ops.exp_sum(row, T, m);
    }
    ops.pv(sc.data(), rows, ld, vuse, T, Hv, sums, orow);
  }
}

#if NPU_EP_X86
// Rows [s0, s1) of head (b, n) with the fused scores (AVX-512), K transposed in panels: sdpa's PanelPass over passes
// of query rows (the same operations in the same order as Task's fused 4-row passes).
void FusedTask(const Chain& c, const gqa::Ops& ops, ScoresPrologue fused_scores, int64_t b, int64_t n, int64_t s0,
               int64_t s1) {
  const int64_t H = c.H, T = c.T, Hv = c.Hv, ld = std::max<int64_t>((T + 15) / 16 * 16, 16), pass = PassRows(T);
  const bool q_direct = c.q.strides[3] == 1;  // Q rows read where they are
  thread_local std::vector<float> qbuf, sc, kbuf, vbuf, acc;
  qbuf.resize(pass * H);
  sc.resize(pass * ld);
  acc.resize(pass * Hv);
  const float* k0 = c.kt.At(b, n);
  const int64_t ki = c.kt.strides[2], kj = c.kt.strides[3];  // element (i, j) of K^T: k0[i * ki + j * kj]
  kbuf.resize((T + kPanel - 1) / kPanel * kPanel * H);
  const bool tiles = ki == 1 && H % 16 == 0;  // K rows: 16 x 16 register tiles
  for (int64_t jb = 0; jb < T; jb += 16) {    // 16 keys at a time: short runs on both sides
    float* col = kbuf.data() + jb / kPanel * kPanel * H + jb % kPanel;  // key jb's channel 0
    if (tiles && jb + 16 <= T) {
      TransposeKeys16x512(k0 + jb * kj, kj, H, col, kPanel);
      continue;
    }
    for (int64_t i = 0; i < H; ++i)
      for (int64_t j = jb; j < std::min(jb + 16, T); ++j) col[i * kPanel + j - jb] = k0[i * ki + j * kj];
  }
  const float* v0 = c.v.At(b, n);
  PanelArgs p;
  p.kt = kbuf.data();
  p.v = v0;
  if (c.v.strides[3] != 1 || c.v.strides[2] != Hv) {  // P V reads rows of Hv at a pitch of Hv
    vbuf.resize(T * Hv);
    for (int64_t j = 0; j < T; ++j)
      for (int64_t i = 0; i < Hv; ++i) vbuf[j * Hv + i] = v0[j * c.v.strides[2] + i * c.v.strides[3]];
    p.v = vbuf.data();
  }
  p.h = H, p.hv = Hv, p.t = T, p.scale = c.scale_kind == 1 ? c.scale : 1.0f;
  p.ldb = c.mask.strides[2], p.nan_rows_zero = c.zero_nan_rows, p.masked_rows_zero = c.masked_rows_zero;
  const float* q0 = c.q.At(b, n);
  const float* m0 = c.has_mask ? c.mask.At(b, n) : nullptr;
  float* orow[kPassRows];
  p.out = orow;
  for (int64_t r0 = s0; r0 < s1; r0 += pass) {
    const int64_t rows = std::min(pass, s1 - r0);
    p.q = q_direct ? q0 + r0 * c.q.strides[2] : qbuf.data(), p.lq = q_direct ? c.q.strides[2] : H;
    for (int64_t r = 0; r < rows; ++r) {
      orow[r] = c.out + (((b * c.L1 + n) * c.S) + r0 + r) * Hv;
      const float* qs = q0 + (r0 + r) * c.q.strides[2];
      if (!q_direct)
        for (int64_t i = 0; i < H; ++i) qbuf[r * H + i] = qs[i * c.q.strides[3]];
    }
    p.bias = m0 ? m0 + r0 * c.mask.strides[2] : nullptr;
    PanelPass(p, rows, fused_scores, ops, sc.data(), ld, acc.data());
  }
}
#endif

py::array AttentionChainPy(const py::array& q, const py::array& kt, const py::array& v, const py::object& mask,
                           int scale_kind, float scale, int threads, bool zero_nan_rows, bool k_rows, int64_t k_group,
                           int64_t v_group, bool masked_rows_zero) {
  Chain c;
  c.q = Wrap(q, "q");
  c.kt = Wrap(kt, "kt");
  c.v = Wrap(v, "v");
  if (k_rows) {  // K given as rows [.., T, H]: K^T is the same memory with the last two axes swapped
    std::swap(c.kt.dims[2], c.kt.dims[3]);
    std::swap(c.kt.strides[2], c.kt.strides[3]);
  }
  if (k_group < 1 || v_group < 1) throw std::invalid_argument("attention_chain: head groups must be >= 1");
  c.kt.group = k_group;
  c.v.group = v_group;
  c.has_mask = !mask.is_none();
  py::array mask_arr = NullArray();
  if (c.has_mask) {
    mask_arr = mask.cast<py::array>();
    c.mask = Wrap(mask_arr, "mask");
  }
  if (scale_kind < 0 || scale_kind > 2) throw std::invalid_argument("attention_chain: scale_kind must be 0, 1 or 2");
  c.scale_kind = scale_kind;
  c.scale = scale;
  c.zero_nan_rows = zero_nan_rows;
  c.masked_rows_zero = masked_rows_zero;
  c.S = c.q.dims[2], c.H = c.q.dims[3], c.T = c.kt.dims[3], c.Hv = c.v.dims[3];
  const Operand* mk = c.has_mask ? &c.mask : &c.q;
  c.L0 = Lead(0, {&c.q, &c.kt, &c.v, mk});
  c.L1 = Lead(1, {&c.q, &c.kt, &c.v, mk});
  const bool mask_ok =
      !c.has_mask || ((c.mask.dims[2] == 1 || c.mask.dims[2] == c.S) && (c.mask.dims[3] == 1 || c.mask.dims[3] == c.T));
  if (c.kt.dims[2] != c.H || c.v.dims[2] != c.T || c.L0 < 0 || c.L1 < 0 || !mask_ok || c.T == 0)
    throw std::invalid_argument("attention_chain: shapes do not chain: q " + Dims(q) + ", kt " + Dims(kt) + ", v " +
                                Dims(v) + (c.has_mask ? ", mask " + Dims(mask_arr) : std::string()) +
                                " (q [.., S, H] @ kt [.., H, T] (+ mask [.., S, T]) @ v [.., T, Hv], T > 0)");
  std::vector<py::ssize_t> shape = {c.L0, c.L1, c.S, c.Hv};
  const int rank = std::max({q.ndim(), kt.ndim(), v.ndim(), c.has_mask ? mask_arr.ndim() : py::ssize_t{2}});
  py::array_t<float> y(shape);
  c.out = y.mutable_data();
  const int64_t heads = c.L0 * c.L1;
  if (heads > 0 && c.S > 0 && c.Hv > 0) {
    py::gil_scoped_release release;
    const gqa::Ops ops = gqa::SelectOps();
    const RowPrologue prologue = SelectPrologue();
    const ScoresPrologue fused_scores = SelectScoresPrologue();
    // sdpa's scores with the multiply and the mask in their epilogue (a divide keeps the separate prologue)
    [[maybe_unused]] const bool fused =
        fused_scores && c.S >= kTransposeRows && c.scale_kind != 2 && (!c.has_mask || c.mask.strides[3] == 1);
    const int used = ThreadsFor(threads, heads * c.S * c.T * (c.H + c.Hv));
    // Each row's result does not depend on the task holding it, so the split may follow the thread count: whole
    // heads (K transposed once per head) unless that leaves threads idle, then about two tasks per thread.
    const int64_t chunks = std::min(c.S, std::max<int64_t>(1, (2 * used + heads - 1) / heads));
    const int64_t rows = (c.S + chunks - 1) / chunks;
    ParallelFor(used, heads * chunks, [&](int64_t t) {
      const int64_t head = t / chunks, s0 = (t % chunks) * rows;
      if (s0 >= c.S) return;
#if NPU_EP_X86
      if (fused) return FusedTask(c, ops, fused_scores, head / c.L1, head % c.L1, s0, std::min(c.S, s0 + rows));
#endif
      Task(c, ops, prologue, head / c.L1, head % c.L1, s0, std::min(c.S, s0 + rows));
    });
  }
  return y.reshape(std::vector<py::ssize_t>(shape.begin() + (4 - rank), shape.end()));
}

}  // namespace

void BindAttentionChain(py::module_& m) {
  m.def("attention_chain", &AttentionChainPy, py::arg("q"), py::arg("kt"), py::arg("v"), py::arg("mask"),
        py::arg("scale_kind"), py::arg("scale"), py::arg("threads") = 1, py::arg("zero_nan_rows") = false,
        py::arg("k_rows") = false, py::arg("k_group") = 1, py::arg("v_group") = 1, py::arg("masked_rows_zero") = false,
        "softmax(q @ kt [* scale (scale_kind 1) | / scale (2)] [+ mask]) @ v over the last axis, float32 operands "
        "of rank 2 to 4 with numpy broadcasting of the leading dims (any strides), query rows in tasks "
        "on up to `threads` threads (the same bits at any count); the chain's order of roundings, its own "
        "summation order and exp: the reference's values within float tolerance; a row holding a NaN or an "
        "infinite maximum is NaN, or with zero_nan_rows its probabilities are 0 (the exporters' NaN guard); k_rows: "
        "kt is given as K [.., T, H]; k_group / v_group: each head of K / V serves that many query heads; "
        "masked_rows_zero: a row whose every score is -inf gives zeros, as ORT's attention kernels");
}

}  // namespace npu_ep::kern
