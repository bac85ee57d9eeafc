// Activations quantized to int8 per 32 values (llama.cpp's Q8 activations), shared by the
// row-major kernels (quant_gemm.cpp) and the 8-row interleaved ones (quant_x8.cpp).
#pragma once
#include "api.h"
#include "qact_view.h"

#include <cmath>

namespace radixlm {

inline void quantize_row(const float* x, int8_t* q, float* d, float* s, int64_t K) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < K / 32; ++b) {
    const float* xb = x + b * 32;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xb + 8 * i);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
    }
    const float m = hmax(amax);
    // A max below 127 / FLT_MAX (~3.7e-37) has no finite 127 / m: such a block quantizes as an
    // all-zero one (an infinite factor made garbage integers). Non-finite inputs are as before.
    const float inv = m > 0.0f ? 127.0f / m : 0.0f;
    const bool tiny = std::isinf(inv);
    const float db = tiny ? 0.0f : m / 127.0f;
    const __m256 id = _mm256_set1_ps(tiny ? 0.0f : inv);
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], id));  // round to nearest even
    __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], id));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], id));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], id));
    __m256i isum = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    i0 = _mm256_packs_epi32(i0, i1);
    i2 = _mm256_packs_epi32(i2, i3);
    i0 = _mm256_packs_epi16(i0, i2);
    i0 = _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i*)(q + b * 32), i0);
    d[b] = db;
    s[b] = db * hsum(_mm256_cvtepi32_ps(isum));
  }
}

// Q8_K-style activations (QAct::per256): per 256 values q = round(x / d), d = max|x| / 127 (the
// same rounding and tiny-max rule as quantize_row's), and per 32 the two 16-value integer sums
// as int16 halves of one int32 (low: values 0..15), as act_sums16 packs them.
inline void quantize_row_k(const float* x, int8_t* q, float* d, int32_t* s16, int64_t K) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t sb = 0; sb < K / 256; ++sb) {
    const float* xs = x + sb * 256;
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < 32; ++i) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(xs + 8 * i)));
    const float m = hmax(amax);
    const float inv = m > 0.0f ? 127.0f / m : 0.0f;
    const bool tiny = std::isinf(inv);
    d[sb] = tiny ? 0.0f : m / 127.0f;
    const __m256 id = _mm256_set1_ps(tiny ? 0.0f : inv);
    for (int b = 0; b < 8; ++b) {
      const float* xb = xs + 32 * b;
      __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb), id));  // round to nearest even
      __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 8), id));
      __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 16), id));
      __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 24), id));
      const int32_t lo = (int32_t)hsum(_mm256_cvtepi32_ps(_mm256_add_epi32(i0, i1)));  // |sum| <= 2032: exact
      const int32_t hi = (int32_t)hsum(_mm256_cvtepi32_ps(_mm256_add_epi32(i2, i3)));
      s16[sb * 8 + b] = (int32_t)(((uint32_t)(uint16_t)(int16_t)hi << 16) | (uint16_t)(int16_t)lo);
      i0 = _mm256_packs_epi32(i0, i1);
      i2 = _mm256_packs_epi32(i2, i3);
      i0 = _mm256_packs_epi16(i0, i2);
      i0 = _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256((__m256i*)(q + sb * 256 + 32 * b), i0);
    }
  }
}

// Whether a format's kernels take QAct::per256 activations (the rest: per 32).
inline bool fmt_takes_k_acts(int64_t fmt) { return fmt == FMT_Q4KX8 || fmt == FMT_Q6KX8; }

// 8-row interleaved formats (quant_x8.cpp): repacked at load from Q4_0 / Q4_1 / Q8_0.
at::Tensor repack_x8(const at::Tensor& w, int64_t fmt, int64_t cols);
void gemm_x8(int64_t fmt, const uint8_t* W, int64_t group_bytes, int64_t N, const QAct& a, int64_t M, float* out,
             int64_t ldo, const float* bias);
// The activations' 16-value integer sums of rows [m0, m1), a pair per 32 values (QAct::sum16),
// written at out + m * nb: what Q6_KX8 needs, made once by callers that run many slices.
void act_sums16(const QAct& a, int64_t m0, int64_t m1, int32_t* out);
void dequant_row_x8(int64_t fmt, const uint8_t* W, int64_t group_bytes, int64_t row, int64_t K, float* y);
// Their K-quant layouts (quant_kx8.cpp): repacked from Q4_K / Q6_K.
at::Tensor repack_kx8(const at::Tensor& w, int64_t fmt, int64_t cols);
void dequant_row_kx8(int64_t fmt, const uint8_t* W, int64_t group_bytes, int64_t row, int64_t K, float* y);

}  // namespace radixlm
