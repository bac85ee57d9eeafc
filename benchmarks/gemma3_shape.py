"""Gemma 3's text shape (llama.cpp arch `gemma3`, as its converter's Gemma3Model writes it):
sandwich norms, q / k norms, one head size, every 6th layer global (llama.cpp fixes the pattern by
architecture), the global layers' RoPE base and linear scaling in the file, the local ones' 10000.
model_shapes.SHAPES holds the instances; make_random_gguf.py writes them."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.model_shapes import Shape


@dataclass(frozen=True)
class Gemma3Shape(Shape):
    sliding_window: int = 1024
    rope_linear_factor: float = 0.0  # the global layers' linear RoPE scaling (0: none)

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        out = [("token_embd.weight", (self.vocab, h))]
        for i in range(self.layers):
            b = f"blk.{i}."
            out += [
                (b + "attn_norm.weight", (h,)),
                (b + "attn_q.weight", (q, h)),
                (b + "attn_q_norm.weight", (self.head_dim,)),
                (b + "attn_k.weight", (kv, h)),
                (b + "attn_k_norm.weight", (self.head_dim,)),
                (b + "attn_v.weight", (kv, h)),
                (b + "attn_output.weight", (h, q)),
                (b + "post_attention_norm.weight", (h,)),
                (b + "ffn_norm.weight", (h,)),
                (b + "ffn_gate.weight", (self.intermediate, h)),
                (b + "ffn_up.weight", (self.intermediate, h)),
                (b + "ffn_down.weight", (h, self.intermediate)),
                (b + "post_ffw_norm.weight", (h,)),
            ]
        out.append(("output_norm.weight", (h,)))
        if not self.tied:
            out.append(("output.weight", (self.vocab, h)))
        return out

    def add_keys(self, w) -> None:
        """The keys conversion/gemma.py's Gemma3Model (and TextModel before it) writes beside the
        common ones (gguf/archs/gemma.py reads them)."""
        import gguf

        w.add_feed_forward_length(self.intermediate)
        w.add_head_count_kv(self.kv_heads)
        w.add_key_length(self.head_dim)
        w.add_value_length(self.head_dim)
        w.add_sliding_window(self.sliding_window)
        if self.rope_linear_factor:
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(self.rope_linear_factor)
