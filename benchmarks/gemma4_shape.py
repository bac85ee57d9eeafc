"""Gemma 4's shape (llama.cpp arch `gemma4`, as its converter writes the text model): sliding
layers of `head_dim` beside every `swa_period`-th layer global with `global_head_dim`, the last
`kv_shared_layers` layers with no K/V of their own, their MLP twice as wide (`double_wide`),
per-layer inputs of `ple_dim` per layer, a learned output scale per layer. model_shapes.SHAPES holds
the instances; make_random_gguf.py writes them."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.model_shapes import Shape


@dataclass(frozen=True)
class Gemma4Shape(Shape):
    global_head_dim: int = 512
    global_kv_heads: int = 0  # 0: kv_heads
    sliding_window: int = 512
    swa_period: int = 5  # layer i is global when (i + 1) % swa_period == 0
    kv_shared_layers: int = 0
    ple_dim: int = 256
    double_wide: bool = False
    k_eq_v: bool = False  # global layers take V = K's projection (no attn_v)
    partial_rotary: float = 0.25  # the global layers' proportional RoPE
    rope_theta_swa: float = 10_000.0
    final_logit_softcapping: float = 30.0

    def is_global(self, layer: int) -> bool:
        return (layer + 1) % self.swa_period == 0

    def is_shared(self, layer: int) -> bool:
        return layer >= self.layers - self.kv_shared_layers

    def layer_kv(self, layer: int) -> tuple[int, int]:
        """(kv heads, head dim) of layer `layer`."""
        if self.is_global(layer):
            return self.global_kv_heads or self.kv_heads, self.global_head_dim
        return self.kv_heads, self.head_dim

    def ffn(self, layer: int) -> int:
        return self.intermediate * (2 if self.double_wide and self.is_shared(layer) else 1)

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        h, n, p = self.hidden, self.layers, self.ple_dim
        out = [("token_embd.weight", (self.vocab, h))]
        if p:
            out += [
                ("per_layer_token_embd.weight", (self.vocab, p * n)),
                ("per_layer_model_proj.weight", (p * n, h)),
                ("per_layer_proj_norm.weight", (p,)),
            ]
        for i in range(n):
            b, (kvh, d), f = f"blk.{i}.", self.layer_kv(i), self.ffn(i)
            out += [
                (b + "attn_norm.weight", (h,)),
                (b + "attn_q.weight", (self.heads * d, h)),
                (b + "attn_q_norm.weight", (d,)),
            ]
            if not self.is_shared(i):
                out += [(b + "attn_k.weight", (kvh * d, h)), (b + "attn_k_norm.weight", (d,))]
                if not (self.k_eq_v and self.is_global(i)):
                    out.append((b + "attn_v.weight", (kvh * d, h)))
            out += [
                (b + "attn_output.weight", (h, self.heads * d)),
                (b + "post_attention_norm.weight", (h,)),
                (b + "ffn_norm.weight", (h,)),
                (b + "ffn_gate.weight", (f, h)),
                (b + "ffn_up.weight", (f, h)),
                (b + "ffn_down.weight", (h, f)),
                (b + "post_ffw_norm.weight", (h,)),
            ]
            if p:
                out += [
                    (b + "inp_gate.weight", (p, h)),
                    (b + "proj.weight", (h, p)),
                    (b + "post_norm.weight", (h,)),
                ]
            out.append((b + "layer_output_scale.weight", (1,)))
        out.append(("output_norm.weight", (h,)))
        if not self.tied:
            out.append(("output.weight", (self.vocab, h)))
        return out

    def rope_freqs(self):
        """The converter's rope_freqs: 1 for the global layers' rotating frequencies, 1e30 (no
        rotation) for the rest."""
        import numpy as np

        half = self.global_head_dim // 2
        rotating = int(self.global_head_dim * self.partial_rotary / 2)
        return np.array([1.0] * rotating + [1e30] * (half - rotating), dtype=np.float32)

    def add_keys(self, w) -> None:
        """The keys conversion/gemma.py's Gemma4Model writes (gguf/archs/gemma4.py reads them)."""
        n = self.layers
        w.add_feed_forward_length([self.ffn(i) for i in range(n)])
        kv = [self.layer_kv(i)[0] for i in range(n)]
        w.add_head_count_kv(kv if len(set(kv)) > 1 else kv[0])
        w.add_key_length(self.global_head_dim)
        w.add_value_length(self.global_head_dim)
        w.add_key_length_swa(self.head_dim)
        w.add_value_length_swa(self.head_dim)
        w.add_rope_dimension_count(self.global_head_dim)
        w.add_rope_dimension_count_swa(self.head_dim)
        w.add_rope_freq_base_swa(self.rope_theta_swa)
        w.add_sliding_window(self.sliding_window)
        w.add_sliding_window_pattern([not self.is_global(i) for i in range(n)])
        w.add_shared_kv_layers(self.kv_shared_layers)
        w.add_embedding_length_per_layer_input(self.ple_dim)
        w.add_final_logit_softcapping(self.final_logit_softcapping)
