// Several activation rows (prefill, batches) against two groups of 8 interleaved weight rows at
// once, in 512-bit registers: the tiles of x8_tiles.h with group g's rows in the low 8 lanes and
// group g + 1's in the high 8 (quant_x8_pair.cpp's layout for one row). A weight register holds
// the same 32-byte chunk of both groups, so a row's 4 activation bytes of that chunk broadcast to
// all 16 lanes: per row and block, half the 256-bit tiles' byte dots, converts, scale products and
// FMAs, and no permute or fold (which the one-row kernels pay to read two chunks of one group).
// Every integer is the 256-bit tiles' (exact int32 sums in any order: the rows' chains interleaved
// here) and
// each lane's float steps are theirs in order, so the results are bitwise theirs: batch and ISA
// invariance hold.
// Q8X8 drops the sign trick as row1_q8x8 does: (w xor 0x80) dot a = w dot a + 128 sum(a), the
// block's sum(a) exact from the activations' 16-value sums (QAct::sum16, made by gemm_x8).
// Compiled for this ISA alone (quant_x8.cpp calls it at the VBMI level).
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni,avx512vbmi,gfni")
#include "x8_pair_zmm.h"

namespace radixlm {
namespace {

// vpdpbusd with the activations' 4 bytes as an embedded broadcast: one fused instruction where
// vpbroadcastd + vpdpbusd took two (GCC 12 does not fold the broadcast).
inline __m512i dpbusd_bcst(__m512i acc, __m512i w, const int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t*)p));
  return acc;
}

// The tile's rows' byte dots of n chunks (w[i] pairs with each row's activation bytes 4i..4i+3,
// ap = the first row's block in QAct::panels) added to dots[]: chunk-major, so the RM rows' chains
// interleave and each vpdpbusd's predecessor issued RM instructions earlier (one row's chain after
// another stalls on the dot's latency: +40% here for Q4_KX8 with 16 rows).
template <int RM>
inline void dots_rows(const __m512i* w, int n, const int8_t* ap, __m512i* dots) {
#pragma GCC unroll 8
  for (int i = 0; i < n; ++i)
#pragma GCC unroll 16
    for (int m = 0; m < RM; ++m) dots[m] = dpbusd_bcst(dots[m], w[i], ap + 32 * m + 4 * i);
}

// Q4X8, Q5X8 and MXFP4X8 (32 values a block): per lane acc = fma(dot, d d_a, acc) + m s_a (Q4, Q5),
// acc = fma(dot - 12 (S_lo + S_hi), 2^(e - 128) d_a, acc) (MXFP4), as tile_q4x8 / tile_mxfp4x8.
template <X8Kind K, int RM>
void tile_nibbles(const uint8_t* g, int64_t gb, const QAct& a, int64_t m0, float* out, int64_t ldo,
                  const float* bias16) {
  constexpr int64_t BYTES = nibble_block_bytes(K);
  __m512 acc[RM];
  for (int m = 0; m < RM; ++m) acc[m] = _mm512_setzero_ps();
  BlockDots<RM> dots;
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* b0 = g + b * BYTES;
    const uint8_t* b1 = b0 + gb;
    if constexpr (RM <= 8) prefetch_pair(b0, b1, BYTES);
    __m512i w[8];
    nibble_chunks<K>(b0, b1, w);
    __m512i isum[RM];
    for (int m = 0; m < RM; ++m) isum[m] = _mm512_setzero_si512();
    dots_rows<RM>(w, 8, a.panel_block(m0, b), isum);
    for (int m = 0; m < RM; ++m) {
      if constexpr (K == X8Kind::MXFP4)
        isum[m] = _mm512_sub_epi32(isum[m], _mm512_madd_epi16(_mm512_set1_epi16(12), _mm512_set1_epi32(a.sum16row(m0 + m)[b])));
      dots.put(m, isum[m]);
    }
    __m512 dw, mw;
    block_scales16<K>(b0, b1, dw, mw);
    for (int m = 0; m < RM; ++m) {
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots.get(m)), _mm512_mul_ps(dw, _mm512_set1_ps(a.drow(m0 + m)[b])), acc[m]);
      if constexpr (K != X8Kind::MXFP4) acc[m] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.srow(m0 + m)[b]), acc[m]);
    }
  }
  for (int m = 0; m < RM; ++m) store16(acc[m], bias16, out + (m0 + m) * ldo);
}

