// The AMX loop of the compute peaks (peaks.cpp): tile multiplies of int8 (tdpbssd, 16 x 64 bytes
// against 16 x 64: 16,384 byte products each) into four independent accumulator tiles. Compiled
// for AMX here only and called when the CPU and the OS give it (quant_x8.cpp: amx_supported).
#if (defined(__clang__) && __clang_major__ >= 11) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define RADIXLM_AMX 1
#pragma GCC target("amx-tile,amx-int8")
#else
#pragma GCC target("avx2")  // a compiler without AMX (before GCC 11 / clang 11): never called
#endif
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace radixlm {

#ifndef RADIXLM_AMX
float peak_loop_amx(int64_t) { return 0.0f; }
#else

namespace {
struct alignas(64) PeakTiles {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};
}  // namespace

// iters x 4 tdpbssd; returns a checksum so nothing is dropped.
float peak_loop_amx(int64_t iters) {
  // A static config: GCC 12 does not see ldtilecfg read its operand and drops the stores to a
  // local one (llama.cpp's AMX build crashed on that here, tiles left unconfigured).
  static thread_local PeakTiles cfg;
  _tile_loadconfig(&cfg);
  alignas(64) static thread_local int8_t a[16 * 64], b[16 * 64];
  std::memset(a, 1, sizeof a);
  std::memset(b, 1, sizeof b);
  alignas(64) static thread_local int32_t c[16 * 16];
  _tile_loadd(0, a, 64);
  _tile_loadd(1, a, 64);
  _tile_loadd(2, b, 64);
  _tile_loadd(3, b, 64);
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbssd(4, 0, 2);
    _tile_dpbssd(5, 0, 3);
    _tile_dpbssd(6, 1, 2);
    _tile_dpbssd(7, 1, 3);
  }
  _tile_stored(4, c, 64);
  _tile_release();
  return (float)c[0];
}

#endif  // RADIXLM_AMX

}  // namespace radixlm
