// The recurrences of hybrid models' state layers (model/layers/linear_attn/base.py states the math
// and the layouts): the causal conv1d with its state and Mamba-2's SSD update (recurrent.cpp), the
// gated delta rule (Gated DeltaNet, gated_delta.cpp) and its per-channel-decay form (Kimi Delta
// Attention, kda.cpp), over a varlen batch whose states live in a pool at `rows`. This header holds
// what the files use: the state types and their conversions, the
// inputs' and states' checks, the batch's bookkeeping and the work loop.
//
// The work is split by (request, head, block of state columns or rows): each block is independent
// of the others (a delta rule's column depends only on its own column of the state; an SSD row
// only on its own row). A block is advanced over the request's tokens while it stays in L1 (in place
// for a float32 decode step, which so streams the state once; else through a float32 copy, so a
// bfloat16 or float16 state rounds once per call, at the end). Blocks go to ATen's threads from a
// shared counter, longest requests first (an extend batch mixes lengths).
#pragma once
#include "api.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

// Named namespaces and inline functions, not an anonymous namespace: recurrent.cpp and gated_delta.cpp
// include this both in one unity file and in separate translation units.
namespace radixlm {
namespace linear_attn {  // named: the unity build puts these files beside others' anonymous helpers

enum class SType { F32, BF16, F16 };

inline SType state_type(const at::Tensor& s, const char* what) {
  if (s.scalar_type() == at::kFloat) return SType::F32;
  if (s.scalar_type() == at::kBFloat16) return SType::BF16;
  TORCH_CHECK(s.scalar_type() == at::kHalf, what, ": float32, bfloat16 or float16, got ", s.scalar_type());
  return SType::F16;
}

inline int64_t type_size(SType t) { return t == SType::F32 ? 4 : 2; }

inline float bf16_to_float(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as torch's .to(torch.bfloat16).
inline uint16_t float_to_bf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

inline __m128i float_to_bf16_8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

// n state values at p (type t) -> float32 dst.
inline void state_load(const char* p, SType t, float* dst, int64_t n) {
  int64_t i = 0;
  if (t == SType::F32) {
    std::memcpy(dst, p, n * 4);
  } else if (t == SType::BF16) {
    const uint16_t* s = (const uint16_t*)p;
    for (; i + 8 <= n; i += 8) {
      const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(s + i)));
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < n; ++i) dst[i] = bf16_to_float(s[i]);
  } else {
    const uint16_t* s = (const uint16_t*)p;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(s + i))));
    for (; i < n; ++i) dst[i] = _cvtsh_ss(s[i]);
  }
}

inline void state_store(const float* src, SType t, char* p, int64_t n) {
  int64_t i = 0;
  if (t == SType::F32) {
    std::memcpy(p, src, n * 4);
  } else if (t == SType::BF16) {
    uint16_t* d = (uint16_t*)p;
    for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i*)(d + i), float_to_bf16_8(_mm256_loadu_ps(src + i)));
    for (; i < n; ++i) d[i] = float_to_bf16(src[i]);
  } else {
    uint16_t* d = (uint16_t*)p;
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128((__m128i*)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) d[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
  }
}

// A float32 input [T, H, D] (or [T, H] with D = 0) read through its strides; unit stride in D.
struct In {
  const float* p;
  int64_t st, sh;
  const float* at(int64_t t, int64_t h) const { return p + t * st + h * sh; }
};

inline In input(const at::Tensor& x, int64_t T, int64_t H, int64_t D, const char* what) {
  const bool shape = D ? (x.dim() == 3 && x.size(0) == T && x.size(1) == H && x.size(2) == D && (D == 1 || x.stride(2) == 1))
                       : (x.dim() == 2 && x.size(0) == T && x.size(1) == H);
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu() && shape, what, ": float32 CPU [", T, ", ", H,
              D ? ", " + std::to_string(D) + "] with unit stride in the last dimension" : std::string("]"), ", got ",
              x.scalar_type(), " ", x.sizes());
  return {x.data_ptr<float>(), x.stride(0), x.stride(1)};
}

