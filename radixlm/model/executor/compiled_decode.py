"""--enable-torch-compile: decode steps through torch.compile (SGLang's CPU graph runner,
CPU-first).

A decode step of a small model is hundreds of small ops, and on a CPU Python and torch's dispatcher
are much of its time. With --enable-torch-compile the model's decode forward (the layers and the
logits) is compiled once per batch size of SGLang's cuda-graph list (1, 2, 4, 8, 12, 16, 24, 32,
...) up to --torch-compile-max-bs, at start-up; a decode batch is padded up to the next compiled
size (padded rows write their K/V to the pool's dummy slot 0 and attend only to it). Prefill, mixed
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
from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixlm.model.decoder_stack import DecoderStack, decoder_stack_of
from radixlm.model.executor.static_decode import (
    RunnerView,
    StaticDecodeInputs,
    decode_backend_of,
    decode_logits,
    why_not_graphed,
)
from radixlm.model.forward_batch import ForwardBatch, ForwardMode
from radixlm.model.layers.attention.native import NativeCPUBackend, NativeMetadata

logger = logging.getLogger(__name__)


def compile_batch_sizes(max_bs: int, max_running_requests: int) -> list[int]:
    """SGLang's cuda-graph batch sizes (1, 2, 4, 8, 12, then every 8) up to the cap, and the cap."""
    cap = min(max_bs, max_running_requests)
    sizes = [s for s in [1, 2, 4, 8, 12, *range(16, cap + 1, 8)] if s <= cap]
    return sizes if sizes and sizes[-1] == cap else sizes + [cap]


def why_not_compiled(runner: RunnerView) -> str | None:
    """None where decode steps can be compiled, else why not (said in the start-up log line)."""
    model = runner.model
    if runner.device.type != "cpu":
        return "decode steps are compiled on CPU only"
    if decode_backend_of(runner.attn_backend, NativeCPUBackend) is None:
        return (
            f"decode attention runs {runner.attn_backend!r}; only the native backend's decode"
            " compiles"
        )
    why = why_not_graphed(model)
    if why is not None:
        return why
    stack = decoder_stack_of(model)
    if isinstance(stack, DecoderStack) and stack.fused_layers():
        return (
            "the native fused decoder op already runs every layer in one call (nothing left for "
            "torch.compile to save; docs/benchmarks.md)"
        )
    return None


@dataclass
class _Graph:
    bs: int
    fb: ForwardBatch  # the static batch of `bs` rows the compiled function is called with


class EagerDecode:
    """No compiled graphs: every forward runs eager (reason: why, when compiling was asked for)."""

    def __init__(self, reason: str | None = None):
        self.reason = reason

    def can_run(self, fb: ForwardBatch) -> bool:
        return False

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        raise AssertionError("EagerDecode runs nothing")

    def info(self) -> dict:
        """For /get_server_info's internal_state: nothing unless --enable-torch-compile was
        given."""
        return (
            {}
            if self.reason is None
            else {"torch_compile": {"compiled": False, "reason": self.reason}}
        )


class CompiledDecode:
    """Decode batches of up to max(batch_sizes) requests through the compiled model forward."""

    def __init__(self, runner: RunnerView, batch_sizes: list[int]):
        self.model = runner.model
        self.backend = decode_backend_of(runner.attn_backend, NativeCPUBackend)
        self.batch_sizes = tuple(batch_sizes)
        n = max(batch_sizes)
        self.inputs = StaticDecodeInputs(runner, n)
        q_start = torch.arange(n + 1, dtype=torch.int64, device=runner.device)
        self.graphs = {
            bs: _Graph(bs, self._static_batch(runner, bs, q_start)) for bs in batch_sizes
        }
        # One compiled function; dynamo keeps a graph per batch size (shapes are static).
        from torch import _dynamo

        cfg = _dynamo.config
        cfg.cache_size_limit = max(cfg.cache_size_limit, len(batch_sizes) + 8)
        cfg.accumulated_cache_size_limit = max(
            cfg.accumulated_cache_size_limit, len(batch_sizes) + 64
        )
        self._fn: Callable = torch.compile(decode_logits, dynamic=False, fullgraph=True)
        self.compile_s = 0.0
        self._graphs_at_capture = self.graphs_compiled = 0
        self.decode_steps = 0  # decode batches run through the compiled graphs

    def _static_batch(self, runner: RunnerView, bs: int, q_start: torch.Tensor) -> ForwardBatch:
        fb = self.inputs.batch(runner, bs, self.backend)
        i = self.inputs
        fb.attn_metadata = NativeMetadata(
            q_start=q_start[: bs + 1],
            seq_lens=i.seq_lens[:bs],
            kv_slots=i.kv_slots[:bs],
            rows=i.rows[:bs],
        )
        return fb

    def capture(self) -> float:
        """Compile every batch size now (on all-padding batches); the seconds it took."""
        t0, before = time.perf_counter(), _graphs_compiled()
        self.inputs.reset_padding(0, max(self.batch_sizes))
        with torch.inference_mode():
            # One eager step first: the layers set up lazy state on their first call (the pool's and
            # norms' native ops, the fused-op arguments); traced first, that would fail a guard
            # later.
            decode_logits(self.model, self.graphs[self.batch_sizes[0]].fb)
            for bs in sorted(self.batch_sizes, reverse=True):
                for _ in range(2):  # the second call must hit the graph the first compiled
                    self._fn(self.model, self.graphs[bs].fb)
        self.compile_s = time.perf_counter() - t0
        self._graphs_at_capture = _graphs_compiled()
        self.graphs_compiled = (
            self._graphs_at_capture - before
        )  # one per batch size when no guard failed
        return self.compile_s

    def can_run(self, fb: ForwardBatch) -> bool:
        return (
            fb.forward_mode == ForwardMode.DECODE
            and fb.batch_size <= self.batch_sizes[-1]
            and isinstance(fb.attn_metadata, NativeMetadata)
        )

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """The decode batch's logits [bs, vocab] (float32)."""
        bs = fb.batch_size
        g = self.graphs[next(s for s in self.batch_sizes if s >= bs)]
        self.inputs.copy_in(fb, fb.attn_metadata.kv_slots, g.bs)
        self.decode_steps += 1
        return self._fn(self.model, g.fb)[:bs]

    def info(self) -> dict:
        # recompiles: graphs compiled while serving (a guard that failed; each costs seconds). 0
        # expected.
        return {
            "torch_compile": {
                "compiled": True,
                "batch_sizes": list(self.batch_sizes),
                "compile_s": round(self.compile_s, 1),
                "graphs": self.graphs_compiled,
                "decode_steps": self.decode_steps,
                "recompiles": _graphs_compiled() - self._graphs_at_capture,
            }
        }


def _graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def create_decode_graphs(
    runner: RunnerView, enable: bool, max_bs: int
) -> CompiledDecode | EagerDecode:
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
            why = (
                f"compiling failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            )
        else:
            logger.info(
                "torch.compile: decode batches of 1-%d requests compiled (batch sizes %s, padded"
                " up) in %.1f s; prefill and larger batches run eager",
                sizes[-1],
                list(sizes),
                seconds,
            )
            return graphs
    logger.info("torch.compile: not compiled: %s; every forward runs eager", why)
    return EagerDecode(why)
