// Quantized linear layers on weights repacked 8 rows at a time (Q4_0 / Q4_1 -> Q4X8, Q5_0 / Q5_1 -> Q5X8, Q8_0 -> Q8X8,
// Q4_K -> Q4_KX8, Q6_K -> Q6_KX8; the K-quants' repacking is in quant_kx8.cpp).
//
// Row-major blocks cost a horizontal sum and a scale broadcast per row and block; interleaving 8
// rows puts row r's 4-value groups in 32-bit lane r, so one integer multiply-add serves 8 rows,
// the 8 block dots land in the 8 lanes of one vector and the 8 rows' scales multiply them at once
// (llama.cpp's repacked CPU layouts work the same way). Activations are the int8 blocks of qact.h.
//
// The tiles are in x8_tiles.h; with AVX-512 VNNI the CPU's own byte dot product serves them
// (quant_x8_vnni.cpp), with the same integers and so the same results.
#include "qact.h"
#include "x8_row1_ymm.h"
#include "x8_tiles.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <string>
#include <vector>

namespace radixlm {

void x8_group_rows_vnni(X8Kind kind, const uint8_t* g, const QAct& a, int64_t m0, int64_t m1, float* out, int64_t ldo,
                        const float* bias8);
void x8_group_rows_vbmi_mxfp4(const uint8_t* g, const QAct& a, int64_t m0, int64_t m1, float* out, int64_t ldo,
                              const float* bias8);
void x8_pair_rows_vbmi(X8Kind kind, const uint8_t* g, int64_t group_bytes, const QAct& a, int64_t m, float* out,
                       const float* bias16);
void x8_pair_tiles_vbmi(X8Kind kind, const uint8_t* g, int64_t group_bytes, const QAct& a, int64_t m0, int64_t m1,
                        float* out, int64_t ldo, const float* bias16);
void x8_pair_tiles_amx(X8Kind kind, const uint8_t* g, int64_t group_bytes, const QAct& a, int64_t m0, int64_t m1,
                       float* out, int64_t ldo, const float* bias16);

bool amx_compiled();  // quant_x8_amx.cpp: false where the compiler knows no AMX

// AMX-INT8, and Linux's permission for this process's tile data (asked once, as llama.cpp's and
// oneDNN's AMX paths ask: arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
bool amx_supported() {
  static const bool ok = [] {
    if (!amx_compiled()) return false;
    __builtin_cpu_init();  // the VBMI level's kernels run beside the tiles
    const bool vbmi = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vbmi") &&
                      __builtin_cpu_supports("gfni");
    unsigned a, b, c, d;  // CPUID.7.0:EDX bit 24 AMX-TILE, bit 25 AMX-INT8
    if (!vbmi || !__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 24) & 1) || !((d >> 25) & 1)) return false;
#ifdef __linux__
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return false;
#endif
  }();
  return ok;
}

