// Every decoder layer of a Llama-family model in one op, for CPU batches whose linear layers are
// quantized matrices (one or more segments each). At batch 1 a step is ~400 small ops, and Python plus the dispatcher
// cost ~10 ms of a ~28 ms step; here they are C++ calls. It calls exactly the kernels the Python
// layers call, in the same order on the same shapes, so its results are bitwise theirs.
#include "api.h"

namespace radixlm {
namespace {

// Per layer, in this order: input_norm, post_norm, then the quantized segments of qkv, o, gate_up and
// down (seg_counts: 4 per layer; a projection is several segments when its shards differ in format,
// as a Q4_K_M file's Q4_K q/k beside a Q6_K v), one format per segment.
constexpr int64_t PROJS = 4;

void llama_layers_(at::Tensor& hidden, at::Tensor& residual, const at::Tensor& positions, const at::Tensor& cos_sin,
                   at::TensorList weights, at::IntArrayRef fmts, at::IntArrayRef seg_counts, at::TensorList qkv_bias,
                   at::TensorList k_bufs, at::TensorList v_bufs, at::TensorList k_scales, at::TensorList v_scales,
                   const at::Tensor& out_cache_loc, const at::Tensor& kv_slots, const at::Tensor& rows,
                   const at::Tensor& seq_lens, const at::Tensor& q_start, int64_t num_heads, int64_t num_kv_heads,
                   int64_t head_dim, double eps, double scaling) {
  const int64_t L = k_bufs.size();
  int64_t segments = 0;
  for (int64_t c : seg_counts) {
    TORCH_CHECK(c >= 1, "llama_layers: a projection needs a segment");
    segments += c;
  }
  TORCH_CHECK((int64_t)seg_counts.size() == L * PROJS && (int64_t)weights.size() == 2 * L + segments &&
                  (int64_t)fmts.size() == segments,
              "llama_layers: 2 norms per layer, ", PROJS, " segment counts per layer, a format per segment");
  TORCH_CHECK(v_bufs.size() == k_bufs.size() && k_scales.size() == v_scales.size() &&
                  (k_scales.empty() || (int64_t)k_scales.size() == L) && (qkv_bias.empty() || (int64_t)qkv_bias.size() == L),
              "llama_layers: per-layer lists disagree");
  TORCH_CHECK(hidden.dim() == 2 && hidden.is_contiguous() && residual.sizes() == hidden.sizes(),
              "llama_layers: hidden and residual [tokens, hidden]");
  const int64_t T = hidden.size(0), qs = num_heads * head_dim, kvs = num_kv_heads * head_dim;
  auto opt = [](at::TensorList l, int64_t i) -> c10::optional<at::Tensor> {
    return l.empty() ? c10::nullopt : c10::optional<at::Tensor>(l[i]);
  };
  int64_t next_w = 0, next_fmt = 0;  // cursors over weights and fmts, advanced layer by layer
  // One projection: its segments side by side in the output's columns (QuantizedMatrix.matmul's
  // order and operations, so bitwise the Python layer's result).
  auto linear = [&](const at::Tensor& x, int64_t count, const c10::optional<at::Tensor>& bias) {
    int64_t out_rows = 0;
    for (int64_t j = 0; j < count; ++j) out_rows += weights[next_w + j].size(0) * fmt_group(fmts[next_fmt + j]);
    at::Tensor out = at::empty({T, out_rows}, x.options());
    for (int64_t j = 0, start = 0; j < count; ++j) {
      const at::Tensor& w = weights[next_w + j];
      const int64_t fmt = fmts[next_fmt + j], n = w.size(0) * fmt_group(fmt);
      if (count == 1) {
        api::qlinear_out(x, w, fmt, bias, out);
      } else {
        at::Tensor view = out.narrow(1, start, n);
        api::qlinear_out(x, w, fmt, c10::nullopt, view);
      }
      start += n;
    }
    if (count > 1 && bias) out.add_(*bias);
    next_w += count;
    next_fmt += count;
    return out;
  };
  const auto plan = plan_attention(kv_slots, rows, seq_lens, q_start, num_kv_heads, num_heads / num_kv_heads);
  for (int64_t i = 0; i < L; ++i) {
    const at::Tensor& input_norm = weights[next_w];
    const at::Tensor& post_norm = weights[next_w + 1];
    next_w += 2;
    const int64_t* counts = seg_counts.data() + i * PROJS;
    if (i == 0) {  // the first norm has no residual to add: the stream starts as the embedding
      residual.copy_(hidden);
      hidden = api::rmsnorm(residual, input_norm, eps);
    } else {
      api::add_rmsnorm_(hidden, residual, input_norm, eps);
    }
    at::Tensor qkv = linear(hidden, counts[0], opt(qkv_bias, i));
    at::Tensor q = qkv.narrow(1, 0, qs), k = qkv.narrow(1, qs, kvs), v = qkv.narrow(1, qs + kvs, kvs);
    api::rotary_embedding_(positions, q, k, head_dim, cos_sin);
    at::Tensor k3 = k.view({T, num_kv_heads, head_dim}), v3 = v.view({T, num_kv_heads, head_dim});
    at::Tensor kb = k_bufs[i], vb = v_bufs[i];
    api::kv_store_(k3, v3, out_cache_loc, kb, vb, opt(k_scales, i), opt(v_scales, i));
    at::Tensor attn = at::empty({T, num_heads, head_dim}, hidden.options());
    api::paged_attention_out(q.view({T, num_heads, head_dim}), kb, vb, opt(k_scales, i), opt(v_scales, i), kv_slots, rows,
                             seq_lens, q_start, scaling, attn, plan.get());
    hidden = linear(attn.view({T, qs}), counts[1], c10::nullopt);
    api::add_rmsnorm_(hidden, residual, post_norm, eps);
    at::Tensor gate_up = linear(hidden, counts[2], c10::nullopt);
    hidden = linear(api::silu_and_mul(gate_up), counts[3], c10::nullopt);
  }
}

// The op returns the last layer's output (hidden is rebound inside) and fills residual in place.
at::Tensor llama_layers(const at::Tensor& hidden_in, at::Tensor& residual, const at::Tensor& positions,
                        const at::Tensor& cos_sin, at::TensorList weights, at::IntArrayRef fmts,
                        at::IntArrayRef seg_counts, at::TensorList qkv_bias,
                        at::TensorList k_bufs, at::TensorList v_bufs, at::TensorList k_scales, at::TensorList v_scales,
                        const at::Tensor& out_cache_loc, const at::Tensor& kv_slots, const at::Tensor& rows,
                        const at::Tensor& seq_lens, const at::Tensor& q_start, int64_t num_heads, int64_t num_kv_heads,
                        int64_t head_dim, double eps, double scaling) {
  at::Tensor hidden = hidden_in.contiguous();
  llama_layers_(hidden, residual, positions, cos_sin, weights, fmts, seg_counts, qkv_bias, k_bufs, v_bufs, k_scales, v_scales,
                out_cache_loc, kv_slots, rows, seq_lens, q_start, num_heads, num_kv_heads, head_dim, eps, scaling);
  return hidden;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("llama_layers(Tensor hidden, Tensor(a!) residual, Tensor positions, Tensor cos_sin, Tensor[] weights, "
        "int[] fmts, int[] seg_counts, Tensor[] qkv_bias, Tensor(b!)[] k_bufs, Tensor(c!)[] v_bufs, Tensor(d!)[] k_scales, "
        "Tensor(e!)[] v_scales, Tensor out_cache_loc, Tensor kv_slots, Tensor rows, Tensor seq_lens, Tensor q_start, "
        "int num_heads, int num_kv_heads, int head_dim, float eps, float scaling) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("llama_layers", &llama_layers); }

}  // namespace radixlm
