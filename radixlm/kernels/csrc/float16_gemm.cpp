// Linear layers on float weights kept as stored: 16-bit (GGUF F16 and BF16: half of float32's
// memory and of the bytes a decode step streams) and FP8 e4m3 with a float32 scale per 128 values
// (a quarter, plus 3%: pre-quantized FP8 checkpoints, model/fp8_checkpoint.py). Activations stay
// fp32 (no int8 grid: the weight already is the only rounding); each 8-value weight chunk is
// widened to fp32 once (F16C's vcvtph2ps; a bf16 is a float32's top half, so a 16-bit shift; an
// e4m3 byte, its 7 magnitude bits shifted into a half's exponent and mantissa, is a half of
// 2^-8 its value, the 2^8 being folded into the block's stored scale) and FMA'd into several rows.
#include "quant_rows.h"

namespace radixlm {
namespace {

enum class W { F16, BF16, FP8 };

// FP8: blocks of [float32 scale * 256][128 e4m3 bytes].
constexpr int64_t FP8_BLOCK = 128, FP8_BLOCK_BYTES = 4 + FP8_BLOCK;

static inline float fp8_scale(const uint8_t* row, int64_t k) {
  float s;
  std::memcpy(&s, row + k / FP8_BLOCK * FP8_BLOCK_BYTES, 4);
  return s;
}

static inline const uint8_t* fp8_at(const uint8_t* row, int64_t k) {
  return row + k / FP8_BLOCK * FP8_BLOCK_BYTES + 4 + k % FP8_BLOCK;
}

// 8 e4m3 bytes as floats of 2^-8 their value: each byte in a 16-bit lane's high half (b << 8:
// sign at bit 15, magnitude at 8..14), shifted right arithmetically by one (magnitude at 7..13:
// a half's exponent and mantissa) with the sign's copy at bit 14 cleared, then F16C.
static inline __m256 fp8_halves(const uint8_t* p) {
  const __m128i h = _mm_unpacklo_epi8(_mm_setzero_si128(), _mm_loadl_epi64((const __m128i*)p));
  return _mm256_cvtph_ps(_mm_and_si128(_mm_srai_epi16(h, 1), _mm_set1_epi16((short)0xBFFF)));
}

// Weights k .. k + 7 of a stored row (a chunk never crosses an FP8 block: blocks are 8-aligned).
template <W T>
static inline __m256 widen8(const uint8_t* row, int64_t k) {
  if constexpr (T == W::FP8) {
    return _mm256_mul_ps(fp8_halves(fp8_at(row, k)), _mm256_set1_ps(fp8_scale(row, k)));
  } else {
    const __m128i h = _mm_loadu_si128((const __m128i*)(row + 2 * k));
    if constexpr (T == W::BF16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(h);
    }
  }
}

template <W T>
static inline float widen1(const uint8_t* row, int64_t k) {
  if constexpr (T == W::FP8) {
    const uint8_t b = *fp8_at(row, k);
    return _cvtsh_ss((uint16_t)(((b & 0x80) << 8) | ((b & 0x7F) << 7))) * fp8_scale(row, k);
  } else {
    uint16_t h;
    std::memcpy(&h, row + 2 * k, 2);
    if constexpr (T == W::BF16) {
      const uint32_t u = (uint32_t)h << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    } else {
      return _cvtsh_ss(h);
    }
  }
}

// RM activation rows x RN weight rows. Every output is one FMA chain over the 8-value chunks in
// order, its hsum, then the < 8 tail values in order, then the bias: the same operations
// whatever the tile, so a row's result never depends on its batch (scalar a * b + c is never
// fused: -ffp-contract=off).
template <W T, int RM, int RN>
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
  if constexpr (T == W::FP8) {
    // Per 128-value block: an FMA chain over its 16 chunks of x times the unscaled bytes, then
    // one FMA of that by the block's scale into the row's sum (a multiply per chunk saved).
    for (; k < K; k += FP8_BLOCK) {
      __m256 part[RM][RN], sv[RN];
      const uint8_t* q[RN];
      for (int n = 0; n < RN; ++n) {
        sv[n] = _mm256_set1_ps(fp8_scale(w[n], k));
        q[n] = fp8_at(w[n], k);
      }
      for (int m = 0; m < RM; ++m)
        for (int n = 0; n < RN; ++n) part[m][n] = _mm256_setzero_ps();
      for (int j = 0; j < FP8_BLOCK; j += 8) {
        __m256 wv[RN];
        for (int n = 0; n < RN; ++n) wv[n] = fp8_halves(q[n] + j);
        for (int m = 0; m < RM; ++m) {
          const __m256 xv = _mm256_loadu_ps(xr[m] + k + j);
          for (int n = 0; n < RN; ++n) part[m][n] = _mm256_fmadd_ps(xv, wv[n], part[m][n]);
        }
      }
      for (int m = 0; m < RM; ++m)
        for (int n = 0; n < RN; ++n) acc[m][n] = _mm256_fmadd_ps(part[m][n], sv[n], acc[m][n]);
    }
  }
  for (; k + 8 <= K; k += 8) {
    __m256 wv[RN];
    for (int n = 0; n < RN; ++n) wv[n] = widen8<T>(w[n], k);
    for (int m = 0; m < RM; ++m) {
      const __m256 xv = _mm256_loadu_ps(xr[m] + k);
      for (int n = 0; n < RN; ++n) acc[m][n] = _mm256_fmadd_ps(xv, wv[n], acc[m][n]);
    }
  }
  for (int m = 0; m < RM; ++m)
    for (int n = 0; n < RN; ++n) {
      float s = hsum(acc[m][n]);
      for (int64_t j = k; j < K; ++j) s += xr[m][j] * widen1<T>(w[n], j);
      out[(m0 + m) * ldo + n0 + n] = s + (bias ? bias[n0 + n] : 0.0f);
    }
}

// Rows of M in blocks that stay in L2 while a thread's weight tiles pass over them.
constexpr int64_t M_BLOCK16 = 64;

template <W T>
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
            for (int64_t m = mb; m < me; ++m) tile16<T, 1, 1>(W, rb, n, x, ldx, m, K, out, ldo, bias);
          continue;
        }
        if (M == 1) {
          tile16<T, 1, 4>(W, rb, n0, x, ldx, 0, K, out, ldo, bias);
          continue;
        }
        int64_t m = mb;
        for (; m + 4 <= me; m += 4) tile16<T, 4, 2>(W, rb, n0, x, ldx, m, K, out, ldo, bias);
        for (; m < me; ++m) tile16<T, 1, 2>(W, rb, n0, x, ldx, m, K, out, ldo, bias);
      }
    }
  });
}

