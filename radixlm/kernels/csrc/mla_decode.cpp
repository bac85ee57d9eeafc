// Absorbed multi-head latent attention decode (DeepSeek-V2/V3): every head of a request attends
// the request's latent vectors [c_kv | k_pe] (one per token, the MLA pool's layout) with its
// absorbed query [q_nope @ W_UK | q_pe]; the output is the softmax-weighted sum of the c_kv parts.
// A block of latent rows is read from the pool (any element type) and converted to fp32 once, then
// every head uses it while it is in cache: the pool is read once per step for all heads, where
// per-head K/V would be read heads times. Long sequences are split into pieces run in parallel and
// merged (flash-decoding), so one request still uses every core.
#include "api.h"
#include "kv_pool.h"

#include <cmath>
#include <limits>
#include <vector>

namespace radixlm {
namespace {
using namespace kv;

constexpr int64_t BLK = 32;     // latent rows converted to fp32 at a time
constexpr int64_t SPLIT = 256;  // keys per work item

template <int T>
inline void load_row(const void* src, float* dst, int64_t D) {
  for (int64_t c = 0; c < D; c += 8) _mm256_storeu_ps(dst + c, ld8<T>(src, c));
}

inline void scale_add(float* y, float a, const float* x, float keep, int64_t n) {  // y = keep * y + a * x
  const __m256 va = _mm256_set1_ps(a), vk = _mm256_set1_ps(keep);
  for (int64_t c = 0; c < n; c += 8)
    _mm256_storeu_ps(y + c, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + c), _mm256_mul_ps(vk, _mm256_loadu_ps(y + c))));
}

struct Item {
  int64_t b, k0, k1;
};

// Four dot products of one query with four rows: independent accumulators (one chain would wait
// on each FMA's latency) and the query loaded once.
inline void dot4(const float* q, const float* r, int64_t D, float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t c = 0; c < D; c += 8) {
    const __m256 x = _mm256_loadu_ps(q + c);
    a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(r + c), a0);
    a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(r + D + c), a1);
    a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(r + 2 * D + c), a2);
    a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(r + 3 * D + c), a3);
  }
  out[0] = hsum(a0), out[1] = hsum(a1), out[2] = hsum(a2), out[3] = hsum(a3);
}

// y = keep * y + sum_j p[j] * rows[j][:n] over n_rows rows (stride D): y is loaded and stored once.
inline void accumulate(float* y, float keep, const float* p, const float* rows, int64_t n_rows, int64_t D, int64_t n) {
  const __m256 vk = _mm256_set1_ps(keep);
  for (int64_t c = 0; c < n; c += 8) {
    __m256 acc = _mm256_mul_ps(vk, _mm256_loadu_ps(y + c));
    for (int64_t j = 0; j < n_rows; ++j) acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(rows + j * D + c), acc);
    _mm256_storeu_ps(y + c, acc);
  }
}

// Keys [k0, k1) of one request: running max m[h], sum l[h] and unnormalized output acc[h][R].
template <int T>
void run_item(const float* q, const uint8_t* base, int64_t slot_stride, const int64_t* idx, const Item& it,
              int64_t H, int64_t D, int64_t R, float scale, float* m, float* l, float* acc) {
  std::vector<float> rows(BLK * D), s(BLK);
  std::fill(m, m + H, -std::numeric_limits<float>::infinity());
  std::fill(l, l + H, 0.0f);
  std::fill(acc, acc + H * R, 0.0f);
  for (int64_t kb = it.k0; kb < it.k1; kb += BLK) {
    const int64_t n = std::min(BLK, it.k1 - kb);
    for (int64_t j = 0; j < n; ++j) load_row<T>(base + idx[kb + j] * slot_stride, rows.data() + j * D, D);
    for (int64_t j = n; j < ((n + 3) & ~int64_t(3)); ++j) std::fill(rows.data() + j * D, rows.data() + (j + 1) * D, 0.0f);
    for (int64_t h = 0; h < H; ++h) {
      float mx = m[h];
      for (int64_t j = 0; j < n; j += 4) dot4(q + h * D, rows.data() + j * D, D, s.data() + j);
      for (int64_t j = 0; j < n; ++j) {
        s[j] *= scale;
        mx = std::max(mx, s[j]);
      }
      const float corr = std::isinf(m[h]) ? 0.0f : std::exp(m[h] - mx);
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        s[j] = std::exp(s[j] - mx);
        sum += s[j];
      }
      l[h] = l[h] * corr + sum;
      accumulate(acc + h * R, corr, s.data(), rows.data(), n, D, R);
      m[h] = mx;
    }
  }
}

