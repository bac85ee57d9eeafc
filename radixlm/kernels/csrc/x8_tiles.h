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

// The interleaved layouts, by tile kind (outside the anonymous namespace: both ISAs' files name it).
// Q4 / Q5: Q4_1 / Q5_1 (x = d q + m, m stored); Q4_0 / Q5_0: their offsets -8 d / -16 d, which are
// not stored but made from d (exact: a power-of-two multiple), 16 bytes less per 8 x 32 values.
enum class X8Kind { Q4, Q8, Q4K, Q6K, MXFP4, Q5, Q4_0, Q5_0 };

// The 32-value nibble layouts (Q4X8, Q5X8 and the min-less Q4_0X8, Q5_0X8): d[8] (fp16), m[8] where
// stored, 4 nibble chunks of 32 bytes, then (Q5) 8 words of fifth bits.
constexpr bool x8_q4_like(X8Kind k) { return k == X8Kind::Q4 || k == X8Kind::Q5 || k == X8Kind::Q4_0 || k == X8Kind::Q5_0; }
constexpr bool x8_fifth_bits(X8Kind k) { return k == X8Kind::Q5 || k == X8Kind::Q5_0; }
// The offset that stands for m in the min-less layouts (0: m is stored).
constexpr float x8_offset(X8Kind k) { return k == X8Kind::Q4_0 ? -8.0f : k == X8Kind::Q5_0 ? -16.0f : 0.0f; }
// Where a block's nibble chunks start (MXFP4X8: after its 8 exponent bytes).
constexpr int64_t x8_qs(X8Kind k) { return k == X8Kind::MXFP4 ? 8 : x8_offset(k) != 0.0f ? 16 : 32; }
// A nibble format's block bytes (Q4X8 160, Q5X8 192, Q4_0X8 144, Q5_0X8 176, MXFP4X8 136).
constexpr int64_t nibble_block_bytes(X8Kind k) { return x8_qs(k) + 128 + (x8_fifth_bits(k) ? 32 : 0); }

namespace {

inline __m256i bcast32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }

inline __m256 scales8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }

// A nibble block's m for 8 rows: stored after d, or the offset times d (the same floats as the
// fp16 m Q4X8 stored for Q4_0 before: -8 d is exact in fp16 and in fp32).
template <X8Kind K>
inline __m256 mins8(const uint8_t* blk, __m256 dw) {
  if constexpr (x8_offset(K) != 0.0f)
    return _mm256_mul_ps(dw, _mm256_set1_ps(x8_offset(K)));
  else
    return scales8(blk + 16);
}

// Software prefetch PF_AHEAD bytes past the block a tile of at most 8 rows starts (the next groups
// follow contiguously): in decode, where one row or a batch streams the weights from memory, the next
// blocks' loads then overlap the dots (K-quant tiles at M = 1: +5-18% GB/s on cold weights; at M = 8:
// -10-38% time per matrix, docs/benchmarks.md). 16-row tiles (prefill) reuse each block enough.
constexpr int64_t PF_AHEAD = 4096;
inline void prefetch_span(const uint8_t* p, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch((const char*)(p + PF_AHEAD + o), _MM_HINT_T0);
}

