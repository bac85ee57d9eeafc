"""--enable-torch-compile: decode steps through torch.compile (SGLang's CPU graph runner, CPU-first).

A decode step of a small model is hundreds of small ops, and on a CPU Python and torch's dispatcher
are much of its time. With --enable-torch-compile the model's decode forward (the layers and the
logits) is compiled once per batch size of SGLang's cuda-graph list (1, 2, 4, 8, 12, 16, 24, 32, ...)
up to --torch-compile-max-bs, at start-up; a decode batch is padded up to the next compiled size
(padded rows write their K/V to the pool's dummy slot 0 and attend only to it). Prefill, mixed
and verify batches, and larger decode batches, run eager, as in SGLang.

The compiled graph reads its inputs from static buffers (one set, sized for the largest batch),
so the same tensors and Python objects come back every step and dynamo's guards hold: no
recompilation while serving. The native ops are opaque to dynamo (kernels/ops.py registers their
fake implementations); the attention is the native backend's (paged, read by slot), whose
metadata is copied into the static buffers.

Where compiling cannot apply, or does not pay, the flag is accepted and one log line says why;
every forward then runs eager. Measured on 2 cores (docs/benchmarks.md): where the layers run in
Python (float weights, quantized models the fused op does not cover) compiled steps are 1-11%
faster; where the one-op fused decoder step runs (quantized Llama-family weights, the default
model) there is nothing left to save and compiling lost 3-6%, so it is declined there.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

import torch

from radixlm.model.forward_batch import ForwardBatch, ForwardMode
from radixlm.model.layers.attention.base import AttentionBackend
from radixlm.model.layers.attention.hybrid import HybridAttnBackend
from radixlm.model.layers.attention.native import NativeCPUBackend, NativeMetadata
from radixlm.model.layers.rotary import MRotaryEmbedding, RotaryEmbedding

logger = logging.getLogger(__name__)


class RunnerView(Protocol):
    """What this module reads of model/runner.py: ModelRunner (typed here: the runner imports us)."""

    model: torch.nn.Module
    attn_backend: AttentionBackend
    device: torch.device
    req_to_token_pool: Any
    token_to_kv_pool: Any
    max_running_requests: int


def compile_batch_sizes(max_bs: int, max_running_requests: int) -> list[int]:
    """SGLang's cuda-graph batch sizes (1, 2, 4, 8, 12, then every 8) up to the cap, and the cap."""
    cap = min(max_bs, max_running_requests)
    sizes = [s for s in [1, 2, 4, 8, 12, *range(16, cap + 1, 8)] if s <= cap]
    return sizes if sizes and sizes[-1] == cap else sizes + [cap]


def _native_decode_backend(backend: AttentionBackend) -> Optional[NativeCPUBackend]:
    if isinstance(backend, HybridAttnBackend):
        backend = backend.decode_backend
    return backend if isinstance(backend, NativeCPUBackend) else None


def why_not_compiled(runner: RunnerView) -> Optional[str]:
    """None where decode steps can be compiled, else why not (said in the start-up log line)."""
    model = runner.model
    if runner.device.type != "cpu":
        return "decode steps are compiled on CPU only"
    if _native_decode_backend(runner.attn_backend) is None:
        return f"decode attention runs {runner.attn_backend!r}; only the native backend's decode compiles"
    if any(getattr(m, "tp_size", 1) > 1 for m in model.modules()):
        return "tensor parallelism all-reduces inside the layers (not traced)"
    if getattr(getattr(model, "pp", None), "size", 1) > 1:
        return "a pipeline stage hands its activations to the next stage inside the forward (not traced)"
    if any(isinstance(m, MRotaryEmbedding) for m in model.modules()):
        return "M-RoPE positions (Qwen2-VL) come from each request's images at every step"
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is not None and type(rotary).cache_rows is not RotaryEmbedding.cache_rows:
        return "longrope picks each request's rotary table from its length (a per-step Python decision)"
    stack = getattr(model, "model", None)
    if stack is not None and getattr(stack, "use_fused_layers", False) and stack._fused_layers():
        return ("the native fused decoder op already runs every layer in one call (nothing left for "
                "torch.compile to save; docs/benchmarks.md)")
    return None


@dataclass
class _Graph:
    bs: int
    fb: ForwardBatch  # the static batch of `bs` rows the compiled function is called with


class EagerDecode:
    """No compiled graphs: every forward runs eager (reason: why, when compiling was asked for)."""

    def __init__(self, reason: Optional[str] = None):
        self.reason = reason

    def can_run(self, fb: ForwardBatch) -> bool:
        return False

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        raise AssertionError("EagerDecode runs nothing")

    def info(self) -> dict:
        """For /get_server_info's internal_state: nothing unless --enable-torch-compile was given."""
        return {} if self.reason is None else {"torch_compile": {"compiled": False, "reason": self.reason}}


