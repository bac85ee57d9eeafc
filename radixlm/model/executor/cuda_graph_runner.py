"""CUDA graphs of decode steps (SGLang's CudaGraphRunner): --cuda-graph-max-bs, --cuda-graph-bs,
--disable-cuda-graph.

A decode step of a model on a GPU is a few hundred kernel launches; at small batches launching
them takes longer than running them. At start-up the model's decode forward (layers and logits) is
captured once per batch size of SGLang's list (1, 2, 4, 8, 12, 16, 24, 32, ...) up to
--cuda-graph-max-bs, or of --cuda-graph-bs's list (graph_batch_sizes), into one memory pool, the
largest first; a decode batch is then copied into
static input buffers, padded up to the next captured size, and the graph replayed. Padded rows
write their K/V to the pool's dummy slot 0 and attend to it alone (compiled_decode.py's design,
which this shares: its batch sizes, its padding, its static batches).

What the graph reads is fixed at capture: the static buffers (input ids, positions, output slots,
sequence lengths, each request's slot row) and the Triton backend's kernels, whose grids depend on
the batch size alone (split-KV decode, triton_backend.py); the shared-prefix groups are found by
device ops inside the graph. The logits are copied out of the graph's output (the next replay
overwrites it while the scheduler may still read this step's). Prefill, mixed and verify batches,
batches with LoRA adapters and larger decode batches run eager, as in SGLang.

Captured only where every decode op can be: a CUDA device, the Triton decode backend, one tensor-
and pipeline-parallel rank, rotary tables that do not depend on the batch (not longrope). Where it
cannot apply, one log line says why and every forward runs eager.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from radixlm.model.executor.compiled_decode import EagerDecode, compile_batch_sizes
from radixlm.model.executor.static_decode import (
    RunnerView,
    StaticDecodeInputs,
    decode_backend_of,
    decode_logits,
    why_not_graphed,
)
from radixlm.model.forward_batch import ForwardBatch, ForwardMode
from radixlm.model.layers.attention.triton_backend import TritonAttnBackend, TritonMetadata

if TYPE_CHECKING:
    from radixlm.model.executor.runner_config import ModelRunnerConfig

logger = logging.getLogger(__name__)

DEFAULT_MAX_BS = 256


def graph_batch_sizes(config: ModelRunnerConfig, max_running_requests: int) -> list[int]:
    """The decode batch sizes to capture: --cuda-graph-bs's (sorted, once each) where given, less
    those above --max-running-requests (a decode batch never has more) or --cuda-graph-max-bs when
    that is given too; else SGLang's list (1, 2, 4, 8, 12, then every 8) up to --cuda-graph-max-bs
    (default min(256, --max-running-requests)) and that cap. Possibly empty."""
    if config.cuda_graph_bs:
        cap = min(max_running_requests, config.cuda_graph_max_bs or max_running_requests)
        return sorted({bs for bs in config.cuda_graph_bs if bs <= cap})
    cap = config.cuda_graph_max_bs or min(DEFAULT_MAX_BS, max_running_requests)
    return compile_batch_sizes(cap, max_running_requests)


def why_not_captured(runner: RunnerView) -> str | None:
    """None where decode steps can be captured, else why not (said in the start-up log line)."""
    if runner.device.type != "cuda":
        return "CUDA graphs need a CUDA device"
    if decode_backend_of(runner.attn_backend, TritonAttnBackend) is None:
        return (
            f"decode attention runs {runner.attn_backend!r}; only the triton backend's decode is"
            " captured"
        )
    return why_not_graphed(runner.model)


class CudaGraphDecode:
    """Decode batches of up to max(batch_sizes) requests replayed from CUDA graphs."""

    def __init__(self, runner: RunnerView, batch_sizes: list[int]):
        self.model = runner.model
        self.backend = decode_backend_of(runner.attn_backend, TritonAttnBackend)
        self.batch_sizes = tuple(sorted(batch_sizes))
        self.inputs = StaticDecodeInputs(runner, max(batch_sizes))
        kv_heads = runner.token_to_kv_pool.num_kv_heads
        self.static = {bs: self._static_batch(runner, bs, kv_heads) for bs in batch_sizes}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.capture_s = 0.0
        self.decode_steps = 0  # decode batches replayed

    def _static_batch(self, runner: RunnerView, bs: int, kv_heads: int) -> ForwardBatch:
        from radixlm.kernels import triton_ops

        fb = self.inputs.batch(runner, bs, self.backend)
        sms, i = self.backend.sms, self.inputs
        # kv_start made here, not while capturing (a tensor made then holds its value in replays
        # only).
        fb.attn_metadata = TritonMetadata(
            kv_slots=i.kv_slots[:bs],
            seq_lens=i.seq_lens[:bs],
            num_splits=triton_ops.decode_splits(bs, kv_heads, sms),
            num_prefix_splits=triton_ops.decode_splits(1, kv_heads, sms),
            kv_start=i.kv_start[:bs],
        )
        return fb

    def capture(self) -> float:
        """Capture every batch size now (on all-padding batches), the largest first so the smaller
        graphs reuse its memory; the seconds it took."""
        t0 = time.perf_counter()
        self.inputs.reset_padding(0, max(self.batch_sizes))
        pool = torch.cuda.graph_pool_handle()
        with torch.inference_mode():
            for bs in sorted(self.batch_sizes, reverse=True):
                fb = self.static[bs]
                # Warm-up off the capture stream: Triton compiles its kernels, lazy state is set up.
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):
                        decode_logits(self.model, fb)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[bs] = decode_logits(self.model, fb)
                self.graphs[bs] = graph
        torch.cuda.synchronize()
        self.capture_s = time.perf_counter() - t0
        return self.capture_s

    def can_run(self, fb: ForwardBatch) -> bool:
        return (
            fb.forward_mode == ForwardMode.DECODE
            and fb.batch_size <= self.batch_sizes[-1]
            and not fb.uses_lora
            and isinstance(fb.attn_metadata, TritonMetadata)
        )

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """The decode batch's logits [bs, vocab] (float32, a copy of the graph's output)."""
        bs = fb.batch_size
        size = next(s for s in self.batch_sizes if s >= bs)
        self.inputs.copy_in(fb, fb.attn_metadata.kv_slots, size)
        self.graphs[size].replay()
        self.decode_steps += 1
        return self.outputs[size][:bs].clone()

    def info(self) -> dict:
        return {
            "cuda_graph": {
                "captured": True,
                "batch_sizes": list(self.batch_sizes),
                "capture_s": round(self.capture_s, 1),
                "decode_steps": self.decode_steps,
            }
        }


class NoCudaGraph(EagerDecode):
    """CUDA graphs not captured (reason: why, said once at start-up and in the server's info)."""

    def info(self) -> dict:
        return {"cuda_graph": {"captured": False, "reason": self.reason}}


def create_cuda_graphs(
    runner: RunnerView, config: ModelRunnerConfig
) -> CudaGraphDecode | EagerDecode:
    """The runner's CUDA graphs of decode steps (captured now), or eager decoding with the
    reason."""
    if config.enable_torch_compile:
        logger.info("torch.compile: not used on CUDA (decode steps replay CUDA graphs instead)")
    if config.disable_cuda_graph:
        return NoCudaGraph("--disable-cuda-graph")
    sizes = graph_batch_sizes(config, runner.max_running_requests)
    why = why_not_captured(runner)
    if why is None and not sizes:
        why = (
            f"no --cuda-graph-bs size is within --max-running-requests"
            f" {runner.max_running_requests} and --cuda-graph-max-bs"
        )
    if why is None:
        graphs = CudaGraphDecode(runner, sizes)
        try:
            seconds = graphs.capture()
        except Exception as e:  # an op that cannot be captured: serve eager rather than not at all
            why = f"capture failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        else:
            logger.info(
                "CUDA graphs: decode batches of up to %d requests captured (batch sizes %s, padded"
                " up) in %.1f s",
                sizes[-1],
                list(sizes),
                seconds,
            )
            return graphs
    logger.info("CUDA graphs: not captured: %s; every forward runs eager", why)
    return NoCudaGraph(why)
