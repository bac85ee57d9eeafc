// The sampler's argmax over each row of float32 logits (greedy decoding, and the exponential race's
// draw): torch.argmax's answer (the first index of the maximum; a NaN counts as the maximum, the
// first NaN wins) in two vector passes, a long row split over ATen's threads. torch's CPU argmax
// scans one element at a time on one thread: ~210 us for a 248k vocabulary (Qwen3.5's), ~1% of a
// decode step at this machine's faster read rate; here ~20 us.
#include "common.h"

#include <cmath>
#include <limits>
#include <vector>

namespace radixlm {
namespace sampling {  // named: the unity build puts this file beside others' anonymous helpers

struct Best {
  float v;
  int64_t i;
  bool nan;
};

// The first index of [n0, n1)'s maximum (or of its first NaN).
Best scan(const float* x, int64_t n0, int64_t n1) {
  __m256 mx = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 unordered = _mm256_setzero_ps();
  int64_t i = n0;
  for (; i + 8 <= n1; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    mx = _mm256_max_ps(mx, v);
  }
  float m = hmax(mx);
  bool nan = _mm256_movemask_ps(unordered) != 0;
  for (int64_t j = i; j < n1; ++j) {
    nan |= std::isnan(x[j]);
    m = x[j] > m ? x[j] : m;
  }
  if (nan) {
    for (int64_t j = n0; j < n1; ++j)
      if (std::isnan(x[j])) return {x[j], j, true};
  }
  const __m256 mv = _mm256_set1_ps(m);
  for (i = n0; i + 8 <= n1; i += 8) {
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), mv, _CMP_EQ_OQ));
    if (mask) return {m, i + __builtin_ctz(mask), false};
  }
  for (; i < n1; ++i)
    if (x[i] == m) return {m, i, false};
  return {m, n0, false};  // not reached: m is one of the values
}

// A row split in chunks (in order): the earliest NaN, else the greatest value, the earlier on ties.
Best combine(const Best& a, const Best& b) {
  if (a.nan) return a;
  if (b.nan) return b;
  return b.v > a.v ? b : a;
}

// Rows of at least this many values split over the threads (a fork costs more below).
constexpr int64_t SPLIT_MIN = 1 << 16;

at::Tensor argmax_rows(const at::Tensor& logits) {
  TORCH_CHECK(logits.dtype() == at::kFloat && logits.dim() == 2 && logits.size(1) > 0,
              "argmax_rows: logits must be float32 [rows, vocab] with vocab > 0");
  const at::Tensor x = logits.contiguous();
  const int64_t M = x.size(0), V = x.size(1);
  at::Tensor out = at::empty({M}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  const int64_t threads = at::get_num_threads();
  if (M >= threads || V < SPLIT_MIN) {
    at::parallel_for(0, M, V < SPLIT_MIN ? 64 : 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) op[r] = scan(xp + r * V, 0, V).i;
    });
    return out;
  }
  // Fewer rows than threads: each row's chunks (multiples of 8 values) over the threads.
  const int64_t chunk = ((V + threads - 1) / threads + 7) / 8 * 8, parts = (V + chunk - 1) / chunk;
  std::vector<Best> best(M * parts);
  at::parallel_for(0, M * parts, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r = t / parts, c0 = (t % parts) * chunk;
      best[t] = scan(xp + r * V, c0, std::min(V, c0 + chunk));
    }
  });
  for (int64_t r = 0; r < M; ++r) {
    Best b = best[r * parts];
    for (int64_t c = 1; c < parts; ++c) b = combine(b, best[r * parts + c]);
    op[r] = b.i;
  }
  return out;
}

}  // namespace sampling

TORCH_LIBRARY_FRAGMENT(radixlm, m) { m.def("argmax_rows(Tensor logits) -> Tensor"); }

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("argmax_rows", &sampling::argmax_rows); }

}  // namespace radixlm
