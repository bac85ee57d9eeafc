"""Reading and writing EAGLE heads in the published layout: a directory with config.json and
safetensors, the tensors under the head's names (eagle_head.py), with or without a "model." prefix.

What the head shares with the target is not read from the checkpoint: the embedding (EAGLE and
EAGLE-3 whose hidden size is the target's) and, for EAGLE, the LM head (SGLang's
set_embed_and_head). EAGLE's first layer has no input norm (SGLang drops one a checkpoint has).
EAGLE-3's `t2d` (the
inverse of `d2t`) is implied by `d2t`.
"""

from __future__ import annotations

import glob
import json
import logging
import os

import torch

from radixlm.speculative.eagle_head import ARCHITECTURES, EagleHead, EagleHeadConfig

logger = logging.getLogger(__name__)

# Tensors a checkpoint may carry that the head takes from the target (or implies) instead.
_SHARED = ("embed_tokens.weight", "t2d")
_EAGLE_SHARED = ("lm_head.weight", "layers.0.input_layernorm.weight")
WEIGHTS_FILE = "model.safetensors"


def read_head_tensors(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"speculative_draft_model_path {path!r}: no *.safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        for name, t in load_file(file).items():
            tensors[name[len("model.") :] if name.startswith("model.") else name] = t
    return tensors


def load_eagle_head(
    path: str,
    kind: str,
    target_vocab_size: int,
    target_hidden_size: int,
    dtype: torch.dtype = torch.float32,
) -> EagleHead:
    """The head in `path` for a target of this vocabulary and hidden size, or a ValueError naming
    what does not fit."""
    cfg = EagleHeadConfig.from_dir(path, kind)
    if cfg.vocab_size != target_vocab_size:
        raise ValueError(
            f"speculative_draft_model_path {path!r}: vocab_size {cfg.vocab_size} is not the"
            f" target's {target_vocab_size} (a head is trained for one model)"
        )
    if cfg.target_hidden_size != target_hidden_size:
        raise ValueError(
            f"speculative_draft_model_path {path!r}: target hidden size {cfg.target_hidden_size} is"
            f" not the target's {target_hidden_size}"
        )
    if cfg.hidden_size != target_hidden_size:
        raise ValueError(
            f"speculative_draft_model_path {path!r}: a head whose hidden size ({cfg.hidden_size})"
            f" differs from the target's ({target_hidden_size}) needs its own embedding: not"
            " supported"
        )
    head = EagleHead(cfg)
    tensors = read_head_tensors(path)
    skip = _SHARED + (_EAGLE_SHARED if kind == "eagle" else ())
    own = head.state_dict()
    unknown = sorted(
        n
        for n in tensors
        if n not in own and n not in skip and not n.endswith("rotary_emb.inv_freq")
    )
    missing = sorted(n for n in own if n not in tensors)
    if unknown or missing:
        raise ValueError(
            f"speculative_draft_model_path {path!r}: the weights do not match an {kind} head of"
            f" this config: missing {missing[:8]}, unknown {unknown[:8]}"
        )
    for name, t in own.items():
        got = tensors[name]
        if got.shape != t.shape:
            raise ValueError(
                f"speculative_draft_model_path {path!r}: {name} has shape {tuple(got.shape)}, the "
                f"config gives {tuple(t.shape)}"
            )
    state = {n: tensors[n].to(torch.int64 if n == "d2t" else dtype) for n in own}
    head.load_state_dict(state)
    if head.own_vocab:
        ids = head.draft_token_ids()
        if int(ids.min()) < 0 or int(ids.max()) >= target_vocab_size:
            raise ValueError(
                f"speculative_draft_model_path {path!r}: d2t maps draft ids outside the target's "
                f"vocabulary of {target_vocab_size}"
            )
    ignored = sorted(n for n in tensors if n in skip)
    if ignored:
        logger.info(
            "EAGLE head %s: %s taken from the target (or implied), not from the checkpoint",
            path,
            ignored,
        )
    return head.to(dtype).eval()


def save_eagle_head(head: EagleHead, path: str, config: dict) -> None:
    """Write `head` as a published-layout checkpoint: config.json (`config`, an HF Llama config plus
    the head's fields, completed here) and model.safetensors."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    cfg = head.cfg
    out = dict(config)
    out.update(
        architectures=[ARCHITECTURES[cfg.kind][0]],
        model_type="llama",
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size,
        rms_norm_eps=cfg.rms_norm_eps,
        vocab_size=cfg.vocab_size,
        bias=cfg.fc_bias,
        attention_bias=cfg.attention_bias,
        max_position_embeddings=cfg.max_position,
        tie_word_embeddings=False,
        rope_theta=cfg.rope["rope_theta"],
    )
    if cfg.rope.get("rope_type", "default") != "default":
        out["rope_scaling"] = {k: v for k, v in cfg.rope.items() if k != "rope_theta"}
    if cfg.kind == "eagle3":
        out.update(target_hidden_size=cfg.target_hidden_size, draft_vocab_size=cfg.draft_vocab_size)
        if cfg.aux_layer_ids is not None:
            out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids)}
    state = {n: t.detach().contiguous().cpu() for n, t in head.state_dict().items()}
    if head.own_vocab:  # SGLang reads t2d too: which target ids the draft vocabulary holds
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[head.draft_token_ids().cpu()] = True
        state["t2d"] = t2d
    tmp = os.path.join(path, WEIGHTS_FILE + ".tmp")
    save_file(state, tmp)
    os.replace(tmp, os.path.join(path, WEIGHTS_FILE))
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)


def load_token_map(path: str, vocab_size: int) -> torch.Tensor:
    """SGLang's --speculative-token-map: a torch file holding the token ids (a list or a 1-D tensor)
    the draft head ranks, in any order; -> sorted unique int64 ids."""
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"speculative_token_map {path!r} does not exist (a torch file of token ids)"
        )
    try:
        ids = torch.as_tensor(torch.load(path, weights_only=True), dtype=torch.int64).flatten()
    except Exception as e:
        raise ValueError(
            f"speculative_token_map {path!r}: not a torch file of token ids ({type(e).__name__}:"
            f" {e})"
        ) from e
    ids = torch.unique(ids)
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(
            f"speculative_token_map {path!r}: token ids must be non-empty and in [0, {vocab_size})"
        )
    return ids


def save_token_map(ids: torch.Tensor, path: str) -> None:
    torch.save(ids.to(torch.int64).cpu(), path)


def head_summary(head: EagleHead, token_map: torch.Tensor | None) -> str:
    cfg = head.cfg
    vocab = (
        f"own vocabulary of {cfg.draft_vocab_size}"
        if head.own_vocab
        else (
            f"{token_map.numel()} mapped tokens"
            if token_map is not None
            else f"the target's {cfg.vocab_size} tokens"
        )
    )
    params = sum(p.numel() for p in head.parameters())
    return (
        f"{cfg.kind} head: {cfg.num_layers} layer(s), hidden {cfg.hidden_size}, {params / 1e6:.1f}M"
        f" parameters, ranks {vocab}"
    )
