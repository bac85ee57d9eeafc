// The view of int8-quantized activations the GEMM kernels read (qact.h makes them). No torch
// headers: quant_x8_vnni.cpp includes it under another target ISA, and an inline function of
// torch's compiled there could replace the baseline copy everywhere at link time.
#pragma once
#include <cstdint>

namespace radixlm {

// Activations quantized per 32 values: q = round(x / d), d = max|x| / 127, s = d * sum(q).
struct QAct {
  const int8_t* q;
  const float* d;
  const float* s;
  int64_t K, nb;  // values and blocks per row
  const int8_t* qrow(int64_t m) const { return q + m * K; }
  const float* drow(int64_t m) const { return d + m * nb; }
  const float* srow(int64_t m) const { return s + m * nb; }
};

}  // namespace radixlm
