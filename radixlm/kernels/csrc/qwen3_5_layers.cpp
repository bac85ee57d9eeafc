// Every decoder layer of a Qwen3.5 (Gated DeltaNet layers and gated full attention, each followed by a
// SwiGLU MLP or Qwen3.5-MoE's sparse block) in one op, for CPU batches whose projections are
// quantized matrices. At batch 1
// the Python layers cost ~1,500 torch calls a step; here they are C++ calls. As layers.cpp does for
// the Llama family, it calls exactly the kernels the Python layers call (model/models/qwen3_5.py,
// model/layers/linear_attn/gated_delta_net.py with the native linear-attention backend,
// model/layers/moe/moe_block.py with the native experts), in the same order on the same shapes, so
// its results are bitwise theirs.
#include "layer_stack.h"

namespace radixlm {
namespace qwen3_5 {  // named: the unity build puts this file beside others' anonymous helpers

// Per layer, 4 projections (seg_counts): a linear-attention layer's in_proj_qkvz, out_proj, gate_up,
// down; an attention layer's qkv, o, gate_up, down. Before its segments, a linear-attention layer's
// weights are: input norm, post norm, in_proj_ba (float32), conv weight [C, K], A_log, dt_bias, the
// gated norm's weight; an attention layer's: input norm, post norm, q norm, k norm (the norms'
// scales: 1 + w). A sparse MLP (mlp_is_moe) adds the router [E, H], the experts' w13 and w2 blocks
// and the shared expert's gate [1, H] (float32), its gate_up and down being the layer's last two
// projections (the shared expert's); moe_ints per sparse layer: w13's and w2's formats, top k,
// renormalize.
constexpr int64_t PROJS = 4, LINEAR_TENSORS = 7, ATTN_TENSORS = 4, MOE_TENSORS = 4, MOE_INTS = 4;

// dims: attention heads, KV heads, head dim; key heads, value heads, key head dim, value head dim;
// value heads read key heads tiled (1) or grouped (0).
constexpr int64_t DIMS = 8;

using layer_stack::ROUTER_GEMM_MAX_ROWS;
using layer_stack::router_linear;
using layer_stack::Stack;

// GatedDeltaNet's in_proj_ba (float32), as its _ba(): the native router_gemm up to
// ROUTER_GEMM_MAX_ROWS tokens, else layers/linear.py's linear(): 9..15 rows go through MKL padded
// to 16 (its GEMM is slow there), so the padded product is what the Python layer computes.
at::Tensor float_linear(const at::Tensor& x, const at::Tensor& w) {
  const int64_t m = x.size(0);
  if (m <= ROUTER_GEMM_MAX_ROWS) return api::router_gemm(x, w);
  if (m >= 9 && m < 16) {
    at::Tensor padded = at::zeros({16, x.size(1)}, x.options());
    padded.narrow(0, 0, m).copy_(x);
    return at::linear(padded, w).narrow(0, 0, m);
  }
  return at::linear(x, w);
}

// The expert load (SparseMoeBlock's scatter-add of ones at the routed ids), counted in a loop: two
// ATen ops on a few integers cost ~24 us a layer at batch 1 (cold after the weights' stream).
void count_load(at::Tensor& expert_load, const at::Tensor& ids_) {
  TORCH_CHECK(expert_load.dtype() == at::kLong && expert_load.is_contiguous(), "qwen3_5_layers: int64 expert loads");
  const at::Tensor ids = ids_.to(at::kLong).contiguous();
  const int64_t *ip = ids.data_ptr<int64_t>(), n = ids.numel(), E = expert_load.numel();
  int64_t* lp = expert_load.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(ip[i] >= 0 && ip[i] < E, "qwen3_5_layers: routed id ", ip[i], " out of range");
    ++lp[ip[i]];
  }
}

// SparseMoeBlock.forward: softmax top-k routing (topk.py), the expert load counted, the experts'
// native op, the shared expert scaled by its sigmoid gate: inside the experts' op where its
// segments can join their tasks (the same kernels on the same rows, the same mul-then-add), else
// as the dense layers run it.
at::Tensor sparse_moe(Stack& s, const at::Tensor& x, at::Tensor& expert_load, const int64_t* ints) {
  const at::Tensor& router = s.take();
  const at::Tensor& w13 = s.take();
  const at::Tensor& w2 = s.take();
  const at::Tensor& shared_gate = s.take();
  const int64_t k = ints[2];
  at::Tensor probs = at::softmax(router_linear(x, router), -1, at::kFloat);
  auto [weights, ids] = at::topk(probs, k, -1);
  if (ints[3]) weights = weights / weights.sum(-1, true);
  count_load(expert_load, ids);
  at::Tensor gate = at::sigmoid(router_linear(x, shared_gate));
  const auto [gate_up, gate_up_fmts] = s.peek(0);
  const auto [down, down_fmt] = s.peek(1);
  if (down.size() == 1) {
    const api::SharedExpertWeights shared{gate_up, gate_up_fmts, down[0], down_fmt[0]};
    if (api::shared_expert_joins(shared, x.size(1))) {
      s.skip(2);
      return layer_stack::routed_experts(x, ids, weights, w13, ints[0], w2, ints[1], c10::nullopt, c10::nullopt,
                                         "silu", 0.0, 0.0, &shared, gate.reshape(-1).contiguous());
    }
  }
  at::Tensor out = layer_stack::routed_experts(x, ids, weights, w13, ints[0], w2, ints[1]);
  at::Tensor shared = s.linear(api::silu_and_mul(s.linear(x)));
  return out + gate * shared;
}

at::Tensor qwen3_5_layers(const at::Tensor& hidden_in, at::Tensor& residual, const at::Tensor& positions,
                          const at::Tensor& cos_sin, at::TensorList weights, at::IntArrayRef fmts,
                          at::IntArrayRef seg_counts, at::IntArrayRef layer_is_linear, at::IntArrayRef mlp_is_moe,
                          at::TensorList expert_loads, at::IntArrayRef moe_ints, at::TensorList conv_states,
                          at::TensorList ssm_states, const at::Tensor& state_rows, at::IntArrayRef state_lens,
                          at::TensorList k_bufs, at::TensorList v_bufs, at::TensorList k_scales,
                          at::TensorList v_scales, const at::Tensor& out_cache_loc, const at::Tensor& kv_slots,
                          const at::Tensor& rows, const at::Tensor& seq_lens, const at::Tensor& q_start,
                          at::IntArrayRef dims, double eps, double scaling) {
  const int64_t L = layer_is_linear.size();
  int64_t linear_layers = 0, segments = 0;
  int64_t moe_layers = 0;
  for (int64_t f : layer_is_linear) linear_layers += f != 0;
  TORCH_CHECK((int64_t)mlp_is_moe.size() == L, "qwen3_5_layers: an MLP kind per layer");
  for (int64_t f : mlp_is_moe) moe_layers += f != 0;
  TORCH_CHECK((int64_t)expert_loads.size() == moe_layers && (int64_t)moe_ints.size() == moe_layers * MOE_INTS,
              "qwen3_5_layers: an expert load and ", MOE_INTS, " ints per sparse MLP");
  for (int64_t c : seg_counts) {
    TORCH_CHECK(c >= 1, "qwen3_5_layers: a projection needs a segment");
    segments += c;
  }
  const int64_t attn_layers = L - linear_layers;
  TORCH_CHECK(dims.size() == DIMS, "qwen3_5_layers: ", DIMS, " dims");
  TORCH_CHECK((int64_t)seg_counts.size() == L * PROJS && (int64_t)fmts.size() == segments &&
                  (int64_t)weights.size() ==
                      linear_layers * LINEAR_TENSORS + attn_layers * ATTN_TENSORS + moe_layers * MOE_TENSORS + segments,
              "qwen3_5_layers: ", PROJS, " segment counts per layer, a format per segment, the layers' tensors");
  TORCH_CHECK((int64_t)conv_states.size() == linear_layers && (int64_t)ssm_states.size() == linear_layers &&
                  (int64_t)k_bufs.size() == attn_layers && v_bufs.size() == k_bufs.size() &&
                  k_scales.size() == v_scales.size() && (k_scales.empty() || (int64_t)k_scales.size() == attn_layers),
              "qwen3_5_layers: per-layer lists disagree");
  TORCH_CHECK(hidden_in.dim() == 2 && residual.sizes() == hidden_in.sizes(),
              "qwen3_5_layers: hidden and residual [tokens, hidden]");
  const int64_t T = hidden_in.size(0);
  const int64_t nh = dims[0], kvh = dims[1], hd = dims[2], nk = dims[3], nv = dims[4], dk = dims[5], dv = dims[6];
  const bool tiled = dims[7] != 0;
  const int64_t qs = nh * hd, kvs = kvh * hd, key_dim = nk * dk, value_dim = nv * dv, conv_dim = 2 * key_dim + value_dim;
  auto opt = [](at::TensorList l, int64_t i) -> c10::optional<at::Tensor> {
    return l.empty() ? c10::nullopt : c10::optional<at::Tensor>(l[i]);
  };
  Stack s{weights, fmts, seg_counts};
  const auto plan =
      attn_layers ? plan_attention(kv_slots, rows, seq_lens, q_start, kvh, nh / kvh) : nullptr;
  at::Tensor hidden = hidden_in.contiguous();
  for (int64_t i = 0, li = 0, ai = 0, mi = 0; i < L; ++i) {
    const at::Tensor& input_norm = s.take();
    const at::Tensor& post_norm = s.take();
    layer_stack::input_norm(i, hidden, residual, input_norm, eps);
    if (layer_is_linear[i]) {  // GatedDeltaNet.forward and _recurrence
      const at::Tensor& ba_w = s.take();
      const at::Tensor& conv_w = s.take();
      const at::Tensor& a_log = s.take();
      const at::Tensor& dt_bias = s.take();
      const at::Tensor& norm_w = s.take();
      at::Tensor qkvz = s.linear(hidden);
      at::Tensor mixed = qkvz.narrow(1, 0, conv_dim), z = qkvz.narrow(1, conv_dim, value_dim);
      at::Tensor ba = float_linear(hidden, ba_w);
      at::Tensor b = ba.narrow(1, 0, nv), a = ba.narrow(1, nv, nv);
      at::Tensor conv_state = conv_states[li], ssm_state = ssm_states[li];
      at::Tensor x = api::causal_conv1d(mixed, conv_w, c10::nullopt, conv_state, state_rows, state_lens, true);
      at::Tensor q = x.narrow(1, 0, key_dim).reshape({T, nk, dk});
      at::Tensor k = x.narrow(1, key_dim, key_dim).reshape({T, nk, dk});
      at::Tensor v = x.narrow(1, 2 * key_dim, value_dim).reshape({T, nv, dv});
      at::Tensor o = api::gated_delta_rule_gated(q, k, v, a, b, a_log, dt_bias, ssm_state, state_rows, state_lens, tiled);
      o = api::gated_rmsnorm(o, z.reshape({T, nv, dv}), norm_w, eps);
      hidden = s.linear(o.reshape({T, value_dim}));
      ++li;
    } else {  // Qwen3_5Attention.forward
      const at::Tensor& q_norm = s.take();
      const at::Tensor& k_norm = s.take();
      at::Tensor qkv = s.linear(hidden);
      std::vector<at::Tensor> qg = qkv.narrow(1, 0, 2 * qs).reshape({T, nh, 2 * hd}).chunk(2, -1);
      at::Tensor q = api::rmsnorm(qg[0].reshape({-1, hd}), q_norm, eps).reshape({T, qs});
      at::Tensor k = api::rmsnorm(qkv.narrow(1, 2 * qs, kvs).reshape({-1, hd}), k_norm, eps).reshape({T, kvs});
      at::Tensor v = qkv.narrow(1, 2 * qs + kvs, kvs).contiguous();
      api::rotary_embedding_(positions, q, k, hd, cos_sin);
      at::Tensor kb = k_bufs[ai], vb = v_bufs[ai];
      api::kv_store_(k.view({T, kvh, hd}), v.view({T, kvh, hd}), out_cache_loc, kb, vb, opt(k_scales, ai),
                     opt(v_scales, ai));
      at::Tensor attn = at::empty({T, nh, hd}, hidden.options());
      api::paged_attention_out(q.view({T, nh, hd}), kb, vb, opt(k_scales, ai), opt(v_scales, ai), kv_slots, rows,
                               seq_lens, q_start, scaling, attn, plan.get());
      hidden = s.linear(attn.reshape({T, qs}) * at::sigmoid(qg[1].reshape({T, qs})));
      ++ai;
    }
    api::add_rmsnorm_(hidden, residual, post_norm, eps);
    if (mlp_is_moe[i]) {
      at::Tensor load = expert_loads[mi];
      hidden = sparse_moe(s, hidden, load, moe_ints.data() + MOE_INTS * mi);
      ++mi;
    } else {
      at::Tensor gate_up = s.linear(hidden);
      hidden = s.linear(api::silu_and_mul(gate_up));
    }
  }
  return hidden;
}

}  // namespace qwen3_5

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("qwen3_5_layers(Tensor hidden, Tensor(a!) residual, Tensor positions, Tensor cos_sin, Tensor[] weights, "
        "int[] fmts, int[] seg_counts, int[] layer_is_linear, int[] mlp_is_moe, Tensor(h!)[] expert_loads, "
        "int[] moe_ints, Tensor(b!)[] conv_states, Tensor(c!)[] ssm_states, "
        "Tensor state_rows, int[] state_lens, Tensor(d!)[] k_bufs, Tensor(e!)[] v_bufs, Tensor(f!)[] k_scales, "
        "Tensor(g!)[] v_scales, Tensor out_cache_loc, Tensor kv_slots, Tensor rows, Tensor seq_lens, Tensor q_start, "
        "int[] dims, float eps, float scaling) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("qwen3_5_layers", &qwen3_5::qwen3_5_layers); }

}  // namespace radixlm
