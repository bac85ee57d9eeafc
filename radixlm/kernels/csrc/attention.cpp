// Attention straight over the paged KV pool (slots listed by req_to_token), for decode and
// extend alike, over every KV element type (fp32, fp16, bf16, int8 / int4 + per-token scale; int4's
// rows are Hadamard-turned: the queries are turned the same way and the outputs back, kv_pool.h).
//
// Batch invariance: a query's result depends only on its position and the K/V it attends, never on
// how the batch was cut (one extend, chunks, decode steps, other requests beside it). Keys go in
// fixed blocks of 32 anchored at position 0, one online softmax per query in block order, every
// sum in a fixed order; a query never touches keys past its position. The quantized linear layers
// round activations to an int8 grid, so any difference here would be amplified into another token.
//
// Per-layer features, each a function of the query's position alone, so invariance holds: a sliding
// window (the query at p reads keys [p - window + 1, p]; the blocks stay anchored at 0 and the
// keys before the window weigh exactly 0 in their lanes, as keys past p do), chunked attention
// (Llama 4: keys [p - p % chunk, p], a window that restarts at each chunk), a logit soft-cap
// (cap * tanh(score / cap), per score) and attention sinks (a head's extra logit joins the
// denominator at the end, like triton_ops/tiles.py add_sink).
#include "api.h"
#include "attention_plan.h"
#include "kv_pool.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

