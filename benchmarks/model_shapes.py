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


@dataclass(frozen=True)
class HybridShape(Shape):
    """Qwen3.5's hybrid (llama.cpp arch `qwen35`, or `qwen35moe` with experts): Gated DeltaNet
    ("linear attention") layers, every `full_attention_interval`-th layer gated full attention.
    Figures under HF text_config's names; `intermediate` is 0 for the MoE (no dense MLP)."""

    full_attention_interval: int = 4
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 16
    partial_rotary_factor: float = 0.25
    mrope_section: tuple[int, ...] = (11, 11, 10)  # rope_parameters.mrope_section
    experts: int = 0  # num_experts (0: dense qwen35)
    experts_used: int = 0  # num_experts_per_tok
    expert_intermediate: int = 0  # moe_intermediate_size
    shared_expert_intermediate: int = 0  # shared_expert_intermediate_size

    def is_full_attention(self, layer: int) -> bool:
        return (layer + 1) % self.full_attention_interval == 0  # llama.cpp's and HF's rule

    @property
    def rope_dims(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """The tensors convert_hf_to_gguf writes for a Qwen3.5 text model (MTP block excluded):
        norms [n] (F32), the shared-expert gate [1, hidden] as HF's, experts [E, rows, cols]."""
        h = self.hidden
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        key = self.linear_num_key_heads * self.linear_key_head_dim
        value = self.linear_num_value_heads * self.linear_value_head_dim
        nv = self.linear_num_value_heads
        out = [("token_embd.weight", (self.vocab, h))]
        for i in range(self.layers):
            b = f"blk.{i}."
            out.append((b + "attn_norm.weight", (h,)))
            if self.is_full_attention(i):
                out += [
                    (b + "attn_q.weight", (2 * q, h)),  # q and its gate, interleaved per head
                    (b + "attn_k.weight", (kv, h)),
                    (b + "attn_v.weight", (kv, h)),
                    (b + "attn_output.weight", (h, q)),
                    (b + "attn_q_norm.weight", (self.head_dim,)),
                    (b + "attn_k_norm.weight", (self.head_dim,)),
                ]
            else:
                out += [
                    (b + "attn_qkv.weight", (2 * key + value, h)),
                    (b + "attn_gate.weight", (value, h)),
                    (b + "ssm_conv1d.weight", (2 * key + value, self.linear_conv_kernel_dim)),
                    (b + "ssm_a", (nv,)),
                    (b + "ssm_dt.bias", (nv,)),
                    (b + "ssm_beta.weight", (nv, h)),
                    (b + "ssm_alpha.weight", (nv, h)),
                    (b + "ssm_norm.weight", (self.linear_value_head_dim,)),
                    (b + "ssm_out.weight", (h, value)),
                ]
            out.append((b + "post_attention_norm.weight", (h,)))
            if self.experts:
                e, f, sf = self.experts, self.expert_intermediate, self.shared_expert_intermediate
                out += [
                    (b + "ffn_gate_inp.weight", (e, h)),
                    (b + "ffn_gate_exps.weight", (e, f, h)),
                    (b + "ffn_up_exps.weight", (e, f, h)),
                    (b + "ffn_down_exps.weight", (e, h, f)),
                    (b + "ffn_gate_inp_shexp.weight", (1, h)),
                    (b + "ffn_gate_shexp.weight", (sf, h)),
                    (b + "ffn_up_shexp.weight", (sf, h)),
                    (b + "ffn_down_shexp.weight", (h, sf)),
                ]
            else:
                out += [
                    (b + "ffn_gate.weight", (self.intermediate, h)),
                    (b + "ffn_up.weight", (self.intermediate, h)),
                    (b + "ffn_down.weight", (h, self.intermediate)),
                ]
        out.append(("output_norm.weight", (h,)))
        if not self.tied:
            out.append(("output.weight", (self.vocab, h)))
        return out


@dataclass(frozen=True)
class GptOssShape(Shape):
    """gpt-oss (llama.cpp arch `gpt-oss`): q/k/v/o biases and attention sinks, a window on every
    other layer (layer 0 first), a biased router and biased experts whose weights are MXFP4, as the
    released GGUFs store them. `intermediate` is an expert's (there is no dense MLP)."""

    experts: int = 32
    experts_used: int = 4
    sliding_window: int = 128
    yarn_factor: float = 32.0
    yarn_original_context: int = 4096

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        h, e, f = self.hidden, self.experts, self.intermediate
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        out = [("token_embd.weight", (self.vocab, h))]
        for i in range(self.layers):
            b = f"blk.{i}."
            out.append((b + "attn_norm.weight", (h,)))
            for name, rows in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
                out += [(b + name + ".weight", (rows, h)), (b + name + ".bias", (rows,))]
            out += [
                (b + "attn_output.weight", (h, q)),
                (b + "attn_output.bias", (h,)),
                (b + "attn_sinks.weight", (self.heads,)),
                (b + "post_attention_norm.weight", (h,)),
                (b + "ffn_gate_inp.weight", (e, h)),
                (b + "ffn_gate_inp.bias", (e,)),
                (b + "ffn_gate_exps.weight", (e, f, h)),
                (b + "ffn_gate_exps.bias", (e, f)),
                (b + "ffn_up_exps.weight", (e, f, h)),
                (b + "ffn_up_exps.bias", (e, f)),
                (b + "ffn_down_exps.weight", (e, h, f)),
                (b + "ffn_down_exps.bias", (e, h)),
            ]
        out.append(("output_norm.weight", (h,)))
        if not self.tied:
            out.append(("output.weight", (self.vocab, h)))
        return out


from benchmarks.gemma3_shape import Gemma3Shape  # noqa: E402 (it subclasses Shape, defined above)
from benchmarks.gemma4_shape import Gemma4Shape  # noqa: E402 (it subclasses Shape, defined above)

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
    # Qwen/Qwen2.5-0.5B-Instruct config.json: 494,032,768 parameters (head_dim = 896 / 14). Its
    # 896 columns are no multiple of 256: llama-quantize's Q4_K_M falls back to Q5_0 / Q8_0 for
    # those matrices, as in the released Q4_K_M file (a mixed-type file, like a real one).
    "qwen2.5-0.5b": Shape(
        "qwen2",
        "Qwen/Qwen2.5-0.5B-Instruct config.json",
        hidden=896,
        layers=24,
        heads=14,
        kv_heads=2,
        head_dim=64,
        intermediate=4864,
        vocab=151936,
        tied=True,
        rope_theta=1000000.0,
        rms_eps=1e-6,
        context=32768,
        qkv_bias=True,
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
    # google/gemma-3-4b-it config.json's text_config (every 6th layer global, linear RoPE scaling
    # 8 on the global layers): the text model, 3.88 B parameters.
    "gemma-3-4b": Gemma3Shape(
        "gemma3",
        "google/gemma-3-4b-it config.json (text_config)",
        hidden=2560,
        layers=34,
        heads=8,
        kv_heads=4,
        head_dim=256,
        intermediate=10240,
        vocab=262208,
        tied=True,
        rope_theta=1_000_000.0,
        rms_eps=1e-6,
        context=131072,
        sliding_window=1024,
        rope_linear_factor=8.0,
    ),
    # mistralai/Mistral-Small-3.1-24B-Instruct-2503 config.json's text_config (Mistral Small 3.1 /
    # 3.2, Magistral Small and Devstral Small share it; llama.cpp writes the text model as `llama`).
    "mistral-small-24b": Shape(
        "llama",
        "mistralai/Mistral-Small-3.1-24B-Instruct-2503 config.json (text_config)",
        hidden=5120,
        layers=40,
        heads=32,
        kv_heads=8,
        head_dim=128,
        intermediate=32768,
        vocab=131072,
        tied=False,
        rope_theta=1000000000.0,
        rms_eps=1e-5,
        context=131072,
    ),
    # openai/gpt-oss-20b config.json (experts_per_token 4, sliding_window 128, YaRN factor 32 over
    # 4096): 20,914,757,184 parameters (its model card's 21B).
    "gpt-oss-20b": GptOssShape(
        "gpt-oss",
        "openai/gpt-oss-20b config.json",
        hidden=2880,
        layers=24,
        heads=64,
        kv_heads=8,
        head_dim=64,
        intermediate=2880,
        vocab=201088,
        tied=False,
        rope_theta=150000.0,
        rms_eps=1e-5,
        context=131072,
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
    "tiny-gpt-oss": GptOssShape(
        "gpt-oss",
        "test shape",
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=2,
        head_dim=16,
        intermediate=64,
        vocab=49216,
        tied=False,
        rope_theta=150000.0,
        rms_eps=1e-5,
        context=4096,
        experts=4,
        experts_used=2,
        sliding_window=8,
        yarn_original_context=256,
    ),
    # Qwen/Qwen3.5-0.8B config.json text_config (as given in the task brief, which quotes it):
    # 24 layers, 3 Gated DeltaNet : 1 gated attention. Text model only (the vision tower is not
    # in llama.cpp's text GGUF): 752,393,024 parameters.
    "qwen3.5-0.8b": HybridShape(
        "qwen35",
        "Qwen/Qwen3.5-0.8B config.json text_config",
        hidden=1024,
        layers=24,
        heads=8,
        kv_heads=2,
        head_dim=256,
        intermediate=3584,
        vocab=248320,
        tied=True,
        rope_theta=10000000.0,
        rms_eps=1e-6,
        context=262144,
    ),
    # Qwen/Qwen3.5-2B config.json text_config, from memory (not checked against the file here):
    # hidden 2048 and intermediate 6144 are the figures least sure; the rest (24 layers, 8 / 2
    # heads of 256, 16 / 16 linear heads of 128, tied, rope 1e7, partial 0.25) as the 0.8B.
    "qwen3.5-2b": HybridShape(
        "qwen35",
        "Qwen/Qwen3.5-2B config.json text_config (from memory, unverified)",
        hidden=2048,
        layers=24,
        heads=8,
        kv_heads=2,
        head_dim=256,
        intermediate=6144,
        vocab=248320,
        tied=True,
        rope_theta=10000000.0,
        rms_eps=1e-6,
        context=262144,
    ),
    # Qwen/Qwen3.5-35B-A3B config.json text_config, from memory (not checked against the file):
    # 40 layers, 16 / 2 heads of 256, linear heads 16 key / 32 value of 128, 256 experts of 512
    # (8 routed) + a shared expert of 512, untied. Text model ~34.7B, ~3B active: the name's.
    "qwen3.5-35b-a3b": HybridShape(
        "qwen35moe",
        "Qwen/Qwen3.5-35B-A3B config.json text_config (from memory, unverified)",
        hidden=2048,
        layers=40,
        heads=16,
        kv_heads=2,
        head_dim=256,
        intermediate=0,
        vocab=248320,
        tied=False,
        rope_theta=10000000.0,
        rms_eps=1e-6,
        context=262144,
        linear_num_value_heads=32,
        experts=256,
        experts_used=8,
        expert_intermediate=512,
        shared_expert_intermediate=512,
    ),
    # Tests: the smallest qwen35 / qwen35moe files (4 layers: 3 linear + 1 full attention; value
    # heads 2x the key heads, so the converter's V-head reorder is exercised; rope dims 32 * 0.25
    # = 8, i.e. 4 frequencies split 2 / 1 / 1).
    "tiny-qwen35": HybridShape(
        "qwen35",
        "test shape",
        hidden=64,
        layers=4,
        heads=2,
        kv_heads=1,
        head_dim=32,
        intermediate=128,
        vocab=49216,
        tied=True,
        rope_theta=10000000.0,
        rms_eps=1e-6,
        context=4096,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        mrope_section=(2, 1, 1),
    ),
    "tiny-qwen35moe": HybridShape(
        "qwen35moe",
        "test shape",
        hidden=64,
        layers=4,
        heads=2,
        kv_heads=1,
        head_dim=32,
        intermediate=0,
        vocab=49216,
        tied=False,
        rope_theta=10000000.0,
        rms_eps=1e-6,
        context=4096,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        mrope_section=(2, 1, 1),
        experts=4,
        experts_used=2,
        expert_intermediate=32,
        shared_expert_intermediate=64,
    ),
    # google/gemma-4-E2B-it config.json text_config (its figures as public code quotes them):
    # hidden 1536, 35 layers (4 sliding : 1 global), 8 heads over 1 KV head of 256 (global: 512),
    # MLP 6144 (12288 on the 20 KV-shared layers), per-layer inputs of 256, vocab 262144, tied.
    "gemma-4-e2b": Gemma4Shape(
        "gemma4",
        "google/gemma-4-E2B-it config.json text_config",
        hidden=1536,
        layers=35,
        heads=8,
        kv_heads=1,
        head_dim=256,
        intermediate=6144,
        vocab=262144,
        tied=True,
        rope_theta=1_000_000.0,
        rms_eps=1e-6,
        context=131072,
        kv_shared_layers=20,
        double_wide=True,
    ),
    # Tests: every Gemma 4 feature (shared KV, K = V, double-wide, per-layer inputs) in 6 layers
    # (the last global, as HF requires).
    "tiny-gemma4": Gemma4Shape(
        "gemma4",
        "test shape",
        hidden=64,
        layers=6,
        heads=4,
        kv_heads=2,
        head_dim=32,
        intermediate=128,
        vocab=49216,
        tied=True,
        rope_theta=1_000_000.0,
        rms_eps=1e-6,
        context=4096,
        global_head_dim=64,
        global_kv_heads=1,
        sliding_window=8,
        swa_period=2,
        kv_shared_layers=2,
        ple_dim=32,
        double_wide=True,
        k_eq_v=True,
    ),
}