namespace {

struct Avx2Dot {
  static constexpr int RM = 4;
  static inline __m256 e8m0_halves8(const uint8_t* p) { return radixlm::e8m0_halves8(p); }
  static inline __m256i q4(const __m256i* lo, const __m256i* hi, const int8_t* aq) {
    // 16-bit partial sums: 8 x (2 x 15 x 127) stays below 32767.
    __m256i s = _mm256_maddubs_epi16(lo[0], bcast32(aq));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(lo[1], bcast32(aq + 4)));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(lo[2], bcast32(aq + 8)));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(lo[3], bcast32(aq + 12)));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(hi[0], bcast32(aq + 16)));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(hi[1], bcast32(aq + 20)));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(hi[2], bcast32(aq + 24)));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(hi[3], bcast32(aq + 28)));
    return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
  }
  // Q5's values (0..31): two chains of 4 maddubs, as u24's, stay within 4 x 2 x 31 x 127 = 31496.
  static inline __m256i q5(const __m256i* lo, const __m256i* hi, const int8_t* aq) { return u24(lo, hi, aq); }
  static inline __m256i fifth_bits(const uint8_t* p) { return fifth_bits_avx2(p); }
  // Unsigned values up to 24 (MXFP4 offset by 12): 4 maddubs stay within 4 x 2 x 24 x 127 = 24384
  // in 16 bits, then madd widens each half.
  static inline __m256i u24(const __m256i* lo, const __m256i* hi, const int8_t* aq) {
    __m256i s0 = _mm256_maddubs_epi16(lo[0], bcast32(aq)), s1 = _mm256_maddubs_epi16(hi[0], bcast32(aq + 16));
    for (int i = 1; i < 4; ++i) {
      s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(lo[i], bcast32(aq + 4 * i)));
      s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(hi[i], bcast32(aq + 16 + 4 * i)));
    }
    const __m256i one = _mm256_set1_epi16(1);
    return _mm256_add_epi32(_mm256_madd_epi16(s0, one), _mm256_madd_epi16(s1, one));
  }
  // Q4_KX8: q4's dot with the sub-block's scale applied by the widening madd (no extra step):
  // 8 x 2 x 15 x 127 in 16 bits, times a scale below 64 in each int32.
  static inline __m256i k_scale(const uint8_t* sc) { return u8_pairs16(sc); }
  static inline __m256i q4k(const __m256i* w, const int8_t* aq, __m256i scale) {
    __m256i s = _mm256_maddubs_epi16(w[0], bcast32(aq));
    for (int i = 1; i < 8; ++i) s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[i], bcast32(aq + 4 * i)));
    return _mm256_madd_epi16(s, scale);
  }
  // |w| (wabs: the tile's, shared by its rows) times a carrying w's sign (w: the chunks in memory).
  static inline __m256i q8(const __m256i* wabs, const uint8_t* w, const int8_t* aq) {
    __m256i s = _mm256_setzero_si256();
    for (int i = 0; i < 8; ++i) {
      const __m256i p = _mm256_maddubs_epi16(wabs[i], _mm256_sign_epi8(bcast32(aq + 4 * i), load32(w + 32 * i)));
      s = _mm256_add_epi32(s, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
    }
    return s;
  }
  // Q6_K: the scale times the dot of 16 unsigned 6-bit values with the activations, exact: two
  // maddubs stay within 2 x 2 x 63 x 127 = 32004 in 16 bits, then madd applies the scale.
  // Lane r: row r's scale (sign-extended int32 lanes) in both 16-bit halves: one byte shuffle.
  static inline __m256i q6_scale(__m256i sc32) {
    return _mm256_shuffle_epi8(sc32, _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5,
                                                      4, 5, 8, 9, 8, 9, 12, 13, 12, 13));
  }
  static inline __m256i q6(const __m256i* q, const int8_t* aq, __m256i scale) {
    const __m256i s01 = _mm256_add_epi16(_mm256_maddubs_epi16(q[0], bcast32(aq)), _mm256_maddubs_epi16(q[1], bcast32(aq + 4)));
    const __m256i s23 = _mm256_add_epi16(_mm256_maddubs_epi16(q[2], bcast32(aq + 8)), _mm256_maddubs_epi16(q[3], bcast32(aq + 12)));
    return _mm256_add_epi32(_mm256_madd_epi16(s01, scale), _mm256_madd_epi16(s23, scale));
  }
  // One activation row where x8_row1_ymm.h has a kernel (group_rows asks).
  template <X8Kind K>
  static constexpr bool HAS_ROW1 = K == X8Kind::Q4K;
  template <X8Kind K>
  static inline void row1(const uint8_t* g, const QAct& a, int64_t m, float* out, __m256 bias) {
    row1_q4kx8_ymm(g, a, m, out, bias);
  }
};

