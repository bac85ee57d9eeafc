// Prefill tiles on AMX (Intel Sapphire Rapids and later): 16 or 32 activation rows against two groups
// 8 interleaved weight rows (quant_x8_pair_tiles.cpp's layout), with each 32-value block's 16 x 16
// int32 dots made by one tile multiply instead of 8 vpdpbusd a row. A block's 8 weight registers
// (both groups' chunk i side by side: 16 columns of 4 bytes) are exactly the rows of an AMX B tile,
// and QAct::panels holds a tile's 16 activation rows of a block 32 bytes apart: an A tile. The
// dots land in L1 (tilestored) where the VNNI tiles park them (BlockDots), and every integer and
// float step after them is the VNNI tiles' own, in the same order: bitwise their results (batch
// and ISA invariance hold). Q8X8 takes the signed dot (tdpbssd) where VNNI needs the sign trick:
// the same integer.
//
// Tiles: A 0 and 1 (two panels: 32 rows share each block's weight tile), B 2, C 4 and 5 or 6 and 7
// (the blocks alternate, so one block's multiplies run while the previous block's steps read its
// dots); Q4_KX8: 64-byte A tiles from the row-major activations, B 2 and 3 (its scaled halves), C
// 4 to 7. Rows past the last 32 take one panel; past the last 16 the VNNI tiles. Q6_KX8 stays on
// the VNNI tiles: its two half-block multiplies (each half has its own scale) measured 0.96x them.
//
// Compilers before GCC 11 / clang 11 know no AMX: there this file forwards to the VNNI tiles and
// amx_compiled() is false (the level is then never offered).
#if (defined(__clang__) && __clang_major__ >= 11) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define RADIXLM_AMX 1
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni,avx512vbmi,gfni,amx-tile,amx-int8")
#else
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni,avx512vbmi,gfni")
#endif
#include "x8_pair_zmm.h"

#include <type_traits>
#include <vector>