// 32 bytes from 32 bits: byte k is 0x10 where bit k of the word at p is set (a Q5 value's fifth
// bit), with AVX2: each byte takes its word byte, tests its bit, and keeps 0x10.
inline __m256i fifth_bits_avx2(const uint8_t* p) {
  int32_t w;
  std::memcpy(&w, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(w), _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                                             3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

// RM activation rows x one group of 8 weight rows, Q4X8: a block is d[8], m[8] (fp16) and 4 chunks
// of 32 bytes; chunk i, lane r = row r's GGUF nibble bytes 4i..4i+3 (values 4i.. low, 16+4i.. high).
// Q4_0X8 is the same without m (mins8 makes it). Q5X8 (Q5_1; Q5_0X8 without m) adds 8 words of
// fifth bits: word i for chunk i's low values, word 4 + i for its high ones, bit 4r + j for lane r's byte j; its values (0..31) take Dot::q5,
// whose partial sums have room for them, and every float step is Q4X8's.
// A tile's rows' float accumulators: in registers, or in L1 where the tile takes more rows than the
// Dot's registers hold beside the weights (8 or 16 rows at the AVX2 level: each block's unpacking then
// serves them all, where 4-row tiles repeated it; Q5X8's fifth bits cost ~50 operations a block).
template <int RM, bool InL1>
struct TileAcc {
  __m256 v[RM];
  TileAcc() {
    for (int m = 0; m < RM; ++m) v[m] = _mm256_setzero_ps();
  }
  __m256 get(int m) const { return v[m]; }
  void put(int m, __m256 x) { v[m] = x; }
};
template <int RM>
struct TileAcc<RM, true> {
  alignas(32) float v[RM][8];
  TileAcc() {
    for (int m = 0; m < RM; ++m) _mm256_store_ps(v[m], _mm256_setzero_ps());
  }
  __m256 get(int m) const { return _mm256_load_ps(v[m]); }
  void put(int m, __m256 x) { _mm256_store_ps(v[m], x); }
};

template <class Dot, int RM, X8Kind K>
inline void tile_q4x8(const uint8_t* g, const QAct& a, int64_t m0, float* out, int64_t ldo, __m256 bias) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  constexpr bool Q5 = x8_fifth_bits(K);
  constexpr int64_t BYTES = nibble_block_bytes(K), QS = x8_qs(K);
  TileAcc<RM, (RM > Dot::RM)> acc;
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* blk = g + b * BYTES;
    if constexpr (RM <= 8) prefetch_span(blk, BYTES);
    const __m256 dw = scales8(blk), mw = mins8<K>(blk, dw);
    __m256i lo[4], hi[4];
    for (int i = 0; i < 4; ++i) {
      const __m256i raw = _mm256_loadu_si256((const __m256i*)(blk + QS + 32 * i));
      lo[i] = _mm256_and_si256(raw, m4);
      hi[i] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      if constexpr (Q5) {
        lo[i] = _mm256_or_si256(lo[i], Dot::fifth_bits(blk + QS + 128 + 4 * i));
        hi[i] = _mm256_or_si256(hi[i], Dot::fifth_bits(blk + QS + 144 + 4 * i));
      }
    }
    for (int m = 0; m < RM; ++m) {
      const int8_t* aq = a.qrow(m0 + m) + b * 32;
      const __m256 p = _mm256_cvtepi32_ps(Q5 ? Dot::q5(lo, hi, aq) : Dot::q4(lo, hi, aq));
      __m256 x = _mm256_fmadd_ps(p, _mm256_mul_ps(dw, _mm256_set1_ps(a.drow(m0 + m)[b])), acc.get(m));
      acc.put(m, _mm256_fmadd_ps(mw, _mm256_set1_ps(a.srow(m0 + m)[b]), x));
    }
  }
  for (int m = 0; m < RM; ++m) _mm256_storeu_ps(out + (m0 + m) * ldo, _mm256_add_ps(acc.get(m), bias));
}

// Q8X8: a block is d[8] (fp16) and 8 chunks of 32 bytes; chunk i, lane r = row r's int8 values 4i..4i+3.
template <class Dot, int RM>
inline void tile_q8x8(const uint8_t* g, const QAct& a, int64_t m0, float* out, int64_t ldo, __m256 bias) {
  __m256 acc[RM];
  for (int m = 0; m < RM; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* blk = g + b * 272;
    if constexpr (RM <= 8) prefetch_span(blk, 272);
    const __m256 dw = scales8(blk);
    __m256i wabs[8];  // |w| once for the tile's rows (the signs are read from the block per row)
    for (int i = 0; i < 8; ++i) wabs[i] = _mm256_abs_epi8(load32(blk + 16 + 32 * i));
    for (int m = 0; m < RM; ++m) {
      const __m256 p = _mm256_cvtepi32_ps(Dot::q8(wabs, blk + 16, a.qrow(m0 + m) + b * 32));
      acc[m] = _mm256_fmadd_ps(p, _mm256_mul_ps(dw, _mm256_set1_ps(a.drow(m0 + m)[b])), acc[m]);
    }
  }
  for (int m = 0; m < RM; ++m) _mm256_storeu_ps(out + (m0 + m) * ldo, _mm256_add_ps(acc[m], bias));
}

