"""What a model is, typed: the contract between a model and the runner (model/executor/runner.py
and its helpers: the loader, the memory pools, the quantization methods, the pooler, ...).

Every served model class derives from `ServedModel` and answers `traits()` with a `ModelTraits`;
the runner reads those fields instead of probing the model for optional attributes by name.
What a module can do during loading (finish_loading, set_quantized, quantize_weights) or whether it
is sharded (tp_size) is a small runtime-checkable Protocol below, checked with isinstance.
tests/unit/test_model_contract.py keeps `hasattr` and name probes out of the runner's modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from torch import nn

if TYPE_CHECKING:
    from radixlm.model.mm_embed import EncoderCache
    from radixlm.model.tp_shard import TensorSlice


@dataclass(frozen=True)
class ModelTraits:
    """What the runner asks of a model, answered once it is built (`ServedModel.traits`)."""

    # A cross-encoder (BERT, XLM-R): no decoding, whole prompts, its pooled first token through
    # `classify()`; served with --is-embedding only.
    encoder_only: bool = False
    # The inputs a request may carry ("text", "image").
    modalities: tuple[str, ...] = ("text",)
    # The layers that keep KV in the pool (a hybrid: its attention layers, numbered among
    # themselves); None: every layer.
    num_kv_layers: int | None = None
    # Whether some layers keep a recurrent state per request (linear attention, Mamba: a hybrid;
    # its `state_specs` gives their shapes: model/memory/state_memory.py).
    is_hybrid: bool = False
    # Layers that compute no K/V and read an earlier layer's (Gemma 4's last layers).
    kv_shared_layers: tuple[int, ...] = ()
    # Its LRU of image-encoder outputs (model/mm_embed.py); None: no image encoder.
    encoder_cache: EncoderCache | None = None
    # Whether the tokens of one image attend each other both ways (Gemma 3): its requests' image
    # spans say so (MultimodalInputs.bidirectional), prefill chunks never cut a span, and only the
    # attention backends that honour it (supports_bidirectional_spans) run the model.
    bidirectional_images: bool = False
    # Whether it can join the other DP-attention ranks' MoE collectives with no tokens of its own
    # (`forward_idle`).
    supports_forward_idle: bool = False
    # Whether it loads quantized checkpoint tensors by name (`takes_quantized`, `module_of`:
    # AWQ / GPTQ / FP8 checkpoints).
    loads_quantized_weights: bool = False
    # Whether the LM head is the input embedding (one tensor under two names).
    tie_word_embeddings: bool = False
    # The longest input it covers where the model, not the config, bounds it (BERT's position
    # embeddings); None: the config's max_position_embeddings.
    context_len: int | None = None

    @property
    def is_multimodal(self) -> bool:
        return self.modalities != ("text",)


class ServedModel(nn.Module):
    """The base of every model class the registry names (model/registry.py)."""

    # The HF config it was built from.
    config: Any
    # Known before the model is built (the loader refuses to generate with an encoder).
    encoder_only: ClassVar[bool] = False

    def traits(self) -> ModelTraits:
        """What the runner may ask of this model (families extend their base's with
        dataclasses.replace)."""
        return ModelTraits(encoder_only=self.encoder_only)

    def param_name(self, name: str) -> str:
        """The parameter checkpoint tensor `name` fills, after the model's own renaming (what a
        pipeline stage asks of a name: loader._stage_owns)."""
        return name


# ------------------------------------------------------------------ what a module can do at load
@runtime_checkable
class FinishesLoading(Protocol):
    """A module with work once all its weights are in (repacking, fused copies)."""

    def finish_loading(self) -> None: ...


@runtime_checkable
class TakesQuantized(Protocol):
    """A layer whose weight matrix may be a quantized tensor the kernels multiply by."""

    def set_quantized(self, *args: Any) -> None: ...


@runtime_checkable
class QuantizesWeights(Protocol):
    """A module that quantizes its own float weights at load (MoE experts, per expert)."""

    def quantize_weights(self, fmt_name: str) -> None: ...


@runtime_checkable
class HoldsQuantized(Protocol):
    """A layer whose weight may be held quantized (qweight: that matrix; None: its float
    `weight`)."""

    qweight: Any


@runtime_checkable
class SlicesForTP(Protocol):
    """A layer that says which part of a checkpoint tensor this tensor-parallel rank holds."""

    def tp_slice(self, kind: str, shard: int | None) -> TensorSlice | None: ...


@runtime_checkable
class TPSharded(Protocol):
    """A module split across tensor-parallel ranks (tp_size: its group's size; HF modules inside
    a model may hold None)."""

    tp_size: int | None


def tp_sharded(model: nn.Module) -> bool:
    """Whether any module of the model is split across more than one tensor-parallel rank."""
    return any(isinstance(m, TPSharded) and (m.tp_size or 1) > 1 for m in model.modules())
