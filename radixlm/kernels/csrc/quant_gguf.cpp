// Linear kernels for the rest of the common GGUF weight types: Q5_0, Q5_1, IQ4_NL, MXFP4 (32-value
// blocks, tiled by gemm32) and Q5_K, Q3_K, Q2_K, IQ4_XS (256-value super-blocks, by gemm<K>).
// Layouts and value formulas are gguf.quants' dequantizers (= llama.cpp's ggml-common.h); each
// block is unpacked to bytes once and dotted with the int8 activations by integer multiply-adds.
#include "quant_rows.h"

namespace radixlm {
namespace {

// IQ4_NL / IQ4_XS: a nibble indexes this non-uniform table (int8).
alignas(16) constexpr int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                  1,    13,   25,  38,  53,  69,  89,  113};

// MXFP4 (gpt-oss's experts): a nibble is an e2m1 value, here doubled to an exact int8 (ggml's
// kvalues_mxfp4); the block's e8m0 exponent then scales by 2^(e - 128) (the halving undoes the
// doubling).
alignas(16) constexpr int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// ggml's GGML_E8M0_TO_FP32_HALF: 2^(e - 128) as float bits (e < 2: a subnormal).
static inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// 16 bytes of nibbles -> 32 bytes 0..15: low nibbles are values 0..15, high nibbles 16..31.
static inline __m256i nibbles32(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128((const __m128i*)p);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F));
}

// Bit i of a 32-bit little-endian word -> byte i, as 0x10 (the 5th bit of a Q5 value) or 0.
static inline __m256i bits32_to_0x10(const uint8_t* p) {
  uint32_t x;
  std::memcpy(&x, p, 4);
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);  // byte i = source byte i / 8
  b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));     // all ones except bit i % 8
  return _mm256_and_si256(_mm256_cmpeq_epi8(b, _mm256_set1_epi8(-1)), _mm256_set1_epi8(0x10));
}

// Bit `i` of every byte of v moved to bit `to`, other bits cleared. 16-bit shifts only pull a
// neighbouring byte's bits into positions the mask drops (i, to < 8).
static inline __m256i byte_bit(__m256i v, int i, int to) {
  const __m256i s = i >= to ? _mm256_srli_epi16(v, i - to) : _mm256_slli_epi16(v, to - i);
  return _mm256_and_si256(s, _mm256_set1_epi8((char)(1 << to)));
}

static inline __m256i iq4_table() {
  return _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)kvalues_iq4nl));
}

// ---- 32-value blocks, for gemm32 ----

// Q5_0 / Q5_1: 5-bit values 0..31 as unsigned bytes (Q4's pattern plus the high bits); the
// offset (-16 d, or + m) folds in through the activation block's sum.
template <bool HasMin>
struct FQ5 {
  static constexpr int64_t bytes = HasMin ? 24 : 22, header = 0;
  static constexpr bool is_signed = false, has_offset = true;
  static inline __m256i unpack(const uint8_t* blk, float& dw, float& off) {
    dw = fp16(blk);
    off = HasMin ? fp16(blk + 2) : -16.0f * dw;
    const uint8_t* qh = blk + (HasMin ? 4 : 2);
    return _mm256_or_si256(nibbles32(qh + 4), bits32_to_0x10(qh));
  }
  static inline float row_scale(const uint8_t*) { return 1.0f; }
};

// IQ4_NL: table values are signed bytes (|v| <= 127), dotted like Q8_0.
struct FIQ4_NL {
  static constexpr int64_t bytes = 18, header = 0;
  static constexpr bool is_signed = true, has_offset = false;
  static inline __m256i unpack(const uint8_t* blk, float& dw, float& off) {
    dw = fp16(blk), off = 0.0f;
    return _mm256_shuffle_epi8(iq4_table(), nibbles32(blk + 2));
  }
  static inline float row_scale(const uint8_t*) { return 1.0f; }
};

