// The experts' half of a mixture-of-experts layer in one op (SGLang's fused_moe, on the CPU
// kernels): the (token, slot) pairs are grouped by expert, each expert touched runs one matmul over
// its tokens for gate and up (w13 = [gate; up] rows), SiLU(gate) * up, one matmul for down (w2), and
// each token sums its k rows scaled by their routing weights. Only the experts some token chose are
// read, so a decode step streams k experts' bytes, not E.
//
// The matmuls are the qlinear kernels' own (gemm_quantized: row-major, 8-row interleaved with the
// run-time AVX2 / AVX-512 VNNI choice, the GGUF formats; gemm_float16), called on slices of an
// expert's rows. Work is (expert, block of rows) tasks on ATen's threads, taken from a shared
// counter heaviest expert first; the kernels' own parallel_for runs inline inside a task.
//
// Batch invariance: every output element of the kernels is computed by the same operations
// whatever the batch and the slice (quant_rows.h, x8_tiles.h), activations are quantized per row,
// SiLU's vector / scalar split depends on the column only (blocks start at multiples of 8), and a
// token sums its k rows in slot order. So a token's output is bitwise the same alone or in any
// batch, like the dense path's (model/layers/quantized.py).
#include "api.h"
#include "qact.h"
#include "quant_rows.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

namespace radixlm {
namespace {

// One projection's stacked experts: expert e's stored rows start at base + e * expert_bytes.
struct Experts {
  const uint8_t* base;
  int64_t fmt, group, row_bytes, expert_bytes, rows, cols;
  const uint8_t* at(int64_t e, int64_t row) const { return base + e * expert_bytes + (row / group) * row_bytes; }
};

Experts check_experts(const at::Tensor& w, int64_t fmt, int64_t cols, const char* name) {
  TORCH_CHECK(w.dtype() == at::kByte && w.dim() == 3 && w.is_contiguous(), "fused_moe: ", name,
              " must be contiguous uint8 [experts, stored rows, row bytes]");
  TORCH_CHECK(cols % fmt_block(fmt) == 0, "fused_moe: ", name, " has ", cols, " columns, not a multiple of its format's block ",
              fmt_block(fmt));
  TORCH_CHECK(w.size(2) == fmt_row_bytes(fmt, cols), "fused_moe: ", name, " rows have ", w.size(2), " bytes, format ", fmt,
              " with ", cols, " columns needs ", fmt_row_bytes(fmt, cols));
  TORCH_CHECK(fmt_is_float16(fmt) || cols / 32 <= MAX_BLOCKS, "fused_moe: ", name, " in_features ", cols, " above ",
              MAX_BLOCKS * 32);
  const int64_t g = fmt_group(fmt);
  return Experts{w.data_ptr<uint8_t>(), fmt, g, w.size(2), w.size(1) * w.size(2), w.size(1) * g, cols};
}

// The gathered input rows of one matmul: fp32 as they are (16-bit float weights) or int8 blocks.
struct Acts {
  at::Tensor x, q, d, s;
  std::vector<int32_t> s16;  // the 16-value sums (MXFP4X8, the K-quants'), made once for all the tasks
  int64_t K = 0;
  bool per256 = false;

  // Rows src(r) for r < R; int8 blocks when fmt takes them.
  template <class Src>
  void make(int64_t fmt, int64_t R, int64_t K_, const Src& src, const at::TensorOptions& opt) {
    K = K_;
    if (fmt_is_float16(fmt)) {
      x = at::empty({R, K}, opt);
      float* xp = x.data_ptr<float>();
      at::parallel_for(0, R, 16, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) std::memcpy(xp + r * K, src(r), K * sizeof(float));
      });
      return;
    }
    q = at::empty({R, K}, opt.dtype(at::kChar));
    if (fmt_takes_k_acts(fmt)) {  // Q8_K-style (QAct::per256), the 16-value sums with them
      per256 = true;
      d = at::empty({R, K / 256}, opt);
      s16.resize(R * (K / 32));
      int8_t* qp = q.data_ptr<int8_t>();
      float* dp = d.data_ptr<float>();
      at::parallel_for(0, R, 16, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) quantize_row_k(src(r), qp + r * K, dp + r * (K / 256), s16.data() + r * (K / 32), K);
      });
      return;
    }
    d = at::empty({R, K / 32}, opt);
    s = at::empty({R, K / 32}, opt);
    int8_t* qp = q.data_ptr<int8_t>();
    float *dp = d.data_ptr<float>(), *sp = s.data_ptr<float>();
    at::parallel_for(0, R, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) quantize_row(src(r), qp + r * K, dp + r * (K / 32), sp + r * (K / 32), K);
    });
    if (fmt == FMT_MXFP4X8) {
      s16.resize(R * (K / 32));
      act_sums16(view(0), 0, R, s16.data());
    }
  }

  QAct view(int64_t m0) const {
    const int64_t nb = K / 32;
    if (per256)
      return QAct{q.data_ptr<int8_t>() + m0 * K, d.data_ptr<float>() + m0 * (nb / 8), nullptr, K, nb, s16.data() + m0 * nb, true};
    return QAct{q.data_ptr<int8_t>() + m0 * K, d.data_ptr<float>() + m0 * nb, s.data_ptr<float>() + m0 * nb, K, nb,
                s16.empty() ? nullptr : s16.data() + m0 * nb};
  }
};

