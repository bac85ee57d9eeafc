// Every decoder layer of a dense model in one op, for CPU batches whose linear layers are quantized
// matrices (one or more segments each): the Llama family's pre-norm layers, and with flags Qwen3's
// q/k norms and Gemma 2/3's sandwich norms, GELU MLP, per-layer windows and RoPE tables. At batch 1
// a step is ~400 small ops, and Python plus the dispatcher cost ~10 ms of a ~28 ms step; here they
// are C++ calls. It calls exactly the kernels the Python layers call, in the same order on the same
// shapes, so its results are bitwise theirs.
#include "layer_stack.h"

namespace radixlm {
namespace {

// flags: what the layers have beyond Llama's.
constexpr int64_t QK_NORM = 1;    // an RMSNorm over each head of q and k, before RoPE (Qwen3, Gemma 3)
constexpr int64_t SANDWICH = 2;   // Gemma: norms after attention and MLP too, before they join the stream
constexpr int64_t GELU_TANH = 4;  // gelu(gate, "tanh") * up instead of silu(gate) * up
constexpr int64_t GELU_ERF = 8;   // gelu(gate) * up (exact)

// The batch's attention inputs for one slot space: its table, the plan made from it, and where the
// new tokens' K/V go.
struct SlotSpace {
  at::Tensor kv_slots, out_cache_loc;
  std::shared_ptr<const AttentionPlan> plan;
};

// Per layer, in this order: input_norm, post_norm (with SANDWICH: then pre_ff_norm, post_ff_norm;
// with QK_NORM: then q_norm, k_norm), then the quantized segments of qkv, o, gate_up and down
// (seg_counts: 4 per layer; a projection is several segments when its shards differ in format, as a
// Q4_K_M file's Q4_K q/k beside a Q6_K v), one format per segment. cos_sin: one RoPE table for all
// layers or one per layer; windows: per layer (0: full attention), or none. A windowed layer reads
// the windowed slot space (swa_kv_slots, swa_out_cache_loc) where the pool has one.
void llama_layers_(at::Tensor& hidden, at::Tensor& residual, const at::Tensor& positions, at::TensorList cos_sin,
                   at::TensorList weights, at::IntArrayRef fmts, at::IntArrayRef seg_counts, at::TensorList qkv_bias,
                   at::TensorList k_bufs, at::TensorList v_bufs, at::TensorList k_scales, at::TensorList v_scales,
                   const at::Tensor& out_cache_loc, const c10::optional<at::Tensor>& swa_out_cache_loc,
                   const at::Tensor& kv_slots, const c10::optional<at::Tensor>& swa_kv_slots, const at::Tensor& rows,
                   const at::Tensor& seq_lens, const at::Tensor& q_start, at::IntArrayRef windows, int64_t num_heads,
                   int64_t num_kv_heads, int64_t head_dim, double eps, double scaling, double logit_cap,
                   int64_t flags) {
  const int64_t L = k_bufs.size();
  const bool qk_norm = flags & QK_NORM, sandwich = flags & SANDWICH;
  const int64_t norms = 2 + (sandwich ? 2 : 0) + (qk_norm ? 2 : 0);
  int64_t segments = 0;
  for (int64_t c : seg_counts) {
    TORCH_CHECK(c >= 1, "llama_layers: a projection needs a segment");
    segments += c;
  }
  TORCH_CHECK((int64_t)seg_counts.size() == L * 4 && (int64_t)weights.size() == norms * L + segments &&
                  (int64_t)fmts.size() == segments,
              "llama_layers: ", norms, " norms per layer, 4 segment counts per layer, a format per segment");
  TORCH_CHECK(v_bufs.size() == k_bufs.size() && k_scales.size() == v_scales.size() &&
                  (k_scales.empty() || (int64_t)k_scales.size() == L) && (qkv_bias.empty() || (int64_t)qkv_bias.size() == L),
              "llama_layers: per-layer lists disagree");
  TORCH_CHECK(cos_sin.size() == 1 || (int64_t)cos_sin.size() == L, "llama_layers: one RoPE table, or one per layer");
  TORCH_CHECK(windows.empty() || (int64_t)windows.size() == L, "llama_layers: a window per layer, or none");
  TORCH_CHECK(swa_kv_slots.has_value() == swa_out_cache_loc.has_value(),
              "llama_layers: the windowed slot space needs its table and its new tokens' slots");
  TORCH_CHECK(hidden.dim() == 2 && hidden.is_contiguous() && residual.sizes() == hidden.sizes(),
              "llama_layers: hidden and residual [tokens, hidden]");
  const int64_t T = hidden.size(0), qs = num_heads * head_dim, kvs = num_kv_heads * head_dim;
  auto opt = [](at::TensorList l, int64_t i) -> c10::optional<at::Tensor> {
    return l.empty() ? c10::nullopt : c10::optional<at::Tensor>(l[i]);
  };
  const int64_t group = num_heads / num_kv_heads;
  const SlotSpace full{kv_slots, out_cache_loc, plan_attention(kv_slots, rows, seq_lens, q_start, num_kv_heads, group)};
  SlotSpace swa;
  if (swa_kv_slots) {
    swa = {*swa_kv_slots, *swa_out_cache_loc,
           plan_attention(*swa_kv_slots, rows, seq_lens, q_start, num_kv_heads, group)};
  }
  layer_stack::Stack s{weights, fmts, seg_counts};
  for (int64_t i = 0; i < L; ++i) {
    const at::Tensor& input_norm = s.take();
    const at::Tensor& post_norm = s.take();
    const at::Tensor* pre_ff_norm = sandwich ? &s.take() : nullptr;
    const at::Tensor* post_ff_norm = sandwich ? &s.take() : nullptr;
    const at::Tensor* q_norm = qk_norm ? &s.take() : nullptr;
    const at::Tensor* k_norm = qk_norm ? &s.take() : nullptr;
    layer_stack::input_norm(i, hidden, residual, input_norm, eps);
    at::Tensor qkv = s.linear(hidden, opt(qkv_bias, i));
    at::Tensor q = qkv.narrow(1, 0, qs), k = qkv.narrow(1, qs, kvs), v = qkv.narrow(1, qs + kvs, kvs);
    if (qk_norm) {  // LlamaAttention's: each head a row of the norm
      q = api::rmsnorm(q.reshape({-1, head_dim}), *q_norm, eps).view({T, qs});
      k = api::rmsnorm(k.reshape({-1, head_dim}), *k_norm, eps).view({T, kvs});
    }
    api::rotary_embedding_(positions, q, k, head_dim, cos_sin[cos_sin.size() == 1 ? 0 : i]);
    const int64_t window = windows.empty() ? 0 : windows[i];
    const SlotSpace& space = window > 0 && swa_kv_slots ? swa : full;
    at::Tensor k3 = k.view({T, num_kv_heads, head_dim}), v3 = v.view({T, num_kv_heads, head_dim});
    at::Tensor kb = k_bufs[i], vb = v_bufs[i];
    api::kv_store_(k3, v3, space.out_cache_loc, kb, vb, opt(k_scales, i), opt(v_scales, i));
    at::Tensor attn = at::empty({T, num_heads, head_dim}, hidden.options());
    api::paged_attention_out(q.view({T, num_heads, head_dim}), kb, vb, opt(k_scales, i), opt(v_scales, i),
                             space.kv_slots, rows, seq_lens, q_start, scaling, attn, space.plan.get(), window,
                             c10::nullopt, logit_cap);
    hidden = s.linear(attn.view({T, qs}));
    if (sandwich) {  // Gemma: the branch normed before it joins the stream, then the MLP's pre-norm
      hidden = api::rmsnorm(hidden, post_norm, eps);
      api::add_rmsnorm_(hidden, residual, *pre_ff_norm, eps);
    } else {
      api::add_rmsnorm_(hidden, residual, post_norm, eps);
    }
    at::Tensor gate_up = s.linear(hidden);
    at::Tensor act;
    if (flags & (GELU_TANH | GELU_ERF)) {  // GeluAndMul's two ops, so bitwise its result
      const int64_t d = gate_up.size(1) / 2;
      act = at::gelu(gate_up.narrow(1, 0, d), flags & GELU_TANH ? "tanh" : "none") * gate_up.narrow(1, d, d);
    } else {
      act = api::silu_and_mul(gate_up);
    }
    hidden = s.linear(act);
    if (sandwich) hidden = api::rmsnorm(hidden, *post_ff_norm, eps);
  }
}

// The op returns the last layer's output (hidden is rebound inside) and fills residual in place.
at::Tensor llama_layers(const at::Tensor& hidden_in, at::Tensor& residual, const at::Tensor& positions,
                        at::TensorList cos_sin, at::TensorList weights, at::IntArrayRef fmts,
                        at::IntArrayRef seg_counts, at::TensorList qkv_bias, at::TensorList k_bufs,
                        at::TensorList v_bufs, at::TensorList k_scales, at::TensorList v_scales,
                        const at::Tensor& out_cache_loc, const c10::optional<at::Tensor>& swa_out_cache_loc,
                        const at::Tensor& kv_slots, const c10::optional<at::Tensor>& swa_kv_slots,
                        const at::Tensor& rows, const at::Tensor& seq_lens, const at::Tensor& q_start,
                        at::IntArrayRef windows, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps,
                        double scaling, double logit_cap, int64_t flags) {
  at::Tensor hidden = hidden_in.contiguous();
  llama_layers_(hidden, residual, positions, cos_sin, weights, fmts, seg_counts, qkv_bias, k_bufs, v_bufs, k_scales,
                v_scales, out_cache_loc, swa_out_cache_loc, kv_slots, swa_kv_slots, rows, seq_lens, q_start, windows,
                num_heads, num_kv_heads, head_dim, eps, scaling, logit_cap, flags);
  return hidden;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("llama_layers(Tensor hidden, Tensor(a!) residual, Tensor positions, Tensor[] cos_sin, Tensor[] weights, "
        "int[] fmts, int[] seg_counts, Tensor[] qkv_bias, Tensor(b!)[] k_bufs, Tensor(c!)[] v_bufs, Tensor(d!)[] k_scales, "
        "Tensor(e!)[] v_scales, Tensor out_cache_loc, Tensor? swa_out_cache_loc, Tensor kv_slots, Tensor? swa_kv_slots, "
        "Tensor rows, Tensor seq_lens, Tensor q_start, int[] windows, int num_heads, int num_kv_heads, int head_dim, "
        "float eps, float scaling, float logit_cap, int flags) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("llama_layers", &llama_layers); }

}  // namespace radixlm
