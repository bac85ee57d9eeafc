// The 8-row interleaved kernels' tiles with AVX-512 VNNI (256-bit vpdpbusd: 4 byte products summed
// into each int32 lane in one instruction, where AVX2 needs maddubs + adds + madd). Compiled for
// that ISA here only and called when the CPU has it (quant_x8.cpp asks); torch's headers stay out
// of this file so no inline function of theirs is built for an ISA the baseline may lack.
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni")
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
  // Unsigned values up to 24 (MXFP4 offset by 12): vpdpbusd's int32 sums cannot overflow.
  static inline __m256i u24(const __m256i* lo, const __m256i* hi, const int8_t* aq) { return q4(lo, hi, aq); }
  // Signed x signed through the sign trick: |w| (unsigned) times a carrying w's sign.
  static inline __m256i q8(const __m256i* w, const int8_t* aq) {
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    for (int i = 0; i < 8; i += 2) {
      s0 = _mm256_dpbusd_epi32(s0, _mm256_abs_epi8(w[i]), _mm256_sign_epi8(bcast32(aq + 4 * i), w[i]));
      s1 = _mm256_dpbusd_epi32(s1, _mm256_abs_epi8(w[i + 1]), _mm256_sign_epi8(bcast32(aq + 4 * i + 4), w[i + 1]));
    }
    return _mm256_add_epi32(s0, s1);
  }
  // Q6_K: the same integers as the AVX2 tiles' maddubs + madd (quant_x8.cpp), in int32 throughout.
  static inline __m256i q6_scale(const int8_t* sc) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)sc)); }
  static inline __m256i q6(const __m256i* q, const int8_t* aq, __m256i scale) {
    __m256i s0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q[0], bcast32(aq));
    __m256i s1 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q[1], bcast32(aq + 4));
    s0 = _mm256_dpbusd_epi32(s0, q[2], bcast32(aq + 8));
    s1 = _mm256_dpbusd_epi32(s1, q[3], bcast32(aq + 12));
    return _mm256_mullo_epi32(_mm256_add_epi32(s0, s1), scale);
  }
};

}  // namespace

void x8_group_rows_vnni(X8Kind kind, const uint8_t* g, const QAct& a, int64_t m0, int64_t m1, float* out, int64_t ldo,
                        const float* bias8) {
  const __m256 bv = bias8 ? _mm256_loadu_ps(bias8) : _mm256_setzero_ps();
  switch (kind) {
    case X8Kind::Q4: group_rows<VnniDot, X8Kind::Q4>(g, a, m0, m1, out, ldo, bv); break;
    case X8Kind::Q8: group_rows<VnniDot, X8Kind::Q8>(g, a, m0, m1, out, ldo, bv); break;
    case X8Kind::Q4K: group_rows<VnniDot, X8Kind::Q4K>(g, a, m0, m1, out, ldo, bv); break;
    case X8Kind::Q6K: group_rows<VnniDot, X8Kind::Q6K>(g, a, m0, m1, out, ldo, bv); break;
    case X8Kind::MXFP4: group_rows<VnniDot, X8Kind::MXFP4>(g, a, m0, m1, out, ldo, bv); break;
  }
}

}  // namespace radixlm
