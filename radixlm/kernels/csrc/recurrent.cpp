// The causal conv1d with its state and Mamba-2's SSD update of hybrid models' state layers
// (recurrent.h: how the work is split, and the helpers they share with gated_delta.cpp's gated delta
// rule).
#include "recurrent.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace radixlm {
namespace linear_attn {  // named: the unity build puts this file beside others' anonymous helpers
namespace {

// ---- causal conv1d -------------------------------------------------------------------------------

struct Conv {
  const float *x, *w, *bias;
  int64_t x_t, w_c, w_k;  // strides
  char* state;
  int64_t slot_bytes;
  SType st;
  float* y;
  int64_t C, K;
  bool silu;
};

inline __m256 silu8(__m256 v) {
  return _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), v))));
}

constexpr int64_t MAX_K = 16;

// One token's outputs over cw channels: in[j] is the input row j taps back (oldest first), wt the
// block's weights [K][cw].
template <bool SILU>
inline void conv_row(const float* const* in, const float* wt, const float* bias, int64_t K, int64_t cw, float* y) {
  int64_t c = 0;
  for (; c + 8 <= cw; c += 8) {
    __m256 acc = bias ? _mm256_loadu_ps(bias + c) : _mm256_setzero_ps();
    for (int64_t j = 0; j < K; ++j) acc = _mm256_fmadd_ps(_mm256_loadu_ps(wt + j * cw + c), _mm256_loadu_ps(in[j] + c), acc);
    _mm256_storeu_ps(y + c, SILU ? silu8(acc) : acc);
  }
  for (; c < cw; ++c) {
    float acc = bias ? bias[c] : 0.0f;
    for (int64_t j = 0; j < K; ++j) acc = std::fma(wt[j * cw + c], in[j][c], acc);
    y[c] = SILU ? acc / (1.0f + std::exp(-acc)) : acc;
  }
}

// wt [K][cw] = weight[c0 : c0 + cw, :]^T. A decode step's conv is a few multiply-adds per weight,
// so the common [C, 4] layout is transposed 8 channels at a time in registers.
void transpose_weights(const Conv& A, int64_t c0, int64_t cw, float* wt) {
  const int64_t K = A.K;
  int64_t c = 0;
  if (K == 4 && A.w_c == 4 && A.w_k == 1) {
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (; c + 8 <= cw; c += 8) {
      const float* w = A.w + (c0 + c) * 4;  // channels c..c+7, 4 taps each: 32 floats
      const __m256 r01 = _mm256_loadu_ps(w), r23 = _mm256_loadu_ps(w + 8);
      const __m256 r45 = _mm256_loadu_ps(w + 16), r67 = _mm256_loadu_ps(w + 24);
      // Per 128-bit lane: lo = taps 0, 1 and hi = taps 2, 3 of channels (0, 2) | (1, 3), ...
      const __m256 lo0 = _mm256_unpacklo_ps(r01, r23), hi0 = _mm256_unpackhi_ps(r01, r23);
      const __m256 lo1 = _mm256_unpacklo_ps(r45, r67), hi1 = _mm256_unpackhi_ps(r45, r67);
      // tap j of channels (0, 2, 4, 6 | 1, 3, 5, 7), then put in channel order.
      const __m256 t0 = _mm256_shuffle_ps(lo0, lo1, 0x44), t1 = _mm256_shuffle_ps(lo0, lo1, 0xEE);
      const __m256 t2 = _mm256_shuffle_ps(hi0, hi1, 0x44), t3 = _mm256_shuffle_ps(hi0, hi1, 0xEE);
      _mm256_storeu_ps(wt + c, _mm256_permutevar8x32_ps(t0, order));
      _mm256_storeu_ps(wt + cw + c, _mm256_permutevar8x32_ps(t1, order));
      _mm256_storeu_ps(wt + 2 * cw + c, _mm256_permutevar8x32_ps(t2, order));
      _mm256_storeu_ps(wt + 3 * cw + c, _mm256_permutevar8x32_ps(t3, order));
    }
  }
  for (int64_t j = 0; j < K; ++j)
    for (int64_t cc = c; cc < cw; ++cc) wt[j * cw + cc] = A.w[(c0 + cc) * A.w_c + j * A.w_k];
}

// Channels [c0, c0 + cw) of every request: the block's weights transposed once ([K][cw]), then per
// request its history (converted, a copy: the new history may overwrite rows still to be read).
void conv_block(const Conv& A, const Batch& B, int64_t c0, int64_t cw, std::vector<float>& scratch) {
  const int64_t K = A.K, H = K - 1, es = type_size(A.st);
  scratch.resize((K + H) * cw);
  float* wt = scratch.data();
  float* hist = wt + K * cw;
  transpose_weights(A, c0, cw, wt);
  for (const int64_t r : B.order) {
    const int64_t n = B.len[r], s0 = B.start[r];
    char* slot = A.state + B.rows[r] * A.slot_bytes + c0 * es;
    for (int64_t i = 0; i < H; ++i) state_load(slot + i * A.C * es, A.st, hist + i * cw, cw);
    // Row f of the request's inputs with its history in front (f < H: the history).
    auto src = [&](int64_t f) { return f < H ? hist + f * cw : A.x + (s0 + f - H) * A.x_t + c0; };
    const float* in[MAX_K];
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < K; ++j) in[j] = src(t + j);
      float* yt = A.y + (s0 + t) * A.C + c0;
      if (A.silu)
        conv_row<true>(in, wt, A.bias ? A.bias + c0 : nullptr, K, cw, yt);
      else
        conv_row<false>(in, wt, A.bias ? A.bias + c0 : nullptr, K, cw, yt);
    }
    for (int64_t i = 0; i < H; ++i) state_store(src(n + i), A.st, slot + i * A.C * es, cw);
  }
}

