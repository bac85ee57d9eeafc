"""EAGLE draft heads in their published layouts (SGLang's LlamaForCausalLMEagle /
LlamaForCausalLMEagle3).

EAGLE (EAGLE-1/2): `fc` maps [embedding of token t+1, target hidden state of token t] (2 x hidden)
to hidden, then Llama decoder layers (the first without its input norm); the output (the last
layer's plus its residual, no final norm) predicts the target's next hidden state and goes through
the target's own LM head. The embedding is the target's too.

EAGLE-3: `fc` maps the target's residual stream entering three of its layers (low, middle, high;
3 x target hidden) to hidden; one `midlayer` attends over [norm(embedding), hidden_norm(hidden)]
(its q/k/v read 2 x hidden); `norm` then `lm_head` give logits over the head's own small vocabulary,
`d2t` maps a draft id to its target id (target = draft + d2t[draft]). The stream before `norm` is
what the next step reads as its hidden state (not fc'd again).

The modules here hold plain float parameters under the checkpoint's names (state_dict() is the
published layout, so `radixlm train-eagle` trains this class and saves it as is). Attention is the
caller's (`Attend`): the draft source attends over its paged KV plus a tree (eagle.py), training
over whole sequences.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.model.layers.rotary import compute_inv_freq, cos_sin_table, rope_parameters

ARCHITECTURES = {
    "eagle": ("LlamaForCausalLMEagle", "LlamaForCausalLM"),
    "eagle3": ("LlamaForCausalLMEagle3",),
}

# q [rows, heads, head_dim], k and v [rows, kv_heads, head_dim] (roped), the layer's index -> [rows,
# heads * head_dim]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


@dataclass(frozen=True)
class EagleHeadConfig:
    kind: str  # "eagle" | "eagle3"
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    vocab_size: int  # the target's
    target_hidden_size: int
    fc_bias: bool
    attention_bias: bool
    rope: dict  # rope_parameters()
    max_position: int
    draft_vocab_size: int | None = None  # eagle3 with its own lm_head; None: the target's LM head
    # eagle3: SGLang's eagle_aux_hidden_state_layer_ids (the outputs of these target layers); None:
    # SGLang's default
    aux_layer_ids: tuple[int, ...] | None = None

    @property
    def fc_in(self) -> int:
        return (2 * self.hidden_size) if self.kind == "eagle" else 3 * self.target_hidden_size

    def capture_layers(self, target_layers: int) -> tuple[int, ...]:
        """eagle3: the target layers whose incoming residual stream are the features, low to high
        (SGLang: layer id + 1 for each given id, else 2, n // 2 and n - 3)."""
        if self.aux_layer_ids is not None:
            return tuple(i + 1 for i in self.aux_layer_ids)
        return (2, target_layers // 2, target_layers - 3)

    @classmethod
    def from_dict(cls, d: dict, kind: str) -> EagleHeadConfig:
        def need(key: str):
            if key not in d:
                raise ValueError(f"EAGLE head config.json has no {key!r}")
            return d[key]

        hidden, heads = int(need("hidden_size")), int(need("num_attention_heads"))
        eagle_cfg = d.get("eagle_config") or {}
        aux = eagle_cfg.get(
            "eagle_aux_hidden_state_layer_ids", d.get("eagle_aux_hidden_state_layer_ids")
        )
        draft_vocab = (
            d.get("draft_vocab_size")
            if kind == "eagle3" and not d.get("tie_word_embeddings")
            else None
        )
        layers = int(d.get("num_hidden_layers", 1))
        if kind == "eagle3" and layers != 1:
            raise ValueError(
                f"an EAGLE-3 head has one decoder layer (midlayer), config.json says {layers}"
            )
        if aux is not None and len(aux) != 3:
            raise ValueError(
                f"eagle_aux_hidden_state_layer_ids needs three target layers, got {aux!r}"
            )
        return cls(
            kind=kind,
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or hidden // heads),
            intermediate_size=int(need("intermediate_size")),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            vocab_size=int(need("vocab_size")),
            target_hidden_size=int(d.get("target_hidden_size") or hidden),
            fc_bias=bool(d.get("bias", kind == "eagle")),
            attention_bias=bool(d.get("attention_bias", False)),
            rope=rope_parameters(_Namespace(d)),
            max_position=int(d.get("max_position_embeddings", 4096)),
            draft_vocab_size=int(draft_vocab) if draft_vocab else None,
            aux_layer_ids=tuple(int(i) for i in aux) if aux is not None else None,
        )

    @classmethod
    def for_target(
        cls,
        target: Any,
        kind: str,
        draft_vocab_size: int | None = None,
        aux_layer_ids: Sequence[int] | None = None,
    ) -> EagleHeadConfig:
        """A one-layer head shaped like one of the target's layers (target: its HF config), as EAGLE
        trains them."""
        d = {
            k: getattr(target, k, None)
            for k in (
                "hidden_size",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "intermediate_size",
                "rms_norm_eps",
                "vocab_size",
                "max_position_embeddings",
                "rope_theta",
                "rope_scaling",
            )
        }
        d = {k: v for k, v in d.items() if v is not None}
        d.update(
            num_hidden_layers=1,
            draft_vocab_size=draft_vocab_size,
            eagle_config=(
                {"eagle_aux_hidden_state_layer_ids": list(aux_layer_ids)} if aux_layer_ids else None
            ),
        )
        cfg = cls.from_dict(d, kind)
        params = rope_parameters(target)
        return dataclasses.replace(cfg, rope=params)

    @classmethod
    def from_dir(cls, path: str, kind: str) -> EagleHeadConfig:
        file = os.path.join(path, "config.json")
        if not os.path.isfile(file):
            raise FileNotFoundError(
                f"speculative_draft_model_path {path!r}: no config.json (an EAGLE head is a "
                "directory with config.json and safetensors)"
            )
        with open(file, encoding="utf-8") as f:
            d = json.load(f)
        archs = tuple(d.get("architectures") or ())
        if archs and not set(archs) & set(ARCHITECTURES[kind]):
            other = next((k for k, names in ARCHITECTURES.items() if set(archs) & set(names)), None)
            hint = f" (an {other} head: --speculative-algorithm {other})" if other else ""
            raise ValueError(
                f"speculative_draft_model_path {path!r}: architectures {list(archs)} is not an"
                f" {kind} head ({' or '.join(ARCHITECTURES[kind])}){hint}"
            )
        return cls.from_dict(d, kind)


class _Namespace:
    """A dict read as an HF config object (rope_parameters reads attributes)."""

    def __init__(self, d: dict):
        self.__dict__.update(d)

    def __getattr__(self, name: str) -> Any:
        return None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.native = None  # serving (EagleHead.for_serving): the fused kernels where they run

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native is not None and x.dim() == 2:
            return self.native.rmsnorm(x, self.weight, self.eps)
        return rms_norm(x, self.weight, self.eps)


class ServingLinear:
    """Several nn.Linear of one input as one matmul, for serving: their weights stacked, float or
    quantized for the native CPU kernels (a one-row draft step reads every weight: Q8_0 reads a
    quarter of float32's bytes)."""

    def __init__(
        self,
        linears: Sequence[nn.Linear],
        quantize: str | None,
        weight: torch.Tensor | None = None,
    ):
        """linears (or one `weight` [out, in] without bias)."""
        if weight is None:
            weight = torch.cat([lin.weight.detach() for lin in linears])
        biases = [lin.bias for lin in linears]
        self.bias = (
            torch.cat([b.detach() for b in biases]) if biases and biases[0] is not None else None
        )
        self.matrix = None
        if quantize is not None:
            from radixlm.model.layers.quantized import QuantizedMatrix, QuantizedTensor

            self.matrix = QuantizedMatrix([QuantizedTensor.quantize(weight, quantize)])
        self.weight = weight if self.matrix is None else None
        self.sizes = [lin.out_features for lin in linears] or [weight.shape[0]]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.matrix is not None:
            return self.matrix.matmul(x, self.bias)
        return F.linear(x, self.weight, self.bias)


class Rope(nn.Module):
    """Neox-style RoPE from the config's rope parameters (model/layers/rotary.py's tables), in plain
    torch ops: the head trains through it."""

    def __init__(self, cfg: EagleHeadConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        table = cos_sin_table(
            *compute_inv_freq(cfg.rope, cfg.head_dim, cfg.max_position), cfg.max_position
        )
        self.register_buffer("cos_sin", table, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [rows, heads, head_dim]."""
        cos, sin = self.cos_sin[positions].to(x.dtype).unsqueeze(1).chunk(2, dim=-1)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def native_(self, native, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> None:
        """q [rows, heads * head_dim] and k, in place, by the CPU kernel (the same table)."""
        native.rotary_embedding_(positions, q, k, self.head_dim, self.cos_sin)


class EagleAttention(nn.Module):
    def __init__(self, cfg: EagleHeadConfig, in_size: int):
        super().__init__()
        self.cfg = cfg
        q, kv, b = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.attention_bias
        self.q_proj = nn.Linear(in_size, q, bias=b)
        self.k_proj = nn.Linear(in_size, kv, bias=b)
        self.v_proj = nn.Linear(in_size, kv, bias=b)
        self.o_proj = nn.Linear(q, cfg.hidden_size, bias=b)
        self.serving: tuple[ServingLinear, ServingLinear, Any] | None = None  # (qkv, o, native ops)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, rope: Rope, attend: Attend, layer: int
    ) -> torch.Tensor:
        c = self.cfg
        if self.serving is not None:
            qkv, o, native = self.serving
            q, k, v = qkv(x).split(qkv.sizes, dim=-1)
            if native is not None:
                rope.native_(native, positions, q, k)
                q, k = (
                    q.reshape(-1, c.num_heads, c.head_dim),
                    k.reshape(-1, c.num_kv_heads, c.head_dim),
                )
            else:
                q = rope(q.reshape(-1, c.num_heads, c.head_dim), positions)
                k = rope(k.reshape(-1, c.num_kv_heads, c.head_dim), positions)
            return o(attend(q, k, v.reshape(-1, c.num_kv_heads, c.head_dim), layer))
        q = rope(self.q_proj(x).view(-1, c.num_heads, c.head_dim), positions)
        k = rope(self.k_proj(x).view(-1, c.num_kv_heads, c.head_dim), positions)
        v = self.v_proj(x).view(-1, c.num_kv_heads, c.head_dim)
        return self.o_proj(attend(q, k, v, layer))


class EagleMLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.serving: tuple[ServingLinear, ServingLinear] | None = None  # (gate_up, down)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.serving is not None:
            gate_up, down = self.serving
            g, u = gate_up(x).chunk(2, dim=-1)
            return down(F.silu(g) * u)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class EagleLayer(nn.Module):
    """A Llama decoder layer; EAGLE's first has no input norm, EAGLE-3's midlayer reads [embeds,
    hidden]."""

    def __init__(self, cfg: EagleHeadConfig, index: int):
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.eagle3 = cfg.kind == "eagle3"
        self.self_attn = EagleAttention(cfg, 2 * h if self.eagle3 else h)
        self.mlp = EagleMLP(h, cfg.intermediate_size)
        self.post_attention_layernorm = RMSNorm(h, eps)
        if self.eagle3 or index > 0:
            self.input_layernorm = RMSNorm(h, eps)
        if self.eagle3:
            self.hidden_norm = RMSNorm(h, eps)
        self.index = index

    def forward(
        self,
        x: torch.Tensor,
        embeds: torch.Tensor | None,
        positions: torch.Tensor,
        rope: Rope,
        attend: Attend,
    ) -> torch.Tensor:
        """x: the stream entering the layer -> the stream leaving it (the residual added)."""
        if self.eagle3:
            y = torch.cat((self.input_layernorm(embeds), self.hidden_norm(x)), dim=-1)
        else:
            y = self.input_layernorm(x) if self.index > 0 else x
        x = x + self.self_attn(y, positions, rope, attend, self.index)
        return x + self.mlp(self.post_attention_layernorm(x))


class EagleHead(nn.Module):
    """The head's weights under the published names (see the module docstring). forward() gives, per
    row, the hidden state its logits come from and the one the next draft step reads."""

    def __init__(self, cfg: EagleHeadConfig):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(cfg.fc_in, cfg.hidden_size, bias=cfg.fc_bias)
        if cfg.kind == "eagle3":
            self.midlayer = EagleLayer(cfg, 0)
            self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            if cfg.draft_vocab_size:
                self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
                self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        else:
            self.layers = nn.ModuleList(EagleLayer(cfg, i) for i in range(cfg.num_layers))
        self.rope = Rope(cfg)
        self._fc: ServingLinear | None = None

    def for_serving(self, quantize: str | None) -> EagleHead:
        """Fewer, cheaper ops for drafting (no training after this): q/k/v and gate/up as one matmul
        each, every matrix quantized to `quantize` (None: float), the norms and RoPE by the fused
        kernels where they run."""
        from radixlm.kernels.ops import fused_ops

        native = fused_ops(
            self.fc.weight
        )  # the CPU kernels, or the Triton ones on CUDA (the same names)
        self._fc = ServingLinear([self.fc], quantize)
        for m in self.modules():
            if isinstance(m, EagleAttention):
                m.serving = (
                    ServingLinear([m.q_proj, m.k_proj, m.v_proj], quantize),
                    ServingLinear([m.o_proj], quantize),
                    native,
                )
            elif isinstance(m, EagleMLP):
                m.serving = (
                    ServingLinear([m.gate_proj, m.up_proj], quantize),
                    ServingLinear([m.down_proj], quantize),
                )
            elif isinstance(m, RMSNorm):
                m.native = native
        return self

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        return self._fc(x) if self._fc is not None else self.fc(x)

    @property
    def own_vocab(self) -> bool:
        return hasattr(self, "lm_head")

    def draft_token_ids(self) -> torch.Tensor | None:
        """eagle3 with its own vocabulary: the target id of each draft id; else None (the target's
        ids)."""
        if not self.own_vocab:
            return None
        return self.d2t + torch.arange(self.d2t.shape[0], device=self.d2t.device)

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        attend: Attend,
        from_target: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """embeds [rows, hidden]: the target's embedding of each row's token; hidden: the target's
        features of the token before it (from_target; EAGLE: its final hidden state, EAGLE-3: the
        three streams concatenated) or the head's own next-state output for that token.
        -> (logit_hidden, next_hidden), [rows, hidden] each."""
        if self.cfg.kind == "eagle":
            x = self._project(torch.cat((embeds, hidden), dim=-1))
            for layer in self.layers:
                x = layer(x, None, positions, self.rope, attend)
            return x, x
        x = self._project(hidden) if from_target else hidden
        x = self.midlayer(x, embeds, positions, self.rope, attend)
        return self.norm(x), x


def causal_attend(mask: torch.Tensor | None = None) -> Attend:
    """Attention of rows over all rows before them (one sequence, or a padded batch flattened with
    `mask` [rows, rows] True where a row may look): the training and reference path."""

    def attend(q, k, v, layer):
        rows, heads, dim = q.shape
        rep = heads // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        m = (
            mask
            if mask is not None
            else torch.ones(rows, rows, dtype=torch.bool, device=q.device).tril()
        )
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=m
        )
        return out.transpose(0, 1).reshape(rows, heads * dim)

    return attend
