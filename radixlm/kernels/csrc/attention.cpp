// Attention straight over the paged KV pool (slots listed by req_to_token), for decode and
// extend alike, and the KV write with its element type (fp32, fp16, bf16, int8 + per-token scale).
//
// Batch invariance: a query's result depends only on its position and the K/V it attends, never on
// how the batch was cut (one extend, chunks, decode steps, other requests beside it). Keys go in
// fixed blocks of 32 anchored at position 0, one online softmax per query in block order, every
// sum in a fixed order; a query never touches keys past its position. The quantized linear layers
// round activations to an int8 grid, so any difference here would be amplified into another token.
#include "api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace radixlm {
namespace {

constexpr int KB = 32;    // keys per block
constexpr int QT = 4;     // query rows per work item (each with all the query heads of a KV head)
constexpr int MAXD = 256;

enum KVType : int { KV_F32 = 0, KV_F16 = 1, KV_BF16 = 2, KV_I8 = 3 };

KVType kv_type(const at::Tensor& buf) {
  switch (buf.scalar_type()) {
    case at::kFloat: return KV_F32;
    case at::kHalf: return KV_F16;
    case at::kBFloat16: return KV_BF16;
    case at::kChar: return KV_I8;
    default: TORCH_CHECK(false, "KV buffer dtype ", buf.scalar_type(), " not supported (float32, float16, bfloat16, int8)");
  }
}

// fp32 head vector -> the pool's element type (round to nearest even; int8: scale = max|x| / 127).
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

Pool make_pool(const at::Tensor& buf, const c10::optional<at::Tensor>& scale, const char* what) {
  TORCH_CHECK(buf.dim() == 3 && buf.is_contiguous(), what, ": contiguous [slots, kv_heads, head_dim]");
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

struct Item {
  int64_t b, h, row0, rows;
};

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

// s[j] = (q . k_j) * scale (* k_j's int8 scale) for the n keys of a block, read in place, 8 keys
// at a time: one 8-lane FMA chain per key (q[0:8] * k[0:8], then an FMA per 8 dims), the 8 chains
// reduced by one fixed hadd tree into the 8 keys' lanes. Past n, lanes read key 0 again, unused.
template <int T>
inline void scores(const float* q, const void* const* kp, const float* ksc, int64_t n, int64_t D, float scale, float* s) {
  const __m256 sc = _mm256_set1_ps(scale);
  for (int64_t j = 0; j < n; j += 8) {
    const void* k[8];
    for (int i = 0; i < 8; ++i) k[i] = kp[j + i < n ? j + i : j];
    const __m256 q0 = _mm256_loadu_ps(q);
    __m256 a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm256_mul_ps(q0, ld8<T>(k[i], 0));
    for (int64_t c = 8; c < D; c += 8) {
      const __m256 qc = _mm256_loadu_ps(q + c);
      for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(qc, ld8<T>(k[i], c), a[i]);
    }
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);  // keys 0-3 | keys 4-7, per 128-bit half
    __m256 r = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
    if constexpr (T == KV_I8) r = _mm256_mul_ps(r, _mm256_load_ps(ksc + j));
    _mm256_store_ps(s + j, _mm256_mul_ps(r, sc));
  }
}

// o = o * alpha + sum_j p_j v_j (p_j times v_j's int8 scale): per element, o * alpha then one FMA
// per key in key order; up to 64 dims at a time so 8 independent chains fill the pipeline.
template <int T>
inline void accumulate_pv(float* o, float alpha, const float* p, const void* const* vp, const float* vsc, int64_t n,
                          int64_t D) {
  const __m256 av = _mm256_set1_ps(alpha);
  for (int64_t c0 = 0; c0 < D; c0 += 64) {
    const int nc = (int)std::min<int64_t>(8, (D - c0) / 8);
    __m256 acc[8];
    for (int c = 0; c < nc; ++c) acc[c] = _mm256_mul_ps(_mm256_loadu_ps(o + c0 + 8 * c), av);
    for (int64_t j = 0; j < n; ++j) {
      const __m256 pj = _mm256_set1_ps(T == KV_I8 ? p[j] * vsc[j] : p[j]);
      if (nc == 8) {
        for (int c = 0; c < 8; ++c) acc[c] = _mm256_fmadd_ps(pj, ld8<T>(vp[j], c0 + 8 * c), acc[c]);
      } else {
        for (int c = 0; c < nc; ++c) acc[c] = _mm256_fmadd_ps(pj, ld8<T>(vp[j], c0 + 8 * c), acc[c]);
      }
    }
    for (int c = 0; c < nc; ++c) _mm256_storeu_ps(o + c0 + 8 * c, acc[c]);
  }
}

struct Args {
  const float* q;
  int64_t q_row_stride, Hq, G, D;
  float* out;
  const int64_t *rtt, *rpi, *sl, *qs;
  int64_t C, slots;
  float scale;
};

// The work items [i0, i1): each is QT query rows x the G query heads of one KV head of a request.
template <int T>
void run_items(const Args& A, const Pool& K, const Pool& V, const std::vector<Item>& items, int64_t i0, int64_t i1) {
  const int64_t G = A.G, D = A.D, NQ = QT * G;
  std::vector<float> o(NQ * D), m(NQ), l(NQ);
  alignas(32) float s[KB], p[KB], ksc[KB], vsc[KB];
  const void* kp[KB];
  const void* vp[KB];
  for (int64_t it = i0; it < i1; ++it) {
    const Item& w = items[it];
    const int64_t n_b = A.qs[w.b + 1] - A.qs[w.b], first_pos = A.sl[w.b] - n_b + w.row0;
    const int64_t last_pos = first_pos + w.rows - 1;
    const int64_t* slots_of = A.rtt + A.rpi[w.b] * A.C;
    const int64_t nq = w.rows * G;
    std::fill(o.begin(), o.begin() + nq * D, 0.0f);
    std::fill(m.begin(), m.begin() + nq, -std::numeric_limits<float>::infinity());
    std::fill(l.begin(), l.begin() + nq, 0.0f);
    for (int64_t j0 = 0; j0 <= last_pos; j0 += KB) {
      const int64_t nk = std::min<int64_t>(KB, last_pos + 1 - j0);
      for (int64_t j = 0; j < nk; ++j) {
        const int64_t slot = slots_of[j0 + j];
        TORCH_CHECK(slot >= 0 && slot < A.slots, "paged_attention: KV slot ", slot, " out of range");
        kp[j] = K.at(slot, w.h);
        vp[j] = V.at(slot, w.h);
        if constexpr (T == KV_I8) ksc[j] = K.scale_at(slot, w.h), vsc[j] = V.scale_at(slot, w.h);
      }
      for (int64_t r = 0; r < w.rows; ++r) {
        const int64_t pos = first_pos + r;
        const int64_t n = std::min<int64_t>(nk, pos + 1 - j0);  // keys this query sees in the block
        if (n <= 0) continue;
        for (int64_t g = 0; g < G; ++g) {
          const int64_t qi = r * G + g;
          const float* qv = A.q + (A.qs[w.b] + w.row0 + r) * A.q_row_stride + (w.h * G + g) * D;
          scores<T>(qv, kp, ksc, n, D, A.scale, s);
          float mb = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < n; ++j) mb = std::max(mb, s[j]);
          const float m_new = std::max(m[qi], mb);
          const float alpha = m[qi] == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(m[qi] - m_new);
          const __m256 mv = _mm256_set1_ps(m_new);
          __m256 psum = _mm256_setzero_ps();
          for (int64_t j = 0; j < KB; j += 8) {
            __m256 e = _mm256_setzero_ps();
            if (j < n) {
              e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
              if (j + 8 > n) {  // keys past the query's position weigh exactly 0
                const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - j)), lane));
                e = _mm256_and_ps(e, keep);
              }
            }
            _mm256_store_ps(p + j, e);
            psum = _mm256_add_ps(psum, e);
          }
          l[qi] = l[qi] * alpha + hsum(psum);
          accumulate_pv<T>(o.data() + qi * D, alpha, p, vp, vsc, n, D);
          m[qi] = m_new;
        }
      }
    }
    for (int64_t r = 0; r < w.rows; ++r)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t qi = r * G + g;
        float* dst = A.out + ((A.qs[w.b] + w.row0 + r) * A.Hq + w.h * G + g) * D;
        const __m256 inv = _mm256_set1_ps(1.0f / l[qi]);
        for (int64_t c = 0; c < D; c += 8) _mm256_storeu_ps(dst + c, _mm256_mul_ps(_mm256_loadu_ps(o.data() + qi * D + c), inv));
      }
  }
}

