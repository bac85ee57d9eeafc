"""Benchmarks of multi-LoRA serving (issue 37; figures go in docs/benchmarks.md, "LoRA adapters").

batch: output tokens per second of 8 concurrent requests over 4 adapters (one mixed batch) against
    the same 8 requests on the base model alone, and against the per-request loop (each adapter
    request run by itself, one after the other).
rank: the time per decode step that adapters add: 8 requests decoding under adapters of rank 8 / 16
    / 64 (all-linear targets) against the same batch on the base model.
Adapters are random peft-format files written here (no peft needed). Run on a quiet machine:
    python -m radixlm.bench.lora [--model-path P] [--quantization none] [--tokens 128] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch

from radixlm.engine.engine import Engine

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_adapter(path: str, hf_config, rank: int, seed: int) -> None:
    """A random peft LoRA adapter for every projection of every layer (alpha = rank: scale 1)."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    h, inter = hf_config.hidden_size, hf_config.intermediate_size
    heads = hf_config.num_attention_heads
    hd = getattr(hf_config, "head_dim", None) or h // heads
    kv = (getattr(hf_config, "num_key_value_heads", None) or heads) * hd
    shapes = {
        "q_proj": (heads * hd, h),
        "k_proj": (kv, h),
        "v_proj": (kv, h),
        "o_proj": (h, heads * hd),
        "gate_proj": (inter, h),
        "up_proj": (inter, h),
        "down_proj": (h, inter),
    }
    tensors = {}
    for i in range(hf_config.num_hidden_layers):
        for m, (out, inp) in shapes.items():
            part = "self_attn" if m[0] in "qkvo" else "mlp"
            key = f"base_model.model.model.layers.{i}.{part}.{m}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, inp, generator=g) * inp**-0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(out, rank, generator=g) * 0.01
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(
            {"peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": list(TARGETS)}, f
        )


def tokens_per_s(
    engine: Engine, prompts: list[list[int]], names: list, tokens: int, loop: bool = False
) -> float:
    sp = {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}
    t0 = time.perf_counter()
    if loop:
        for p, n in zip(prompts, names):
            engine.generate(input_ids=p, sampling_params=sp, lora_path=n)
    else:
        engine.generate(input_ids=prompts, sampling_params=sp, lora_path=names)
    return len(prompts) * tokens / (time.perf_counter() - t0)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    from radixlm.model.loader import default_model_path, load_model_config

    cfg = load_model_config(args.model_path or default_model_path())
    root = tempfile.mkdtemp(prefix="radixlm-lora-bench-")
    prompts = [[(97 * i + 13 * j) % 20000 + 100 for j in range(64)] for i in range(8)]
    common = dict(quantization=args.quantization, num_threads=args.threads, log_level="warning")
    med = lambda f: statistics.median(f() for _ in range(args.repeats))

    paths = []
    for k in range(4):
        write_adapter(os.path.join(root, f"r16-{k}"), cfg, 16, k)
        paths.append(f"a{k}={os.path.join(root, f'r16-{k}')}")
    names = [f"a{i % 4}" for i in range(8)]
    with Engine(args.model_path, lora_paths=paths, **common) as e:
        e.generate(input_ids=prompts[0], sampling_params={"max_new_tokens": 4})  # warm-up
        base = med(lambda: tokens_per_s(e, prompts, [None] * 8, args.tokens))
        mixed = med(lambda: tokens_per_s(e, prompts, names, args.tokens))
        loop = med(lambda: tokens_per_s(e, prompts, names, args.tokens, loop=True))
    print(
        f"batch: 8 requests x {args.tokens} tokens: base {base:.1f} tok/s, 4 adapters mixed"
        f" {mixed:.1f} tok/s ({mixed / base:.2f}x base), per-request loop {loop:.1f} tok/s (mixed"
        f" {mixed / loop:.2f}x the loop)"
    )

    for rank in (8, 16, 64):
        path = os.path.join(root, f"rank{rank}")
        write_adapter(path, cfg, rank, 100 + rank)
        with Engine(args.model_path, lora_paths=[f"r={path}"], **common) as e:
            e.generate(input_ids=prompts[0], sampling_params={"max_new_tokens": 4})
            # Decode dominates at this length: seconds per token of the 8-request batch = one step.
            step = {
                n: med(lambda n=n: 8 / tokens_per_s(e, prompts, [n] * 8, args.tokens))
                for n in (None, "r")
            }
        print(
            f"rank {rank}: decode step of 8 requests {step['r'] * 1e3:.2f} ms vs base"
            f" {step[None] * 1e3:.2f} ms (+{(step['r'] - step[None]) * 1e3:.2f} ms)"
        )


if __name__ == "__main__":
    main()
