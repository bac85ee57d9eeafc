"""HiddenCapture: the target's hidden states handed to whoever asked for them, from the forward that
computes them anyway (no extra pass).

An EAGLE draft head (speculative/eagle.py) reads the target's hidden states: EAGLE's the final
hidden state (after the last norm) of every token the target computes, EAGLE-3's the residual
stream entering three of its layers (low, middle, high). The runner holds one capture component
and hands it every forward's final hidden states (`on_forward`); every model's decoder stack
records the stream before each of `aux_layers` (`record_layer`) as it runs its layers in segments
cut there (model/decoder_stack.py). NoHiddenCapture, the default, asks for nothing: the model runs
its layers in one segment and nothing is recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from radixlm.model.forward_batch import ForwardBatch


class HiddenCapture(Protocol):
    # Layers before which the model records the residual stream (hidden + residual, or the
    # embedding before layer 0), once each however often listed; () for none.
    aux_layers: tuple[int, ...]

    def record_layer(self, layer: int, stream: torch.Tensor) -> None:
        """The residual stream [tokens, hidden] entering `layer` (one of aux_layers) in this
        forward."""
        ...

    def on_forward(self, fb: ForwardBatch, hidden: torch.Tensor) -> None:
        """The forward of fb is done: hidden [tokens, hidden] is its final hidden state (after the
        model's last norm), row for row fb.input_ids."""
        ...


class NoHiddenCapture:
    aux_layers: tuple[int, ...] = ()

    def record_layer(self, layer: int, stream: torch.Tensor) -> None:
        pass

    def on_forward(self, fb: ForwardBatch, hidden: torch.Tensor) -> None:
        pass


def layer_segments(layers: range, cuts: tuple[int, ...]) -> list[tuple[int, int]]:
    """`layers` split before each cut inside it: [(start, end), ...], non-empty, covering every
    layer once."""
    bounds = (
        [layers.start] + sorted({c for c in cuts if layers.start < c < layers.stop}) + [layers.stop]
    )
    return [(a, b) for a, b in zip(bounds, bounds[1:])]
