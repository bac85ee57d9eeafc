// Float -> Q4_K at load (--quantization q4_k for float checkpoints): the block format GGUF files
// hold, so the loaded matrix takes the same kernels and interleaved layout as a Q4_K_M file's.
// The search is llama.cpp's reference one (quantize_row_q4_K_ref, make_qkx2_quants): per 32
// values a scale and min fit by weighted least squares over 21 candidate grids, then the 8
// sub-block scales and mins quantized to 6 bits against the block's largest. The 8 fits of a
// super-block run in the 8 lanes of AVX2 registers (the scalar search is latency-bound on its sums). The gguf package has
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

// The 8 sub-blocks of a super-block fit side by side, sub-block j in lane j: each lane runs the
// reference's scalar sequence (same operations, same order: -ffp-contract=off keeps every product
// and sum rounded), so the result is bitwise the scalar search's at 8 sub-blocks per instruction.
// xt[i], wt[i]: value i of every sub-block and its weight. Out: each lane's scale, -min and levels.
void fit_scale_min8(const __m256* xt, const __m256* wt, __m256* L, __m256* scale_out, __m256* neg_min_out) {
  constexpr float nmax = 15.f, rmin = -1.f, rdelta = 0.1f;
  constexpr int nstep = 20;
  const __m256 zero = _mm256_setzero_ps(), vmax = _mm256_set1_ps(nmax);
  __m256 lo = xt[0], hi = xt[0], sum_w = wt[0], sum_x = _mm256_mul_ps(wt[0], xt[0]);
  for (int i = 1; i < 32; ++i) {
    lo = _mm256_min_ps(xt[i], lo);  // x < lo ? x : lo, as std::min(lo, x)
    hi = _mm256_max_ps(xt[i], hi);
    sum_w = _mm256_add_ps(sum_w, wt[i]);
    sum_x = _mm256_add_ps(sum_x, _mm256_mul_ps(wt[i], xt[i]));
  }
  lo = _mm256_min_ps(zero, lo);  // lo > 0 ? 0 : lo
  const __m256 flat = _mm256_cmp_ps(hi, lo, _CMP_EQ_OQ);
  auto levels = [&](__m256 iscale, __m256 x) {
    const __m256 l = _mm256_round_ps(_mm256_mul_ps(iscale, _mm256_sub_ps(x, lo)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_min_ps(vmax, _mm256_max_ps(l, zero));  // max(l, 0): +0, never -0, as the int levels
  };
  __m256 iscale = _mm256_div_ps(vmax, _mm256_sub_ps(hi, lo));
  __m256 scale = _mm256_div_ps(_mm256_set1_ps(1.f), iscale), best = zero;
  for (int i = 0; i < 32; ++i) {
    L[i] = levels(iscale, xt[i]);
    const __m256 diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(scale, L[i]), lo), xt[i]);
    best = _mm256_add_ps(best, _mm256_mul_ps(wt[i], _mm256_mul_ps(diff, diff)));
  }
  __m256 aux[32];
  for (int is = 0; is <= nstep; ++is) {
    // The range is taken from the best min so far, as the reference does.
    iscale = _mm256_div_ps(_mm256_set1_ps(rmin + rdelta * is + nmax), _mm256_sub_ps(hi, lo));
    __m256 sum_l = zero, sum_l2 = zero, sum_xl = zero;
    for (int i = 0; i < 32; ++i) {
      aux[i] = levels(iscale, xt[i]);
      const __m256 wl = _mm256_mul_ps(wt[i], aux[i]);
      sum_l = _mm256_add_ps(sum_l, wl);
      sum_l2 = _mm256_add_ps(sum_l2, _mm256_mul_ps(wl, aux[i]));
      sum_xl = _mm256_add_ps(sum_xl, _mm256_mul_ps(wl, xt[i]));
    }
    const __m256 D = _mm256_sub_ps(_mm256_mul_ps(sum_w, sum_l2), _mm256_mul_ps(sum_l, sum_l));
    const __m256 positive = _mm256_cmp_ps(D, zero, _CMP_GT_OQ);
    if (_mm256_movemask_ps(positive) == 0) continue;
    __m256 this_scale = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sum_w, sum_xl), _mm256_mul_ps(sum_x, sum_l)), D);
    __m256 this_min = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sum_l2, sum_x), _mm256_mul_ps(sum_l, sum_xl)), D);
    const __m256 min_above = _mm256_cmp_ps(this_min, zero, _CMP_GT_OQ);
    this_min = _mm256_blendv_ps(this_min, zero, min_above);
    this_scale = _mm256_blendv_ps(this_scale, _mm256_div_ps(sum_xl, sum_l2), min_above);
    __m256 err = zero;
    for (int i = 0; i < 32; ++i) {
      const __m256 diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(this_scale, aux[i]), this_min), xt[i]);
      err = _mm256_add_ps(err, _mm256_mul_ps(wt[i], _mm256_mul_ps(diff, diff)));
    }
    const __m256 take = _mm256_and_ps(positive, _mm256_cmp_ps(err, best, _CMP_LT_OQ));
    if (_mm256_movemask_ps(take) == 0) continue;
    for (int i = 0; i < 32; ++i) L[i] = _mm256_blendv_ps(L[i], aux[i], take);
    best = _mm256_blendv_ps(best, err, take);
    scale = _mm256_blendv_ps(scale, this_scale, take);
    lo = _mm256_blendv_ps(lo, this_min, take);
  }
  // A constant sub-block (hi == lo): levels 0, scale 0, -min = -lo.
  for (int i = 0; i < 32; ++i) L[i] = _mm256_blendv_ps(L[i], zero, flat);
  *scale_out = _mm256_blendv_ps(scale, zero, flat);
  *neg_min_out = _mm256_xor_ps(lo, _mm256_set1_ps(-0.f));  // -lo exactly (0 - lo would lose -0's sign)
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
  // Transposed: xt[i] holds value i of the 8 sub-blocks; each weight is av_x + |x| (the sub-block's
  // RMS plus the value's magnitude), as in the reference.
  alignas(32) float t[32][8];
  for (int j = 0; j < 8; ++j)
    for (int i = 0; i < 32; ++i) t[i][j] = x[32 * j + i];
  __m256 xt[32], wt[32], Lv[32], sum_x2 = _mm256_setzero_ps();
  for (int i = 0; i < 32; ++i) {
    xt[i] = _mm256_load_ps(t[i]);
    sum_x2 = _mm256_add_ps(sum_x2, _mm256_mul_ps(xt[i], xt[i]));
  }
  const __m256 av_x = _mm256_sqrt_ps(_mm256_div_ps(sum_x2, _mm256_set1_ps(32.f)));
  for (int i = 0; i < 32; ++i) wt[i] = _mm256_add_ps(av_x, _mm256_andnot_ps(_mm256_set1_ps(-0.f), xt[i]));
  __m256 vscale, vmin;
  fit_scale_min8(xt, wt, Lv, &vscale, &vmin);
  alignas(32) float scales[8], mins[8];
  _mm256_store_ps(scales, vscale);
  _mm256_store_ps(mins, vmin);
  uint8_t L[QK];
  for (int i = 0; i < 32; ++i) {
    _mm256_store_ps(t[i], Lv[i]);
    for (int j = 0; j < 8; ++j) L[32 * j + i] = static_cast<uint8_t>(t[i][j]);
  }
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
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
