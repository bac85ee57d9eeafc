// One activation row (decode, M = 1) against two groups of 8 interleaved weight rows at once, in
// 512-bit registers, for every interleaved format (Q4X8, Q5X8, Q8X8, MXFP4X8, Q4_KX8, Q6_KX8), whose
// 256-bit tiles (x8_tiles.h) turn compute-bound on two cores once memory reads faster than ~35
// GB/s. The savings keep every integer and every float step of the tiles, so the results are
// bitwise theirs (batch and ISA invariance hold):
//  - a register holds two 32-byte chunks of one group, and the activations are permuted to match
//    (x8_row1_zmm.h), once per block for both groups: half the byte dots and masks;
//  - the two groups' 16 rows share one float register (group g in the low 8 lanes, g + 1 in the
//    high): each of the tiles' per-lane steps (convert, scale products, FMA) runs once for both,
//    and two accumulator chains hide each other's FMA latency;
//  - Q6_K: GFNI's bit-matrix multiply moves a chunk's 2 top bits into place in one instruction
//    (shift + mask before), and its -32 offset is taken off each 16-value dot before the scale
//    (sc (dot - 32 S) = sc dot - 32 sc S: the same int32), from sums made once per block.
// Compiled for this ISA alone (quant_x8.cpp calls it at the VBMI level, which requires GFNI).
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni,avx512vbmi,gfni")
#include "x8_row1_zmm.h"

namespace radixlm {
namespace {

// [x.lo + x.hi | y.lo + y.hi]: two 8-lane folds (exact int32) in one register.
inline __m512i fold_pair(__m512i x, __m512i y) {
  return _mm512_add_epi32(_mm512_shuffle_i64x2(x, y, 0x44), _mm512_shuffle_i64x2(x, y, 0xEE));
}

// A 32-value block's 4 registers of unsigned weight bytes, chunk pairs (0, 1) and (2, 3), low then
// high values: Q4X8's nibbles (values 0..7, 8..15 low, 16.., 24.. high); Q8X8's int8 xor 0x80
// (w + 128, x8_row1_zmm.h); MXFP4X8's nibbles looked up by VBMI's vpermb over 6-bit indices (the
// 16 values offset by 12, four times over, so no nibble needs masking).
template <X8Kind K>
inline void block_weights(const uint8_t* blk, __m512i* w) {
  if constexpr (K == X8Kind::Q8) {
    for (int j = 0; j < 4; ++j) w[j] = _mm512_xor_si512(_mm512_loadu_si512(blk + 16 + 64 * j), _mm512_set1_epi8((char)0x80));
  } else if constexpr (x8_q4_like(K)) {
    constexpr int64_t QS = x8_qs(K);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i r0 = _mm512_loadu_si512(blk + QS), r1 = _mm512_loadu_si512(blk + QS + 64);
    w[0] = _mm512_and_si512(r0, m4);
    w[1] = _mm512_and_si512(r1, m4);
    w[2] = _mm512_and_si512(_mm512_srli_epi16(r0, 4), m4);
    w[3] = _mm512_and_si512(_mm512_srli_epi16(r1, 4), m4);
    if constexpr (x8_fifth_bits(K)) {  // register j's two chunks take fifth-bit words 2j, 2j + 1
      const __m512i sixteen = _mm512_set1_epi8(0x10);
      for (int j = 0; j < 4; ++j) {
        uint64_t bits;
        std::memcpy(&bits, blk + QS + 128 + 8 * j, 8);
        w[j] = _mm512_or_si512(w[j], _mm512_maskz_mov_epi8(_cvtu64_mask64(bits), sixteen));
      }
    }
  } else {
    alignas(16) static constexpr int8_t values[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
    const __m512i table = _mm512_broadcast_i32x4(_mm_load_si128((const __m128i*)values));
    const __m512i r0 = _mm512_loadu_si512(blk + 8), r1 = _mm512_loadu_si512(blk + 72);
    w[0] = _mm512_permutexvar_epi8(r0, table);
    w[1] = _mm512_permutexvar_epi8(r1, table);
    w[2] = _mm512_permutexvar_epi8(_mm512_srli_epi16(r0, 4), table);
    w[3] = _mm512_permutexvar_epi8(_mm512_srli_epi16(r1, 4), table);
  }
}

// The 32-value block formats, each lane in its tile's sequence, block by block:
//  Q4X8, Q5X8, Q4_0X8, Q5_0X8 (tile_q4x8): acc = fma(dot, d d_a, acc) + m s_a;
//  Q8X8 (row1_q8x8):      acc = fma(dot - 128 sum(q), d d_a, acc);
//  MXFP4X8 (tile_mxfp4x8): acc = fma(dot - 12 (S_lo + S_hi), 2^(e - 128) d_a, acc).
template <X8Kind K>
void pair_blocks32(const uint8_t* g, int64_t gb, const QAct& a, int64_t m, float* out, const float* bias16) {
  constexpr int64_t BYTES = K == X8Kind::Q8 ? 272 : nibble_block_bytes(K);
  const int8_t* aq = a.qrow(m);
  const float *da = a.drow(m), *sa = a.srow(m);
  alignas(32) int32_t offset[8];
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* b0 = g + b * BYTES;
    const uint8_t* b1 = b0 + gb;
    // Both groups' next blocks fetched ahead, as the tiles do: one row streams the weights, and
    // without it this Intel Xeon (AMX, 2026-12-01) read Q4X8 at 15-16 GB/s and Q8X8 at 20 against
    // 18-22 and 23-25 with it (benchmarks/qlinear.py --cold, alternating builds).
    prefetch_span(b0, BYTES);
    prefetch_span(b1, BYTES);
    __m512i ap[4], w0[4], w1[4];
    permuted_act(aq + 32 * b, ap);
    block_weights<K>(b0, w0);
    block_weights<K>(b1, w1);
    __m512i isum = fold_pair(dot4(w0, ap), dot4(w1, ap));
    __m512 dw, mw;
    if constexpr (K == X8Kind::MXFP4) {
      isum = _mm512_sub_epi32(isum, _mm512_madd_epi16(_mm512_set1_epi16(12), _mm512_set1_epi32(a.sum16row(m)[b])));
      const __m512 e = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
          _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i*)b0), _mm_loadl_epi64((const __m128i*)b1))));
      dw = _mm512_scalef_ps(_mm512_set1_ps(1.0f), _mm512_sub_ps(e, _mm512_set1_ps(128.0f)));
    } else {
      if constexpr (K == X8Kind::Q8) {
        if ((b & 7) == 0) block_sums128(sa + b, da + b, std::min<int64_t>(8, a.nb - b), offset);
        isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(offset[b & 7]));
      }
      const __m256 d0 = scales8(b0), d1 = scales8(b1);
      dw = cat8(d0, d1);
      if constexpr (x8_q4_like(K)) mw = cat8(mins8<K>(b0, d0), mins8<K>(b1, d1));
    }
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(da[b])), acc);
    if constexpr (x8_q4_like(K)) acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(sa[b]), acc);
  }
  store16(acc, bias16, out);
}

