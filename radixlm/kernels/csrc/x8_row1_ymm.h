// One activation row against one group of 8 interleaved weight rows with 256-bit vectors: the
// decode case (M = 1) at the AVX2 level. On an AVX2-only CPU at two threads the one-row tiles of
// x8_tiles.h ran at ~17 GB/s per thread wherever the weights were (L2, L3 or memory): bound by
// their own instructions, not by the read rate. The RM = 1 tile spent most of its instructions on
// a sub-block loop the compiler kept rolled (address arithmetic and a branch per sub-block, each
// nibble byte loaded twice). Here a Q4_KX8 super-block's sub-blocks go in pairs from one load
// (low nibbles: sub-block 2p, high: 2p + 1), fully unrolled: +20-30% on a matrix in L2 / L3 and
// +7-12% from memory, alternating in one process (the same treatment of Q6_KX8's rolled block loop
// gained nothing: its address arithmetic is one add).
//
// The integers are the tiles' own (exact int16 / int32 sums: their order cannot change them) and
// the float steps are q4k_step in the same order: bitwise tile_q4kx8<Dot, 1>'s results.
#pragma once
#include "x8_tiles.h"

namespace radixlm {
namespace {

inline void row1_q4kx8_ymm(const uint8_t* g, const QAct& a, int64_t m, float* out, __m256 bias) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const int8_t* aq = a.qrow(m);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < a.nb / 8; ++sb) {
    const uint8_t* blk = g + sb * Q4KX8_BYTES;
    prefetch_span(blk, Q4KX8_BYTES);
    __m256i isum = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      const uint8_t* qs = blk + 160 + 256 * p;
      const int8_t* a0 = aq + (8 * sb + 2 * p) * 32;  // sub-block 2p's 32 activations, then 2p + 1's
      __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        const __m256i raw = load32(qs + 32 * i);
        const __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
        s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(lo, bcast32(a0 + 4 * i)));
        s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(hi, bcast32(a0 + 32 + 4 * i)));
      }
      // Each 16-bit lane: 8 x 2 x 15 x 127 < 2^15; the widening madd applies the sub-block's scale.
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(s0, u8_pairs16(blk + 32 + 16 * p)));
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(s1, u8_pairs16(blk + 40 + 16 * p)));
    }
    const Q4kMins mins(blk, a);
    acc = q4k_step(acc, isum, mins.sum(a, m, sb), scales8(blk), scales8(blk + 16), a.d256row(m)[sb]);
  }
  _mm256_storeu_ps(out, _mm256_add_ps(acc, bias));
}


}  // namespace
}  // namespace radixlm
