// Row-major GEMM drivers over quantized weights, shared by quant_gemm.cpp and quant_gguf.cpp:
// gemm32<F> tiles 32-value block formats (F unpacks one block to bytes), gemm<K> runs a
// super-block kernel K (256 values) one weight row at a time against up to 4 activation rows.
#pragma once
#include "qact.h"

#include <algorithm>

namespace radixlm {

// ---- 32-value block formats: register-tiled ----
// A tile is RM activation rows x RN weight rows; each weight block is unpacked once per tile and
// each activation block loaded once per row. Every output element is computed by the same
// sequence of operations whatever the tile shape (acc += cvt(int dot) * (dw * da) per block in
// order, then hsum + the offset term), so a row's result never depends on its batch.
// F: bytes (per block), header (bytes before a row's blocks), is_signed (unpack gives int8, else
// unsigned bytes), has_offset (a per-block offset times the activation block's sum is added),
// unpack(blk, dw, off) and row_scale(row).
// Per block: acc += cvt(int dot) * (dw * da); the
// offset term (Q4: -8 dw or m, times the activation block's sum) is a dot over blocks done after.
constexpr int64_t MAX_BLOCKS = 4096;  // in_features up to 131072

template <class F, int RM, int RN>
inline void tile32(const uint8_t* W, int64_t row_bytes, int64_t n0, const QAct& a, int64_t m0, float* out, int64_t ldo,
                   const float* bias) {
  __m256 acc[RM][RN];
  for (int m = 0; m < RM; ++m)
    for (int n = 0; n < RN; ++n) acc[m][n] = _mm256_setzero_ps();
  alignas(32) float offs[F::has_offset ? RN : 1][F::has_offset ? MAX_BLOCKS : 1];
  const uint8_t* rows[RN];
  for (int n = 0; n < RN; ++n) rows[n] = W + (n0 + n) * row_bytes;
  for (int64_t b = 0; b < a.nb; ++b) {
    __m256i u[RN], sg[RN];
    float dw[RN];
    for (int n = 0; n < RN; ++n) {
      float off;
      const __m256i w = F::unpack(rows[n] + F::header + b * F::bytes, dw[n], off);
      if constexpr (F::has_offset) offs[n][b] = off;
      if constexpr (F::is_signed) {
        u[n] = _mm256_sign_epi8(w, w);
        sg[n] = w;
      } else {
        u[n] = w;
      }
    }
    for (int m = 0; m < RM; ++m) {
      const __m256i av = _mm256_loadu_si256((const __m256i*)(a.qrow(m0 + m) + b * 32));
      const float da = a.drow(m0 + m)[b];
      for (int n = 0; n < RN; ++n) {
        __m256i p;
        if constexpr (F::is_signed) {
          p = dot_us(u[n], _mm256_sign_epi8(av, sg[n]));
        } else {
          p = dot_us(u[n], av);
        }
        acc[m][n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw[n] * da), acc[m][n]);
      }
    }
  }
  for (int n = 0; n < RN; ++n) {
    const float rs = F::row_scale(rows[n]), bn = bias ? bias[n0 + n] : 0.0f;
    for (int m = 0; m < RM; ++m) {
      float corr = 0.0f;
      if constexpr (F::has_offset) {
        const float* s = a.srow(m0 + m);
        __m256 c = _mm256_setzero_ps();
        int64_t b = 0;
        for (; b + 8 <= a.nb; b += 8) c = _mm256_fmadd_ps(_mm256_load_ps(offs[n] + b), _mm256_loadu_ps(s + b), c);
        corr = hsum(c);
        for (; b < a.nb; ++b) corr += offs[n][b] * s[b];
      }
      out[(m0 + m) * ldo + n0 + n] = (hsum(acc[m][n]) + corr) * rs + bn;
    }
  }
}

// Rows of M in blocks that stay in L2 while a thread's weight tiles pass over them.
constexpr int64_t M_BLOCK = 64;

