"""ForwardBatch: everything one model forward needs, on the model's device.

The model runner builds it from the scheduler's ModelWorkerBatch (ModelRunner.prepare), so model
code never imports the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from radixlm.cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixlm.cache.state_pool import MambaPool
    from radixlm.model.tree_mask import TreeMask


class ForwardMode(IntEnum):
    EXTEND = 1  # prefill of new tokens, possibly after a cached prefix
    DECODE = 2  # one new token per request
    # Prefill of new requests and a decode step of running ones in one forward (SGLang's mixed
    # chunk): the weights are read once for both. The decode requests come last.
    MIXED = 3
    # Speculative verification: each running request's next input plus its draft tokens after its
    # context, every row's logits returned (SGLang's name). The model runs it as an extend.
    TARGET_VERIFY = 4

    def is_extend(self) -> bool:
        """Extend-shaped: every request has prefix + new tokens (1 for a MIXED batch's decodes)."""
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY)

    def is_verify(self) -> bool:
        return self == ForwardMode.TARGET_VERIFY

    def is_mixed(self) -> bool:
        return self == ForwardMode.MIXED

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    # [num_tokens]: the new tokens of every request, concatenated in batch order.
    input_ids: torch.Tensor
    # [num_tokens]: absolute position of each new token in its sequence.
    positions: torch.Tensor
    # [bs]: row of each request in ReqToTokenPool.req_to_token.
    req_pool_indices: torch.Tensor
    # [bs]: total length of each sequence after this forward (prefix + new).
    seq_lens: torch.Tensor
    # [num_tokens]: KV slot where each new token's K/V is written.
    out_cache_loc: torch.Tensor
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: TokenToKVPool
    # The attention backend (model/layers/attention/) that runs this batch, and its per-batch
    # metadata (built at launch by the scheduler, or by the model's forward if nobody did).
    attn_backend: Any = None
    attn_metadata: Any = None
    # Host copies, so per-request Python loops never sync with the device.
    seq_lens_cpu: list[int] = field(default_factory=list)
    # Extend only: tokens already in the KV cache / new tokens, per request.
    extend_prefix_lens_cpu: list[int] | None = None
    extend_seq_lens_cpu: list[int] | None = None
    # Extend only: per request, the first absolute position whose next-token
    # logprob must be returned (prompt logprobs); None = only the last token.
    extend_logprob_start_lens_cpu: list[int | None] | None = None
    # MIXED only: the last num_decode requests are decode steps (one token after their context).
    num_decode: int = 0
    # The sampler's tensors for this batch (model/layers/sampler.py), built by ModelRunner.prepare.
    sampling_info: Any = None
    # Per request, the LoRA adapter it runs under (lora/runtime.py; None: the base model); empty:
    # none.
    lora_ids: list = field(default_factory=list)
    # Per request, its images (MultimodalInputs or None; empty: none in the batch): the model embeds
    # the parts of their spans this extend covers (model/mm_embed.py).
    mm_inputs: list = field(default_factory=list)
    # [3, num_tokens]: M-RoPE positions (temporal, height, width; model/executor/mrope.py) of an
    # M-RoPE model's step where a request has images; None: none (plain RoPE at `positions`).
    mrope_positions: torch.Tensor | None = None
    # TARGET_VERIFY of draft trees: which new tokens each new token attends (model/tree_mask.py);
    # None: causal (every other batch, and a verify batch of chains). Every backend honours it.
    tree_mask: TreeMask | None = None
    # A hybrid model's recurrent states (cache/state_pool.py; None: no state layers). Request i's
    # state is slot req_pool_indices[i]; the runner applies state_copies (src, dst) before the
    # forward (snapshots of finished requests, admitted requests' starting states), and a state
    # layer copies request i's state after t of its new tokens to slot s for each (t, s) in
    # state_tracks[i] (model/layers/linear_attn/segments.py).
    state_pool: MambaPool | None = None
    state_copies: list[tuple[int, int]] = field(default_factory=list)
    state_tracks: list[list[tuple[int, int]]] | None = None
    # TARGET_VERIFY on a hybrid: per request, (a draft slot per draft node, each node's parent
    # node, -1: the root), the state after each node kept in its slot
    # (model/layers/linear_attn/draft_states.py); None: no drafts.
    state_drafts: list[tuple[list[int], list[int]]] | None = None
    # The kernels of the state layers (model/layers/linear_attn/).
    linear_attn_backend: Any = None

    @property
    def uses_lora(self) -> bool:
        return any(self.lora_ids)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