namespace radixlm {

void x8_pair_tiles_vbmi(X8Kind kind, const uint8_t* g, int64_t group_bytes, const QAct& a, int64_t m0, int64_t m1,
                        float* out, int64_t ldo, const float* bias16);

#ifndef RADIXLM_AMX
bool amx_compiled() { return false; }
void x8_pair_tiles_amx(X8Kind kind, const uint8_t* g, int64_t group_bytes, const QAct& a, int64_t m0, int64_t m1,
                       float* out, int64_t ldo, const float* bias16) {
  x8_pair_tiles_vbmi(kind, g, group_bytes, a, m0, m1, out, ldo, bias16);
}
#else
bool amx_compiled() { return true; }

namespace {

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {32, 32, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 8, 8, 16, 16, 16, 16};
};
// Q4_KX8's: A tiles of 64 activation bytes (two sub-blocks) against B tiles of 16 rows.
struct alignas(64) WideTileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

inline void load_config(bool wide) {
  // Static: GCC 12 does not see ldtilecfg read its operand and drops the stores to a local config
  // (llama.cpp's AMX build crashed on this here, its tiles left unconfigured).
  static const TileConfig cfg;
  static const WideTileConfig wide_cfg;
  if (wide)
    _tile_loadconfig(&wide_cfg);
  else
    _tile_loadconfig(&cfg);
}

// Block b's multiplies into slot S's C tiles (4 + 2S, 5 + 2S): C_r = A_r . B for the R panels
// (panel r's rows at a.panel_block(m0 + 16 r, b)). The slots alternate, so block b + 1's
// multiplies run while block b's steps read its dots. GCC's tile intrinsics paste their tile
// numbers into the instruction text: literals.
#define RADIXLM_AMX_ISSUE(C0, C1)                                      \
  _tile_loadd(2, bt, 64);                                              \
  _tile_loadd(0, a.panel_block(m0, b), 32);                            \
  if constexpr (R == 2) _tile_loadd(1, a.panel_block(m0 + 16, b), 32); \
  _tile_zero(C0);                                                      \
  if constexpr (R == 2) _tile_zero(C1);                                \
  if constexpr (SIGNED) {                                              \
    _tile_dpbssd(C0, 0, 2);                                            \
    if constexpr (R == 2) _tile_dpbssd(C1, 1, 2);                      \
  } else {                                                             \
    _tile_dpbsud(C0, 0, 2);                                            \
    if constexpr (R == 2) _tile_dpbsud(C1, 1, 2);                      \
  }
template <int S, int R, bool SIGNED>
inline void issue(const QAct& a, int64_t m0, int64_t b, const uint8_t* bt) {
  if constexpr (S == 0) {
    RADIXLM_AMX_ISSUE(4, 5)
  } else {
    RADIXLM_AMX_ISSUE(6, 7)
  }
}
#undef RADIXLM_AMX_ISSUE

template <int S, bool TWO>
inline void collect(BlockDots<16>* dots) {
  if constexpr (S == 0) {
    _tile_stored(4, dots[0].v, 64);
    if constexpr (TWO) _tile_stored(5, dots[1].v, 64);
  } else {
    _tile_stored(6, dots[0].v, 64);
    if constexpr (TWO) _tile_stored(7, dots[1].v, 64);
  }
}

// Every block's multiplies, one block ahead of steps(b, dots) (dots[r]: panel r's). bt:
// unpack_pair's tiles, 512 bytes a block.
template <int R, bool SIGNED, class Steps>
inline void for_blocks(const QAct& a, int64_t m0, const uint8_t* bt, Steps steps) {
  constexpr bool TWO = R == 2;
  BlockDots<16> dots[2];
  issue<0, R, SIGNED>(a, m0, 0, bt);
  for (int64_t b = 0; b < a.nb; ++b) {
    if (b & 1) {
      if (b + 1 < a.nb) issue<0, R, SIGNED>(a, m0, b + 1, bt + 512 * (b + 1));
      collect<1, TWO>(dots);
    } else {
      if (b + 1 < a.nb) issue<1, R, SIGNED>(a, m0, b + 1, bt + 512 * (b + 1));
      collect<0, TWO>(dots);
    }
    steps(b, dots);
  }
}

// Block b's 8 weight registers of a 32-value format (the K-quants: sub-block b % 8).
template <X8Kind K>
inline void block_chunks(const uint8_t* g, int64_t gb, int64_t b, __m512i* w) {
  if constexpr (K == X8Kind::Q8) {
    const uint8_t* b0 = g + b * 272;
    for (int i = 0; i < 8; ++i) w[i] = join(b0 + 16 + 32 * i, b0 + gb + 16 + 32 * i);
  } else if constexpr (K == X8Kind::Q4K) {
    const int64_t sb = b / 8, s = b % 8, qs = sb * Q4KX8_BYTES + 160 + 256 * (s / 2);
    q4k_half_chunks(g + qs, g + gb + qs, s & 1, 0, w);
    q4k_half_chunks(g + qs, g + gb + qs, s & 1, 1, w + 4);
  } else {
    const uint8_t* b0 = g + b * nibble_block_bytes(K);
    nibble_chunks<K>(b0, b0 + gb, w);
  }
}

// Every block's weight tile of the pair (its 8 B rows, 512 bytes a block), made once for all the
// row panels: a tile load right after the vector stores that made it waits for them to reach the
// cache (52-58 ns a block against 17 from an earlier-made tile on this Xeon), and the unpacking is
// shared.
template <X8Kind K>
const uint8_t* unpack_pair(const uint8_t* g, int64_t gb, int64_t nb) {
  static thread_local std::vector<__m512i> buf;
  if ((int64_t)buf.size() < nb * 8) buf.resize(nb * 8);
  for (int64_t b = 0; b < nb; ++b) block_chunks<K>(g, gb, b, buf.data() + 8 * b);
  return (const uint8_t*)buf.data();
}

// Bytes q (0..15) times v (0..7, one per byte): q v <= 105, a u8.
inline __m512i mul_u3(__m512i q, __m512i v) {
  const __m512i q2 = _mm512_add_epi8(q, q), q4 = _mm512_add_epi8(q2, q2);
  const __m512i r = _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(v, _mm512_set1_epi8(1)), q);
  return _mm512_add_epi8(_mm512_add_epi8(r, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(v, _mm512_set1_epi8(2)), q2)),
                         _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(v, _mm512_set1_epi8(4)), q4));
}

// Q4_KX8's weight tiles with each sub-block's 6-bit scale folded in, split so every byte stays a
// u8: lo = q (sc & 7) and hi = q (sc >> 3) (nb blocks of 512 bytes each, hi after lo), so
// sum_s sc_s dot_s = C(lo) + 8 C(hi) over a whole super-block: the tile unit adds the sub-blocks
// up, where per sub-block tiles stored each dot and multiplied it by its scale in vector registers.
const uint8_t* unpack_q4k_scaled(const uint8_t* g, int64_t gb, int64_t nb) {
  static thread_local std::vector<__m512i> buf;
  if ((int64_t)buf.size() < nb * 16) buf.resize(nb * 16);
  __m512i* lo = buf.data();
  __m512i* hi = lo + 8 * nb;
  const __m512i spread = _mm512_set1_epi32(0x01010101);
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t sb = b / 8, s = b % 8;
    const uint8_t* b0 = g + sb * Q4KX8_BYTES;
    // each column's scale in all 4 bytes of its lane
    const __m512i sc = _mm512_mullo_epi32(u8x16_to_epi32(b0 + 32 + 8 * s, b0 + gb + 32 + 8 * s), spread);
    const __m512i sc_lo = _mm512_and_si512(sc, _mm512_set1_epi8(7));
    const __m512i sc_hi = _mm512_and_si512(_mm512_srli_epi16(sc, 3), _mm512_set1_epi8(7));
    __m512i w[8];
    block_chunks<X8Kind::Q4K>(g, gb, b, w);
    for (int i = 0; i < 8; ++i) {
      lo[8 * b + i] = mul_u3(w[i], sc_lo);
      hi[8 * b + i] = mul_u3(w[i], sc_hi);
    }
  }
  return (const uint8_t*)buf.data();
}

