"""ModelRunnerConfig: what a ModelRunner is built from (ServerArgs stays the one CLI surface)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixlm.lora.config import LoRAConfig
from radixlm.model.layers.attention.registry import check_attention_backend_name
from radixlm.model.memory.swa_memory import server_refusal as swa_server_refusal
from radixlm.model.quant.methods import QUANTIZATIONS, refusal
from radixlm.model.reranker import parse_overrides

if TYPE_CHECKING:
    from radixlm.config import ServerArgs

# Every name here resolves (TORCH_DTYPES): half and float are SGLang's (and torch's) other
# spellings.
TORCH_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "int4": torch.uint8,  # two 4-bit values a byte (cache/memory_pool.py INT4_KV)
}
DTYPES = ("auto", "float32", "float16", "bfloat16", "half", "float")
# int8 and int4 keep a float32 scale per token and head (memory_pool.TokenToKVPool); int4's rows
# are Hadamard-turned per head before rounding (kernels/csrc/kv_pool.h).
KV_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16", "int8", "int4")
# A hybrid model's recurrent state (SGLang's --mamba-ssm-dtype values).
MAMBA_SSM_DTYPES = ("float32", "bfloat16", "float16")


def _check_choice(
    field: str, value: str | None, choices: tuple[str, ...], optional: bool = False
) -> None:
    if value is None and optional:
        return
    if value not in choices:
        raise ValueError(f"{field} must be one of {', '.join(choices)}, got {value!r}")


@dataclass(frozen=True)
class ModelRunnerConfig:
    model_path: str | None = None  # None: the embedded default model (loader.default_model_path)
    device: str = "cpu"
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA
    quantization: str | None = (
        None  # None: gguf for a GGUF file, else none (loader.resolve_quantization)
    )
    # auto: float16 for weights in the native CPU formats where every attention backend reads it
    # (ModelRunner; QuantMethod.float16_kv), else dtype.
    kv_cache_dtype: str = "auto"
    # Backend names (attention registry); None: auto. The prefill / decode ones default to
    # attention_backend, and naming different ones makes a HybridAttnBackend.
    attention_backend: str | None = None
    prefill_attention_backend: str | None = None
    decode_attention_backend: str | None = None
    max_total_tokens: int | None = None  # KV pool size in tokens; None: from kv_memory_gb
    kv_memory_gb: float = 1.0
    # SGLang's sizing from available memory (model/memory/kv_budget.py), capped by
    # max_total_tokens; None: kv_memory_gb.
    mem_fraction_static: float | None = None
    memory_share: int = 1  # ranks on this host that split the memory (tp ranks per node)
    # The torch backend's dense decode KV copy (0: off). from_server_args resolves ServerArgs'
    # default (1 GiB on CPU).
    decode_kv_mirror_bytes: int = 0
    # Hybrid models' state pool and kernels (ServerArgs' fields of the same names).
    max_mamba_cache_size: int | None = None
    mamba_full_memory_ratio: float = 0.9
    mamba_ssm_dtype: str = "float32"
    linear_attn_backend: str = "auto"
    # Speculative decoding's most draft tokens per request and step (0: none): a hybrid's state
    # pool keeps draft slots for them (memory/state_memory.py). SchedulerConfig sets it.
    spec_draft_tokens: int = 0
    # Sliding-window layers' own slot space (model/memory/swa_memory.py): its size per full slot,
    # and why the server's options keep one slot space (None: they allow two).
    swa_full_tokens_ratio: float = 0.8
    swa_memory_off: str | None = None
    disable_shared_prefix_attention: bool = False
    max_running_requests: int = 64
    context_length: int | None = None  # None: the model's own (capped by the pool either way)
    num_threads: int | None = None  # CPU: torch intra-op threads; None: all cores
    random_seed: int = 42
    # Decode steps of up to torch_compile_max_bs requests through torch.compile
    # (model/executor/compiled_decode.py).
    enable_torch_compile: bool = False
    torch_compile_max_bs: int = 32
    # CUDA: decode steps of up to cuda_graph_max_bs requests replayed from CUDA graphs
    # (model/executor/cuda_graph_runner.py; None: min(256, max_running_requests)).
    cuda_graph_max_bs: int | None = None
    # The batch sizes captured (--cuda-graph-bs; None: SGLang's list up to the max).
    cuda_graph_bs: tuple[int, ...] | None = None
    disable_cuda_graph: bool = False
    # An embedding model (--is-embedding): extends return pooled hidden states, never logits
    # (model/pooler.py).
    is_embedding: bool = False
    # --json-model-override-args: merged into the HF config before the model is built.
    model_overrides: dict = dataclasses.field(default_factory=dict)
    # Pipeline: most requests in one decode micro-batch (None: pp_size micro-batches; pp_micro.py).
    pp_max_micro_batch_size: int | None = None
    lora: LoRAConfig | None = None  # --enable-lora (radixlm/lora/); None: off
    mm_cache_size_mb: int = (
        64  # a vision model's LRU of encoder outputs by image hash (model/mm_embed.py)
    )

    def __post_init__(self):
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("quantization", self.quantization, QUANTIZATIONS, optional=True)
        if self.device in ("cpu", "cuda") or self.device.startswith("cuda:"):
            # At start-up, in one line.
            why = refusal(self.quantization, self.device, self.model_path)
            if why:
                raise ValueError(why)
        _check_choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        for field in ("attention_backend", "prefill_attention_backend", "decode_attention_backend"):
            check_attention_backend_name(getattr(self, field), field)
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        for field in ("max_total_tokens", "context_length", "num_threads"):
            value = getattr(self, field)
            if value is not None and value <= 0:
                raise ValueError(f"{field} must be positive, got {value}")
        if self.torch_compile_max_bs <= 0:
            raise ValueError(
                f"torch_compile_max_bs must be positive, got {self.torch_compile_max_bs}"
            )
        if self.cuda_graph_max_bs is not None and self.cuda_graph_max_bs <= 0:
            raise ValueError(f"cuda_graph_max_bs must be positive, got {self.cuda_graph_max_bs}")
        if self.cuda_graph_bs is not None and (
            not self.cuda_graph_bs or min(self.cuda_graph_bs) <= 0
        ):
            raise ValueError(
                f"cuda_graph_bs must be batch sizes >= 1, got {list(self.cuda_graph_bs)}"
            )
        if self.max_running_requests <= 0:
            raise ValueError(
                f"max_running_requests must be positive, got {self.max_running_requests}"
            )
        if self.kv_memory_gb <= 0:
            raise ValueError(f"kv_memory_gb must be positive, got {self.kv_memory_gb}")
        if self.mm_cache_size_mb < 0:
            raise ValueError(f"mm_cache_size_mb must be >= 0, got {self.mm_cache_size_mb}")
        if self.max_mamba_cache_size is not None and self.max_mamba_cache_size < 2:
            raise ValueError(
                f"max_mamba_cache_size must be >= 2 (a running request and a snapshot), got"
                f" {self.max_mamba_cache_size}"
            )
        if not self.mamba_full_memory_ratio > 0:
            raise ValueError(
                f"mamba_full_memory_ratio must be > 0, got {self.mamba_full_memory_ratio}"
            )
        if self.mamba_ssm_dtype not in MAMBA_SSM_DTYPES:
            raise ValueError(
                f"mamba_ssm_dtype {self.mamba_ssm_dtype!r}: choose from"
                f" {', '.join(MAMBA_SSM_DTYPES)}"
            )
        if not self.swa_full_tokens_ratio > 0:
            raise ValueError(f"swa_full_tokens_ratio must be > 0, got {self.swa_full_tokens_ratio}")
        if self.decode_kv_mirror_bytes < 0:
            raise ValueError(
                f"decode_kv_mirror_bytes must be >= 0, got {self.decode_kv_mirror_bytes}"
            )

    @classmethod
    def from_server_args(cls, args: ServerArgs) -> ModelRunnerConfig:
        return cls(
            model_path=args.model_path,
            device=args.device,
            dtype=args.dtype,
            quantization=args.quantization,
            kv_cache_dtype=args.kv_cache_dtype,
            attention_backend=args.attention_backend,
            prefill_attention_backend=args.prefill_attention_backend,
            decode_attention_backend=args.decode_attention_backend,
            max_total_tokens=args.max_total_tokens,
            kv_memory_gb=args.kv_memory_gb,
            mem_fraction_static=args.mem_fraction_static,
            memory_share=max(1, args.tp_size * args.pp_size // max(1, args.nnodes)),
            # The torch backend's decode mirror: 1 GiB on CPU (where it saves the per-step gather),
            # off on CUDA.
            decode_kv_mirror_bytes=int(
                (1.0 if args.device == "cpu" else 0.0) * 2**30
                if args.decode_kv_mirror_gb is None
                else args.decode_kv_mirror_gb * 2**30
            ),
            disable_shared_prefix_attention=args.disable_shared_prefix_attention,
            max_running_requests=args.max_running_requests,
            context_length=args.context_length,
            num_threads=args.num_threads,
            random_seed=args.random_seed,
            enable_torch_compile=args.enable_torch_compile,
            torch_compile_max_bs=args.torch_compile_max_bs,
            cuda_graph_max_bs=args.cuda_graph_max_bs,
            cuda_graph_bs=None if args.cuda_graph_bs is None else tuple(args.cuda_graph_bs),
            disable_cuda_graph=args.disable_cuda_graph,
            is_embedding=args.is_embedding,
            model_overrides=parse_overrides(args.json_model_override_args),
            pp_max_micro_batch_size=args.pp_max_micro_batch_size,
            lora=LoRAConfig.from_server_args(args),
            mm_cache_size_mb=args.mm_cache_size_mb,
            max_mamba_cache_size=args.max_mamba_cache_size,
            mamba_full_memory_ratio=args.mamba_full_memory_ratio,
            mamba_ssm_dtype=args.mamba_ssm_dtype,
            linear_attn_backend=args.linear_attn_backend,
            swa_full_tokens_ratio=args.swa_full_tokens_ratio,
            swa_memory_off=swa_server_refusal(args),
        )

    def resolved_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.float32 if self.device == "cpu" else torch.bfloat16
        return TORCH_DTYPES[self.dtype]

    def resolved_kv_cache_dtype(self) -> torch.dtype:
        """The KV dtype asked for; auto is the model dtype here (ModelRunner may pick float16 for
        quantized weights)."""
        if self.kv_cache_dtype == "auto":
            return self.resolved_dtype()
        return TORCH_DTYPES[self.kv_cache_dtype]

    def resolved_mamba_ssm_dtype(self) -> torch.dtype:
        """A hybrid model's recurrent states' dtype (memory/state_memory.py)."""
        return TORCH_DTYPES[self.mamba_ssm_dtype]
