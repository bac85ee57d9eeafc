// The gated delta rule (Gated DeltaNet) of hybrid models' state layers (recurrent.h: how the work is
// split, and the helpers it shares with recurrent.cpp's causal conv1d and Mamba-2 SSD).
//
// The gated delta rule's token step also has an AVX-512 form (64 columns, chosen at run time): every
// lane runs the same operations in the same order as the AVX2 form, so the two agree bit for bit.
#include "recurrent.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

namespace radixlm {
namespace linear_attn {  // named: the unity build puts this file beside others' anonymous helpers
namespace {

// ---- gated delta rule ----------------------------------------------------------------------------

// One token of the gated delta rule over a block of state columns S [Dk][W] (float32, row stride
// ld), with a = (S^T k, S^T q) of the state before it:
//   S = e S + k d^T,  d = beta (v - e S^T k);  o = S^T q = e S^T q + (k . q) d
// a comes from the previous token's update pass (acc) or, for a request's first token, from a pass
// of its own; the update pass also makes the next token's a, so a token reads the block once.
// `fetch`: the block is not in cache yet (recurrent.h: PF_ROWS).
struct GdrTok {
  const float *k, *q, *v;
  float e, beta, kq;
  float* o;
};

void gdr_step_avx2(float* S, int64_t ld, int64_t Dk, const GdrTok& cur, const GdrTok* next, float* acc, bool first,
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
    const __m256 kb = _mm256_set1_ps(cur.k[i]), qb = _mm256_set1_ps(cur.q[i]);
    for (int j = 0; j < NV; ++j) {
      const __m256 s = _mm256_loadu_ps(S + i * ld + 8 * j);
      ak[j] = _mm256_fmadd_ps(s, kb, ak[j]);
      aq[j] = _mm256_fmadd_ps(s, qb, aq[j]);
    }
  }
  const __m256 ev = _mm256_set1_ps(cur.e), bv = _mm256_set1_ps(cur.beta), kqv = _mm256_set1_ps(cur.kq);
  for (int j = 0; j < NV; ++j) {
    d[j] = _mm256_mul_ps(bv, _mm256_fnmadd_ps(ev, ak[j], _mm256_loadu_ps(cur.v + 8 * j)));
    _mm256_storeu_ps(cur.o + 8 * j, _mm256_fmadd_ps(kqv, d[j], _mm256_mul_ps(ev, aq[j])));
  }
  // The update; with a next token, its a from the new rows (GCC unswitches the loop on `next`).
  for (int j = 0; j < NV; ++j) ak[j] = aq[j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < Dk; ++i) {
    const __m256 kb = _mm256_set1_ps(cur.k[i]);
    __m256 sv[NV];
    for (int j = 0; j < NV; ++j) {
      float* s = S + i * ld + 8 * j;
      sv[j] = _mm256_fmadd_ps(kb, d[j], _mm256_mul_ps(ev, _mm256_loadu_ps(s)));
      _mm256_storeu_ps(s, sv[j]);
    }
    if (!next) continue;
    const __m256 nk = _mm256_set1_ps(next->k[i]), nq = _mm256_set1_ps(next->q[i]);
    for (int j = 0; j < NV; ++j) ak[j] = _mm256_fmadd_ps(sv[j], nk, ak[j]), aq[j] = _mm256_fmadd_ps(sv[j], nq, aq[j]);
  }
  for (int j = 0; next && j < NV; ++j) _mm256_storeu_ps(acc + 8 * j, ak[j]), _mm256_storeu_ps(acc + W + 8 * j, aq[j]);
}

// The same over 16 NV columns with AVX-512 (lane for lane the same operations as the AVX2 form).
template <int NV>
__attribute__((target("avx512f"))) void gdr_step_avx512(float* S, int64_t ld, int64_t Dk, const GdrTok& cur,
                                                         const GdrTok* next, float* acc, bool first, bool fetch) {
  constexpr int W = 16 * NV;
  __m512 ak[NV], aq[NV], d[NV];
  for (int j = 0; j < NV; ++j) {
    ak[j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + 16 * j);
    aq[j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + W + 16 * j);
  }
  for (int64_t i = 0; first && i < Dk; ++i) {
    if (fetch && i + PF_ROWS < Dk)
      for (int j = 0; j < NV; ++j) _mm_prefetch((const char*)(S + (i + PF_ROWS) * ld + 16 * j), _MM_HINT_T0);
    const __m512 kb = _mm512_set1_ps(cur.k[i]), qb = _mm512_set1_ps(cur.q[i]);
    for (int j = 0; j < NV; ++j) {
      const __m512 s = _mm512_loadu_ps(S + i * ld + 16 * j);
      ak[j] = _mm512_fmadd_ps(s, kb, ak[j]);
      aq[j] = _mm512_fmadd_ps(s, qb, aq[j]);
    }
  }
  const __m512 ev = _mm512_set1_ps(cur.e), bv = _mm512_set1_ps(cur.beta), kqv = _mm512_set1_ps(cur.kq);
  for (int j = 0; j < NV; ++j) {
    d[j] = _mm512_mul_ps(bv, _mm512_fnmadd_ps(ev, ak[j], _mm512_loadu_ps(cur.v + 16 * j)));
    _mm512_storeu_ps(cur.o + 16 * j, _mm512_fmadd_ps(kqv, d[j], _mm512_mul_ps(ev, aq[j])));
  }
  for (int j = 0; j < NV; ++j) ak[j] = aq[j] = _mm512_setzero_ps();
  for (int64_t i = 0; i < Dk; ++i) {
    const __m512 kb = _mm512_set1_ps(cur.k[i]);
    __m512 sv[NV];
    for (int j = 0; j < NV; ++j) {
      float* s = S + i * ld + 16 * j;
      sv[j] = _mm512_fmadd_ps(kb, d[j], _mm512_mul_ps(ev, _mm512_loadu_ps(s)));
      _mm512_storeu_ps(s, sv[j]);
    }
    if (!next) continue;
    const __m512 nk = _mm512_set1_ps(next->k[i]), nq = _mm512_set1_ps(next->q[i]);
    for (int j = 0; j < NV; ++j) ak[j] = _mm512_fmadd_ps(sv[j], nk, ak[j]), aq[j] = _mm512_fmadd_ps(sv[j], nq, aq[j]);
  }
  for (int j = 0; next && j < NV; ++j) _mm512_storeu_ps(acc + 16 * j, ak[j]), _mm512_storeu_ps(acc + W + 16 * j, aq[j]);
}

struct Gdr {
  In q, k, v, g, beta;
  float* o;
  char* state;
  int64_t slot_bytes;
  SType st;
  int64_t Hk, Hv, Dk, Dv;
  bool tiled;  // value head h reads key head h % Hk (llama.cpp's order), else h / (Hv / Hk)
};

using GdrStep = void (*)(float*, int64_t, int64_t, const GdrTok&, const GdrTok*, float*, bool, bool);

// Request r, value head h, columns [c0, c0 + W) of its state, over the request's tokens. A decode
// step's full float32 block is advanced in place (read once, updated in L1); otherwise the block
// goes through a contiguous float32 copy, zero-padded to W: the state's rows are Dv apart, and over
// many tokens a block of them would fall into a few L1 sets and evict itself.
void gdr_block(const Gdr& A, const Batch& B, int64_t r, int64_t h, int64_t c0, int64_t W, GdrStep step,
               std::vector<float>& scratch) {
  if (B.len[r] == 0) return;  // nothing to advance (and no token to read)
  const int64_t Dk = A.Dk, Dv = A.Dv, w = std::min(W, Dv - c0), es = type_size(A.st);
  const int64_t hk = A.tiled ? h % A.Hk : h / (A.Hv / A.Hk);
  const bool in_place = A.st == SType::F32 && w == W && B.len[r] == 1;
  char* base = A.state + B.rows[r] * A.slot_bytes + ((h * Dk) * Dv + c0) * es;
  float *S = (float*)base, *v = nullptr, *o = nullptr;
  int64_t ld = Dv;
  if (!in_place) {
    scratch.resize(Dk * W + 2 * W);
    S = scratch.data(), ld = W;
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
  // A token's values and outputs: in place, or through zero-padded buffers of W (a partial block).
  float acc[2 * 128];
  auto token = [&](int64_t t) {
    const float *k = A.k.at(t, hk), *q = A.q.at(t, hk);
    float kq = 0.0f;
    for (int64_t i = 0; i < Dk; ++i) kq = std::fma(k[i], q[i], kq);
    float* out = A.o + (t * A.Hv + h) * Dv + c0;
    return GdrTok{k, q, in_place ? A.v.at(t, h) + c0 : v, std::exp(*A.g.at(t, h)), *A.beta.at(t, h), kq,
                  in_place ? out : o};
  };
  const int64_t t0 = B.start[r], t1 = t0 + B.len[r];
  GdrTok cur = token(t0);
  for (int64_t t = t0; t < t1; ++t) {
    const GdrTok next = t + 1 < t1 ? token(t + 1) : GdrTok{};
    if (!in_place) std::memcpy(v, A.v.at(t, h) + c0, w * 4);
    step(S, ld, Dk, cur, t + 1 < t1 ? &next : nullptr, acc, t == t0, in_place);
    if (!in_place) std::memcpy(A.o + (t * A.Hv + h) * Dv + c0, o, w * 4);
    cur = next;
  }
  if (!in_place)
    for (int64_t i = 0; i < Dk; ++i) state_store(S + i * W, A.st, base + i * Dv * es, w);
}

}  // namespace

// The op below, with the key heads' order as an option (gdn_fused.cpp calls it, tiled or not).
at::Tensor gated_delta_rule_run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                const at::Tensor& beta, at::Tensor& ssm_state, const at::Tensor& rows,
                                at::IntArrayRef seq_lens, bool tiled) {
  TORCH_CHECK(q.dim() == 3 && v.dim() == 3, "gated_delta_rule: q [T, Hk, Dk], v [T, Hv, Dv]");
  const int64_t T = q.size(0), Hk = q.size(1), Dk = q.size(2), Hv = v.size(1), Dv = v.size(2);
  TORCH_CHECK(Hk > 0 && Hv % Hk == 0, "gated_delta_rule: ", Hv, " value heads over ", Hk, " key heads");
  check_state(ssm_state, Hv, Dk, Dv, "gated_delta_rule ssm_state");
  const SType st = state_type(ssm_state, "gated_delta_rule ssm_state");
  const Batch B = batch(rows, seq_lens, T, ssm_state.size(0), "gated_delta_rule");
  auto o = at::empty({T, Hv, Dv}, v.options().memory_format(at::MemoryFormat::Contiguous));
  const Gdr A{input(q, T, Hk, Dk, "gated_delta_rule q"), input(k, T, Hk, Dk, "gated_delta_rule k"),
              input(v, T, Hv, Dv, "gated_delta_rule v"), input(g, T, Hv, 0, "gated_delta_rule g"),
              input(beta, T, Hv, 0, "gated_delta_rule beta"), o.data_ptr<float>(), (char*)ssm_state.data_ptr(),
              ssm_state.stride(0) * type_size(st), st, Hk, Hv, Dk, Dv, tiled};
  const bool wide = use_avx512();
  // A decode batch (a token per request) over float32 states takes a head's whole rows of 128
  // columns per block: its state streams contiguously, where blocks of 64 read half of each row,
  // and the op runs ~2x faster from memory. (More tokens: 64, whose registers hold the next
  // token's sums too.)
  const bool decode = st == SType::F32 && std::all_of(B.len.begin(), B.len.end(), [](int64_t n) { return n <= 1; });
  const int64_t W = !wide ? 32 : decode && Dv % 128 == 0 ? 128 : 64, nb = (Dv + W - 1) / W, per_req = Hv * nb;
  const GdrStep step = !wide ? gdr_step_avx2 : W == 128 ? gdr_step_avx512<8> : gdr_step_avx512<4>;
  const int64_t n = (int64_t)B.rows.size() * per_req;
  run_items(n, (T + 1) * Hv * Dk * Dv > SERIAL_WORK, [&](int64_t i, std::vector<float>& scratch) {
    const int64_t r = B.order[i / per_req], h = i % per_req / nb, c0 = i % nb * W;
    gdr_block(A, B, r, h, c0, W, step, scratch);
  });
  return o;
}

namespace {

at::Tensor gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                            const at::Tensor& beta, at::Tensor& ssm_state, const at::Tensor& rows,
                            at::IntArrayRef seq_lens) {
  return gated_delta_rule_run(q, k, v, g, beta, ssm_state, rows, seq_lens, false);
}

// The ISA the delta rules' steps use ("avx512" or "avx2"); `isa` non-empty switches first.
std::string linear_attn_isa(const std::string& isa) {
  if (!isa.empty()) {
    TORCH_CHECK(isa == "avx2" || isa == "avx512", "linear_attn_isa: isa must be 'avx2' or 'avx512', got '", isa, "'");
    TORCH_CHECK(isa == "avx2" || avx512_supported(), "linear_attn_isa: this CPU has no AVX-512");
    use_avx512() = isa == "avx512";
  }
  return use_avx512() ? "avx512" : "avx2";
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("gated_delta_rule(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor(a!) ssm_state, Tensor rows, "
        "int[] seq_lens) -> Tensor");
  m.def("linear_attn_isa(str isa=\"\") -> str", &linear_attn_isa);
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) {
  m.impl("gated_delta_rule", &gated_delta_rule);
}

}  // namespace linear_attn
}  // namespace radixlm