// MXFP4: IQ4_NL's layout with a one-byte exponent for the fp16 scale and the e2m1 table.
struct FMXFP4 {
  static constexpr int64_t bytes = 17, header = 0;
  static constexpr bool is_signed = true, has_offset = false;
  static inline __m256i unpack(const uint8_t* blk, float& dw, float& off) {
    dw = e8m0_half(blk[0]), off = 0.0f;
    const __m256i table = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)kvalues_mxfp4));
    return _mm256_shuffle_epi8(table, nibbles32(blk + 1));
  }
  static inline float row_scale(const uint8_t*) { return 1.0f; }
};

// ---- 256-value super-blocks, for gemm<K> ----

// Q5_K: Q4_K with a 5th bit per value (qh bit s of byte l: sub-block s, value l).
struct KQ5_K {
  template <int R>
  static void run(const uint8_t* w, const QAct& a, int64_t m, float* res) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[R];
    float corr[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), corr[r] = 0.0f;
    for (int64_t b = 0; b < a.nb / 8; ++b) {
      const uint8_t* blk = w + b * 176;
      const float d = fp16(blk), dmin = fp16(blk + 2);
      const __m256i qh = _mm256_loadu_si256((const __m256i*)(blk + 16));
      const uint8_t* qs = blk + 48;
      for (int j = 0; j < 4; ++j) {
        uint8_t sc0, mn0, sc1, mn1;
        q4k_scale_min(2 * j, blk + 4, &sc0, &mn0);
        q4k_scale_min(2 * j + 1, blk + 4, &sc1, &mn1);
        const __m256i raw = _mm256_loadu_si256((const __m256i*)(qs + 32 * j));
        const __m256i lo = _mm256_or_si256(_mm256_and_si256(raw, m4), byte_bit(qh, 2 * j, 4));
        const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), byte_bit(qh, 2 * j + 1, 4));
        const int64_t ab = 8 * b + 2 * j;
        for (int r = 0; r < R; ++r) {
          const int8_t* aq = a.qrow(m + r) + ab * 32;
          const float* ad = a.drow(m + r) + ab;
          const float* as = a.srow(m + r) + ab;
          const __m256i a0 = _mm256_loadu_si256((const __m256i*)aq);
          const __m256i a1 = _mm256_loadu_si256((const __m256i*)(aq + 32));
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_us(lo, a0)), _mm256_set1_ps(d * sc0 * ad[0]), acc[r]);
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_us(hi, a1)), _mm256_set1_ps(d * sc1 * ad[1]), acc[r]);
          corr[r] += dmin * (mn0 * as[0] + mn1 * as[1]);
        }
      }
    }
    for (int r = 0; r < R; ++r) res[r] = hsum(acc[r]) - corr[r];
  }
};

// Q3_K's 16 6-bit scales (signed, -32..31), one per 16 values.
inline void q3k_scales(const uint8_t* s, int8_t* sc) {
  for (int k = 0; k < 16; ++k) {
    const int lo = (k < 8 ? s[k] : s[k - 8] >> 4) & 0xF, hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
    sc[k] = (int8_t)((lo | (hi << 4)) - 32);
  }
}

// 16-bit lanes holding scale s0 in the low 128 bits (values 0..15 of an activation block), s1 in
// the high (values 16..31): the per-16 scales multiply inside the integer dot.
static inline __m256i lane_scales(int s0, int s1) {
  return _mm256_set_m128i(_mm_set1_epi16((short)s1), _mm_set1_epi16((short)s0));
}