class CompiledDecode:
    """Decode batches of up to max(batch_sizes) requests through the compiled model forward."""

    def __init__(self, runner: RunnerView, batch_sizes: list[int]):
        self.model = runner.model
        self.backend = _native_decode_backend(runner.attn_backend)
        self.batch_sizes = tuple(batch_sizes)
        n = max(batch_sizes)
        width = runner.req_to_token_pool.req_to_token.shape[1]
        i64 = dict(dtype=torch.int64, device=runner.device)
        # Padded rows: token 0 at position 0, K/V written to the dummy slot 0, attending to it alone.
        self.input_ids = torch.zeros(n, **i64)
        self.positions = torch.zeros(n, **i64)
        self.out_cache_loc = torch.zeros(n, **i64)
        self.seq_lens = torch.ones(n, **i64)
        self.kv_slots = torch.zeros(n, width, **i64)
        rows, q_start = torch.arange(n, **i64), torch.arange(n + 1, **i64)
        self.graphs = {bs: _Graph(bs, self._static_batch(runner, bs, rows, q_start)) for bs in batch_sizes}
        # One compiled function; dynamo keeps a graph per batch size (shapes are static).
        from torch import _dynamo

        cfg = _dynamo.config
        cfg.cache_size_limit = max(cfg.cache_size_limit, len(batch_sizes) + 8)
        cfg.accumulated_cache_size_limit = max(cfg.accumulated_cache_size_limit, len(batch_sizes) + 64)
        self._fn: Callable = torch.compile(_decode_logits, dynamic=False, fullgraph=True)
        self.compile_s = 0.0
        self._graphs_at_capture = self.graphs_compiled = 0
        self.decode_steps = 0  # decode batches run through the compiled graphs

    def _static_batch(self, runner: RunnerView, bs: int, rows: torch.Tensor, q_start: torch.Tensor) -> ForwardBatch:
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            req_pool_indices=rows[:bs],  # unused: the rows are copied into kv_slots
            seq_lens=self.seq_lens[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool=runner.token_to_kv_pool,
            attn_backend=self.backend,
            seq_lens_cpu=[1] * bs,
        )
        fb.attn_metadata = NativeMetadata(q_start=q_start[: bs + 1], seq_lens=self.seq_lens[:bs],
                                          kv_slots=self.kv_slots[:bs], rows=rows[:bs])
        return fb

    def capture(self) -> float:
        """Compile every batch size now (on all-padding batches); the seconds it took."""
        t0, before = time.perf_counter(), _graphs_compiled()
        self._reset_padding(0, max(self.batch_sizes))
        with torch.inference_mode():
            # One eager step first: the layers set up lazy state on their first call (the pool's and
            # norms' native ops, the fused-op arguments); traced first, that would fail a guard later.
            _decode_logits(self.model, self.graphs[self.batch_sizes[0]].fb)
            for bs in sorted(self.batch_sizes, reverse=True):
                for _ in range(2):  # the second call must hit the graph the first compiled
                    self._fn(self.model, self.graphs[bs].fb)
        self.compile_s = time.perf_counter() - t0
        self._graphs_at_capture = _graphs_compiled()
        self.graphs_compiled = self._graphs_at_capture - before  # one per batch size when no guard failed
        return self.compile_s

    def can_run(self, fb: ForwardBatch) -> bool:
        return (fb.forward_mode == ForwardMode.DECODE and fb.batch_size <= self.batch_sizes[-1]
                and isinstance(fb.attn_metadata, NativeMetadata))

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """The decode batch's logits [bs, vocab] (float32)."""
        bs = fb.batch_size
        g = self.graphs[next(s for s in self.batch_sizes if s >= bs)]
        md: NativeMetadata = fb.attn_metadata
        self.input_ids[:bs].copy_(fb.input_ids)
        self.positions[:bs].copy_(fb.positions)
        self.out_cache_loc[:bs].copy_(fb.out_cache_loc)
        self.seq_lens[:bs].copy_(md.seq_lens)
        self.kv_slots[:bs, : md.kv_slots.shape[1]].copy_(md.kv_slots)
        self._reset_padding(bs, g.bs)
        self.decode_steps += 1
        return self._fn(self.model, g.fb)[:bs]

    def info(self) -> dict:
        # recompiles: graphs compiled while serving (a guard that failed; each costs seconds). 0 expected.
        return {"torch_compile": {"compiled": True, "batch_sizes": list(self.batch_sizes),
                                  "compile_s": round(self.compile_s, 1), "graphs": self.graphs_compiled,
                                  "decode_steps": self.decode_steps,
                                  "recompiles": _graphs_compiled() - self._graphs_at_capture}}

    def _reset_padding(self, start: int, end: int) -> None:
        if start < end:
            for buf in (self.input_ids, self.positions, self.out_cache_loc):
                buf[start:end] = 0
            self.seq_lens[start:end] = 1
            self.kv_slots[start:end, 0] = 0


def _graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _decode_logits(model: torch.nn.Module, fb: ForwardBatch) -> torch.Tensor:
    hidden = model.forward(fb.input_ids, fb.positions, fb)
    return model.compute_logits(hidden).float()


def create_decode_graphs(runner: RunnerView, enable: bool, max_bs: int) -> "CompiledDecode | EagerDecode":
    """The runner's compiled decode (compiled now), or EagerDecode; one log line says which."""
    if not enable:
        return EagerDecode()
    why = why_not_compiled(runner)
    if why is None:
        sizes = compile_batch_sizes(max_bs, runner.max_running_requests)
        graphs = CompiledDecode(runner, sizes)
        try:
            seconds = graphs.capture()
        except Exception as e:  # an op dynamo cannot trace: serve eager rather than not at all
            why = f"compiling failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        else:
            logger.info("torch.compile: decode batches of 1-%d requests compiled (batch sizes %s, padded up) in "
                        "%.1f s; prefill and larger batches run eager", sizes[-1], list(sizes), seconds)
            return graphs
    logger.info("torch.compile: not compiled: %s; every forward runs eager", why)
    return EagerDecode(why)