// MXFP4X8: a block is e[8] (e8m0 exponents) and 4 chunks of 32 bytes laid out as Q4X8's; a nibble
// indexes the e2m1 values doubled to exact int8 (-12..12, ggml's kvalues_mxfp4), looked up here
// with 12 added (0..24: unsigned, so the byte dot needs no sign fix-up), and the activation block's
// integer sum times 12 taken back: the same exact int32 dot as the signed values', then 2^(e-128)
// (the halving undoes the doubling: exact in fp32) scales the block. 136 bytes per 8 x 32 values:
// the row-major blocks' own size.
inline __m256 e8m0_halves8(const uint8_t* p) {
  const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
  const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
  const __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);  // e < 2: subnormal
  const __m256i use_tiny = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
  return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, tiny, use_tiny));
}

template <class Dot, int RM>
inline void tile_mxfp4x8(const uint8_t* g, const QAct& a, int64_t m0, float* out, int64_t ldo, __m256 bias) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i table = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                         12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
  const __m256i twelve = _mm256_set1_epi16(12);
  __m256 acc[RM];
  for (int m = 0; m < RM; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* blk = g + b * 136;
    if constexpr (RM <= 8) prefetch_span(blk, 136);
    const __m256 dw = Dot::e8m0_halves8(blk);
    __m256i lo[4], hi[4];
    for (int i = 0; i < 4; ++i) {
      const __m256i raw = _mm256_loadu_si256((const __m256i*)(blk + 8 + 32 * i));
      if constexpr (requires { Dot::VBMI_LOOKUP; }) {  // 5-bit indices into the table twice over
        lo[i] = _mm256_permutexvar_epi8(raw, table);
        hi[i] = _mm256_permutexvar_epi8(_mm256_srli_epi16(raw, 4), table);
      } else {
        lo[i] = _mm256_shuffle_epi8(table, _mm256_and_si256(raw, m4));
        hi[i] = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
      }
    }
    for (int m = 0; m < RM; ++m) {
      // 12 x (the block's two 16-value sums), as int32 in every lane
      const __m256i off = _mm256_madd_epi16(twelve, _mm256_set1_epi32(a.sum16row(m0 + m)[b]));
      const __m256i isum = _mm256_sub_epi32(Dot::u24(lo, hi, a.qrow(m0 + m) + b * 32), off);
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(a.drow(m0 + m)[b])), acc[m]);
    }
  }
  for (int m = 0; m < RM; ++m) _mm256_storeu_ps(out + (m0 + m) * ldo, _mm256_add_ps(acc[m], bias));
}

// Q4_KX8, per 256 values (1184 bytes): d[8], dmin[8] (fp16), then the 6-bit sub-block scales and mins
// as bytes, sc[8 sub-blocks][8 rows] and mn[8][8], then 4 x 256 bytes of nibbles: pair p, chunk i,
// lane r = row r's GGUF qs bytes 32p + 4i..4i+3 (low nibbles: sub-block 2p's values 4i..4i+3, high:
// sub-block 2p+1's). With Q8_K activations (one d_a per 256 values) a row's super-block is
// d d_a sum_s sc_s dot_s - dmin d_a sum_s mn_s S_s: two int32 sums and one float step (q4k_step).
constexpr int64_t Q4KX8_BYTES = 1184;

// Sub-block s's 8 chunks of a Q4_KX8 super-block (even s: the low nibbles, odd: the high ones).
inline void q4kx8_nibbles(const uint8_t* blk, int s, __m256i* w) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const uint8_t* qs = blk + 160 + 256 * (s / 2);
  for (int i = 0; i < 8; ++i) {
    const __m256i raw = _mm256_loadu_si256((const __m256i*)(qs + 32 * i));
    w[i] = _mm256_and_si256(s & 1 ? _mm256_srli_epi16(raw, 4) : raw, m4);
  }
}

