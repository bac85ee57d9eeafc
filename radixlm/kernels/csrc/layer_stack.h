// The one-op decoder stacks' walk over their flattened weights (qwen3_5_layers.cpp,
// gpt_oss_layers.cpp): cursors into the tensors, the formats and the projections' segment counts,
// advanced layer by layer in the order the Python builder laid them out.
#pragma once
#include "api.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace radixlm {
namespace layer_stack {  // named: the unity build puts this header beside others' anonymous helpers

struct Stack {
  at::TensorList weights;
  at::IntArrayRef fmts, seg_counts;
  int64_t next_w = 0, next_fmt = 0, next_count = 0;

  // One projection: its segments side by side in the output's columns, then its bias
  // (QuantizedMatrix.matmul's order and operations: one segment takes the bias in its kernel,
  // several add it after, so the results are bitwise the Python layer's).
  at::Tensor linear(const at::Tensor& x, const c10::optional<at::Tensor>& bias = c10::nullopt) {
    const int64_t count = seg_counts[next_count++];
    int64_t out_rows = 0;
    for (int64_t j = 0; j < count; ++j) out_rows += weights[next_w + j].size(0) * fmt_group(fmts[next_fmt + j]);
    at::Tensor out = at::empty({x.size(0), out_rows}, x.options());
    for (int64_t j = 0, start = 0; j < count; ++j) {
      const at::Tensor& w = weights[next_w + j];
      const int64_t fmt = fmts[next_fmt + j], n = w.size(0) * fmt_group(fmt);
      at::Tensor view = count == 1 ? out : out.narrow(1, start, n);
      api::qlinear_out(x, w, fmt, count == 1 ? bias : c10::nullopt, view);
      start += n;
    }
    if (count > 1 && bias) out.add_(*bias);
    next_w += count;
    next_fmt += count;
    return out;
  }
  const at::Tensor& take() { return weights[next_w++]; }
  // Projection `ahead` (0: the next) as its segments and formats, the cursors left where they are.
  std::pair<at::TensorList, at::IntArrayRef> peek(int64_t ahead = 0) const {
    int64_t w = next_w, c = next_count;
    for (; c < next_count + ahead; ++c) w += seg_counts[c];
    const int64_t f = next_fmt + (w - next_w);
    return {weights.slice(w, seg_counts[c]), fmts.slice(f, seg_counts[c])};
  }
  void skip(int64_t projections) {
    for (int64_t j = 0; j < projections; ++j) {
      next_w += seg_counts[next_count];
      next_fmt += seg_counts[next_count++];
    }
  }
};

// The input norm of layer i: layer 0's stream starts as the embedding (the Python layers keep it as
// their residual), later layers add their input to the residual first.
inline void input_norm(int64_t i, at::Tensor& hidden, at::Tensor& residual, const at::Tensor& w, double eps) {
  if (i == 0) {
    residual.copy_(hidden);
    hidden = api::rmsnorm(residual, w, eps);
  } else {
    api::add_rmsnorm_(hidden, residual, w, eps);
  }
}

// layers/router_gemm.py's router_logits: the native router_gemm up to ROUTER_GEMM_MAX_ROWS tokens,
// MKL (F.linear) above.
constexpr int64_t ROUTER_GEMM_MAX_ROWS = 8;
inline at::Tensor router_linear(const at::Tensor& x, const at::Tensor& w,
                                const c10::optional<at::Tensor>& bias = c10::nullopt) {
  return x.size(0) <= ROUTER_GEMM_MAX_ROWS ? api::router_gemm(x, w, bias) : at::linear(x, w, bias);
}

// moe/native.py's run_with: the experts' op on slices of MOE_MAX_TOKENS tokens (its MAX_TOKENS),
// float32 activations and weights, the slices' outputs concatenated. With a shared expert (and its
// tokens' gates [T]) it runs in the same op (api::fused_moe_shared).
constexpr int64_t MOE_MAX_TOKENS = 1024;
inline at::Tensor routed_experts(const at::Tensor& x, const at::Tensor& ids, const at::Tensor& weights,
                                 const at::Tensor& w13, int64_t w13_fmt, const at::Tensor& w2, int64_t w2_fmt,
                                 const c10::optional<at::Tensor>& b13 = c10::nullopt,
                                 const c10::optional<at::Tensor>& b2 = c10::nullopt,
                                 c10::string_view activation = "silu", double alpha = 0.0, double limit = 0.0,
                                 const api::SharedExpertWeights* shared = nullptr,
                                 const at::Tensor& shared_gate = {}) {
  const int64_t T = x.size(0), k = ids.size(-1);
  const at::Tensor xs = x.reshape({-1, x.size(-1)}).to(at::kFloat).contiguous();
  const at::Tensor ids2 = ids.reshape({T, k}), w2d = weights.reshape({T, k}).to(at::kFloat);
  std::vector<at::Tensor> parts;
  for (int64_t a = 0; a < std::max<int64_t>(T, 1); a += MOE_MAX_TOKENS) {
    const int64_t n = std::min(MOE_MAX_TOKENS, T - a);
    const at::Tensor xa = xs.narrow(0, a, n), ia = ids2.narrow(0, a, n), wa = w2d.narrow(0, a, n);
    parts.push_back(shared ? api::fused_moe_shared(xa, ia, wa, w13, w13_fmt, w2, w2_fmt, *shared,
                                                   shared_gate.narrow(0, a, n).contiguous())
                           : api::fused_moe(xa, ia, wa, w13, w13_fmt, w2, w2_fmt, b13, b2, activation, alpha, limit));
  }
  at::Tensor out = parts.size() == 1 ? parts[0] : at::cat(parts);
  return out.view(x.sizes());
}

}  // namespace layer_stack
}  // namespace radixlm