// out[m, j] = act row m0 + m . weight row r0 + j of expert e, for m < M, j < n.
// bias: the n values of rows r0.. (nullptr: none).
void expert_matmul(const Experts& w, int64_t e, int64_t r0, int64_t n, const Acts& a, int64_t m0, int64_t M, float* out,
                   int64_t ldo, const float* bias) {
  if (fmt_is_float16(w.fmt)) {
    gemm_float16(w.fmt, w.at(e, r0), w.row_bytes, n, a.x.data_ptr<float>() + m0 * a.K, a.K, M, a.K, out, ldo, bias);
  } else {
    gemm_quantized(w.fmt, w.at(e, r0), w.row_bytes, n, a.view(m0), M, out, ldo, bias);
  }
}

// o[i] = silu(g[i]) * u[i] for columns [i0, i1) of a row of width I; the vector / scalar choice
// is fused.cpp's silu_and_mul's (by column), so each value is that op's.
void silu_mul(const float* g, const float* u, float* o, int64_t i0, int64_t i1, int64_t I) {
  int64_t i = i0;
  for (; i + 8 <= i1 && i + 8 <= I; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 sv = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
    _mm256_storeu_ps(o + i, _mm256_mul_ps(sv, _mm256_loadu_ps(u + i)));
  }
  for (; i < i1; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

// gpt-oss's clamped SwiGLU (HF GptOssExperts._apply_gate, SGLang's activation "swiglu"): gate clamped
// above and up on both sides at limit, then (up + 1) * gate * sigmoid(alpha * gate); columns
// [i0, i1) as silu_mul, the vector / scalar split by column alike.
void swiglu_clamp_mul(const float* g, const float* u, float* o, int64_t i0, int64_t i1, int64_t I, float alpha,
                      float limit) {
  const __m256 one = _mm256_set1_ps(1.0f), lim = _mm256_set1_ps(limit), nlim = _mm256_set1_ps(-limit);
  const __m256 av = _mm256_set1_ps(alpha);
  int64_t i = i0;
  for (; i + 8 <= i1 && i + 8 <= I; i += 8) {
    const __m256 gv = _mm256_min_ps(_mm256_loadu_ps(g + i), lim);
    const __m256 uv = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(u + i), nlim), lim);
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(gv, av)));
    const __m256 glu = _mm256_div_ps(gv, _mm256_add_ps(one, e));
    _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_add_ps(uv, one), glu));
  }
  for (; i < i1; ++i) {
    const float gi = std::min(g[i], limit), ui = std::min(std::max(u[i], -limit), limit);
    o[i] = (ui + 1.0f) * (gi / (1.0f + std::exp(-gi * alpha)));
  }
}

// Tasks 0..n-1 on ATen's threads, each taken from a shared counter (tasks differ in cost).
template <class F>
void run_tasks(int64_t n, const F& f) {
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(n, at::get_num_threads()));
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) f(i);
  });
}

// Rows per task over `rows` output rows: a multiple of 8 (the interleaved groups, and SiLU's vector
// columns) giving the active experts about 4 tasks per thread together.
int64_t block_rows(int64_t rows, int64_t active) {
  const int64_t per_expert = std::max<int64_t>(1, (4 * at::get_num_threads() + active - 1) / active);
  const int64_t b = ((rows + per_expert - 1) / per_expert + 7) / 8 * 8;
  return std::max<int64_t>(16, std::min(b, (rows + 7) / 8 * 8));
}