// Q8X8: per lane acc = fma(dot, d d_a, acc), the dot taken as (w xor 0x80) dot a - 128 sum(a).
template <int RM>
void tile_q8(const uint8_t* g, int64_t gb, const QAct& a, int64_t m0, float* out, int64_t ldo, const float* bias16) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  __m512 acc[RM];
  for (int m = 0; m < RM; ++m) acc[m] = _mm512_setzero_ps();
  BlockDots<RM> dots;
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* b0 = g + b * 272;
    const uint8_t* b1 = b0 + gb;
    if constexpr (RM <= 8) prefetch_pair(b0, b1, 272);
    __m512i w[8];
    for (int i = 0; i < 8; ++i) w[i] = _mm512_xor_si512(join(b0 + 16 + 32 * i, b1 + 16 + 32 * i), flip);
    __m512i isum[RM];
    for (int m = 0; m < RM; ++m) isum[m] = _mm512_set1_epi32(-128 * block_sum(a, m0 + m, b));  // the chains start at the offset
    dots_rows<RM>(w, 8, a.panel_block(m0, b), isum);
    for (int m = 0; m < RM; ++m) dots.put(m, isum[m]);
    const __m512 dw = cat8(scales8(b0), scales8(b1));
    for (int m = 0; m < RM; ++m)
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots.get(m)), _mm512_mul_ps(dw, _mm512_set1_ps(a.drow(m0 + m)[b])), acc[m]);
  }
  for (int m = 0; m < RM; ++m) store16(acc[m], bias16, out + (m0 + m) * ldo);
}

// One row of q4k_half8: t = its 4 chunks' dots (activation bytes at ap + 32 M), is_M += t x sc.
#define RADIXLM_Q4K_ROW(M)                                          \
  "vpxord %[t], %[t], %[t]\n\t"                                     \
  "vpdpbusd 32*" #M "+0(%[ap])%{1to16%}, %[w0], %[t]\n\t"           \
  "vpdpbusd 32*" #M "+4(%[ap])%{1to16%}, %[w1], %[t]\n\t"           \
  "vpdpbusd 32*" #M "+8(%[ap])%{1to16%}, %[w2], %[t]\n\t"           \
  "vpdpbusd 32*" #M "+12(%[ap])%{1to16%}, %[w3], %[t]\n\t"          \
  "vpdpwssd %[sc], %[t], %[i" #M "]\n\t"

// 8 rows' sums of half a sub-block: is[m] += sc x (the 4 chunks w dotted with row m's 16 bytes at
// ap + 32 m), each dot below 2^15 in its lane's low int16 (see tile_q4k). One asm block, because
// GCC 12 neither folds the broadcasts nor keeps 16 rows' sums in registers across these chains
// (it parked them on the stack and copied each twice per vpdpwssd): 6 instructions per row here.
inline void q4k_half8(__m512i* is, const __m512i* w, __m512i sc, const int8_t* ap) {
  __m512i t;
  asm(RADIXLM_Q4K_ROW(0) RADIXLM_Q4K_ROW(1) RADIXLM_Q4K_ROW(2) RADIXLM_Q4K_ROW(3) RADIXLM_Q4K_ROW(4)
          RADIXLM_Q4K_ROW(5) RADIXLM_Q4K_ROW(6) RADIXLM_Q4K_ROW(7)
      : [i0] "+v"(is[0]), [i1] "+v"(is[1]), [i2] "+v"(is[2]), [i3] "+v"(is[3]), [i4] "+v"(is[4]),
        [i5] "+v"(is[5]), [i6] "+v"(is[6]), [i7] "+v"(is[7]), [t] "=&v"(t)
      : [w0] "v"(w[0]), [w1] "v"(w[1]), [w2] "v"(w[2]), [w3] "v"(w[3]), [sc] "v"(sc), [ap] "r"(ap),
        "m"(*(const int8_t(*)[256])ap));
}
#undef RADIXLM_Q4K_ROW

