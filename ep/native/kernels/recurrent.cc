// Native LSTM (ONNX LSTM, layout 0, default activations): the input projection X @ W^T + Wb + Rb as one product over
// all time steps, then per step one [batch, H] x [H, 4H] product against R and the gate math, every direction in one
// call (the two directions of a bidirectional LSTM on two threads), so a speech model's single-step LSTM costs one
// Python call instead of a few dozen numpy ones.
// The numpy reference (kernels/ops/recurrent.py) is the specification; the gate order is i, o, f, c and `clip`
// bounds every gate's pre-activation. The products run on the packed float GEMM (packed_sgemm.h) with W^T and R^T
// packed once by the caller (numpy's BLAS is slow on one row of h at a time: ep/native/EXECUTOR.md, session 22);
// its fixed order gives the same bits at any thread count.
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

#include "cpu.h"
#include "int8_gemm.h"
#include "intrinsics.h"
#include "packed_sgemm.h"
#include "quantize.h"
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

struct LstmShape {
  int64_t seq, batch, input, hidden, dirs;
};

// c[m, :n] = a[m, :k] @ B (+ bias[:n]) for B packed by pack_sgemm_b
void Product(const float* a, int64_t m, int64_t k, const float* packed, int64_t n, const float* bias, float* c,
             int threads) {
  const PackedSgemmArgs g{a, m, k, k, packed, n, c, n, bias, false};
  PackedSgemm(g, threads, nullptr, nullptr);
}

inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(std::min(-x, 88.0f))); }

// tanh through expf (glibc's tanhf costs ~5x an expf): an odd Taylor polynomial below |x| = 1/16 (error < 1e-9
// relative), else 1 - 2 / (exp(2|x|) + 1) with x's sign (a few ulps relative); exp's argument capped where the
// result is 1 in float anyway.
inline float Tanh(float x) {
  const float a = std::fabs(x);
  if (a < 0.0625f) {
    const float x2 = x * x;
    return x * (1.0f + x2 * (-1.0f / 3.0f + x2 * (2.0f / 15.0f)));
  }
  const float t = 1.0f - 2.0f / (std::exp(std::min(2.0f * a, 88.0f)) + 1.0f);
  return std::copysign(t, x);
}
inline float Clip(float x, bool has_clip, float clip) { return has_clip ? std::min(std::max(x, -clip), clip) : x; }

// The gates of one batch entry: x, g [4H] (X's and the step's products), c [H] updated in place, y [H] written.
// The order of operations is the reference model's (kernels/ops/recurrent.py), bias (DynamicQuantizeLSTM) after
// the product and the peepholes.
struct GateArgs {
  const float* x;
  const float* g;
  const float* peep;  // [3H] or null
  const float* bias;  // [4H] or null
  bool has_clip;
  float clip;
  int64_t H;
};

void GateRow(const GateArgs& a, float* c, float* y) {
  const int64_t H = a.H;
  const float* x = a.x;
  const float* gb = a.g;
  for (int64_t j = 0; j < H; ++j) {
    float gi = x[j] + gb[j], go = x[H + j] + gb[H + j];
    float gf = x[2 * H + j] + gb[2 * H + j], gc = x[3 * H + j] + gb[3 * H + j];
    if (a.peep != nullptr) gi += a.peep[j] * c[j], gf += a.peep[2 * H + j] * c[j];
    if (a.bias != nullptr) gi += a.bias[j], gf += a.bias[2 * H + j], gc += a.bias[3 * H + j];
    const float i = Sigmoid(Clip(gi, a.has_clip, a.clip)), f = Sigmoid(Clip(gf, a.has_clip, a.clip));
    const float c_new = f * c[j] + i * Tanh(Clip(gc, a.has_clip, a.clip));
    if (a.peep != nullptr) go += a.peep[H + j] * c_new;
    if (a.bias != nullptr) go += a.bias[H + j];
    c[j] = c_new;
    y[j] = Sigmoid(Clip(go, a.has_clip, a.clip)) * Tanh(c_new);
  }
}