// 8 unsigned bytes as 8 int32 lanes, each byte in both 16-bit halves: madd_epi16 against a lane
// of two int16 sums then gives byte x (lo + hi).
inline __m256i u8_pairs16(const uint8_t* p) {
  const __m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
  return _mm256_or_si256(s, _mm256_slli_epi32(s, 16));
}

// A super-block's min term per lane, sum_s mn_s S_s (S_s: sub-block s's activation sum, the two
// 16-value sums of s16[s]), exact in int32; mn16[s]: sub-block s's 8 rows' mins (u8_pairs16).
inline __m256i q4k_min_sum(const __m256i* mn16, const int32_t* s16) {
  __m256i t = _mm256_madd_epi16(mn16[0], _mm256_set1_epi32(s16[0]));
  for (int s = 1; s < 8; ++s) t = _mm256_add_epi32(t, _mm256_madd_epi16(mn16[s], _mm256_set1_epi32(s16[s])));
  return t;
}

// The same sum from pairs: mnp[p] lane r = (mn_2p, mn_2p+1) as int16 halves, s32p[p] = QAct::sum32p's
// (S_2p, S_2p+1): 4 madds instead of 8, the same int32 (every term exact).
inline void q4k_min_pairs(const uint8_t* blk, __m256i* mnp) {
  for (int p = 0; p < 4; ++p)
    mnp[p] = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(blk + 96 + 16 * p))),
                             _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(blk + 104 + 16 * p))), 16));
}
inline __m256i q4k_min_sum_pairs(const __m256i* mnp, const int32_t* s32p) {
  const __m256i t01 = _mm256_add_epi32(_mm256_madd_epi16(mnp[0], _mm256_set1_epi32(s32p[0])),
                                       _mm256_madd_epi16(mnp[1], _mm256_set1_epi32(s32p[1])));
  const __m256i t23 = _mm256_add_epi32(_mm256_madd_epi16(mnp[2], _mm256_set1_epi32(s32p[2])),
                                       _mm256_madd_epi16(mnp[3], _mm256_set1_epi32(s32p[3])));
  return _mm256_add_epi32(t01, t23);
}

// A Q4_KX8 super-block's min term for row m: from QAct::sum32p where gemm_x8 made them.
struct Q4kMins {
  __m256i v[8];
  bool pairs;
  Q4kMins(const uint8_t* blk, const QAct& a) : pairs(a.sum32p != nullptr) {
    if (pairs) {
      q4k_min_pairs(blk, v);
    } else {
      for (int s = 0; s < 8; ++s) v[s] = u8_pairs16(blk + 96 + 8 * s);
    }
  }
  __m256i sum(const QAct& a, int64_t m, int64_t sb) const {
    return pairs ? q4k_min_sum_pairs(v, a.sum32prow(m) + 4 * sb) : q4k_min_sum(v, a.sum16row(m) + 8 * sb);
  }
};

// A Q4_KX8 super-block's float steps for one row (Q8_K activations, one d_a per 256 values):
// acc = fma(isum, d d_a, acc) - msum dmin d_a, isum = sum_s sc_s dot_s. Every kernel of Q4_KX8
// (these tiles, quant_x8_pair*.cpp) takes these steps per lane in this order.
inline __m256 q4k_step(__m256 acc, __m256i isum, __m256i msum, __m256 d, __m256 dmin, float da) {
  const __m256 vda = _mm256_set1_ps(da);
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, vda), acc);
  return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin, vda), acc);
}

