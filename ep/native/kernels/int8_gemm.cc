// int8 GEMM, exact: every operand is mapped to u8 A' x s8 B' (int8 A +128, uint8 B -128, zero points shifted
// alike), so one integer dot product serves all four sign combinations:
//   sum_k (A' - azp')(B' - bzp') = dot(A', B') - bzp' * sum(A') - azp' * sum(B') + K * azp' * bzp'
// evaluated in wrapping 32-bit arithmetic, which equals the exact result whenever that fits int32 (as int32
// hardware accumulators). dot(): vpdpbusd on VNNI hosts (4 products per lane, no intermediate saturation);
// otherwise bytes widened to int16 and vpmaddwd (pair sums <= 2 * 255 * 128, exact) - never vpmaddubsw, whose
// int16 saturation is the inexactness ORT's AVX2 u8s8 path has.
// Register tile 4 rows x 4 columns; tasks are fixed chunks of columns, so bits do not depend on thread count.
#include "int8_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu.h"
#include "thread_pool.h"

#if NPU_EP_X86
#include <immintrin.h>
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace npu_ep::kern {
namespace {

constexpr int64_t kColsPerTask = 32;
constexpr int kTile = 4;

// dot of up to 4 rows x 4 columns over kp bytes; out[r][c]
using TileFn = void (*)(const uint8_t* const* a, const int8_t* const* b, int64_t kp, int32_t out[kTile][kTile]);

void TileScalar(const uint8_t* const* a, const int8_t* const* b, int64_t kp, int32_t out[kTile][kTile]) {
  for (int r = 0; r < kTile; ++r)
    for (int c = 0; c < kTile; ++c) {
      uint32_t s = 0;
      for (int64_t k = 0; k < kp; ++k) s += static_cast<uint32_t>(a[r][k] * b[c][k]);
      out[r][c] = static_cast<int32_t>(s);
    }
}

#if NPU_EP_X86
__attribute__((target("avx2,fma"))) inline int32_t HsumEpi32Avx2(__m256i v) {
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
  return _mm_cvtsi128_si32(x);
}

__attribute__((target("avx2,fma"))) void TileAvx2(const uint8_t* const* a, const int8_t* const* b, int64_t kp,
                                                  int32_t out[kTile][kTile]) {
  __m256i acc[kTile][kTile];
  for (auto& row : acc)
    for (auto& v : row) v = _mm256_setzero_si256();
  for (int64_t k = 0; k < kp; k += 16) {
    __m256i bv[kTile];
    for (int c = 0; c < kTile; ++c)
      bv[c] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[c] + k)));
    for (int r = 0; r < kTile; ++r) {
      const __m256i av = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a[r] + k)));
      for (int c = 0; c < kTile; ++c) acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(av, bv[c]));
    }
  }
  for (int r = 0; r < kTile; ++r)
    for (int c = 0; c < kTile; ++c) out[r][c] = HsumEpi32Avx2(acc[r][c]);
}

__attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni"))) void TileVnni(
    const uint8_t* const* a, const int8_t* const* b, int64_t kp, int32_t out[kTile][kTile]) {
  __m512i acc[kTile][kTile];
  for (auto& row : acc)
    for (auto& v : row) v = _mm512_setzero_si512();
  for (int64_t k = 0; k < kp; k += 64) {
    __m512i bv[kTile];
    for (int c = 0; c < kTile; ++c) bv[c] = _mm512_loadu_si512(b[c] + k);
    for (int r = 0; r < kTile; ++r) {
      const __m512i av = _mm512_loadu_si512(a[r] + k);
      for (int c = 0; c < kTile; ++c) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], av, bv[c]);
    }
  }
  for (int r = 0; r < kTile; ++r)
    for (int c = 0; c < kTile; ++c) out[r][c] = _mm512_reduce_add_epi32(acc[r][c]);
}
#endif

inline uint8_t Requantize(int32_t acc, float mult, int32_t zp, bool is_signed) {
  const float lo = is_signed ? -128.0f : 0.0f, hi = is_signed ? 127.0f : 255.0f;
  const float z = static_cast<float>(zp);
  float v = static_cast<float>(acc) * mult;
  v = std::min(std::max(v, lo - z), hi - z);
  v = std::nearbyint(v) + z;  // half to even (default rounding mode)
  const int32_t q = static_cast<int32_t>(v);
  return static_cast<uint8_t>(is_signed ? static_cast<uint8_t>(static_cast<int8_t>(q)) : q);
}

}  // namespace

void Int8MatMul(const Int8Gemm& g) {
  if (g.M == 0 || g.N == 0) return;
  // A' = u8 rows padded to kp, and their sums
  std::vector<uint8_t> ap(g.M * g.kp, 0);
  std::vector<int32_t> asum(g.M, 0);
  const uint8_t flip = g.a_signed ? 0x80 : 0x00;
  for (int64_t m = 0; m < g.M; ++m) {
    int32_t s = 0;
    for (int64_t k = 0; k < g.K; ++k) {
      const uint8_t v = g.a[m * g.K + k] ^ flip;  // int8 x + 128 == uint8 bits of x with the sign bit flipped
      ap[m * g.kp + k] = v;
      s += v;
    }
    asum[m] = s;
  }
  const Isa isa = ActiveIsa();
  TileFn tile = TileScalar;
#if NPU_EP_X86
  if (isa >= Isa::kAvx2) tile = TileAvx2;
  if (isa == Isa::kAvx512Vnni) tile = TileVnni;
#else
  (void)isa;
#endif
  const int32_t a_shift = g.a_signed ? 128 : 0;
  const int64_t n_tasks = (g.N + kColsPerTask - 1) / kColsPerTask;
  ParallelFor(g.threads, n_tasks, [&](int64_t task) {
    const int64_t n0 = task * kColsPerTask, n1 = std::min(g.N, n0 + kColsPerTask);
    for (int64_t m0 = 0; m0 < g.M; m0 += kTile) {
      for (int64_t c0 = n0; c0 < n1; c0 += kTile) {
        const uint8_t* ar[kTile];
        const int8_t* br[kTile];
        for (int r = 0; r < kTile; ++r) ar[r] = ap.data() + std::min(m0 + r, g.M - 1) * g.kp;
        for (int c = 0; c < kTile; ++c) br[c] = g.bt + std::min(c0 + c, n1 - 1) * g.kp;
        int32_t d[kTile][kTile];
        tile(ar, br, g.kp, d);
        for (int r = 0; r < kTile && m0 + r < g.M; ++r) {
          const int64_t m = m0 + r;
          const uint32_t azp = static_cast<uint32_t>((g.azp_per_row ? g.azp[m] : g.azp[0]) + a_shift);
          for (int c = 0; c < kTile && c0 + c < n1; ++c) {
            const int64_t n = c0 + c;
            const uint32_t bzp = static_cast<uint32_t>(g.bzp[n]);
            const uint32_t v = static_cast<uint32_t>(d[r][c]) - bzp * static_cast<uint32_t>(asum[m]) -
                               azp * static_cast<uint32_t>(g.bsum[n]) + static_cast<uint32_t>(g.K) * azp * bzp;
            const int32_t acc = static_cast<int32_t>(v);
            if (g.y != nullptr)
              g.y[m * g.N + n] = Requantize(acc, g.mult[g.mult_per_col ? n : 0], g.y_zp, g.y_signed);
            else
              g.acc[m * g.N + n] = acc;
          }
        }
      }
    }
  });
}

}  // namespace npu_ep::kern
