"""What a captured decode step reads, shared by torch.compile's graphs on CPU (compiled_decode.py)
and CUDA graphs (cuda_graph_runner.py): one set of static input buffers sized for the largest batch,
a static ForwardBatch per captured size over their first rows, and the checks that say where a
decode step cannot be captured.

A batch is copied into the buffers and padded up to the captured size: padded rows feed token 0 at
position 0, write their K/V to the pool's dummy slot 0 and attend to it alone, so they touch nothing
a request owns. The same tensors and Python objects come back every step, which is what both kinds
of graph need (dynamo's guards hold; a CUDA graph reads fixed addresses).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from radixlm.model.decoder_stack import decoder_stack_of
from radixlm.model.forward_batch import ForwardBatch, ForwardMode
from radixlm.model.layers.attention.base import AttentionBackend
from radixlm.model.layers.attention.hybrid import HybridAttnBackend
from radixlm.model.layers.rotary import MRotaryEmbedding, RotaryEmbedding
from radixlm.model.traits import tp_sharded


class RunnerView(Protocol):
    """What the graphs read of model/executor/runner.py: ModelRunner (typed here: the runner imports
    them)."""

    model: torch.nn.Module
    attn_backend: AttentionBackend
    device: torch.device
    req_to_token_pool: Any
    token_to_kv_pool: Any
    max_running_requests: int


def decode_backend_of(backend: AttentionBackend, cls: type) -> AttentionBackend | None:
    """The backend that runs decode batches (a hybrid's decode side) when it is a `cls`, else
    None."""
    if isinstance(backend, HybridAttnBackend):
        backend = backend.decode_backend
    return backend if isinstance(backend, cls) else None


def why_not_graphed(model: torch.nn.Module) -> str | None:
    """None where the model's decode forward can be captured whole, else why not."""
    if tp_sharded(model):
        return "tensor parallelism all-reduces inside the layers (not traced)"
    stack = decoder_stack_of(model)  # None: an encoder
    if stack is not None and stack.pp.size > 1:
        return (
            "a pipeline stage hands its activations to the next stage inside the forward (not"
            " traced)"
        )
    if any(isinstance(m, MRotaryEmbedding) for m in model.modules()):
        return "M-RoPE positions (Qwen2-VL) come from each request's images at every step"
    rotary = stack.rotary_emb if stack is not None else None
    if rotary is not None and type(rotary).cache_rows is not RotaryEmbedding.cache_rows:
        return (
            "longrope picks each request's rotary table from its length (a per-step Python"
            " decision)"
        )
    return None


class StaticDecodeInputs:
    def __init__(self, runner: RunnerView, max_bs: int):
        width = runner.req_to_token_pool.req_to_token.shape[1]
        i64 = dict(dtype=torch.int64, device=runner.device)
        self.input_ids = torch.zeros(max_bs, **i64)
        self.positions = torch.zeros(max_bs, **i64)
        self.out_cache_loc = torch.zeros(max_bs, **i64)
        self.seq_lens = torch.ones(max_bs, **i64)
        self.kv_slots = torch.zeros(max_bs, width, **i64)  # each request's slot row
        self.rows = torch.arange(
            max_bs, **i64
        )  # 0..bs-1: the request rows (req_pool_indices: unused)
        self.kv_start = torch.zeros(
            max_bs, **i64
        )  # the Triton decode's own keys' start (no groups)

    def batch(self, runner: RunnerView, bs: int, backend: AttentionBackend) -> ForwardBatch:
        """The static batch of `bs` rows (its attn_metadata is the caller's, over these buffers)."""
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            req_pool_indices=self.rows[:bs],
            seq_lens=self.seq_lens[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool=runner.token_to_kv_pool,
            attn_backend=backend,
            seq_lens_cpu=[1] * bs,
        )

    def copy_in(self, fb: ForwardBatch, kv_slots: torch.Tensor, size: int) -> None:
        """fb's inputs and slot rows into the first rows, the rest up to `size` padding."""
        bs = fb.batch_size
        self.input_ids[:bs].copy_(fb.input_ids)
        self.positions[:bs].copy_(fb.positions)
        self.out_cache_loc[:bs].copy_(fb.out_cache_loc)
        self.seq_lens[:bs].copy_(fb.seq_lens)
        self.kv_slots[:bs, : kv_slots.shape[1]].copy_(kv_slots)
        self.reset_padding(bs, size)

    def reset_padding(self, start: int, end: int) -> None:
        if start < end:
            for buf in (self.input_ids, self.positions, self.out_cache_loc):
                buf[start:end] = 0
            self.seq_lens[start:end] = 1
            self.kv_slots[start:end, 0] = 0


def decode_logits(model: torch.nn.Module, fb: ForwardBatch) -> torch.Tensor:
    """What a graph holds: the model's decode forward and its logits (float32)."""
    hidden = model.forward(fb.input_ids, fb.positions, fb)
    return model.compute_logits(hidden).float()
