// One activation row against one group of 8 interleaved Q8X8 weight rows with 512-bit vectors:
// the decode case (M = 1), where a GEMV turns compute-bound on two cores at this machine's faster
// read rate (~60 GB/s). A 32-byte chunk holds 4 values of each of the 8 rows; a 512-bit register
// holds two chunks, and vpermd builds the matching activations (chunk i's 4 bytes in the low 8
// lanes, chunk i + 1's in the high 8) from one 32-byte load, where the 256-bit tiles broadcast 4
// bytes per chunk. The two halves' int32 sums fold into the 8 rows' lanes before the float steps,
// so every integer is the 256-bit tiles' own and every float step is theirs in order: bitwise the
// same results (x8_tiles.h's batch and ISA invariance hold).
//
// It also drops the sign trick (|w| times a carrying w's sign, 3 instructions per chunk): w xor
// 0x80 is w + 128 unsigned, so vpdpbusd gives sum(w a) + 128 sum(a), and the block's sum(a) is
// exact from the activations' own scales (s = d * sum(q), qact.h: |sum(q)| < 2^12, so s / d
// rounds back to it; for finite activations, whose q lie in [-127, 127]).
//
// Only for the files compiled with AVX-512 (x8_vnni_dot.h includes it); internal linkage.
#pragma once
#include "x8_tiles.h"

#include <cmath>

namespace radixlm {
namespace {

// Lanes 0-7 <- 32-bit word 2j of x, lanes 8-15 <- word 2j + 1.
inline __m512i pair_index(int j) {
  return _mm512_add_epi32(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), _mm512_set1_epi32(2 * j));
}

// The 8 lanes of rows 0-7: a register's two halves added (exact int32).
inline __m256i fold_halves(__m512i s) {
  return _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
}

// 128 * sum(q) of blocks [b, b + n), n <= 8, from s / d (a zero block has d = s = 0). A block with
// a non-finite input has no meaningful integers on any path; d > 0 keeps the cast defined.
inline void block_sums128(const float* s, const float* d, int64_t n, int32_t* out) {
  if (n == 8) {
    const __m256 dv = _mm256_loadu_ps(d);
    const __m256i v = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(s), dv));
    const __m256i positive = _mm256_castps_si256(_mm256_cmp_ps(dv, _mm256_setzero_ps(), _CMP_GT_OQ));
    _mm256_storeu_si256((__m256i*)out, _mm256_slli_epi32(_mm256_and_si256(v, positive), 7));
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = d[i] > 0.0f ? 128 * (int32_t)std::lrint(s[i] / d[i]) : 0;
}

// The two-group kernels' float layout (quant_x8_pair.cpp, quant_x8_pair_tiles.cpp): group g's 8
// rows in the low lanes, group g + 1's in the high ones.
inline __m512 cat8(__m256 lo, __m256 hi) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

// 8 bytes at p0 and 8 at p1 as 16 int32 lanes; and with each byte in both 16-bit halves (u8_pairs16).
inline __m512i u8x16_to_epi32(const uint8_t* p0, const uint8_t* p1) {
  return _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i*)p0), _mm_loadl_epi64((const __m128i*)p1)));
}
inline __m512i u8x16_pairs16(const uint8_t* p0, const uint8_t* p1) {
  const __m512i s = u8x16_to_epi32(p0, p1);
  return _mm512_or_si512(s, _mm512_slli_epi32(s, 16));
}

// x8_tiles.h's q4k_min_sum and q4k_step for the two-group layout: every lane's integers and float
// steps are theirs (vpdpwssd: the madd and the add in one instruction, the same int32 sums).
inline __m512i q4k_min_sum16(const __m512i* mn16, const int32_t* s16) {
  __m512i t = _mm512_madd_epi16(mn16[0], _mm512_set1_epi32(s16[0]));
  for (int s = 1; s < 8; ++s) t = _mm512_dpwssd_epi32(t, mn16[s], _mm512_set1_epi32(s16[s]));
  return t;
}
inline __m512 q4k_step16(__m512 acc, __m512i isum, __m512i msum, __m512 d, __m512 dmin, float da) {
  const __m512 vda = _mm512_set1_ps(da);
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, vda), acc);
  return _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dmin, vda), acc);
}

// The 16 outputs plus the bias, as the tiles add it (a zero vector without one).
inline void store16(__m512 acc, const float* bias16, float* out) {
  const __m256 lo = _mm512_castps512_ps256(acc), hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
  _mm256_storeu_ps(out, _mm256_add_ps(lo, bias16 ? _mm256_loadu_ps(bias16) : _mm256_setzero_ps()));
  _mm256_storeu_ps(out + 8, _mm256_add_ps(hi, bias16 ? _mm256_loadu_ps(bias16 + 8) : _mm256_setzero_ps()));
}

// Block b's 32 activation bytes as the 4 registers matching chunk pairs (2j, 2j + 1).
inline void permuted_act(const int8_t* x, __m512i* ap) {
  const __m512i ax = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)x));
  for (int j = 0; j < 4; ++j) ap[j] = _mm512_permutexvar_epi32(pair_index(j), ax);
}

// The byte dots of 4 registers of unsigned weight bytes (two chunks each) with the permuted
// activations: the two chunk halves not yet added.
inline __m512i dot4(const __m512i* w, const __m512i* ap) {
  __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], ap[0]);
  __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], ap[1]);
  s0 = _mm512_dpbusd_epi32(s0, w[2], ap[2]);
  s1 = _mm512_dpbusd_epi32(s1, w[3], ap[3]);
  return _mm512_add_epi32(s0, s1);
}

// The block's 8 row dots of its 32 activation bytes x (signed) with 4 registers of unsigned
// weight bytes (two chunks each).
inline __m256i dot_u4(const __m512i* w, const int8_t* x) {
  __m512i ap[4];
  permuted_act(x, ap);
  return fold_halves(dot4(w, ap));
}

inline void row1_q8x8(const uint8_t* g, const QAct& a, int64_t m, float* out, __m256 bias) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  const int8_t* aq = a.qrow(m);
  const float *da = a.drow(m), *sa = a.srow(m);
  alignas(32) int32_t offset[8];
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    if ((b & 7) == 0) block_sums128(sa + b, da + b, std::min<int64_t>(8, a.nb - b), offset);
    const uint8_t* blk = g + b * 272;
    __m512i w[4];
    for (int j = 0; j < 4; ++j) w[j] = _mm512_xor_si512(_mm512_loadu_si512(blk + 16 + 64 * j), flip);
    const __m256i isum = _mm256_sub_epi32(dot_u4(w, aq + 32 * b), _mm256_set1_epi32(offset[b & 7]));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(scales8(blk), _mm256_set1_ps(da[b])), acc);
  }
  _mm256_storeu_ps(out, _mm256_add_ps(acc, bias));
}

}  // namespace
}  // namespace radixlm
