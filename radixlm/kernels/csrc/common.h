// Shared AVX2 helpers and the quantized formats' ids (radixlm/kernels/formats.py mirrors them).
#pragma once
#include <immintrin.h>
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <cstdint>
#include <cstring>

namespace radixlm {

// Weight formats: a quantized matrix is a uint8 tensor [rows, row_bytes] of GGUF blocks.
enum Fmt : int64_t {
  FMT_Q8_0 = 0,  // 32 values: fp16 d, int8 q[32]               x = d*q
  FMT_Q4_0 = 1,  // 32 values: fp16 d, nibbles[16]               x = d*(q-8)
  FMT_Q4_1 = 2,  // 32 values: fp16 d, fp16 m, nibbles[16]       x = d*q + m
  FMT_Q4_K = 3,  // 256 values: fp16 d, dmin, scales[12], nibbles[128]
  FMT_Q6_K = 4,  // 256 values: ql[128], qh[64], int8 scales[16], fp16 d
  FMT_I8 = 5,    // a row: fp32 scale, int8 q[cols]              x = s*q (per output channel)
  // 8 rows interleaved (quant_x8.cpp), made at load; a stored row is a group of 8 weight rows.
  FMT_Q4X8 = 6,  // per 32 values: fp16 d[8], fp16 m[8], 4 x (8 rows x 4 nibble bytes)   x = d*q + m
  FMT_Q8X8 = 7,  // per 32 values: fp16 d[8], 8 x (8 rows x 4 int8)                      x = d*q
  // More GGUF formats (quant_gguf.cpp).
  FMT_Q5_0 = 8,     // 32 values: fp16 d, qh[4], nibbles[16]            x = d*(q-16), q = 5 bits
  FMT_Q5_1 = 9,     // 32 values: fp16 d, fp16 m, qh[4], nibbles[16]    x = d*q + m
  FMT_IQ4_NL = 10,  // 32 values: fp16 d, nibbles[16]                   x = d*kvalues[q]
  FMT_Q5_K = 11,    // 256 values: fp16 d, dmin, scales[12], qh[32], nibbles[128]
  FMT_Q3_K = 12,    // 256 values: hmask[32], 2-bit qs[64], scales[12], fp16 d
  FMT_Q2_K = 13,    // 256 values: scales[16], 2-bit qs[64], fp16 d, dmin
  FMT_IQ4_XS = 14,  // 256 values: fp16 d, scales_h[2], scales_l[4], nibbles[128]
  // 16-bit floats (float16_gemm.cpp): a row is its values as stored; activations stay fp32.
  FMT_F16 = 15,   // IEEE half
  FMT_BF16 = 16,  // bfloat16 (a float32's top 16 bits)
  // K-quants 8 rows interleaved (x8_tiles.h has the layouts), made at load from Q4_K / Q6_K.
  FMT_Q4KX8 = 17,  // per 256 values: 1184 bytes (Q4_K's 8 x 144, scales unpacked to bytes)
  FMT_Q6KX8 = 18,  // per 256 values: 1680 bytes (Q6_K's 8 x 210)
  FMT_MXFP4 = 19,  // 32 values: e8m0 e, nibbles[16] (quant_gguf.cpp)   x = 2^(e-128)*kvalues[q] (e2m1 x 2)
  FMT_MXFP4X8 = 20,  // per 32 values: e8m0 e[8], 4 x (8 rows x 4 nibble bytes) (x8_tiles.h)
  FMT_FP8 = 21,  // 128 values: fp32 256 s, e4m3 q[128] (float16_gemm.cpp)   x = 256 s * (q as a half)
  FMT_Q5X8 = 22,  // per 32 values: Q4X8's 160 bytes, then 8 x 32 fifth bits (x8_tiles.h)   x = d*q + m
  // Q4_0 / Q5_0 interleaved without m (the kernels make m = -8 d / -16 d from d): 144 / 176 bytes
  // per 8 x 32 values, the row-major blocks' own size.
  FMT_Q4_0X8 = 23,  // per 32 values: fp16 d[8], 4 x (8 rows x 4 nibble bytes)              x = d*(q-8)
  FMT_Q5_0X8 = 24,  // per 32 values: Q4_0X8's 144 bytes, then 8 x 32 fifth bits            x = d*(q-16)
};

inline bool fmt_is_x8(int64_t f) {
  return f == FMT_Q4X8 || f == FMT_Q8X8 || f == FMT_Q4KX8 || f == FMT_Q6KX8 || f == FMT_MXFP4X8 || f == FMT_Q5X8 ||
         f == FMT_Q4_0X8 || f == FMT_Q5_0X8;
}
// Weight rows per stored row: 8 for the interleaved formats.
inline int64_t fmt_group(int64_t f) { return fmt_is_x8(f) ? 8 : 1; }

// Formats multiplied by fp32 activations as they are (float16_gemm.cpp); the rest round them to int8.
inline bool fmt_is_float16(int64_t f) { return f == FMT_F16 || f == FMT_BF16 || f == FMT_FP8; }

inline int64_t fmt_block(int64_t f) {
  switch (f) {
    case FMT_F16:
    case FMT_BF16: return 1;
    case FMT_Q4_K:
    case FMT_Q6_K:
    case FMT_Q5_K:
    case FMT_Q3_K:
    case FMT_Q2_K:
    case FMT_IQ4_XS:
    case FMT_Q4KX8:
    case FMT_Q6KX8: return 256;
    case FMT_FP8: return 128;
    default: return 32;
  }
}
inline int64_t fmt_block_bytes(int64_t f) {
  switch (f) {
    case FMT_Q8_0: return 34;
    case FMT_Q4_0: return 18;
    case FMT_Q4_1: return 20;
    case FMT_Q4_K: return 144;
    case FMT_Q6_K: return 210;
    case FMT_I8: return 32;  // 32 int8 per 32 values; the row's 4-byte scale comes first
    case FMT_Q4X8: return 160;
    case FMT_Q8X8: return 272;
    case FMT_Q5_0: return 22;
    case FMT_Q5_1: return 24;
    case FMT_IQ4_NL: return 18;
    case FMT_Q5_K: return 176;
    case FMT_Q3_K: return 110;
    case FMT_Q2_K: return 84;
    case FMT_IQ4_XS: return 136;
    case FMT_MXFP4: return 17;
    case FMT_MXFP4X8: return 136;
    case FMT_Q5X8: return 192;
    case FMT_Q4_0X8: return 144;
    case FMT_Q5_0X8: return 176;
    case FMT_Q4KX8: return 1184;
    case FMT_Q6KX8: return 1680;
    case FMT_F16:
    case FMT_BF16: return 2;
    case FMT_FP8: return 132;
  }
  TORCH_CHECK(false, "unknown quantized format id ", f);
}
inline int64_t fmt_row_bytes(int64_t f, int64_t cols) {
  return cols / fmt_block(f) * fmt_block_bytes(f) + (f == FMT_I8 ? 4 : 0);
}

static inline float fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

static inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// sum(x^2) over n values (the norms' statistic: 8 lanes of FMAs, then the tail in order).
static inline float sum_squares(const float* x, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float ss = hsum(acc);
  for (; i < n; ++i) ss += x[i] * x[i];
  return ss;
}

static inline float hmax(__m256 v) {
  __m128 lo = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_max_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_max_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// sum over 32 bytes of u[i] * s[i] (u unsigned < 128 or so, s signed) as 8 int32 lanes.
static inline __m256i dot_us(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// sum over 32 bytes of a[i] * b[i], both signed int8 (|a| <= 127 or b's sign trick is exact).
static inline __m256i dot_ss(__m256i a, __m256i b) {
  return dot_us(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

// exp for 8 floats (Cephes' polynomial, ~1 ulp); inputs clamped to where 2^n stays normal.
static inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(x, x), x), _mm256_set1_ps(1.0f));
  const __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}

static inline __m256 load8_as_float(const float* p) { return _mm256_loadu_ps(p); }

}  // namespace radixlm