at::Tensor causal_conv1d(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias_,
                         at::Tensor& conv_state, const at::Tensor& rows, at::IntArrayRef seq_lens, bool silu) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.stride(1) == 1 && x.device().is_cpu(),
              "causal_conv1d x: float32 CPU [tokens, channels] with unit channel stride");
  const int64_t T = x.size(0), C = x.size(1);
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 2 && weight.size(0) == C && weight.size(1) >= 2 &&
                  weight.size(1) <= MAX_K,
              "causal_conv1d weight: float32 [", C, ", K] with 2 <= K <= ", MAX_K, ", got ", weight.sizes());
  const int64_t K = weight.size(1);
  at::Tensor bias;
  if (bias_.has_value()) {
    bias = bias_->contiguous();
    TORCH_CHECK(bias.scalar_type() == at::kFloat && bias.numel() == C, "causal_conv1d bias: float32 [", C, "]");
  }
  TORCH_CHECK(conv_state.dim() == 3 && conv_state.size(1) == K - 1 && conv_state.size(2) == C && conv_state.device().is_cpu(),
              "causal_conv1d conv_state: [slots, ", K - 1, ", ", C, "], got ", conv_state.sizes());
  TORCH_CHECK(conv_state.stride(2) == 1 && conv_state.stride(1) == C, "causal_conv1d conv_state: each slot must be contiguous");
  const SType st = state_type(conv_state, "causal_conv1d conv_state");
  const Batch B = batch(rows, seq_lens, T, conv_state.size(0), "causal_conv1d");
  auto y = at::empty({T, C}, x.options().memory_format(at::MemoryFormat::Contiguous));
  const Conv A{x.data_ptr<float>(), weight.data_ptr<float>(), bias.defined() ? bias.data_ptr<float>() : nullptr,
               x.stride(0), weight.stride(0), weight.stride(1), (char*)conv_state.data_ptr(),
               conv_state.stride(0) * type_size(st), st, y.data_ptr<float>(), C, K, silu};
  // Channel blocks: about 4 per thread (they cost the same), a multiple of 8 channels, 64 to 512.
  const int64_t threads = at::get_num_threads();
  const int64_t cb = std::max<int64_t>(64, std::min<int64_t>(512, (C / (4 * threads) + 7) / 8 * 8));
  const int64_t blocks = (C + cb - 1) / cb;
  const int64_t work = (T + (int64_t)B.rows.size() * (K - 1)) * C * K;
  run_items(blocks, work > SERIAL_WORK, [&](int64_t i, std::vector<float>& scratch) {
    conv_block(A, B, i * cb, std::min(cb, C - i * cb), scratch);
  });
  return y;
}
// ---- Mamba-2 SSD ---------------------------------------------------------------------------------

struct Ssd {
  In x, dt, b, c;
  const float* a;
  float* y;
  char* state;
  int64_t slot_bytes;
  SType st;
  int64_t H, G, P, N;
};

constexpr int64_t SSD_ROWS = 16;  // state rows (of P) per work item

