// Gated DeltaNet's small per-token steps fused around its recurrence (at batch 1 each torch op
// costs more in dispatch than in arithmetic, ~10 of them per layer):
//   gated_delta_rule_gated: beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias), q and k
//     l2-normalized (q then times Dk^-0.5), then gated_delta.cpp's gated delta rule, its value heads
//     reading the key heads grouped (h / (Hv / Hk)) or tiled (h % Hk) without repeating q and k;
//   gated_rmsnorm: each row RMS-normalized, times weight, times silu(z) (the layer's output norm).
// Both in float32, as model/layers/linear_attn/base.py's torch defaults state them.
#include "recurrent.h"

#include <cmath>

namespace radixlm {
namespace linear_attn {

// gated_delta.cpp: the gated delta rule over prepared q, k (normalized), g and beta.
at::Tensor gated_delta_rule_run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                const at::Tensor& beta, at::Tensor& ssm_state, const at::Tensor& rows,
                                at::IntArrayRef seq_lens, bool tiled);

namespace {

// dst = x * rsqrt(sum(x^2) + 1e-6) * scale over n values (HF's l2norm, then the query's scale).
inline void l2norm_row(const float* x, float* dst, int64_t n, float scale, bool scaled) {
  const float r = 1.0f / std::sqrt(sum_squares(x, n) + 1e-6f);
  int64_t i;
  const __m256 rv = _mm256_set1_ps(r), sv = _mm256_set1_ps(scale);
  for (i = 0; i + 8 <= n; i += 8) {
    __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x + i), rv);
    if (scaled) y = _mm256_mul_ps(y, sv);
    _mm256_storeu_ps(dst + i, y);
  }
  for (; i < n; ++i) dst[i] = scaled ? x[i] * r * scale : x[i] * r;
}

inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }  // torch's threshold

at::Tensor gated_delta_rule_gated(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                                  const at::Tensor& b, const at::Tensor& a_log, const at::Tensor& dt_bias,
                                  at::Tensor& ssm_state, const at::Tensor& rows, at::IntArrayRef seq_lens, bool tiled) {
  TORCH_CHECK(q.dim() == 3 && v.dim() == 3, "gated_delta_rule_gated: q [T, Hk, Dk], v [T, Hv, Dv]");
  const int64_t T = q.size(0), Hk = q.size(1), Dk = q.size(2), Hv = v.size(1);
  TORCH_CHECK(Hk > 0 && Hv % Hk == 0, "gated_delta_rule_gated: ", Hv, " value heads over ", Hk, " key heads");
  const In qi = input(q, T, Hk, Dk, "gated_delta_rule_gated q"), ki = input(k, T, Hk, Dk, "gated_delta_rule_gated k");
  const In ai = input(a, T, Hv, 0, "gated_delta_rule_gated a"), bi = input(b, T, Hv, 0, "gated_delta_rule_gated b");
  for (const at::Tensor* p : {&a_log, &dt_bias})
    TORCH_CHECK(p->scalar_type() == at::kFloat && p->dim() == 1 && p->numel() == Hv && p->is_contiguous(),
                "gated_delta_rule_gated: a_log and dt_bias float32 [", Hv, "], got ", p->sizes());
  // One buffer: q and k normalized [T, Hk, Dk] each, then g and beta [T, Hv] each.
  const int64_t nq = T * Hk * Dk, ng = T * Hv;
  at::Tensor buf = at::empty({2 * nq + 2 * ng}, q.options().memory_format(at::MemoryFormat::Contiguous));
  float* qn = buf.data_ptr<float>();
  float *kn = qn + nq, *g = kn + nq, *beta = g + ng;
  const float* al = a_log.data_ptr<float>();
  const float* dtb = dt_bias.data_ptr<float>();
  const float scale = 1.0f / std::sqrt((float)Dk);
  auto prep = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t h = 0; h < Hk; ++h) {
        l2norm_row(qi.at(t, h), qn + (t * Hk + h) * Dk, Dk, scale, true);
        l2norm_row(ki.at(t, h), kn + (t * Hk + h) * Dk, Dk, 1.0f, false);
      }
      for (int64_t h = 0; h < Hv; ++h) {
        g[t * Hv + h] = -std::exp(al[h]) * softplus(*ai.at(t, h) + dtb[h]);
        beta[t * Hv + h] = 1.0f / (1.0f + std::exp(-*bi.at(t, h)));
      }
    }
  };
  if (T * Hk * Dk > SERIAL_WORK)
    at::parallel_for(0, T, 1, prep);
  else
    prep(0, T);
  const at::Tensor qt = buf.narrow(0, 0, nq).view({T, Hk, Dk}), kt = buf.narrow(0, nq, nq).view({T, Hk, Dk});
  const at::Tensor gt = buf.narrow(0, 2 * nq, ng).view({T, Hv}), bt = buf.narrow(0, 2 * nq + ng, ng).view({T, Hv});
  return gated_delta_rule_run(qt, kt, v, gt, bt, ssm_state, rows, seq_lens, tiled);
}

