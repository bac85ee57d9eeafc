// Every decoder layer of gpt-oss in one op, for CPU batches whose attention projections are quantized
// matrices and whose experts run on the native experts' op (MXFP4 in the released GGUFs). At batch 1
// the Python layers are ~40 torch calls a layer (a 24-layer cut-down shape: 9.49 -> 6.03 ms a step
// as one op, docs/benchmarks.md); here they are C++ calls. As layers.cpp does for the Llama family, it calls exactly the kernels the
// Python layers call (models/gpt_oss.py's LlamaAttention with sinks and windows on the native
// attention backend, models/gpt_oss_moe.py's router and fused experts), in the same order on the
// same shapes, so its results are bitwise theirs.
#include "layer_stack.h"

namespace radixlm {
namespace gpt_oss {  // named: the unity build puts this file beside others' anonymous helpers

using layer_stack::Stack;

// Per layer, in this order: input norm, post norm, qkv's bias, o's bias, the sinks [heads], the
// quantized segments of qkv and o (seg_counts: 2 per layer), the router's weight [E, H] and bias
// [E] (float32), the experts' w13 and its bias b13 ([gate; up] rows), w2 and b2.
constexpr int64_t PROJS = 2, TENSORS = 11;
// layer_ints per layer: its window (0: full attention), w13's and w2's formats, top k. in_swa per
// layer: its KV lives in the windowed pool (cache/swa_pool.py), read and written at the swa_* slots.
constexpr int64_t INTS = 4;

// GptOssSparseMoeBlock.forward: softmax over the top-k of the biased router's logits, then the
// experts with their biases and the clamped SwiGLU.
at::Tensor moe(Stack& s, const at::Tensor& x, const int64_t* ints, double alpha, double limit) {
  const at::Tensor& router_w = s.take();
  const at::Tensor& router_b = s.take();
  const at::Tensor& w13 = s.take();
  const at::Tensor& b13 = s.take();
  const at::Tensor& w2 = s.take();
  const at::Tensor& b2 = s.take();
  auto [top, ids] = at::topk(layer_stack::router_linear(x, router_w, router_b), ints[3], -1);
  const at::Tensor weights = at::softmax(top, -1, at::kFloat);
  return layer_stack::routed_experts(x, ids, weights, w13, ints[1], w2, ints[2], b13, b2, "swiglu", alpha, limit);
}

at::Tensor gpt_oss_layers(const at::Tensor& hidden_in, at::Tensor& residual, const at::Tensor& positions,
                          const at::Tensor& cos_sin, at::TensorList weights, at::IntArrayRef fmts,
                          at::IntArrayRef seg_counts, at::IntArrayRef layer_ints, at::IntArrayRef in_swa, at::TensorList k_bufs,
                          at::TensorList v_bufs, at::TensorList k_scales, at::TensorList v_scales,
                          const at::Tensor& out_cache_loc, const at::Tensor& swa_out_cache_loc,
                          const at::Tensor& kv_slots, const at::Tensor& swa_kv_slots, const at::Tensor& rows,
                          const at::Tensor& seq_lens, const at::Tensor& q_start, int64_t num_heads,
                          int64_t num_kv_heads, int64_t head_dim, double eps, double scaling, double alpha,
                          double limit) {
  const int64_t L = k_bufs.size();
  int64_t segments = 0;
  for (int64_t c : seg_counts) {
    TORCH_CHECK(c >= 1, "gpt_oss_layers: a projection needs a segment");
    segments += c;
  }
  TORCH_CHECK((int64_t)seg_counts.size() == L * PROJS && (int64_t)layer_ints.size() == L * INTS &&
                  (int64_t)fmts.size() == segments && (int64_t)weights.size() == L * TENSORS + segments,
              "gpt_oss_layers: ", PROJS, " segment counts, ", INTS, " ints and ", TENSORS,
              " tensors per layer, a format per segment");
  TORCH_CHECK((int64_t)in_swa.size() == L && v_bufs.size() == k_bufs.size() && k_scales.size() == v_scales.size() &&
                  (k_scales.empty() || (int64_t)k_scales.size() == L),
              "gpt_oss_layers: per-layer lists disagree");
  TORCH_CHECK(hidden_in.dim() == 2 && residual.sizes() == hidden_in.sizes(),
              "gpt_oss_layers: hidden and residual [tokens, hidden]");
  const int64_t T = hidden_in.size(0), qs = num_heads * head_dim, kvs = num_kv_heads * head_dim;
  auto opt = [](at::TensorList l, int64_t i) -> c10::optional<at::Tensor> {
    return l.empty() ? c10::nullopt : c10::optional<at::Tensor>(l[i]);
  };
  // One plan per slot space (the paged kernel groups requests by the slots they share).
  const int64_t group = num_heads / num_kv_heads;
  const auto plan = plan_attention(kv_slots, rows, seq_lens, q_start, num_kv_heads, group);
  bool any_swa = false;
  for (int64_t f : in_swa) any_swa = any_swa || f != 0;
  const auto swa_plan = any_swa ? plan_attention(swa_kv_slots, rows, seq_lens, q_start, num_kv_heads, group) : nullptr;
  Stack s{weights, fmts, seg_counts};
  at::Tensor hidden = hidden_in.contiguous();
  for (int64_t i = 0; i < L; ++i) {
    const int64_t* ints = layer_ints.data() + INTS * i;
    const bool swa = in_swa[i] != 0;
    const at::Tensor& input_norm = s.take();
    const at::Tensor& post_norm = s.take();
    const at::Tensor& qkv_bias = s.take();
    const at::Tensor& o_bias = s.take();
    const at::Tensor& sinks = s.take();
    layer_stack::input_norm(i, hidden, residual, input_norm, eps);
    // LlamaAttention.forward and RadixAttention.forward (set_kv_buffer, then the native backend)
    at::Tensor qkv = s.linear(hidden, qkv_bias);
    at::Tensor q = qkv.narrow(1, 0, qs), k = qkv.narrow(1, qs, kvs), v = qkv.narrow(1, qs + kvs, kvs);
    api::rotary_embedding_(positions, q, k, head_dim, cos_sin);
    at::Tensor kb = k_bufs[i], vb = v_bufs[i];
    api::kv_store_(k.view({T, num_kv_heads, head_dim}), v.view({T, num_kv_heads, head_dim}),
                   swa ? swa_out_cache_loc : out_cache_loc, kb, vb, opt(k_scales, i), opt(v_scales, i));
    at::Tensor attn = at::empty({T, num_heads, head_dim}, hidden.options());
    api::paged_attention_out(q.view({T, num_heads, head_dim}), kb, vb, opt(k_scales, i), opt(v_scales, i),
                             swa ? swa_kv_slots : kv_slots, rows, seq_lens, q_start, scaling, attn,
                             swa ? swa_plan.get() : plan.get(), ints[0], sinks);
    hidden = s.linear(attn.view({T, qs}), o_bias);
    api::add_rmsnorm_(hidden, residual, post_norm, eps);
    hidden = moe(s, hidden, ints, alpha, limit);
  }
  return hidden;
}

}  // namespace gpt_oss

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("gpt_oss_layers(Tensor hidden, Tensor(a!) residual, Tensor positions, Tensor cos_sin, Tensor[] weights, "
        "int[] fmts, int[] seg_counts, int[] layer_ints, int[] in_swa, Tensor(b!)[] k_bufs, Tensor(c!)[] v_bufs, "
        "Tensor(d!)[] k_scales, Tensor(e!)[] v_scales, Tensor out_cache_loc, Tensor swa_out_cache_loc, "
        "Tensor kv_slots, Tensor swa_kv_slots, Tensor rows, Tensor seq_lens, Tensor q_start, int num_heads, "
        "int num_kv_heads, int head_dim, float eps, float scaling, float alpha, float limit) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("gpt_oss_layers", &gpt_oss::gpt_oss_layers); }

}  // namespace radixlm