// A state tensor [slots, d1, d2, d3] whose slot is contiguous (the pool's slot stride is free).
inline void check_state(const at::Tensor& s, int64_t d1, int64_t d2, int64_t d3, const char* what) {
  TORCH_CHECK(s.dim() == 4 && s.size(1) == d1 && s.size(2) == d2 && s.size(3) == d3 && s.device().is_cpu(), what,
              ": expected [slots, ", d1, ", ", d2, ", ", d3, "], got ", s.sizes());
  TORCH_CHECK(s.stride(3) == 1 && s.stride(2) == d3 && s.stride(1) == d2 * d3, what, ": each slot must be contiguous");
}

// The batch: request i's tokens [start[i], start[i] + len[i]) and state slot rows[i]; `order` lists
// the requests longest first.
struct Batch {
  std::vector<int64_t> rows, start, len, order;
};

inline Batch batch(const at::Tensor& rows_, at::IntArrayRef seq_lens, int64_t T, int64_t slots, const char* what) {
  TORCH_CHECK(rows_.dim() == 1 && rows_.numel() == (int64_t)seq_lens.size(), what, ": rows [", seq_lens.size(),
              "] (one per request), got ", rows_.sizes());
  const at::Tensor rows = rows_.to(at::kCPU, at::kLong).contiguous();
  Batch b;
  const int64_t n = rows.numel();
  b.rows.assign(rows.data_ptr<int64_t>(), rows.data_ptr<int64_t>() + n);
  int64_t s = 0;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(b.rows[i] >= 0 && b.rows[i] < slots, what, ": state row ", b.rows[i], " out of range [0, ", slots, ")");
    TORCH_CHECK(seq_lens[i] >= 0, what, ": negative seq_len");
    b.start.push_back(s);
    b.len.push_back(seq_lens[i]);
    s += seq_lens[i];
  }
  TORCH_CHECK(s == T, what, ": seq_lens sum to ", s, " but there are ", T, " tokens");
  b.order.resize(n);
  std::iota(b.order.begin(), b.order.end(), 0);
  std::stable_sort(b.order.begin(), b.order.end(), [&](int64_t x, int64_t y) { return b.len[x] > b.len[y]; });
  return b;
}

// f(item, scratch) for items 0..n-1, from a shared counter on ATen's threads (serially when the
// call is too small to pay for waking them); each thread keeps one scratch buffer.
template <class F>
inline void run_items(int64_t n, bool parallel, const F& f) {
  const int64_t workers = std::min<int64_t>(n, at::get_num_threads());
  if (!parallel || workers <= 1) {
    std::vector<float> scratch;
    for (int64_t i = 0; i < n; ++i) f(i, scratch);
    return;
  }
  std::atomic<int64_t> next{0};
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    std::vector<float> scratch;
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) f(i, scratch);
  });
}

// The delta rules' token steps (gated_delta.cpp, kda.cpp) in AVX-512 where the CPU has it
// (libgcc's check includes the OS saving its state), unless RADIXLM_KERNEL_ISA=avx2;
// linear_attn_isa() switches at run time (tests compare the two). Inline: one flag for both files.
inline bool avx512_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}
inline bool& use_avx512() {
  static bool on = [] {
    const char* env = std::getenv("RADIXLM_KERNEL_ISA");
    return avx512_supported() && !(env && std::string(env) == "avx2");
  }();
  return on;
}

// A state block not in cache yet has rows a state row apart, which the hardware prefetcher follows
// poorly: the delta rules' first pass asks for the rows this far ahead.
inline constexpr int64_t PF_ROWS = 8;

inline constexpr int64_t SERIAL_WORK = 1 << 15;  // multiply-adds below which a call runs on one thread

}  // namespace linear_attn
}  // namespace radixlm