#if NPU_EP_X86
// Sigmoid and Tanh of 16 lanes: the scalar functions' formulas and NaN behaviour, with exp in lanes (intrinsics.h,
// within 2 ulp of std::exp).
__attribute__((target("avx2,fma,avx512f"))) inline __m512 SigmoidAvx512(__m512 x) {
  const __m512 neg = _mm512_sub_ps(_mm512_setzero_ps(), x);
  const __m512 e = ExpAvx512(_mm512_min_ps(_mm512_set1_ps(88.0f), neg));  // NaN: the second operand
  return _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

__attribute__((target("avx2,fma,avx512f"))) inline __m512 TanhAvx512(__m512 x) {
  const __m512 a = _mm512_abs_ps(x);
  const __m512 x2 = _mm512_mul_ps(x, x);
  const __m512 poly = _mm512_mul_ps(
      x, _mm512_add_ps(_mm512_set1_ps(1.0f),
                       _mm512_mul_ps(x2, _mm512_add_ps(_mm512_set1_ps(-1.0f / 3.0f),
                                                       _mm512_mul_ps(x2, _mm512_set1_ps(2.0f / 15.0f))))));
  const __m512 e = ExpAvx512(_mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_add_ps(a, a)));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 t = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
  const __m512 signed_t = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), sign));  // copysign
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(0.0625f), _CMP_LT_OQ), signed_t, poly);
}

__attribute__((target("avx2,fma,avx512f"))) inline __m512 ClipAvx512(__m512 v, const GateArgs& a) {
  if (!a.has_clip) return v;
  return _mm512_min_ps(_mm512_set1_ps(a.clip), _mm512_max_ps(_mm512_set1_ps(-a.clip), v));  // NaN stays
}

// GateRow 16 lanes at a time (the last ones masked).
__attribute__((target("avx2,fma,avx512f"))) void GateRowAvx512(const GateArgs& a, float* c, float* y) {
  const int64_t H = a.H;
  for (int64_t j = 0; j < H; j += 16) {
    const __mmask16 k = static_cast<__mmask16>(H - j >= 16 ? 0xFFFF : (1u << (H - j)) - 1);
    const auto at = [&](const float* p, int64_t gate) { return _mm512_maskz_loadu_ps(k, p + gate * H + j); };
    __m512 gi = _mm512_add_ps(at(a.x, 0), at(a.g, 0)), go = _mm512_add_ps(at(a.x, 1), at(a.g, 1));
    __m512 gf = _mm512_add_ps(at(a.x, 2), at(a.g, 2)), gc = _mm512_add_ps(at(a.x, 3), at(a.g, 3));
    const __m512 cv = at(c, 0);
    if (a.peep != nullptr) {
      gi = _mm512_add_ps(gi, _mm512_mul_ps(at(a.peep, 0), cv));
      gf = _mm512_add_ps(gf, _mm512_mul_ps(at(a.peep, 2), cv));
    }
    if (a.bias != nullptr) {
      gi = _mm512_add_ps(gi, at(a.bias, 0));
      gf = _mm512_add_ps(gf, at(a.bias, 2));
      gc = _mm512_add_ps(gc, at(a.bias, 3));
    }
    const __m512 i = SigmoidAvx512(ClipAvx512(gi, a)), f = SigmoidAvx512(ClipAvx512(gf, a));
    const __m512 c_new = _mm512_add_ps(_mm512_mul_ps(f, cv), _mm512_mul_ps(i, TanhAvx512(ClipAvx512(gc, a))));
    if (a.peep != nullptr) go = _mm512_add_ps(go, _mm512_mul_ps(at(a.peep, 1), c_new));
    if (a.bias != nullptr) go = _mm512_add_ps(go, at(a.bias, 1));
    _mm512_mask_storeu_ps(c + j, k, c_new);
    _mm512_mask_storeu_ps(y + j, k, _mm512_mul_ps(SigmoidAvx512(ClipAvx512(go, a)), TanhAvx512(c_new)));
  }
}
#endif

