"""HybridAttnBackend: one backend for prefill, another for decode (SGLang's
--prefill-attention-backend / --decode-attention-backend).

Every call goes to the backend of the batch's shape, so a batch's metadata is always built and
read by the same backend. Both read and write the same KV pool, so a request may prefill
through one and decode through the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixlm.model.layers.attention.base import AttentionBackend

if TYPE_CHECKING:
    from radixlm.model.forward_batch import ForwardBatch


class HybridAttnBackend(AttentionBackend):
    def __init__(self, prefill_backend: AttentionBackend, decode_backend: AttentionBackend):
        self.prefill_backend = prefill_backend
        self.decode_backend = decode_backend

    @property
    def reads_swa_pool(self) -> bool:
        return self.prefill_backend.reads_swa_pool and self.decode_backend.reads_swa_pool

    @property
    def supports_tree_mask(self) -> bool:  # verify batches are extend-shaped: the prefill backend's
        return self.prefill_backend.supports_tree_mask

    @property
    def supports_bidirectional_spans(self) -> bool:  # images come in extends only
        return self.prefill_backend.supports_bidirectional_spans

    def _select_backend(self, forward_batch: ForwardBatch) -> AttentionBackend:
        # EXTEND, MIXED and TARGET_VERIFY are extend-shaped: several queries per request.
        return (
            self.decode_backend if forward_batch.forward_mode.is_decode() else self.prefill_backend
        )

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        self._select_backend(forward_batch).init_forward_metadata(forward_batch)

    def begin_forward(self, forward_batch: ForwardBatch) -> None:
        self._select_backend(forward_batch).begin_forward(forward_batch)

    def reset(self) -> None:
        self.prefill_backend.reset()
        self.decode_backend.reset()

    def forward_extend(self, q, k, v, layer, forward_batch):
        return self._select_backend(forward_batch).forward_extend(q, k, v, layer, forward_batch)

    def forward_decode(self, q, k, v, layer, forward_batch):
        return self._select_backend(forward_batch).forward_decode(q, k, v, layer, forward_batch)

    def runs_fused_layers(self, forward_batch: ForwardBatch) -> bool:
        return self._select_backend(forward_batch).runs_fused_layers(forward_batch)

    def __repr__(self) -> str:
        return (
            f"HybridAttnBackend(prefill={self.prefill_backend!r}, decode={self.decode_backend!r})"
        )