// Q4X8, Q5X8, MXFP4X8 and Q8X8 over 16 R rows: quant_x8_pair_tiles.cpp's tile_nibbles / tile_q8
// float steps, the accumulators in L1.
template <X8Kind K, int R>
void tile_blocks(const uint8_t* g, const uint8_t* bt, int64_t gb, const QAct& a, int64_t m0, float* out, int64_t ldo,
                 const float* bias16) {
  constexpr int64_t BYTES = K == X8Kind::Q8 ? 272 : nibble_block_bytes(K);
  alignas(64) float acc[16 * R][16];
  for (int m = 0; m < 16 * R; ++m) _mm512_store_ps(acc[m], _mm512_setzero_ps());
  for_blocks<R, K == X8Kind::Q8>(a, m0, bt, [&](int64_t b, BlockDots<16>* dots) {
    const uint8_t* b0 = g + b * BYTES;
    const uint8_t* b1 = b0 + gb;
    __m512 dw, mw;
    block_scales16<K>(b0, b1, dw, mw);
#pragma GCC unroll 16
    for (int m = 0; m < 16 * R; ++m) {
      __m512i dot = dots[m / 16].get(m % 16);
      if constexpr (K == X8Kind::MXFP4)
        dot = _mm512_sub_epi32(dot, _mm512_madd_epi16(_mm512_set1_epi16(12), _mm512_set1_epi32(a.sum16row(m0 + m)[b])));
      __m512 x = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, _mm512_set1_ps(a.drow(m0 + m)[b])),
                                 _mm512_load_ps(acc[m]));
      if constexpr (x8_q4_like(K)) x = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.srow(m0 + m)[b]), x);
      _mm512_store_ps(acc[m], x);
    }
  });
  for (int m = 0; m < 16 * R; ++m) store16(_mm512_load_ps(acc[m]), bias16, out + (m0 + m) * ldo);
}

// Q4_KX8: isum = sum_s sc_s dot_s per super-block = C(lo) + 8 C(hi) (unpack_q4k_scaled), four
// 64-byte multiplies of each into the same C tiles; the same exact int32 as the VNNI tiles' vpdpwssd
// pairs, then tile_q4k's mins and float step. A tiles come from the row-major activations (64
// contiguous bytes a row: two sub-blocks), 16 R rows.
#define RADIXLM_Q4K_MULS                                          \
  for (int kk = 0; kk < 4; ++kk) {                                \
    const int64_t b = 8 * sb + 2 * kk;                            \
    _tile_loadd(2, lo + 512 * b, 64);                             \
    _tile_loadd(3, hi + 512 * b, 64);                             \
    _tile_loadd(0, a.qrow(m0) + 32 * b, a.K);                     \
    if constexpr (R == 2) _tile_loadd(1, a.qrow(m0 + 16) + 32 * b, a.K); \
    _tile_dpbsud(4, 0, 2);                                        \
    _tile_dpbsud(5, 0, 3);                                        \
    if constexpr (R == 2) {                                       \
      _tile_dpbsud(6, 1, 2);                                      \
      _tile_dpbsud(7, 1, 3);                                      \
    }                                                             \
  }
