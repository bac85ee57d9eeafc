// Linear layers on 16-bit float weights (GGUF F16 and BF16), kept as stored: half of float32's
// memory and of the bytes a decode step streams. Activations stay fp32 (no int8 grid: the weight
// already is the only rounding); each 8-value weight chunk is widened to fp32 once (F16C's
// vcvtph2ps; a bf16 is a float32's top half, so a 16-bit shift) and FMA'd into several rows.
#include "quant_rows.h"

namespace radixlm {
namespace {

template <bool BF16>
static inline __m256 widen8(const uint8_t* p) {
  const __m128i h = _mm_loadu_si128((const __m128i*)p);
  if constexpr (BF16) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(h);
  }
}

template <bool BF16>
static inline float widen1(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  if constexpr (BF16) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  } else {
    return _cvtsh_ss(h);
  }
}

// RM activation rows x RN weight rows. Every output is one FMA chain over the 8-value chunks in
// order, its hsum, then the < 8 tail values in order, then the bias: the same operations
// whatever the tile, so a row's result never depends on its batch (scalar a * b + c is never
// fused: -ffp-contract=off).
template <bool BF16, int RM, int RN>
void tile16(const uint8_t* W, int64_t rb, int64_t n0, const float* x, int64_t ldx, int64_t m0, int64_t K, float* out,
            int64_t ldo, const float* bias) {
  __m256 acc[RM][RN];
  for (int m = 0; m < RM; ++m)
    for (int n = 0; n < RN; ++n) acc[m][n] = _mm256_setzero_ps();
  const uint8_t* w[RN];
  const float* xr[RM];
  for (int n = 0; n < RN; ++n) w[n] = W + (n0 + n) * rb;
  for (int m = 0; m < RM; ++m) xr[m] = x + (m0 + m) * ldx;
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 wv[RN];
    for (int n = 0; n < RN; ++n) wv[n] = widen8<BF16>(w[n] + 2 * k);
    for (int m = 0; m < RM; ++m) {
      const __m256 xv = _mm256_loadu_ps(xr[m] + k);
      for (int n = 0; n < RN; ++n) acc[m][n] = _mm256_fmadd_ps(xv, wv[n], acc[m][n]);
    }
  }
  for (int m = 0; m < RM; ++m)
    for (int n = 0; n < RN; ++n) {
      float s = hsum(acc[m][n]);
      for (int64_t j = k; j < K; ++j) s += xr[m][j] * widen1<BF16>(w[n] + 2 * j);
      out[(m0 + m) * ldo + n0 + n] = s + (bias ? bias[n0 + n] : 0.0f);
    }
}

// Rows of M in blocks that stay in L2 while a thread's weight tiles pass over them.
constexpr int64_t M_BLOCK16 = 64;

template <bool BF16>
void gemm16(const uint8_t* W, int64_t rb, int64_t N, const float* x, int64_t ldx, int64_t M, int64_t K, float* out,
            int64_t ldo, const float* bias) {
  // One row (decode) reads each weight once: 4 weight rows per tile give 4 independent FMA
  // chains. Several rows: 4 x 2 tiles, each widened weight chunk used by 4 rows.
  const int64_t RN = M == 1 ? 4 : 2;
  const int64_t tiles = (N + RN - 1) / RN;
  const int64_t grain = std::max<int64_t>(1, tiles / (4 * at::get_num_threads()));
  at::parallel_for(0, tiles, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t mb = 0; mb < M; mb += M_BLOCK16) {
      const int64_t me = std::min(M, mb + M_BLOCK16);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t n0 = t * RN;
        if (n0 + RN > N) {  // ragged last columns, one at a time
          for (int64_t n = n0; n < N; ++n)
            for (int64_t m = mb; m < me; ++m) tile16<BF16, 1, 1>(W, rb, n, x, ldx, m, K, out, ldo, bias);
          continue;
        }
        if (M == 1) {
          tile16<BF16, 1, 4>(W, rb, n0, x, ldx, 0, K, out, ldo, bias);
          continue;
        }
        int64_t m = mb;
        for (; m + 4 <= me; m += 4) tile16<BF16, 4, 2>(W, rb, n0, x, ldx, m, K, out, ldo, bias);
        for (; m < me; ++m) tile16<BF16, 1, 2>(W, rb, n0, x, ldx, m, K, out, ldo, bias);
      }
    }
  });
}

template <bool BF16>
void dequant16(const uint8_t* w, int64_t K, float* y) {
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) _mm256_storeu_ps(y + k, widen8<BF16>(w + 2 * k));
  for (; k < K; ++k) y[k] = widen1<BF16>(w + 2 * k);
}

}  // namespace

bool gemm_float16(int64_t fmt, const uint8_t* W, int64_t rb, int64_t N, const float* x, int64_t ldx, int64_t M,
                  int64_t K, float* out, int64_t ldo, const float* bias) {
  switch (fmt) {
    case FMT_F16: gemm16<false>(W, rb, N, x, ldx, M, K, out, ldo, bias); return true;
    case FMT_BF16: gemm16<true>(W, rb, N, x, ldx, M, K, out, ldo, bias); return true;
    default: return false;
  }
}

bool dequant_row_float16(int64_t fmt, const uint8_t* w, int64_t K, float* y) {
  switch (fmt) {
    case FMT_F16: dequant16<false>(w, K, y); return true;
    case FMT_BF16: dequant16<true>(w, K, y); return true;
    default: return false;
  }
}

}  // namespace radixlm
