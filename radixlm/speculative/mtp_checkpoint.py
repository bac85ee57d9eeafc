"""Loading a model's multi-token-prediction layer (MtpHead, mtp_head.py) from the target's own file.

Where the heads are (num_nextn_predict_layers of them, stored after the decoder's layers):
- HF safetensors: `model.layers.{num_hidden_layers + i}.{enorm, hnorm, eh_proj, shared_head.norm,
  shared_head.head, embed_tokens}` plus that layer's own attention / MoE tensors (DeepSeek-V3,
  Kimi-K2, GLM-4.5);
- Qwen3.5 / Qwen3.5-MoE / Qwen3-Next safetensors: `mtp.fc`, `mtp.pre_fc_norm_{embedding,hidden}`,
  `mtp.norm` and `mtp.layers.0.*`, renamed to those names (_QWEN_RENAMES);
- Nemotron-3 safetensors: `mtp.layers.{i}.*` one block each of mtp_layers_block_type (an attention
  block, a MoE block), the first holding enorm / hnorm / eh_proj, the last final_layernorm (the
  shared_head.norm); the blocks become `blocks.{i}.*` of models/nemotron_h_mtp.py's layer. Its GGUF
  (nemotron_h_moe, the block folded into one blk.N) reads back under the same `mtp.layers.*` names
  (gguf/archs/hybrid_ssm.py), so both take the same renames (MtpFamily.from_mtp);
- GGUF, as llama.cpp's converter writes them: `blk.N.nextn.{eh_proj, enorm, hnorm,
  shared_head_norm, shared_head_head, embed_tokens}` plus blk.N's layer tensors, block_count
  counting them and `<arch>.nextn_predict_layers` saying how many (gguf/archs/*: the same HF names;
  qwen35.py's reads blocks up to the config's num_hidden_layers, so it is given index + 1).

The layer is built by the family's entry in MTP_FAMILY_REGISTRY (the target's layer class at index
num_hidden_layers) and loaded by the target class's own load_weights through a shell holding just
that layer at `model.layers.{num_hidden_layers}`: the checkpoint's names, expert layouts, GGUF
quant types and --quantization apply as they do to the target. The head's embedding and LM head
are the target's (as SGLang's NEXTN shares them): the file's copies are checked against the
target's shape and dropped. Where a family's layers are whole heads (DeepSeek-V3, GLM-4.5) and the
file has several, they chain (draft step k runs head k, llama.cpp's chained MTP heads); else the
first head drafts every step (SGLang's NEXTN).
"""

from __future__ import annotations

import copy
import glob
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from radixlm.registry import Registry
from radixlm.speculative.mtp_head import HeadAttention, LatentHeadAttention, MtpHead, MtpHeadConfig

if TYPE_CHECKING:
    from radixlm.model.executor.runner import ModelRunner

# (target model, its HF config, the layer's index) -> (the decoder layer, its attention stand-in)
MtpLayerBuilder = Callable[[nn.Module, Any, int], tuple[nn.Module, nn.Module]]


@dataclass(frozen=True)
class MtpFamily:
    """What a family's head differs in: its norms (Qwen's multiply by 1 + w) and its HF names.

    from_mtp(name, layer): a checkpoint's `mtp.*` tensor -> its name in the head's built layer (the
    NextN names: eh_proj, enorm, hnorm, shared_head.norm, then the layer's own), or None (another
    head's); to_mtp(nextn name, layer): back (a fitted head written under the file's names).
    None for both: the file names the head model.layers.{num_hidden_layers}.* already."""

    offset_norms: bool = False
    chained: bool = False  # num_nextn_predict_layers > 1: each a whole head, draft step k runs k
    from_mtp: Callable[[str, nn.Module], str | None] | None = None
    to_mtp: Callable[[str, nn.Module], str] | None = None

    @property
    def mtp_names(self) -> bool:
        return self.from_mtp is not None


MTP_FAMILY_REGISTRY = Registry[MtpLayerBuilder, MtpFamily](
    "multi-token-prediction family",
    unknown="{name}: radixlm does not load its multi-token-prediction layers (it loads: {choices})",
)

