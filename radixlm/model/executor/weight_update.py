"""A served model's weights replaced, read back and given back (SGLang's RL routes, on the runner).

- `load_checkpoint`: a new checkpoint through the loader the server started with (safetensors or
  GGUF, the server's --quantization), beside the old model. It is refused before the load when its
  architecture or shape differs, and swapped in (`install`) only once it loaded whole: a bad
  checkpoint leaves the old weights serving. The price is both in memory while it loads.
- `weight_by_name`: one checkpoint tensor by its HF name, as this rank holds it (a fused qkv or
  gate_up shard cut out, quantized blocks dequantized); `assemble` joins the ranks' parts.
- `release_weights` / `resume_weights`: drop the model (its memory back to the OS) and load it
  again from the checkpoint it last came from.
A tensor-parallel rank runs all of this on its own shard (the loader reads the model's tp_slice).
"""

from __future__ import annotations

import gc
import logging
import os
from typing import TYPE_CHECKING, Any

import torch

from radixlm.model.layers.attention import attention_features
from radixlm.model.loader import LoadedModel, _model_kind, load_model, load_model_config
from radixlm.model.registry import resolve_architecture
from radixlm.model.tp_shard import TensorSlice
from radixlm.model.traits import HoldsQuantized, ModelTraits

if TYPE_CHECKING:
    from radixlm.model.executor.runner import ModelRunner

logger = logging.getLogger(__name__)

LOAD_FORMATS = ("auto", "safetensors", "gguf")  # SGLang's --load-format values that apply here
# What the KV pool, the sampler and the attention backend were sized for: a new checkpoint keeps
# them.
SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
)


class CheckpointError(ValueError):
    """A checkpoint the server cannot switch to; the message names the field and why."""


def _shape(config: Any) -> dict:
    heads = config.num_attention_heads
    return {
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": getattr(config, "intermediate_size", None),
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": getattr(config, "num_key_value_heads", None) or heads,
        "head_dim": getattr(config, "head_dim", None) or config.hidden_size // heads,
        "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
    }


def check_checkpoint(runner: ModelRunner, model_path: str, load_format: str | None) -> None:
    """Refuse, before loading anything, a path that is no checkpoint, a load_format it is not, or a
    model of another architecture or shape than the one served."""
    fmt = load_format or "auto"
    if fmt not in LOAD_FORMATS:
        raise CheckpointError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {fmt!r}")
    if not isinstance(model_path, str) or not model_path:
        raise CheckpointError(
            "model_path must be a non-empty string: a checkpoint's directory or .gguf file"
        )
    if os.path.exists(model_path) and not (os.path.isdir(model_path) or os.path.isfile(model_path)):
        # a FIFO or a device would block the scheduler in open()
        raise CheckpointError(
            f"model_path {model_path!r} is neither a directory nor a regular file"
        )
    try:
        kind = _model_kind(model_path)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"model_path: {e}") from None
    if kind == "config":
        raise CheckpointError(
            f"model_path {model_path!r} is a bare config.json; a checkpoint has weights "
            "(a HF directory with *.safetensors or a .gguf file)"
        )
    if fmt != "auto" and fmt != ("gguf" if kind == "gguf" else "safetensors"):
        raise CheckpointError(
            f"load_format {fmt!r} does not match model_path {model_path!r} (a "
            f"{'GGUF file' if kind == 'gguf' else 'HF directory'})"
        )
    try:
        config = load_model_config(model_path)
        arch, _ = resolve_architecture(getattr(config, "architectures", None))
    except Exception as e:
        raise CheckpointError(f"model_path {model_path!r}: cannot read its config: {e}") from None
    served = runner.loaded
    if arch != served.architecture:
        raise CheckpointError(
            f"model_path {model_path!r} is a {arch}; the server runs a {served.architecture} "
            "(a new checkpoint must have the served architecture)"
        )
    old, new = _shape(served.hf_config), _shape(config)
    for field in SHAPE_FIELDS:
        if old[field] != new[field]:
            raise CheckpointError(
                f"model_path {model_path!r} has {field} {new[field]}, the served model "
                f"{old[field]} (a new checkpoint must have the served shape)"
            )


