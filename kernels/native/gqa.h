// com.microsoft GroupQueryAttention (float32, or float16 in/out with float32 math) as a native kernel: rotary, KV-cache
// append into the present buffer, causal/windowed softmax attention, one task per (batch, kv head). The numpy kernel
// (kernels/ops/attention_gqa.py) is the reference; it resolves lengths and buffers, this runs the math.
#pragma once

#include <cstdint>

namespace npu_ep::kern {

struct GqaArgs {
  int64_t B = 0, S = 0, N = 0, Nkv = 0, H = 0;
  // Row (b, s) of Q starts at q + (b*S + s) * q_tok; query head n at + n*H. K likewise with k_tok, V with v_tok
  // (each its own pitch: a rotated K is a fresh array, V a column slice of a QKV product; packed QKV:
  // k = q + N*H, v = q + (N+Nkv)*H, k_tok = v_tok = q_tok).
  // q, k, v, past_k, past_v, present and out hold float, or IEEE half bits when fp16.
  bool fp16 = false;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t q_tok = 0, k_tok = 0, v_tok = 0;
  const void* past_k = nullptr;  // [B, Nkv, P, H] or null (the past prefix then reads as zeros)
  const void* past_v = nullptr;
  int64_t P = 0;
  void* present_k = nullptr;  // [B, Nkv, T, H] each: rows >= dirty are zero on entry
  void* present_v = nullptr;
  int64_t T = 0, dirty = 0;
  const int32_t* past_len = nullptr;  // [B] past_b: new rows go to [past_b, past_b + S)
  const int32_t* total_len = nullptr;  // [B] total_b: keys >= total_b are never seen
  float scale = 1.0f, softcap = 0.0f;
  int64_t window = -1;  // > 0: query at position p sees keys t > p - window
  const float* cos = nullptr;  // [max_pos, half] float32 (rotary on Q and new K when non-null)
  const float* sin = nullptr;
  int64_t max_pos = 0, half = 0;
  bool interleaved = false;
  const int64_t* position_ids = nullptr;  // [B, S] or null (positions past_b + s)
  void* out = nullptr;  // [B, S, N*H]
  int threads = 1;
};

// K/V bytes one call moves (issue 41: appends in place vs copies of the cache): the new rows written into the
// presents, and the past rows copied into presents that are separate buffers (none when they are the past buffers:
// ORT's shared-buffer mode, IOBinding of past and present to one OrtValue).
struct KvTraffic {
  bool in_place = false;  // present_k/present_v are past_k/past_v
  int64_t appended_bytes = 0;  // new K and V rows written (S per batch row)
  int64_t copied_bytes = 0;  // valid past K and V rows copied into a separate present
};
KvTraffic TrafficOf(const GqaArgs& a);

// Validates positions (throws std::out_of_range naming the bad one) and row bounds, then runs. Each (batch, kv
// head) task does its rows in a fixed order, so the bits do not depend on the thread count.
void GroupQueryAttention(const GqaArgs& a);

}  // namespace npu_ep::kern
