// Native LSTM, GRU and RNN (ONNX, layout 0 or 1, default activations) and com.microsoft DynamicQuantizeLSTM: the input
// projection X @ W^T + biases as one product over all time steps, then per step the products of h with R and the
// gate math, every direction in one call (the two directions of a bidirectional op on two threads), so a model's
// recurrence costs one Python call instead of a few numpy ones per step. The cells (LstmCell, GruCell, RnnCell)
// share the time loop (RunDirection) and the direction threading (RunDirections) and differ only in their products
// and gate math (16 AVX-512 lanes, or scalar).
// The numpy reference (kernels/ops/recurrent.py) is the specification: gate orders LSTM i, o, f, c and GRU z, r, h;
// `clip` bounds every gate's pre-activation. The products run on the packed float GEMM (packed_sgemm.h) with W^T
// and R^T packed once by the caller (numpy's BLAS is slow on one row of h at a time: PERF.md's executor
// history, session 22); its fixed order gives the same bits at any thread count.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "as_array.h"
#include "cpu.h"
#include "int8_gemm.h"
#include "intrinsics.h"
#include "packed_sgemm.h"
#include "quantize.h"
#include "recurrent_gates.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {

// The gate math rounds each operation as the reference model does: no a * b + c contracted into one FMA.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

namespace {

struct RecurrentShape {
  int64_t seq, batch, input, hidden, dirs;
};

// c[m, :n] = a[m, :k] @ B (+ bias[:n]) for B packed by pack_sgemm_b
void Product(const float* a, int64_t m, int64_t k, const float* packed, int64_t n, const float* bias, float* c,
             int threads) {
  const PackedSgemmArgs g{a, m, k, k, packed, n, c, n, bias, false};
  PackedSgemm(g, threads, nullptr, nullptr);
}

constexpr int64_t kReleaseGilWork = int64_t{1} << 16;  // multiply-adds per gate from which a call releases the GIL

// A step's product of h (few rows) with R^T: B's panels split among up to `threads` tasks from kStepSplitWork
// multiply-adds on (PackedSgemm gives a product under its 2^20 one thread, and an LSTM of hidden 384 then read all
// of R^T's 2.4 MB on one core every step). Each output's sums are the packed GEMM's at any split: the same bits.
constexpr int64_t kStepSplitWork = int64_t{1} << 17;

void StepProduct(const float* a, int64_t m, int64_t k, const float* packed, int64_t n, float* c, int threads) {
  const int64_t panels = (n + kSgemmPanel - 1) / kSgemmPanel;
  const int64_t tasks = std::min<int64_t>(threads, panels);
  if (tasks <= 1 || m * n * k < kStepSplitWork) return Product(a, m, k, packed, n, nullptr, c, threads);
  const int64_t per = (panels + tasks - 1) / tasks;
  ParallelFor(threads, tasks, [&](int64_t t) {
    const int64_t p0 = t * per, p1 = std::min(panels, p0 + per);
    if (p0 >= p1) return;
    const int64_t n0 = p0 * kSgemmPanel, n1 = std::min(n, p1 * kSgemmPanel);
    const PackedSgemmArgs g{a, m, k, k, packed + p0 * k * kSgemmPanel, n1 - n0, c + n0, n, nullptr, false};
    PackedSgemm(g, 1, nullptr, nullptr);
  });
}

// The time loop of every cell, one direction. cell.Recur(h_in, t) makes the step's products with R for every batch
// row (t[b]: the time index row b processes, -1 once its sequence has finished); cell.Row(b, t, h, y) the gates of
// one live row from its previous state h [H] into y [H] (the cell keeps any other state: LSTM's c). zero_finished:
// a finished row enters the next product as 0 (kernels/ops/recurrent_quant.py). h [batch, H] in/out; y rows written
// at y + (t * dirs) * batch * H (the caller offsets y by the direction).
template <typename Cell>
void RunDirection(const RecurrentShape& s, Cell& cell, const int64_t* lens, bool reverse, bool zero_finished, float* h,
                  float* y) {
  const int64_t H = s.hidden, B = s.batch;
  std::vector<int64_t> t(B);
  std::vector<float> h_in(zero_finished ? B * H : 0);
  for (int64_t step = 0; step < s.seq; ++step) {
    for (int64_t b = 0; b < B; ++b) t[b] = step >= lens[b] ? -1 : reverse ? lens[b] - 1 - step : step;
    const float* hp = h;
    if (zero_finished && step > 0) {
      for (int64_t b = 0; b < B; ++b) {
        const bool live = step - 1 < lens[b];
        std::copy(h + b * H, h + (b + 1) * H, h_in.data() + b * H);
        if (!live) std::fill(h_in.data() + b * H, h_in.data() + (b + 1) * H, 0.0f);
      }
      hp = h_in.data();
    }
    cell.Recur(hp, t.data());  // every batch entry (finished ones are ignored)
    for (int64_t b = 0; b < B; ++b) {
      if (t[b] < 0) continue;
      float* yb = y + (t[b] * s.dirs * B + b) * H;
      cell.Row(b, t[b], h + b * H, yb);
      std::copy(yb, yb + H, h + b * H);
    }
  }
}

// LSTM's gates (order i, o, f, c). xw [seq, batch, 4H] holds X's product, plus Wb + Rb when bias is null; product(h,
// g) writes the step's [batch, 4H] product with R into g; bias (DynamicQuantizeLSTM) is added after that product and
// the peepholes; c [batch, H] the cell state, in/out.
template <typename ProductFn>
class LstmCell {
 public:
  LstmCell(const RecurrentShape& s, const float* xw, ProductFn product, const float* peep, const float* bias,
           std::optional<float> clip, float* c)
      : B_(s.batch), H_(s.hidden), xw_(xw), product_(product), peep_(peep), bias_(bias), clip_(clip), c_(c),
        g_(s.batch * 4 * s.hidden) {}
  void Recur(const float* h, const int64_t*) { product_(h, g_.data()); }
  void Row(int64_t b, int64_t t, const float*, float* y) {
    const int64_t G = 4 * H_;
    const GateArgs args{xw_ + (t * B_ + b) * G, g_.data() + b * G,    peep_, bias_,
                        clip_.has_value(),      clip_.value_or(0.0f), H_};
#if NPU_EP_X86
    if (vector_) return GateRowAvx512(args, c_ + b * H_, y);
#endif
    GateRow(args, c_ + b * H_, y);
  }