namespace radixlm {
namespace {
using namespace kv;

constexpr int MAXD = 512;  // Gemma 4 global layers: 512
constexpr int64_t PF_BLOCKS_AHEAD = 4;  // blocks of K/V asked for ahead of use (into L2: into L1 they evict the block in use)

struct Args {
  const float* q;
  int64_t q_row_stride, Hq, G, D;
  float* out;
  Index x;
  int64_t slots;
  float scale;
  int64_t window;      // 0: every earlier key
  int64_t chunk;       // 0: none; else keys from the start of the query's chunk only
  const float* sinks;  // [Hq] or null
  float cap;           // 0: no soft-cap
};

// The block of keys [j0, j0 + nk) at slots `slot_row` (+ j0), as pointers (and int8 scales).
template <int T>
inline void load_block(const Args& A, const Pool& K, const Pool& V, const int64_t* slot_row, int64_t h, int64_t j0,
                       int64_t nk, const void** kp, const void** vp, float* ksc, float* vsc) {
  for (int64_t j = 0; j < nk; ++j) {
    const int64_t slot = slot_row[j0 + j];
    TORCH_CHECK(slot >= 0 && slot < A.slots, "paged_attention: KV slot ", slot, " out of range");
    kp[j] = K.at(slot, h);
    vp[j] = V.at(slot, h);
    if constexpr (scaled(T)) ksc[j] = K.scale_at(slot, h), vsc[j] = V.scale_at(slot, h);
  }
}

// Asks for the K/V rows of keys [j0, j0 + nk) ahead of use: slots are scattered over the pool, so
// the hardware prefetcher cannot guess them, and a block's compute hides the next one's misses.
// always_inline: GCC finds a function of prefetches alone free of side effects and drops its calls.
__attribute__((always_inline)) inline void prefetch_block(const Pool& K, const Pool& V, const int64_t* slot_row, int64_t h0,
                                                          int64_t h1, int64_t j0, int64_t nk, int64_t row_bytes) {
  for (int64_t h = h0; h < h1; ++h)
    for (int64_t j = 0; j < nk; ++j) {
      const int64_t slot = slot_row[j0 + j];
      const char* kr = (const char*)K.at(slot, h);
      const char* vr = (const char*)V.at(slot, h);
      for (int64_t c = 0; c < row_bytes; c += 64) {
        _mm_prefetch(kr + c, _MM_HINT_T1);
        _mm_prefetch(vr + c, _MM_HINT_T1);
      }
    }
}

// The queries of a unit, as the block loop sees them.
struct Queries {
  std::vector<const float*> q;  // each query's vector
  std::vector<int64_t> pos;     // its position (it sees keys lo..pos)
  std::vector<int64_t> lo;      // its first key (0, or where its window starts)
  float *o, *m, *l;             // state [n, D], [n], [n]
};

// Scores of NQ queries against keys [j, j + 4) of a block: s[t * KB + j + i] = (q_t . k_i) * scale
// (* k_i's int8 scale). Per key: an 8-lane product, an FMA per further 8 dims, then a fixed hadd
// tree; the 4 keys and NQ queries share the loads. Keys past nk read key 0 again, unused.
template <int T, int NQ>
inline void scores4(const float* const* q, const void* const* kp, const float* ksc, int64_t j, int64_t nk, int64_t D,
                    float scale, float* s) {
  const void* k[4];
  for (int i = 0; i < 4; ++i) k[i] = kp[j + i < nk ? j + i : 0];
  __m256 a[NQ][4];
  for (int i = 0; i < 4; ++i) {
    const __m256 kv = ld8<T>(k[i], 0);
    for (int t = 0; t < NQ; ++t) a[t][i] = _mm256_mul_ps(_mm256_loadu_ps(q[t]), kv);
  }
  for (int64_t c = 8; c < D; c += 8)
    for (int i = 0; i < 4; ++i) {
      const __m256 kv = ld8<T>(k[i], c);
      for (int t = 0; t < NQ; ++t) a[t][i] = _mm256_fmadd_ps(_mm256_loadu_ps(q[t] + c), kv, a[t][i]);
    }
  const __m128 sc = _mm_set1_ps(scale);
  for (int t = 0; t < NQ; ++t) {
    const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(a[t][0], a[t][1]), _mm256_hadd_ps(a[t][2], a[t][3]));
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
    if constexpr (scaled(T)) r = _mm_mul_ps(r, _mm_loadu_ps(ksc + j));
    _mm_storeu_ps(s + t * KB + j, _mm_mul_ps(r, sc));
  }
}

// o_t[c0, c0 + 8 NC) = o_t * alpha_t + sum_{j < n} p_tj v_j (p times v_j's int8 scale) for NQ
// queries: per element o * alpha, then one FMA per key in key order.
template <int T, int NQ, int NC>
inline void pv_chunk(float* const* o, const float* alpha, const float* p, const void* const* vp, const float* vsc,
                     int64_t n, int64_t c0) {
  __m256 acc[NQ][NC];
  for (int t = 0; t < NQ; ++t) {
    const __m256 av = _mm256_set1_ps(alpha[t]);
    for (int c = 0; c < NC; ++c) acc[t][c] = _mm256_mul_ps(_mm256_loadu_ps(o[t] + c0 + 8 * c), av);
  }
  for (int64_t j = 0; j < n; ++j) {
    __m256 pj[NQ];
    for (int t = 0; t < NQ; ++t) pj[t] = _mm256_set1_ps(scaled(T) ? p[t * KB + j] * vsc[j] : p[t * KB + j]);
    for (int c = 0; c < NC; ++c) {
      const __m256 vv = ld8<T>(vp[j], c0 + 8 * c);
      for (int t = 0; t < NQ; ++t) acc[t][c] = _mm256_fmadd_ps(pj[t], vv, acc[t][c]);
    }
  }
  for (int t = 0; t < NQ; ++t)
    for (int c = 0; c < NC; ++c) _mm256_storeu_ps(o[t] + c0 + 8 * c, acc[t][c]);
}

template <int T, int NQ>
inline void pv_tile(float* const* o, const float* alpha, const float* p, const void* const* vp, const float* vsc,
                    int64_t n, int64_t D) {
  int64_t c0 = 0;
  for (; c0 + 32 <= D; c0 += 32) pv_chunk<T, NQ, 4>(o, alpha, p, vp, vsc, n, c0);
  for (; c0 < D; c0 += 8) pv_chunk<T, NQ, 1>(o, alpha, p, vp, vsc, n, c0);
}

// Lanes j .. j + 8 of a block that lie in [a, n).
inline __m256 lanes_in(int64_t j, int64_t a, int64_t n) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i below_n = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - j)), lane);
  const __m256i from_a = _mm256_cmpgt_epi32(lane, _mm256_set1_epi32((int)(a - j - 1)));
  return _mm256_castsi256_ps(_mm256_and_si256(below_n, from_a));
}

// max of s[a, n), n <= KB (the max of a set: the same whatever the order).
inline float block_max(const float* s, int64_t a, int64_t n) {
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 mx = ninf;
  for (int64_t j = a & ~7; j < n; j += 8) mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_loadu_ps(s + j), lanes_in(j, a, n)));
  return hmax(mx);
}

