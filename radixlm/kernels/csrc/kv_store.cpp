// The KV write: float32 K/V of new tokens into the pool's slots, converted to its element type
// (fp32, fp16, bf16, int8 / int4 with a per-token, per-head scale; int4 turned by kv_pool.h's
// Hadamard transform first, its scale chosen by i4_scale).
#include "api.h"
#include "kv_pool.h"

#include <algorithm>

namespace radixlm {
namespace {
using namespace kv;

// fp32 head vector -> the pool's element type (round to nearest even; int8: scale = max|x| / 127;
// int4: of the turned vector, values -8..7 as two's complement nibbles, the scale i4_scale's).
constexpr int64_t MAX_I4_DIM = 512;

// The int4 row's scale: the largest-magnitude value x_m maps to -8 (scale = x_m / -8, so the 16th
// level is used: q4_0's rule), then the scale shrunk by each of I4_SHRINK is tried and the one with
// the least squared error kept: clipping the few largest values buys finer steps for the rest
// (on the default model's K / V rows, turned: relative error 1.03% with max / 7, 0.81% with
// q4_0's rule, 0.74% with this search; docs/benchmarks.md).
constexpr float I4_SHRINK[] = {1.0f, 0.95f, 0.9f, 0.85f, 0.8f, 0.75f, 0.7f, 0.65f};

// The squared error of rounding y[0, D) (D a multiple of 8) to -8..7 steps of s: 8 lanes at a time,
// so the search adds little to a long prefill's KV writes (every row of every layer).
inline float i4_sq_error(const float* y, int64_t D, float s) {
  const __m256 inv = _mm256_set1_ps(1.0f / s), step = _mm256_set1_ps(s);
  const __m256 lo = _mm256_set1_ps(-8.0f), hi = _mm256_set1_ps(7.0f);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < D; i += 8) {
    const __m256 v = _mm256_loadu_ps(y + i);
    const __m256 r = _mm256_round_ps(_mm256_mul_ps(v, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 d = _mm256_fnmadd_ps(_mm256_min_ps(hi, _mm256_max_ps(lo, r)), step, v);
    acc = _mm256_fmadd_ps(d, d, acc);
  }
  return hsum(acc);
}

inline float i4_scale(const float* y, int64_t D) {
  float m = 0.0f;
  for (int64_t i = 0; i < D; ++i)
    if (std::fabs(y[i]) > std::fabs(m)) m = y[i];
  if (m == 0.0f) return 0.0f;
  float best = 0.0f, best_e = INFINITY;
  for (const float f : I4_SHRINK) {
    const float s = m / -8.0f * f, e = i4_sq_error(y, D, s);
    if (e < best_e) best = s, best_e = e;
  }
  return best;
}

inline void from_f32(KVType t, const float* x, void* dst, float* scale, int64_t D) {
  switch (t) {
    case KV_F32:
      std::memcpy(dst, x, D * 4);
      break;
    case KV_F16:
      for (int64_t i = 0; i < D; i += 8)
        _mm_storeu_si128((__m128i*)((uint16_t*)dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
      break;
    case KV_BF16: {
      uint16_t* o = (uint16_t*)dst;
      for (int64_t i = 0; i < D; ++i) {
        uint32_t u;
        std::memcpy(&u, x + i, 4);
        if ((u & 0x7fffffff) > 0x7f800000) {  // NaN stays NaN
          o[i] = (uint16_t)((u >> 16) | 0x40);
        } else {
          o[i] = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
        }
      }
      break;
    }
    case KV_I8: {
      const __m256 sign = _mm256_set1_ps(-0.0f);
      __m256 amax = _mm256_setzero_ps();
      for (int64_t i = 0; i < D; i += 8) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
      const float m = hmax(amax);
      *scale = m / 127.0f;
      const __m256 inv = _mm256_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
      int8_t* o = (int8_t*)dst;
      for (int64_t i = 0; i < D; i += 8) {
        alignas(32) int32_t q[8];
        _mm256_store_si256((__m256i*)q, _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv)));
        for (int l = 0; l < 8; ++l) o[i + l] = (int8_t)std::max(-127, std::min(127, q[l]));
      }
      break;
    }
    case KV_I4: {
      alignas(32) float y[MAX_I4_DIM];
      std::memcpy(y, x, D * 4);
      hadamard_(y, D);
      *scale = i4_scale(y, D);
      const float inv = *scale != 0.0f ? 1.0f / *scale : 0.0f;
      uint8_t* o = (uint8_t*)dst;
      for (int64_t i = 0; i < D; i += 2) {
        const int lo = std::max(-8, std::min(7, (int)std::nearbyint(y[i] * inv)));
        const int hi = std::max(-8, std::min(7, (int)std::nearbyint(y[i + 1] * inv)));
        o[i / 2] = (uint8_t)((lo & 15) | ((hi & 15) << 4));  // two's complement nibbles
      }
      break;
    }
  }
}

// k_buf[loc[t]] = k[t] (and v), converted to the pool's element type; int8 also stores the scale.
void kv_store_(const at::Tensor& k, const at::Tensor& v, const at::Tensor& loc_, at::Tensor& k_buf, at::Tensor& v_buf,
               const c10::optional<at::Tensor>& k_scale, const c10::optional<at::Tensor>& v_scale) {
  for (const at::Tensor* t : {&k, &v})
    TORCH_CHECK(t->dtype() == at::kFloat && t->dim() == 3 && t->stride(2) == 1 && t->stride(1) == t->size(2),
                "kv_store: k and v must be float32 [tokens, kv_heads, head_dim] with contiguous heads");
  TORCH_CHECK(k.sizes() == v.sizes(), "kv_store: k and v shapes differ");
  const Pool K = make_pool(k_buf, k_scale, "k_buf"), V = make_pool(v_buf, v_scale, "v_buf");
  const int64_t T = k.size(0), H = k.size(1), D = k.size(2), slots = k_buf.size(0);
  TORCH_CHECK(k_buf.size(1) == H && row_dim(k_buf) == D && v_buf.sizes() == k_buf.sizes() && K.type == V.type && D % 8 == 0,
              "kv_store: pool shape [", slots, ", ", k_buf.size(1), ", ", k_buf.size(2), "] does not fit k [", T, ", ", H, ", ", D, "]");
  TORCH_CHECK(K.type != KV_I4 || ((D & (D - 1)) == 0 && D <= MAX_I4_DIM),
              "kv_store: an int4 KV cache needs a power-of-two head_dim of at most ", MAX_I4_DIM, ", got ", D);
  const at::Tensor loc = loc_.to(at::kLong).contiguous();
  TORCH_CHECK(loc.numel() == T, "kv_store: ", loc.numel(), " slots for ", T, " tokens");
  const int64_t* lp = loc.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) TORCH_CHECK(lp[t] >= 0 && lp[t] < slots, "kv_store: slot ", lp[t], " out of range");
  uint8_t* kb = (uint8_t*)k_buf.data_ptr();
  uint8_t* vb = (uint8_t*)v_buf.data_ptr();
  float* ks = K.scale ? const_cast<float*>(K.scale) : nullptr;
  float* vs = V.scale ? const_cast<float*>(V.scale) : nullptr;
  at::parallel_for(0, T, 64, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t s = lp[t];
        from_f32(K.type, k.data_ptr<float>() + t * k.stride(0) + h * D, kb + s * K.slot_stride + h * K.head_stride,
                 ks ? ks + s * H + h : nullptr, D);
        from_f32(V.type, v.data_ptr<float>() + t * v.stride(0) + h * D, vb + s * V.slot_stride + h * V.head_stride,
                 vs ? vs + s * H + h : nullptr, D);
      }
  });
}

}  // namespace

namespace api {
void kv_store_(const at::Tensor& k, const at::Tensor& v, const at::Tensor& loc, at::Tensor& k_buf, at::Tensor& v_buf,
               const c10::optional<at::Tensor>& k_scale, const c10::optional<at::Tensor>& v_scale) {
  radixlm::kv_store_(k, v, loc, k_buf, v_buf, k_scale, v_scale);
}
}  // namespace api

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("kv_store_(Tensor k, Tensor v, Tensor loc, Tensor(a!) k_buf, Tensor(b!) v_buf, Tensor(c!)? k_scale, "
        "Tensor(d!)? v_scale) -> ()");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("kv_store_", &kv_store_); }

}  // namespace radixlm