// Which tiles run: VNNI where the CPU has it (libgcc's check includes the OS saving the AVX-512
// state), and where it has VBMI and GFNI too MXFP4's lookups and decode rows two weight groups
// at a time (quant_x8_pair.cpp). Every level gives the same bits, so the level is a speed choice
// only, made twice: for one activation row (decode) and for more. The widest level is not the
// fastest everywhere (Zen 4 splits 512-bit work in two), so kernels/calibrate.py times the
// levels on the machine and sets them through qlinear_levels(); RADIXLM_KERNEL_ISA=avx2 (or
// avx512vnni, avx512vbmi) caps both, and the calibration keeps to that cap. AMX (the VBMI level
// with the prefill tiles' block dots on tile multiplies, quant_x8_amx.cpp) is a level for more
// than one row only: one row runs VBMI's kernels under it.
enum class Isa { AVX2 = 0, VNNI = 1, VBMI = 2, AMX = 3 };
bool vnni_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw");
}
// The VBMI level also takes GFNI (quant_x8_pair.cpp): every CPU with VNNI and VBMI has it.
bool vbmi_supported() {
  return vnni_supported() && __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("gfni");
}
Isa best_isa() {
  return amx_supported() ? Isa::AMX : vbmi_supported() ? Isa::VBMI : vnni_supported() ? Isa::VNNI : Isa::AVX2;
}
Isa initial_isa() {
  const char* env = std::getenv("RADIXLM_KERNEL_ISA");
  const std::string want = env ? env : "";
  const Isa best = best_isa();
  if (want == "avx2") return Isa::AVX2;
  if (want == "avx512vnni" && best != Isa::AVX2) return Isa::VNNI;
  if (want == "avx512vbmi" && best >= Isa::VBMI) return Isa::VBMI;
  return best;
}
Isa& isa_level(bool one_row) {
  static Isa decode = std::min(initial_isa(), Isa::VBMI), batch = initial_isa();
  return one_row ? decode : batch;
}

// Rows of M in blocks that stay in L2 while a thread's weight groups pass over them.
constexpr int64_t M_BLOCK = 64;

template <X8Kind Kind>
void gemm(const uint8_t* W, int64_t group_bytes, int64_t N, const QAct& a, int64_t M, float* out,
          int64_t ldo, const float* bias) {
  const int64_t groups = N / 8;
  const Isa isa = isa_level(M == 1);
  const int64_t grain = std::max<int64_t>(1, groups / (4 * at::get_num_threads()));
  at::parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    if (isa >= Isa::VBMI) {  // groups in pairs, in 512-bit registers (an odd one left to the tiles)
      const int64_t paired = g0 + (g1 - g0) / 2 * 2;
      // AMX makes a pair's weight tiles once per row block (quant_x8_amx.cpp): longer blocks share
      // them more, as long as the block's activations (rows x K bytes) stay within half an L2
      const int64_t m_block = isa == Isa::AMX && Kind != X8Kind::Q6K
                                  ? std::clamp<int64_t>((int64_t{1} << 19) / a.K / 32 * 32, M_BLOCK, 4 * M_BLOCK)
                                  : M_BLOCK;
      for (int64_t mb = 0; mb < M; mb += m_block)
        for (int64_t g = g0; g < paired; g += 2) {
          const uint8_t* gw = W + g * group_bytes;
          const float* b16 = bias ? bias + 8 * g : nullptr;
          if (M == 1)  // decode: the one-row kernels
            x8_pair_rows_vbmi(Kind, gw, group_bytes, a, 0, out + 8 * g, b16);
          else if (isa == Isa::AMX)
            x8_pair_tiles_amx(Kind, gw, group_bytes, a, mb, std::min(M, mb + m_block), out + 8 * g, ldo, b16);
          else
            x8_pair_tiles_vbmi(Kind, gw, group_bytes, a, mb, std::min(M, mb + M_BLOCK), out + 8 * g, ldo, b16);
        }
      g0 = paired;
    }
    for (int64_t mb = 0; mb < M; mb += M_BLOCK) {
      const int64_t me = std::min(M, mb + M_BLOCK);
      for (int64_t g = g0; g < g1; ++g) {
        const uint8_t* gw = W + g * group_bytes;
        float* o = out + 8 * g;
        if (Kind == X8Kind::MXFP4 && isa >= Isa::VBMI) {
          x8_group_rows_vbmi_mxfp4(gw, a, mb, me, o, ldo, bias ? bias + 8 * g : nullptr);
          continue;
        }
        if (isa != Isa::AVX2) {
          x8_group_rows_vnni(Kind, gw, a, mb, me, o, ldo, bias ? bias + 8 * g : nullptr);
          continue;
        }
        const __m256 bv = bias ? _mm256_loadu_ps(bias + 8 * g) : _mm256_setzero_ps();
        group_rows<Avx2Dot, Kind>(gw, a, mb, me, o, ldo, bv);
      }
    }
  });
}