// One direction. xw [seq, batch, 4H] holds X's product, plus Wb + Rb when bias is null; product(h_in, g) writes the
// step's [batch, 4H] product with R into g; bias (DynamicQuantizeLSTM) is added after that product and the
// peepholes; zero_finished: a finished row enters the next product as 0 (kernels/ops/recurrent_quant.py). h, c
// [batch, H] in/out; y rows written at y + (t * dirs) * batch * H (the caller offsets y by the direction).
template <typename ProductFn>
void LstmDirection(const LstmShape& s, const float* xw, ProductFn&& product, const float* peep, const float* bias,
                   bool zero_finished, float* h, float* c, const int64_t* lens, bool reverse, bool has_clip, float clip,
                   float* y) {
  const int64_t H = s.hidden, G = 4 * H, B = s.batch;
  std::vector<float> g(B * G), h_in(zero_finished ? B * H : 0);
  [[maybe_unused]] const bool vector_gates = ActiveIsa() >= Isa::kAvx512;
  for (int64_t step = 0; step < s.seq; ++step) {
    const float* hp = h;
    if (zero_finished && step > 0) {
      for (int64_t b = 0; b < B; ++b) {
        const bool live = step - 1 < lens[b];
        std::copy(h + b * H, h + (b + 1) * H, h_in.data() + b * H);
        if (!live) std::fill(h_in.data() + b * H, h_in.data() + (b + 1) * H, 0.0f);
      }
      hp = h_in.data();
    }
    product(hp, g.data());  // every batch entry (invalid ones are ignored)
    for (int64_t b = 0; b < B; ++b) {
      if (step >= lens[b]) continue;
      const int64_t t = reverse ? lens[b] - 1 - step : step;
      const GateArgs args{xw + (t * B + b) * G, g.data() + b * G, peep, bias, has_clip, clip, H};
      float* yb = y + (t * s.dirs * B + b) * H;
#if NPU_EP_X86
      if (vector_gates) GateRowAvx512(args, c + b * H, yb);
      else
#endif
        GateRow(args, c + b * H, yb);
      std::copy(yb, yb + H, h + b * H);
    }
  }
}

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

const float* Checked(const Arr<float>& a, int64_t n, const char* what) {
  if (a.size() != n)
    throw std::invalid_argument(std::string("lstm: ") + what + " has " + std::to_string(a.size()) +
                                " elements, expected " + std::to_string(n));
  return a.data();
}

// One direction's W^T or R^T as pack_sgemm_b packs it: [4H / 32 rounded up, k, 32].
const float* CheckedPanels(const Arr<float>& p, int64_t k, int64_t G, const char* what) {
  if (p.ndim() != 3 || p.shape(0) != (G + kSgemmPanel - 1) / kSgemmPanel || p.shape(1) != k ||
      p.shape(2) != kSgemmPanel)
    throw std::invalid_argument(std::string("lstm: ") + what + " must be a direction's [" + std::to_string(k) + ", " +
                                std::to_string(G) + "] weights as pack_sgemm_b packs them");
  return p.data();
}

// The arguments both LSTMs share, checked: x [seq, batch, I]; bias [dirs, 4H]; peep [dirs, 3H] or None; h0, c0
// [dirs, batch, H]; lens [batch] int64 in [0, seq]; clip >= 0 if given.
LstmShape CheckedShape(const Arr<float>& x, int64_t dirs, const Arr<float>& bias, const std::optional<Arr<float>>& peep,
                       const Arr<float>& h0, const Arr<float>& c0, const Arr<int64_t>& lens,
                       std::optional<float> clip) {
  if (x.ndim() != 3 || h0.ndim() != 3) throw std::invalid_argument("lstm: x and initial_h must be 3-d");
  LstmShape s{x.shape(0), x.shape(1), x.shape(2), h0.shape(2), dirs};
  const int64_t H = s.hidden, G = 4 * H, B = s.batch, D = s.dirs;
  if (H <= 0 || (D != 1 && D != 2)) throw std::invalid_argument("lstm: one or two directions, and hidden size >= 1");
  Checked(bias, D * G, "bias");
  if (peep) Checked(*peep, D * 3 * H, "peepholes");
  Checked(h0, D * B * H, "initial_h");
  Checked(c0, D * B * H, "initial_c");
  if (lens.size() != B) throw std::invalid_argument("lstm: sequence_lens must have batch entries");
  for (int64_t b = 0; b < B; ++b)
    if (lens.data()[b] < 0 || lens.data()[b] > s.seq) throw std::invalid_argument("lstm: sequence_lens out of range");
  if (clip && !(*clip >= 0.0f)) throw std::invalid_argument("lstm: clip must be >= 0");
  return s;
}

