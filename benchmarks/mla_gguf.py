"""MLA side by side with llama.cpp (issue 46): a random-weight GGUF of DeepSeek-V2-Lite's shape in
llama.cpp's `deepseek2` architecture (the split attn_k_b / attn_v_b of newer conversions), served by
radixlm and by llama-server on the same file, decode tok/s at batch 1 / 8 / 32 with a --ctx-token
prompt per request.

    python benchmarks/mla_gguf.py -o /data/dsv2lite-4l.q8_0.gguf --llama-server PATH/llama-server
    python benchmarks/mla_gguf.py -o /tmp/ds2-smoke.gguf --layers 2 --experts 8 --ctx 32 --batch 1 2 \\
        --output-len 6 --llama-server PATH/llama-server              # a check that both load and answer

The shape is benchmarks/mla.py's (hidden 2048, 16 heads, kv_lora_rank 512, qk_rope 64, qk_nope 128,
v 128, 64 routed experts top-6 + 2 shared, the first layer dense, vocab 102400, YaRN) with --layers
of its 27 layers and --experts routed experts so that it fits this machine (stated in the output);
q_lora_rank 0 is written explicitly (llama.cpp takes its absence for V2-Lite by the layer count).
The tokenizer is SmolLM2's padded to the vocab. Decode tok/s as benchmarks/moe.py measures it:
the batch's requests at once with N and with 1 output token, rate = batch x (N - 1) / (t_N - t_1).
radixlm holds the routed experts in float (dequantized at load: docs/deepseek.md), llama.cpp as
stored. Random weights: outputs are noise; only the speed means anything. Run it alone; the figures
go to docs/benchmarks.md.
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def v2_lite_config(layers: int, experts: int):
    import transformers

    from benchmarks.mla import V2_LITE

    cfg = {k: v for k, v in V2_LITE.items() if k != "model_type"}
    cfg.update(
        num_hidden_layers=layers,
        n_routed_experts=experts,
        num_experts_per_tok=min(6, experts),
        n_group=1,
        topk_group=1,
    )
    return transformers.DeepseekV2Config(**cfg)


def tensor_plan(cfg, qtype) -> list[tuple[str, tuple[int, ...], object]]:
    """(GGUF name, numpy shape, GGML type) in convert_hf_to_gguf's order: norms and the router
    F32."""
    import gguf

    f32 = gguf.GGMLQuantizationType.F32
    h, heads, r, rope = (
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.kv_lora_rank,
        cfg.qk_rope_head_dim,
    )
    nope, v, e, i_exp = (
        cfg.qk_nope_head_dim,
        cfg.v_head_dim,
        cfg.n_routed_experts,
        cfg.moe_intermediate_size,
    )
    shared = i_exp * cfg.n_shared_experts
    out = [("token_embd.weight", (cfg.vocab_size, h), qtype)]
    for n in range(cfg.num_hidden_layers):
        b = f"blk.{n}."
        out += [
            (b + "attn_norm.weight", (h,), f32),
            (b + "attn_q.weight", (heads * (nope + rope), h), qtype),
            (b + "attn_kv_a_mqa.weight", (r + rope, h), qtype),
            (b + "attn_kv_a_norm.weight", (r,), f32),
            (b + "attn_k_b.weight", (heads, r, nope), qtype),
            (b + "attn_v_b.weight", (heads, v, r), qtype),
            (b + "attn_output.weight", (h, heads * v), qtype),
            (b + "ffn_norm.weight", (h,), f32),
        ]
        if n < cfg.first_k_dense_replace:
            out += [
                (b + "ffn_gate.weight", (cfg.intermediate_size, h), qtype),
                (b + "ffn_up.weight", (cfg.intermediate_size, h), qtype),
                (b + "ffn_down.weight", (h, cfg.intermediate_size), qtype),
            ]
        else:
            out += [
                (b + "ffn_gate_inp.weight", (e, h), f32),
                (b + "ffn_gate_exps.weight", (e, i_exp, h), qtype),
                (b + "ffn_up_exps.weight", (e, i_exp, h), qtype),
                (b + "ffn_down_exps.weight", (e, h, i_exp), qtype),
                (b + "ffn_gate_shexp.weight", (shared, h), qtype),
                (b + "ffn_up_shexp.weight", (shared, h), qtype),
                (b + "ffn_down_shexp.weight", (h, shared), qtype),
            ]
    return out + [("output_norm.weight", (h,), f32), ("output.weight", (cfg.vocab_size, h), qtype)]


def write_gguf(path: str, cfg, type_name: str, seed: int = 0, std: float = 0.02) -> None:
    """The file tensor by tensor (peak memory: one tensor)."""
    import gguf

    from benchmarks.make_random_gguf import TensorPlan, _copy_tokenizer, _random_tensor
    from radixlm.model.gguf.archs.deepseek import write_deepseek2_metadata
    from radixlm.model.loader import default_model_path

    T = gguf.GGMLQuantizationType
    qtype = {"q8_0": T.Q8_0, "f16": T.F16, "f32": T.F32}[type_name]
    w = gguf.GGUFWriter(path, "deepseek2")
    w.add_name("random-deepseek-v2-lite-shape")
    write_deepseek2_metadata(w, cfg)
    _copy_tokenizer(w, default_model_path(), cfg.vocab_size)
    plan = tensor_plan(cfg, qtype)
    for n, shape, t in plan:
        nbytes = math.prod(shape) // gguf.GGML_QUANT_SIZES[t][0] * gguf.GGML_QUANT_SIZES[t][1]
        w.add_tensor_info(n, shape, np.float16 if t == T.F16 else np.float32, nbytes, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for k, (n, shape, t) in enumerate(plan):
        rng = np.random.default_rng([seed, k])
        if t == T.F32 and len(shape) > 1:  # the router (and every matrix of an f32 file)
            data = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
        else:
            flat = TensorPlan(n, (math.prod(shape[:-1]), shape[-1]) if len(shape) > 1 else shape, t)
            data = _random_tensor(flat, rng, std)
            data = data.reshape(*shape[:-1], -1) if len(shape) > 1 else data
        w.write_tensor_data(data)
    w.close()


def token_prompt(ctx: int):
    """Request i's prompt: ctx token ids of its own (no two requests share a prefix), below
    SmolLM2's special tokens' ids and inside its real vocabulary."""

    def prompt(i: int) -> list[int]:
        return np.random.default_rng([7, i]).integers(100, 40000, ctx).tolist()

    return prompt


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("-o", "--output", required=True, help="the GGUF (written when missing)")
    p.add_argument("--layers", type=int, default=4, help="of DeepSeek-V2-Lite's 27")
    p.add_argument(
        "--experts", type=int, default=64, help="routed experts per MoE layer (V2-Lite: 64)"
    )
    p.add_argument("--type", default="q8_0", choices=["q8_0", "f16", "f32"])
    p.add_argument("--ctx", type=int, default=1024, help="prompt tokens per request")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument(
        "--llama-server", default=None, help="llama-server binary: the same GGUF side by side"
    )
    args = p.parse_args(argv)
    cfg = v2_lite_config(args.layers, args.experts)
    if not os.path.exists(args.output):
        print(f"writing {args.output} ...", flush=True)
        write_gguf(args.output, cfg, args.type)
    from benchmarks.moe import measure
    from radixlm.server.process import ServerProcess

    slots, per_request = max(args.batch), args.ctx + args.output_len + 16
    prompt = token_prompt(args.ctx)
    result = {
        "shape": (
            f"DeepSeek-V2-Lite dims, {args.layers}/27 layers, {args.experts}/64 routed experts, "
            f"{args.type} GGUF (radixlm: routed experts dequantized to float32)"
        ),
        "file_bytes": os.path.getsize(args.output),
        "ctx": args.ctx,
        "output_len": args.output_len,
        "threads": args.threads,
    }
    radixlm = ServerProcess(
        "--model-path",
        args.output,
        "--num-threads",
        str(args.threads),
        "--max-running-requests",
        str(slots),
        "--context-length",
        str(per_request),
        "--max-total-tokens",
        str(slots * per_request),
        timeout=1800,
    )
    result["radixlm_tok_s"] = measure("radixlm", radixlm, args.batch, args.output_len, prompt)
    if args.llama_server:
        server = ServerProcess(
            command=lambda port: [
                args.llama_server,
                "-m",
                args.output,
                "-np",
                str(slots),
                "-c",
                str(slots * per_request),
                "-t",
                str(args.threads),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-webui",
            ],
            name="llama-server",
            timeout=1800,
        )
        result["llama_server_tok_s"] = measure(
            "llama-server", server, args.batch, args.output_len, prompt
        )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
