"""Where a low-bit KV cache loses quality: K and V rounded separately (bits, scale group, Hadamard
turn) inside HF transformers' attention, after RoPE as radixlm's pool stores them, and the
perplexity of a long text (benchmarks/long_context.py's) compared with float K / V.

    python benchmarks/kv_fake_quant.py [--tokens 2048]

Model: the embedded SmolLM2-135M-Instruct GGUF, dequantized to float32 by transformers (the weights
radixlm serves; only the KV rounding differs between rows). A study of formats radixlm does not all
have: the `int4` row is what --kv-cache-dtype int4 stores.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# (name, K's (bits, group, turned) or None for float, V's likewise)
CASES = (
    ("float K and V", None, None),
    ("int8 K and V (per token and head)", (8, 0, False), (8, 0, False)),
    ("int4 K and V + Hadamard (--kv-cache-dtype int4)", (4, 0, True), (4, 0, True)),
    ("int4 K + Hadamard, float V", (4, 0, True), None),
    ("float K, int4 V + Hadamard", None, (4, 0, True)),
    ("int8 K, int4 V + Hadamard", (8, 0, True), (4, 0, True)),
    ("int4 K and V, no turn", (4, 0, False), (4, 0, False)),
    ("int4 K and V + Hadamard, scales per 32", (4, 32, True), (4, 32, True)),
    ("int4 K and V + Hadamard, scales per 16", (4, 16, True), (4, 16, True)),
)


def hadamard(d: int):
    import torch

    h = torch.ones(1, 1)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


def rounded(x, spec):
    """x [..., d] rounded as spec = (bits, group (0: the row), turned) says; None: as it is."""
    import torch

    if spec is None:
        return x
    bits, group, turned = spec
    d = x.shape[-1]
    h = hadamard(d).to(x.dtype)
    y = x @ h if turned else x
    levels = 2 ** (bits - 1) - 1
    g = y.reshape(*y.shape[:-1], d // (group or d), group or d)
    scale = g.abs().amax(-1, keepdim=True) / levels
    q = torch.where(scale > 0, (g / scale).round().clamp(-levels, levels), 0) * scale
    q = q.reshape(y.shape)
    return q @ h.T if turned else q


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=2048)
    a = p.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from benchmarks.long_context import long_text
    from radixlm.model.loader import default_model_path

    mode: dict = {"k": None, "v": None}

    def attention(module, query, key, value, mask, **kw):
        k, v = rounded(key, mode["k"]), rounded(value, mode["v"])
        return sdpa_attention_forward(module, query, k, v, mask, **kw)

    ALL_ATTENTION_FUNCTIONS["radixlm_kv_study"] = attention
    path = default_model_path()
    folder, name = os.path.dirname(path), os.path.basename(path)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, attn_implementation="radixlm_kv_study"
    ).eval()
    ids = torch.tensor([tok.encode(long_text())[: a.tokens]])
    base = None
    print(f"| K / V | perplexity of {ids.shape[1]} tokens |\n|---|---|")
    for label, k, v in CASES:
        mode["k"], mode["v"] = k, v
        with torch.no_grad():
            ppl = math.exp(model(ids, labels=ids).loss.item())
        base = base or ppl
        print(f"| {label} | {ppl:.3f} ({(ppl / base - 1) * 100:+.1f}%) |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
