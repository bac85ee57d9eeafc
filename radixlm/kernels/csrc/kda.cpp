// Kimi Delta Attention's rule (Kimi-Linear's KDA): the gated delta rule with a decay per key channel
// (model/layers/linear_attn/kda_rule.py states it; recurrent.h: how the work is split, the helpers).
// Per token and head, with e = exp(g) over the Dk key channels:
//   S = diag(e) S;  S = S + k d^T, d = beta (v - S^T k);  o = S^T q
// A token scan, as gated_delta.cpp's: a chunked form does about as many flops at these head sizes
// (4 Dk Dv per token here) and materializes [chunk, chunk, Dk] decays; the scan keeps a block of
// the state in L1 (docs/hybrid.md has the measurement). The AVX-512 step (64 columns, chosen at run
// time) runs lane for lane the AVX2 step's operations, so the two agree bit for bit.
#include "recurrent.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace radixlm {
namespace linear_attn {  // named: the unity build puts this file beside others' anonymous helpers
namespace {

// One token over a block of state columns S [Dk][W] (float32, row stride ld). The decay folds into
// the vectors the state is read with: S'^T k = S^T (e k) for S' = diag(e) S, so with
// a = (S^T ek, S^T eq) of the state before the token,
//   d = beta (v - a_k);  o = S_new^T q = a_q + (k . q) d;  S_new[i] = e_i S[i] + k_i d.
// As in gated_delta.cpp, the update pass also makes the next token's a, so a token reads the block
// once; a request's first token makes its own (prefetching when the block is not in cache).
struct KdaTok {
  const float *k, *e, *ek, *eq, *v;  // [Dk] each but v [W]
  float beta, kq;
  float* o;
};

void kda_step_avx2(float* S, int64_t ld, int64_t Dk, const KdaTok& cur, const KdaTok* next, float* acc, bool first,
                   bool fetch) {
  constexpr int NV = 4, W = 8 * NV;
  __m256 ak[NV], aq[NV], d[NV];
  for (int j = 0; j < NV; ++j) {
    ak[j] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + 8 * j);
    aq[j] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + W + 8 * j);
  }
  for (int64_t i = 0; first && i < Dk; ++i) {
    if (fetch && i + PF_ROWS < Dk) {
      _mm_prefetch((const char*)(S + (i + PF_ROWS) * ld), _MM_HINT_T0);
      _mm_prefetch((const char*)(S + (i + PF_ROWS) * ld + 16), _MM_HINT_T0);
    }
    const __m256 kb = _mm256_set1_ps(cur.ek[i]), qb = _mm256_set1_ps(cur.eq[i]);
    for (int j = 0; j < NV; ++j) {
      const __m256 s = _mm256_loadu_ps(S + i * ld + 8 * j);
      ak[j] = _mm256_fmadd_ps(s, kb, ak[j]);
      aq[j] = _mm256_fmadd_ps(s, qb, aq[j]);
    }
  }
  const __m256 bv = _mm256_set1_ps(cur.beta), kqv = _mm256_set1_ps(cur.kq);
  for (int j = 0; j < NV; ++j) {
    d[j] = _mm256_mul_ps(bv, _mm256_sub_ps(_mm256_loadu_ps(cur.v + 8 * j), ak[j]));
    _mm256_storeu_ps(cur.o + 8 * j, _mm256_fmadd_ps(kqv, d[j], aq[j]));
  }
  for (int j = 0; j < NV; ++j) ak[j] = aq[j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < Dk; ++i) {
    const __m256 kb = _mm256_set1_ps(cur.k[i]), eb = _mm256_set1_ps(cur.e[i]);
    __m256 sv[NV];
    for (int j = 0; j < NV; ++j) {
      float* s = S + i * ld + 8 * j;
      sv[j] = _mm256_fmadd_ps(kb, d[j], _mm256_mul_ps(eb, _mm256_loadu_ps(s)));
      _mm256_storeu_ps(s, sv[j]);
    }
    if (!next) continue;
    const __m256 nk = _mm256_set1_ps(next->ek[i]), nq = _mm256_set1_ps(next->eq[i]);
    for (int j = 0; j < NV; ++j) ak[j] = _mm256_fmadd_ps(sv[j], nk, ak[j]), aq[j] = _mm256_fmadd_ps(sv[j], nq, aq[j]);
  }
  for (int j = 0; next && j < NV; ++j) _mm256_storeu_ps(acc + 8 * j, ak[j]), _mm256_storeu_ps(acc + W + 8 * j, aq[j]);
}

