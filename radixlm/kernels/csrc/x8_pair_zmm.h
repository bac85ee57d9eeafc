// The two-group 512-bit tiles' shared pieces (quant_x8_pair_tiles.cpp's VNNI tiles and
// quant_x8_amx.cpp's AMX ones): group g's 8 rows in the low lanes, group g + 1's in the high 8.
// Internal linkage, as x8_tiles.h: the files including it are compiled for different ISAs.
#pragma once
#include "x8_row1_zmm.h"

namespace radixlm {
namespace {

// [32 bytes at p0 | 32 bytes at p1]: the same chunk of both groups.
inline __m512i join(const uint8_t* p0, const uint8_t* p1) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)p0)),
                            _mm256_loadu_si256((const __m256i*)p1), 1);
}

// Few rows (a decode batch) stream the weights from memory: both groups' next blocks are fetched
// ahead while these dots run (batch 8, cold weights: -10-38% per matrix at the 256-bit level).
inline void prefetch_pair(const uint8_t* b0, const uint8_t* b1, int64_t bytes) {
  prefetch_span(b0, bytes);
  prefetch_span(b1, bytes);
}

// The two 16-value sums of a row's block (int16 halves of QAct::sum16) added: the block's sum.
inline int32_t block_sum(const QAct& a, int64_t m, int64_t b) {
  const int32_t pair = a.sum16row(m)[b];
  return (int16_t)(pair & 0xFFFF) + (int16_t)(pair >> 16);
}

// A tile's rows' int32 dots of one block, parked in L1 between the two passes of a block: first
// every row's dots, then every row's float steps, so the float steps of all rows issue back to
// back instead of each row's waiting at the end of its own dot chain (+6% with 16 rows).
template <int RM>
struct BlockDots {
  alignas(64) int32_t v[RM][16];
  void put(int m, __m512i x) { _mm512_store_si512(v[m], x); }
  __m512i get(int m) const { return _mm512_load_si512(v[m]); }
};

// A super-block's min term per lane for both groups: from QAct::sum32p's block-sum pairs where
// gemm_x8 made them (4 vpdpwssd: lane = (mn_2p, mn_2p+1)), else q4k_min_sum16's 8; the same int32.
struct Q4kMins16 {
  __m512i v[8];
  bool pairs;
  Q4kMins16(const uint8_t* b0, const uint8_t* b1, const QAct& a) : pairs(a.sum32p != nullptr) {
    if (pairs) {
      for (int p = 0; p < 4; ++p)
        v[p] = _mm512_or_si512(u8x16_to_epi32(b0 + 96 + 16 * p, b1 + 96 + 16 * p),
                               _mm512_slli_epi32(u8x16_to_epi32(b0 + 104 + 16 * p, b1 + 104 + 16 * p), 16));
    } else {
      for (int s = 0; s < 8; ++s) v[s] = u8x16_pairs16(b0 + 96 + 8 * s, b1 + 96 + 8 * s);
    }
  }
  __m512i sum(const QAct& a, int64_t m, int64_t sb) const {
    if (!pairs) return q4k_min_sum16(v, a.sum16row(m) + 8 * sb);
    const int32_t* p = a.sum32prow(m) + 4 * sb;
    __m512i t = _mm512_madd_epi16(v[0], _mm512_set1_epi32(p[0]));
    for (int i = 1; i < 4; ++i) t = _mm512_dpwssd_epi32(t, v[i], _mm512_set1_epi32(p[i]));
    return t;
  }
};

// Bits 4..5 of each byte <- chunk I's 2 bits of h (at 2I..2I+1), as x8_tiles.h's q6_top.
template <int I>
inline __m512i q6_top(__m512i h) {
  const __m512i m = _mm512_set1_epi8(0x30);
  if constexpr (I == 0) return _mm512_and_si512(_mm512_slli_epi16(h, 4), m);
  if constexpr (I == 1) return _mm512_and_si512(_mm512_slli_epi16(h, 2), m);
  if constexpr (I == 2) return _mm512_and_si512(h, m);
  if constexpr (I == 3) return _mm512_and_si512(_mm512_srli_epi16(h, 2), m);
}

// 8 scale bytes of each group as 16 int32 lanes.
inline __m512i scales16(const int8_t* s0, const int8_t* s1) {
  return _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i*)s0), _mm_loadl_epi64((const __m128i*)s1)));
}