// Y [seq, dirs, batch, H], Y_h and Y_c: the states start at h0, c0 and direction(d, threads, h, c, y) runs direction
// d (two directions: one per thread, each on its own products; one: the products on every thread); ORT zeroes the
// final states of an empty sequence.
template <typename DirectionFn>
py::tuple RunDirections(const LstmShape& s, const Arr<float>& h0, const Arr<float>& c0, const Arr<int64_t>& lens,
                        int threads, DirectionFn&& direction) {
  const int64_t H = s.hidden, B = s.batch, D = s.dirs;
  py::array_t<float> y({s.seq, D, B, H}), yh({D, B, H}), yc({D, B, H});
  float* yp = y.mutable_data();
  float* hp = yh.mutable_data();
  float* cp = yc.mutable_data();
  {
    py::gil_scoped_release release;
    std::fill(yp, yp + s.seq * D * B * H, 0.0f);
    std::copy(h0.data(), h0.data() + D * B * H, hp);
    std::copy(c0.data(), c0.data() + D * B * H, cp);
    const int outer = D == 2 && threads >= 2 ? 2 : 1, inner = outer == 2 ? 1 : threads;
    ParallelFor(outer, D, [&](int64_t d) { direction(d, inner, hp + d * B * H, cp + d * B * H, yp + d * B * H); });
    for (int64_t d = 0; d < D; ++d)
      for (int64_t b = 0; b < B; ++b)
        if (lens.data()[b] == 0) {
          std::fill(hp + (d * B + b) * H, hp + (d * B + b + 1) * H, 0.0f);
          std::fill(cp + (d * B + b) * H, cp + (d * B + b + 1) * H, 0.0f);
        }
  }
  return py::make_tuple(y, yh, yc);
}

