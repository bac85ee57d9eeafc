// The 8-row interleaved kernels' tiles with AVX-512 VNNI (x8_vnni_dot.h's vpdpbusd block dots).
// Compiled for that ISA here only and called when the CPU has it (quant_x8.cpp asks); torch's headers stay out
// of this file so no inline function of theirs is built for an ISA the baseline may lack.
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni")
#include "x8_vnni_dot.h"

namespace radixlm {

namespace {

// One function per kind, kept out of line: a profile (benchmarks/perf_ops.py) then names the
// weight type its samples multiply.
template <X8Kind K>
__attribute__((noinline)) void rows_vnni(const uint8_t* g, const QAct& a, int64_t m0, int64_t m1, float* out,
                                         int64_t ldo, __m256 bv) {
  group_rows<VnniDot, K>(g, a, m0, m1, out, ldo, bv);
}

}  // namespace

void x8_group_rows_vnni(X8Kind kind, const uint8_t* g, const QAct& a, int64_t m0, int64_t m1, float* out, int64_t ldo,
                        const float* bias8) {
  const __m256 bv = bias8 ? _mm256_loadu_ps(bias8) : _mm256_setzero_ps();
  switch (kind) {
    case X8Kind::Q4: rows_vnni<X8Kind::Q4>(g, a, m0, m1, out, ldo, bv); break;
    case X8Kind::Q5: rows_vnni<X8Kind::Q5>(g, a, m0, m1, out, ldo, bv); break;
    case X8Kind::Q4_0: rows_vnni<X8Kind::Q4_0>(g, a, m0, m1, out, ldo, bv); break;
    case X8Kind::Q5_0: rows_vnni<X8Kind::Q5_0>(g, a, m0, m1, out, ldo, bv); break;
    case X8Kind::Q8: rows_vnni<X8Kind::Q8>(g, a, m0, m1, out, ldo, bv); break;
    case X8Kind::Q4K: rows_vnni<X8Kind::Q4K>(g, a, m0, m1, out, ldo, bv); break;
    case X8Kind::Q6K: rows_vnni<X8Kind::Q6K>(g, a, m0, m1, out, ldo, bv); break;
    case X8Kind::MXFP4: rows_vnni<X8Kind::MXFP4>(g, a, m0, m1, out, ldo, bv); break;
  }
}

}  // namespace radixlm
