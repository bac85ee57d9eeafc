// Element-wise layers fused into one pass each: at batch 1 every torch op costs a few microseconds
// of dispatch, and RMSNorm (8 ops), RoPE (~12 per tensor) and SiLU*mul (3) run 30-60 times a step.
#include "api.h"

#include <cmath>

namespace radixlm {
namespace {

void check_rows(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.dtype() == at::kFloat && t.dim() == 2 && t.stride(1) == 1, what, ": float32 [rows, cols] with unit column stride");
}

// y = x * rsqrt(mean(x^2) + eps) * w, for one row (y may alias x).
inline void rmsnorm_row(const float* x, const float* w, float* y, int64_t n, float eps) {
  const float r = 1.0f / std::sqrt(sum_squares(x, n) / n + eps);
  int64_t i;
  const __m256 rv = _mm256_set1_ps(r);
  for (i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), rv)));
  for (; i < n; ++i) y[i] = w[i] * (x[i] * r);
}

at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& w, double eps) {
  check_rows(x, "rmsnorm x");
  TORCH_CHECK(w.dtype() == at::kFloat && w.is_contiguous() && w.numel() == x.size(1), "rmsnorm weight: float32 [cols]");
  auto y = at::empty_like(x, at::MemoryFormat::Contiguous);
  const int64_t n = x.size(1);
  at::parallel_for(0, x.size(0), 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      rmsnorm_row(x.data_ptr<float>() + r * x.stride(0), w.data_ptr<float>(), y.data_ptr<float>() + r * n, n, (float)eps);
  });
  return y;
}

// residual += x; x = rmsnorm(residual) * w  (SGLang's fused_add_rmsnorm, in place).
void add_rmsnorm_(at::Tensor& x, at::Tensor& residual, const at::Tensor& w, double eps) {
  check_rows(x, "add_rmsnorm x");
  check_rows(residual, "add_rmsnorm residual");
  TORCH_CHECK(x.sizes() == residual.sizes(), "add_rmsnorm: x and residual shapes differ");
  TORCH_CHECK(w.dtype() == at::kFloat && w.is_contiguous() && w.numel() == x.size(1), "add_rmsnorm weight: float32 [cols]");
  const int64_t n = x.size(1);
  at::parallel_for(0, x.size(0), 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* xr = x.data_ptr<float>() + r * x.stride(0);
      float* rr = residual.data_ptr<float>() + r * residual.stride(0);
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) _mm256_storeu_ps(rr + i, _mm256_add_ps(_mm256_loadu_ps(xr + i), _mm256_loadu_ps(rr + i)));
      for (; i < n; ++i) rr[i] = xr[i] + rr[i];
      rmsnorm_row(rr, w.data_ptr<float>(), xr, n, (float)eps);
    }
  });
}

// [rows, 2d] -> silu(first half) * second half, [rows, d].
at::Tensor silu_and_mul(const at::Tensor& x) {
  check_rows(x, "silu_and_mul x");
  TORCH_CHECK(x.size(1) % 2 == 0, "silu_and_mul: odd width");
  const int64_t d = x.size(1) / 2;
  auto y = at::empty({x.size(0), d}, x.options());
  at::parallel_for(0, x.size(0), 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* g = x.data_ptr<float>() + r * x.stride(0);
      const float* u = g + d;
      float* o = y.data_ptr<float>() + r * d;
      int64_t i = 0;
      for (; i + 8 <= d; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 s = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
      }
      for (; i < d; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  });
  return y;
}

// NeoX-style RoPE (HF rotate_half), in place on the first rotary_dim values of every head of q
// [tokens, q_heads * head_dim] and k [tokens, kv_heads * head_dim] (views into the fused qkv
// output are fine: only the row stride matters). cos_sin: [max_pos, rotary_dim] = cos | sin.
void rotary_embedding_(const at::Tensor& positions, at::Tensor& q, at::Tensor& k, int64_t head_dim,
                       const at::Tensor& cos_sin) {
  check_rows(q, "rotary q");
  check_rows(k, "rotary k");
  TORCH_CHECK(cos_sin.dtype() == at::kFloat && cos_sin.is_contiguous() && cos_sin.dim() == 2, "rotary cos_sin: float32 [max_pos, rot]");
  const at::Tensor pos = positions.to(at::kLong).contiguous();
  const int64_t T = q.size(0), rot = cos_sin.size(1), half = rot / 2, max_pos = cos_sin.size(0);
  TORCH_CHECK(k.size(0) == T && pos.numel() == T, "rotary: q, k and positions disagree on tokens");
  TORCH_CHECK(rot <= head_dim && rot % 2 == 0 && q.size(1) % head_dim == 0 && k.size(1) % head_dim == 0, "rotary: bad head_dim");
  const int64_t* pp = pos.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) TORCH_CHECK(pp[t] >= 0 && pp[t] < max_pos, "rotary: position ", pp[t], " beyond the cache");
  auto rotate = [&](float* x, const float* c, const float* s) {
    int64_t i = 0;
    for (; i + 8 <= half; i += 8) {
      const __m256 x1 = _mm256_loadu_ps(x + i), x2 = _mm256_loadu_ps(x + half + i);
      const __m256 cv = _mm256_loadu_ps(c + i), sv = _mm256_loadu_ps(s + i);
      _mm256_storeu_ps(x + i, _mm256_fmsub_ps(x1, cv, _mm256_mul_ps(x2, sv)));
      _mm256_storeu_ps(x + half + i, _mm256_fmadd_ps(x2, cv, _mm256_mul_ps(x1, sv)));
    }
    for (; i < half; ++i) {
      const float x1 = x[i], x2 = x[half + i];
      x[i] = x1 * c[i] - x2 * s[i];
      x[half + i] = x2 * c[i] + x1 * s[i];
    }
  };
  const int64_t qh = q.size(1) / head_dim, kh = k.size(1) / head_dim;
  at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* c = cos_sin.data_ptr<float>() + pp[t] * rot;
      const float* s = c + half;
      for (int64_t h = 0; h < qh; ++h) rotate(q.data_ptr<float>() + t * q.stride(0) + h * head_dim, c, s);
      for (int64_t h = 0; h < kh; ++h) rotate(k.data_ptr<float>() + t * k.stride(0) + h * head_dim, c, s);
    }
  });
}

}  // namespace

namespace api {
at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& w, double eps) { return radixlm::rmsnorm(x, w, eps); }
void add_rmsnorm_(at::Tensor& x, at::Tensor& residual, const at::Tensor& w, double eps) {
  radixlm::add_rmsnorm_(x, residual, w, eps);
}
at::Tensor silu_and_mul(const at::Tensor& x) { return radixlm::silu_and_mul(x); }
void rotary_embedding_(const at::Tensor& positions, at::Tensor& q, at::Tensor& k, int64_t head_dim,
                       const at::Tensor& cos_sin) {
  radixlm::rotary_embedding_(positions, q, k, head_dim, cos_sin);
}
}  // namespace api

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("rmsnorm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rmsnorm_(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()");
  m.def("silu_and_mul(Tensor x) -> Tensor");
  m.def("rotary_embedding_(Tensor positions, Tensor(a!) q, Tensor(b!) k, int head_dim, Tensor cos_sin) -> ()");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) {
  m.impl("rmsnorm", &rmsnorm);
  m.impl("add_rmsnorm_", &add_rmsnorm_);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("rotary_embedding_", &rotary_embedding_);
}

}  // namespace radixlm