std::vector<int32_t> sums16(const QAct& a, int64_t M) {
  std::vector<int32_t> out(M * a.nb);
  act_sums16(a, 0, M, out.data());
  return out;
}

}  // namespace

void act_sums16(const QAct& a, int64_t m0, int64_t m1, int32_t* out) {
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t b = 0; b < a.nb; ++b) {
      const int8_t* q = a.qrow(m) + 32 * b;
      int32_t lo = 0, hi = 0;
      for (int i = 0; i < 16; ++i) lo += q[i], hi += q[16 + i];
      out[m * a.nb + b] = (int32_t)(((uint32_t)(uint16_t)(int16_t)hi << 16) | (uint16_t)(int16_t)lo);
    }
}

// QAct::sum32p of rows [0, M): each block's two 16-value sums added, adjacent blocks paired.
static std::vector<int32_t> sum32_pairs(const QAct& a, int64_t M) {
  std::vector<int32_t> p(M * (a.nb / 2));
  for (int64_t m = 0; m < M; ++m) {
    const int32_t* s16 = a.sum16row(m);
    for (int64_t b = 0; b < a.nb; b += 2) {
      const int32_t s0 = (int16_t)(s16[b] & 0xFFFF) + (int16_t)(s16[b] >> 16);
      const int32_t s1 = (int16_t)(s16[b + 1] & 0xFFFF) + (int16_t)(s16[b + 1] >> 16);
      p[m * (a.nb / 2) + b / 2] = (int32_t)(((uint32_t)(uint16_t)(int16_t)s1 << 16) | (uint16_t)(int16_t)s0);
    }
  }
  return p;
}

// QAct::panels of rows [0, M): the last panel's missing rows zero (tiles never read them).
std::vector<int8_t> make_panels(const QAct& a, int64_t M) {
  std::vector<int8_t> p((M + 15) / 16 * 16 * a.K, 0);
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t b = 0; b < a.nb; ++b)
        std::memcpy(p.data() + (m >> 4) * 16 * a.K + b * 512 + (m & 15) * 32, a.qrow(m) + 32 * b, 32);
  });
  return p;
}

