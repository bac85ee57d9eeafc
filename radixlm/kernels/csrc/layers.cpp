// Every decoder layer of a Llama-family model in one op, for CPU batches whose linear layers are
// single quantized matrices. At batch 1 a step is ~400 small ops, and Python plus the dispatcher
// cost ~10 ms of a ~28 ms step; here they are C++ calls. It calls exactly the kernels the Python
// layers call, in the same order on the same shapes, so its results are bitwise theirs.
#include "api.h"

namespace radixlm {
namespace {

// Per layer, in this order: input_norm, qkv, o, post_norm, gate_up, down (+ qkv_bias if given).
constexpr int64_t PER_LAYER = 6;

void llama_layers_(at::Tensor& hidden, at::Tensor& residual, const at::Tensor& positions, const at::Tensor& cos_sin,
                   at::TensorList weights, at::IntArrayRef fmts, at::TensorList qkv_bias, at::TensorList k_bufs,
                   at::TensorList v_bufs, at::TensorList k_scales, at::TensorList v_scales, const at::Tensor& out_cache_loc,
                   const at::Tensor& kv_slots, const at::Tensor& rows, const at::Tensor& seq_lens, const at::Tensor& q_start,
                   int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double scaling) {
  const int64_t L = k_bufs.size();
  TORCH_CHECK((int64_t)weights.size() == L * PER_LAYER && (int64_t)fmts.size() == L * 4,
              "llama_layers: ", PER_LAYER, " weights and 4 formats per layer");
  TORCH_CHECK(v_bufs.size() == k_bufs.size() && k_scales.size() == v_scales.size() &&
                  (k_scales.empty() || (int64_t)k_scales.size() == L) && (qkv_bias.empty() || (int64_t)qkv_bias.size() == L),
              "llama_layers: per-layer lists disagree");
  TORCH_CHECK(hidden.dim() == 2 && hidden.is_contiguous() && residual.sizes() == hidden.sizes(),
              "llama_layers: hidden and residual [tokens, hidden]");
  const int64_t T = hidden.size(0), qs = num_heads * head_dim, kvs = num_kv_heads * head_dim;
  auto opt = [](at::TensorList l, int64_t i) -> c10::optional<at::Tensor> {
    return l.empty() ? c10::nullopt : c10::optional<at::Tensor>(l[i]);
  };
  auto linear = [&](const at::Tensor& x, int64_t i, int64_t which, const c10::optional<at::Tensor>& bias) {
    const at::Tensor& w = weights[i * PER_LAYER + which];
    static constexpr int64_t fmt_slot[PER_LAYER] = {-1, 0, 1, -1, 2, 3};
    const int64_t fmt = fmts[i * 4 + fmt_slot[which]];
    at::Tensor out = at::empty({T, w.size(0) * fmt_group(fmt)}, x.options());
    api::qlinear_out(x, w, fmt, bias, out);
    return out;
  };
  const auto plan = plan_attention(kv_slots, rows, seq_lens, q_start, num_kv_heads, num_heads / num_kv_heads);
  for (int64_t i = 0; i < L; ++i) {
    const at::Tensor* w = &weights[i * PER_LAYER];
    if (i == 0) {  // the first norm has no residual to add: the stream starts as the embedding
      residual.copy_(hidden);
      hidden = api::rmsnorm(residual, w[0], eps);
    } else {
      api::add_rmsnorm_(hidden, residual, w[0], eps);
    }
    at::Tensor qkv = linear(hidden, i, 1, opt(qkv_bias, i));
    at::Tensor q = qkv.narrow(1, 0, qs), k = qkv.narrow(1, qs, kvs), v = qkv.narrow(1, qs + kvs, kvs);
    api::rotary_embedding_(positions, q, k, head_dim, cos_sin);
    at::Tensor k3 = k.view({T, num_kv_heads, head_dim}), v3 = v.view({T, num_kv_heads, head_dim});
    at::Tensor kb = k_bufs[i], vb = v_bufs[i];
    api::kv_store_(k3, v3, out_cache_loc, kb, vb, opt(k_scales, i), opt(v_scales, i));
    at::Tensor attn = at::empty({T, num_heads, head_dim}, hidden.options());
    api::paged_attention_out(q.view({T, num_heads, head_dim}), kb, vb, opt(k_scales, i), opt(v_scales, i), kv_slots, rows,
                             seq_lens, q_start, scaling, attn, plan.get());
    hidden = linear(attn.view({T, qs}), i, 2, c10::nullopt);
    api::add_rmsnorm_(hidden, residual, w[3], eps);
    hidden = linear(api::silu_and_mul(linear(hidden, i, 4, c10::nullopt)), i, 5, c10::nullopt);
  }
}

// The op returns the last layer's output (hidden is rebound inside) and fills residual in place.
at::Tensor llama_layers(const at::Tensor& hidden_in, at::Tensor& residual, const at::Tensor& positions,
                        const at::Tensor& cos_sin, at::TensorList weights, at::IntArrayRef fmts, at::TensorList qkv_bias,
                        at::TensorList k_bufs, at::TensorList v_bufs, at::TensorList k_scales, at::TensorList v_scales,
                        const at::Tensor& out_cache_loc, const at::Tensor& kv_slots, const at::Tensor& rows,
                        const at::Tensor& seq_lens, const at::Tensor& q_start, int64_t num_heads, int64_t num_kv_heads,
                        int64_t head_dim, double eps, double scaling) {
  at::Tensor hidden = hidden_in.contiguous();
  llama_layers_(hidden, residual, positions, cos_sin, weights, fmts, qkv_bias, k_bufs, v_bufs, k_scales, v_scales,
                out_cache_loc, kv_slots, rows, seq_lens, q_start, num_heads, num_kv_heads, head_dim, eps, scaling);
  return hidden;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("llama_layers(Tensor hidden, Tensor(a!) residual, Tensor positions, Tensor cos_sin, Tensor[] weights, "
        "int[] fmts, Tensor[] qkv_bias, Tensor(b!)[] k_bufs, Tensor(c!)[] v_bufs, Tensor(d!)[] k_scales, "
        "Tensor(e!)[] v_scales, Tensor out_cache_loc, Tensor kv_slots, Tensor rows, Tensor seq_lens, Tensor q_start, "
        "int num_heads, int num_kv_heads, int head_dim, float eps, float scaling) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("llama_layers", &llama_layers); }

}  // namespace radixlm
