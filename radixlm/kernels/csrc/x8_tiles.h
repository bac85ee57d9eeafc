// The 8-row interleaved kernels' inner tiles (quant_x8.cpp), written once over a Dot policy that
// makes the exact int32 block dot: AVX2's maddubs chain (quant_x8.cpp) or AVX-512 VNNI's
// vpdpbusd (quant_x8_vnni.cpp, chosen at run time). Both give the same integers, and everything
// after them is the same float sequence, so a row's result does not depend on the ISA either.
//
// Batch invariance: lane r of acc is output (m, 8g + r) and sees, block by block in order,
// acc = fma(float(exact int dot), d_w * d_a, acc) (+ fma(m_w, s_a, acc) for Q4), whatever M is and
// however the rows are tiled, so a row's result never depends on its batch.
//
// Everything here has internal linkage: the file is compiled for two ISAs, and the linker must
// never merge one ISA's copy into the other's callers.
#pragma once
#include <immintrin.h>

#include <cstring>

#include "qact_view.h"

namespace radixlm {
namespace {

inline __m256i bcast32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

inline __m256 scales8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }

// RM activation rows x one group of 8 weight rows, Q4X8: a block is d[8], m[8] (fp16) and 4 chunks
// of 32 bytes; chunk i, lane r = row r's GGUF nibble bytes 4i..4i+3 (values 4i.. low, 16+4i.. high).
template <class Dot, int RM>
inline void tile_q4x8(const uint8_t* g, const QAct& a, int64_t m0, float* out, int64_t ldo, __m256 bias) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc[RM];
  for (int m = 0; m < RM; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* blk = g + b * 160;
    const __m256 dw = scales8(blk), mw = scales8(blk + 16);
    __m256i lo[4], hi[4];
    for (int i = 0; i < 4; ++i) {
      const __m256i raw = _mm256_loadu_si256((const __m256i*)(blk + 32 + 32 * i));
      lo[i] = _mm256_and_si256(raw, m4);
      hi[i] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
    }
    for (int m = 0; m < RM; ++m) {
      const __m256 p = _mm256_cvtepi32_ps(Dot::q4(lo, hi, a.qrow(m0 + m) + b * 32));
      acc[m] = _mm256_fmadd_ps(p, _mm256_mul_ps(dw, _mm256_set1_ps(a.drow(m0 + m)[b])), acc[m]);
      acc[m] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.srow(m0 + m)[b]), acc[m]);
    }
  }
  for (int m = 0; m < RM; ++m) _mm256_storeu_ps(out + (m0 + m) * ldo, _mm256_add_ps(acc[m], bias));
}

// Q8X8: a block is d[8] (fp16) and 8 chunks of 32 bytes; chunk i, lane r = row r's int8 values 4i..4i+3.
template <class Dot, int RM>
inline void tile_q8x8(const uint8_t* g, const QAct& a, int64_t m0, float* out, int64_t ldo, __m256 bias) {
  __m256 acc[RM];
  for (int m = 0; m < RM; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* blk = g + b * 272;
    const __m256 dw = scales8(blk);
    __m256i w[8];
    for (int i = 0; i < 8; ++i) w[i] = _mm256_loadu_si256((const __m256i*)(blk + 16 + 32 * i));
    for (int m = 0; m < RM; ++m) {
      const __m256 p = _mm256_cvtepi32_ps(Dot::q8(w, a.qrow(m0 + m) + b * 32));
      acc[m] = _mm256_fmadd_ps(p, _mm256_mul_ps(dw, _mm256_set1_ps(a.drow(m0 + m)[b])), acc[m]);
    }
  }
  for (int m = 0; m < RM; ++m) _mm256_storeu_ps(out + (m0 + m) * ldo, _mm256_add_ps(acc[m], bias));
}

// Activation rows [m0, m1) against one group of 8 weight rows, in tiles of Dot::RM rows.
template <class Dot, bool Q4>
inline void group_rows(const uint8_t* g, const QAct& a, int64_t m0, int64_t m1, float* out, int64_t ldo, __m256 bias) {
  constexpr int R = Dot::RM;
  int64_t m = m0;
#define RADIXLM_TILE(n)                                 \
  if constexpr (Q4) {                                   \
    tile_q4x8<Dot, n>(g, a, m, out, ldo, bias);         \
  } else {                                              \
    tile_q8x8<Dot, n>(g, a, m, out, ldo, bias);         \
  }
  for (; m + R <= m1; m += R) { RADIXLM_TILE(R) }
  if constexpr (R > 4) {
    if (m + 4 <= m1) { RADIXLM_TILE(4) m += 4; }
  }
  switch (m1 - m) {
    case 3: RADIXLM_TILE(3) break;
    case 2: RADIXLM_TILE(2) break;
    case 1: RADIXLM_TILE(1) break;
    default: break;
  }
#undef RADIXLM_TILE
}

}  // namespace
}  // namespace radixlm
