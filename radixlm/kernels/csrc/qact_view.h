// The view of int8-quantized activations the GEMM kernels read (qact.h makes them). No torch
// headers: quant_x8_vnni.cpp includes it under another target ISA, and an inline function of
// torch's compiled there could replace the baseline copy everywhere at link time.
#pragma once
#include <cstdint>

namespace radixlm {

// Activations quantized per 32 values: q = round(x / d), d = max|x| / 127, s = d * sum(q).
// Or, for the interleaved K-quants (Q4_KX8, Q6_KX8: `per256`), llama.cpp's Q8_K: one d per 256
// values (d = max|x| / 127 over them, at d + m * nb / 8), no s, and sum16 always made: a
// super-block's 8 sub-block dots then add up in int32 and take one float step, where per-32
// scales cost four (convert, scale product, FMA, the min's FMA) per sub-block and row.
struct QAct {
  const int8_t* q;
  const float* d;
  const float* s;
  int64_t K, nb;  // values and blocks per row
  // Per 32 values, the integer sums of q's two halves as a pair of int16 (low: values 0..15) in one
  // int32: made only where a kernel needs them (Q6_KX8 folds its -32 offset in through them).
  const int32_t* sum16 = nullptr;
  bool per256 = false;
  // The 512-bit tiles' copy of q (gemm_x8 makes it): panels of 16 rows, each 32-value block's bytes
  // of the panel's rows side by side, so a tile's rows lie at fixed offsets from one pointer (16 row
  // pointers would not fit the general registers beside the loop's own).
  const int8_t* panels = nullptr;
  // Per row, the 32-value blocks' integer sums (the two halves of sum16 added, |S| <= 4064) in
  // int16 pairs of adjacent blocks, (S_2p, S_2p+1): Q4_KX8's tiles take a super-block's min term in
  // 4 madds instead of 8 (gemm_x8 makes them for more than one row).
  const int32_t* sum32p = nullptr;
  const int8_t* qrow(int64_t m) const { return q + m * K; }
  const float* drow(int64_t m) const { return d + m * nb; }
  const float* srow(int64_t m) const { return s + m * nb; }
  const int32_t* sum16row(int64_t m) const { return sum16 + m * nb; }
  const float* d256row(int64_t m) const { return d + m * (nb / 8); }
  const int32_t* sum32prow(int64_t m) const { return sum32p + m * (nb / 2); }
  // Row m's block b in the panels; row m + r's lies 32 r bytes on while m + r stays in m's panel.
  const int8_t* panel_block(int64_t m, int64_t b) const { return panels + (m >> 4) * 16 * K + b * 512 + (m & 15) * 32; }
};

}  // namespace radixlm