// Where a phase's shared-expert tasks sit among its routed ones: `count` blocks of `rows` from
// task `first` (0: before the routed tasks; their number: after them).
struct SharedTasks {
  int64_t first = 0, count = 0, rows = 1;
  bool has(int64_t task) const { return task >= first && task < first + count; }
  int64_t routed(int64_t task) const { return task >= first ? task - count : task; }  // its routed index
};

// The shared expert's tasks over its `total` rows: last, a piece per thread (whole 8-row groups, 16
// rows at least, as block_rows), or first in blocks of `block` rows.
SharedTasks shared_tasks(bool last, int64_t total, int64_t block, int64_t routed_tasks) {
  const int64_t pieces = at::get_num_threads();
  const int64_t rows = last ? std::max<int64_t>(16, (total + 8 * pieces - 1) / (8 * pieces) * 8) : block;
  return SharedTasks{last ? routed_tasks : 0, (total + rows - 1) / rows, rows};
}

// The shared expert (Qwen2-MoE's, Qwen3.5-MoE's): a dense SwiGLU MLP every token runs, its output
// scaled by the token's gate and added after the routed rows (SparseMoeBlock's
// `out + sigmoid(gate) * shared`: mul, then add). Its matmuls join the routed experts' task pools,
// so its weights stream on both threads beside theirs rather than as GEMVs of their own.
struct Shared {
  std::vector<Experts> gate_up;  // the projection's segments: consecutive rows of [gate; up]
  std::vector<int64_t> starts;   // each segment's first row, then 2 * I
  Experts down;
  int64_t act_fmt;    // a gate_up segment's format: float rows or int8 blocks, Q6_KX8's sums
  const float* gate;  // [T]: the tokens' sigmoid gates
  int64_t I;
};

// out[m, j] = act row m . row r0 + j of a projection in segments, for m < M, j < n.
void segments_matmul(const std::vector<Experts>& segs, const std::vector<int64_t>& starts, int64_t r0, int64_t n,
                     const Acts& a, int64_t M, float* out, int64_t ldo) {
  for (size_t j = 0; j < segs.size(); ++j) {
    const int64_t lo = std::max(r0, starts[j]), hi = std::min(r0 + n, starts[j + 1]);
    if (lo < hi) expert_matmul(segs[j], 0, lo - starts[j], hi - lo, a, 0, M, out + (lo - r0), ldo, nullptr);
  }
}

// o[h] = o[h] + w * y[h] (two roundings, as torch's `o + w * y`).
void add_scaled(float* o, const float* y, float w, int64_t H) {
  const __m256 wv = _mm256_set1_ps(w);
  int64_t h = 0;
  for (; h + 8 <= H; h += 8)
    _mm256_storeu_ps(o + h, _mm256_add_ps(_mm256_loadu_ps(o + h), _mm256_mul_ps(wv, _mm256_loadu_ps(y + h))));
  for (; h < H; ++h) o[h] = o[h] + w * y[h];
}

// The activation for columns [i0, i1) of the rows [m0, m1) of gate;up pairs (width 2I) into act (width I).
struct Activation {
  bool swiglu;
  float alpha, limit;
  void operator()(const float* gu, float* act, int64_t m0, int64_t m1, int64_t i0, int64_t i1, int64_t I) const {
    for (int64_t m = m0; m < m1; ++m) {
      const float *g = gu + m * 2 * I, *u = g + I;
      if (swiglu)
        swiglu_clamp_mul(g, u, act + m * I, i0, i1, I, alpha, limit);
      else
        silu_mul(g, u, act + m * I, i0, i1, I);
    }
  }
};