// Per super-block and row: the 8 sub-blocks' dots times their scales summed in int32 (Dot::q4k,
// |isum| <= 8 x 63 x 32 x 15 x 127 < 2^25), the mins' sum beside them, then q4k_step.
template <class Dot, int RM>
inline void tile_q4kx8(const uint8_t* g, const QAct& a, int64_t m0, float* out, int64_t ldo, __m256 bias) {
  __m256 acc[RM];
  for (int m = 0; m < RM; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < a.nb / 8; ++sb) {
    const uint8_t* blk = g + sb * Q4KX8_BYTES;
    if constexpr (RM <= 8) prefetch_span(blk, Q4KX8_BYTES);
    __m256i isum[RM];
    for (int m = 0; m < RM; ++m) isum[m] = _mm256_setzero_si256();
    for (int s = 0; s < 8; ++s) {
      __m256i w[8];
      q4kx8_nibbles(blk, s, w);
      const __m256i sc = Dot::k_scale(blk + 32 + 8 * s);
      for (int m = 0; m < RM; ++m)
        isum[m] = _mm256_add_epi32(isum[m], Dot::q4k(w, a.qrow(m0 + m) + (8 * sb + s) * 32, sc));
    }
    const Q4kMins mins(blk, a);
    const __m256 d = scales8(blk), dmin = scales8(blk + 16);
    for (int m = 0; m < RM; ++m)
      acc[m] = q4k_step(acc[m], isum[m], mins.sum(a, m0 + m, sb), d, dmin, a.d256row(m0 + m)[sb]);
  }
  for (int m = 0; m < RM; ++m) _mm256_storeu_ps(out + (m0 + m) * ldo, _mm256_add_ps(acc[m], bias));
}

// tile_q4kx8 for 8 or 16 rows at a time (the AVX2 level): a chunk's unpacking serves them all
// instead of 4, with the rows' int32 sums and accumulators kept in L1 (they would not fit the 16
// registers beside the weights). The same integers and float steps: bitwise tile_q4kx8's.
template <class Dot, int RM>
inline void tile_q4kx8_wide(const uint8_t* g, const QAct& a, int64_t m0, float* out, int64_t ldo, __m256 bias) {
  alignas(32) float acc[RM][8];
  alignas(32) int32_t isum[RM][8];
  for (int m = 0; m < RM; ++m) _mm256_store_ps(acc[m], _mm256_setzero_ps());
  for (int64_t sb = 0; sb < a.nb / 8; ++sb) {
    const uint8_t* blk = g + sb * Q4KX8_BYTES;
    if constexpr (RM <= 8) prefetch_span(blk, Q4KX8_BYTES);
    for (int m = 0; m < RM; ++m) _mm256_store_si256((__m256i*)isum[m], _mm256_setzero_si256());
    for (int s = 0; s < 8; ++s) {
      __m256i w[8];
      q4kx8_nibbles(blk, s, w);
      const __m256i sc = Dot::k_scale(blk + 32 + 8 * s);
      const int64_t b = 8 * sb + s;
      for (int m = 0; m < RM; ++m) {
        const __m256i x = _mm256_add_epi32(_mm256_load_si256((const __m256i*)isum[m]), Dot::q4k(w, a.qrow(m0 + m) + b * 32, sc));
        _mm256_store_si256((__m256i*)isum[m], x);
      }
    }
    const Q4kMins mins(blk, a);
    const __m256 d = scales8(blk), dmin = scales8(blk + 16);
    for (int m = 0; m < RM; ++m) {
      const __m256i x = _mm256_load_si256((const __m256i*)isum[m]);
      const __m256 y = q4k_step(_mm256_load_ps(acc[m]), x, mins.sum(a, m0 + m, sb), d, dmin, a.d256row(m0 + m)[sb]);
      _mm256_store_ps(acc[m], y);
    }
  }
  for (int m = 0; m < RM; ++m) _mm256_storeu_ps(out + (m0 + m) * ldo, _mm256_add_ps(_mm256_load_ps(acc[m]), bias));
}

// Q6_KX8, per 256 values (1680 bytes): d[8] (fp16), sc[16 sub-blocks][8 rows] (int8), then 8 x 192
// bytes, one per 32 values: 4 nibble chunks (chunk i, lane r: row r's values 4i..4i+3 in the low
// nibbles, 16+4i..16+4i+3 in the high ones), then 2 chunks of the values' top 2 bits (h0 for values
// 0..15, h1 for 16..31; bits 2i..2i+1 of a byte belong to chunk i). The 6-bit q (0..63) are dotted
// unsigned (Dot::q6: times the sub-block's scale), and the -32 offset folds in once per 32 values
// through the activations' 16-value sums: isum = sc_lo dot_lo + sc_hi dot_hi - 32 (sc_lo S_lo + sc_hi S_hi),
// exact in int32; a super-block's 8 such sums add up in int32 and take one float step with its d_a.
constexpr int64_t Q6KX8_BYTES = 1680;

