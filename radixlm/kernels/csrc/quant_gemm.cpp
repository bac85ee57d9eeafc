// Linear layers on quantized weights (GGUF block formats and per-channel int8), llama.cpp's way:
// activations are quantized to int8 per 32 values, each weight block is unpacked to bytes once
// and dotted with up to 4 activation rows by integer multiply-adds; fp32 scales fold in per block.
#include "quant_rows.h"

#include <algorithm>
#include <vector>

namespace radixlm {
namespace {

// ---- 32-value block formats (Q8_0, Q4_0, Q4_1, per-channel int8), for gemm32 (quant_rows.h) ----
struct FQ8_0 {
  static constexpr int64_t bytes = 34, header = 0;
  static constexpr bool is_signed = true, has_offset = false;
  static inline __m256i unpack(const uint8_t* blk, float& dw, float& off) {
    dw = fp16(blk), off = 0.0f;
    return _mm256_loadu_si256((const __m256i*)(blk + 2));
  }
  static inline float row_scale(const uint8_t*) { return 1.0f; }
};
struct FI8 {  // a row: fp32 scale, then int8 values; the scale multiplies the finished dot
  static constexpr int64_t bytes = 32, header = 4;
  static constexpr bool is_signed = true, has_offset = false;
  static inline __m256i unpack(const uint8_t* blk, float& dw, float& off) {
    dw = 1.0f, off = 0.0f;
    return _mm256_loadu_si256((const __m256i*)blk);
  }
  static inline float row_scale(const uint8_t* row) {
    float s;
    std::memcpy(&s, row, 4);
    return s;
  }
};
// Q4_0 and Q4_1: nibbles 0..15 dotted as unsigned bytes; the offset (-8 d, or + m) folds in
// through the activation block's sum.
template <bool HasMin>
struct FQ4 {
  static constexpr int64_t bytes = HasMin ? 20 : 18, header = 0;
  static constexpr bool is_signed = false, has_offset = true;
  static inline __m256i unpack(const uint8_t* blk, float& dw, float& off) {
    dw = fp16(blk);
    off = HasMin ? fp16(blk + 2) : -8.0f * dw;
    const __m128i raw = _mm_loadu_si128((const __m128i*)(blk + (HasMin ? 4 : 2)));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F));
  }
  static inline float row_scale(const uint8_t*) { return 1.0f; }
};

// ---- K-quants, for gemm<K> (quant_rows.h) ----
struct KQ4_K {
  template <int R>
  static void run(const uint8_t* w, const QAct& a, int64_t m, float* res) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[R];
    float corr[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), corr[r] = 0.0f;
    for (int64_t b = 0; b < a.nb / 8; ++b) {
      const uint8_t* blk = w + b * 144;
      const float d = fp16(blk), dmin = fp16(blk + 2);
      const uint8_t* qs = blk + 16;
      for (int j = 0; j < 4; ++j) {
        uint8_t sc0, mn0, sc1, mn1;
        q4k_scale_min(2 * j, blk + 4, &sc0, &mn0);
        q4k_scale_min(2 * j + 1, blk + 4, &sc1, &mn1);
        const __m256i raw = _mm256_loadu_si256((const __m256i*)(qs + 32 * j));
        const __m256i lo = _mm256_and_si256(raw, m4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
        const int64_t ab = 8 * b + 2 * j;
        for (int r = 0; r < R; ++r) {
          const int8_t* aq = a.qrow(m + r) + ab * 32;
          const float* ad = a.drow(m + r) + ab;
          const float* as = a.srow(m + r) + ab;
          const __m256i a0 = _mm256_loadu_si256((const __m256i*)aq);
          const __m256i a1 = _mm256_loadu_si256((const __m256i*)(aq + 32));
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_us(lo, a0)), _mm256_set1_ps(d * sc0 * ad[0]), acc[r]);
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_us(hi, a1)), _mm256_set1_ps(d * sc1 * ad[1]), acc[r]);
          corr[r] += dmin * (mn0 * as[0] + mn1 * as[1]);
        }
      }
    }
    for (int r = 0; r < R; ++r) res[r] = hsum(acc[r]) - corr[r];
  }
};

