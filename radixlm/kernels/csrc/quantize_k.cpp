// Float -> Q4_K at load (--quantization q4_k for float checkpoints): the block format GGUF files
// hold, so the loaded matrix takes the same kernels and interleaved layout as a Q4_K_M file's.
// The search is llama.cpp's reference one (quantize_row_q4_K_ref, make_qkx2_quants): per 32
// values a scale and min fit by weighted least squares over 21 candidate grids, then the 8
// sub-block scales and mins quantized to 6 bits against the block's largest. The gguf package has
// no Q4_K quantizer; tests/kernels/test_quantize_k.py checks this one bit for bit against a naive
// Python port of the same search.
#include "common.h"

#include <cmath>

namespace radixlm {
namespace {

constexpr int QK = 256;
constexpr int Q4K_BYTES = 144;  // fp16 d, fp16 dmin, scales[12], nibbles[128]

// Round half to even, as llama.cpp's nearest_int (its float-magic trick) does for |x| < 2^22.
inline int nearest_int(float x) { return static_cast<int>(std::nearbyintf(x)); }

inline uint16_t to_fp16(float x) { return _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT); }
inline float from_fp16(uint16_t h) { return _cvtsh_ss(h); }

// One sub-block's scale (returned) and -min (out) with levels L in [0, nmax]: llama.cpp's
// make_qkx2_quants with use_mad false.
float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min, float rmin,
                    float rdelta, int nstep) {
  float lo = x[0], hi = x[0], sum_w = w[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0) lo = 0;
  if (hi == lo) {
    std::memset(L, 0, n);
    *neg_min = -lo;
    return 0.f;
  }
  float iscale = nmax / (hi - lo), scale = 1 / iscale, best_error = 0;
  for (int i = 0; i < n; ++i) {
    int l = std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - lo))));
    L[i] = static_cast<uint8_t>(l);
    float diff = scale * L[i] + lo - x[i];
    best_error += w[i] * (diff * diff);
  }
  uint8_t aux[32];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (hi - lo);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - lo))));
      aux[i] = static_cast<uint8_t>(l);
      float wl = w[i] * l;
      sum_l += wl;
      sum_l2 += wl * l;
      sum_xl += wl * x[i];
    }
    float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * aux[i] + this_min - x[i];
        cur_error += w[i] * (diff * diff);
      }
      if (cur_error < best_error) {
        std::memcpy(L, aux, n);
        best_error = cur_error;
        scale = this_scale;
        lo = this_min;
      }
    }
  }
  *neg_min = -lo;
  return scale;
}

inline void scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void quantize_block_q4_k(const float* x, uint8_t* out) {
  uint8_t L[QK];
  float weights[32], mins[8], scales[8], max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = fit_scale_min(32, 15, xs, weights, L + 32 * j, &mins[j], -1.f, 0.1f, 20);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t* sc = out + 4;
  std::memset(sc, 0, 12);
  for (int j = 0; j < 8; ++j) {
    // Narrowed first, then capped, as the reference does.
    uint8_t ls = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
    uint8_t lm = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
    if (j < 4) {
      sc[j] = ls;
      sc[j + 4] = lm;
    } else {
      sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
      sc[j - 4] |= ((ls >> 4) << 6);
      sc[j] |= ((lm >> 4) << 6);
    }
  }
  uint16_t d16 = to_fp16(max_scale / 63.f), dmin16 = to_fp16(max_min / 63.f);
  std::memcpy(out, &d16, 2);
  std::memcpy(out + 2, &dmin16, 2);
  for (int j = 0; j < 8; ++j) {
    uint8_t s, m;
    scale_min_k4(j, sc, &s, &m);
    const float d = from_fp16(d16) * s;
    if (!d) continue;  // keeps the levels of the fit
    const float dm = from_fp16(dmin16) * m;
    for (int ii = 0; ii < 32; ++ii) {
      int l = nearest_int((x[32 * j + ii] + dm) / d);
      L[32 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(15, l)));
    }
  }
  uint8_t* q = out + 16;
  for (int j = 0; j < QK; j += 64, q += 32)
    for (int l = 0; l < 32; ++l) q[l] = L[j + l] | (L[j + l + 32] << 4);
}

at::Tensor quantize_q4_k(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat, "quantize_q4_k: float32 [rows, cols]");
  TORCH_CHECK(w.size(1) % QK == 0, "quantize_q4_k: columns must be a multiple of 256, got ", w.size(1));
  at::Tensor x = w.contiguous();
  const int64_t rows = x.size(0), blocks = x.size(1) / QK;
  at::Tensor out = at::empty({rows, blocks * Q4K_BYTES}, x.options().dtype(at::kByte));
  const float* src = x.data_ptr<float>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, rows * blocks, 64, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) quantize_block_q4_k(src + b * QK, dst + b * Q4K_BYTES);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm, m) { m.def("quantize_q4_k(Tensor w) -> Tensor"); }

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("quantize_q4_k", &quantize_q4_k); }

}  // namespace radixlm