_SHARED = ("embed_tokens.weight", "shared_head.head.weight")  # the target's, in SGLang's NEXTN


def build_deepseek_layer(target: nn.Module, config: Any, index: int):
    from radixlm.model.models.deepseek_v2 import DeepseekV2DecoderLayer

    model = target.model
    layer = DeepseekV2DecoderLayer(config, index, model.rotary_emb, target.v3, model.dispatch)
    attention = LatentHeadAttention(layer.self_attn.attn)
    layer.self_attn.attn = attention
    return layer, attention


def build_glm4_moe_layer(target: nn.Module, config: Any, index: int):
    layer = target.build_layer(config, index, target.model.rotary_emb)
    a = layer.self_attn
    attention = HeadAttention(a.num_heads, a.num_kv_heads, a.head_dim)
    a.attn = attention
    return layer, attention


def build_qwen3_5_layer(target: nn.Module, config: Any, index: int):
    """Qwen3.5 / Qwen3-Next's `mtp.layers.0`: a full-attention layer (gated attention, q/k norms,
    partial RoPE) over the family's MLP or MoE."""
    from radixlm.model.models.qwen3_5 import Qwen3_5DecoderLayer

    mlp = target.build_mlp(config, index)
    layer = Qwen3_5DecoderLayer(config, "full_attention", 0, target.model.rotary_emb, mlp)
    a = layer.self_attn
    attention = HeadAttention(a.num_heads, a.num_kv_heads, a.head_dim)
    a.attn = attention
    return layer, attention


def build_nemotron_h_layer(target: nn.Module, config: Any, index: int):
    """Nemotron-3's MTP blocks (mtp_layers_block_type: an attention block, then MoE / MLP)."""
    from radixlm.model.layers.moe.expert_dispatch import expert_dispatch
    from radixlm.model.models.nemotron_h_mtp import NemotronHMtpLayer

    layer = NemotronHMtpLayer(config, target.model.dispatch or expert_dispatch())
    a = layer.attention_block.mixer
    attention = HeadAttention(a.num_heads, a.num_kv_heads, a.head_dim)
    a.attn = attention
    return layer, attention


# Qwen's `mtp.*` names -> the NextN names (after `mtp.layers.0.` -> the layer's own)
_QWEN_RENAMES = {
    "fc.weight": "eh_proj.weight",
    "pre_fc_norm_embedding.weight": "enorm.weight",
    "pre_fc_norm_hidden.weight": "hnorm.weight",
    "norm.weight": "shared_head.norm.weight",
}


def qwen_from_mtp(name: str, layer: nn.Module) -> str | None:
    """Qwen3.5 / Qwen3-Next: mtp.fc / pre_fc_norm_* / norm, and the first head's mtp.layers.0.*."""
    rest = name.removeprefix("mtp.")
    if rest.startswith("layers."):
        i, _, rest = rest.removeprefix("layers.").partition(".")
        return rest if i == "0" else None  # later heads: only the first drafts
    return _QWEN_RENAMES.get(rest, rest)


def qwen_to_mtp(nextn_name: str, layer: nn.Module) -> str:
    back = {v: k for k, v in _QWEN_RENAMES.items()}
    return "mtp." + back[nextn_name]


_NEMOTRON_FUSION = ("enorm.weight", "hnorm.weight", "eh_proj.weight")


def nemotron_h_from_mtp(name: str, layer: nn.Module) -> str | None:
    """Nemotron-3: mtp.layers.{i}.* the i-th block of mtp_layers_block_type (the first head's);
    the first block's enorm / hnorm / eh_proj and the last one's final_layernorm are the NextN
    modules."""
    n = len(layer.blocks)
    i, _, rest = name.removeprefix("mtp.layers.").partition(".")
    if not i.isdecimal() or int(i) >= n:
        return None  # a later head's blocks
    if rest in _NEMOTRON_FUSION:
        return rest
    if rest == "final_layernorm.weight":
        return "shared_head.norm.weight"
    return f"blocks.{i}.{rest}"