// Q3_K: value 32 i + l (i = 4 h + s) = (qs[32 h + l] >> 2 s & 3) - (hmask[l] bit i ? 0 : 4),
// signed -4..3, Q6_K's way: signed bytes, 16-value scales as 16-bit lanes.
struct KQ3_K {
  template <int R>
  static void run(const uint8_t* w, const QAct& a, int64_t m, float* res) {
    const __m256i m3 = _mm256_set1_epi8(3), c4 = _mm256_set1_epi8(4);
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < a.nb / 8; ++b) {
      const uint8_t* blk = w + b * 110;
      const float d = fp16(blk + 108);
      int8_t sc[16];
      q3k_scales(blk + 96, sc);
      const __m256i hm = _mm256_loadu_si256((const __m256i*)blk);
      for (int h = 0; h < 2; ++h) {
        const __m256i q2 = _mm256_loadu_si256((const __m256i*)(blk + 32 + 32 * h));
        for (int s = 0; s < 4; ++s) {
          const int i = 4 * h + s;
          const __m256i q = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q2, 2 * s), m3), byte_bit(hm, i, 2));
          const __m256i wq = _mm256_sub_epi8(q, c4);
          const __m256i wu = _mm256_sign_epi8(wq, wq);
          const __m256i scv = lane_scales(sc[2 * i], sc[2 * i + 1]);
          const int64_t ab = 8 * b + i;
          for (int r = 0; r < R; ++r) {
            const __m256i av = _mm256_loadu_si256((const __m256i*)(a.qrow(m + r) + ab * 32));
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wu, _mm256_sign_epi8(av, wq)), scv);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * a.drow(m + r)[ab]), acc[r]);
          }
        }
      }
    }
    for (int r = 0; r < R; ++r) res[r] = hsum(acc[r]);
  }
};

// Q2_K: value 32 i + l (i = 4 h + s) = (qs[32 h + l] >> 2 s & 3), 0..3, times d * (scale & 15)
// minus dmin * (scale >> 4), one scale byte per 16 values. The mins need per-16 activation sums
// (the activations carry per-32 ones): a ones-by-activation multiply-add gives them per lane.
struct KQ2_K {
  template <int R>
  static void run(const uint8_t* w, const QAct& a, int64_t m, float* res) {
    const __m256i m3 = _mm256_set1_epi8(3), ones = _mm256_set1_epi8(1);
    __m256 acc[R], accm[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), accm[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < a.nb / 8; ++b) {
      const uint8_t* blk = w + b * 84;
      const float d = fp16(blk + 80), dmin = fp16(blk + 82);
      for (int h = 0; h < 2; ++h) {
        const __m256i q2 = _mm256_loadu_si256((const __m256i*)(blk + 16 + 32 * h));
        for (int s = 0; s < 4; ++s) {
          const int i = 4 * h + s;
          const __m256i q = _mm256_and_si256(_mm256_srli_epi16(q2, 2 * s), m3);
          const uint8_t s0 = blk[2 * i], s1 = blk[2 * i + 1];
          const __m256i scv = lane_scales(s0 & 0xF, s1 & 0xF), mnv = lane_scales(s0 >> 4, s1 >> 4);
          const int64_t ab = 8 * b + i;
          for (int r = 0; r < R; ++r) {
            const __m256i av = _mm256_loadu_si256((const __m256i*)(a.qrow(m + r) + ab * 32));
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, av), scv);
            const __m256i pm = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, av), mnv);
            const float da = a.drow(m + r)[ab];
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * da), acc[r]);
            accm[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pm), _mm256_set1_ps(dmin * da), accm[r]);
          }
        }
      }
    }
    for (int r = 0; r < R; ++r) res[r] = hsum(acc[r]) - hsum(accm[r]);
  }
};

// IQ4_XS's 8 6-bit scales (signed, -32..31), one per 32 values.
inline int iq4xs_scale(const uint8_t* blk, int k) {
  const uint16_t sh = (uint16_t)(blk[2] | (blk[3] << 8));
  return (((blk[4 + k / 2] >> (4 * (k % 2))) & 0xF) | (((sh >> (2 * k)) & 3) << 4)) - 32;
}

