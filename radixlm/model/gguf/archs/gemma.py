"""The HF config of a Gemma 2 / Gemma 3 GGUF: what llama.cpp's converter writes (sliding window,
logit soft-caps, the global layers' RoPE) and what llama.cpp fixes by architecture instead
(src/llama-model.cpp): the local/global layer pattern (Gemma 2: every 2nd layer global, Gemma 3:
every 6th), the local layers' RoPE base (10000), and the attention scale (head_dim ** -0.5, but
hidden / heads for the 27B models, known by their layer count)."""

from __future__ import annotations

from radixlm.model.gguf.fields import field

GEMMA_ARCHS = ("gemma2", "gemma3")
_SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "olmo2": 4}  # olmo2: OLMo 3 (gguf_loader._olmo3_config)
_LAYERS_27B = {"gemma2": 46, "gemma3": 62}
_DEFAULT_WINDOW = {"gemma2": 4096}  # llama.cpp's default where a Gemma 2 file has none


def layer_types(reader, arch: str, n_layers: int) -> list[str]:
    """Per layer, sliding_attention or full_attention: the file's sliding_window_pattern where a
    newer converter wrote one (a flag per layer, or a period), else llama.cpp's fixed period
    (layer il is local when il % n < n - 1, as HF's (il + 1) % n != 0)."""
    pattern = field(reader, f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        local = [bool(p) for p in pattern]
    else:
        n = int(pattern or _SWA_PATTERN[arch])
        local = [il % n < n - 1 for il in range(n_layers)]
    return ["sliding_attention" if is_local else "full_attention" for is_local in local]


def gemma_config_kwargs(reader, arch: str, kw: dict) -> dict:
    """kw (the keys every architecture shares) completed for a Gemma config class."""
    kw = dict(kw)
    n_layers, head_dim = kw["num_hidden_layers"], kw.get("head_dim")
    window = field(reader, f"{arch}.attention.sliding_window", _DEFAULT_WINDOW.get(arch))
    if window is None:
        raise ValueError(f"{arch} GGUF without {arch}.attention.sliding_window")
    kw["sliding_window"] = int(window)
    kw["layer_types"] = layer_types(reader, arch, n_layers)
    kw["hidden_activation"] = "gelu_pytorch_tanh"
    if n_layers == _LAYERS_27B[arch]:
        kw["query_pre_attn_scalar"] = kw["hidden_size"] // kw["num_attention_heads"]
    else:
        kw["query_pre_attn_scalar"] = head_dim or kw["hidden_size"] // kw["num_attention_heads"]
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        value = field(reader, f"{arch}.{key}")
        if value is not None:
            kw[key] = float(value)
        elif arch == "gemma3":
            kw[key] = (
                None  # Gemma 3 has none unless written (Gemma 2's HF defaults are llama.cpp's)
            )
    if arch == "gemma3":
        # Global layers: the file's base (rope_theta) and scaling; local ones: 10000 unless written.
        full = dict(kw.pop("rope_scaling", None) or {"rope_type": "default"})
        full["rope_theta"] = float(kw.pop("rope_theta", 1_000_000.0))
        local_base = field(reader, f"{arch}.rope.freq_base_swa", 10_000.0)
        kw["rope_parameters"] = {
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": float(local_base)},
        }
    return kw