// Request r, head h, rows [p0, p0 + pr) of its state: each row is independent of the others,
//   s = e s + (dt x[p]) b,  y[p] = s . c   (one pass over the row per token)
void ssd_block(const Ssd& A, const Batch& B, int64_t r, int64_t h, int64_t p0, std::vector<float>& scratch) {
  const int64_t N = A.N, Np = (N + 7) / 8 * 8, pr = std::min(SSD_ROWS, A.P - p0), es = type_size(A.st);
  const int64_t grp = h / (A.H / A.G);
  // The block's rows are contiguous: a float32 state whose rows fill whole vectors is advanced in
  // place; otherwise through a float32 copy with b and c zero-padded to whole vectors.
  const bool in_place = A.st == SType::F32 && N == Np;
  char* base = A.state + B.rows[r] * A.slot_bytes + (h * A.P + p0) * N * es;
  float *S = (float*)base, *bt = nullptr, *ct = nullptr;
  if (!in_place) {
    scratch.assign(pr * Np + 2 * Np, 0.0f);
    S = scratch.data();
    bt = S + pr * Np;
    ct = bt + Np;
    for (int64_t p = 0; p < pr; ++p) state_load(base + p * N * es, A.st, S + p * Np, N);
  }
  const float a = A.a[h];
  for (int64_t t = B.start[r]; t < B.start[r] + B.len[r]; ++t) {
    const float dt = *A.dt.at(t, h);
    const __m256 ev = _mm256_set1_ps(std::exp(dt * a));
    const float *b = A.b.at(t, grp), *c = A.c.at(t, grp);
    if (!in_place) {
      std::memcpy(bt, b, N * 4), std::memcpy(ct, c, N * 4);
      b = bt, c = ct;
    }
    const float* x = A.x.at(t, h) + p0;
    float* y = A.y + (t * A.H + h) * A.P + p0;
    for (int64_t p = 0; p < pr; ++p) {
      const __m256 xd = _mm256_set1_ps(dt * x[p]);
      float* s = S + p * Np;
      __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;  // two chains: one would wait on each FMA
      int64_t j = 0;
      for (; j + 16 <= Np; j += 16) {
        const __m256 s0 = _mm256_fmadd_ps(xd, _mm256_loadu_ps(b + j), _mm256_mul_ps(ev, _mm256_loadu_ps(s + j)));
        const __m256 s1 = _mm256_fmadd_ps(xd, _mm256_loadu_ps(b + j + 8), _mm256_mul_ps(ev, _mm256_loadu_ps(s + j + 8)));
        _mm256_storeu_ps(s + j, s0);
        _mm256_storeu_ps(s + j + 8, s1);
        acc0 = _mm256_fmadd_ps(s0, _mm256_loadu_ps(c + j), acc0);
        acc1 = _mm256_fmadd_ps(s1, _mm256_loadu_ps(c + j + 8), acc1);
      }
      if (j < Np) {
        const __m256 s0 = _mm256_fmadd_ps(xd, _mm256_loadu_ps(b + j), _mm256_mul_ps(ev, _mm256_loadu_ps(s + j)));
        _mm256_storeu_ps(s + j, s0);
        acc0 = _mm256_fmadd_ps(s0, _mm256_loadu_ps(c + j), acc0);
      }
      y[p] = hsum(_mm256_add_ps(acc0, acc1));
    }
  }
  if (!in_place)
    for (int64_t p = 0; p < pr; ++p) state_store(S + p * Np, A.st, base + p * N * es, N);
}

at::Tensor ssd_update(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& a_, const at::Tensor& b,
                      const at::Tensor& c, at::Tensor& ssm_state, const at::Tensor& rows, at::IntArrayRef seq_lens) {
  TORCH_CHECK(x.dim() == 3 && b.dim() == 3, "ssd_update: x [T, H, P], b [T, G, N]");
  const int64_t T = x.size(0), H = x.size(1), P = x.size(2), G = b.size(1), N = b.size(2);
  TORCH_CHECK(G > 0 && H % G == 0, "ssd_update: ", H, " heads over ", G, " groups");
  const at::Tensor a = a_.contiguous();
  TORCH_CHECK(a.scalar_type() == at::kFloat && a.numel() == H && a.device().is_cpu(), "ssd_update a: float32 [", H, "]");
  check_state(ssm_state, H, P, N, "ssd_update ssm_state");
  const SType st = state_type(ssm_state, "ssd_update ssm_state");
  const Batch B = batch(rows, seq_lens, T, ssm_state.size(0), "ssd_update");
  auto y = at::empty({T, H, P}, x.options().memory_format(at::MemoryFormat::Contiguous));
  const Ssd A{input(x, T, H, P, "ssd_update x"), input(dt, T, H, 0, "ssd_update dt"), input(b, T, G, N, "ssd_update b"),
              input(c, T, G, N, "ssd_update c"), a.data_ptr<float>(), y.data_ptr<float>(), (char*)ssm_state.data_ptr(),
              ssm_state.stride(0) * type_size(st), st, H, G, P, N};
  const int64_t nb = (P + SSD_ROWS - 1) / SSD_ROWS, per_req = H * nb;
  const int64_t n = (int64_t)B.rows.size() * per_req;
  run_items(n, (T + 1) * H * P * N > SERIAL_WORK, [&](int64_t i, std::vector<float>& scratch) {
    const int64_t r = B.order[i / per_req], h = i % per_req / nb, p0 = i % nb * SSD_ROWS;
    ssd_block(A, B, r, h, p0, scratch);
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("causal_conv1d(Tensor x, Tensor weight, Tensor? bias, Tensor(a!) conv_state, Tensor rows, int[] seq_lens, "
        "bool silu) -> Tensor");
  m.def("ssd_update(Tensor x, Tensor dt, Tensor a, Tensor b, Tensor c, Tensor(a!) ssm_state, Tensor rows, "
        "int[] seq_lens) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) {
  m.impl("causal_conv1d", &causal_conv1d);
  m.impl("ssd_update", &ssd_update);
}

}  // namespace linear_attn

namespace api {
at::Tensor causal_conv1d(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                         at::Tensor& conv_state, const at::Tensor& rows, at::IntArrayRef seq_lens, bool silu) {
  return linear_attn::causal_conv1d(x, weight, bias, conv_state, rows, seq_lens, silu);
}
}  // namespace api
}  // namespace radixlm