struct KQ6_K {
  template <int R>
  static void run(const uint8_t* w, const QAct& a, int64_t m, float* res) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3), c32 = _mm256_set1_epi8(32);
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < a.nb / 8; ++b) {
      const uint8_t* blk = w + b * 210;
      const int8_t* sc = (const int8_t*)(blk + 192);
      const float d = fp16(blk + 208);
      for (int n = 0; n < 2; ++n) {
        const __m256i l0 = _mm256_loadu_si256((const __m256i*)(blk + 64 * n));
        const __m256i l1 = _mm256_loadu_si256((const __m256i*)(blk + 64 * n + 32));
        const __m256i h = _mm256_loadu_si256((const __m256i*)(blk + 128 + 32 * n));
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m3), 4));
        q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m3), 4));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m3), 4));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m3), 4));
        for (int k = 0; k < 4; ++k) {
          const __m256i wq = _mm256_sub_epi8(q[k], c32);
          const __m256i wu = _mm256_sign_epi8(wq, wq);
          // 16 values per scale: the low 128-bit lane holds the first 16, the high lane the rest.
          const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[8 * n + 2 * k + 1]), _mm_set1_epi16(sc[8 * n + 2 * k]));
          const int64_t ab = 8 * b + 4 * n + k;
          for (int r = 0; r < R; ++r) {
            const __m256i av = _mm256_loadu_si256((const __m256i*)(a.qrow(m + r) + ab * 32));
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wu, _mm256_sign_epi8(av, wq)), scv);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * a.drow(m + r)[ab]), acc[r]);
          }
        }
      }
    }
    for (int r = 0; r < R; ++r) res[r] = hsum(acc[r]);
  }
};

}  // namespace

void gemm_quantized(int64_t fmt, const uint8_t* W, int64_t rb, int64_t N, const QAct& a, int64_t M, float* o,
                    int64_t ld, const float* bp) {
  switch (fmt) {
    case FMT_Q8_0: gemm32<FQ8_0>(W, rb, N, a, M, o, ld, bp); break;
    case FMT_Q4_0: gemm32<FQ4<false>>(W, rb, N, a, M, o, ld, bp); break;
    case FMT_Q4_1: gemm32<FQ4<true>>(W, rb, N, a, M, o, ld, bp); break;
    case FMT_Q4_K: gemm<KQ4_K>(W, rb, N, a, M, o, ld, bp); break;
    case FMT_Q6_K: gemm<KQ6_K>(W, rb, N, a, M, o, ld, bp); break;
    case FMT_I8: gemm32<FI8>(W, rb, N, a, M, o, ld, bp); break;
    case FMT_Q4X8:
    case FMT_Q5X8:
    case FMT_Q4_0X8:
    case FMT_Q5_0X8:
    case FMT_Q8X8:
    case FMT_MXFP4X8:
    case FMT_Q4KX8:
    case FMT_Q6KX8: gemm_x8(fmt, W, rb, N, a, M, o, ld, bp); break;
    default: TORCH_CHECK(gemm_gguf(fmt, W, rb, N, a, M, o, ld, bp), "unknown quantized format id ", fmt);
  }
}

namespace {

void check_weight(const at::Tensor& w, int64_t fmt, int64_t cols) {
  TORCH_CHECK(w.dtype() == at::kByte && w.dim() == 2 && w.is_contiguous(), "quantized weight: contiguous uint8 [rows, row_bytes]");
  TORCH_CHECK(cols % fmt_block(fmt) == 0, "in_features ", cols, " is not a multiple of the format's block ", fmt_block(fmt));
  TORCH_CHECK(w.size(1) == fmt_row_bytes(fmt, cols), "quantized weight rows have ", w.size(1), " bytes, format ", fmt,
              " with ", cols, " columns needs ", fmt_row_bytes(fmt, cols));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_act(const at::Tensor& x_) {
  TORCH_CHECK(x_.dtype() == at::kFloat && x_.dim() == 2, "quantize_act: float32 [rows, cols]");
  const at::Tensor x = x_.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K % 32 == 0, "quantize_act: cols must be a multiple of 32");
  auto q = at::empty({M, K}, x.options().dtype(at::kChar));
  auto d = at::empty({M, K / 32}, x.options());
  auto s = at::empty({M, K / 32}, x.options());
  const float* xp = x.data_ptr<float>();
  int8_t* qp = q.data_ptr<int8_t>();
  float *dp = d.data_ptr<float>(), *sp = s.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) quantize_row(xp + m * K, qp + m * K, dp + m * (K / 32), sp + m * (K / 32), K);
  });
  return {q, d, s};
}

// QAct::per256 activations: (q [M, K], d [M, K / 256], the 16-value sums [M, K / 32] as int32).
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_act_k(const at::Tensor& x_) {
  TORCH_CHECK(x_.dtype() == at::kFloat && x_.dim() == 2, "quantize_act_k: float32 [rows, cols]");
  const at::Tensor x = x_.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K % 256 == 0, "quantize_act_k: cols must be a multiple of 256");
  auto q = at::empty({M, K}, x.options().dtype(at::kChar));
  auto d = at::empty({M, K / 256}, x.options());
  auto s16 = at::empty({M, K / 32}, x.options().dtype(at::kInt));
  const float* xp = x.data_ptr<float>();
  int8_t* qp = q.data_ptr<int8_t>();
  float* dp = d.data_ptr<float>();
  int32_t* sp = s16.data_ptr<int32_t>();
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) quantize_row_k(xp + m * K, qp + m * K, dp + m * (K / 256), sp + m * (K / 32), K);
  });
  return {q, d, s16};
}

