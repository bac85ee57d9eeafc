// AVX-512 VNNI's block dots for the 8-row interleaved tiles (x8_tiles.h): vpdpbusd sums 4 byte
// products into each int32 lane in one instruction, where AVX2 needs maddubs + adds + madd.
// Included only by the files compiled for that ISA (quant_x8_vnni.cpp, quant_x8_vbmi.cpp), after
// their `#pragma GCC target`; internal linkage, as x8_tiles.h.
#pragma once
#include "x8_row1_zmm.h"
#include "x8_tiles.h"

namespace radixlm {
namespace {

struct VnniDot {
  static constexpr int RM = 8;  // 32 vector registers: 8 rows of accumulators beside the weights
  // Two chains per row (low and high nibbles): the integer sum is exact in any order.
  static inline __m256i q4(const __m256i* lo, const __m256i* hi, const int8_t* aq) {
    __m256i s0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), lo[0], bcast32(aq));
    __m256i s1 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), hi[0], bcast32(aq + 16));
    for (int i = 1; i < 4; ++i) {
      s0 = _mm256_dpbusd_epi32(s0, lo[i], bcast32(aq + 4 * i));
      s1 = _mm256_dpbusd_epi32(s1, hi[i], bcast32(aq + 16 + 4 * i));
    }
    return _mm256_add_epi32(s0, s1);
  }
  // Q4_KX8: the sub-block's dot times its scale (int32 lanes; exact, as the AVX2 madd's).
  static inline __m256i k_scale(const uint8_t* sc) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)sc)); }
  static inline __m256i q4k(const __m256i* w, const int8_t* aq, __m256i scale) {
    return _mm256_mullo_epi32(q4(w, w + 4, aq), scale);
  }
  // MXFP4's 8 e8m0 scales halved, 2^(e - 128), by vscalefps: exact, subnormals included (e < 2),
  // so the same floats as x8_tiles.h's integer construction in 4 instructions instead of 7.
  static inline __m256 e8m0_halves8(const uint8_t* p) {
    const __m256 e = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)));
    return _mm256_scalef_ps(_mm256_set1_ps(1.0f), _mm256_sub_ps(e, _mm256_set1_ps(128.0f)));
  }
  // Unsigned values up to 24 (MXFP4 offset by 12) or 31 (Q5): vpdpbusd's int32 sums cannot overflow.
  static inline __m256i u24(const __m256i* lo, const __m256i* hi, const int8_t* aq) { return q4(lo, hi, aq); }
  static inline __m256i q5(const __m256i* lo, const __m256i* hi, const int8_t* aq) { return q4(lo, hi, aq); }
  // Q5's fifth bits as 0x10 bytes: the word is a byte mask.
  static inline __m256i fifth_bits(const uint8_t* p) {
    uint32_t w;
    std::memcpy(&w, p, 4);
    return _mm256_maskz_mov_epi8(_cvtu32_mask32(w), _mm256_set1_epi8(0x10));
  }
  // Signed x signed through the sign trick: |w| (wabs, the tile's, shared by its rows) times a
  // carrying w's sign (w: the block's 8 chunks in memory).
  static inline __m256i q8(const __m256i* wabs, const uint8_t* w, const int8_t* aq) {
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    for (int i = 0; i < 8; i += 2) {
      s0 = _mm256_dpbusd_epi32(s0, wabs[i], _mm256_sign_epi8(bcast32(aq + 4 * i), load32(w + 32 * i)));
      s1 = _mm256_dpbusd_epi32(s1, wabs[i + 1], _mm256_sign_epi8(bcast32(aq + 4 * i + 4), load32(w + 32 * i + 32)));
    }
    return _mm256_add_epi32(s0, s1);
  }
  // Q6_K: the same integers as the AVX2 tiles' maddubs + madd (quant_x8.cpp), in int32 throughout.
  static inline __m256i q6_scale(__m256i sc32) { return sc32; }  // the int32 scales as they are
  static inline __m256i q6(const __m256i* q, const int8_t* aq, __m256i scale) {
    __m256i s0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q[0], bcast32(aq));
    __m256i s1 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q[1], bcast32(aq + 4));
    s0 = _mm256_dpbusd_epi32(s0, q[2], bcast32(aq + 8));
    s1 = _mm256_dpbusd_epi32(s1, q[3], bcast32(aq + 12));
    return _mm256_mullo_epi32(_mm256_add_epi32(s0, s1), scale);
  }
  // One activation row with 512-bit registers where x8_row1_zmm.h has a tile (group_rows asks):
  // Q8X8's (+30-55 % on a matrix in L2 / L3; the K-quants' gained 5-7 %, left out).
  template <X8Kind K>
  static constexpr bool HAS_ROW1 = K == X8Kind::Q8;
  template <X8Kind K>
  static inline void row1(const uint8_t* g, const QAct& a, int64_t m, float* out, __m256 bias) {
    row1_q8x8(g, a, m, out, bias);
  }
};

}  // namespace
}  // namespace radixlm
