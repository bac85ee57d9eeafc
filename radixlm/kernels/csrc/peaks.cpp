// The machine's compute peaks, for `radixlm bench limits` and the rooflines of `bench one-batch`:
// each of ATen's threads runs a loop of independent multiply-add chains at one ISA level (int8
// dot products: AVX2's vpmaddubsw + vpmaddwd, AVX-VNNI's and AVX-512 VNNI's vpdpbusd; float32
// FMA at 256 and 512 bits), timed together. An operation is a multiply or an add (a byte product
// added into a sum: 2), as TOPS / FLOP/s figures count them.
#include "common.h"

#include <chrono>
#include <string>
#include <vector>

namespace radixlm {

float peak_loop_vnni512(int64_t iters);  // peaks_avx512.cpp
float peak_loop_fma512(int64_t iters);
float peak_loop_avxvnni(int64_t iters);  // peaks_avxvnni.cpp
float peak_loop_amx(int64_t iters);      // peaks_amx.cpp
bool amx_supported();                    // quant_x8.cpp (asks Linux for the tile state once)

namespace peaks {

constexpr int kChains = 12;

// iters x 6 (vpmaddubsw + vpmaddwd + vpaddd) on ymm: 32 byte products each. Each chain has its
// own weights b[j]: with one b for all, the compiler computed the product once per iteration and
// the loop measured adds (0.506 TOPS where the multiplies give ~0.3). Six chains keep the
// accumulators and weights in registers (twelve spilled them to the stack).
constexpr int kAvx2Chains = 6;
float loop_avx2_int8(int64_t iters) {
  __m256i acc[kAvx2Chains], b[kAvx2Chains];
  for (int j = 0; j < kAvx2Chains; ++j) acc[j] = _mm256_setzero_si256(), b[j] = _mm256_set1_epi8((char)(j + 1));
  __m256i a = _mm256_set1_epi8(1);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < iters; ++i) {
    __asm__ volatile("" : "+x"(a));  // the products are not loop-invariant: not hoisted
    for (int j = 0; j < kAvx2Chains; ++j)
      acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b[j]), ones));
  }
  __m256i s = acc[0];
  for (int j = 1; j < kAvx2Chains; ++j) s = _mm256_add_epi32(s, acc[j]);
  return (float)_mm256_extract_epi32(s, 0);
}

// iters x 12 vfmadd ymm: 8 float multiply-adds each.
float loop_fma256(int64_t iters) {
  __m256 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm256_set1_ps((float)j);
  const __m256 a = _mm256_set1_ps(1.0f), b = _mm256_set1_ps(0.0f);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
  __m256 s = acc[0];
  for (int j = 1; j < kChains; ++j) s = _mm256_add_ps(s, acc[j]);
  return _mm256_cvtss_f32(s);
}

// __builtin_cpu_supports takes a literal only.
#define RADIXLM_HAS(feature) (__builtin_cpu_init(), __builtin_cpu_supports(feature))

}  // namespace peaks

// Operations per second of `kind` ("int8_avx2", "int8_avxvnni", "int8_avx512vnni", "int8_amx",
// "fp32_avx2", "fp32_avx512") with every ATen thread running `iters` iterations at once; refused by name when
// the CPU lacks the ISA.
double compute_peak(const std::string& kind, int64_t iters) {
  using namespace peaks;
  float (*loop)(int64_t) = nullptr;
  double ops = 0;  // per iteration
  if (kind == "int8_avx2") loop = loop_avx2_int8, ops = kAvx2Chains * 32 * 2;
  else if (kind == "fp32_avx2") loop = loop_fma256, ops = kChains * 8 * 2;
  else if (kind == "int8_avxvnni") {
    TORCH_CHECK(RADIXLM_HAS("avxvnni"), "compute_peak: this CPU has no AVX-VNNI");
    loop = peak_loop_avxvnni, ops = kChains * 32 * 2;
  } else if (kind == "int8_avx512vnni") {
    TORCH_CHECK(RADIXLM_HAS("avx512vnni") && RADIXLM_HAS("avx512bw") && RADIXLM_HAS("avx512vl"), "compute_peak: this CPU has no AVX-512 VNNI");
    loop = peak_loop_vnni512, ops = kChains * 64 * 2;
  } else if (kind == "int8_amx") {
    TORCH_CHECK(amx_supported(), "compute_peak: this CPU has no AMX-INT8 (or its OS does not give it)");
    loop = peak_loop_amx, ops = 4.0 * 16 * 16 * 64 * 2;
  } else if (kind == "fp32_avx512") {
    TORCH_CHECK(RADIXLM_HAS("avx512f"), "compute_peak: this CPU has no AVX-512");
    loop = peak_loop_fma512, ops = kChains * 16 * 2;
  }
  TORCH_CHECK(loop != nullptr, "compute_peak: kind must be int8_avx2, int8_avxvnni, int8_avx512vnni, int8_amx, fp32_avx2 or ",
              "fp32_avx512, got '", kind, "'");
  TORCH_CHECK(iters > 0, "compute_peak: iters must be positive, got ", iters);
  const int64_t threads = at::get_num_threads();
  std::vector<float> sink(threads);
  const auto t0 = std::chrono::steady_clock::now();
  at::parallel_for(0, threads, 1, [&](int64_t t0_, int64_t t1_) {
    for (int64_t t = t0_; t < t1_; ++t) sink[t] = loop(iters);
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  volatile float keep = 0;
  for (float v : sink) keep = keep + v;
  return ops * (double)iters * (double)threads / s;
}

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("compute_peak(str kind, int iters) -> float", &compute_peak);
}

}  // namespace radixlm
