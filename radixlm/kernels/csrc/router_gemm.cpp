// A MoE router's logits (SGLang's router_gemm): a float32 matrix [experts, hidden] times a few
// token rows, the matrix kept float32 (routing decides which experts run; SGLang and HF keep it
// unquantized). At decode MKL's float GEMV takes these rows on one thread at ~17 GB/s while the
// other core waits: on the Qwen3.5-35B-A3B shape's step, 4.8% of the main thread's samples with
// the second thread idle. Here the matrix's rows are split over ATen's threads.
//
// Each logit is one dot in a fixed order (two 8-lane FMA chains over alternate 8-column chunks,
// then the 8-column tail, then a scalar tail), whatever the batch and the split: a token's logits
// are bitwise the same alone or in any batch.
#include "common.h"

namespace radixlm {
namespace router {  // named: the unity build puts this file beside others' anonymous helpers

constexpr int64_t TILE = 4;  // weight rows per tile: 8 FMA chains, each weight row read once per tile

template <int R>
inline void dot_rows(const float* w, int64_t K, const float* x, float* out) {
  __m256 a0[R], a1[R];
  for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
    for (int r = 0; r < R; ++r) {
      a0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w + r * K + k), x0, a0[r]);
      a1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w + r * K + k + 8), x1, a1[r]);
    }
  }
  if (k + 8 <= K) {
    const __m256 x0 = _mm256_loadu_ps(x + k);
    for (int r = 0; r < R; ++r) a0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w + r * K + k), x0, a0[r]);
    k += 8;
  }
  for (int r = 0; r < R; ++r) {
    float s = hsum(_mm256_add_ps(a0[r], a1[r]));
    for (int64_t j = k; j < K; ++j) s += w[r * K + j] * x[j];
    out[r] = s;
  }
}

at::Tensor router_gemm(const at::Tensor& x_, const at::Tensor& w_, const c10::optional<at::Tensor>& bias_) {
  TORCH_CHECK(x_.dtype() == at::kFloat && x_.dim() == 2, "router_gemm: x must be float32 [tokens, hidden]");
  TORCH_CHECK(w_.dtype() == at::kFloat && w_.dim() == 2 && w_.size(1) == x_.size(1),
              "router_gemm: weight must be float32 [experts, hidden] with x's hidden (", x_.size(1), ")");
  const at::Tensor x = x_.contiguous(), w = w_.contiguous();
  const int64_t M = x.size(0), N = w.size(0), K = w.size(1);
  at::Tensor bias;
  if (bias_) {
    bias = bias_->contiguous();
    TORCH_CHECK(bias.dtype() == at::kFloat && bias.dim() == 1 && bias.size(0) == N,
                "router_gemm: bias must be float32 [experts] = [", N, "]");
  }
  at::Tensor out = at::empty({M, N}, x.options());
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  const int64_t tiles = (N + TILE - 1) / TILE;
  // A tile per thread share; a matrix under ~256 KB stays on the calling thread (a fork costs more).
  const int64_t grain = N * K * 4 < (256 << 10) ? tiles : 1;
  at::parallel_for(0, tiles, grain, [&](int64_t t0, int64_t t1) {
    float logits[TILE];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * TILE, rows = std::min(TILE, N - n0);
      for (int64_t m = 0; m < M; ++m) {
        const float* xr = xp + m * K;
        const float* wr = wp + n0 * K;
        if (rows == TILE) {
          dot_rows<TILE>(wr, K, xr, logits);
        } else {
          for (int64_t r = 0; r < rows; ++r) dot_rows<1>(wr + r * K, K, xr, logits + r);
        }
        for (int64_t r = 0; r < rows; ++r) op[m * N + n0 + r] = bp ? logits[r] + bp[n0 + r] : logits[r];
      }
    }
  });
  return out;
}

}  // namespace router

namespace api {
at::Tensor router_gemm(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  return router::router_gemm(x, w, bias);
}
}  // namespace api

TORCH_LIBRARY_FRAGMENT(radixlm, m) { m.def("router_gemm(Tensor x, Tensor w, Tensor? bias=None) -> Tensor"); }

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("router_gemm", &router::router_gemm); }

}  // namespace radixlm
