"""Tensor-parallel linear layers and vocabulary (SGLang's / vLLM's names), on the plain layers.

Each is built with its tp group (parallel_state.get_tp_group(): rank and size) and holds only its
shard; `tp_slice(kind, shard)` tells the loader which part of the checkpoint tensor that is.
- ColumnParallelLinear: output rows split; the output stays split (feeds a row-parallel layer).
- MergedColumnParallelLinear: gate/up, each projection's rows split (a rank keeps [gate_r | up_r]).
- QKVParallelLinear: heads split; KV heads replicated when tp_size > num_kv_heads.
- RowParallelLinear: input columns split; partial outputs summed by an all-reduce, then the bias.
- VocabParallelEmbedding: vocabulary rows split; out-of-shard ids give 0, then an all-reduce; as the
  tied LM head, local logits then an all-gather over the vocabulary.
- ParallelLMHead: the untied LM head, vocabulary rows split, logits all-gathered.
With tp_size 1 each is exactly its plain layer (same parameters, same kernels, no collective), so
the single-process path, the one-op fused decoder step included, is unchanged.
"""

from __future__ import annotations

import torch

from radixlm.distributed.parallel_state import GroupCoordinator, get_tp_group
from radixlm.model.layers.linear import Linear, MergedLinear, VocabEmbedding, linear
from radixlm.model.tp_shard import TensorSlice, divide


class _TPMixin:
    tp_rank: int
    tp_size: int

    def _init_tp(self, tp: GroupCoordinator | None) -> GroupCoordinator:
        tp = tp or get_tp_group()
        self.tp_rank, self.tp_size = tp.rank_in_group, tp.world_size
        self._comm = tp.device_comm
        return tp


class ColumnParallelLinear(_TPMixin, Linear):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        tp: GroupCoordinator | None = None,
        what: str = "out_features",
    ):
        tp = self._init_tp(tp)
        super().__init__(in_features, divide(out_features, tp.world_size, what), bias)

    def tp_slice(self, kind: str, shard: int | None) -> TensorSlice | None:
        if self.tp_size == 1:
            return None
        return TensorSlice.of(0, self.tp_rank * self.out_features, self.out_features)


class MergedColumnParallelLinear(_TPMixin, MergedLinear):
    """output_sizes: the full projections' sizes (each split across the group)."""

    def __init__(
        self,
        in_features: int,
        output_sizes: list[int],
        bias: bool = False,
        tp: GroupCoordinator | None = None,
        what: str = "intermediate_size",
    ):
        tp = self._init_tp(tp)
        self.full_sizes = list(output_sizes)
        super().__init__(in_features, [divide(n, tp.world_size, what) for n in output_sizes], bias)

    def shard_start(self, shard: int) -> int:
        """First row of this rank's part of projection `shard`, in the full projection."""
        return self.tp_rank * self.output_sizes[shard]

    def tp_slice(self, kind: str, shard: int | None) -> TensorSlice | None:
        if self.tp_size == 1:
            return None
        shards = (
            range(len(self.output_sizes)) if shard is None else [shard]
        )  # None: a fused checkpoint tensor
        base = [sum(self.full_sizes[:i]) for i in range(len(self.full_sizes))]
        return TensorSlice(
            0,
            tuple(
                (base[i] * (shard is None) + self.shard_start(i), self.output_sizes[i])
                for i in shards
            ),
        )


class QKVParallelLinear(MergedColumnParallelLinear):
    """q, k, v of total_num_heads / total_num_kv_heads heads; this rank's heads only. With
    tp_size > total_num_kv_heads each KV head is held by tp_size / total_num_kv_heads ranks."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        total_num_heads: int,
        total_num_kv_heads: int,
        bias: bool = False,
        tp: GroupCoordinator | None = None,
    ):
        tp = tp or get_tp_group()
        n = tp.world_size
        self.num_heads = divide(total_num_heads, n, "num_attention_heads")
        if n >= total_num_kv_heads:
            if n % total_num_kv_heads:
                raise ValueError(
                    f"tp_size {n} is neither a divisor nor a multiple of num_key_value_heads"
                    f" {total_num_kv_heads} (KV heads are split, or replicated tp_size / heads"
                    " times)"
                )
            self.num_kv_heads, self.kv_replicas = 1, n // total_num_kv_heads
        else:
            self.num_kv_heads, self.kv_replicas = (
                divide(total_num_kv_heads, n, "num_key_value_heads"),
                1,
            )
        self.head_dim = head_dim
        q, kv = total_num_heads * head_dim, total_num_kv_heads * head_dim
        # The parent splits each size by tp_size: hand it the per-rank sizes times tp_size.
        super().__init__(
            hidden_size,
            [q, self.num_kv_heads * head_dim * n, self.num_kv_heads * head_dim * n],
            bias,
            tp,
            what="num_attention_heads * head_dim",
        )
        self.full_sizes = [q, kv, kv]

    def shard_start(self, shard: int) -> int:
        if shard == 0:
            return self.tp_rank * self.output_sizes[0]
        return (self.tp_rank // self.kv_replicas) * self.output_sizes[shard]


class RowParallelLinear(_TPMixin, Linear):
    """in_features: the full input size (each rank multiplies its columns)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        tp: GroupCoordinator | None = None,
        what: str = "in_features",
    ):
        tp = self._init_tp(tp)
        super().__init__(divide(in_features, tp.world_size, what), out_features, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return super().forward(x)
        out = self.qweight.matmul(x) if self.qweight is not None else linear(x, self.weight)
        self._comm.all_reduce(out)
        return out if self.bias is None else out + self.bias  # once, after the sum

    def tp_slice(self, kind: str, shard: int | None) -> TensorSlice | None:
        if self.tp_size == 1 or kind == "bias":
            return None
        return TensorSlice.of(1, self.tp_rank * self.in_features, self.in_features)


class VocabParallelEmbedding(_TPMixin, VocabEmbedding):
    def __init__(self, num_embeddings: int, embedding_dim: int, tp: GroupCoordinator | None = None):
        tp = self._init_tp(tp)
        super().__init__(divide(num_embeddings, tp.world_size, "vocab_size"), embedding_dim)
        self.vocab_start = self.tp_rank * self.num_embeddings

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return super().forward(input_ids)
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_embeddings)
        out = super().forward(local.masked_fill(outside, 0))
        out.masked_fill_(outside.unsqueeze(-1), 0.0)
        return self._comm.all_reduce(out)

    def as_lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().as_lm_head(hidden)
        return logits if self.tp_size == 1 else self._comm.all_gather(logits, dim=-1)

    def tp_slice(self, kind: str, shard: int | None) -> TensorSlice | None:
        if self.tp_size == 1:
            return None
        return TensorSlice.of(0, self.vocab_start, self.num_embeddings)


class ParallelLMHead(ColumnParallelLinear):
    """hidden -> logits over the whole vocabulary (each rank's part, all-gathered)."""

    def __init__(self, hidden_size: int, vocab_size: int, tp: GroupCoordinator | None = None):
        super().__init__(hidden_size, vocab_size, tp=tp, what="vocab_size")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)
        return logits if self.tp_size == 1 else self._comm.all_gather(logits, dim=-1)