// x [seq, batch, I]; wt, rt: per direction W^T [I, 4H] and R^T [H, 4H] packed (pack_sgemm_b); bias [dirs, 4H]
// (Wb + Rb); the rest as CheckedShape. Returns (y [seq, dirs, batch, H], y_h, y_c).
py::tuple LstmPy(const Arr<float>& x, const std::vector<Arr<float>>& wt, const std::vector<Arr<float>>& rt,
                 const Arr<float>& bias, const std::optional<Arr<float>>& peep, const Arr<float>& h0,
                 const Arr<float>& c0, const Arr<int64_t>& lens, bool reverse_first, std::optional<float> clip,
                 int threads) {
  if (rt.size() != wt.size()) throw std::invalid_argument("lstm: as many packed W^T as R^T");
  const LstmShape s = CheckedShape(x, static_cast<int64_t>(wt.size()), bias, peep, h0, c0, lens, clip);
  const int64_t H = s.hidden, G = 4 * H, B = s.batch;
  std::vector<const float*> wp(s.dirs), rp(s.dirs);
  for (int64_t d = 0; d < s.dirs; ++d) {
    wp[d] = CheckedPanels(wt[d], s.input, G, "W^T");
    rp[d] = CheckedPanels(rt[d], H, G, "R^T");
  }
  return RunDirections(s, h0, c0, lens, threads, [&](int64_t d, int inner, float* h, float* c, float* y) {
    std::vector<float> xw(s.seq * B * G);
    Product(x.data(), s.seq * B, s.input, wp[d], G, bias.data() + d * G, xw.data(), inner);
    const auto product = [&](const float* hv, float* g) { Product(hv, B, H, rp[d], G, nullptr, g, inner); };
    LstmDirection(s, xw.data(), product, peep ? peep->data() + d * 3 * H : nullptr, nullptr, false, h, c,
                  lens.data(), reverse_first || d == 1, clip.has_value(), clip.value_or(0.0f), y);
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
// CheckedShape. Returns (y [seq, dirs, batch, H], y_h, y_c).
py::tuple QLstmPy(const Arr<float>& x, const std::vector<py::tuple>& w, const std::vector<py::tuple>& r,
                  const Arr<float>& bias, const std::optional<Arr<float>>& peep, const Arr<float>& h0,
                  const Arr<float>& c0, const Arr<int64_t>& lens, bool reverse_first, std::optional<float> clip,
                  bool zero_finished, int threads) {
  if (r.size() != w.size()) throw std::invalid_argument("qlstm: as many W as R");
  const LstmShape s = CheckedShape(x, static_cast<int64_t>(w.size()), bias, peep, h0, c0, lens, clip);
  const int64_t H = s.hidden, G = 4 * H, B = s.batch;
  std::vector<py::array> keep;
  std::vector<QuantWeights> wq, rq;
  for (int64_t d = 0; d < s.dirs; ++d) {
    wq.push_back(CheckedQuant(w[d], s.input, G, "W", keep));
    rq.push_back(CheckedQuant(r[d], H, G, "R", keep));
  }
  const int64_t steps = B ? *std::max_element(lens.data(), lens.data() + B) : 0;
  return RunDirections(s, h0, c0, lens, threads, [&](int64_t d, int inner, float* h, float* c, float* y) {
    std::vector<uint8_t> aq;
    std::vector<int32_t> acc;
    std::vector<float> xw(s.seq * B * G, 0.0f);
    QuantProduct(x.data(), steps * B, wq[d], G, xw.data(), aq, acc, inner);
    const auto product = [&](const float* hv, float* g) { QuantProduct(hv, B, rq[d], G, g, aq, acc, inner); };
    LstmDirection(s, xw.data(), product, peep ? peep->data() + d * 3 * H : nullptr, bias.data() + d * G,
                  zero_finished, h, c, lens.data(), reverse_first || d == 1, clip.has_value(), clip.value_or(0.0f),
                  y);
  });
}

}  // namespace

void BindRecurrent(py::module_& m) {
  m.def("lstm", &LstmPy, py::arg("x"), py::arg("wt"), py::arg("rt"), py::arg("bias"), py::arg("peep"),
        py::arg("h0"), py::arg("c0"), py::arg("lens"), py::arg("reverse"), py::arg("clip") = py::none(),
        py::arg("threads") = 1,
        "ONNX LSTM, layout 0, default activations, every direction: x [seq, batch, I], wt/rt: per direction W^T "
        "[I, 4H] and R^T [H, 4H] as pack_sgemm_b packs them, bias [dirs, 4H] = Wb + Rb, peep [dirs, 3H] or None, "
        "h0/c0 [dirs, batch, H], lens [batch] int64; reverse: the first direction runs backwards. "
        "Returns (Y [seq, dirs, batch, H], Y_h, Y_c)");
  m.def("qlstm", &QLstmPy, py::arg("x"), py::arg("w"), py::arg("r"), py::arg("bias"), py::arg("peep"), py::arg("h0"),
        py::arg("c0"), py::arg("lens"), py::arg("reverse"), py::arg("clip") = py::none(),
        py::arg("zero_finished") = true, py::arg("threads") = 1,
        "com.microsoft DynamicQuantizeLSTM, every direction: x [seq, batch, I]; w, r: per direction (bp, bsum, bzp, "
        "scale) of W [I, 4H] and R [H, 4H] as matmul_int.pack_b packs them; bias [dirs, 4H] = Wb + Rb; peep, h0, c0, "
        "lens, reverse, clip as lstm's; zero_finished: a finished sequence's h enters the next product as 0 (Y is an "
        "output). Returns (Y [seq, dirs, batch, H], Y_h, Y_c)");
}

}  // namespace npu_ep::kern