// q [T, Hq, D] (row stride free), out [T, Hq, D] contiguous. Request b has q rows
// q_start[b] .. q_start[b+1] at positions seq_lens[b] - n_b ... seq_lens[b] - 1 and keys at slots
// req_to_token[req_pool_indices[b], 0 .. seq_lens[b]).
void paged_attention_out(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                         const c10::optional<at::Tensor>& k_scale, const c10::optional<at::Tensor>& v_scale,
                         const at::Tensor& req_to_token, const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                         const at::Tensor& q_start, double scale, at::Tensor& out) {
  TORCH_CHECK(q.dtype() == at::kFloat && q.dim() == 3 && q.stride(2) == 1 && q.stride(1) == q.size(2),
              "paged_attention: q must be float32 [tokens, heads, head_dim] with contiguous heads");
  const int64_t T = q.size(0), Hq = q.size(1), D = q.size(2);
  TORCH_CHECK(out.dtype() == at::kFloat && out.is_contiguous() && out.sizes() == q.sizes(), "paged_attention: out like q, contiguous");
  const Pool K = make_pool(k_buf, k_scale, "k_buf"), V = make_pool(v_buf, v_scale, "v_buf");
  TORCH_CHECK(K.type == V.type && k_buf.sizes() == v_buf.sizes(), "paged_attention: k_buf and v_buf differ");
  const int64_t Hkv = k_buf.size(1), slots = k_buf.size(0);
  TORCH_CHECK(k_buf.size(2) == D && D % 8 == 0 && D <= MAXD, "paged_attention: head_dim ", D, " (pool ", k_buf.size(2),
              ") must match, be a multiple of 8 and at most ", MAXD);
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0, "paged_attention: ", Hq, " query heads over ", Hkv, " KV heads");
  const int64_t G = Hq / Hkv;
  for (const at::Tensor* t : {&req_to_token, &req_pool_indices, &seq_lens, &q_start})
    TORCH_CHECK(t->dtype() == at::kLong && t->is_contiguous() && t->device().is_cpu(), "paged_attention: index tensors are contiguous int64");
  TORCH_CHECK(req_to_token.dim() == 2, "paged_attention: req_to_token [rows, context]");
  const int64_t B = seq_lens.numel(), C = req_to_token.size(1);
  TORCH_CHECK(req_pool_indices.numel() == B && q_start.numel() == B + 1, "paged_attention: batch sizes disagree");
  const int64_t *rtt = req_to_token.data_ptr<int64_t>(), *rpi = req_pool_indices.data_ptr<int64_t>(),
                *sl = seq_lens.data_ptr<int64_t>(), *qs = q_start.data_ptr<int64_t>();
  TORCH_CHECK(qs[0] == 0 && qs[B] == T, "paged_attention: q_start must run from 0 to the number of tokens");
  std::vector<Item> items;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = qs[b + 1] - qs[b];
    TORCH_CHECK(n >= 0 && n <= sl[b] && sl[b] <= C, "paged_attention: request ", b, " has ", n, " queries over ", sl[b], " keys");
    TORCH_CHECK(rpi[b] >= 0 && rpi[b] < req_to_token.size(0), "paged_attention: req_pool_index out of range");
    for (int64_t r = 0; r < n; r += QT)
      for (int64_t h = 0; h < Hkv; ++h) items.push_back({b, h, r, std::min<int64_t>(QT, n - r)});
  }
  // Requests that share a cached prefix share its first slot: run their items for one KV head back
  // to back, so the prefix's K/V is still in cache for the next (the results do not change).
  auto first_slot = [&](const Item& w) { return sl[w.b] > 0 ? rtt[rpi[w.b] * C] : -1; };
  std::stable_sort(items.begin(), items.end(), [&](const Item& x, const Item& y) {
    const int64_t fx = first_slot(x), fy = first_slot(y);
    return fx != fy ? fx < fy : x.h < y.h;
  });
  const Args A{q.data_ptr<float>(), q.stride(0), Hq, G, D, out.data_ptr<float>(), rtt, rpi, sl, qs, C, slots, (float)scale};
  at::parallel_for(0, (int64_t)items.size(), 1, [&](int64_t i0, int64_t i1) {
    switch (K.type) {
      case KV_F32: run_items<KV_F32>(A, K, V, items, i0, i1); break;
      case KV_F16: run_items<KV_F16>(A, K, V, items, i0, i1); break;
      case KV_BF16: run_items<KV_BF16>(A, K, V, items, i0, i1); break;
      case KV_I8: run_items<KV_I8>(A, K, V, items, i0, i1); break;
    }
  });
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                           const c10::optional<at::Tensor>& k_scale, const c10::optional<at::Tensor>& v_scale,
                           const at::Tensor& req_to_token, const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                           const at::Tensor& q_start, double scale) {
  auto out = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
  paged_attention_out(q, k_buf, v_buf, k_scale, v_scale, req_to_token, req_pool_indices, seq_lens, q_start, scale, out);
  return out;
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
  TORCH_CHECK(k_buf.size(1) == H && k_buf.size(2) == D && v_buf.sizes() == k_buf.sizes() && D % 8 == 0,
              "kv_store: pool shape [", slots, ", ", k_buf.size(1), ", ", k_buf.size(2), "] does not fit k [", T, ", ", H, ", ", D, "]");
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
void paged_attention_out(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                         const c10::optional<at::Tensor>& k_scale, const c10::optional<at::Tensor>& v_scale,
                         const at::Tensor& req_to_token, const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                         const at::Tensor& q_start, double scale, at::Tensor& out) {
  radixlm::paged_attention_out(q, k_buf, v_buf, k_scale, v_scale, req_to_token, req_pool_indices, seq_lens, q_start,
                               scale, out);
}
}  // namespace api

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("paged_attention(Tensor q, Tensor k_buf, Tensor v_buf, Tensor? k_scale, Tensor? v_scale, Tensor req_to_token, "
        "Tensor req_pool_indices, Tensor seq_lens, Tensor q_start, float scale) -> Tensor");
  m.def("kv_store_(Tensor k, Tensor v, Tensor loc, Tensor(a!) k_buf, Tensor(b!) v_buf, Tensor(c!)? k_scale, "
        "Tensor(d!)? v_scale) -> ()");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) {
  m.impl("paged_attention", &paged_attention);
  m.impl("kv_store_", &kv_store_);
}

}  // namespace radixlm