// IQ4_XS: IQ4_NL's table values in 32-value sub-blocks, each with a 6-bit scale that multiplies
// inside the integer dot.
struct KIQ4_XS {
  template <int R>
  static void run(const uint8_t* w, const QAct& a, int64_t m, float* res) {
    const __m256i table = iq4_table();
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < a.nb / 8; ++b) {
      const uint8_t* blk = w + b * 136;
      const float d = fp16(blk);
      for (int k = 0; k < 8; ++k) {
        const __m256i wq = _mm256_shuffle_epi8(table, nibbles32(blk + 8 + 16 * k));
        const __m256i wu = _mm256_sign_epi8(wq, wq);
        const __m256i scv = _mm256_set1_epi16((short)iq4xs_scale(blk, k));
        const int64_t ab = 8 * b + k;
        for (int r = 0; r < R; ++r) {
          const __m256i av = _mm256_loadu_si256((const __m256i*)(a.qrow(m + r) + ab * 32));
          const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wu, _mm256_sign_epi8(av, wq)), scv);
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * a.drow(m + r)[ab]), acc[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) res[r] = hsum(acc[r]);
  }
};

// ---- dequantization: the same float operations as gguf.quants' numpy (bitwise equal) ----

void dequant_q5(bool has_min, const uint8_t* w, int64_t K, float* y) {
  const int64_t bytes = has_min ? 24 : 22;
  for (int64_t b = 0; b < K / 32; ++b) {
    const uint8_t* blk = w + b * bytes;
    const float d = fp16(blk), mn = has_min ? fp16(blk + 2) : 0.0f;
    const uint8_t* qh = blk + (has_min ? 4 : 2);
    const uint8_t* qs = qh + 4;
    uint32_t h;
    std::memcpy(&h, qh, 4);
    for (int i = 0; i < 32; ++i) {
      const int q = ((i < 16 ? qs[i] : qs[i - 16] >> 4) & 0xF) | (((h >> i) & 1) << 4);
      y[b * 32 + i] = has_min ? d * (float)q + mn : d * (float)(q - 16);
    }
  }
}

void dequant_iq4_nl(const uint8_t* w, int64_t K, float* y) {
  for (int64_t b = 0; b < K / 32; ++b) {
    const uint8_t* blk = w + b * 18;
    const float d = fp16(blk);
    for (int i = 0; i < 16; ++i) {
      y[b * 32 + i] = d * (float)kvalues_iq4nl[blk[2 + i] & 0xF];
      y[b * 32 + 16 + i] = d * (float)kvalues_iq4nl[blk[2 + i] >> 4];
    }
  }
}

void dequant_mxfp4(const uint8_t* w, int64_t K, float* y) {
  for (int64_t b = 0; b < K / 32; ++b) {
    const uint8_t* blk = w + b * 17;
    const float d = e8m0_half(blk[0]);
    for (int i = 0; i < 16; ++i) {
      y[b * 32 + i] = d * (float)kvalues_mxfp4[blk[1 + i] & 0xF];
      y[b * 32 + 16 + i] = d * (float)kvalues_mxfp4[blk[1 + i] >> 4];
    }
  }
}