// Queries [t0, t0 + NQ) of Q against one block of keys [j0, j0 + nk): scores, the online softmax
// update and P.V, each query's arithmetic the same whatever queries share its tile.
template <int T, int NQ>
inline void attend_tile(const Queries& Q, int64_t t0, int64_t j0, int64_t nk, const void* const* kp,
                        const void* const* vp, const float* ksc, const float* vsc, int64_t D, float scale,
                        float cap) {
  alignas(32) float s[NQ * KB], p[NQ * KB];
  int64_t a[NQ], n[NQ];
  float alpha[NQ];
  float* o[NQ];
  for (int t = 0; t < NQ; ++t) {
    // The keys [a, n) of the block this query sees: from its window's start to its position.
    a[t] = std::max<int64_t>(0, Q.lo[t0 + t] - j0);
    n[t] = std::min<int64_t>(nk, Q.pos[t0 + t] + 1 - j0);
    if (a[t] >= n[t]) a[t] = n[t] = 0;  // none: the block leaves the query's state as it is
    o[t] = Q.o + (t0 + t) * D;
  }
  const int64_t n_max = *std::max_element(n, n + NQ);
  int64_t a_min = KB;  // keys before every query's window need no score
  for (int t = 0; t < NQ; ++t)
    if (n[t] > 0) a_min = std::min(a_min, a[t]);
  for (int64_t j = a_min & ~3; j < n_max; j += 4) scores4<T, NQ>(&Q.q[t0], kp, ksc, j, nk, D, scale, s);
  if (cap != 0.0f)
    for (int t = 0; t < NQ; ++t)
      for (int64_t j = a[t]; j < n[t]; ++j) s[t * KB + j] = cap * std::tanh(s[t * KB + j] / cap);
  for (int t = 0; t < NQ; ++t) {
    float* m = Q.m + t0 + t;
    float* l = Q.l + t0 + t;
    const float* st = s + t * KB;
    const float m_new = std::max(*m, block_max(st, a[t], n[t]));
    alpha[t] = *m == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(*m - m_new);
    const __m256 mv = _mm256_set1_ps(m_new);
    __m256 psum = _mm256_setzero_ps();
    for (int64_t j = 0; j < KB; j += 8) {
      __m256 e = _mm256_setzero_ps();
      if (j < n[t] && j + 8 > a[t]) {
        e = exp8(_mm256_sub_ps(_mm256_loadu_ps(st + j), mv));
        // keys past the query's position, or before its window, weigh exactly 0
        if (j + 8 > n[t] || j < a[t]) e = _mm256_and_ps(e, lanes_in(j, a[t], n[t]));
      }
      _mm256_store_ps(p + t * KB + j, e);
      psum = _mm256_add_ps(psum, e);
    }
    *l = *l * alpha[t] + hsum(psum);
    *m = m_new;
  }
  bool same = true;
  for (int t = 1; t < NQ; ++t) same = same && a[t] == a[0] && n[t] == n[0];
  if (same) {
    pv_tile<T, NQ>(o, alpha, p + a[0], vp + a[0], vsc + a[0], n[0] - a[0], D);
  } else {  // a block on the diagonal or a window's edge: each query on its own, over exactly its keys
    for (int t = 0; t < NQ; ++t)
      if (n[t] > 0) pv_tile<T, 1>(&o[t], &alpha[t], p + t * KB + a[t], vp + a[t], vsc + a[t], n[t] - a[t], D);
  }
}

// Queries [t0, t1) of Q against one block, in tiles of 3 (then 2, 1).
template <int T>
inline void attend_block(const Queries& Q, int64_t t0, int64_t t1, int64_t j0, int64_t nk, const void* const* kp,
                         const void* const* vp, const float* ksc, const float* vsc, int64_t D, float scale,
                         float cap) {
  int64_t t = t0;
  for (; t + 3 <= t1; t += 3) attend_tile<T, 3>(Q, t, j0, nk, kp, vp, ksc, vsc, D, scale, cap);
  if (t1 - t == 2) attend_tile<T, 2>(Q, t, j0, nk, kp, vp, ksc, vsc, D, scale, cap);
  if (t1 - t == 1) attend_tile<T, 1>(Q, t, j0, nk, kp, vp, ksc, vsc, D, scale, cap);
}

