// The paged KV pool as the native ops see it: element types, per-slot/per-head rows with any
// strides (CPU pools are stored head-major), int8 scales, and loading 8 values as fp32.
#pragma once
#include "common.h"

namespace radixlm::kv {

enum KVType : int { KV_F32 = 0, KV_F16 = 1, KV_BF16 = 2, KV_I8 = 3 };

inline KVType kv_type(const at::Tensor& buf) {
  switch (buf.scalar_type()) {
    case at::kFloat: return KV_F32;
    case at::kHalf: return KV_F16;
    case at::kBFloat16: return KV_BF16;
    case at::kChar: return KV_I8;
    default: TORCH_CHECK(false, "KV buffer dtype ", buf.scalar_type(), " not supported (float32, float16, bfloat16, int8)");
  }
}

struct Pool {
  const uint8_t* base;
  KVType type;
  int64_t slot_stride, head_stride;  // bytes
  const float* scale;                // int8: [slots, kv_heads]
  int64_t Hkv;
  const void* at(int64_t slot, int64_t h) const { return base + slot * slot_stride + h * head_stride; }
  float scale_at(int64_t slot, int64_t h) const { return scale ? scale[slot * Hkv + h] : 1.0f; }
};

inline Pool make_pool(const at::Tensor& buf, const c10::optional<at::Tensor>& scale, const char* what) {
  // Any strides over slots and heads (the pool stores CPU buffers head-major); a head's row is contiguous.
  TORCH_CHECK(buf.dim() == 3 && buf.stride(2) == 1, what, ": [slots, kv_heads, head_dim] with contiguous rows");
  Pool p{(const uint8_t*)buf.data_ptr(), kv_type(buf), buf.stride(0) * buf.element_size(), buf.stride(1) * buf.element_size(),
         nullptr, buf.size(1)};
  if (p.type == KV_I8) {
    TORCH_CHECK(scale.has_value() && scale->defined() && scale->dtype() == at::kFloat && scale->is_contiguous() &&
                    scale->size(0) == buf.size(0) && scale->numel() == buf.size(0) * buf.size(1),
                what, ": an int8 KV buffer needs float32 scales [slots, kv_heads]");
    p.scale = scale->data_ptr<float>();
  }
  return p;
}

// 8 values of a head vector in the pool's element type, as fp32 (int8: before its scale).
template <int T>
inline __m256 ld8(const void* p, int64_t c) {
  if constexpr (T == KV_F32) {
    return _mm256_loadu_ps((const float*)p + c);
  } else if constexpr (T == KV_F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)p + c)));
  } else if constexpr (T == KV_BF16) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)((const uint16_t*)p + c)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  } else {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)((const int8_t*)p + c))));
  }
}

}  // namespace radixlm::kv
