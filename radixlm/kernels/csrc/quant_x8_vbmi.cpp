// The MXFP4 tiles with AVX-512 VBMI besides VNNI: vpermb looks the e2m1 values up from 5-bit
// indices in a 32-entry table, which repeats the 16 values, so the nibbles need no masking
// (vpshufb reads 4 bits but zeroes a byte whose top bit is set: every lookup needs an AND first).
// Eight ANDs fewer in a block's ~50 instructions, where decode streams MXFP4 experts compute-bound
// at the machine's faster read rate. The integers, and so the results, are the VNNI tiles'.
// Compiled for that ISA here only; called when the CPU has it (quant_x8.cpp asks).
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni,avx512vbmi")
#include "x8_vnni_dot.h"

namespace radixlm {
namespace {

struct VbmiDot : VnniDot {
  static constexpr bool VBMI_LOOKUP = true;  // tile_mxfp4x8 looks up with vpermb
};

}  // namespace

void x8_group_rows_vbmi_mxfp4(const uint8_t* g, const QAct& a, int64_t m0, int64_t m1, float* out, int64_t ldo,
                              const float* bias8) {
  const __m256 bv = bias8 ? _mm256_loadu_ps(bias8) : _mm256_setzero_ps();
  group_rows<VbmiDot, X8Kind::MXFP4>(g, a, m0, m1, out, ldo, bv);
}

}  // namespace radixlm