template <int T>
void run_unit(const Args& A, const Pool& K, const Pool& V, const std::vector<Item>& items, const Unit& u,
              std::vector<float>& ws, Queries& Q) {
  const int64_t G = A.G, D = A.D;
  // Queries by KV head, then item, row and query head: a head's queries (and an item's) are a range.
  Q.q.clear();
  Q.pos.clear();
  Q.lo.clear();
  for (int64_t h = u.h0; h < u.h1; ++h)
    for (int64_t it = u.i0; it < u.i1; ++it) {
      const Item& w = items[it];
      const int64_t first_pos = A.x.first_pos(w);
      for (int64_t r = 0; r < w.rows; ++r)
        for (int64_t g = 0; g < G; ++g) {
          Q.q.push_back(A.q + (A.x.qs[w.b] + w.row0 + r) * A.q_row_stride + (h * G + g) * D);
          Q.pos.push_back(first_pos + r);
          const int64_t p = first_pos + r;
          Q.lo.push_back(A.chunk > 0 ? p - p % A.chunk : A.window > 0 ? std::max<int64_t>(0, p - A.window + 1) : 0);
        }
    }
  const int64_t nq = Q.q.size(), per_head = nq / (u.h1 - u.h0);
  ws.resize(nq * (D + 2));
  Q.o = ws.data(), Q.m = Q.o + nq * D, Q.l = Q.m + nq;
  std::fill(Q.o, Q.o + nq * D, 0.0f);
  std::fill(Q.m, Q.m + nq, -std::numeric_limits<float>::infinity());
  std::fill(Q.l, Q.l + nq, 0.0f);
  alignas(32) float ksc[KB], vsc[KB];
  const void* kp[KB];
  const void* vp[KB];
  const int64_t* shared_row = A.x.slots_of(items[u.i0].b);
  const int64_t row_bytes = T == KV_I4 ? D / 2 : D * (T == KV_F32 ? 4 : T == KV_I8 ? 1 : 2);
  const int64_t shared_keys = u.shared * KB;
  // A window: the blocks before every query's window are skipped (no-ops for all of them).
  auto first_block = [&](int64_t lo) { return lo / KB * KB; };
  const int64_t unit_j0 = first_block(*std::min_element(Q.lo.begin(), Q.lo.begin() + per_head));
  for (int64_t a = 1; a < PF_BLOCKS_AHEAD && unit_j0 + a * KB < shared_keys; ++a)
    prefetch_block(K, V, shared_row, u.h0, u.h1, unit_j0 + a * KB, KB, row_bytes);
  for (int64_t j0 = unit_j0; j0 < shared_keys; j0 += KB) {
    if (j0 + PF_BLOCKS_AHEAD * KB < shared_keys) prefetch_block(K, V, shared_row, u.h0, u.h1, j0 + PF_BLOCKS_AHEAD * KB, KB, row_bytes);
    for (int64_t h = u.h0; h < u.h1; ++h) {
      load_block<T>(A, K, V, shared_row, h, j0, KB, kp, vp, ksc, vsc);
      const int64_t t0 = (h - u.h0) * per_head;
      attend_block<T>(Q, t0, t0 + per_head, j0, KB, kp, vp, ksc, vsc, D, A.scale, A.cap);
    }
  }
  int64_t q0 = 0;  // the item's first query within its head's range
  for (int64_t it = u.i0; it < u.i1; ++it) {
    const Item& w = items[it];
    const int64_t last_pos = A.x.first_pos(w) + w.rows - 1, nw = w.rows * G;
    const int64_t* row = A.x.slots_of(w.b);
    const int64_t item_j0 = std::max(shared_keys, first_block(Q.lo[q0]));  // its first row's window
    for (int64_t j0 = item_j0; j0 <= last_pos; j0 += KB) {
      const int64_t nk = std::min<int64_t>(KB, last_pos + 1 - j0);
      if (j0 + KB <= last_pos) prefetch_block(K, V, row, u.h0, u.h1, j0 + KB, std::min<int64_t>(KB, last_pos + 1 - j0 - KB),
                                                row_bytes);
      for (int64_t h = u.h0; h < u.h1; ++h) {
        load_block<T>(A, K, V, row, h, j0, nk, kp, vp, ksc, vsc);
        const int64_t t0 = (h - u.h0) * per_head + q0;
        attend_block<T>(Q, t0, t0 + nw, j0, nk, kp, vp, ksc, vsc, D, A.scale, A.cap);
      }
    }
    for (int64_t h = u.h0; h < u.h1; ++h)
      for (int64_t r = 0; r < w.rows; ++r)
        for (int64_t g = 0; g < G; ++g) {
          const int64_t qi = (h - u.h0) * per_head + q0 + r * G + g;
          float* dst = A.out + ((A.x.qs[w.b] + w.row0 + r) * A.Hq + h * G + g) * D;
          float scale_o = 1.0f / Q.l[qi];
          if (A.sinks != nullptr) {  // the sink joins the max and the denominator, with no value
            const float sink = A.sinks[h * G + g], m_new = std::max(Q.m[qi], sink);
            const float alpha = std::exp(Q.m[qi] - m_new);
            scale_o = alpha / (Q.l[qi] * alpha + std::exp(sink - m_new));
          }
          const __m256 inv = _mm256_set1_ps(scale_o);
          for (int64_t c = 0; c < D; c += 8)
            _mm256_storeu_ps(dst + c, _mm256_mul_ps(_mm256_loadu_ps(Q.o + qi * D + c), inv));
        }
    q0 += nw;
  }
}