// Q4_KX8 (Q8_K activations): per lane and super-block, isum = sum_s sc_s dot_s and msum = sum_s mn_s S_s
// in int32, then tile_q4kx8's q4k_step: acc = fma(isum, d d_a, acc) - msum dmin d_a. The rows' int32
// sums stay in registers through the super-block and the float accumulators in L1 (touched once per
// super-block).
template <int RM>
void tile_q4k(const uint8_t* g, int64_t gb, const QAct& a, int64_t m0, float* out, int64_t ldo, const float* bias16) {
  alignas(64) float acc[RM][16];
  for (int m = 0; m < RM; ++m) _mm512_store_ps(acc[m], _mm512_setzero_ps());
  for (int64_t sb = 0; sb < a.nb / 8; ++sb) {
    const uint8_t* b0 = g + sb * Q4KX8_BYTES;
    const uint8_t* b1 = b0 + gb;
    if constexpr (RM <= 8) prefetch_pair(b0, b1, Q4KX8_BYTES);
    __m512i isum[RM];
#pragma GCC unroll 16
    for (int m = 0; m < RM; ++m) isum[m] = _mm512_setzero_si512();
    for (int s = 0; s < 8; ++s) {
      const int64_t qs = 160 + 256 * (s / 2);
      const int64_t b = 8 * sb + s;
      // Each half's dots (16 values: |dot| <= 16 x 15 x 127 < 2^15) fit the low int16 of its lane, so
      // vpdpwssd against (sc, 0) adds sc x dot: one instruction where vpmulld (two) and an add ran.
      const __m512i sc = u8x16_to_epi32(b0 + 32 + 8 * s, b1 + 32 + 8 * s);
      const int8_t* ap = a.panel_block(m0, b);
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        __m512i w[4];
        q4k_half_chunks(b0 + qs, b1 + qs, s & 1, half, w);
        if constexpr (RM % 8 == 0) {
#pragma GCC unroll 2
          for (int m = 0; m < RM; m += 8) q4k_half8(isum + m, w, sc, ap + 32 * m + 16 * half);
        } else {
          for (int m = 0; m < RM; ++m) {
            const int8_t* ar = ap + 32 * m + 16 * half;
            __m512i d = dpbusd_bcst(_mm512_setzero_si512(), w[0], ar);
            d = dpbusd_bcst(d, w[1], ar + 4);
            d = dpbusd_bcst(d, w[2], ar + 8);
            d = dpbusd_bcst(d, w[3], ar + 12);
            isum[m] = _mm512_dpwssd_epi32(isum[m], d, sc);
          }
        }
      }
    }
    const Q4kMins16 mins(b0, b1, a);
    const __m512 d = cat8(scales8(b0), scales8(b1)), dmin = cat8(scales8(b0 + 16), scales8(b1 + 16));
#pragma GCC unroll 16
    for (int m = 0; m < RM; ++m)
      _mm512_store_ps(acc[m], q4k_step16(_mm512_load_ps(acc[m]), isum[m], mins.sum(a, m0 + m, sb), d, dmin,
                                         a.d256row(m0 + m)[sb]));
  }
  for (int m = 0; m < RM; ++m) store16(_mm512_load_ps(acc[m]), bias16, out + (m0 + m) * ldo);
}

// One row of q6k_block8: t0, t1 = its low and high 16 values' dots (activation bytes at ap + 32 M),
// is_M += t0 x sc_lo + t1 x sc_hi.
#define RADIXLM_Q6K_ROW(M)                                 \
  "vpxord %[t0], %[t0], %[t0]\n\t"                         \
  "vpxord %[t1], %[t1], %[t1]\n\t"                         \
  "vpdpbusd 32*" #M "+0(%[ap])%{1to16%}, %[q0], %[t0]\n\t"  \
  "vpdpbusd 32*" #M "+16(%[ap])%{1to16%}, %[q4], %[t1]\n\t" \
  "vpdpbusd 32*" #M "+4(%[ap])%{1to16%}, %[q1], %[t0]\n\t"  \
  "vpdpbusd 32*" #M "+20(%[ap])%{1to16%}, %[q5], %[t1]\n\t" \
  "vpdpbusd 32*" #M "+8(%[ap])%{1to16%}, %[q2], %[t0]\n\t"  \
  "vpdpbusd 32*" #M "+24(%[ap])%{1to16%}, %[q6], %[t1]\n\t" \
  "vpdpbusd 32*" #M "+12(%[ap])%{1to16%}, %[q3], %[t0]\n\t" \
  "vpdpbusd 32*" #M "+28(%[ap])%{1to16%}, %[q7], %[t1]\n\t" \
  "vpmulld %[slo], %[t0], %[t0]\n\t"                       \
  "vpmulld %[shi], %[t1], %[t1]\n\t"                       \
  "vpaddd %[t0], %[i" #M "], %[i" #M "]\n\t"               \
  "vpaddd %[t1], %[i" #M "], %[i" #M "]\n\t"