// The same over 64 columns with AVX-512 (lane for lane the same operations as the AVX2 form).
__attribute__((target("avx512f"))) void kda_step_avx512(float* S, int64_t ld, int64_t Dk, const KdaTok& cur,
                                                         const KdaTok* next, float* acc, bool first, bool fetch) {
  constexpr int NV = 4, W = 16 * NV;
  __m512 ak[NV], aq[NV], d[NV];
  for (int j = 0; j < NV; ++j) {
    ak[j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + 16 * j);
    aq[j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + W + 16 * j);
  }
  for (int64_t i = 0; first && i < Dk; ++i) {
    if (fetch && i + PF_ROWS < Dk)
      for (int j = 0; j < NV; ++j) _mm_prefetch((const char*)(S + (i + PF_ROWS) * ld + 16 * j), _MM_HINT_T0);
    const __m512 kb = _mm512_set1_ps(cur.ek[i]), qb = _mm512_set1_ps(cur.eq[i]);
    for (int j = 0; j < NV; ++j) {
      const __m512 s = _mm512_loadu_ps(S + i * ld + 16 * j);
      ak[j] = _mm512_fmadd_ps(s, kb, ak[j]);
      aq[j] = _mm512_fmadd_ps(s, qb, aq[j]);
    }
  }
  const __m512 bv = _mm512_set1_ps(cur.beta), kqv = _mm512_set1_ps(cur.kq);
  for (int j = 0; j < NV; ++j) {
    d[j] = _mm512_mul_ps(bv, _mm512_sub_ps(_mm512_loadu_ps(cur.v + 16 * j), ak[j]));
    _mm512_storeu_ps(cur.o + 16 * j, _mm512_fmadd_ps(kqv, d[j], aq[j]));
  }
  for (int j = 0; j < NV; ++j) ak[j] = aq[j] = _mm512_setzero_ps();
  for (int64_t i = 0; i < Dk; ++i) {
    const __m512 kb = _mm512_set1_ps(cur.k[i]), eb = _mm512_set1_ps(cur.e[i]);
    __m512 sv[NV];
    for (int j = 0; j < NV; ++j) {
      float* s = S + i * ld + 16 * j;
      sv[j] = _mm512_fmadd_ps(kb, d[j], _mm512_mul_ps(eb, _mm512_loadu_ps(s)));
      _mm512_storeu_ps(s, sv[j]);
    }
    if (!next) continue;
    const __m512 nk = _mm512_set1_ps(next->ek[i]), nq = _mm512_set1_ps(next->eq[i]);
    for (int j = 0; j < NV; ++j) ak[j] = _mm512_fmadd_ps(sv[j], nk, ak[j]), aq[j] = _mm512_fmadd_ps(sv[j], nq, aq[j]);
  }
  for (int j = 0; next && j < NV; ++j) _mm512_storeu_ps(acc + 16 * j, ak[j]), _mm512_storeu_ps(acc + W + 16 * j, aq[j]);
}

struct Kda {
  In q, k, v, g, beta;
  float* o;
  char* state;
  int64_t slot_bytes;
  SType st;
  int64_t H, Dk, Dv;
};

using KdaStep = void (*)(float*, int64_t, int64_t, const KdaTok&, const KdaTok*, float*, bool, bool);

// A token's key-side vectors into buf [3 Dk]: e = exp(g), e k, e q (AVX2 for either step, so both
// ISAs see the same values); returns k . q.
float kda_prepare(const Kda& A, int64_t t, int64_t h, float* buf) {
  const int64_t Dk = A.Dk;
  const float *g = A.g.at(t, h), *k = A.k.at(t, h), *q = A.q.at(t, h);
  float *e = buf, *ek = buf + Dk, *eq = buf + 2 * Dk;
  __m256 kq8 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= Dk; i += 8) {
    const __m256 ev = exp8(_mm256_loadu_ps(g + i)), kv = _mm256_loadu_ps(k + i), qv = _mm256_loadu_ps(q + i);
    _mm256_storeu_ps(e + i, ev);
    _mm256_storeu_ps(ek + i, _mm256_mul_ps(ev, kv));
    _mm256_storeu_ps(eq + i, _mm256_mul_ps(ev, qv));
    kq8 = _mm256_fmadd_ps(kv, qv, kq8);
  }
  float kq = hsum(kq8);
  for (; i < Dk; ++i) {
    e[i] = std::exp(g[i]);
    ek[i] = e[i] * k[i];
    eq[i] = e[i] * q[i];
    kq = std::fma(k[i], q[i], kq);
  }
  return kq;
}