// q [T, Hq, D] (row stride free), out [T, Hq, D] contiguous. Request b has q rows
// q_start[b] .. q_start[b+1] at positions seq_lens[b] - n_b ... seq_lens[b] - 1 and keys at slots
// req_to_token[req_pool_indices[b], 0 .. seq_lens[b]). plan: made by plan_attention for these
// index tensors (the layers op makes one per forward), or null to make one here. The layer's
// features: window (0: none), sinks (float32 [Hq] or none), logit_cap (0: none), chunk (0: none).
void paged_attention_out(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                         const c10::optional<at::Tensor>& k_scale, const c10::optional<at::Tensor>& v_scale,
                         const at::Tensor& req_to_token, const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                         const at::Tensor& q_start, double scale, at::Tensor& out, const AttentionPlan* plan,
                         int64_t window, const c10::optional<at::Tensor>& sinks, double logit_cap, int64_t chunk) {
  TORCH_CHECK(q.dtype() == at::kFloat && q.dim() == 3 && q.stride(2) == 1 && q.stride(1) == q.size(2),
              "paged_attention: q must be float32 [tokens, heads, head_dim] with contiguous heads");
  const int64_t T = q.size(0), Hq = q.size(1), D = q.size(2);
  TORCH_CHECK(out.dtype() == at::kFloat && out.is_contiguous() && out.sizes() == q.sizes(), "paged_attention: out like q, contiguous");
  const Pool K = make_pool(k_buf, k_scale, "k_buf"), V = make_pool(v_buf, v_scale, "v_buf");
  TORCH_CHECK(K.type == V.type && k_buf.sizes() == v_buf.sizes(), "paged_attention: k_buf and v_buf differ");
  const int64_t Hkv = k_buf.size(1), slots = k_buf.size(0);
  TORCH_CHECK(row_dim(k_buf) == D && D % 8 == 0 && D <= MAXD, "paged_attention: head_dim ", D, " (pool ", row_dim(k_buf),
              ") must match, be a multiple of 8 and at most ", MAXD);
  TORCH_CHECK(K.type != KV_I4 || (D & (D - 1)) == 0, "paged_attention: an int4 KV cache needs a power-of-two head_dim, got ", D);
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0, "paged_attention: ", Hq, " query heads over ", Hkv, " KV heads");
  const int64_t G = Hq / Hkv;
  TORCH_CHECK(window >= 0 && logit_cap >= 0 && chunk >= 0, "paged_attention: window, logit_cap and chunk must not be negative");
  TORCH_CHECK(window == 0 || chunk == 0, "paged_attention: a window or a chunk, not both");
  TORCH_CHECK(!sinks || (sinks->dtype() == at::kFloat && sinks->is_contiguous() && sinks->device().is_cpu() &&
                         sinks->numel() == Hq),
              "paged_attention: sinks must be float32 [", Hq, "] on CPU");
  std::shared_ptr<const AttentionPlan> own;
  if (plan == nullptr) {
    own = plan_attention(req_to_token, req_pool_indices, seq_lens, q_start, Hkv, G);
    plan = own.get();
  }
  TORCH_CHECK(plan->B == seq_lens.numel() && plan->Hkv == Hkv && plan->G == G,
              "paged_attention: the plan was made for another batch or model");
  TORCH_CHECK(plan->T == T, "paged_attention: q_start must run from 0 to the number of tokens");
  const Index x{req_to_token.data_ptr<int64_t>(), req_pool_indices.data_ptr<int64_t>(), seq_lens.data_ptr<int64_t>(),
                q_start.data_ptr<int64_t>(), plan->B, req_to_token.size(1), req_to_token.size(0)};
  at::Tensor q_turned;  // int4: the queries in the keys' turned basis
  if (K.type == KV_I4) {
    q_turned = q.clone(at::MemoryFormat::Contiguous);  // one copy, turned in place
    float* qt = q_turned.data_ptr<float>();
    at::parallel_for(0, T * Hq, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) hadamard_(qt + r * D, D);
    });
  }
  const float* q_rows = K.type == KV_I4 ? q_turned.data_ptr<float>() : q.data_ptr<float>();
  const int64_t q_stride = K.type == KV_I4 ? Hq * D : q.stride(0);
  const Args A{q_rows, q_stride, Hq, G, D, out.data_ptr<float>(), x, slots, (float)scale, window, chunk,
               sinks ? sinks->data_ptr<float>() : nullptr, (float)logit_cap};
  const std::vector<Unit>& units = plan->units;
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), (int64_t)units.size());
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    std::vector<float> ws;
    Queries Q;
    for (int64_t u; (u = next.fetch_add(1)) < (int64_t)units.size();) {
      switch (K.type) {
        case KV_F32: run_unit<KV_F32>(A, K, V, plan->items, units[u], ws, Q); break;
        case KV_F16: run_unit<KV_F16>(A, K, V, plan->items, units[u], ws, Q); break;
        case KV_BF16: run_unit<KV_BF16>(A, K, V, plan->items, units[u], ws, Q); break;
        case KV_I8: run_unit<KV_I8>(A, K, V, plan->items, units[u], ws, Q); break;
        case KV_I4: run_unit<KV_I4>(A, K, V, plan->items, units[u], ws, Q); break;
      }
    }
  });
  if (K.type == KV_I4) {  // the outputs back from the values' turned basis
    float* o = out.data_ptr<float>();
    at::parallel_for(0, T * Hq, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) hadamard_(o + r * D, D);
    });
  }
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                           const c10::optional<at::Tensor>& k_scale, const c10::optional<at::Tensor>& v_scale,
                           const at::Tensor& req_to_token, const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                           const at::Tensor& q_start, double scale, int64_t window,
                           const c10::optional<at::Tensor>& sinks, double logit_cap, int64_t chunk) {
  auto out = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
  paged_attention_out(q, k_buf, v_buf, k_scale, v_scale, req_to_token, req_pool_indices, seq_lens, q_start, scale, out,
                      nullptr, window, sinks, logit_cap, chunk);
  return out;
}

}  // namespace

namespace api {
void paged_attention_out(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                         const c10::optional<at::Tensor>& k_scale, const c10::optional<at::Tensor>& v_scale,
                         const at::Tensor& req_to_token, const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                         const at::Tensor& q_start, double scale, at::Tensor& out, const AttentionPlan* plan,
                         int64_t window, const c10::optional<at::Tensor>& sinks, double logit_cap, int64_t chunk) {
  radixlm::paged_attention_out(q, k_buf, v_buf, k_scale, v_scale, req_to_token, req_pool_indices, seq_lens, q_start,
                               scale, out, plan, window, sinks, logit_cap, chunk);
}
}  // namespace api

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("paged_attention(Tensor q, Tensor k_buf, Tensor v_buf, Tensor? k_scale, Tensor? v_scale, Tensor req_to_token, "
        "Tensor req_pool_indices, Tensor seq_lens, Tensor q_start, float scale, int window=0, Tensor? sinks=None, "
        "float logit_cap=0., int chunk=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("paged_attention", &paged_attention); }

}  // namespace radixlm