// A nibble block's 8 weight registers (both groups): chunk i's low nibbles (values 4i..) at i, its
// high ones (16 + 4i..) at 4 + i; unsigned bytes (Q5 with its fifth bit, MXFP4 looked up and
// offset by 12).
template <X8Kind K>
inline void nibble_chunks(const uint8_t* b0, const uint8_t* b1, __m512i* w) {
  constexpr int64_t QS = x8_qs(K);  // the first nibble chunk
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  alignas(16) static constexpr int8_t values[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
  for (int i = 0; i < 4; ++i) {
    const __m512i raw = join(b0 + QS + 32 * i, b1 + QS + 32 * i);
    if constexpr (K == X8Kind::MXFP4) {  // the table repeats every 16 bytes: no masking
      const __m512i table = _mm512_broadcast_i32x4(_mm_load_si128((const __m128i*)values));
      w[i] = _mm512_permutexvar_epi8(raw, table);
      w[4 + i] = _mm512_permutexvar_epi8(_mm512_srli_epi16(raw, 4), table);
    } else {
      w[i] = _mm512_and_si512(raw, m4);
      w[4 + i] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
    }
    if constexpr (x8_fifth_bits(K)) {  // chunk i's fifth-bit words: group 0's bits 0-31, group 1's 32-63
      const __m512i sixteen = _mm512_set1_epi8(0x10);
      uint32_t l0, l1, h0, h1;
      std::memcpy(&l0, b0 + QS + 128 + 4 * i, 4);
      std::memcpy(&l1, b1 + QS + 128 + 4 * i, 4);
      std::memcpy(&h0, b0 + QS + 144 + 4 * i, 4);
      std::memcpy(&h1, b1 + QS + 144 + 4 * i, 4);
      w[i] = _mm512_or_si512(w[i], _mm512_maskz_mov_epi8(_cvtu64_mask64(l0 | (uint64_t)l1 << 32), sixteen));
      w[4 + i] = _mm512_or_si512(w[4 + i], _mm512_maskz_mov_epi8(_cvtu64_mask64(h0 | (uint64_t)h1 << 32), sixteen));
    }
  }
}

// Half `half` of a Q4_KX8 sub-block (16 values: 4 chunks), both groups; the sub-block's nibbles are
// the low (even sub-block) or high (odd) ones of the bytes at q0 / q1 (the pair's shared bytes).
inline void q4k_half_chunks(const uint8_t* q0, const uint8_t* q1, bool high, int half, __m512i* w) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  for (int i = 0; i < 4; ++i) {
    const __m512i raw = join(q0 + 32 * (4 * half + i), q1 + 32 * (4 * half + i));
    w[i] = _mm512_and_si512(high ? _mm512_srli_epi16(raw, 4) : raw, m4);
  }
}

// A 32-value block's weight scales for both groups: d (MXFP4: 2^(e - 128)) and, for the Q4 / Q5
// layouts, m (mins8's: stored, or the offset times d).
template <X8Kind K>
inline void block_scales16(const uint8_t* b0, const uint8_t* b1, __m512& dw, __m512& mw) {
  if constexpr (K == X8Kind::MXFP4) {
    const __m512 e = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
        _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i*)b0), _mm_loadl_epi64((const __m128i*)b1))));
    dw = _mm512_scalef_ps(_mm512_set1_ps(1.0f), _mm512_sub_ps(e, _mm512_set1_ps(128.0f)));
  } else {
    const __m256 d0 = scales8(b0), d1 = scales8(b1);
    dw = cat8(d0, d1);
    if constexpr (x8_q4_like(K)) mw = cat8(mins8<K>(b0, d0), mins8<K>(b1, d1));
  }
}

// A Q6_KX8 block's 8 weight registers (values 0..63, both groups; the block's bytes at p0 / p1):
// the low 16 values' 4 chunks, then the high 16 values'.
inline void q6k_chunks(const uint8_t* p0, const uint8_t* p1, __m512i* q) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i h0 = join(p0 + 128, p1 + 128), h1 = join(p0 + 160, p1 + 160);
  const __m512i n0 = join(p0, p1), n1 = join(p0 + 32, p1 + 32);
  const __m512i n2 = join(p0 + 64, p1 + 64), n3 = join(p0 + 96, p1 + 96);
  q[0] = _mm512_or_si512(_mm512_and_si512(n0, m4), q6_top<0>(h0));
  q[1] = _mm512_or_si512(_mm512_and_si512(n1, m4), q6_top<1>(h0));
  q[2] = _mm512_or_si512(_mm512_and_si512(n2, m4), q6_top<2>(h0));
  q[3] = _mm512_or_si512(_mm512_and_si512(n3, m4), q6_top<3>(h0));
  q[4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(n0, 4), m4), q6_top<0>(h1));
  q[5] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(n1, 4), m4), q6_top<1>(h1));
  q[6] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(n2, 4), m4), q6_top<2>(h1));
  q[7] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(n3, 4), m4), q6_top<3>(h1));
}

}  // namespace
}  // namespace radixlm