// Request r, head h, columns [c0, c0 + W) of its state, over the request's tokens: in place for a
// float32 decode step's full block, else through a contiguous float32 copy zero-padded to W
// (gated_delta.cpp's gdr_block says why).
void kda_block(const Kda& A, const Batch& B, int64_t r, int64_t h, int64_t c0, int64_t W, KdaStep step,
               std::vector<float>& scratch) {
  if (B.len[r] == 0) return;
  const int64_t Dk = A.Dk, Dv = A.Dv, w = std::min(W, Dv - c0), es = type_size(A.st);
  const bool in_place = A.st == SType::F32 && w == W && B.len[r] == 1;
  char* base = A.state + B.rows[r] * A.slot_bytes + ((h * Dk) * Dv + c0) * es;
  // scratch: two tokens' key-side vectors [3 Dk] each, then (not in place) the block, v and o.
  scratch.resize(6 * Dk + (in_place ? 0 : Dk * W + 2 * W));
  float* toks[2] = {scratch.data(), scratch.data() + 3 * Dk};
  float *S = (float*)base, *v = nullptr, *o = nullptr;
  int64_t ld = Dv;
  if (!in_place) {
    S = scratch.data() + 6 * Dk, ld = W;
    v = S + Dk * W;  // the token's values, zero past w
    o = v + W;
    for (int64_t i = 0; i < Dk; ++i) {
      if (i + PF_ROWS < Dk)
        for (int64_t byte = 0; byte < w * es; byte += 64) _mm_prefetch(base + (i + PF_ROWS) * Dv * es + byte, _MM_HINT_T0);
      state_load(base + i * Dv * es, A.st, S + i * W, w);
      std::fill(S + i * W + w, S + (i + 1) * W, 0.0f);
    }
    std::fill(v + w, v + W, 0.0f);
  }
  float acc[2 * 64];
  auto token = [&](int64_t t, float* buf) {
    const float kq = kda_prepare(A, t, h, buf);
    float* out = A.o + (t * A.H + h) * Dv + c0;
    return KdaTok{A.k.at(t, h), buf, buf + Dk, buf + 2 * Dk, in_place ? A.v.at(t, h) + c0 : v, *A.beta.at(t, h), kq,
                  in_place ? out : o};
  };
  const int64_t t0 = B.start[r], t1 = t0 + B.len[r];
  KdaTok cur = token(t0, toks[0]);
  for (int64_t t = t0; t < t1; ++t) {
    const KdaTok next = t + 1 < t1 ? token(t + 1, toks[(t - t0 + 1) % 2]) : KdaTok{};
    if (!in_place) std::memcpy(v, A.v.at(t, h) + c0, w * 4);
    step(S, ld, Dk, cur, t + 1 < t1 ? &next : nullptr, acc, t == t0, in_place);
    if (!in_place) std::memcpy(A.o + (t * A.H + h) * Dv + c0, o, w * 4);
    cur = next;
  }
  if (!in_place)
    for (int64_t i = 0; i < Dk; ++i) state_store(S + i * W, A.st, base + i * Dv * es, w);
}

at::Tensor kimi_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                           const at::Tensor& beta, at::Tensor& ssm_state, const at::Tensor& rows,
                           at::IntArrayRef seq_lens) {
  TORCH_CHECK(q.dim() == 3 && v.dim() == 3, "kimi_delta_rule: q [T, H, Dk], v [T, H, Dv]");
  const int64_t T = q.size(0), H = q.size(1), Dk = q.size(2), Dv = v.size(2);
  check_state(ssm_state, H, Dk, Dv, "kimi_delta_rule ssm_state");
  const SType st = state_type(ssm_state, "kimi_delta_rule ssm_state");
  const Batch B = batch(rows, seq_lens, T, ssm_state.size(0), "kimi_delta_rule");
  auto o = at::empty({T, H, Dv}, v.options().memory_format(at::MemoryFormat::Contiguous));
  const Kda A{input(q, T, H, Dk, "kimi_delta_rule q"), input(k, T, H, Dk, "kimi_delta_rule k"),
              input(v, T, H, Dv, "kimi_delta_rule v"), input(g, T, H, Dk, "kimi_delta_rule g"),
              input(beta, T, H, 0, "kimi_delta_rule beta"), o.data_ptr<float>(), (char*)ssm_state.data_ptr(),
              ssm_state.stride(0) * type_size(st), st, H, Dk, Dv};
  const bool wide = use_avx512();
  const int64_t W = wide ? 64 : 32, nb = (Dv + W - 1) / W, per_req = H * nb;
  const KdaStep step = wide ? kda_step_avx512 : kda_step_avx2;
  const int64_t n = (int64_t)B.rows.size() * per_req;
  run_items(n, (T + 1) * H * Dk * Dv > SERIAL_WORK, [&](int64_t i, std::vector<float>& scratch) {
    const int64_t r = B.order[i / per_req], h = i % per_req / nb, c0 = i % nb * W;
    kda_block(A, B, r, h, c0, W, step, scratch);
  });
  return o;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("kimi_delta_rule(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor(a!) ssm_state, Tensor rows, "
        "int[] seq_lens) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) {
  m.impl("kimi_delta_rule", &kimi_delta_rule);
}

}  // namespace linear_attn
}  // namespace radixlm
