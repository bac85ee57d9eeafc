"""Decode attention that reads a prefix shared by several requests once (cascade attention).

Requests that hit the radix cache for the same prefix hold the very same KV slots for it. The
plain decode path gathers every request's whole KV ([bs, max_len] rows) and so copies and reads
a shared 1,000-token system prompt once per request; on a CPU that memory traffic is most of a
long-context decode step. Here each group of requests sharing a prefix attends to it in one
batched product (its queries stacked), every request attends to its own rest, and the two
partial softmaxes are merged by their log-sum-exp: the same result, with the prefix read once.
On the CPU both parts run torch's flash-attention kernel, which returns the log-sum-exp.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_SHARED_LEN = 32  # shorter shared prefixes are not worth a second pass
NEG_INF = float("-inf")


@dataclass
class SharedPrefixMetadata:
    prefix_indices: torch.Tensor  # [G, P] pool slots of each group's shared prefix (padded)
    prefix_mask: (
        torch.Tensor
    )  # [G, 1, 1, P] additive: 0 where a slot is part of the prefix, else -inf
    query_map: torch.Tensor  # [G, n] batch row of each group member (padded with row 0)
    member_rows: torch.Tensor  # [M] batch rows in a group, in group-major order
    member_flat: torch.Tensor  # [M] their index into the flattened [G * n] members
    suffix_indices: torch.Tensor  # [bs, S] each request's own slots after its group's prefix
    suffix_mask: torch.Tensor  # [bs, 1, 1, S] additive, as prefix_mask


def build_shared_prefix_metadata(
    rows: torch.Tensor, seq_lens: list[int], dtype: torch.dtype = torch.float32
) -> SharedPrefixMetadata | None:
    """rows: [bs, max_len] req_to_token rows of a decode batch; dtype: the queries' (the masks'
    dtype). None when no two requests share at least MIN_SHARED_LEN leading slots."""
    bs = len(seq_lens)
    if bs < 2:
        return None
    firsts = rows[:, 0].tolist()
    by_first: dict[int, list[int]] = {}
    for b, f in enumerate(firsts):
        by_first.setdefault(f, []).append(b)
    groups, shared = [], []
    for members in by_first.values():
        if len(members) < 2:
            continue
        n = min(seq_lens[b] for b in members) - 1  # every member keeps at least its newest token
        if n < MIN_SHARED_LEN:
            continue
        block = rows[members, :n]
        differs = (block != block[0]).any(0).nonzero()
        p = int(differs[0]) if len(differs) else n
        if p >= MIN_SHARED_LEN:
            groups.append(members)
            shared.append(p)
    if not groups:
        return None
    device = rows.device
    g, pmax, nmax = len(groups), max(shared), max(len(m) for m in groups)
    prefix_indices = torch.zeros((g, pmax), dtype=torch.int64, device=device)
    prefix_valid = torch.zeros((g, 1, 1, pmax), dtype=torch.bool, device=device)
    query_map = torch.zeros((g, nmax), dtype=torch.int64, device=device)
    starts = [0] * bs
    member_rows, member_flat = [], []
    for gi, (members, p) in enumerate(zip(groups, shared)):
        prefix_indices[gi, :p] = rows[members[0], :p]
        prefix_valid[gi, ..., :p] = True
        query_map[gi, : len(members)] = torch.tensor(members, dtype=torch.int64)
        for j, b in enumerate(members):
            starts[b] = p
            member_rows.append(b)
            member_flat.append(gi * nmax + j)
    smax = max(s - st for s, st in zip(seq_lens, starts))
    start_t = torch.tensor(starts, dtype=torch.int64, device=device)
    lens_t = torch.tensor(seq_lens, dtype=torch.int64, device=device)
    pos = start_t[:, None] + torch.arange(smax, device=device)[None, :]
    valid = pos < lens_t[:, None]
    suffix_indices = rows.gather(1, torch.where(valid, pos, torch.zeros_like(pos)))
    as_t = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)
    additive = lambda ok: torch.zeros(ok.shape, dtype=dtype, device=device).masked_fill_(
        ~ok, NEG_INF
    )
    return SharedPrefixMetadata(
        prefix_indices,
        additive(prefix_valid),
        query_map,
        as_t(member_rows),
        as_t(member_flat),
        suffix_indices,
        additive(valid.view(bs, 1, 1, smax)),
    )


def _cpu_flash(q: torch.Tensor) -> bool:
    return q.device.type == "cpu"


def _attend(q, k, v, mask, scale):
    """q [B, kvh, r, d] over k/v [B, kvh, S, d] (views of any strides) with an additive mask
    [B, 1, 1, S]: (softmax-normalized output [B, kvh, r, d], log-sum-exp of the scores
    [B, kvh, r, 1]). On the CPU torch's flash kernel computes both in one pass over K/V: ~1.7x
    faster at the serving shape than bmm + softmax (docs/benchmarks.md)."""
    if _cpu_flash(q):
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, attn_mask=mask, scale=scale
        )
        return o, lse.unsqueeze(-1)
    s = torch.matmul(q, k.transpose(-1, -2)).mul_(scale).add_(mask)
    lse = torch.logsumexp(s, -1, keepdim=True)
    return torch.matmul(torch.exp_(s.sub_(lse)), v), lse


def shared_prefix_decode(
    q, k_buf, v_buf, meta: SharedPrefixMetadata, scale: float, gather, prefix_kv=None
) -> torch.Tensor:
    """q: [bs, heads, d] -> [bs, heads, d]. prefix_kv: the prefixes' K/V as [G, kv_heads, P, d]
    (any strides), if the caller kept them from an earlier step."""
    bs, heads, d = q.shape
    kvh = k_buf.shape[1]
    gh = heads // kvh
    qh = q.view(bs, kvh, gh, d)
    # Each request over its own slots after the shared prefix.
    ks, vs = gather(k_buf, meta.suffix_indices), gather(v_buf, meta.suffix_indices)
    o2, l2 = _attend(qh, ks.transpose(1, 2), vs.transpose(1, 2), meta.suffix_mask, scale)
    # Each group's queries, stacked, over the group's prefix read once.
    g, n = meta.query_map.shape
    qg = qh[meta.query_map].permute(0, 2, 1, 3, 4).reshape(g, kvh, n * gh, d)
    kp, vp = prefix_kv or gather_prefix_kv(k_buf, v_buf, meta, gather)
    o1, l1 = _attend(qg, kp, vp, meta.prefix_mask, scale)
    unstack = lambda t: t.view(g, kvh, n, gh, -1).permute(0, 2, 1, 3, 4).reshape(g * n, kvh, gh, -1)
    o1, l1 = (unstack(t)[meta.member_flat] for t in (o1, l1))
    rows = meta.member_rows
    m = torch.maximum(l1, l2[rows])
    w1, w2 = torch.exp(l1 - m), torch.exp(l2[rows] - m)
    o2[rows] = (o1 * w1 + o2[rows] * w2) / (w1 + w2)  # o2 is this call's own tensor: merge in place
    return o2.reshape(bs, heads, d)


def gather_prefix_kv(k_buf, v_buf, meta: SharedPrefixMetadata, gather, contiguous: bool = False):
    """The groups' prefix K/V as [G, kv_heads, P, d]: strided views of one gather, or head-major
    copies (which the attention reads ~20% faster; worth it for copies kept across steps)."""
    kp, vp = (gather(buf, meta.prefix_indices).transpose(1, 2) for buf in (k_buf, v_buf))
    return (kp.contiguous(), vp.contiguous()) if contiguous else (kp, vp)