void gemm_x8(int64_t fmt, const uint8_t* W, int64_t group_bytes, int64_t N, const QAct& a, int64_t M, float* out,
             int64_t ldo, const float* bias) {
  // The K-quants take Q8_K-style activations (qact.h: quantize_row_k, sums included)
  TORCH_CHECK(a.per256 == fmt_takes_k_acts(fmt) && (!a.per256 || a.sum16 != nullptr),
              "interleaved format ", fmt, ": activations quantized ", a.per256 ? "per 256" : "per 32", " do not fit it");
  // MXFP4X8 takes the 16-value sums, and Q8X8's 512-bit tiles the block sums made of them
  const bool sums = fmt == FMT_MXFP4X8 || (fmt == FMT_Q8X8 && M > 1 && isa_level(false) >= Isa::VBMI);
  if (sums && a.sum16 == nullptr) {  // (a caller may have
    const std::vector<int32_t> s16 = sums16(a, M);                         // made them for many calls)
    QAct with = a;
    with.sum16 = s16.data();
    gemm_x8(fmt, W, group_bytes, N, with, M, out, ldo, bias);
    return;
  }
  if (M > 1 && isa_level(false) >= Isa::VBMI && a.panels == nullptr) {  // the 512-bit tiles' copy
    const std::vector<int8_t> panels = make_panels(a, M);
    QAct with = a;
    with.panels = panels.data();
    gemm_x8(fmt, W, group_bytes, N, with, M, out, ldo, bias);
    return;
  }
  if (fmt == FMT_Q4KX8 && M > 1 && a.sum32p == nullptr) {  // the tiles' mins in half the madds
    const std::vector<int32_t> pairs = sum32_pairs(a, M);
    QAct with = a;
    with.sum32p = pairs.data();
    gemm_x8(fmt, W, group_bytes, N, with, M, out, ldo, bias);
    return;
  }
  switch (fmt) {
    case FMT_Q6KX8: gemm<X8Kind::Q6K>(W, group_bytes, N, a, M, out, ldo, bias); break;
    case FMT_Q4X8: gemm<X8Kind::Q4>(W, group_bytes, N, a, M, out, ldo, bias); break;
    case FMT_Q5X8: gemm<X8Kind::Q5>(W, group_bytes, N, a, M, out, ldo, bias); break;
    case FMT_Q4_0X8: gemm<X8Kind::Q4_0>(W, group_bytes, N, a, M, out, ldo, bias); break;
    case FMT_Q5_0X8: gemm<X8Kind::Q5_0>(W, group_bytes, N, a, M, out, ldo, bias); break;
    case FMT_Q8X8: gemm<X8Kind::Q8>(W, group_bytes, N, a, M, out, ldo, bias); break;
    case FMT_MXFP4X8: gemm<X8Kind::MXFP4>(W, group_bytes, N, a, M, out, ldo, bias); break;
    default: gemm<X8Kind::Q4K>(W, group_bytes, N, a, M, out, ldo, bias); break;
  }
}

void dequant_row_x8(int64_t fmt, const uint8_t* W, int64_t group_bytes, int64_t row, int64_t K, float* y) {
  if (fmt == FMT_Q4KX8 || fmt == FMT_Q6KX8) {
    dequant_row_kx8(fmt, W, group_bytes, row, K, y);
    return;
  }
  const uint8_t* g = W + (row / 8) * group_bytes;
  const int64_t r = row % 8;
  for (int64_t b = 0; b < K / 32; ++b) {
    float* yb = y + 32 * b;
    if (fmt == FMT_MXFP4X8) {
      static const int8_t values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
      const uint8_t* blk = g + b * 136;
      const uint8_t e = blk[r];
      const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
      float d;
      std::memcpy(&d, &bits, 4);
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) {
          const uint8_t q = blk[8 + 32 * i + 4 * r + j];
          yb[4 * i + j] = d * values[q & 0xF];
          yb[16 + 4 * i + j] = d * values[q >> 4];
        }
    } else if (fmt == FMT_Q4X8 || fmt == FMT_Q5X8 || fmt == FMT_Q4_0X8 || fmt == FMT_Q5_0X8) {
      const bool q5 = fmt == FMT_Q5X8 || fmt == FMT_Q5_0X8, has_min = fmt == FMT_Q4X8 || fmt == FMT_Q5X8;
      const int64_t qs = has_min ? 32 : 16;  // the nibbles follow d[8] (and m[8])
      const uint8_t* blk = g + b * fmt_block_bytes(fmt);
      const float d = fp16(blk + 2 * r), mn = has_min ? fp16(blk + 16 + 2 * r) : (q5 ? -16.0f : -8.0f) * d;
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) {
          const uint8_t q = blk[qs + 32 * i + 4 * r + j];
          const int bit = 4 * r + j;  // in words i (low values) and 4 + i (high)
          const int lo5 = q5 ? (blk[qs + 128 + 4 * i + bit / 8] >> (bit % 8) & 1) << 4 : 0;
          const int hi5 = q5 ? (blk[qs + 144 + 4 * i + bit / 8] >> (bit % 8) & 1) << 4 : 0;
          yb[4 * i + j] = d * ((q & 0xF) | lo5) + mn;
          yb[16 + 4 * i + j] = d * ((q >> 4) | hi5) + mn;
        }
    } else {
      const uint8_t* blk = g + b * 272;
      const float d = fp16(blk + 2 * r);
      for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 4; ++j) yb[4 * i + j] = d * (int8_t)blk[16 + 32 * i + 4 * r + j];
    }
  }
}

