// Q4_K and Q6_K repacked 8 rows at a time (the layouts and tiles are in x8_tiles.h): made at load,
// read back row by row for the embedding and for tests. Every value is kept exactly.
#include "quant_rows.h"
#include "x8_tiles.h"

namespace radixlm {
namespace {

void repack_q4k_block(const uint8_t* blk, int64_t r, uint8_t* o) {
  std::memcpy(o + 2 * r, blk, 2);
  std::memcpy(o + 16 + 2 * r, blk + 2, 2);
  for (int s = 0; s < 8; ++s) q4k_scale_min(s, blk + 4, o + 32 + 8 * s + r, o + 96 + 8 * s + r);
  for (int p = 0; p < 4; ++p)
    for (int i = 0; i < 8; ++i) std::memcpy(o + 160 + 256 * p + 32 * i + 4 * r, blk + 16 + 32 * p + 4 * i, 4);
}

// Q6_K's 6-bit values of one block, in value order (GGUF interleaves them by 32 and 64).
void q6k_values(const uint8_t* blk, uint8_t* q) {
  for (int n = 0; n < 2; ++n)
    for (int l = 0; l < 32; ++l) {
      const uint8_t* ql = blk + 64 * n;
      const uint8_t h = blk[128 + 32 * n + l];
      q[128 * n + l] = (ql[l] & 0xF) | ((h & 3) << 4);
      q[128 * n + l + 32] = (ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4);
      q[128 * n + l + 64] = (ql[l] >> 4) | (((h >> 4) & 3) << 4);
      q[128 * n + l + 96] = (ql[l + 32] >> 4) | (((h >> 6) & 3) << 4);
    }
}

void repack_q6k_block(const uint8_t* blk, int64_t r, uint8_t* o) {
  std::memcpy(o + 2 * r, blk + 208, 2);
  for (int s = 0; s < 16; ++s) o[16 + 8 * s + r] = blk[192 + s];
  uint8_t q[256];
  q6k_values(blk, q);
  for (int j = 0; j < 8; ++j) {
    uint8_t* qb = o + 144 + 192 * j;
    const uint8_t* v = q + 32 * j;
    for (int t = 0; t < 4; ++t) {
      uint8_t h0 = 0, h1 = 0;
      for (int i = 0; i < 4; ++i) {
        qb[32 * i + 4 * r + t] = (v[4 * i + t] & 0xF) | ((v[16 + 4 * i + t] & 0xF) << 4);
        h0 |= ((v[4 * i + t] >> 4) & 3) << (2 * i);
        h1 |= ((v[16 + 4 * i + t] >> 4) & 3) << (2 * i);
      }
      qb[128 + 4 * r + t] = h0;
      qb[160 + 4 * r + t] = h1;
    }
  }
}

}  // namespace

at::Tensor repack_kx8(const at::Tensor& w, int64_t fmt, int64_t cols) {
  TORCH_CHECK(w.dtype() == at::kByte && w.dim() == 2 && w.is_contiguous() && w.size(1) == fmt_row_bytes(fmt, cols),
              "repack_x8: contiguous uint8 [rows, row_bytes] in the format");
  TORCH_CHECK(cols % 256 == 0 && w.size(0) % 8 == 0, "repack_x8: rows must be a multiple of 8 (got ", w.size(0), ")");
  const bool q4 = fmt == FMT_Q4_K;
  const int64_t N = w.size(0), nsb = cols / 256, src_bytes = fmt_block_bytes(fmt);
  const int64_t gb = q4 ? Q4KX8_BYTES : Q6KX8_BYTES, rb = w.size(1);
  auto out = at::empty({N / 8, nsb * gb}, w.options());
  const uint8_t* src = w.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, N / 8, 16, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t b = 0; b < nsb; ++b)
        for (int64_t r = 0; r < 8; ++r) {
          const uint8_t* blk = src + (8 * g + r) * rb + b * src_bytes;
          uint8_t* o = dst + g * nsb * gb + b * gb;
          if (q4) {
            repack_q4k_block(blk, r, o);
          } else {
            repack_q6k_block(blk, r, o);
          }
        }
  });
  return out;
}

// The same float operations as dequant_row's Q4_K / Q6_K (so the values are bitwise gguf's).
void dequant_row_kx8(int64_t fmt, const uint8_t* W, int64_t group_bytes, int64_t row, int64_t K, float* y) {
  const uint8_t* g = W + (row / 8) * group_bytes;
  const int64_t r = row % 8;
  for (int64_t sb = 0; sb < K / 256; ++sb) {
    float* yb = y + 256 * sb;
    if (fmt == FMT_Q4KX8) {
      const uint8_t* blk = g + sb * Q4KX8_BYTES;
      const float d = fp16(blk + 2 * r), dmin = fp16(blk + 16 + 2 * r);
      for (int s = 0; s < 8; ++s) {
        const float ds = d * blk[32 + 8 * s + r], ms = dmin * blk[96 + 8 * s + r];
        for (int i = 0; i < 8; ++i)
          for (int t = 0; t < 4; ++t) {
            const uint8_t byte = blk[160 + 256 * (s / 2) + 32 * i + 4 * r + t];
            yb[32 * s + 4 * i + t] = ds * ((s & 1) ? byte >> 4 : byte & 0xF) - ms;
          }
      }
      continue;
    }
    const uint8_t* blk = g + sb * Q6KX8_BYTES;
    const float d = fp16(blk + 2 * r);
    const int8_t* sc = (const int8_t*)(blk + 16);
    for (int j = 0; j < 8; ++j) {
      const uint8_t* qb = blk + 144 + 192 * j;
      for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 4; ++i)
          for (int t = 0; t < 4; ++t) {
            const uint8_t nib = qb[32 * i + 4 * r + t];
            const int lo = h ? nib >> 4 : nib & 0xF;
            const int top = (qb[128 + 32 * h + 4 * r + t] >> (2 * i)) & 3;
            const int v = 32 * j + 16 * h + 4 * i + t;
            yb[v] = d * sc[8 * (v / 16) + r] * ((lo | (top << 4)) - 32);
          }
    }
  }
}

}  // namespace radixlm