void qlinear_out(const at::Tensor& x_, const at::Tensor& w, int64_t fmt, const c10::optional<at::Tensor>& bias,
                 at::Tensor& out) {
  TORCH_CHECK(x_.dtype() == at::kFloat && x_.dim() == 2, "qlinear: x must be float32 [rows, in_features]");
  const int64_t M = x_.size(0), K = x_.size(1), N = w.size(0) * fmt_group(fmt);
  check_weight(w, fmt, K);
  TORCH_CHECK(out.dtype() == at::kFloat && out.dim() == 2 && out.size(0) == M && out.size(1) == N && out.stride(1) == 1,
              "qlinear: out must be float32 [rows, out_features] with unit column stride");
  const float* bp = nullptr;
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->contiguous();
    TORCH_CHECK(b.dtype() == at::kFloat && b.numel() == N, "qlinear: bias must be float32 [out_features]");
    bp = b.data_ptr<float>();
  }
  if (M == 0) return;
  if (fmt_is_float16(fmt)) {  // fp32 activations as they are: no int8 grid
    const at::Tensor x = x_.contiguous();
    gemm_float16(fmt, w.data_ptr<uint8_t>(), w.size(1), N, x.data_ptr<float>(), K, M, K, out.data_ptr<float>(),
                 out.stride(0), bp);
    return;
  }
  TORCH_CHECK(K / 32 <= MAX_BLOCKS, "qlinear: in_features ", K, " above ", MAX_BLOCKS * 32);
  if (fmt_takes_k_acts(fmt)) {
    auto [q, d, s16] = quantize_act_k(x_);
    QAct a{q.data_ptr<int8_t>(), d.data_ptr<float>(), nullptr, K, K / 32, s16.data_ptr<int32_t>(), true};
    gemm_quantized(fmt, w.data_ptr<uint8_t>(), w.size(1), N, a, M, out.data_ptr<float>(), out.stride(0), bp);
    return;
  }
  auto [q, d, s] = quantize_act(x_);
  QAct a{q.data_ptr<int8_t>(), d.data_ptr<float>(), s.data_ptr<float>(), K, K / 32};
  gemm_quantized(fmt, w.data_ptr<uint8_t>(), w.size(1), N, a, M, out.data_ptr<float>(), out.stride(0), bp);
}

at::Tensor qlinear(const at::Tensor& x, const at::Tensor& w, int64_t fmt, const c10::optional<at::Tensor>& bias) {
  auto out = at::empty({x.size(0), w.size(0) * fmt_group(fmt)}, x.options());
  qlinear_out(x, w, fmt, bias, out);
  return out;
}

// ---- dequantization (the large-batch path, the embedding, and references) ----