def nemotron_h_to_mtp(nextn_name: str, layer: nn.Module) -> str:
    if nextn_name in _NEMOTRON_FUSION:
        return f"mtp.layers.0.{nextn_name}"
    assert nextn_name == "shared_head.norm.weight", nextn_name
    return f"mtp.layers.{len(layer.blocks) - 1}.final_layernorm.weight"


# Kimi-K2's checkpoints name themselves DeepseekV3ForCausalLM: the same entry.
MTP_FAMILY_REGISTRY.register("DeepseekV3ForCausalLM", build_deepseek_layer, MtpFamily(chained=True))
MTP_FAMILY_REGISTRY.register("Glm4MoeForCausalLM", build_glm4_moe_layer, MtpFamily(chained=True))
MTP_FAMILY_REGISTRY.register(
    "NemotronHForCausalLM",
    build_nemotron_h_layer,
    MtpFamily(from_mtp=nemotron_h_from_mtp, to_mtp=nemotron_h_to_mtp),
)
_QWEN = MtpFamily(offset_norms=True, from_mtp=qwen_from_mtp, to_mtp=qwen_to_mtp)
for _arch in (
    "Qwen3_5ForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3NextForCausalLM",
):
    MTP_FAMILY_REGISTRY.register(_arch, build_qwen3_5_layer, _QWEN)


def num_mtp_layers(config: Any, path: str | None = None) -> int:
    """DeepSeek / GLM / a GGUF: num_nextn_predict_layers; Qwen3.5's config.json:
    mtp_num_hidden_layers; Qwen3-Next's config has neither (llama.cpp's converter counts its
    checkpoint's `mtp.layers.{i}` instead, and so does this for a directory `path`)."""
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        n = int(getattr(config, key, 0) or 0)
        if n:
            return n
    if path is None or not os.path.isdir(path):
        return 0
    from safetensors import safe_open

    layers = set()
    for file in glob.glob(os.path.join(path, "*.safetensors")):
        with safe_open(file, framework="pt") as f:  # the header only
            layers.update(n.split(".")[2] for n in f.keys() if n.startswith("mtp.layers."))
    return len(layers)


def load_mtp_head(runner: ModelRunner, algorithm: str) -> MtpHead:
    """The target's MTP layers as a draft head, on the target's device and dtype: all of them
    where the family chains them (DeepSeek-V3, GLM-4.5), else the first."""
    loaded, config = runner.loaded, runner.hf_config
    n_mtp = num_mtp_layers(config, loaded.model_path)
    if n_mtp == 0:
        raise ValueError(
            f"speculative_algorithm {algorithm}: {loaded.architecture} at {loaded.model_path!r} has"
            f" no multi-token-prediction layers (num_nextn_predict_layers {n_mtp})"
        )
    build = MTP_FAMILY_REGISTRY.get(loaded.architecture)
    family = MTP_FAMILY_REGISTRY.meta(loaded.architecture)
    index, h = config.num_hidden_layers, config.hidden_size
    n_heads = n_mtp if family.chained else 1
    from radixlm.model.loader import _default_dtype

    layers, attentions = [], []
    with torch.device(runner.device), _default_dtype(runner.dtype):
        for i in range(n_heads):
            layer, attention = build(runner.model, config, index + i)
            _add_nextn_modules(layer, h, _norm_eps(config), family.offset_norms)
            layers.append(layer)
            attentions.append(attention)
    shell = _shell(runner.model, config, index, layers)
    weights = _head_weights(loaded, config, index, family, layers)
    weights = _checked(weights, index, runner.vocab_size, h)
    from radixlm.model.quant.methods import quant_method

    method = quant_method(loaded.quantization)
    if method is not None:
        weights = method.while_loading(weights, shell)
    shell.load_weights(weights)
    if method is not None:
        method.after_loading(shell)
    kv_heads, head_dim = attention.kv_shape
    cfg = MtpHeadConfig(
        "nextn", loaded.architecture, index, h, runner.vocab_size, kv_heads, head_dim, n_heads
    )
    return MtpHead(cfg, layers, attentions).eval()