// 8 rows' unsigned dots of one Q6_K block (32 values) times their sub-blocks' scales, added to
// is[m]: one asm block for q4k_half8's reasons (the rows' sums stay in registers).
inline void q6k_block8(__m512i* is, const __m512i* q, __m512i slo, __m512i shi, const int8_t* ap) {
  __m512i t0, t1;
  asm(RADIXLM_Q6K_ROW(0) RADIXLM_Q6K_ROW(1) RADIXLM_Q6K_ROW(2) RADIXLM_Q6K_ROW(3) RADIXLM_Q6K_ROW(4)
          RADIXLM_Q6K_ROW(5) RADIXLM_Q6K_ROW(6) RADIXLM_Q6K_ROW(7)
      : [i0] "+v"(is[0]), [i1] "+v"(is[1]), [i2] "+v"(is[2]), [i3] "+v"(is[3]), [i4] "+v"(is[4]),
        [i5] "+v"(is[5]), [i6] "+v"(is[6]), [i7] "+v"(is[7]), [t0] "=&v"(t0), [t1] "=&v"(t1)
      : [q0] "v"(q[0]), [q1] "v"(q[1]), [q2] "v"(q[2]), [q3] "v"(q[3]), [q4] "v"(q[4]), [q5] "v"(q[5]),
        [q6] "v"(q[6]), [q7] "v"(q[7]), [slo] "v"(slo), [shi] "v"(shi), [ap] "r"(ap),
        "m"(*(const int8_t(*)[256])ap));
}
#undef RADIXLM_Q6K_ROW

// Q6_KX8, 32 values at a time: isum += sc_lo dot_lo + sc_hi dot_hi - 32 (sc_lo S_lo + sc_hi S_hi), tile_q6kx8's
// integer (exact), then per super-block acc = fma(isum, d d_a, acc). As tile_q4k: the rows' int32 sums
// in registers through the super-block, the float accumulators in L1.
template <int RM>
void tile_q6k(const uint8_t* g, int64_t gb, const QAct& a, int64_t m0, float* out, int64_t ldo, const float* bias16) {
  alignas(64) float acc[RM][16];
  for (int m = 0; m < RM; ++m) _mm512_store_ps(acc[m], _mm512_setzero_ps());
  for (int64_t sb = 0; sb < a.nb / 8; ++sb) {
    const uint8_t* b0 = g + sb * Q6KX8_BYTES;
    const uint8_t* b1 = b0 + gb;
    if constexpr (RM <= 8) prefetch_pair(b0, b1, Q6KX8_BYTES);
    __m512i isum[RM];
#pragma GCC unroll 16
    for (int m = 0; m < RM; ++m) isum[m] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      const int64_t qb = 144 + 192 * j;
      __m512i q[8];
      q6k_chunks(b0 + qb, b1 + qb, q);
      const int64_t b = 8 * sb + j;
      const int8_t* ap = a.panel_block(m0, b);
      const int8_t* s0 = (const int8_t*)(b0 + 16 + 16 * j);
      const int8_t* s1 = (const int8_t*)(b1 + 16 + 16 * j);
      const __m512i slo = scales16(s0, s1), shi = scales16(s0 + 8, s1 + 8);
      if constexpr (RM % 8 == 0) {
#pragma GCC unroll 2
        for (int m = 0; m < RM; m += 8) q6k_block8(isum + m, q, slo, shi, ap + 32 * m);
      } else {
        for (int m = 0; m < RM; ++m) {
          __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
          for (int i = 0; i < 4; ++i) {
            lo = dpbusd_bcst(lo, q[i], ap + 32 * m + 4 * i);
            hi = dpbusd_bcst(hi, q[4 + i], ap + 32 * m + 16 + 4 * i);
          }
          isum[m] = _mm512_add_epi32(isum[m], _mm512_add_epi32(_mm512_mullo_epi32(lo, slo), _mm512_mullo_epi32(hi, shi)));
        }
      }
      // The offsets' term, -32 (sc_lo S_lo + sc_hi S_hi): (-32 sc_lo, -32 sc_hi) as int16 pairs
      // against QAct::sum16's (S_lo, S_hi), one vpdpwssd per row.
      const __m512i neg32 = _mm512_set1_epi32(-32);
      const __m512i off = _mm512_or_si512(_mm512_and_si512(_mm512_mullo_epi32(slo, neg32), _mm512_set1_epi32(0xFFFF)),
                                          _mm512_slli_epi32(_mm512_mullo_epi32(shi, neg32), 16));
#pragma GCC unroll 16
      for (int m = 0; m < RM; ++m) isum[m] = _mm512_dpwssd_epi32(isum[m], off, _mm512_set1_epi32(a.sum16row(m0 + m)[b]));
    }
    const __m512 d = cat8(scales8(b0), scales8(b1));
#pragma GCC unroll 16
    for (int m = 0; m < RM; ++m)
      _mm512_store_ps(acc[m], _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[m]), _mm512_mul_ps(d, _mm512_set1_ps(a.d256row(m0 + m)[sb])),
                                              _mm512_load_ps(acc[m])));
  }
  for (int m = 0; m < RM; ++m) store16(_mm512_load_ps(acc[m]), bias16, out + (m0 + m) * ldo);
}

