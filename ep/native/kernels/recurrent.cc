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

#include "packed_sgemm.h"
#include "thread_pool.h"

namespace py = pybind11;

namespace npu_ep::kern {
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

// One direction. xw [seq, batch, 4H] already holds X @ W^T + Wb + Rb; h, c [batch, H] in/out; y rows written at
// y + (t * dirs) * batch * H (the caller offsets y by the direction).
void LstmDirection(const LstmShape& s, const float* xw, const float* rt, const float* peep, float* h, float* c,
                   const int64_t* lens, bool reverse, bool has_clip, float clip, float* y, int threads) {
  const int64_t H = s.hidden, G = 4 * H, B = s.batch;
  std::vector<float> g(B * G);
  for (int64_t step = 0; step < s.seq; ++step) {
    Product(h, B, H, rt, G, nullptr, g.data(), threads);  // h @ R^T for every batch entry (invalid ones are ignored)
    for (int64_t b = 0; b < B; ++b) {
      if (step >= lens[b]) continue;
      const int64_t t = reverse ? lens[b] - 1 - step : step;
      const float* x = xw + (t * B + b) * G;
      float* gb = g.data() + b * G;
      float* hb = h + b * H;
      float* cb = c + b * H;
      float* yb = y + (t * s.dirs * B + b) * H;
      for (int64_t j = 0; j < H; ++j) {
        float gi = x[j] + gb[j], go = x[H + j] + gb[H + j];
        float gf = x[2 * H + j] + gb[2 * H + j], gc = x[3 * H + j] + gb[3 * H + j];
        if (peep != nullptr) gi += peep[j] * cb[j], gf += peep[2 * H + j] * cb[j];
        const float i = Sigmoid(Clip(gi, has_clip, clip)), f = Sigmoid(Clip(gf, has_clip, clip));
        const float c_new = f * cb[j] + i * Tanh(Clip(gc, has_clip, clip));
        if (peep != nullptr) go += peep[H + j] * c_new;
        const float h_new = Sigmoid(Clip(go, has_clip, clip)) * Tanh(c_new);
        cb[j] = c_new;
        yb[j] = h_new;
      }
      std::copy(yb, yb + H, hb);
    }
  }
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

// x [seq, batch, I]; wt, rt: per direction W^T [I, 4H] and R^T [H, 4H] packed (pack_sgemm_b); bias [dirs, 4H]
// (Wb + Rb); peep [dirs, 3H] or None; h0, c0 [dirs, batch, H]; lens [batch] int64 in [0, seq].
// Returns (y [seq, dirs, batch, H], y_h, y_c).
py::tuple LstmPy(const Arr<float>& x, const std::vector<Arr<float>>& wt, const std::vector<Arr<float>>& rt,
                 const Arr<float>& bias, const std::optional<Arr<float>>& peep, const Arr<float>& h0,
                 const Arr<float>& c0, const Arr<int64_t>& lens, bool reverse_first, std::optional<float> clip,
                 int threads) {
  if (x.ndim() != 3 || h0.ndim() != 3) throw std::invalid_argument("lstm: x and initial_h must be 3-d");
  LstmShape s{x.shape(0), x.shape(1), x.shape(2), h0.shape(2), static_cast<int64_t>(wt.size())};
  const int64_t H = s.hidden, G = 4 * H, B = s.batch, D = s.dirs;
  if (H <= 0 || (D != 1 && D != 2) || rt.size() != wt.size())
    throw std::invalid_argument("lstm: one or two directions of packed W^T and R^T, and hidden size >= 1");
  std::vector<const float*> wp(D), rp(D);
  for (int64_t d = 0; d < D; ++d) {
    wp[d] = CheckedPanels(wt[d], s.input, G, "W^T");
    rp[d] = CheckedPanels(rt[d], H, G, "R^T");
  }
  Checked(bias, D * G, "bias");
  if (peep) Checked(*peep, D * 3 * H, "peepholes");
  Checked(h0, D * B * H, "initial_h");
  Checked(c0, D * B * H, "initial_c");
  if (lens.size() != B) throw std::invalid_argument("lstm: sequence_lens must have batch entries");
  for (int64_t b = 0; b < B; ++b)
    if (lens.data()[b] < 0 || lens.data()[b] > s.seq) throw std::invalid_argument("lstm: sequence_lens out of range");
  if (clip && !(*clip >= 0.0f)) throw std::invalid_argument("lstm: clip must be >= 0");
  py::array_t<float> y({s.seq, D, B, H}), yh({D, B, H}), yc({D, B, H});
  float* yp = y.mutable_data();
  float* hp = yh.mutable_data();
  float* cp = yc.mutable_data();
  {
    py::gil_scoped_release release;
    std::fill(yp, yp + s.seq * D * B * H, 0.0f);
    std::copy(h0.data(), h0.data() + D * B * H, hp);
    std::copy(c0.data(), c0.data() + D * B * H, cp);
    // two directions: one per thread, each on its own products; one: the products on every thread
    const int outer = D == 2 && threads >= 2 ? 2 : 1, inner = outer == 2 ? 1 : threads;
    ParallelFor(outer, D, [&](int64_t d) {
      std::vector<float> xw(s.seq * B * G);
      Product(x.data(), s.seq * B, s.input, wp[d], G, bias.data() + d * G, xw.data(), inner);
      LstmDirection(s, xw.data(), rp[d], peep ? peep->data() + d * 3 * H : nullptr, hp + d * B * H, cp + d * B * H,
                    lens.data(), reverse_first || d == 1, clip.has_value(), clip.value_or(0.0f), yp + d * B * H,
                    inner);
    });
    for (int64_t d = 0; d < D; ++d)  // ORT zeroes the final states of an empty sequence
      for (int64_t b = 0; b < B; ++b)
        if (lens.data()[b] == 0) {
          std::fill(hp + (d * B + b) * H, hp + (d * B + b + 1) * H, 0.0f);
          std::fill(cp + (d * B + b) * H, cp + (d * B + b + 1) * H, 0.0f);
        }
  }
  return py::make_tuple(y, yh, yc);
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
}

}  // namespace npu_ep::kern