// [N, row_bytes] GGUF blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 or MXFP4) -> [N / 8, blocks * group block
// bytes]. Q4_0 / Q5_0 keep only d (Q4_0X8, Q5_0X8: the kernels make their offsets -8 d, -16 d);
// MXFP4 keeps its exponent bytes and nibbles as they are.
at::Tensor repack_x8(const at::Tensor& w, int64_t fmt, int64_t cols) {
  if (fmt == FMT_Q4_K || fmt == FMT_Q6_K) return repack_kx8(w, fmt, cols);
  TORCH_CHECK(fmt == FMT_Q4_0 || fmt == FMT_Q4_1 || fmt == FMT_Q8_0 || fmt == FMT_MXFP4 || fmt == FMT_Q5_0 ||
                  fmt == FMT_Q5_1,
              "repack_x8: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, Q4_K or Q6_K weights, got format ", fmt);
  TORCH_CHECK(w.dtype() == at::kByte && w.dim() == 2 && w.is_contiguous() && w.size(1) == fmt_row_bytes(fmt, cols),
              "repack_x8: contiguous uint8 [rows, row_bytes] in the format");
  TORCH_CHECK(cols % 32 == 0 && w.size(0) % 8 == 0, "repack_x8: rows must be a multiple of 8 (got ", w.size(0), ")");
  const int64_t N = w.size(0), nb = cols / 32, src_bytes = fmt_block_bytes(fmt);
  const bool q5 = fmt == FMT_Q5_0 || fmt == FMT_Q5_1;
  const bool has_min = fmt == FMT_Q4_1 || fmt == FMT_Q5_1;
  const int64_t packed = fmt == FMT_Q8_0    ? FMT_Q8X8
                         : fmt == FMT_MXFP4 ? FMT_MXFP4X8
                         : q5               ? (has_min ? FMT_Q5X8 : FMT_Q5_0X8)
                                            : (has_min ? FMT_Q4X8 : FMT_Q4_0X8);
  const int64_t qs_at = has_min ? 32 : 16;  // the nibble chunks, after d[8] (and m[8])
  const int64_t gb = fmt_block_bytes(packed);
  auto out = q5 ? at::zeros({N / 8, nb * gb}, w.options()) : at::empty({N / 8, nb * gb}, w.options());
  const uint8_t* src = w.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  const int64_t rb = w.size(1);
  at::parallel_for(0, N / 8, 16, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* o = dst + g * nb * gb + b * gb;
        for (int64_t r = 0; r < 8; ++r) {
          const uint8_t* blk = src + (8 * g + r) * rb + b * src_bytes;
          if (packed == FMT_Q8X8) {
            std::memcpy(o + 2 * r, blk, 2);
            for (int i = 0; i < 8; ++i) std::memcpy(o + 16 + 32 * i + 4 * r, blk + 2 + 4 * i, 4);
            continue;
          }
          if (packed == FMT_MXFP4X8) {
            o[r] = blk[0];
            for (int i = 0; i < 4; ++i) std::memcpy(o + 8 + 32 * i + 4 * r, blk + 1 + 4 * i, 4);
            continue;
          }
          const uint8_t* qs = blk + 2 + (has_min ? 2 : 0) + (q5 ? 4 : 0);
          std::memcpy(o + 2 * r, blk, 2);
          if (has_min) std::memcpy(o + 16 + 2 * r, blk + 2, 2);
          for (int i = 0; i < 4; ++i) std::memcpy(o + qs_at + 32 * i + 4 * r, qs + 4 * i, 4);
          if (q5) {  // qh bit v is value v's fifth bit: values 4i + j (word i) and 16 + 4i + j (word 4 + i)
            uint32_t qh;
            std::memcpy(&qh, blk + 2 + (has_min ? 2 : 0), 4);
            for (int i = 0; i < 4; ++i) {
              for (int k = 0; k < 2; ++k) {  // the words start zero (at::zeros)
                uint32_t word;
                std::memcpy(&word, o + qs_at + 128 + 16 * k + 4 * i, 4);
                word |= (qh >> (16 * k + 4 * i) & 0xF) << (4 * r);
                std::memcpy(o + qs_at + 128 + 16 * k + 4 * i, &word, 4);
              }
            }
          }
        }
      }
  });
  return out;
}