// fused_moe's work after its checks: the routed (token, slot) pairs and, when given, every token's
// shared-expert row, through w13, the activation and w2; then each token's sum.
at::Tensor run_experts(const at::Tensor& hidden, const at::Tensor& ids, const at::Tensor& tw, const Experts& w13,
                       const Experts& w2, int64_t E, const float* b13p, const float* b2p, const Activation& activate,
                       const Shared* sh) {
  const int64_t T = hidden.size(0), H = hidden.size(1), k = ids.size(1), I2 = w13.rows, I = I2 / 2;
  at::Tensor out = at::zeros({T, H}, hidden.options());
  if (T == 0 || (k == 0 && !sh)) return out;

  // Group the (token, slot) pairs by expert, in flat order within an expert: row_of[t * k + j] is
  // the pair's row in the gathered buffers, -1 for id -1 (an expert another rank holds).
  const int64_t* ip = ids.data_ptr<int64_t>();
  std::vector<int64_t> count(E + 1, 0), row_of(T * k, -1);
  for (int64_t i = 0; i < T * k; ++i) {
    TORCH_CHECK(ip[i] >= -1 && ip[i] < E, "fused_moe: topk_ids value ", ip[i], " out of range [0, ", E, ") (or -1: skipped)");
    if (ip[i] >= 0) ++count[ip[i] + 1];
  }
  std::vector<int64_t> start(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) start[e + 1] = start[e] + count[e + 1];
  const int64_t R = start[E];
  if (R == 0 && !sh) return out;
  std::vector<int64_t> fill(start.begin(), start.end() - 1), token_of(R);
  for (int64_t i = 0; i < T * k; ++i)
    if (ip[i] >= 0) token_of[row_of[i] = fill[ip[i]]++] = i / k;
  std::vector<int64_t> experts;  // those touched, most rows first (their tasks are the longest)
  for (int64_t e = 0; e < E; ++e)
    if (start[e + 1] > start[e]) experts.push_back(e);
  std::stable_sort(experts.begin(), experts.end(),
                   [&](int64_t a, int64_t b) { return start[a + 1] - start[a] > start[b + 1] - start[b]; });
  const int64_t active = experts.size(), units = active + (sh ? 1 : 0);
  const int64_t Is = sh ? sh->I : 0;

  // gate and up for a block of intermediate columns, then the activation into act.
  const float* hp = hidden.data_ptr<float>();
  Acts x, xs;
  x.make(w13.fmt, R, H, [&](int64_t r) { return hp + token_of[r] * H; }, hidden.options());
  if (sh) xs.make(sh->act_fmt, T, H, [&](int64_t r) { return hp + r * H; }, hidden.options());
  at::Tensor gu = at::empty({R, I2}, hidden.options()), act = at::empty({R, I}, hidden.options());
  at::Tensor sgu = at::empty({sh ? T : 0, 2 * Is}, hidden.options()), sact = at::empty({sh ? T : 0, Is}, hidden.options());
  float *gup = gu.data_ptr<float>(), *actp = act.data_ptr<float>();
  float *sgup = sgu.data_ptr<float>(), *sactp = sact.data_ptr<float>();
  // Tasks heaviest first. At decode every expert has the same rows, so the shared expert goes
  // last, in a piece per thread: after the routed experts' tasks it evens the threads out.
  const bool shared_last = sh && (active == 0 || T <= start[experts[0] + 1] - start[experts[0]]);
  const int64_t routed_units = std::max<int64_t>(1, shared_last ? active : units);  // (none: the shared alone)
  const int64_t bi = block_rows(I, routed_units), nbi = (I + bi - 1) / bi;
  const SharedTasks s1 = sh ? shared_tasks(shared_last, Is, block_rows(Is, units), active * nbi) : SharedTasks{};
  run_tasks(s1.count + active * nbi, [&](int64_t task) {
    if (s1.has(task)) {
      const int64_t i0 = (task - s1.first) * s1.rows, n = std::min(s1.rows, Is - i0);
      segments_matmul(sh->gate_up, sh->starts, i0, n, xs, T, sgup + i0, 2 * Is);
      segments_matmul(sh->gate_up, sh->starts, Is + i0, n, xs, T, sgup + Is + i0, 2 * Is);
      Activation{false, 0.0f, 0.0f}(sgup, sactp, 0, T, i0, i0 + n, Is);
      return;
    }
    task = s1.routed(task);
    const int64_t e = experts[task / nbi], i0 = (task % nbi) * bi, n = std::min(bi, I - i0);
    const int64_t m0 = start[e], M = start[e + 1] - m0;
    const float* bg = b13p ? b13p + e * I2 + i0 : nullptr;
    expert_matmul(w13, e, i0, n, x, m0, M, gup + m0 * I2 + i0, I2, bg);
    expert_matmul(w13, e, I + i0, n, x, m0, M, gup + m0 * I2 + I + i0, I2, bg ? bg + I : nullptr);
    activate(gup, actp, m0, m0 + M, i0, i0 + n, I);
  });

  // down, per block of hidden columns.
  Acts a, as;
  a.make(w2.fmt, R, I, [&](int64_t r) { return actp + r * I; }, hidden.options());
  if (sh) as.make(sh->down.fmt, T, Is, [&](int64_t r) { return sactp + r * Is; }, hidden.options());
  at::Tensor y = at::empty({R, H}, hidden.options()), sy = at::empty({sh ? T : 0, H}, hidden.options());
  float *yp = y.data_ptr<float>(), *syp = sy.data_ptr<float>();
  const int64_t bh = block_rows(H, routed_units), nbh = (H + bh - 1) / bh;
  const SharedTasks s2 = sh ? shared_tasks(shared_last, H, bh, active * nbh) : SharedTasks{};
  run_tasks(s2.count + active * nbh, [&](int64_t task) {
    if (s2.has(task)) {
      const int64_t h0 = (task - s2.first) * s2.rows;
      expert_matmul(sh->down, 0, h0, std::min(s2.rows, H - h0), as, 0, T, syp + h0, H, nullptr);
      return;
    }
    task = s2.routed(task);
    const int64_t e = experts[task / nbh], h0 = (task % nbh) * bh;
    const int64_t m0 = start[e], M = start[e + 1] - m0;
    expert_matmul(w2, e, h0, std::min(bh, H - h0), a, m0, M, yp + m0 * H + h0, H, b2p ? b2p + e * H + h0 : nullptr);
  });

  // Each token: its rows times their weights, summed in slot order, then its gated shared row.
  const float* wp = tw.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = row_of[t * k + j];
        if (r >= 0) add_scaled(op + t * H, yp + r * H, wp[t * k + j], H);
      }
      if (sh) add_scaled(op + t * H, syp + t * H, sh->gate[t], H);
    }
  });
  return out;
}

