"""DeepStack (Qwen3-VL): visual features taken from intermediate vision layers, one set per early
decoder layer, added to the hidden states the first decoder layers put out at the image tokens'
rows (transformers' Qwen3VLTextModel._deepstack_process).

The model with images splits its encoder's output per image token into the embedding (the first
`hidden` columns) and the DeepStack features (the rest), and hands the decoder a `DeepStack` for
the forward; `DeepStackLayers` is the decoder stack's `run_layer` hook that adds them. A prefix
served from the radix cache has had its features added already: its KV was computed with them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DeepStack:
    """One forward's DeepStack input: `features[i]` [len(rows), hidden] joins layer i's output at
    the batch's `rows` (the image tokens this extend computes)."""

    rows: torch.Tensor  # int64 [n]
    features: torch.Tensor  # [num_layers, n, hidden]

    @property
    def num_layers(self) -> int:
        return self.features.shape[0]

    @staticmethod
    def split(
        pieces: list[tuple[int, torch.Tensor]], hidden: int, num_layers: int
    ) -> tuple[list[tuple[int, torch.Tensor]], DeepStack]:
        """pieces of image spans (first row in the batch, the encoder's rows: [n, hidden * (1 +
        num_layers)], the embedding then each layer's features) -> the embedding's pieces and the
        DeepStack of them all."""
        rows = torch.cat([torch.arange(s, s + t.shape[0], device=t.device) for s, t in pieces])
        feats = torch.cat([t[:, hidden:] for _, t in pieces])
        features = feats.reshape(rows.shape[0], num_layers, hidden).transpose(0, 1)
        return [(s, t[:, :hidden]) for s, t in pieces], DeepStack(rows, features)


class DeepStackLayers:
    """A decoder stack's run_layer that adds this forward's DeepStack features after each of the
    first layers (mixed into DecoderStack families: the dense and the MoE Qwen3-VL decoders).

    At an image row the stream becomes transformers' (residual + output) + feature, held whole in
    the residual with a zero output beside it (the next layer's add, or a pipeline stage's hand-over
    of both, gives it back bitwise); every other row keeps its (output, residual) pair."""

    deepstack: DeepStack | None = None  # set by the model with images around one forward

    def run_layer(self, i, positions, hidden, fb, residual):
        hidden, residual = super().run_layer(i, positions, hidden, fb, residual)
        ds = self.deepstack
        if ds is None or i >= ds.num_layers:
            return hidden, residual
        rows, feature = ds.rows, ds.features[i].to(hidden.dtype)
        if residual is None:  # a stack whose layers return the whole stream
            return hidden.index_put((rows,), hidden[rows] + feature), None
        stream = (residual[rows] + hidden[rows]) + feature
        residual = residual.index_put((rows,), stream)
        return hidden.index_put((rows,), torch.zeros_like(stream)), residual
