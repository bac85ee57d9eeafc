// The AVX-512 loops of the compute peaks (peaks.cpp): independent vpdpbusd / vfmadd chains, as
// many as keep both vector ports busy. Compiled for AVX-512 VNNI here only and called when the
// CPU has it; torch's headers stay out of this file (as in quant_x8_vnni.cpp).
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni")
#include <immintrin.h>

#include <cstdint>

namespace radixlm {

constexpr int kChains512 = 12;

// iters x 12 vpdpbusd zmm (64 byte products each); returns a checksum so nothing is dropped.
float peak_loop_vnni512(int64_t iters) {
  __m512i acc[kChains512];
  for (int j = 0; j < kChains512; ++j) acc[j] = _mm512_setzero_si512();
  const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(1);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains512; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], a, b);
  __m512i s = acc[0];
  for (int j = 1; j < kChains512; ++j) s = _mm512_add_epi32(s, acc[j]);
  return (float)_mm512_reduce_add_epi32(s);
}

// iters x 12 vfmadd zmm (16 float multiply-adds each).
float peak_loop_fma512(int64_t iters) {
  __m512 acc[kChains512];
  for (int j = 0; j < kChains512; ++j) acc[j] = _mm512_set1_ps((float)j);
  const __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(0.0f);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains512; ++j) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
  __m512 s = acc[0];
  for (int j = 1; j < kChains512; ++j) s = _mm512_add_ps(s, acc[j]);
  return _mm512_reduce_add_ps(s);
}

}  // namespace radixlm
