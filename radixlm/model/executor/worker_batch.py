"""ModelWorkerBatch: what the scheduler hands the model runner for one step.

Host lists and the step's KV slots, no Req: the runner builds the ForwardBatch, the attention
metadata and the sampler's tensors from it (ModelRunner.prepare), so the scheduler never touches
a tensor of the model's. SGLang's name for the same boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixlm.model.forward_batch import ForwardMode
from radixlm.model.layers.sampler import SamplingRow


@dataclass
class ModelWorkerBatch:
    forward_mode: ForwardMode
    input_ids: list[
        int
    ]  # the new tokens of every request, in batch order (negative: a future slot)
    positions: list[int]
    req_pool_indices: list[int]
    seq_lens: list[int]  # prefix + new, per request
    out_cache_loc: torch.Tensor  # KV slot of each new token, already written into the request rows
    # Extend-shaped modes: cached tokens, new tokens, first prompt-logprob position (None: last
    # only).
    extend_prefix_lens: list[int] | None = None
    extend_seq_lens: list[int] | None = None
    extend_logprob_start_lens: list[int | None] | None = None
    num_decode: int = 0  # MIXED: the last num_decode requests are decode steps
    # One per request: what the sampler needs (empty: the caller takes the logits itself).
    sampling: list[SamplingRow] = field(default_factory=list)
    lora_ids: list[str | None] = field(
        default_factory=list
    )  # per request, its adapter's uid (None: base)
    # Per request, its images (radixlm/mm_inputs.py; None: none); empty: no request of the batch has
    # any.
    mm_inputs: list = field(default_factory=list)
    # TARGET_VERIFY of draft trees: per request, the parent of each new token among its new tokens
    # (-1: the first, the request's next input); None: every request's new tokens form a chain.
    tree_parents: list[list[int]] | None = None
    # A hybrid model's state moves (ForwardBatch.state_copies / state_tracks): copies (src, dst)
    # applied before the forward, in order; per request, (new tokens, snapshot slot) to keep.
    state_copies: list[tuple[int, int]] = field(default_factory=list)
    state_tracks: list[list[tuple[int, int]]] | None = None
    # TARGET_VERIFY on a hybrid (ForwardBatch.state_drafts): per request, a draft slot per node
    # and each node's parent node.
    state_drafts: list[tuple[list[int], list[int]]] | None = None

    @property
    def batch_size(self) -> int:
        return len(self.req_pool_indices)
