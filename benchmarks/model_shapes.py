"""Real models' shapes, for random-weight GGUFs of realistic size (make_random_gguf.py).

Each figure is the model's HF config.json value (source named per entry). Only the shape
matters for speed: the weights are random, the tokenizer is SmolLM2's padded to `vocab`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    arch: str  # general.architecture as llama.cpp writes it
    source: str  # where the figures come from
    hidden: int  # hidden_size
    layers: int  # num_hidden_layers
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    head_dim: int
    intermediate: int  # intermediate_size
    vocab: int  # vocab_size (the embedding's rows, padding included)
    tied: bool  # tie_word_embeddings: no output.weight
    rope_theta: float
    rms_eps: float
    context: int  # max_position_embeddings
    qkv_bias: bool = False  # Qwen2: q/k/v projections carry a bias
    # HF rope_scaling of type llama3 (Llama 3.1+), which llama.cpp stores as rope_freqs.weight
    llama3_rope: dict | None = None

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """(GGUF name, shape as [rows, cols] / [n]) in llama.cpp's order, rope_freqs excluded."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        out = [("token_embd.weight", (self.vocab, self.hidden))]
        for i in range(self.layers):
            b = f"blk.{i}."
            out.append((b + "attn_norm.weight", (self.hidden,)))
            out += [
                (b + "attn_q.weight", (q, self.hidden)),
                (b + "attn_k.weight", (kv, self.hidden)),
                (b + "attn_v.weight", (kv, self.hidden)),
            ]
            if self.qkv_bias:
                out += [
                    (b + "attn_q.bias", (q,)),
                    (b + "attn_k.bias", (kv,)),
                    (b + "attn_v.bias", (kv,)),
                ]
            out += [
                (b + "attn_output.weight", (self.hidden, q)),
                (b + "ffn_norm.weight", (self.hidden,)),
                (b + "ffn_gate.weight", (self.intermediate, self.hidden)),
                (b + "ffn_up.weight", (self.intermediate, self.hidden)),
                (b + "ffn_down.weight", (self.hidden, self.intermediate)),
            ]
        out.append(("output_norm.weight", (self.hidden,)))
        if not self.tied:
            out.append(("output.weight", (self.vocab, self.hidden)))
        return out

    def num_params(self) -> int:
        n = 0
        for _, shape in self.tensors():
            size = 1
            for d in shape:
                size *= d
            n += size
        return n


# Llama 3.1 / 3.2's rope_scaling (the same in every Llama 3.x config.json).
_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

SHAPES = {
    # meta-llama/Llama-3.2-1B(-Instruct) config.json: 1,235,814,400 parameters.
    "llama-3.2-1b": Shape(
        "llama",
        "meta-llama/Llama-3.2-1B config.json",
        hidden=2048,
        layers=16,
        heads=32,
        kv_heads=8,
        head_dim=64,
        intermediate=8192,
        vocab=128256,
        tied=True,
        rope_theta=500000.0,
        rms_eps=1e-5,
        context=131072,
        llama3_rope=_LLAMA3_ROPE,
    ),
    # Qwen/Qwen2.5-1.5B-Instruct config.json: 1,543,714,304 parameters (head_dim = 1536 / 12).
    "qwen2.5-1.5b": Shape(
        "qwen2",
        "Qwen/Qwen2.5-1.5B-Instruct config.json",
        hidden=1536,
        layers=28,
        heads=12,
        kv_heads=2,
        head_dim=128,
        intermediate=8960,
        vocab=151936,
        tied=True,
        rope_theta=1000000.0,
        rms_eps=1e-6,
        context=32768,
        qkv_bias=True,
    ),
    # meta-llama/Meta-Llama-3-8B(-Instruct) config.json: 8,030,261,248 parameters; Llama 3.0 has no
    # rope_scaling.
    "llama-3-8b": Shape(
        "llama",
        "meta-llama/Meta-Llama-3-8B config.json",
        hidden=4096,
        layers=32,
        heads=32,
        kv_heads=8,
        head_dim=128,
        intermediate=14336,
        vocab=128256,
        tied=False,
        rope_theta=500000.0,
        rms_eps=1e-5,
        context=8192,
    ),
    # Tests: the smallest files with each feature (llama3 rope + tied; qkv bias + untied). Columns
    # are multiples of 32 for the block formats; the vocab just above the SmolLM2 tokenizer's 49152.
    "tiny": Shape(
        "llama",
        "test shape",
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=2,
        head_dim=16,
        intermediate=128,
        vocab=49216,
        tied=True,
        rope_theta=500000.0,
        rms_eps=1e-5,
        context=16384,
        llama3_rope=_LLAMA3_ROPE,
    ),
    "tiny-qwen2": Shape(
        "qwen2",
        "test shape",
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=2,
        head_dim=16,
        intermediate=128,
        vocab=49216,
        tied=False,
        rope_theta=1000000.0,
        rms_eps=1e-6,
        context=4096,
        qkv_bias=True,
    ),
}
