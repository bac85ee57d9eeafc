// The kernels as C++ functions, for ops that chain several of them without going back to Python
// (layers.cpp). Each forwards to the function its own torch op runs.
#pragma once
#include "common.h"

#include <memory>

namespace radixlm {
// How one batch's queries are cut into work for paged attention (attention.cpp); depends only on
// the index tensors, so one plan serves every layer of a forward.
struct AttentionPlan;
std::shared_ptr<const AttentionPlan> plan_attention(const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                                                    const at::Tensor& seq_lens, const at::Tensor& q_start,
                                                    int64_t num_kv_heads, int64_t group);
}  // namespace radixlm

namespace radixlm::api {
void qlinear_out(const at::Tensor& x, const at::Tensor& w, int64_t fmt, const c10::optional<at::Tensor>& bias,
                 at::Tensor& out);
// The experts of a MoE layer after routing (moe.cpp): hidden [T, H], topk ids / weights [T, k].
// SGLang's options: per-expert biases b13 [E, 2I] and b2 [E, H], activation "silu" or "swiglu"
// (gpt-oss's, clamped at limit).
at::Tensor fused_moe(const at::Tensor& hidden, const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                     const at::Tensor& w13, int64_t w13_fmt, const at::Tensor& w2, int64_t w2_fmt,
                     const c10::optional<at::Tensor>& b13 = c10::nullopt,
                     const c10::optional<at::Tensor>& b2 = c10::nullopt, c10::string_view activation = "silu",
                     double alpha = 0.0, double limit = 0.0);
// A shared expert (Qwen2-MoE's) run inside fused_moe's task pools: gate_up's quantized segments
// (2-D, consecutive rows of [gate; up]) and down; the tokens' sigmoid gates [T] scale its rows,
// added after the routed ones (`out + gate * shared`). shared_expert_joins: whether the segments
// can (formats not mixed float / int8 blocks, interleaved rows in whole 8-row groups).
struct SharedExpertWeights {
  at::TensorList gate_up;
  at::IntArrayRef gate_up_fmts;
  at::Tensor down;
  int64_t down_fmt;
};
bool shared_expert_joins(const SharedExpertWeights& w, int64_t hidden);
at::Tensor fused_moe_shared(const at::Tensor& hidden, const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                            const at::Tensor& w13, int64_t w13_fmt, const at::Tensor& w2, int64_t w2_fmt,
                            const SharedExpertWeights& shared, const at::Tensor& shared_gate);
// A router's float32 logits x [T, H] . w [E, H]^T (+ bias [E]) (router_gemm.cpp).
at::Tensor router_gemm(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias = c10::nullopt);
at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& w, double eps);
void add_rmsnorm_(at::Tensor& x, at::Tensor& residual, const at::Tensor& w, double eps);
at::Tensor silu_and_mul(const at::Tensor& x);
void rotary_embedding_(const at::Tensor& positions, at::Tensor& q, at::Tensor& k, int64_t head_dim,
                       const at::Tensor& cos_sin);
void kv_store_(const at::Tensor& k, const at::Tensor& v, const at::Tensor& loc, at::Tensor& k_buf, at::Tensor& v_buf,
               const c10::optional<at::Tensor>& k_scale, const c10::optional<at::Tensor>& v_scale);
void paged_attention_out(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                         const c10::optional<at::Tensor>& k_scale, const c10::optional<at::Tensor>& v_scale,
                         const at::Tensor& req_to_token, const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                         const at::Tensor& q_start, double scale, at::Tensor& out, const AttentionPlan* plan = nullptr,
                         int64_t window = 0, const c10::optional<at::Tensor>& sinks = c10::nullopt,
                         double logit_cap = 0.0, int64_t chunk = 0);
// The hybrid models' state layers (recurrent.cpp, gdn_fused.cpp): the conv's state and the gated
// delta rule's are advanced in place at slots `rows`, seq_lens new tokens per request.
at::Tensor causal_conv1d(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                         at::Tensor& conv_state, const at::Tensor& rows, at::IntArrayRef seq_lens, bool silu);
at::Tensor gated_delta_rule_gated(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                                  const at::Tensor& b, const at::Tensor& a_log, const at::Tensor& dt_bias,
                                  at::Tensor& ssm_state, const at::Tensor& rows, at::IntArrayRef seq_lens, bool tiled);
at::Tensor gated_rmsnorm(const at::Tensor& x, const at::Tensor& z, const at::Tensor& weight, double eps);
}  // namespace radixlm::api