void dequant_row(int64_t fmt, const uint8_t* w, int64_t K, float* y) {
  switch (fmt) {
    case FMT_Q8_0:
      for (int64_t b = 0; b < K / 32; ++b) {
        const uint8_t* blk = w + b * 34;
        const float d = fp16(blk);
        const int8_t* q = (const int8_t*)(blk + 2);
        for (int i = 0; i < 32; ++i) y[b * 32 + i] = d * q[i];
      }
      break;
    case FMT_I8: {
      float s;
      std::memcpy(&s, w, 4);
      const int8_t* q = (const int8_t*)(w + 4);
      for (int64_t i = 0; i < K; ++i) y[i] = s * q[i];
      break;
    }
    case FMT_Q4_0:
    case FMT_Q4_1: {
      const bool has_min = fmt == FMT_Q4_1;
      const int64_t bytes = has_min ? 20 : 18;
      for (int64_t b = 0; b < K / 32; ++b) {
        const uint8_t* blk = w + b * bytes;
        const float d = fp16(blk), off = has_min ? fp16(blk + 2) : -8.0f * d;
        const uint8_t* q = blk + (has_min ? 4 : 2);
        for (int i = 0; i < 16; ++i) {
          y[b * 32 + i] = d * (q[i] & 0xF) + off;
          y[b * 32 + 16 + i] = d * (q[i] >> 4) + off;
        }
      }
      break;
    }
    case FMT_Q4_K:
      for (int64_t b = 0; b < K / 256; ++b) {
        const uint8_t* blk = w + b * 144;
        const float d = fp16(blk), dmin = fp16(blk + 2);
        const uint8_t* qs = blk + 16;
        float* yb = y + b * 256;
        for (int j = 0; j < 4; ++j) {
          uint8_t sc0, mn0, sc1, mn1;
          q4k_scale_min(2 * j, blk + 4, &sc0, &mn0);
          q4k_scale_min(2 * j + 1, blk + 4, &sc1, &mn1);
          const float d0 = d * sc0, m0 = dmin * mn0, d1 = d * sc1, m1 = dmin * mn1;
          for (int l = 0; l < 32; ++l) {
            yb[64 * j + l] = d0 * (qs[32 * j + l] & 0xF) - m0;
            yb[64 * j + 32 + l] = d1 * (qs[32 * j + l] >> 4) - m1;
          }
        }
      }
      break;
    case FMT_Q6_K:
      for (int64_t b = 0; b < K / 256; ++b) {
        const uint8_t* blk = w + b * 210;
        const int8_t* sc = (const int8_t*)(blk + 192);
        const float d = fp16(blk + 208);
        float* yb = y + b * 256;
        for (int n = 0; n < 2; ++n) {
          const uint8_t* ql = blk + 64 * n;
          const uint8_t* qh = blk + 128 + 32 * n;
          for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            yb[128 * n + l] = d * sc[8 * n + is] * (((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
            yb[128 * n + l + 32] = d * sc[8 * n + is + 2] * (((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            yb[128 * n + l + 64] = d * sc[8 * n + is + 4] * (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            yb[128 * n + l + 96] = d * sc[8 * n + is + 6] * (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
          }
        }
      }
      break;
    default:
      TORCH_CHECK(dequant_row_gguf(fmt, w, K, y) || dequant_row_float16(fmt, w, K, y), "unknown quantized format id ", fmt);
  }
}

// Weight row `row` of a matrix whose stored rows are `rb` bytes, in any format.
void dequant_any(int64_t fmt, const uint8_t* W, int64_t rb, int64_t row, int64_t K, float* y) {
  if (fmt_is_x8(fmt)) {
    dequant_row_x8(fmt, W, rb, row, K, y);
  } else {
    dequant_row(fmt, W + row * rb, K, y);
  }
}

at::Tensor dequantize_rows(const at::Tensor& w, int64_t fmt, int64_t cols, const at::Tensor& ids_) {
  check_weight(w, fmt, cols);
  const at::Tensor ids = ids_.to(at::kLong).contiguous();
  const int64_t n = ids.numel(), rows = w.size(0) * fmt_group(fmt), rb = w.size(1);
  auto out = at::empty({n, cols}, w.options().dtype(at::kFloat));
  const int64_t* ip = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(ip[i] >= 0 && ip[i] < rows, "row id ", ip[i], " out of range [0, ", rows, ")");
  const uint8_t* W = w.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, n, 64, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) dequant_any(fmt, W, rb, ip[i], cols, o + i * cols);
  });
  return out;
}

at::Tensor dequantize(const at::Tensor& w, int64_t fmt, int64_t cols) {
  check_weight(w, fmt, cols);
  const int64_t rows = w.size(0) * fmt_group(fmt), rb = w.size(1);
  auto out = at::empty({rows, cols}, w.options().dtype(at::kFloat));
  const uint8_t* W = w.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) dequant_any(fmt, W, rb, r, cols, o + r * cols);
  });
  return out;
}

}  // namespace

namespace api {
void qlinear_out(const at::Tensor& x, const at::Tensor& w, int64_t fmt, const c10::optional<at::Tensor>& bias,
                 at::Tensor& out) {
  radixlm::qlinear_out(x, w, fmt, bias, out);
}
}  // namespace api

TORCH_LIBRARY_FRAGMENT(radixlm, m) {
  m.def("quantize_act(Tensor x) -> (Tensor, Tensor, Tensor)");
  m.def("quantize_act_k(Tensor x) -> (Tensor, Tensor, Tensor)");
  m.def("qlinear(Tensor x, Tensor w, int fmt, Tensor? bias=None) -> Tensor");
  m.def("qlinear_out(Tensor x, Tensor w, int fmt, Tensor? bias, Tensor(a!) out) -> ()");
  m.def("dequantize(Tensor w, int fmt, int cols) -> Tensor");
  m.def("dequantize_rows(Tensor w, int fmt, int cols, Tensor ids) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) {
  m.impl("quantize_act", &quantize_act);
  m.impl("quantize_act_k", &quantize_act_k);
  m.impl("qlinear", &qlinear);
  m.impl("qlinear_out", &qlinear_out);
  m.impl("dequantize", &dequantize);
  m.impl("dequantize_rows", &dequantize_rows);
}

}  // namespace radixlm