 private:
  int64_t B_, H_;
  const float* xw_;
  ProductFn product_;
  const float *peep_, *bias_;
  std::optional<float> clip_;
  float* c_;
  std::vector<float> g_;
  bool vector_ = VectorGates();
};

// GRU's gates (order z, r, h): xw [seq, batch, 3H] = X @ W^T + (Wb + Rb for z and r, Wb for h); R_zr^T [H, 2H] and
// R_h^T [H, H] packed; rbh [H]. Without linear_before_reset the step's second product waits for the reset gate.
class GruCell {
 public:
  GruCell(const RecurrentShape& s, const float* xw, const float* rzr, const float* rh, const float* rbh,
          bool linear_before_reset, std::optional<float> clip, int threads)
      : B_(s.batch), H_(s.hidden), xw_(xw), rzr_(rzr), rh_(rh), rbh_(rbh), lbr_(linear_before_reset), clip_(clip),
        threads_(threads), gzr_(s.batch * 2 * s.hidden), gh_(s.batch * s.hidden),
        reset_(linear_before_reset ? 0 : s.batch * s.hidden) {}
  void Recur(const float* h, const int64_t* t) {
    StepProduct(h, B_, H_, rzr_, 2 * H_, gzr_.data(), threads_);
    if (!lbr_) {
      for (int64_t b = 0; b < B_; ++b) Reset(b, t[b], h + b * H_, reset_.data() + b * H_);
      h = reset_.data();
    }
    StepProduct(h, B_, H_, rh_, H_, gh_.data(), threads_);
  }
  void Row(int64_t b, int64_t t, const float* h, float* y) {
    const GruArgs a{xw_ + (t * B_ + b) * 3 * H_,
                    gzr_.data() + b * 2 * H_,
                    gh_.data() + b * H_,
                    rbh_,
                    h,
                    lbr_,
                    clip_.has_value(),
                    clip_.value_or(0.0f),
                    H_};
#if NPU_EP_X86
    if (vector_) return GruRowAvx512(a, y);
#endif
    GruRow(a, y);
  }

 private:
  // r * h of row b at time t (0 for a finished row: its product is ignored)
  void Reset(int64_t b, int64_t t, const float* h, float* out) {
    if (t < 0) return std::fill(out, out + H_, 0.0f);
    const float* xr = xw_ + (t * B_ + b) * 3 * H_ + H_;
    const float* gr = gzr_.data() + b * 2 * H_ + H_;
#if NPU_EP_X86
    if (vector_) return ResetRowAvx512(xr, gr, h, clip_.has_value(), clip_.value_or(0.0f), H_, out);
#endif
    ResetRow(xr, gr, h, clip_.has_value(), clip_.value_or(0.0f), H_, out);
  }

  int64_t B_, H_;
  const float *xw_, *rzr_, *rh_, *rbh_;
  bool lbr_;
  std::optional<float> clip_;
  int threads_;
  std::vector<float> gzr_, gh_, reset_;
  bool vector_ = VectorGates();
};

// RNN's gate (Tanh): xw [seq, batch, H] = X @ W^T + Wb + Rb; R^T [H, H] packed.
class RnnCell {
 public:
  RnnCell(const RecurrentShape& s, const float* xw, const float* rt, std::optional<float> clip, int threads)
      : B_(s.batch), H_(s.hidden), xw_(xw), rt_(rt), clip_(clip), threads_(threads), g_(s.batch * s.hidden) {}
  void Recur(const float* h, const int64_t*) { StepProduct(h, B_, H_, rt_, H_, g_.data(), threads_); }
  void Row(int64_t b, int64_t t, const float*, float* y) {
    const float* x = xw_ + (t * B_ + b) * H_;
#if NPU_EP_X86
    if (vector_) return RnnRowAvx512(x, g_.data() + b * H_, clip_.has_value(), clip_.value_or(0.0f), H_, y);
#endif
    RnnRow(x, g_.data() + b * H_, clip_.has_value(), clip_.value_or(0.0f), H_, y);
  }