// Optional per-expert biases (b13 [E, 2I] in w13's row order, b2 [E, H]) and the activation: "silu"
// (SiLU(gate) * up) or "swiglu" (gpt-oss's clamped one, with alpha and limit), as SGLang's
// fused_experts takes them (b1, b2, activation, gemm1_alpha, gemm1_limit).
at::Tensor fused_moe(const at::Tensor& hidden_, const at::Tensor& topk_ids_, const at::Tensor& topk_weights_,
                     const at::Tensor& w13_, int64_t w13_fmt, const at::Tensor& w2_, int64_t w2_fmt,
                     const c10::optional<at::Tensor>& b13_, const c10::optional<at::Tensor>& b2_,
                     c10::string_view activation, double alpha, double limit, const Shared* shared = nullptr) {
  TORCH_CHECK(hidden_.dtype() == at::kFloat && hidden_.dim() == 2, "fused_moe: hidden must be float32 [tokens, hidden]");
  const at::Tensor hidden = hidden_.contiguous();
  const int64_t T = hidden.size(0), H = hidden.size(1);
  TORCH_CHECK(topk_ids_.dim() == 2 && topk_ids_.size(0) == T && !at::isFloatingType(topk_ids_.scalar_type()),
              "fused_moe: topk_ids must be integer [tokens, top_k]");
  TORCH_CHECK(topk_weights_.dtype() == at::kFloat && topk_weights_.sizes() == topk_ids_.sizes(),
              "fused_moe: topk_weights must be float32 shaped like topk_ids");
  const at::Tensor ids = topk_ids_.to(at::kLong).contiguous(), tw = topk_weights_.contiguous();
  TORCH_CHECK(w13_.dim() == 3 && w2_.dim() == 3 && w13_.size(0) == w2_.size(0), "fused_moe: w13 and w2 must be [experts, ...] with the same experts");
  const int64_t E = w13_.size(0), I2 = w13_.size(1) * fmt_group(w13_fmt), I = I2 / 2;
  TORCH_CHECK(I2 % 2 == 0, "fused_moe: w13 must have an even number of rows (gate; up), got ", I2);
  TORCH_CHECK(!fmt_is_x8(w13_fmt) || I % 8 == 0, "fused_moe: interleaved w13 needs gate and up rows in multiples of 8");
  const Experts w13 = check_experts(w13_, w13_fmt, H, "w13"), w2 = check_experts(w2_, w2_fmt, I, "w2");
  TORCH_CHECK(w2.rows == H, "fused_moe: w2 has ", w2.rows, " rows per expert, hidden size is ", H);
  TORCH_CHECK(activation == "silu" || activation == "swiglu", "fused_moe: activation must be 'silu' or 'swiglu', got '",
              std::string(activation), "'");
  at::Tensor b13, b2;
  if (b13_) {
    b13 = b13_->contiguous();
    TORCH_CHECK(b13.dtype() == at::kFloat && b13.dim() == 2 && b13.size(0) == E && b13.size(1) == I2,
                "fused_moe: b13 must be float32 [experts, 2 * intermediate] = [", E, ", ", I2, "]");
  }
  if (b2_) {
    b2 = b2_->contiguous();
    TORCH_CHECK(b2.dtype() == at::kFloat && b2.dim() == 2 && b2.size(0) == E && b2.size(1) == H,
                "fused_moe: b2 must be float32 [experts, hidden] = [", E, ", ", H, "]");
  }
  const float* b13p = b13.defined() ? b13.data_ptr<float>() : nullptr;
  const float* b2p = b2.defined() ? b2.data_ptr<float>() : nullptr;
  const Activation activate{activation == "swiglu", float(alpha), float(limit)};
  return run_experts(hidden, ids, tw, w13, w2, E, b13p, b2p, activate, shared);
}