def load_checkpoint(
    runner: ModelRunner, model_path: str, load_format: str | None = None
) -> LoadedModel:
    """The checkpoint at model_path, loaded as the served model was (dtype, device, quantization);
    CheckpointError when it does not fit. The served model is untouched."""
    check_checkpoint(runner, model_path, load_format)
    cfg = runner.config
    try:
        loaded = load_model(
            model_path,
            dtype=runner.dtype,
            device=runner.device,
            quantization=cfg.quantization,
            is_embedding=cfg.is_embedding,
            overrides=cfg.model_overrides,
        )
    except (
        MemoryError
    ):  # no room beside the served model: the server's limit, not the checkpoint's fault
        raise
    except Exception as e:
        raise CheckpointError(
            f"model_path {model_path!r}: the weights did not load: {type(e).__name__}: {e}"
        ) from None
    features = attention_features(loaded.model.modules())
    if features != runner.attn_features:
        raise CheckpointError(
            f"model_path {model_path!r}: its attention (sliding window, logit cap, sinks)"
            f" {tuple(features)} differs from the served {tuple(runner.attn_features)}"
        )
    return loaded


def install(runner: ModelRunner, loaded: LoadedModel) -> None:
    """Serve `loaded` from the next forward on; the old model's memory goes back."""
    runner.loaded, runner.model = loaded, loaded.model
    runner.reset_attention_state()  # kept K/V (mirror, shared prefix) came from the old weights
    gc.collect()


class ReleasedModel:
    """The runner's model while its weights are released: any use is a clear error (the scheduler
    runs no batch then), and introspection finds nothing: /get_server_info's per-model figures (MoE
    expert load, a vision encoder's cache) read as absent, via modules() and traits()."""

    def modules(self):
        return iter(())

    def traits(self) -> ModelTraits:
        return ModelTraits()

    def __getattr__(self, name: str):
        raise AttributeError(
            "the weights are released (release_memory_occupation); resume_memory_occupation first"
        )


def release_weights(runner: ModelRunner) -> None:
    runner.model = ReleasedModel()
    runner.loaded.model = None
    runner.reset_attention_state()
    gc.collect()


def resume_weights(runner: ModelRunner) -> None:
    """Load the weights again from the checkpoint they last came from."""
    loaded = load_checkpoint(runner, runner.loaded.model_path)
    install(runner, loaded)


# ------------------------------------------------------------------------- reading a weight back
def weight_by_name(model: torch.nn.Module, name: str) -> tuple[torch.Tensor, TensorSlice | None]:
    """(this rank's part of checkpoint tensor `name` as float32 on the CPU, the slice of the full
    tensor it is; None: all of it). KeyError for a name the model does not hold."""
    if model.traits().tie_word_embeddings and name == "lm_head.weight":
        name = "model.embed_tokens.weight"  # tied: one tensor (as SGLang answers)
    owner, kind, shard = model._owner_of(name)  # the module that took this tensor at load
    if owner is None:
        raise KeyError(name)
    quantized = owner.qweight if kind == "weight" and isinstance(owner, HoldsQuantized) else None
    value = quantized.dequantize() if quantized is not None else getattr(owner, kind, None)
    if not isinstance(value, torch.Tensor):
        raise KeyError(name)
    if shard is not None:
        start, size = owner.offsets[shard], owner.output_sizes[shard]
        value = value[start : start + size]
    part = model.tp_slice(name)
    return value.detach().to("cpu", torch.float32).contiguous(), part


def assemble(parts: list[tuple[torch.Tensor, TensorSlice | None]]) -> torch.Tensor:
    """The full tensor from every rank's (part, slice); replicated parts (KV heads held by several
    ranks, unsharded norms) are the same values and simply written again."""
    whole = [t for t, s in parts if s is None]
    if whole:
        return whole[0]
    dim = next(s.dim for _, s in parts if s is not None)
    size = max(a + n for _, s in parts if s is not None for a, n in s.ranges)
    shape = list(parts[0][0].shape)
    shape[dim] = size
    full = torch.empty(shape, dtype=torch.float32)
    for t, s in parts:
        offset = 0
        for a, n in s.ranges:
            full.narrow(dim, a, n).copy_(t.narrow(dim, offset, n))
            offset += n
    return full