// tile_q4kx8's sequence per lane: per super-block isum = sum_s sc_s dot_s, msum = sum_s mn_s S_s, then
// q4k_step16 (acc = fma(isum, d d_a, acc) - msum dmin d_a).
void pair_q4kx8(const uint8_t* g, int64_t gb, const QAct& a, int64_t m, float* out, const float* bias16) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const int8_t* aq = a.qrow(m);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < a.nb / 8; ++sb) {
    const uint8_t* b0 = g + sb * Q4KX8_BYTES;
    const uint8_t* b1 = b0 + gb;
    prefetch_span(b0, Q4KX8_BYTES);  // both groups, at the tiles' distance ahead
    prefetch_span(b1, Q4KX8_BYTES);
    __m512i isum = _mm512_setzero_si512();
    for (int p = 0; p < 4; ++p) {
      __m512i lo[2][4], hi[2][4];
      for (int k = 0; k < 2; ++k) {
        const uint8_t* qs = (k ? b1 : b0) + 160 + 256 * p;
        for (int j = 0; j < 4; ++j) {
          const __m512i raw = _mm512_loadu_si512(qs + 64 * j);
          lo[k][j] = _mm512_and_si512(raw, m4);
          hi[k][j] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
        }
      }
      for (int h = 0; h < 2; ++h) {  // sub-blocks 2p (low nibbles) and 2p + 1 (high)
        const int s = 2 * p + h;
        __m512i ap[4];
        permuted_act(aq + 32 * (8 * sb + s), ap);
        const __m512i dot = fold_pair(dot4(h ? hi[0] : lo[0], ap), dot4(h ? hi[1] : lo[1], ap));
        isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(dot, u8x16_to_epi32(b0 + 32 + 8 * s, b1 + 32 + 8 * s)));
      }
    }
    __m512i mn16[8];
    for (int s = 0; s < 8; ++s) mn16[s] = u8x16_pairs16(b0 + 96 + 8 * s, b1 + 96 + 8 * s);
    const __m512 d = cat8(scales8(b0), scales8(b1)), dmin = cat8(scales8(b0 + 16), scales8(b1 + 16));
    acc = q4k_step16(acc, isum, q4k_min_sum16(mn16, a.sum16row(m) + 8 * sb), d, dmin, a.d256row(m)[sb]);
  }
  store16(acc, bias16, out);
}

// The GF(2) matrix (per 64-bit lane) that sends bits 2i, 2i + 1 of each byte to bits 4, 5 and
// clears the rest: result bit t is the parity of (matrix byte 7 - t) & x.
constexpr uint64_t top_bits_matrix(int i) { return ((1ull << (2 * i)) << 24) | ((1ull << (2 * i + 1)) << 16); }

