// How one batch's attention queries are cut into units of work (attention_plan.cpp), shared by
// the kernel (attention.cpp). Depends only on the index tensors: one plan serves every layer.
#pragma once
#include "common.h"

#include <memory>
#include <vector>

namespace radixlm {

constexpr int KB = 32;  // keys per block
constexpr int QT = 4;   // query rows per item (each with all the query heads of a KV head)

struct Item {  // query rows [row0, row0 + rows) of request b
  int64_t b, row0, rows;
};

// A unit of work: items [i0, i1) over KV heads [h0, h1) whose queries all see the first `shared`
// blocks of keys, which sit at the same slots for all of them (one request's query rows, or requests that
// share a cached prefix). Those blocks are read once for the whole unit, then each item walks the
// rest of its own keys. Every query still goes through its blocks in order with the same
// arithmetic, so grouping never changes a result; it only saves K/V reads.
struct Unit {
  int64_t i0, i1, shared, h0, h1;  // items, shared blocks, KV heads [h0, h1)
  double cost;
};

struct Index {  // the batch's index tensors, checked
  const int64_t *rtt, *rpi, *sl, *qs;
  int64_t B, C, rows;
  const int64_t* slots_of(int64_t b) const { return rtt + rpi[b] * C; }
  int64_t first_pos(const Item& w) const { return sl[w.b] - (qs[w.b + 1] - qs[w.b]) + w.row0; }
};

Index check_index(const at::Tensor& req_to_token, const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                  const at::Tensor& q_start);

// How one batch's queries are cut into units, made once per forward (the layers op shares it
// across layers). Requests are sorted by their slot rows, so those sharing a cached prefix sit
// together, however their prefixes branch; consecutive items go into one unit while they keep
// most of its shared blocks and it holds at most UNIT_QUERIES queries per KV head.
struct AttentionPlan {
  int64_t B, T, Hkv, G;
  std::vector<Item> items;
  std::vector<Unit> units;
};

}  // namespace radixlm
