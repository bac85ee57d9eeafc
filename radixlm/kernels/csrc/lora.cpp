// The LoRA delta of one target layer on CPU: out[t] += (x[t] A_s^T) B_s^T for each token t under
// adapter slot s = slots[t] (-1: the base model, left alone). Every output value is one dot product
// computed by one fixed sequence of operations (an 8-lane FMA chain over k, then one fixed tree over
// the lanes) whatever the batch holds and on every CPU the kernels run on (AVX2 only, no ISA
// switch): a token's delta, and so its logits, do not depend on its neighbours. torch's float GEMM
// (MKL) gave none of this: its sums depend on the row count and on the ISA it picks at run time, and
// on quantized weights the int8 activation grid turns those last-bit differences into different
// tokens downstream.
#include "common.h"

namespace radixlm {
namespace {

// Lane i of the result: v[i]'s eight lanes summed as ((0+1)+(2+3)) + ((4+5)+(6+7)), the same for all i.
inline __m256 hsum8(const __m256* v) {
  const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// dst[i] = rows[i] . v over n values, for the `count` (<= 8) rows of m starting at `first` (row
// stride ld). A group short of 8 repeats its last row, so every value takes the same path; the
// last k-block is masked (zeros add nothing).
inline void dot_rows(const float* m, int64_t ld, int64_t first, int64_t count, const float* v, int64_t n, float* dst) {
  const float* rows[8];
  for (int i = 0; i < 8; ++i) rows[i] = m + (first + (i < count ? i : count - 1)) * ld;
  __m256 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256 x = _mm256_loadu_ps(v + k);
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(rows[i] + k), x, acc[i]);
  }
  if (k < n) {
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - k)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 x = _mm256_maskload_ps(v + k, mask);
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(_mm256_maskload_ps(rows[i] + k, mask), x, acc[i]);
  }
  alignas(32) float sums[8];
  _mm256_store_ps(sums, hsum8(acc));
  for (int64_t i = 0; i < count; ++i) dst[i] = sums[i];
}

constexpr int64_t WORK_PER_TASK = 1 << 15;  // multiply-adds a thread takes at least (smaller: inline)

void lora_delta_(const at::Tensor& x, const at::Tensor& a, const at::Tensor& b, const at::Tensor& slots, at::Tensor& out) {
  TORCH_CHECK(x.dtype() == at::kFloat && out.dtype() == at::kFloat && a.dtype() == at::kFloat && b.dtype() == at::kFloat,
              "lora_delta: x, A, B and out are float32");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && out.dim() == 2 && out.stride(1) == 1,
              "lora_delta: x [tokens, in] and out [tokens, out] with unit column stride");
  TORCH_CHECK(a.dim() == 3 && a.is_contiguous() && b.dim() == 3 && b.is_contiguous() && a.size(0) == b.size(0),
              "lora_delta: A [slots, width, in] and B [slots, out, width], contiguous");
  const int64_t T = x.size(0), in = x.size(1), W = a.size(1), N = b.size(1), S = a.size(0);
  TORCH_CHECK(a.size(2) == in && b.size(2) == W && out.size(0) == T && out.size(1) == N,
              "lora_delta: shapes disagree (x ", x.sizes(), ", A ", a.sizes(), ", B ", b.sizes(), ", out ", out.sizes(), ")");
  TORCH_CHECK(slots.dtype() == at::kLong && slots.dim() == 1 && slots.is_contiguous() && slots.size(0) == T,
              "lora_delta: slots int64 [tokens]");
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) TORCH_CHECK(slot[t] < S, "lora_delta: slot ", slot[t], " of token ", t, " >= ", S);
  if (T == 0 || W == 0) return;
  const float *xp = x.data_ptr<float>(), *ap = a.data_ptr<float>(), *bp = b.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t wg = (W + 7) / 8, ng = (N + 7) / 8;
  // Shrink: s[t] = x[t] A^T (rank blocks, W values per token).
  at::Tensor s_buf = at::empty({T, W}, x.options());
  float* sp = s_buf.data_ptr<float>();
  at::parallel_for(0, T * wg, std::max<int64_t>(1, WORK_PER_TASK / (8 * in)), [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t t = g / wg, j = (g % wg) * 8;
      if (slot[t] < 0) continue;
      dot_rows(ap + slot[t] * W * in, in, j, std::min<int64_t>(8, W - j), xp + t * x.stride(0), in, sp + t * W + j);
    }
  });
  // Expand: out[t] += s[t] B^T, each value rounded once into out.
  at::parallel_for(0, T * ng, std::max<int64_t>(1, WORK_PER_TASK / (8 * W)), [&](int64_t g0, int64_t g1) {
    float delta[8];
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t t = g / ng, o = (g % ng) * 8, count = std::min<int64_t>(8, N - o);
      if (slot[t] < 0) continue;
      dot_rows(bp + slot[t] * N * W, W, o, count, sp + t * W, W, delta);
      float* dst = op + t * out.stride(0) + o;
      for (int64_t i = 0; i < count; ++i) dst[i] += delta[i];
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("lora_delta_(Tensor x, Tensor a, Tensor b, Tensor slots, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("lora_delta_", &lora_delta_); }

}  // namespace radixlm