// q_lat [B, H, D] float32; latent_buf [slots, D] (rows contiguous; f32/f16/bf16); kv_indices [B, L]
// int64 (row b's first lens[b] are its slots); -> [B, H, R] float32, R = kv_lora_rank.
at::Tensor mla_decode(const at::Tensor& q, const at::Tensor& buf, const at::Tensor& kv_indices, const at::Tensor& lens,
                      int64_t R, double scale) {
  TORCH_CHECK(q.dtype() == at::kFloat && q.dim() == 3 && q.is_contiguous(), "mla_decode: q must be float32 [B, H, D], contiguous");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  TORCH_CHECK(buf.dim() == 2 && buf.size(1) == D && buf.stride(1) == 1, "mla_decode: latent_buf must be [slots, D] with contiguous rows");
  TORCH_CHECK(D % 8 == 0 && R % 8 == 0 && 0 < R && R <= D, "mla_decode: D and kv_lora_rank must be multiples of 8, R <= D");
  TORCH_CHECK(kv_indices.dtype() == at::kLong && kv_indices.dim() == 2 && kv_indices.size(0) == B && kv_indices.is_contiguous(),
              "mla_decode: kv_indices must be int64 [B, L], contiguous");
  TORCH_CHECK(lens.dtype() == at::kLong && lens.numel() == B && lens.is_contiguous(), "mla_decode: lens must be int64 [B]");
  const KVType type = kv_type(buf.view({buf.size(0), 1, D}));
  TORCH_CHECK(!scaled(type), "mla_decode: an int8 / int4 latent pool is not supported");
  const int64_t L = kv_indices.size(1), slots = buf.size(0);
  const int64_t* idx = kv_indices.data_ptr<int64_t>();
  const int64_t* ln = lens.data_ptr<int64_t>();
  std::vector<Item> items;
  std::vector<int64_t> first(B + 1);
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(ln[b] > 0 && ln[b] <= L, "mla_decode: lens[", b, "] = ", ln[b], " outside 1..", L);
    for (int64_t k = 0; k < ln[b]; ++k)
      TORCH_CHECK(idx[b * L + k] >= 0 && idx[b * L + k] < slots, "mla_decode: slot out of range");
    first[b] = (int64_t)items.size();
    for (int64_t k0 = 0; k0 < ln[b]; k0 += SPLIT) items.push_back({b, k0, std::min(ln[b], k0 + SPLIT)});
  }
  first[B] = (int64_t)items.size();
  const int64_t n_items = (int64_t)items.size();
  std::vector<float> pm(n_items * H), pl(n_items * H), pacc(n_items * H * R);
  const uint8_t* base = (const uint8_t*)buf.data_ptr();
  const int64_t slot_stride = buf.stride(0) * buf.element_size();
  const float* qp = q.data_ptr<float>();
  at::parallel_for(0, n_items, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const Item& it = items[i];
      const float* qb = qp + it.b * H * D;
      float *m = pm.data() + i * H, *l = pl.data() + i * H, *a = pacc.data() + i * H * R;
      const int64_t* ib = idx + it.b * L;
      switch (type) {
        case KV_F32: run_item<KV_F32>(qb, base, slot_stride, ib, it, H, D, R, (float)scale, m, l, a); break;
        case KV_F16: run_item<KV_F16>(qb, base, slot_stride, ib, it, H, D, R, (float)scale, m, l, a); break;
        default: run_item<KV_BF16>(qb, base, slot_stride, ib, it, H, D, R, (float)scale, m, l, a); break;
      }
    }
  });
  at::Tensor out = at::empty({B, H, R}, q.options());
  float* op = out.data_ptr<float>();
  at::parallel_for(0, B, 1, [&](int64_t lo, int64_t hi) {  // merge each request's pieces
    for (int64_t b = lo; b < hi; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        float M = -std::numeric_limits<float>::infinity(), sum = 0.0f;
        for (int64_t i = first[b]; i < first[b + 1]; ++i) M = std::max(M, pm[i * H + h]);
        float* o = op + (b * H + h) * R;
        std::fill(o, o + R, 0.0f);
        for (int64_t i = first[b]; i < first[b + 1]; ++i) {
          const float w = std::exp(pm[i * H + h] - M);
          sum += w * pl[i * H + h];
          scale_add(o, w, pacc.data() + (i * H + h) * R, 1.0f, R);
        }
        const float inv = 1.0f / sum;
        for (int64_t c = 0; c < R; ++c) o[c] *= inv;
      }
    }
  });
  return out;
}

}  // namespace
}  // namespace radixlm

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("mla_decode(Tensor q_lat, Tensor latent_buf, Tensor kv_indices, Tensor lens, int kv_lora_rank, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("mla_decode", &radixlm::mla_decode); }