// Bits 4..5 of each byte <- chunk i's 2 bits of h (at 2i..2i+1); bits crossing bytes are masked off.
template <int I>
inline __m256i q6_top(__m256i h) {
  const __m256i m = _mm256_set1_epi8(0x30);
  if constexpr (I == 0) return _mm256_and_si256(_mm256_slli_epi16(h, 4), m);
  if constexpr (I == 1) return _mm256_and_si256(_mm256_slli_epi16(h, 2), m);
  if constexpr (I == 2) return _mm256_and_si256(h, m);
  if constexpr (I == 3) return _mm256_and_si256(_mm256_srli_epi16(h, 2), m);
}

template <class Dot, int RM>
inline void tile_q6kx8(const uint8_t* g, const QAct& a, int64_t m0, float* out, int64_t ldo, __m256 bias) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc[RM];
  for (int m = 0; m < RM; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < a.nb / 8; ++sb) {
    const uint8_t* blk = g + sb * Q6KX8_BYTES;
    if constexpr (RM <= 8) prefetch_span(blk, Q6KX8_BYTES);
    const __m256 d = scales8(blk);
    const int8_t* sc = (const int8_t*)(blk + 16);
    // The super-block's 8 blocks' unsigned dots and their offsets' sums, apart until its end (one
    // shift and subtraction per row, not per block), exact: each below 8 x 2 x 128 x 16 x 63 x 127 < 2^29.
    __m256i isum[RM], off[RM];
    for (int m = 0; m < RM; ++m) isum[m] = off[m] = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      const uint8_t* qb = blk + 144 + 192 * j;
      const __m256i h0 = _mm256_loadu_si256((const __m256i*)(qb + 128));
      const __m256i h1 = _mm256_loadu_si256((const __m256i*)(qb + 160));
      __m256i q[8];
      const __m256i n0 = _mm256_loadu_si256((const __m256i*)qb), n1 = _mm256_loadu_si256((const __m256i*)(qb + 32));
      const __m256i n2 = _mm256_loadu_si256((const __m256i*)(qb + 64)), n3 = _mm256_loadu_si256((const __m256i*)(qb + 96));
      q[0] = _mm256_or_si256(_mm256_and_si256(n0, m4), q6_top<0>(h0));
      q[1] = _mm256_or_si256(_mm256_and_si256(n1, m4), q6_top<1>(h0));
      q[2] = _mm256_or_si256(_mm256_and_si256(n2, m4), q6_top<2>(h0));
      q[3] = _mm256_or_si256(_mm256_and_si256(n3, m4), q6_top<3>(h0));
      q[4] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n0, 4), m4), q6_top<0>(h1));
      q[5] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n1, 4), m4), q6_top<1>(h1));
      q[6] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n2, 4), m4), q6_top<2>(h1));
      q[7] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n3, 4), m4), q6_top<3>(h1));
      const int8_t* sl = sc + 16 * j;  // sub-blocks 2j (values 0..15) and 2j+1, 8 rows each
      const __m256i lo32 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)sl));
      const __m256i hi32 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(sl + 8)));
      const __m256i slo = Dot::q6_scale(lo32), shi = Dot::q6_scale(hi32);
      const __m256i pair = _mm256_blend_epi16(lo32, _mm256_slli_epi32(hi32, 16), 0xAA);  // lane r: (lo_r, hi_r)
      const int64_t b = 8 * sb + j;
      for (int m = 0; m < RM; ++m) {
        const int8_t* aq = a.qrow(m0 + m) + b * 32;
        off[m] = _mm256_add_epi32(off[m], _mm256_madd_epi16(pair, _mm256_set1_epi32(a.sum16row(m0 + m)[b])));
        isum[m] = _mm256_add_epi32(_mm256_add_epi32(isum[m], Dot::q6(q, aq, slo)), Dot::q6(q + 4, aq + 16, shi));
      }
    }
    for (int m = 0; m < RM; ++m) {
      const __m256i x = _mm256_sub_epi32(isum[m], _mm256_slli_epi32(off[m], 5));
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(x), _mm256_mul_ps(d, _mm256_set1_ps(a.d256row(m0 + m)[sb])), acc[m]);
    }
  }
  for (int m = 0; m < RM; ++m) _mm256_storeu_ps(out + (m0 + m) * ldo, _mm256_add_ps(acc[m], bias));
}

