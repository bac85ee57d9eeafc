"""How a MoE layer's routed experts meet its tokens across ranks: one strategy per parallel layout,
shared by every MoE layer of a model (SGLang's EP all-reduce, and dp_gather / dp_scatter around the
experts under DP attention).

- LocalExperts (every expert on this rank): the layer's tokens through them, no collective.
- ExpertAllReduce (--ep-size N with --tp-size N): every rank has the same tokens and 1/N of the
  experts; each computes its experts' share of the output, then an all-reduce sums the shares.
- DPGatheredExperts (--enable-dp-attention with --ep-size N): each rank has its own tokens (its own
  requests). The ranks' token counts are exchanged once per forward (`begin`); before each MoE layer
  the tokens, with their routes (weights and expert ids, chosen on their own rank), are all-gathered
  in one packed message, each rank computes its experts' share of every gathered token, the shares
  are all-reduced and each rank takes back its own rows. A rank without a batch still joins every
  collective, with no tokens (the model's `forward_idle`), so a step of the others never waits on
  it.

`experts` (the ExpertFn a layer passes) computes this rank's experts only; `local_share` is the
masking that turns any expert-parallel layer's fused call into such a share.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixlm.distributed.communicator import Communicator
from radixlm.distributed.parallel_state import get_attn_dp_group, get_ep_group

# (x [T, hidden], weights [T, k] float32, ids [T, k] int64) -> [T, hidden]: this rank's experts'
# part of the output
ExpertFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class LocalExperts:
    """Every expert on this rank: nothing to exchange."""

    joins_peers = (
        False  # whether a rank without tokens must still run its MoE layers (forward_idle)
    )

    def begin(self, num_tokens: int) -> None:
        """A forward of num_tokens tokens starts on this rank."""

    def run(
        self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertFn
    ) -> torch.Tensor:
        return experts(x, weights, ids)

    def run_empty(
        self, hidden_size: int, top_k: int, dtype: torch.dtype, experts: ExpertFn
    ) -> None:
        """run with no tokens of this rank's own (forward_idle)."""
        self.run(
            torch.empty(0, hidden_size, dtype=dtype),
            torch.empty(0, top_k),
            torch.empty(0, top_k, dtype=torch.int64),
            experts,
        )


class ExpertAllReduce(LocalExperts):
    """The same tokens on every rank, each holding some of the experts: the shares summed."""

    def __init__(self, comm: Communicator):
        self.comm = comm

    def run(
        self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertFn
    ) -> torch.Tensor:
        return self.comm.all_reduce(experts(x, weights, ids))


class DPGatheredExperts(LocalExperts):
    """Each rank its own tokens (DP attention): gather them, run this rank's experts on all, sum the
    shares, keep this rank's rows."""

    joins_peers = True

    def __init__(self, comm: Communicator):
        self.comm = comm
        self.counts: list[int] = []

    def begin(self, num_tokens: int) -> None:
        self.counts = self.comm.all_gather(
            torch.tensor([num_tokens], dtype=torch.int64), dim=0
        ).tolist()

    def run(
        self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertFn
    ) -> torch.Tensor:
        counts, me = self.counts, self.comm.rank
        if x.shape[0] != counts[me]:
            raise RuntimeError(
                f"DP attention: this rank announced {counts[me]} tokens, its MoE layer got"
                f" {x.shape[0]}"
            )
        most = max(counts)
        if most == 0:
            return torch.zeros_like(x)
        mine = _pack(x, weights.float(), ids.to(torch.int32))
        padded = mine.new_zeros((most, mine.shape[1]))
        padded[: mine.shape[0]] = mine
        every = self.comm.all_gather(padded, dim=0)
        rows = torch.cat([every[r * most : r * most + n] for r, n in enumerate(counts)])
        x_all, w_all, ids_all = _unpack(rows, x.dtype, x.shape[1], weights.shape[1])
        out = experts(x_all, w_all, ids_all.long()).contiguous()
        self.comm.all_reduce(out)
        start = sum(counts[:me])
        return out[start : start + counts[me]]


def _pack(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[T, bytes]: each token's hidden state, route weights (float32) and expert ids (int32), as
    bytes (one message, every dtype exact)."""
    return torch.cat([t.contiguous().view(torch.uint8) for t in (x, weights, ids)], dim=1)


def _unpack(rows: torch.Tensor, dtype: torch.dtype, hidden: int, k: int):
    a = hidden * torch.empty((), dtype=dtype).element_size()
    x = rows[:, :a].contiguous().view(dtype)
    w = rows[:, a : a + 4 * k].contiguous().view(torch.float32)
    ids = rows[:, a + 4 * k : a + 8 * k].contiguous().view(torch.int32)
    return x, w, ids


def forward_idle(dispatch: LocalExperts, mlps, dtype: torch.dtype) -> None:
    """A forward without tokens (DP attention, this rank without a batch while another has one):
    the MoE layers' collectives joined in order, nothing else run. mlps: every layer's MLP; the
    MoE ones have idle(dtype)."""
    if not dispatch.joins_peers:
        return
    dispatch.begin(0)
    for mlp in mlps:
        if hasattr(mlp, "idle"):
            mlp.idle(dtype)


def expert_dispatch() -> LocalExperts:
    """The strategy of this process's parallel layout (a model builds one and hands it to its MoE
    layers)."""
    ep = get_ep_group()
    if ep.world_size == 1:
        return LocalExperts()
    if get_attn_dp_group().world_size > 1:
        return DPGatheredExperts(ep.device_comm)
    return ExpertAllReduce(ep.device_comm)


def local_share(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, start: int, n: int, fused: ExpertFn
) -> torch.Tensor:
    """This rank's experts [start, start + n) only, through `fused` (which takes local expert ids):
    tokens with none of them are left out; a token's slots routed elsewhere point at one of its own
    local experts with weight 0 (no extra expert read)."""
    local = (ids >= start) & (ids < start + n)
    rows = local.any(dim=1).nonzero().squeeze(1)
    out = torch.zeros_like(x)
    if rows.numel():
        lids, lmask = ids[rows] - start, local[rows]
        first = lids.gather(1, lmask.to(torch.int8).argmax(dim=1, keepdim=True))
        lids = torch.where(lmask, lids, first)
        lweights = torch.where(lmask, weights[rows], torch.zeros_like(weights[rows]))
        out.index_copy_(0, rows, fused(x.index_select(0, rows), lweights, lids))
    return out