// tile_q6kx8's sequence per lane: isum += sc_lo (dot_lo - 32 S_lo) + sc_hi (dot_hi - 32 S_hi) (exact)
// 32 values at a time, then per super-block acc = fma(isum, d d_a, acc).
void pair_q6kx8(const uint8_t* g, int64_t gb, const QAct& a, int64_t m, float* out, const float* bias16) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i top01 = _mm512_setr_epi64(top_bits_matrix(0), top_bits_matrix(0), top_bits_matrix(0), top_bits_matrix(0),
                                          top_bits_matrix(1), top_bits_matrix(1), top_bits_matrix(1), top_bits_matrix(1));
  const __m512i top23 = _mm512_setr_epi64(top_bits_matrix(2), top_bits_matrix(2), top_bits_matrix(2), top_bits_matrix(2),
                                          top_bits_matrix(3), top_bits_matrix(3), top_bits_matrix(3), top_bits_matrix(3));
  const int8_t* aq = a.qrow(m);
  const int32_t* s16 = a.sum16row(m);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < a.nb / 8; ++sb) {
    const uint8_t* b0 = g + sb * Q6KX8_BYTES;
    const uint8_t* b1 = b0 + gb;
    prefetch_span(b0, Q6KX8_BYTES);
    prefetch_span(b1, Q6KX8_BYTES);
    const __m512 d = cat8(scales8(b0), scales8(b1));
    __m512i isum = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      const int64_t b = 8 * sb + j;
      // chunks (0, 1) and (2, 3) take activation words 0..3 (values 0..15), chunks 4..7 words 4..7
      __m512i ap[4];
      permuted_act(aq + 32 * b, ap);
      const int32_t pair = s16[b];  // the two 16-value sums, as int16 halves
      const __m512i s32 = _mm512_slli_epi32(
          _mm512_inserti64x4(_mm512_set1_epi32((int16_t)(pair & 0xFFFF)), _mm256_set1_epi32((int16_t)(pair >> 16)), 1), 5);
      __m512i prod[2];
      for (int k = 0; k < 2; ++k) {
        const uint8_t* blk = k ? b1 : b0;
        const uint8_t* qb = blk + 144 + 192 * j;
        const __m512i n01 = _mm512_loadu_si512(qb), n23 = _mm512_loadu_si512(qb + 64);
        const __m512i h0 = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(qb + 128)));
        const __m512i h1 = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(qb + 160)));
        // (n & 0x0F) | top: ternary-logic 0xEA is (A & B) | C
        const __m512i w[4] = {
            _mm512_ternarylogic_epi64(n01, m4, _mm512_gf2p8affine_epi64_epi8(h0, top01, 0), 0xEA),
            _mm512_ternarylogic_epi64(n23, m4, _mm512_gf2p8affine_epi64_epi8(h0, top23, 0), 0xEA),
            _mm512_ternarylogic_epi64(_mm512_srli_epi16(n01, 4), m4, _mm512_gf2p8affine_epi64_epi8(h1, top01, 0), 0xEA),
            _mm512_ternarylogic_epi64(_mm512_srli_epi16(n23, 4), m4, _mm512_gf2p8affine_epi64_epi8(h1, top23, 0), 0xEA)};
        const __m512i lo = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], ap[0]), w[1], ap[1]);
        const __m512i hi = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w[2], ap[2]), w[3], ap[3]);
        const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(blk + 16 + 16 * j)));
        prod[k] = _mm512_mullo_epi32(_mm512_sub_epi32(fold_pair(lo, hi), s32), sc);  // [lo rows | hi rows]
      }
      isum = _mm512_add_epi32(isum, fold_pair(prod[0], prod[1]));
    }
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, _mm512_set1_ps(a.d256row(m)[sb])), acc);
  }
  store16(acc, bias16, out);
}

}  // namespace

void x8_pair_rows_vbmi(X8Kind kind, const uint8_t* g, int64_t group_bytes, const QAct& a, int64_t m, float* out,
                       const float* bias16) {
  switch (kind) {
    case X8Kind::Q4: pair_blocks32<X8Kind::Q4>(g, group_bytes, a, m, out, bias16); break;
    case X8Kind::Q5: pair_blocks32<X8Kind::Q5>(g, group_bytes, a, m, out, bias16); break;
    case X8Kind::Q4_0: pair_blocks32<X8Kind::Q4_0>(g, group_bytes, a, m, out, bias16); break;
    case X8Kind::Q5_0: pair_blocks32<X8Kind::Q5_0>(g, group_bytes, a, m, out, bias16); break;
    case X8Kind::Q8: pair_blocks32<X8Kind::Q8>(g, group_bytes, a, m, out, bias16); break;
    case X8Kind::Q4K: pair_q4kx8(g, group_bytes, a, m, out, bias16); break;
    case X8Kind::Q6K: pair_q6kx8(g, group_bytes, a, m, out, bias16); break;
    case X8Kind::MXFP4: pair_blocks32<X8Kind::MXFP4>(g, group_bytes, a, m, out, bias16); break;
  }
}

}  // namespace radixlm
