"""What issue 90 checks of each dense family it adds, on one tiny random float32 checkpoint per
family (hidden 256, so that Q4_K's 256-value blocks fill the rows): HF's greedy tokens from the
safetensors and from the GGUF llama.cpp's converter writes (windowed_checkpoints.check_greedy:
alone, batched, prefill chunks smaller than the prompts), the radix cache exact
(cache_checks.py), and quantized GGUFs (Q8_0, a Q4_K_M-like mix) with top-1 agreement >=
95% with HF holding the file's dequantized weights (top1_agreement.py)."""

from __future__ import annotations

from collections.abc import Callable

from tests.model.llama_like_gguf import write_llama_like_gguf
from tests.model.windowed_checkpoints import VOCAB, check_greedy, checkpoint

# The tiny shape: 4 layers, GQA 4 / 2 heads of 64, room for the cache checks' 700-token prompts.
SIZE = dict(
    hidden_size=256,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=1024,
)


def family_checkpoint(tmp_path_factory, config_cls: str, architecture: str, **config):
    """(path, HF model) of a tiny random checkpoint of the family."""
    path = str(tmp_path_factory.mktemp(architecture))
    return path, checkpoint(config_cls, architecture, path, **{**SIZE, **config})


def check_gguf_greedy(
    path: str, hf, gguf_path: str, arch: str, label: str, header=None, hparams=None
) -> None:
    write_llama_like_gguf(hf, path, gguf_path, arch, header=header, hparams=hparams)
    check_greedy(gguf_path, hf, f"{label} gguf")


def check_quantized_top1(
    path: str,
    hf,
    tmp_path,
    arch: str,
    label: str,
    header: Callable | None = None,
    hparams=None,
    qtypes: tuple[str, ...] = ("q8_0",),
) -> None:
    """Files of qtypes ("q8_0", "q4_k_m": the Q4_K_M-like mix, where a family's path differs from
    the others'), each kept in its own types on the native kernels: top-1 agreement >= 95% with HF
    holding that file's dequantized weights, along HF's greedy text."""
    from tests.hybrid.test_hybrid_gguf import hf_holding
    from tests.model.top1_agreement import top1_agreement

    for qtype in qtypes:
        q = str(tmp_path / f"{qtype}.gguf")
        write_llama_like_gguf(hf, path, q, arch, qtype, header, hparams)
        agree, total = top1_agreement(q, hf, hf_holding(hf, q), VOCAB, new_tokens=60)
        print(f"{label} {qtype}: top-1 agreement {agree}/{total}")
        assert agree / total >= 0.95, f"{label} {qtype}: top-1 agreement {agree}/{total}"


def with_config(path: str, tmp_path, **changes) -> str:
    """A copy of checkpoint `path` (its files linked) whose config.json has `changes`."""
    import json
    import os

    out = tmp_path / "changed"
    out.mkdir()
    for f in os.listdir(path):
        if f != "config.json":
            (out / f).symlink_to(os.path.join(path, f))
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    with open(out / "config.json", "w") as f:
        json.dump({**cfg, **changes}, f)
    return str(out)
