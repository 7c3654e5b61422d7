// The native scaled-dot-product attention core (`kernels.sdpa`) shared by ONNX Attention (opset 23), com.microsoft
// Attention and com.microsoft MultiHeadAttention: per (batch, head) Q K^T, scale, softcap, additive bias built from
// the ops' masks, softmax and P V, in float32 over float32 or float16 storage. kernels/ops/_sdpa.py's attend and
// the three ops' masks are the reference.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu.h"
#include "gqa_internal.h"

namespace npu_ep::kern {

// A [B, heads, rows, width] view of float32 (or IEEE half bits when the call is fp16): element (b, n, r, i) at
// data + b * sb + n * sn + r * sr + i. `bias` (float32, or null) is added to each row's width elements (head n
// reads bias + n * width): MultiHeadAttention's projection bias.
struct SdpaView {
  const void* data = nullptr;
  int64_t sb = 0, sn = 0, sr = 0;
  const float* bias = nullptr;
};

// A mask or bias operand as a [B, N, S, T] broadcast view (strides in elements, 0 along broadcast axes).
struct SdpaMask {
  const void* data = nullptr;
  int64_t s[4] = {0, 0, 0, 0};
};

enum class MaskKind : int {
  kNone = 0,
  kBool = 1,       // bool bytes: 0 adds -inf (ONNX Attention)
  kFloat = 2,      // additive float32 or float16 values (ONNX Attention)
  kLengths = 3,    // int32 [B]: key j kept when j < len[b]; masked keys get `fill`
  kEndStart = 4,   // int32 [2B]: kept when start[b] <= j < end[b] (com.microsoft Attention)
  kPositive = 5,   // int32 raw mask: kept where > 0 (com.microsoft Attention)
  kNonzero = 6,    // int32 raw mask: kept where != 0 (MultiHeadAttention)
};

enum class CausalKind : int {
  kNone = 0,
  kAddInf = 1,   // future keys: + -inf (ONNX Attention's is_causal)
  kLowest = 2,   // future keys: float32's lowest value, replacing the mask (com.microsoft Attention)
  kAddFill = 3,  // future keys: + fill (MultiHeadAttention)
};

struct SdpaArgs {
  bool fp16 = false;  // q, k, v, past, presents, out (and float masks / attention bias when their flag says) as half
  int64_t B = 0, N = 0, Nkv = 0, S = 0, L = 0, P = 0, H = 0, Hv = 0;  // T = P + L keys
  SdpaView q, k, v;
  const void* past_k = nullptr;  // [B, Nkv, P, H] contiguous, or null when P == 0
  const void* past_v = nullptr;  // [B, Nkv, P, Hv]
  void* present_k = nullptr;     // [B, Nkv, T, H] contiguous (past then the new rows), or null
  void* present_v = nullptr;
  MaskKind mask_kind = MaskKind::kNone;
  SdpaMask mask;
  bool mask_half = false;  // kFloat values are half
  const void* attn_bias = nullptr;  // added after the mask and causal terms, or null
  SdpaMask bias;
  bool bias_half = false;
  CausalKind causal = CausalKind::kNone;  // query i sees keys j <= i + P
  float fill = -10000.0f, scale = 1.0f, softcap = 0.0f;
  void* qk = nullptr;  // [B, N, S, T] in the storage dtype: qk_matmul_output's stage qk_mode (0..3), or null
  int qk_mode = -1;
  void* out = nullptr;  // element (b, n, s, i) at out + b * ob + n * on + s * os + i
  int64_t ob = 0, on = 0, os = 0;
  int threads = 1;
};

// The scores of `rows` query rows (q[r * lq + i]) from K transposed with the prologue in their epilogue:
// sc[r * ld + j] = (q_r . k_j) * scale [+ bias[r * ldb + j]] for j < nk (two roundings), and max[r] the row's maximum
// (NaN when it holds a NaN); one pass over the scores fewer than a scores kernel then a prologue. Key j's channel i
// is kt[(j / 64) * kp + i * ldk + j % 64] (kp = 64: K^T rows of pitch ldk; kp = 64 * h with ldk = 64: panels of 64
// keys). The products are gqa_ops.cc's transposed-K multiply-adds in their order. Null on hosts below AVX-512.
using ScoresPrologue = void (*)(const float* q, int64_t lq, int rows, const float* kt, int64_t ldk, int64_t kp,
                                int64_t nk, int64_t h, float scale, const float* bias, int64_t ldb, float* sc,
                                int64_t ld, float* max);
ScoresPrologue SelectScoresPrologue();

constexpr int64_t kPanel = 64;       // keys per panel of K transposed for PanelPass (the fused scores' blocks)
constexpr int64_t kPassRows = 64;    // query rows per PanelPass at most
constexpr int64_t kPassScores = int64_t{1} << 18;  // floats of scores per pass (1 MB: L2), from 16 rows up

// The query rows of one pass over `t` keys: kPassRows, fewer when their scores would pass kPassScores.
inline int64_t PassRows(int64_t t) {
  const int64_t ld = (t + 15) / 16 * 16;
  return t <= 0 ? kPassRows : std::min<int64_t>(kPassRows, std::max<int64_t>(16, kPassScores / ld / 4 * 4));
}

// One head's operands of a PanelPass.
struct PanelArgs {
  const float* q = nullptr;  // query row r's h channels at q + r * lq
  int64_t lq = 0;
  const float* kt = nullptr;  // K in panels: key j's channel i at (j / kPanel) * kPanel * h + i * kPanel + j % kPanel
  const float* v = nullptr;  // value row j's hv channels at v + j * hv
  int64_t h = 0, hv = 0, t = 0;
  float scale = 1.0f;  // the scores' multiplier
  const float* bias = nullptr;  // row r's additive terms at bias + r * ldb, or null
  int64_t ldb = 0;
  bool nan_rows_zero = false;  // a row whose maximum is NaN or infinite gives zeros (else: NaN, ...)
  bool masked_rows_zero = false;  // ... except that one whose every score is -inf gives zeros
  float* const* out = nullptr;  // row r's hv results
};

#if NPU_EP_X86
// dst[i * ld + k] = src[k * ls + i] for 16 key rows k and H channels i (H a multiple of 16; AVX-512 hosts only).
void TransposeKeys16x512(const float* src, int64_t ls, int64_t H, float* dst, int64_t ld);

// softmax(scores) V of `rows` (<= kPassRows) query rows with the fused scores (AVX-512 hosts): the rows' 4-row
// groups take turns on each K panel's scores and then on its P V terms, so a panel of K or V is read from memory
// once per pass, not once per 4 rows, and from L1 by the groups after the first. Every score, maximum, exp and
// P V sum is the 4-row passes' operations in their order (P V's accumulators are stored between panels; a maximum
// is the same whichever blocks it is taken over): the bits of gqa's kernels on whole rows. sc: rows x ld floats
// (ld >= t), acc: rows x hv.
void PanelPass(const PanelArgs& p, int64_t rows, ScoresPrologue fused_scores, const gqa::Ops& ops, float* sc,
               int64_t ld, float* acc);
#endif

// Runs the call. Each task does its rows in a fixed order, and whether K is transposed depends only on S, so the
// bits do not depend on the thread count.
void Sdpa(const SdpaArgs& a);

}  // namespace npu_ep::kern
