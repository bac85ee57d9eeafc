"""A random-weight HF checkpoint (config.json + bf16/fp16 safetensors shards) with a real model's
shape, for timing `--quantization` at load on realistic sizes (issue 34):

    python benchmarks/make_random_hf.py --shape qwen2.5-1.5b -o /data/qwen2.5-1.5b-bf16
    python -c "from radixlm.model.loader import load_model; load_model('/data/qwen2.5-1.5b-bf16',
    quantization='q4_k')"

No tokenizer is written: the checkpoint serves load-time and kernel figures, not text.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.model_shapes import SHAPES, Shape  # noqa: E402 (after the sys.path insert above)

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
SHARD_BYTES = 2 << 30


def hf_config(shape: Shape, dtype: str) -> dict:
    config = {
        "architectures": [ARCHITECTURES[shape.arch]],
        "model_type": shape.arch,
        "hidden_size": shape.hidden,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.intermediate,
        "vocab_size": shape.vocab,
        "tie_word_embeddings": shape.tied,
        "rope_theta": shape.rope_theta,
        "rms_norm_eps": shape.rms_eps,
        "max_position_embeddings": shape.context,
        "hidden_act": "silu",
        "torch_dtype": dtype,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if shape.llama3_rope:
        config["rope_scaling"] = dict(shape.llama3_rope)
    return config


def hf_tensors(shape: Shape) -> list[tuple[str, tuple[int, ...]]]:
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    out = [("model.embed_tokens.weight", (shape.vocab, shape.hidden))]
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (shape.hidden,)),
            (p + "post_attention_layernorm.weight", (shape.hidden,)),
            (p + "self_attn.q_proj.weight", (q, shape.hidden)),
            (p + "self_attn.k_proj.weight", (kv, shape.hidden)),
            (p + "self_attn.v_proj.weight", (kv, shape.hidden)),
            (p + "self_attn.o_proj.weight", (shape.hidden, q)),
            (p + "mlp.gate_proj.weight", (shape.intermediate, shape.hidden)),
            (p + "mlp.up_proj.weight", (shape.intermediate, shape.hidden)),
            (p + "mlp.down_proj.weight", (shape.hidden, shape.intermediate)),
        ]
        if shape.qkv_bias:
            out += [
                (p + f"self_attn.{n}_proj.bias", (d,)) for n, d in (("q", q), ("k", kv), ("v", kv))
            ]
    out.append(("model.norm.weight", (shape.hidden,)))
    if not shape.tied:
        out.append(("lm_head.weight", (shape.vocab, shape.hidden)))
    return out


def write(shape: Shape, output: str, dtype: str, seed: int, std: float) -> None:
    from safetensors.torch import save_file

    torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    os.makedirs(output, exist_ok=True)
    with open(os.path.join(output, "config.json"), "w") as f:
        json.dump(hf_config(shape, dtype), f, indent=2)
    g = torch.Generator().manual_seed(seed)
    shards: list[dict] = [{}]
    size = 0
    for name, dims in hf_tensors(shape):
        t = (
            (1 + 0.1 * torch.randn(dims, generator=g))
            if len(dims) == 1 and "norm" in name
            else std * torch.randn(dims, generator=g)
        )
        t = t.to(torch_dtype)
        if size + t.nbytes > SHARD_BYTES and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += t.nbytes
    weight_map = {}
    for i, tensors in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, os.path.join(output, file), metadata={"format": "pt"})
        weight_map.update({n: file for n in tensors})
        print(f"wrote {file}: {len(tensors)} tensors", flush=True)
    with open(os.path.join(output, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shape", required=True, choices=list(SHAPES))
    p.add_argument("-o", "--output", required=True, help="the directory to write")
    p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--std", type=float, default=0.02, help="standard deviation of the matrices' values"
    )
    args = p.parse_args(argv)
    write(SHAPES[args.shape], args.output, args.dtype, args.seed, args.std)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
