// AVX-VNNI's loop of the compute peaks (peaks.cpp): vpdpbusd on 256-bit registers (Alder Lake and
// later cores, Zen 5). Compiled for that ISA here only and called when the CPU has it.
#pragma GCC target("avx2,avxvnni")
#include <immintrin.h>

#include <cstdint>

namespace radixlm {

// iters x 12 vpdpbusd ymm (32 byte products each); returns a checksum.
float peak_loop_avxvnni(int64_t iters) {
  constexpr int kChains = 12;
  __m256i acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm256_setzero_si256();
  const __m256i a = _mm256_set1_epi8(1), b = _mm256_set1_epi8(1);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) acc[j] = _mm256_dpbusd_avx_epi32(acc[j], a, b);
  __m256i s = acc[0];
  for (int j = 1; j < kChains; ++j) s = _mm256_add_epi32(s, acc[j]);
  const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  return (float)(_mm_extract_epi32(h, 0) + _mm_extract_epi32(h, 1) + _mm_extract_epi32(h, 2) + _mm_extract_epi32(h, 3));
}

}  // namespace radixlm
