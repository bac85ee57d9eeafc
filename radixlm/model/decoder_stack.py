"""DecoderStack: the loop over a model's decoder layers, one for every family.

A family's decoder (LlamaModel, Gemma2Model, Qwen3_5Model, ...) subclasses it, builds its modules
under the checkpoint's names (this pipeline stage's only: `stage_layers`, `on_first`, `on_last`)
and inherits `forward`, which gives every family the same things: the attention backend's per-batch
set-up, the hand-over between pipeline stages, the hidden states an EAGLE-3 head reads
(`hidden_capture`), the expert dispatch of DP attention and the family's one-op native decoder where
it applies. Every layer is called as `layer(positions, hidden, forward_batch, residual) -> (hidden,
residual)`: families whose layers add their own residual (OLMo 3, Gemma 4) pass None through and
set `residual_stream = False`. A family turns the stack's knobs by overriding the small hooks below
(`embed`, `prepare`, `run_layer`, `build_fused`), never by a loop of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from radixlm.model.hidden_capture import HiddenCapture, NoHiddenCapture, layer_segments
from radixlm.model.pp_stage import PPMissingLayer, PPStage, pp_stage

if TYPE_CHECKING:
    from radixlm.model.forward_batch import ForwardBatch


class FusedStack(Protocol):
    """A family's layers as one native op (layers/fused_*.py)."""

    def runs(self, fb: ForwardBatch, segments: list[tuple[int, int]]) -> bool:
        """Whether the op can run this batch in these segments of layers."""
        ...

    def run(
        self, hidden: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch, start: int, end: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layers [start, end) from hidden (the stream, no residual) -> (hidden, residual)."""
        ...


class DecoderStack(nn.Module):
    # Who reads the residual stream entering some layers (EAGLE-3's draft head:
    # model/hidden_capture.py); the runner installs one. NoHiddenCapture reads nothing, and the
    # layers run in one segment.
    hidden_capture: HiddenCapture = NoHiddenCapture()
    # Whether the layers carry the residual stream beside their output (Llama's pre-norm layers
    # with a fused add + norm); False: each layer returns the whole stream (and None).
    residual_stream: bool = True

    def init_stack(self, config: Any, fused: bool = True, last_from: int | None = None) -> PPStage:
        """This stage's share of the layers (every layer with one stage); fused: whether the family
        has a one-op native decoder to try (build_fused); last_from: the first of the layers the
        last stage must hold (pp_partition.layer_counts). Call before building modules."""
        self.pp = pp = pp_stage(config.num_hidden_layers, last_from)
        self.hidden_size = config.hidden_size
        # (Set here, not as class attributes: nn.Module keeps submodules apart, and a class
        # attribute would hide them.) The experts' dispatch of an MoE family (DP attention: every
        # rank's token count per forward), and the RoPE whose per-request rows a batch may need
        # (longrope; None: the layers' own).
        self.dispatch: Any = None
        self.rotary_emb: Any = None
        self.use_fused_layers = fused and pp.size == 1
        self._fused: Any = None  # the op's arguments, built at the first forward (False: n/a)
        return pp

    # -- building a stage's modules ------------------------------------------------------------
    def stage_layers(self, num_layers: int, build: Callable[[int], nn.Module]) -> nn.ModuleList:
        """build(layer id) for this stage's layers; PPMissingLayer for the others (ids stay
        global, and so do the checkpoint's names)."""
        return nn.ModuleList(
            build(i) if i in self.pp.layers else PPMissingLayer() for i in range(num_layers)
        )

    def on_first(self, build: Callable[[], nn.Module], tied: bool = False) -> nn.Module:
        """A module of the first stage (the embedding; also the last's when the LM head is tied
        to it)."""
        return build() if self.pp.is_first or (tied and self.pp.is_last) else PPMissingLayer()

    def stage_embedding(self, config: Any) -> nn.Module:
        """The token embedding where this stage needs it (on_first; the LM head's when tied)."""
        from radixlm.model.layers.parallel_linear import VocabParallelEmbedding

        tied = bool(getattr(config, "tie_word_embeddings", False))
        return self.on_first(
            lambda: VocabParallelEmbedding(config.vocab_size, config.hidden_size), tied
        )

    def on_last(self, build: Callable[[], nn.Module]) -> nn.Module:
        """A module of the last stage (the final norm)."""
        return build() if self.pp.is_last else PPMissingLayer()

    # -- hooks a family overrides ---------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor, input_embeds: torch.Tensor | None) -> torch.Tensor:
        """The first layer's input (input_embeds: given instead of input_ids' embeddings, e.g.
        with images: model/mm_embed.py)."""
        return self.embed_tokens(input_ids) if input_embeds is None else input_embeds

    def prepare(
        self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch
    ) -> torch.Tensor:
        """Per-forward set-up before the layers; -> the positions the layers take."""
        if self.rotary_emb is not None:
            return self.rotary_emb.cache_rows(positions, fb)  # longrope: its table per request
        return positions

    def run_layer(
        self,
        i: int,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        fb: ForwardBatch,
        residual: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.layers[i](positions, hidden, fb, residual)

    def final_norm(self, hidden: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        if residual is None:
            return self.norm(hidden)
        return self.norm(hidden, residual)[0]

    def build_fused(self) -> FusedStack | None:
        """The family's one-op decoder for these layers (None: it has none, or it does not
        apply)."""
        return None

    # -- the loop ------------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: ForwardBatch,
        input_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """-> the final hidden states (None on a stage before the last: it sent them on)."""
        if self.dispatch is not None:
            self.dispatch.begin(input_ids.shape[0])  # DP attention: the ranks' token counts
        forward_batch.attn_backend.begin_forward(forward_batch)
        pp = self.pp
        if pp.is_first:
            hidden, residual = self.embed(input_ids, input_embeds), None
        else:
            hidden, residual = pp.recv(
                input_ids.shape[0],
                self.hidden_size,
                self.stream_dtype(),
                input_ids.device,
                self.residual_stream,
            )
        positions = self.prepare(input_ids, positions, forward_batch)
        capture = self.hidden_capture
        segments = layer_segments(pp.layers, capture.aux_layers)
        fused = self._fused_for(forward_batch, hidden, segments)
        for start, end in segments:
            if start in capture.aux_layers:
                # layer 0 (or a stage without a residual) keeps the stream in hidden
                stream = hidden.clone() if residual is None else hidden + residual
                capture.record_layer(start, stream)
                if fused:  # the op starts its segment from the stream: bitwise its add + norm
                    hidden, residual = stream, None
            if fused:
                hidden, residual = fused.run(hidden, positions, forward_batch, start, end)
            else:
                for i in range(start, end):
                    hidden, residual = self.run_layer(i, positions, hidden, forward_batch, residual)
        if not pp.is_last:
            pp.send(hidden, residual)
            return None
        return self.final_norm(hidden, residual)

    def stream_dtype(self) -> torch.dtype:
        """The dtype of the residual stream: the float parameters of this stage's first layer."""
        layer = self.layers[self.pp.layers.start]
        return next(p.dtype for p in layer.parameters() if p.dtype.is_floating_point)

    def fused_layers(self) -> FusedStack | None:
        """The one-op decoder where it applies to this model (built once)."""
        if not self.use_fused_layers:
            return None
        if self._fused is None:
            self._fused = self.build_fused() or False
        return self._fused or None

    def _fused_for(
        self, fb: ForwardBatch, hidden: torch.Tensor, segments: list[tuple[int, int]]
    ) -> FusedStack | None:
        # The op runs the base weights only: a batch with LoRA tokens takes the layers (and their
        # hooks).
        if not hidden.shape[0] or fb.uses_lora:
            return None
        fused = self.fused_layers()
        return fused if fused is not None and fused.runs(fb, segments) else None


def decoder_stack_of(model: nn.Module) -> DecoderStack | None:
    """The model's decoder stack (a model with images holds it inside its language model); None:
    an encoder (BERT) has none."""
    return next((m for m in model.modules() if isinstance(m, DecoderStack)), None)
