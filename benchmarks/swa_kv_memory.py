"""KV bytes per token of a long context for a model with sliding-window layers (issue 64): the
windowed layers' own slot space (model/memory/swa_memory.py) beside "every layer global".

    python benchmarks/swa_kv_memory.py --context 32768

It serves one request of `--context` tokens (prompt + 32 generated) on the Engine, through a pool of
context + 64 full slots and the fewest windowed-layer slots that can run it (a prefill chunk
plus two windows: --swa-full-tokens-ratio is set to that), with the scheduler's invariant checks on.
The model is a random gpt-oss of the real attention layout (layers alternating a 128-token window
and full attention) shrunk to one 8-dim KV head per layer, so the 32k prefill takes seconds: slot
counts depend on the layout, the window and the chunk only. The bytes are then those slot counts
times each real shape's per-layer KV bytes (float16 KV, what quantized GGUF weights run with on
CPU), against the same context in one slot space: gpt-oss-20b (24 layers, 8 KV heads x 64 dims,
window 128, alternating), gpt-oss-120b (36 layers, same), Gemma 4's default text config (30
layers, 4 KV heads, 256 dims on the 25 sliding layers of window 512 and 512 dims on the 5 global
ones: its own run, with that window), and Gemma 4 E2B, run as a random Gemma 4 of its layout (35
layers, 4 sliding : 1 global, the last 20 reading earlier layers' KV, so 15 keep any) shrunk the
same way: its bytes are its 12 sliding layers' 1 x 256 and 3 global layers' 1 x 512, against
those 15 layers keeping every token.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CHUNK = 2048
NEW = 32


@dataclass(frozen=True)
class Layout:
    name: str
    window: int
    pattern: int  # every pattern-th layer is full attention (1-based), the rest windowed
    num_layers: int
    kv_heads: int
    swa_head_dim: int
    full_head_dim: int
    kv_shared: int = 0  # the last layers that keep no KV (Gemma 4's shared-KV layers)
    family: str = "gpt-oss"  # the random model run for the slot counts: gpt-oss or gemma4

    def layer_bytes(self, head_dim: int) -> int:
        return 2 * self.kv_heads * head_dim * 2  # K and V, float16

    def _holding(self) -> range:
        return range(self.num_layers - self.kv_shared)  # the layers that keep KV

    @property
    def full_layers(self) -> int:
        return sum((i + 1) % self.pattern == 0 for i in self._holding())

    @property
    def swa_layers(self) -> int:
        return len(self._holding()) - self.full_layers


LAYOUTS = [
    Layout("gpt-oss-20b", 128, 2, 24, 8, 64, 64),
    Layout("gpt-oss-120b", 128, 2, 36, 8, 64, 64),
    Layout("gemma-4 (default text config)", 512, 6, 30, 4, 256, 512),
    Layout("gemma-4-e2b", 512, 5, 35, 1, 256, 512, kv_shared=20, family="gemma4"),
]


def _gemma4(path: str, lay: Layout, context: int) -> None:
    """A random Gemma 4 of the layout's layers, pattern and shared layers, 8-dim KV heads."""
    from tests.model.gemma4_checkpoint import gemma4_checkpoint

    gemma4_checkpoint(
        path,
        hidden_size=16,
        intermediate_size=16,
        num_attention_heads=1,
        num_key_value_heads=1,
        num_global_key_value_heads=1,
        head_dim=8,
        global_head_dim=16,
        hidden_size_per_layer_input=0,
        num_hidden_layers=lay.num_layers,
        num_kv_shared_layers=lay.kv_shared,
        sliding_window=lay.window,
        layer_types=[
            "full_attention" if (i + 1) % lay.pattern == 0 else "sliding_attention"
            for i in range(lay.num_layers)
        ],
        max_position_embeddings=context + CHUNK,
    )


def _model(path: str, window: int, pattern: int, context: int) -> None:
    """A random gpt-oss with one 8-dim KV head per layer and the layout's window pattern."""
    import torch
    import transformers

    from tests.model.hybrid_checkpoints import tiny_tokenizer

    tok = tiny_tokenizer()
    layers = 2 * pattern
    cfg = transformers.GptOssConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=layers,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=8,
        num_local_experts=2,
        num_experts_per_tok=1,
        sliding_window=window,
        layer_types=[
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(layers)
        ],
        max_position_embeddings=context + CHUNK,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    cfg.architectures = ["GptOssForCausalLM"]
    torch.manual_seed(0)
    transformers.GptOssForCausalLM(cfg).to(torch.float32).save_pretrained(path)
    tok.save_pretrained(path)


def run(lay: Layout, context: int) -> tuple[int, int, float]:
    """Serve one request of `context` tokens: (full slots, windowed-layer slots, seconds)."""
    from radixlm import Engine

    size = context + 64  # the context and what admission reserves for its answer
    swa = CHUNK + 2 * lay.window
    with tempfile.TemporaryDirectory() as path:
        if lay.family == "gemma4":
            _gemma4(path, lay, context)
        else:
            _model(path, lay.window, lay.pattern, context)
        rng = random.Random(0)
        ids = [rng.randrange(10, 800) for _ in range(context - NEW)]
        with Engine(
            model_path=path,
            quantization="none",
            max_total_tokens=size,
            swa_full_tokens_ratio=swa / size,
            chunked_prefill_size=CHUNK,
            enable_invariant_checks=True,
            log_level="warning",
        ) as engine:
            info = engine.get_internal_state()
            t = time.perf_counter()
            out = engine.generate(
                input_ids=ids,
                sampling_params={"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True},
            )
            seconds = time.perf_counter() - t
            assert len(out["output_ids"]) == NEW, out["meta_info"]
            assert engine.flush_cache()
            end = engine.get_internal_state()
            assert end["available_swa_kv_tokens"] == end["swa_kv_tokens"]
    return info["max_total_num_tokens"], info["swa_kv_tokens"], seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=32768)
    args = ap.parse_args()
    runs: dict[tuple, tuple[int, int, float]] = {}
    print(
        "| shape | window | full slots | windowed slots | KV bytes/token | every layer global |"
        " ratio | run |\n|---|---|---|---|---|---|---|---|"
    )
    for lay in LAYOUTS:
        key = (lay.window, lay.pattern, lay.family)
        if key not in runs:
            runs[key] = run(lay, args.context)
        full, swa, seconds = runs[key]
        full_b = lay.full_layers * lay.layer_bytes(lay.full_head_dim)
        swa_b = lay.swa_layers * lay.layer_bytes(lay.swa_head_dim)
        pool = full * full_b + swa * swa_b
        global_ = full * (full_b + swa_b)  # the same pool, every layer keeping every token
        print(
            f"| {lay.name} | {lay.window} | {full} | {swa} | {pool / args.context / 1024:.1f} KiB"
            f" | {global_ / args.context / 1024:.1f} KiB | {pool / global_:.3f} | {seconds:.0f} s |"
        )


if __name__ == "__main__":
    main()