template <W T>
void dequant16(const uint8_t* w, int64_t K, float* y) {
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) _mm256_storeu_ps(y + k, widen8<T>(w, k));
  for (; k < K; ++k) y[k] = widen1<T>(w, k);
}

}  // namespace

bool gemm_float16(int64_t fmt, const uint8_t* W, int64_t rb, int64_t N, const float* x, int64_t ldx, int64_t M,
                  int64_t K, float* out, int64_t ldo, const float* bias) {
  switch (fmt) {
    case FMT_F16: gemm16<W::F16>(W, rb, N, x, ldx, M, K, out, ldo, bias); return true;
    case FMT_BF16: gemm16<W::BF16>(W, rb, N, x, ldx, M, K, out, ldo, bias); return true;
    case FMT_FP8: gemm16<W::FP8>(W, rb, N, x, ldx, M, K, out, ldo, bias); return true;
    default: return false;
  }
}

bool dequant_row_float16(int64_t fmt, const uint8_t* w, int64_t K, float* y) {
  switch (fmt) {
    case FMT_F16: dequant16<W::F16>(w, K, y); return true;
    case FMT_BF16: dequant16<W::BF16>(w, K, y); return true;
    case FMT_FP8: dequant16<W::FP8>(w, K, y); return true;
    default: return false;
  }
}

}  // namespace radixlm