void dequant_q5_k(const uint8_t* w, int64_t K, float* y) {
  for (int64_t b = 0; b < K / 256; ++b) {
    const uint8_t* blk = w + b * 176;
    const float d = fp16(blk), dmin = fp16(blk + 2);
    const uint8_t *qh = blk + 16, *qs = blk + 48;
    for (int s = 0; s < 8; ++s) {
      uint8_t sc, mn;
      q4k_scale_min(s, blk + 4, &sc, &mn);
      const float ds = d * sc, ms = dmin * mn;
      for (int l = 0; l < 32; ++l) {
        const int q = ((qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0xF) | (((qh[l] >> s) & 1) << 4);
        y[b * 256 + 32 * s + l] = ds * (float)q - ms;
      }
    }
  }
}

void dequant_q3_k(const uint8_t* w, int64_t K, float* y) {
  for (int64_t b = 0; b < K / 256; ++b) {
    const uint8_t* blk = w + b * 110;
    const float d = fp16(blk + 108);
    int8_t sc[16];
    q3k_scales(blk + 96, sc);
    for (int i = 0; i < 8; ++i) {
      const int h = i / 4, s = i % 4;
      for (int l = 0; l < 32; ++l) {
        const int q = ((blk[32 + 32 * h + l] >> (2 * s)) & 3) - (((blk[l] >> i) & 1) ? 0 : 4);
        y[b * 256 + 32 * i + l] = (d * (float)sc[2 * i + l / 16]) * (float)q;
      }
    }
  }
}

void dequant_q2_k(const uint8_t* w, int64_t K, float* y) {
  for (int64_t b = 0; b < K / 256; ++b) {
    const uint8_t* blk = w + b * 84;
    const float d = fp16(blk + 80), dmin = fp16(blk + 82);
    for (int i = 0; i < 8; ++i) {
      const int h = i / 4, s = i % 4;
      for (int l = 0; l < 32; ++l) {
        const uint8_t sc = blk[2 * i + l / 16];
        const int q = (blk[16 + 32 * h + l] >> (2 * s)) & 3;
        y[b * 256 + 32 * i + l] = (d * (float)(sc & 0xF)) * (float)q - dmin * (float)(sc >> 4);
      }
    }
  }
}

void dequant_iq4_xs(const uint8_t* w, int64_t K, float* y) {
  for (int64_t b = 0; b < K / 256; ++b) {
    const uint8_t* blk = w + b * 136;
    const float d = fp16(blk);
    for (int k = 0; k < 8; ++k) {
      const float dl = d * (float)iq4xs_scale(blk, k);
      const uint8_t* qs = blk + 8 + 16 * k;
      for (int i = 0; i < 16; ++i) {
        y[b * 256 + 32 * k + i] = dl * (float)kvalues_iq4nl[qs[i] & 0xF];
        y[b * 256 + 32 * k + 16 + i] = dl * (float)kvalues_iq4nl[qs[i] >> 4];
      }
    }
  }
}

}  // namespace

bool gemm_gguf(int64_t fmt, const uint8_t* W, int64_t rb, int64_t N, const QAct& a, int64_t M, float* out, int64_t ld,
               const float* bias) {
  switch (fmt) {
    case FMT_Q5_0: gemm32<FQ5<false>>(W, rb, N, a, M, out, ld, bias); return true;
    case FMT_Q5_1: gemm32<FQ5<true>>(W, rb, N, a, M, out, ld, bias); return true;
    case FMT_IQ4_NL: gemm32<FIQ4_NL>(W, rb, N, a, M, out, ld, bias); return true;
    case FMT_MXFP4: gemm32<FMXFP4>(W, rb, N, a, M, out, ld, bias); return true;
    case FMT_Q5_K: gemm<KQ5_K>(W, rb, N, a, M, out, ld, bias); return true;
    case FMT_Q3_K: gemm<KQ3_K>(W, rb, N, a, M, out, ld, bias); return true;
    case FMT_Q2_K: gemm<KQ2_K>(W, rb, N, a, M, out, ld, bias); return true;
    case FMT_IQ4_XS: gemm<KIQ4_XS>(W, rb, N, a, M, out, ld, bias); return true;
    default: return false;
  }
}

bool dequant_row_gguf(int64_t fmt, const uint8_t* w, int64_t K, float* y) {
  switch (fmt) {
    case FMT_Q5_0: dequant_q5(false, w, K, y); return true;
    case FMT_Q5_1: dequant_q5(true, w, K, y); return true;
    case FMT_IQ4_NL: dequant_iq4_nl(w, K, y); return true;
    case FMT_MXFP4: dequant_mxfp4(w, K, y); return true;
    case FMT_Q5_K: dequant_q5_k(w, K, y); return true;
    case FMT_Q3_K: dequant_q3_k(w, K, y); return true;
    case FMT_Q2_K: dequant_q2_k(w, K, y); return true;
    case FMT_IQ4_XS: dequant_iq4_xs(w, K, y); return true;
    default: return false;
  }
}

}  // namespace radixlm