template <class Dot, X8Kind Kind, int RM>
inline void tile_x8(const uint8_t* g, const QAct& a, int64_t m0, float* out, int64_t ldo, __m256 bias) {
  if constexpr (x8_q4_like(Kind)) {
    tile_q4x8<Dot, RM, Kind>(g, a, m0, out, ldo, bias);
  } else if constexpr (Kind == X8Kind::Q8) {
    tile_q8x8<Dot, RM>(g, a, m0, out, ldo, bias);
  } else if constexpr (Kind == X8Kind::Q4K) {
    tile_q4kx8<Dot, RM>(g, a, m0, out, ldo, bias);
  } else if constexpr (Kind == X8Kind::MXFP4) {
    tile_mxfp4x8<Dot, RM>(g, a, m0, out, ldo, bias);
  } else {
    tile_q6kx8<Dot, RM>(g, a, m0, out, ldo, bias);
  }
}

// Activation rows [m0, m1) against one group of 8 weight rows, in tiles of Dot::RM rows.
template <class Dot, X8Kind Kind>
inline void group_rows(const uint8_t* g, const QAct& a, int64_t m0, int64_t m1, float* out, int64_t ldo, __m256 bias) {
  constexpr int R = Dot::RM;
  int64_t m = m0;
  if constexpr (Kind == X8Kind::Q4K && R < 8) {  // AVX2's 16 registers (VNNI's 32 hold 8 rows' tiles)
    for (; m + 16 <= m1; m += 16) tile_q4kx8_wide<Dot, 16>(g, a, m, out, ldo, bias);
    if (m + 8 <= m1) tile_q4kx8_wide<Dot, 8>(g, a, m, out, ldo, bias), m += 8;
  }
  if constexpr (x8_q4_like(Kind) && R < 8) {  // the same, accumulators in L1
    for (; m + 16 <= m1; m += 16) tile_q4x8<Dot, 16, Kind>(g, a, m, out, ldo, bias);
    if (m + 8 <= m1) tile_q4x8<Dot, 8, Kind>(g, a, m, out, ldo, bias), m += 8;
  }
  if constexpr (Kind == X8Kind::Q6K && R < 8) {  // the same for Q6_K: its unpacking costs more
    for (; m + 16 <= m1; m += 16) tile_q6kx8<Dot, 16>(g, a, m, out, ldo, bias);
    if (m + 8 <= m1) tile_q6kx8<Dot, 8>(g, a, m, out, ldo, bias), m += 8;
  }
  for (; m + R <= m1; m += R) tile_x8<Dot, Kind, R>(g, a, m, out, ldo, bias);
  if constexpr (R > 4) {
    if (m + 4 <= m1) {
      tile_x8<Dot, Kind, 4>(g, a, m, out, ldo, bias);
      m += 4;
    }
  }
  switch (m1 - m) {
    case 3: tile_x8<Dot, Kind, 3>(g, a, m, out, ldo, bias); break;
    case 2: tile_x8<Dot, Kind, 2>(g, a, m, out, ldo, bias); break;
    case 1:
      if constexpr (requires { Dot::template HAS_ROW1<Kind>; }) {
        if constexpr (Dot::template HAS_ROW1<Kind>) {
          Dot::template row1<Kind>(g, a, m, out + m * ldo, bias);
          break;
        }
      }
      tile_x8<Dot, Kind, 1>(g, a, m, out, ldo, bias);
      break;
    default: break;
  }
}

}  // namespace
}  // namespace radixlm