template <int RM>
void tile(X8Kind kind, const uint8_t* g, int64_t gb, const QAct& a, int64_t m0, float* out, int64_t ldo,
          const float* bias16) {
  switch (kind) {
    case X8Kind::Q4: tile_nibbles<X8Kind::Q4, RM>(g, gb, a, m0, out, ldo, bias16); break;
    case X8Kind::Q5: tile_nibbles<X8Kind::Q5, RM>(g, gb, a, m0, out, ldo, bias16); break;
    case X8Kind::Q4_0: tile_nibbles<X8Kind::Q4_0, RM>(g, gb, a, m0, out, ldo, bias16); break;
    case X8Kind::Q5_0: tile_nibbles<X8Kind::Q5_0, RM>(g, gb, a, m0, out, ldo, bias16); break;
    case X8Kind::MXFP4: tile_nibbles<X8Kind::MXFP4, RM>(g, gb, a, m0, out, ldo, bias16); break;
    case X8Kind::Q8: tile_q8<RM>(g, gb, a, m0, out, ldo, bias16); break;
    case X8Kind::Q4K: tile_q4k<RM>(g, gb, a, m0, out, ldo, bias16); break;
    case X8Kind::Q6K: tile_q6k<RM>(g, gb, a, m0, out, ldo, bias16); break;
  }
}

}  // namespace

// Rows [m0, m1) against groups g and g + 1 (group_bytes apart), in tiles of 16, 8, 4, 2 and 1 rows:
// a weight chunk's unpacking is shared by the tile's rows, and 16 rows' accumulators still fit the
// 32 registers beside the 8 weight chunks.
// Q8X8, MXFP4X8 and the K-quants need QAct::sum16 (the K-quants: QAct::per256 activations); every
// format QAct::panels, and m0 a multiple of 16 (a tile never crosses a panel).
void x8_pair_tiles_vbmi(X8Kind kind, const uint8_t* g, int64_t group_bytes, const QAct& a, int64_t m0, int64_t m1,
                        float* out, int64_t ldo, const float* bias16) {
  int64_t m = m0;
  for (; m + 16 <= m1; m += 16) tile<16>(kind, g, group_bytes, a, m, out, ldo, bias16);
  if (m + 8 <= m1) tile<8>(kind, g, group_bytes, a, m, out, ldo, bias16), m += 8;
  if (m + 4 <= m1) tile<4>(kind, g, group_bytes, a, m, out, ldo, bias16), m += 4;
  if (m + 2 <= m1) tile<2>(kind, g, group_bytes, a, m, out, ldo, bias16), m += 2;
  if (m < m1) tile<1>(kind, g, group_bytes, a, m, out, ldo, bias16);
}

}  // namespace radixlm