 private:
  int64_t B_, H_;
  const float *xw_, *rt_;
  std::optional<float> clip_;
  int threads_;
  std::vector<float> g_;
  bool vector_ = VectorGates();
};

// One direction's 8-bit weights [K, 4H] as matmul_int.pack_b packs them, with their scale (one or per column).
struct QuantWeights {
  const int8_t* bp;
  const int32_t* bsum;
  const int32_t* bzp;
  const float* scale;
  bool scale_per_col;
  int64_t k;
};

// out [m, n] = float(acc) * (a_scale * w_scale) for a [m, k] quantized to uint8 as DynamicQuantizeLinear does (the
// range without NaN widened to 0, scale (hi - lo) / 255, zero point rint(max(0, min(255, -lo / scale))): 255 for a
// NaN, lo = -Inf) and acc its exact int32 product with the weights: ORT's ComputeGemm for 8-bit weights, the
// reference model's _product.
void QuantProduct(const float* a, int64_t m, const QuantWeights& w, int64_t n, float* out, std::vector<uint8_t>& aq,
                  std::vector<int32_t>& acc, int threads) {
  const int64_t len = m * w.k;
  float lo = 0.0f, hi = 0.0f;
  for (int64_t i = 0; i < len; ++i) lo = std::min(lo, a[i]), hi = std::max(hi, a[i]);
  const float scale = hi == lo ? 1.0f : (hi - lo) / 255.0f;
  const int32_t zp = static_cast<int32_t>(std::nearbyint(std::max(0.0f, std::min(255.0f, 0.0f - lo / scale))));
  aq.resize(len);
  acc.resize(m * n);
  QuantizeTensor(a, len, scale, zp, false, aq.data(), threads);
  Int8Gemm g;
  g.a = aq.data();
  g.azp = &zp;
  g.M = m;
  g.K = w.k;
  g.N = n;
  g.kp = (w.k + 63) / 64 * 64;
  g.bp = w.bp;
  g.bsum = w.bsum;
  g.bzp = w.bzp;
  g.acc = acc.data();
  g.threads = threads;
  Int8MatMul(g);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      out[i * n + j] = static_cast<float>(acc[i * n + j]) * (scale * w.scale[w.scale_per_col ? j : 0]);
}

template <typename T>
using Arr = py::array_t<T, py::array::c_style>;

// A list or tuple of per-direction arrays, each as AsArray takes it.
template <typename T>
std::vector<T> AsList(const py::object& o, const char* op, const char* what,
                      T (*one)(py::handle, const char*, const char*)) {
  if (!py::isinstance<py::list>(o) && !py::isinstance<py::tuple>(o))
    throw py::type_error(std::string(op) + ": " + what + " must be a list of its directions");
  const auto seq = py::reinterpret_borrow<py::sequence>(o);
  std::vector<T> out;
  out.reserve(seq.size());
  for (const auto item : seq) out.push_back(one(item, op, what));
  return out;
}

std::vector<Arr<float>> AsArrays(const py::object& o, const char* op, const char* what) {
  return AsList<Arr<float>>(o, op, what, &AsArray<float>);
}

const float* Checked(const char* op, const Arr<float>& a, int64_t n, const char* what) {
  if (a.size() != n)
    throw std::invalid_argument(std::string(op) + ": " + what + " has " + std::to_string(a.size()) +
                                " elements, expected " + std::to_string(n));
  return a.data();
}

// One direction's W^T or R^T [k, n] as pack_sgemm_b packs it: [n / 32 rounded up, k, 32].
const float* CheckedPanels(const char* op, const Arr<float>& p, int64_t k, int64_t n, const char* what) {
  if (p.ndim() != 3 || p.shape(0) != (n + kSgemmPanel - 1) / kSgemmPanel || p.shape(1) != k ||
      p.shape(2) != kSgemmPanel)
    throw std::invalid_argument(std::string(op) + ": " + what + " must be a direction's [" + std::to_string(k) + ", " +
                                std::to_string(n) + "] weights as pack_sgemm_b packs them");
  return p.data();
}

// The arguments every recurrent op shares, checked: x [seq, batch, I]; bias [dirs, gates * H]; h0 [dirs, batch, H];
// lens [batch] int64 in [0, seq]; clip >= 0 if given.
RecurrentShape CheckedShape(const char* op, const Arr<float>& x, int64_t dirs, int64_t gates, const Arr<float>& bias,
                            const Arr<float>& h0, const Arr<int64_t>& lens, std::optional<float> clip) {
  const std::string name(op);
  if (x.ndim() != 3 || h0.ndim() != 3) throw std::invalid_argument(name + ": x and initial_h must be 3-d");
  RecurrentShape s{x.shape(0), x.shape(1), x.shape(2), h0.shape(2), dirs};
  const int64_t H = s.hidden, B = s.batch, D = s.dirs;
  if (H <= 0 || (D != 1 && D != 2)) throw std::invalid_argument(name + ": one or two directions, and hidden size >= 1");
  Checked(op, bias, D * gates * H, "bias");
  Checked(op, h0, D * B * H, "initial_h");
  if (lens.size() != B) throw std::invalid_argument(name + ": sequence_lens must have batch entries");
  for (int64_t b = 0; b < B; ++b)
    if (lens.data()[b] < 0 || lens.data()[b] > s.seq)
      throw std::invalid_argument(name + ": sequence_lens out of range");
  if (clip && !(*clip >= 0.0f)) throw std::invalid_argument(name + ": clip must be >= 0");
  return s;
}

// The LSTMs' shape: CheckedShape's, with peep [dirs, 3H] or None and c0 [dirs, batch, H].
RecurrentShape CheckedLstmShape(const char* op, const Arr<float>& x, int64_t dirs, const Arr<float>& bias,
                                const std::optional<Arr<float>>& peep, const Arr<float>& h0, const Arr<float>& c0,
                                const Arr<int64_t>& lens, std::optional<float> clip) {
  const RecurrentShape s = CheckedShape(op, x, dirs, 4, bias, h0, lens, clip);
  if (peep) Checked(op, *peep, s.dirs * 3 * s.hidden, "peepholes");
  Checked(op, c0, s.dirs * s.batch * s.hidden, "initial_c");
  return s;
}

// Where the results go: ORT's buffers (a bound step's partition outputs, layout 0) or None.
struct OutBuffers {
  py::object y = py::none(), h = py::none(), c = py::none();
};

// `into` when it is a writeable C-order float32 array of dims' size (ORT's buffer), else a new [dims] array.
py::array Result(const py::object& into, std::vector<py::ssize_t> dims) {
  py::ssize_t n = 1;
  for (const py::ssize_t d : dims) n *= d;
  if (Arr<float>::check_(into)) {
    const auto a = py::reinterpret_borrow<py::array>(into);
    if (a.writeable() && a.size() == n) return a;
  }
  return Arr<float>(std::move(dims));
}

// Y [seq, dirs, batch, H], Y_h and (c0 given: LSTM) Y_c: the states start at h0, c0 and direction(d, threads, h, c,
// y) runs direction d (c null without c0; two directions: one per thread, each on its own products; one: the
// products on every thread); ORT zeroes the final states of an empty sequence.
template <typename DirectionFn>
py::tuple RunDirections(const RecurrentShape& s, const Arr<float>& h0, const Arr<float>* c0, const Arr<int64_t>& lens,
                        int threads, const OutBuffers& outs, DirectionFn&& direction) {
  const int64_t H = s.hidden, B = s.batch, D = s.dirs;
  py::array y = Result(outs.y, {s.seq, D, B, H}), yh = Result(outs.h, {D, B, H});
  py::object yc = py::none();  // a default py::array would be a new empty array per call
  float* cp = nullptr;
  if (c0) {
    py::array c = Result(outs.c, {D, B, H});
    cp = static_cast<float*>(c.mutable_data());
    yc = std::move(c);
  }
  float* yp = static_cast<float*>(y.mutable_data());
  float* hp = static_cast<float*>(yh.mutable_data());
  {
    // a small op (a decoder step's cell) keeps the GIL: handing it over costs more than the op's few microseconds
    std::optional<py::gil_scoped_release> release;
    if (s.seq * B * H * (s.input + H) * D >= kReleaseGilWork) release.emplace();
    std::fill(yp, yp + s.seq * D * B * H, 0.0f);
    std::copy(h0.data(), h0.data() + D * B * H, hp);
    if (c0) std::copy(c0->data(), c0->data() + D * B * H, cp);
    const int outer = D == 2 && threads >= 2 ? 2 : 1, inner = outer == 2 ? 1 : threads;
    ParallelFor(outer, D,
                [&](int64_t d) { direction(d, inner, hp + d * B * H, cp ? cp + d * B * H : nullptr, yp + d * B * H); });
    for (int64_t d = 0; d < D; ++d)
      for (int64_t b = 0; b < B; ++b)
        if (lens.data()[b] == 0) {
          std::fill(hp + (d * B + b) * H, hp + (d * B + b + 1) * H, 0.0f);
          if (cp) std::fill(cp + (d * B + b) * H, cp + (d * B + b + 1) * H, 0.0f);
        }
  }
  if (c0) return py::make_tuple(y, yh, yc);
  return py::make_tuple(y, yh);
}

// a [d0, d1, ...] with its first two axes swapped, C order (layout 1's batch-first tensors to and from the kernels'
// sequence-first ones: a copy, exact).
Arr<float> SwapLeading(const Arr<float>& a, std::vector<py::ssize_t> dims) {
  const int64_t d0 = dims[0], d1 = dims[1], inner = d0 > 0 && d1 > 0 ? a.size() / (d0 * d1) : 0;
  std::swap(dims[0], dims[1]);
  Arr<float> out(dims);
  const float* src = a.data();
  float* dst = out.mutable_data();
  for (int64_t i = 0; i < d0; ++i)
    for (int64_t j = 0; j < d1; ++j) std::copy_n(src + (i * d1 + j) * inner, inner, dst + (j * d0 + i) * inner);
  return out;
}

Arr<float> SwapLeading(const Arr<float>& a) {
  if (a.ndim() < 2)
    throw std::invalid_argument("recurrent: a layout-1 tensor must have batch and another leading axis");
  return SwapLeading(a, std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
}

// A sequence-first op's outputs in layout 1: Y [seq, dirs, batch, H] as [batch, seq, dirs, H], the states
// [dirs, batch, H] as [batch, dirs, H].
py::tuple BatchFirst(const py::tuple& outs) {
  py::list got;
  for (size_t i = 0; i < outs.size(); ++i) {
    const auto a = outs[i].cast<Arr<float>>();
    if (i > 0) {
      got.append(SwapLeading(a));
      continue;
    }
    const py::ssize_t seq = a.shape(0), dirs = a.shape(1), batch = a.shape(2), H = a.shape(3);
    got.append(SwapLeading(a, {seq * dirs, batch, H}).reshape(std::vector<py::ssize_t>{batch, seq, dirs, H}));
  }
  return py::tuple(got);
}

void CheckLayout(const char* op, int layout) {
  if (layout != 0 && layout != 1) throw std::invalid_argument(std::string(op) + ": layout must be 0 or 1");
}

// X's product for every time step of one direction: [seq * batch, n] = x @ W^T + bias.
std::vector<float> InputProduct(const RecurrentShape& s, const Arr<float>& x, const float* wt, int64_t n,
                                const float* bias, int threads) {
  std::vector<float> xw(s.seq * s.batch * n);
  Product(x.data(), s.seq * s.batch, s.input, wt, n, bias, xw.data(), threads);
  return xw;
}

// x [seq, batch, I]; wt, rt: per direction W^T [I, 4H] and R^T [H, 4H] packed (pack_sgemm_b); bias [dirs, 4H]
// (Wb + Rb); the rest as CheckedLstmShape. Returns (y [seq, dirs, batch, H], y_h, y_c).
py::tuple LstmPy(const Arr<float>& x, const std::vector<Arr<float>>& wt, const std::vector<Arr<float>>& rt,
                 const Arr<float>& bias, const std::optional<Arr<float>>& peep, const Arr<float>& h0,
                 const Arr<float>& c0, const Arr<int64_t>& lens, bool reverse_first, std::optional<float> clip,
                 int threads, int layout, const OutBuffers& outs) {
  CheckLayout("lstm", layout);
  if (layout == 1)
    return BatchFirst(LstmPy(SwapLeading(x), wt, rt, bias, peep, SwapLeading(h0), SwapLeading(c0), lens, reverse_first,
                             clip, threads, 0, OutBuffers{}));
  if (rt.size() != wt.size()) throw std::invalid_argument("lstm: as many packed W^T as R^T");
  const RecurrentShape s = CheckedLstmShape("lstm", x, static_cast<int64_t>(wt.size()), bias, peep, h0, c0, lens, clip);
  const int64_t H = s.hidden, G = 4 * H, B = s.batch;
  std::vector<const float*> wp(s.dirs), rp(s.dirs);
  for (int64_t d = 0; d < s.dirs; ++d) {
    wp[d] = CheckedPanels("lstm", wt[d], s.input, G, "W^T");
    rp[d] = CheckedPanels("lstm", rt[d], H, G, "R^T");
  }
  return RunDirections(s, h0, &c0, lens, threads, outs, [&](int64_t d, int inner, float* h, float* c, float* y) {
    const std::vector<float> xw = InputProduct(s, x, wp[d], G, bias.data() + d * G, inner);
    const auto product = [&](const float* hv, float* g) { StepProduct(hv, B, H, rp[d], G, g, inner); };
    LstmCell cell(s, xw.data(), product, peep ? peep->data() + d * 3 * H : nullptr, nullptr, clip, c);
    RunDirection(s, cell, lens.data(), reverse_first || d == 1, false, h, y);
  });
}

// ONNX GRU: x [seq, batch, I]; wt, rzt, rht: per direction W^T [I, 3H], R_zr^T [H, 2H] and R_h^T [H, H] packed;
// bias [dirs, 3H] = (Wb + Rb for z and r, Wb for h); rbh [dirs, H] = Rb for h; the rest as CheckedShape. Returns
// (y [seq, dirs, batch, H], y_h).
py::tuple GruPy(const Arr<float>& x, const std::vector<Arr<float>>& wt, const std::vector<Arr<float>>& rzt,
                const std::vector<Arr<float>>& rht, const Arr<float>& bias, const Arr<float>& rbh, const Arr<float>& h0,
                const Arr<int64_t>& lens, bool reverse_first, std::optional<float> clip, bool linear_before_reset,
                int threads, int layout, const OutBuffers& outs) {
  CheckLayout("gru", layout);
  if (layout == 1)
    return BatchFirst(GruPy(SwapLeading(x), wt, rzt, rht, bias, rbh, SwapLeading(h0), lens, reverse_first, clip,
                            linear_before_reset, threads, 0, OutBuffers{}));
  if (rzt.size() != wt.size() || rht.size() != wt.size())
    throw std::invalid_argument("gru: as many packed W^T as R_zr^T and R_h^T");
  const RecurrentShape s = CheckedShape("gru", x, static_cast<int64_t>(wt.size()), 3, bias, h0, lens, clip);
  const int64_t H = s.hidden, G = 3 * H;
  Checked("gru", rbh, s.dirs * H, "Rb of the hidden gate");
  std::vector<const float*> wp(s.dirs), rzp(s.dirs), rhp(s.dirs);
  for (int64_t d = 0; d < s.dirs; ++d) {
    wp[d] = CheckedPanels("gru", wt[d], s.input, G, "W^T");
    rzp[d] = CheckedPanels("gru", rzt[d], H, 2 * H, "R_zr^T");
    rhp[d] = CheckedPanels("gru", rht[d], H, H, "R_h^T");
  }
  return RunDirections(s, h0, nullptr, lens, threads, outs, [&](int64_t d, int inner, float* h, float*, float* y) {
    const std::vector<float> xw = InputProduct(s, x, wp[d], G, bias.data() + d * G, inner);
    GruCell cell(s, xw.data(), rzp[d], rhp[d], rbh.data() + d * H, linear_before_reset, clip, inner);
    RunDirection(s, cell, lens.data(), reverse_first || d == 1, false, h, y);
  });
}

// ONNX RNN with Tanh: x [seq, batch, I]; wt, rt: per direction W^T [I, H] and R^T [H, H] packed; bias [dirs, H] =
// Wb + Rb; the rest as CheckedShape. Returns (y [seq, dirs, batch, H], y_h).
py::tuple RnnPy(const Arr<float>& x, const std::vector<Arr<float>>& wt, const std::vector<Arr<float>>& rt,
                const Arr<float>& bias, const Arr<float>& h0, const Arr<int64_t>& lens, bool reverse_first,
                std::optional<float> clip, int threads, int layout, const OutBuffers& outs) {
  CheckLayout("rnn", layout);
  if (layout == 1)
    return BatchFirst(
        RnnPy(SwapLeading(x), wt, rt, bias, SwapLeading(h0), lens, reverse_first, clip, threads, 0, OutBuffers{}));
  if (rt.size() != wt.size()) throw std::invalid_argument("rnn: as many packed W^T as R^T");
  const RecurrentShape s = CheckedShape("rnn", x, static_cast<int64_t>(wt.size()), 1, bias, h0, lens, clip);
  const int64_t H = s.hidden;
  std::vector<const float*> wp(s.dirs), rp(s.dirs);
  for (int64_t d = 0; d < s.dirs; ++d) {
    wp[d] = CheckedPanels("rnn", wt[d], s.input, H, "W^T");
    rp[d] = CheckedPanels("rnn", rt[d], H, H, "R^T");
  }
  return RunDirections(s, h0, nullptr, lens, threads, outs, [&](int64_t d, int inner, float* h, float*, float* y) {
    const std::vector<float> xw = InputProduct(s, x, wp[d], H, bias.data() + d * H, inner);
    RnnCell cell(s, xw.data(), rp[d], clip, inner);
    RunDirection(s, cell, lens.data(), reverse_first || d == 1, false, h, y);
  });
}

// One direction's (bp, bsum, bzp, scale) tuple from recurrent_quant.py, checked against its [k, G] weights; the
// arrays are kept in `keep` for the call.
QuantWeights CheckedQuant(const py::tuple& t, int64_t k, int64_t G, const char* what, std::vector<py::array>& keep) {
  const std::string name = std::string("qlstm: ") + what;
  if (t.size() != 4) throw std::invalid_argument(name + " must be (bp, bsum, bzp, scale)");
  const auto bp = Arr<int8_t>::ensure(t[0]);
  const auto bsum = Arr<int32_t>::ensure(t[1]), bzp = Arr<int32_t>::ensure(t[2]);
  const auto scale = Arr<float>::ensure(t[3]);
  if (!bp || !bsum || !bzp || !scale) throw std::invalid_argument(name + ": int8 bp, int32 bsum/bzp, float32 scale");
  const int64_t kp = (k + 63) / 64 * 64;
  if (bp.ndim() != 4 || bp.shape(1) != kp / 4 || bp.shape(2) != 16 || bp.shape(3) != 4 || bp.shape(0) * 16 < G ||
      bsum.size() != bp.shape(0) * 16 || bzp.size() != bp.shape(0) * 16 || (scale.size() != 1 && scale.size() != G))
    throw std::invalid_argument(name + " is not a [" + std::to_string(k) + ", " + std::to_string(G) +
                                "] matrix as pack_b packs it with 1 or " + std::to_string(G) + " scales");
  keep.insert(keep.end(), {bp, bsum, bzp, scale});
  return {bp.data(), bsum.data(), bzp.data(), scale.data(), scale.size() != 1, k};
}

// com.microsoft DynamicQuantizeLSTM: x [seq, batch, I]; w, r: per direction (bp, bsum, bzp, scale) of W [I, 4H] and
// R [H, 4H]; bias [dirs, 4H] = Wb + Rb, added after the products; zero_finished: Y is an output; the rest as
// CheckedLstmShape. Returns (y [seq, dirs, batch, H], y_h, y_c).
py::tuple QLstmPy(const Arr<float>& x, const std::vector<py::tuple>& w, const std::vector<py::tuple>& r,
                  const Arr<float>& bias, const std::optional<Arr<float>>& peep, const Arr<float>& h0,
                  const Arr<float>& c0, const Arr<int64_t>& lens, bool reverse_first, std::optional<float> clip,
                  bool zero_finished, int threads) {
  if (r.size() != w.size()) throw std::invalid_argument("qlstm: as many W as R");
  const RecurrentShape s = CheckedLstmShape("qlstm", x, static_cast<int64_t>(w.size()), bias, peep, h0, c0, lens, clip);
  const int64_t H = s.hidden, G = 4 * H, B = s.batch;
  std::vector<py::array> keep;
  std::vector<QuantWeights> wq, rq;
  for (int64_t d = 0; d < s.dirs; ++d) {
    wq.push_back(CheckedQuant(w[d], s.input, G, "W", keep));
    rq.push_back(CheckedQuant(r[d], H, G, "R", keep));
  }
  const int64_t steps = B ? *std::max_element(lens.data(), lens.data() + B) : 0;
  return RunDirections(
      s, h0, &c0, lens, threads, OutBuffers{}, [&](int64_t d, int inner, float* h, float* c, float* y) {
        std::vector<uint8_t> aq;
        std::vector<int32_t> acc;
        std::vector<float> xw(s.seq * B * G, 0.0f);
        QuantProduct(x.data(), steps * B, wq[d], G, xw.data(), aq, acc, inner);
        const auto product = [&](const float* hv, float* g) { QuantProduct(hv, B, rq[d], G, g, aq, acc, inner); };
        LstmCell cell(s, xw.data(), product, peep ? peep->data() + d * 3 * H : nullptr, bias.data() + d * G, clip, c);
        RunDirection(s, cell, lens.data(), reverse_first || d == 1, zero_finished, h, y);
      });
}

py::tuple AsTuple(py::handle o, const char* op, const char* what) {
  if (!py::isinstance<py::tuple>(o))
    throw py::type_error(std::string(op) + ": each of " + what + " must be a (bp, bsum, bzp, scale) tuple");
  return py::reinterpret_borrow<py::tuple>(o);
}

// The bindings take their arrays as objects and borrow them (AsArray): no numpy conversion call per array and call.
py::tuple LstmEntry(const py::object& x, const py::object& wt, const py::object& rt, const py::object& bias,
                    const py::object& peep, const py::object& h0, const py::object& c0, const py::object& lens,
                    bool reverse_first, std::optional<float> clip, int threads, int layout, const py::object& out_y,
                    const py::object& out_h, const py::object& out_c) {
  const char* op = "lstm";
  return LstmPy(AsArray<float>(x, op, "x"), AsArrays(wt, op, "wt"), AsArrays(rt, op, "rt"),
                AsArray<float>(bias, op, "bias"), AsOptionalArray<float>(peep, op, "peep"),
                AsArray<float>(h0, op, "h0"), AsArray<float>(c0, op, "c0"), AsArray<int64_t>(lens, op, "lens"),
                reverse_first, clip, threads, layout, OutBuffers{out_y, out_h, out_c});
}

py::tuple GruEntry(const py::object& x, const py::object& wt, const py::object& rzt, const py::object& rht,
                   const py::object& bias, const py::object& rbh, const py::object& h0, const py::object& lens,
                   bool reverse_first, std::optional<float> clip, bool linear_before_reset, int threads, int layout,
                   const py::object& out_y, const py::object& out_h) {
  const char* op = "gru";
  return GruPy(AsArray<float>(x, op, "x"), AsArrays(wt, op, "wt"), AsArrays(rzt, op, "rzt"), AsArrays(rht, op, "rht"),
               AsArray<float>(bias, op, "bias"), AsArray<float>(rbh, op, "rbh"), AsArray<float>(h0, op, "h0"),
               AsArray<int64_t>(lens, op, "lens"), reverse_first, clip, linear_before_reset, threads, layout,
               OutBuffers{out_y, out_h});
}

py::tuple RnnEntry(const py::object& x, const py::object& wt, const py::object& rt, const py::object& bias,
                   const py::object& h0, const py::object& lens, bool reverse_first, std::optional<float> clip,
                   int threads, int layout, const py::object& out_y, const py::object& out_h) {
  const char* op = "rnn";
  return RnnPy(AsArray<float>(x, op, "x"), AsArrays(wt, op, "wt"), AsArrays(rt, op, "rt"),
               AsArray<float>(bias, op, "bias"), AsArray<float>(h0, op, "h0"), AsArray<int64_t>(lens, op, "lens"),
               reverse_first, clip, threads, layout, OutBuffers{out_y, out_h});
}

py::tuple QLstmEntry(const py::object& x, const py::object& w, const py::object& r, const py::object& bias,
                     const py::object& peep, const py::object& h0, const py::object& c0, const py::object& lens,
                     bool reverse_first, std::optional<float> clip, bool zero_finished, int threads) {
  const char* op = "qlstm";
  return QLstmPy(AsArray<float>(x, op, "x"), AsList<py::tuple>(w, op, "w", &AsTuple),
                 AsList<py::tuple>(r, op, "r", &AsTuple), AsArray<float>(bias, op, "bias"),
                 AsOptionalArray<float>(peep, op, "peep"), AsArray<float>(h0, op, "h0"), AsArray<float>(c0, op, "c0"),
                 AsArray<int64_t>(lens, op, "lens"), reverse_first, clip, zero_finished, threads);
}

}  // namespace

void BindRecurrent(py::module_& m) {
  m.def("lstm", &LstmEntry, py::arg("x"), py::arg("wt"), py::arg("rt"), py::arg("bias"), py::arg("peep"), py::arg("h0"),
        py::arg("c0"), py::arg("lens"), py::arg("reverse"), py::arg("clip") = py::none(), py::arg("threads") = 1,
        py::arg("layout") = 0, py::arg("out_y") = py::none(), py::arg("out_h") = py::none(),
        py::arg("out_c") = py::none(),
        "ONNX LSTM, default activations, every direction: x [seq, batch, I], wt/rt: per direction W^T "
        "[I, 4H] and R^T [H, 4H] as pack_sgemm_b packs them, bias [dirs, 4H] = Wb + Rb, peep [dirs, 3H] or None, "
        "h0/c0 [dirs, batch, H], lens [batch] int64; reverse: the first direction runs backwards. "
        "Returns (Y [seq, dirs, batch, H], Y_h, Y_c); layout 1: x, h0, c0 and the results batch first, as ONNX's. "
        "out_y/out_h/out_c (layout 0): a writeable C-order float32 array of the result's size to write and return "
        "(ORT's buffer), else a new array");
  m.def(
      "gru", &GruEntry, py::arg("x"), py::arg("wt"), py::arg("rzt"), py::arg("rht"), py::arg("bias"), py::arg("rbh"),
      py::arg("h0"), py::arg("lens"), py::arg("reverse"), py::arg("clip") = py::none(),
      py::arg("linear_before_reset") = false, py::arg("threads") = 1, py::arg("layout") = 0,
      py::arg("out_y") = py::none(), py::arg("out_h") = py::none(),
      "ONNX GRU, default activations, every direction: x [seq, batch, I]; wt, rzt, rht: per direction "
      "W^T [I, 3H], R_zr^T [H, 2H] and R_h^T [H, H] as pack_sgemm_b packs them; bias [dirs, 3H] = (Wb + Rb for z "
      "and r, Wb for h); rbh [dirs, H] = Rb for h; h0, lens, reverse, clip, layout, out_* as lstm's. Returns (Y, Y_h)");
  m.def(
      "rnn", &RnnEntry, py::arg("x"), py::arg("wt"), py::arg("rt"), py::arg("bias"), py::arg("h0"), py::arg("lens"),
      py::arg("reverse"), py::arg("clip") = py::none(), py::arg("threads") = 1, py::arg("layout") = 0,
      py::arg("out_y") = py::none(), py::arg("out_h") = py::none(),
      "ONNX RNN, Tanh, every direction: x [seq, batch, I]; wt, rt: per direction W^T [I, H] and R^T "
      "[H, H] as pack_sgemm_b packs them; bias [dirs, H] = Wb + Rb; h0, lens, reverse, clip, layout, out_* as lstm's. "
      "Returns (Y, Y_h)");
  m.def("qlstm", &QLstmEntry, py::arg("x"), py::arg("w"), py::arg("r"), py::arg("bias"), py::arg("peep"), py::arg("h0"),
        py::arg("c0"), py::arg("lens"), py::arg("reverse"), py::arg("clip") = py::none(),
        py::arg("zero_finished") = true, py::arg("threads") = 1,
        "com.microsoft DynamicQuantizeLSTM, every direction: x [seq, batch, I]; w, r: per direction (bp, bsum, bzp, "
        "scale) of W [I, 4H] and R [H, 4H] as matmul_int.pack_b packs them; bias [dirs, 4H] = Wb + Rb; peep, h0, c0, "
        "lens, reverse, clip as lstm's; zero_finished: a finished sequence's h enters the next product as 0 (Y is an "
        "output). Returns (Y [seq, dirs, batch, H], Y_h, Y_c)");
}

}  // namespace npu_ep::kern