const char* const kIsaNames[] = {"avx2", "avx512vnni", "avx512vbmi", "amx"};

Isa parse_isa(const std::string& isa, const char* op) {
  TORCH_CHECK(isa == "avx2" || isa == "avx512vnni" || isa == "avx512vbmi" || isa == "amx", op,
              ": isa must be 'avx2', 'avx512vnni', 'avx512vbmi' or 'amx', got '", isa, "'");
  TORCH_CHECK(isa == "avx2" || vnni_supported(), op, ": this CPU has no AVX-512 VNNI");
  TORCH_CHECK(isa == "avx2" || isa == "avx512vnni" || vbmi_supported(), op, ": this CPU has no AVX-512 VBMI");
  TORCH_CHECK(isa != "amx" || amx_supported(), op, ": this CPU has no AMX-INT8 (or its OS does not give it)");
  return isa == "avx2" ? Isa::AVX2 : isa == "avx512vnni" ? Isa::VNNI : isa == "avx512vbmi" ? Isa::VBMI : Isa::AMX;
}

// The ISA the interleaved kernels use for more than one row ("avx512vbmi": VNNI's tiles with
// VBMI's MXFP4 lookups, "avx512vnni" or "avx2"); `isa` non-empty sets both levels first (tests
// compare them; an ISA the CPU lacks is refused).
std::string qlinear_isa(const std::string& isa) {
  if (!isa.empty()) {
    isa_level(false) = parse_isa(isa, "qlinear_isa");
    isa_level(true) = std::min(isa_level(false), Isa::VBMI);  // AMX is a batch level
  }
  return kIsaNames[(int)isa_level(false)];
}

// [decode level, batch level]; each non-empty argument sets its level first.
std::vector<std::string> qlinear_levels(const std::string& decode, const std::string& batch) {
  if (!decode.empty()) isa_level(true) = std::min(parse_isa(decode, "qlinear_levels"), Isa::VBMI);
  if (!batch.empty()) isa_level(false) = parse_isa(batch, "qlinear_levels");
  return {kIsaNames[(int)isa_level(true)], kIsaNames[(int)isa_level(false)]};
}

// The levels this CPU can run, narrowest first, within RADIXLM_KERNEL_ISA's cap.
std::vector<std::string> qlinear_isas() {
  std::vector<std::string> out;
  for (int i = 0; i <= (int)initial_isa(); ++i) out.push_back(kIsaNames[i]);
  return out;
}

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("repack_x8(Tensor w, int fmt, int cols) -> Tensor");
  m.def("qlinear_isa(str isa=\"\") -> str", &qlinear_isa);
  m.def("qlinear_levels(str decode=\"\", str batch=\"\") -> str[]", &qlinear_levels);
  m.def("qlinear_isas() -> str[]", &qlinear_isas);
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) {
  m.impl("repack_x8", &repack_x8);
}

}  // namespace radixlm