// y = (weight * (x * rsqrt(mean(x^2) + eps))) * silu(z) per row of D; x, z [N, D] or [N, H, D]
// (any strides but a unit one in D). -> y contiguous, x's shape.
at::Tensor gated_rmsnorm(const at::Tensor& x, const at::Tensor& z, const at::Tensor& weight, double eps) {
  TORCH_CHECK((x.dim() == 2 || x.dim() == 3) && x.sizes() == z.sizes(), "gated_rmsnorm: x and z [N, D] or [N, H, D] alike, got ",
              x.sizes(), " and ", z.sizes());
  const int64_t D = x.size(-1);
  TORCH_CHECK(x.scalar_type() == at::kFloat && z.scalar_type() == at::kFloat && x.device().is_cpu() && z.device().is_cpu() &&
                  x.stride(-1) == 1 && z.stride(-1) == 1,
              "gated_rmsnorm: float32 CPU x and z with unit stride in the last dimension");
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.is_contiguous() && weight.numel() == D,
              "gated_rmsnorm weight: float32 [", D, "]");
  const int64_t N = x.size(0), H = x.dim() == 3 ? x.size(1) : 1;
  const int64_t xs0 = x.stride(0), xs1 = x.dim() == 3 ? x.stride(1) : 0;
  const int64_t zs0 = z.stride(0), zs1 = z.dim() == 3 ? z.stride(1) : 0;
  auto y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  const float *xp = x.data_ptr<float>(), *zp = z.data_ptr<float>(), *w = weight.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const float e = (float)eps;
  auto rows = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r / H * xs0 + r % H * xs1;
      const float* zr = zp + r / H * zs0 + r % H * zs1;
      float* yr = yp + r * D;
      const float inv = 1.0f / std::sqrt(sum_squares(xr, D) / D + e);
      int64_t i;
      const __m256 iv = _mm256_set1_ps(inv), one = _mm256_set1_ps(1.0f);
      for (i = 0; i + 8 <= D; i += 8) {
        const __m256 zv = _mm256_loadu_ps(zr + i);
        const __m256 s = _mm256_div_ps(zv, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), zv))));
        const __m256 n = _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(xr + i), iv));
        _mm256_storeu_ps(yr + i, _mm256_mul_ps(n, s));
      }
      for (; i < D; ++i) yr[i] = w[i] * (xr[i] * inv) * (zr[i] / (1.0f + std::exp(-zr[i])));
    }
  };
  if (N * H * D > SERIAL_WORK)
    at::parallel_for(0, N * H, 16, rows);
  else
    rows(0, N * H);
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("gated_delta_rule_gated(Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor a_log, Tensor dt_bias, "
        "Tensor(a!) ssm_state, Tensor rows, int[] seq_lens, bool tiled) -> Tensor");
  m.def("gated_rmsnorm(Tensor x, Tensor z, Tensor weight, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) {
  m.impl("gated_delta_rule_gated", &gated_delta_rule_gated);
  m.impl("gated_rmsnorm", &gated_rmsnorm);
}

}  // namespace linear_attn

namespace api {
at::Tensor gated_delta_rule_gated(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                                  const at::Tensor& b, const at::Tensor& a_log, const at::Tensor& dt_bias,
                                  at::Tensor& ssm_state, const at::Tensor& rows, at::IntArrayRef seq_lens, bool tiled) {
  return linear_attn::gated_delta_rule_gated(q, k, v, a, b, a_log, dt_bias, ssm_state, rows, seq_lens, tiled);
}
at::Tensor gated_rmsnorm(const at::Tensor& x, const at::Tensor& z, const at::Tensor& weight, double eps) {
  return linear_attn::gated_rmsnorm(x, z, weight, eps);
}
}  // namespace api
}  // namespace radixlm