template <class F>
void gemm32(const uint8_t* W, int64_t row_bytes, int64_t N, const QAct& a, int64_t M, float* out, int64_t ldo,
            const float* bias) {
  // Column tiles of 4 for one activation row (decode: 4 independent accumulator chains), of 2
  // when several rows share each unpacked weight block.
  const int64_t RN = 2;
  const int64_t tiles = (N + RN - 1) / RN;
  const int64_t grain = std::max<int64_t>(1, tiles / (4 * at::get_num_threads()));
  at::parallel_for(0, tiles, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t mb = 0; mb < M; mb += M_BLOCK) {
      const int64_t me = std::min(M, mb + M_BLOCK);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t n0 = t * RN;
        if (n0 + RN > N) {  // ragged last columns, one at a time
          for (int64_t n = n0; n < N; ++n)
            for (int64_t m = mb; m < me; ++m) tile32<F, 1, 1>(W, row_bytes, n, a, m, out, ldo, bias);
          continue;
        }
        if (M == 1) {
          tile32<F, 1, 1>(W, row_bytes, n0, a, 0, out, ldo, bias);
          tile32<F, 1, 1>(W, row_bytes, n0 + 1, a, 0, out, ldo, bias);
          continue;
        }
        int64_t m = mb;
        for (; m + 4 <= me; m += 4) tile32<F, 4, 2>(W, row_bytes, n0, a, m, out, ldo, bias);
        for (; m < me; ++m) tile32<F, 1, 2>(W, row_bytes, n0, a, m, out, ldo, bias);
      }
    }
  });
}

// ---- K-quants (256-value super-blocks): one weight row at a time against up to 4 activation rows ----
// K::run<R>(w, a, m, res): res[r] = weight row w . activation row m + r, each row by the same
// operations whatever R (batch invariance).

inline void q4k_scale_min(int j, const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

template <class K>
void gemm(const uint8_t* W, int64_t row_bytes, int64_t N, const QAct& a, int64_t M, float* out, int64_t ldo,
          const float* bias) {
  // Parallel over output features; each weight row is read from memory once and stays in L1
  // while every 4-row tile of activations passes over it.
  const int64_t grain = std::max<int64_t>(8, N / (8 * at::get_num_threads()));
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
    float res[4];
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* w = W + n * row_bytes;
      const float bn = bias ? bias[n] : 0.0f;
      for (int64_t m = 0; m < M; m += 4) {
        const int64_t R = std::min<int64_t>(4, M - m);
        switch (R) {
          case 4: K::template run<4>(w, a, m, res); break;
          case 3: K::template run<3>(w, a, m, res); break;
          case 2: K::template run<2>(w, a, m, res); break;
          default: K::template run<1>(w, a, m, res); break;
        }
        for (int64_t r = 0; r < R; ++r) out[(m + r) * ldo + n] = res[r] + bn;
      }
    }
  });
}


// out[m, n] = weight row n . activation row m for any int8-activation format (qlinear's dispatch
// on raw pointers; fused ops such as moe.cpp call it on slices of a weight).
void gemm_quantized(int64_t fmt, const uint8_t* W, int64_t row_bytes, int64_t N, const QAct& a, int64_t M, float* out,
                    int64_t ldo, const float* bias);
// The formats of quant_gguf.cpp (Q5_0, Q5_1, IQ4_NL, Q5_K, Q3_K, Q2_K, IQ4_XS); false for any other.
bool gemm_gguf(int64_t fmt, const uint8_t* W, int64_t row_bytes, int64_t N, const QAct& a, int64_t M, float* out,
               int64_t ldo, const float* bias);
bool dequant_row_gguf(int64_t fmt, const uint8_t* w, int64_t K, float* y);
// The 16-bit float formats (float16_gemm.cpp), on fp32 activations x [M, K] (row stride ldx).
bool gemm_float16(int64_t fmt, const uint8_t* W, int64_t row_bytes, int64_t N, const float* x, int64_t ldx, int64_t M,
                  int64_t K, float* out, int64_t ldo, const float* bias);
bool dequant_row_float16(int64_t fmt, const uint8_t* w, int64_t K, float* y);

}  // namespace radixlm