// The shared expert's weights as run_experts takes them, or nullopt where they cannot join the
// routed tasks bitwise as the dense layers compute them: float and int8-block segments mixed, or
// interleaved rows whose 8-row groups a task's block would split.
c10::optional<Shared> shared_of(const api::SharedExpertWeights& w, int64_t H, const float* gate) {
  const int64_t n = w.gate_up.size();
  if (n == 0 || (int64_t)w.gate_up_fmts.size() != n || w.down.dim() != 2) return c10::nullopt;
  Shared sh{{}, {0}, {}, w.gate_up_fmts[0], gate, 0};
  bool any_x8 = fmt_is_x8(w.down_fmt), any_float = false, any_int = false;
  for (int64_t j = 0; j < n; ++j) {
    const at::Tensor& seg = w.gate_up[j];
    const int64_t fmt = w.gate_up_fmts[j];
    if (seg.dim() != 2) return c10::nullopt;
    sh.gate_up.push_back(check_experts(seg.unsqueeze(0), fmt, H, "the shared expert's gate_up"));
    sh.starts.push_back(sh.starts.back() + sh.gate_up.back().rows);
    any_x8 |= fmt_is_x8(fmt);
    (fmt_is_float16(fmt) ? any_float : any_int) = true;
    if (fmt == FMT_Q6KX8 || fmt == FMT_MXFP4X8) sh.act_fmt = fmt;  // its activations carry the 16-value sums
  }
  const int64_t rows = sh.starts.back();
  sh.I = rows / 2;
  if (rows % 2 || (any_float && any_int)) return c10::nullopt;
  if (any_x8 && (sh.I % 8 || std::any_of(sh.starts.begin(), sh.starts.end(), [](int64_t r) { return r % 8; })))
    return c10::nullopt;
  sh.down = check_experts(w.down.unsqueeze(0), w.down_fmt, sh.I, "the shared expert's down");
  if (sh.down.rows != H) return c10::nullopt;
  return sh;
}

}  // namespace

namespace api {
bool shared_expert_joins(const SharedExpertWeights& w, int64_t hidden) {
  return shared_of(w, hidden, nullptr).has_value();
}

at::Tensor fused_moe_shared(const at::Tensor& hidden, const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                            const at::Tensor& w13, int64_t w13_fmt, const at::Tensor& w2, int64_t w2_fmt,
                            const SharedExpertWeights& shared, const at::Tensor& shared_gate) {
  TORCH_CHECK(shared_gate.dtype() == at::kFloat && shared_gate.numel() == hidden.size(0) && shared_gate.is_contiguous(),
              "fused_moe_shared: shared_gate must be float32 with a value per token");
  const c10::optional<Shared> sh = shared_of(shared, hidden.size(1), shared_gate.data_ptr<float>());
  TORCH_CHECK(sh, "fused_moe_shared: the shared expert's segments cannot join the experts' tasks (shared_expert_joins)");
  return radixlm::fused_moe(hidden, topk_ids, topk_weights, w13, w13_fmt, w2, w2_fmt, c10::nullopt, c10::nullopt,
                            "silu", 0.0, 0.0, &*sh);
}

at::Tensor fused_moe(const at::Tensor& hidden, const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                     const at::Tensor& w13, int64_t w13_fmt, const at::Tensor& w2, int64_t w2_fmt,
                     const c10::optional<at::Tensor>& b13, const c10::optional<at::Tensor>& b2,
                     c10::string_view activation, double alpha, double limit) {
  return radixlm::fused_moe(hidden, topk_ids, topk_weights, w13, w13_fmt, w2, w2_fmt, b13, b2, activation, alpha, limit);
}
}  // namespace api

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("fused_moe(Tensor hidden, Tensor topk_ids, Tensor topk_weights, Tensor w13, int w13_fmt, Tensor w2, "
        "int w2_fmt, Tensor? b13=None, Tensor? b2=None, str activation='silu', float alpha=0., float limit=0.) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("fused_moe", &api::fused_moe); }

}  // namespace radixlm
