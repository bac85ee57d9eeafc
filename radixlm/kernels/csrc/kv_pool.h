// The paged KV pool as the native ops see it: element types, per-slot/per-head rows with any
// strides (CPU pools are stored head-major), int8 / int4 scales, and loading 8 values as fp32.
// int4 (a uint8 buffer of head_dim / 2 bytes per row): 4-bit values (-8..7, kv_store's scale) of K
// and V turned by a normalized Hadamard transform per head first (kv_store), so an outlier channel
// spreads over the row before rounding; attention turns the queries the same way and its outputs
// back (the transform is orthogonal and its own inverse), so scores and outputs are those of the
// unrotated vectors up to rounding.
#pragma once
#include "common.h"

#include <cmath>

namespace radixlm::kv {

enum KVType : int { KV_F32 = 0, KV_F16 = 1, KV_BF16 = 2, KV_I8 = 3, KV_I4 = 4 };

// Element types with a float32 scale per token and head.
constexpr bool scaled(int t) { return t == KV_I8 || t == KV_I4; }

inline KVType kv_type(const at::Tensor& buf) {
  switch (buf.scalar_type()) {
    case at::kFloat: return KV_F32;
    case at::kHalf: return KV_F16;
    case at::kBFloat16: return KV_BF16;
    case at::kChar: return KV_I8;
    case at::kByte: return KV_I4;
    default: TORCH_CHECK(false, "KV buffer dtype ", buf.scalar_type(), " not supported (float32, float16, bfloat16, int8, uint8: int4)");
  }
}

struct Pool {
  const uint8_t* base;
  KVType type;
  int64_t slot_stride, head_stride;  // bytes
  const float* scale;                // int8 / int4: [slots, kv_heads]
  int64_t Hkv;
  const void* at(int64_t slot, int64_t h) const { return base + slot * slot_stride + h * head_stride; }
  float scale_at(int64_t slot, int64_t h) const { return scale ? scale[slot * Hkv + h] : 1.0f; }
};

inline Pool make_pool(const at::Tensor& buf, const c10::optional<at::Tensor>& scale, const char* what) {
  // Any strides over slots and heads (the pool stores CPU buffers head-major); a head's row is contiguous.
  TORCH_CHECK(buf.dim() == 3 && buf.stride(2) == 1, what, ": [slots, kv_heads, head_dim] with contiguous rows");
  Pool p{(const uint8_t*)buf.data_ptr(), kv_type(buf), buf.stride(0) * buf.element_size(), buf.stride(1) * buf.element_size(),
         nullptr, buf.size(1)};
  if (scaled(p.type)) {
    TORCH_CHECK(scale.has_value() && scale->defined() && scale->dtype() == at::kFloat && scale->is_contiguous() &&
                    scale->size(0) == buf.size(0) && scale->numel() == buf.size(0) * buf.size(1),
                what, ": an int8 / int4 KV buffer needs float32 scales [slots, kv_heads]");
    p.scale = scale->data_ptr<float>();
  }
  return p;
}

// head_dim of a pool buffer's rows (int4: two values a byte).
inline int64_t row_dim(const at::Tensor& buf) { return kv_type(buf) == KV_I4 ? 2 * buf.size(2) : buf.size(2); }

// x[0, D) *= the normalized Hadamard matrix (D a power of two): butterflies, then 1 / sqrt(D).
inline void hadamard_(float* x, int64_t D) {
  for (int64_t h = 1; h < D; h *= 2)
    for (int64_t i = 0; i < D; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b, x[j + h] = a - b;
      }
  const float s = 1.0f / std::sqrt((float)D);
  for (int64_t i = 0; i < D; ++i) x[i] *= s;
}

// 8 values of a head vector in the pool's element type, as fp32 (int8 / int4: before its scale).
template <int T>
inline __m256 ld8(const void* p, int64_t c) {
  if constexpr (T == KV_F32) {
    return _mm256_loadu_ps((const float*)p + c);
  } else if constexpr (T == KV_F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)p + c)));
  } else if constexpr (T == KV_BF16) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)((const uint16_t*)p + c)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  } else if constexpr (T == KV_I8) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)((const int8_t*)p + c))));
  } else {  // int4: value 2i in byte i's low nibble, 2i + 1 in its high one, two's complement
    int32_t w;
    std::memcpy(&w, (const uint8_t*)p + c / 2, 4);
    // value k's nibble to the top of lane k, then an arithmetic shift back sign-extends it
    const __m256i top = _mm256_sllv_epi32(_mm256_set1_epi32(w), _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0));
    return _mm256_cvtepi32_ps(_mm256_srai_epi32(top, 28));
  }
}

}  // namespace radixlm::kv
