#include "attention_plan.h"
#include "api.h"

#include <algorithm>

namespace radixlm {

Index check_index(const at::Tensor& req_to_token, const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                  const at::Tensor& q_start) {
  for (const at::Tensor* t : {&req_to_token, &req_pool_indices, &seq_lens, &q_start})
    TORCH_CHECK(t->dtype() == at::kLong && t->is_contiguous() && t->device().is_cpu(), "paged_attention: index tensors are contiguous int64");
  TORCH_CHECK(req_to_token.dim() == 2, "paged_attention: req_to_token [rows, context]");
  const int64_t B = seq_lens.numel(), C = req_to_token.size(1);
  TORCH_CHECK(req_pool_indices.numel() == B && q_start.numel() == B + 1, "paged_attention: batch sizes disagree");
  const Index x{req_to_token.data_ptr<int64_t>(), req_pool_indices.data_ptr<int64_t>(), seq_lens.data_ptr<int64_t>(),
                q_start.data_ptr<int64_t>(), B, C, req_to_token.size(0)};
  TORCH_CHECK(x.qs[0] == 0, "paged_attention: q_start must start at 0");
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = x.qs[b + 1] - x.qs[b];
    TORCH_CHECK(n >= 0 && n <= x.sl[b] && x.sl[b] <= C, "paged_attention: request ", b, " has ", n, " queries over ",
                x.sl[b], " keys");
    TORCH_CHECK(x.rpi[b] >= 0 && x.rpi[b] < x.rows, "paged_attention: req_pool_index out of range");
  }
  return x;
}

constexpr int64_t UNIT_QUERIES = 64;

std::shared_ptr<const AttentionPlan> plan_attention(const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                                                    const at::Tensor& seq_lens, const at::Tensor& q_start, int64_t Hkv,
                                                    int64_t G) {
  const Index x = check_index(req_to_token, req_pool_indices, seq_lens, q_start);
  const int64_t B = x.B;
  auto plan = std::make_shared<AttentionPlan>();
  plan->B = B, plan->T = x.qs[B], plan->Hkv = Hkv, plan->G = G;
  std::vector<int64_t> order(B);
  for (int64_t b = 0; b < B; ++b) order[b] = b;
  auto lcp = [&](int64_t a, int64_t b) {  // leading slots two requests share
    const int64_t n = std::min(x.sl[a], x.sl[b]);
    const int64_t *ra = x.slots_of(a), *rb = x.slots_of(b);
    return (int64_t)(std::mismatch(ra, ra + n, rb).first - ra);
  };
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const int64_t k = lcp(a, b);
    if (k < x.sl[a] && k < x.sl[b]) return x.slots_of(a)[k] < x.slots_of(b)[k];
    return x.sl[a] < x.sl[b];  // one is a prefix of the other: the shorter first
  });
  // shares[i]: leading slots request order[i] shares with order[i - 1] (sorted rows: a run of
  // requests shares the minimum of its neighbours' shares).
  std::vector<int64_t> shares(B, 0);
  for (int64_t i = 1; i < B; ++i) shares[i] = lcp(order[i - 1], order[i]);
  // A unit takes all KV heads (each K/V row is then read whole, once) unless that leaves too few
  // units for the threads.
  auto cut = [&](int64_t heads) {
    plan->items.clear();
    plan->units.clear();
    for (int64_t h0 = 0; h0 < Hkv; h0 += heads) {
      const int64_t h1 = std::min(Hkv, h0 + heads);
      Unit u{};
      int64_t nq = 0;  // queries per head
      auto close = [&]() {
        if (nq == 0) return;
        u.i1 = (int64_t)plan->items.size();
        plan->units.push_back(u);
        nq = 0;
      };
      for (int64_t i = 0; i < B; ++i) {
        const int64_t b = order[i], n = x.qs[b + 1] - x.qs[b];
        // A request's items from its last rows back: each sees at least the keys of the one after it.
        for (int64_t r = ((n + QT - 1) / QT - 1) * QT; r >= 0; r -= QT) {
          const Item w{b, r, std::min<int64_t>(QT, n - r)};
          const int64_t sees = (x.first_pos(w) + 1) / KB;  // whole blocks every query of w sees
          const int64_t q = w.rows * G;
          if (nq > 0) {
            // Joining keeps the blocks the unit shares with this item (through the requests between).
            const int64_t with = std::min({u.shared, sees, (r + QT >= n ? shares[i] : x.sl[b]) / KB});
            if (nq + q > UNIT_QUERIES || with == 0 || 4 * with < 3 * u.shared) {
              close();
            } else {
              u.shared = with;
            }
          }
          if (nq == 0) u = Unit{(int64_t)plan->items.size(), 0, sees, h0, h1, 0.0};
          plan->items.push_back(w);
          nq += q;
          u.cost += (double)(h1 - h0) * (q * (x.first_pos(w) + w.rows) + 64.0);
        }
      }
      close();
    }
  };
  cut(Hkv);
  if (Hkv > 1 && (int64_t)plan->units.size() < 2 * at::get_num_threads()) cut(1);
  // Largest first, pulled by whichever thread is free: the units' sizes vary a lot.
  std::stable_sort(plan->units.begin(), plan->units.end(), [](const Unit& a, const Unit& b) { return a.cost > b.cost; });
  return plan;
}

}  // namespace radixlm