def _norm_eps(config: Any) -> float:
    eps = getattr(config, "rms_norm_eps", None)
    return float(config.layer_norm_epsilon if eps is None else eps)  # Nemotron-H: the latter


def _add_nextn_modules(layer: nn.Module, hidden: int, eps: float, offset_norms: bool) -> None:
    from radixlm.model.layers.linear import Linear
    from radixlm.model.layers.norm import OffsetRMSNorm, RMSNorm

    norm = OffsetRMSNorm if offset_norms else RMSNorm
    layer.enorm = norm(hidden, eps)
    layer.hnorm = norm(hidden, eps)
    layer.eh_proj = Linear(2 * hidden, hidden, bias=False)
    layer.shared_head = nn.Module()
    layer.shared_head.norm = norm(hidden, eps)


def _shell(target: nn.Module, config: Any, index: int, layers: list[nn.Module]) -> nn.Module:
    """An instance of the target's class holding `layers` alone, from model.layers.{index}: its
    load_weights (names, expert layouts, quantized tensors, the missing / unknown checks) loads
    them."""
    cls = type(target)
    shell = cls.__new__(cls)
    nn.Module.__init__(shell)
    shell.config = copy.copy(config)
    # the target's loader skips layers past its own
    shell.config.num_hidden_layers = index + len(layers)
    shell.tie_word_embeddings = False
    shell.model = nn.Module()
    shell.model.layers = nn.ModuleList([nn.Module() for _ in range(index)] + list(layers))
    return shell


def _head_weights(
    loaded, config, index: int, family: MtpFamily, layers: list[nn.Module]
) -> Iterator[tuple[str, Any]]:
    """The heads' tensors under model.layers.{index + i}.* (a family's `mtp.*` names renamed)."""
    prefix = f"model.layers.{index}."
    heads = range(index, index + len(layers))
    keep = lambda name: _layer_of(name) in heads or (family.mtp_names and name.startswith("mtp."))
    path = loaded.model_path
    if os.path.isfile(path):  # a GGUF
        from radixlm.model.gguf.loader import gguf_weights
        from radixlm.model.gguf.reader import open_gguf

        # the layers through the head's: a file's archs read no block past num_hidden_layers
        longer = copy.copy(config)
        longer.num_hidden_layers = index + len(layers)
        weights = gguf_weights(
            open_gguf(path), longer, keep_quantized=loaded.quantization == "gguf", keep=keep
        )
    else:
        weights = _safetensors(path, keep)
    for name, t in weights:
        if name.startswith("mtp."):
            name = family.from_mtp(name, layers[0])
            if name is None:
                continue  # a later head's
            name = prefix + name
        yield name, t


def _layer_of(name: str) -> int | None:
    parts = name.split(".", 3)
    if parts[:2] == ["model", "layers"] and len(parts) > 2 and parts[2].isdecimal():
        return int(parts[2])
    return None


def _safetensors(path: str, keep: Callable[[str], bool]) -> Iterator[tuple[str, Any]]:
    from safetensors import safe_open

    for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in filter(keep, f.keys()):
                yield name, f.get_tensor(name)


def _checked(
    weights: Iterable[tuple[str, Any]], index: int, vocab: int, hidden: int
) -> Iterator[tuple[str, Any]]:
    """The layer's tensors; the file's own embedding / LM head copies checked against the target's
    [vocab, hidden] and dropped. No tensor at all: the file lacks the layer its config announces."""
    seen = False
    for name, t in weights:
        seen = True
        if name.endswith(_SHARED):
            if tuple(t.shape) != (vocab, hidden):
                raise ValueError(
                    f"{name}: expected shape ({vocab}, {hidden}) (the target's vocabulary x hidden"
                    f" size), got {tuple(t.shape)}"
                )
            continue
        yield name, t
    if not seen:
        raise ValueError(
            "the checkpoint has no tensors of its multi-token-prediction layer"
            f" model.layers.{index}"
            " (num_nextn_predict_layers says it has one: converted without it, e.g. llama.cpp's"
            " --no-mtp?)"
        )