template <int R>
void tile_q4k(const uint8_t* g, const uint8_t* lo, int64_t gb, const QAct& a, int64_t m0, float* out, int64_t ldo,
              const float* bias16) {
  const uint8_t* hi = lo + 512 * a.nb;
  alignas(64) float acc[16 * R][16];
  BlockDots<16> dots[2 * R];  // panel r's C(lo) at 2r, C(hi) at 2r + 1
  for (int m = 0; m < 16 * R; ++m) _mm512_store_ps(acc[m], _mm512_setzero_ps());
  for (int64_t sb = 0; sb < a.nb / 8; ++sb) {
    _tile_zero(4);
    _tile_zero(5);
    if constexpr (R == 2) {
      _tile_zero(6);
      _tile_zero(7);
    }
    RADIXLM_Q4K_MULS
    _tile_stored(4, dots[0].v, 64);
    _tile_stored(5, dots[1].v, 64);
    if constexpr (R == 2) {
      _tile_stored(6, dots[2].v, 64);
      _tile_stored(7, dots[3].v, 64);
    }
    const uint8_t* b0 = g + sb * Q4KX8_BYTES;
    const uint8_t* b1 = b0 + gb;
    const Q4kMins16 mins(b0, b1, a);
    const __m512 d = cat8(scales8(b0), scales8(b1)), dmin = cat8(scales8(b0 + 16), scales8(b1 + 16));
#pragma GCC unroll 16
    for (int m = 0; m < 16 * R; ++m) {
      const BlockDots<16>* p = dots + 2 * (m / 16);
      const __m512i isum = _mm512_add_epi32(p[0].get(m % 16), _mm512_slli_epi32(p[1].get(m % 16), 3));
      _mm512_store_ps(acc[m], q4k_step16(_mm512_load_ps(acc[m]), isum, mins.sum(a, m0 + m, sb), d, dmin,
                                         a.d256row(m0 + m)[sb]));
    }
  }
  for (int m = 0; m < 16 * R; ++m) store16(_mm512_load_ps(acc[m]), bias16, out + (m0 + m) * ldo);
}
#undef RADIXLM_Q4K_MULS

// Rows [m0, m1) (m1 - m0 >= 16) of the pair: its weight tiles made once, then 32 rows at a time.
template <X8Kind K>
int64_t panels(const uint8_t* g, int64_t gb, const QAct& a, int64_t m0, int64_t m1, float* out, int64_t ldo,
               const float* bias16) {
  const uint8_t* bt = K == X8Kind::Q4K ? unpack_q4k_scaled(g, gb, a.nb) : unpack_pair<K>(g, gb, a.nb);
  auto run = [&](auto r, int64_t m) {
    constexpr int R = decltype(r)::value;
    if constexpr (K == X8Kind::Q4K)
      tile_q4k<R>(g, bt, gb, a, m, out, ldo, bias16);
    else
      tile_blocks<K, R>(g, bt, gb, a, m, out, ldo, bias16);
  };
  int64_t m = m0;
  for (; m + 32 <= m1; m += 32) run(std::integral_constant<int, 2>(), m);
  if (m + 16 <= m1) run(std::integral_constant<int, 1>(), m), m += 16;
  return m;
}

}  // namespace

// x8_pair_tiles_vbmi's contract (QAct::panels, m0 a multiple of 16), 32 or 16 rows at a time on AMX.
void x8_pair_tiles_amx(X8Kind kind, const uint8_t* g, int64_t group_bytes, const QAct& a, int64_t m0, int64_t m1,
                       float* out, int64_t ldo, const float* bias16) {
  int64_t m = m0;
  // Q6_K stays on the VNNI tiles: its AMX tiles (two half-block multiplies) measured 0.96x them
  if (m + 16 <= m1 && kind != X8Kind::Q6K) {
    load_config(kind == X8Kind::Q4K);
    switch (kind) {
      case X8Kind::Q4: m = panels<X8Kind::Q4>(g, group_bytes, a, m0, m1, out, ldo, bias16); break;
      case X8Kind::Q5: m = panels<X8Kind::Q5>(g, group_bytes, a, m0, m1, out, ldo, bias16); break;
      case X8Kind::Q4_0: m = panels<X8Kind::Q4_0>(g, group_bytes, a, m0, m1, out, ldo, bias16); break;
      case X8Kind::Q5_0: m = panels<X8Kind::Q5_0>(g, group_bytes, a, m0, m1, out, ldo, bias16); break;
      case X8Kind::MXFP4: m = panels<X8Kind::MXFP4>(g, group_bytes, a, m0, m1, out, ldo, bias16); break;
      case X8Kind::Q8: m = panels<X8Kind::Q8>(g, group_bytes, a, m0, m1, out, ldo, bias16); break;
      case X8Kind::Q4K: m = panels<X8Kind::Q4K>(g, group_bytes, a, m0, m1, out, ldo, bias16); break;
      case X8Kind::Q6K: break;  // not reached
    }
    _tile_release();  // other code on this thread (oneDNN) configures its own; a context switch then saves less
  }
  if (m < m1) x8_pair_tiles_vbmi(kind, g, group_bytes, a, m, m1, out, ldo, bias16);
}

#endif  // RADIXLM_AMX

}  // namespace radixlm
