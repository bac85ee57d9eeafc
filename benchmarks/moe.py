"""Mixture-of-experts decode (issue 38): a random-weight GGUF of OLMoE-1B-7B's shape (16 layers,
hidden 2048, 64 experts of 1024, top-8; Q8_0: ~7.4 GB, the whole shape fits this machine), served
by radixlm (and, with --llama-server, by llama.cpp's llama-server on the same file), decode tok/s at
batch 1 / 8 / 32, and the bytes a decode step reads against the active-parameter roofline.

    python benchmarks/moe.py -o /data/olmoe-random.q8_0.gguf                      # write (once) and measure
    python benchmarks/moe.py -o /data/olmoe-random.q8_0.gguf --llama-server ~/llama.cpp/build/bin/llama-server
    python benchmarks/moe.py -o /tmp/tiny-moe.gguf --layers 2 --hidden 64 --heads 4 --intermediate 64 \\
        --experts 8 --top-k 2 --batch 1 2 --output-len 8                           # a seconds-long check

Decode tok/s: the batch's requests sent at once with N and with 1 output token (ignore_eos), rate =
batch x (N - 1) / (t_N - t_1), so prefill and HTTP overhead cancel. Bytes per step: attention and
router weights, the LM head, and the experts a step touches: with top-k of E experts routed
uniformly (random weights), a batch of b tokens touches E x (1 - (1 - k/E)^b) experts per layer;
the roofline is the memory bandwidth (measured here by a 1 GiB copy) over those bytes, times b.
Random weights: outputs are noise; only the speed means anything. Figures go to docs/benchmarks.md.
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class MoeShape:
    """OLMoE-1B-7B's config.json (allenai/OLMoE-1B-7B-0924) by default."""

    layers: int = 16
    hidden: int = 2048
    heads: int = 16
    intermediate: int = 1024  # of one expert
    experts: int = 64
    top_k: int = 8
    vocab: int = 50304
    context: int = 4096
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5

    def tensors(self) -> list[tuple[str, tuple[int, ...], bool]]:
        """(GGUF name, numpy shape, quantized) in llama.cpp's olmoe order."""
        h, i, e = self.hidden, self.intermediate, self.experts
        out = [("token_embd.weight", (self.vocab, h), True)]
        for n in range(self.layers):
            b = f"blk.{n}."
            out += [
                (b + "attn_norm.weight", (h,), False),
                (b + "attn_q.weight", (h, h), True),
                (b + "attn_k.weight", (h, h), True),
                (b + "attn_v.weight", (h, h), True),
                (b + "attn_output.weight", (h, h), True),
                (b + "attn_q_norm.weight", (h,), False),
                (b + "attn_k_norm.weight", (h,), False),
                (b + "ffn_norm.weight", (h,), False),
                (b + "ffn_gate_inp.weight", (e, h), False),
                (b + "ffn_gate_exps.weight", (e, i, h), True),
                (b + "ffn_up_exps.weight", (e, i, h), True),
                (b + "ffn_down_exps.weight", (e, h, i), True),
            ]
        return out + [("output_norm.weight", (h,), False), ("output.weight", (self.vocab, h), True)]


def _nbytes(shape: tuple[int, ...], qtype) -> int:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return math.prod(shape) // block * size


def write_gguf(path: str, s: MoeShape, type_name: str, seed: int = 0, std: float = 0.02) -> None:
    """The olmoe file tensor by tensor (experts as 3-D ffn_*_exps), SmolLM2's tokenizer padded to
    vocab."""
    import gguf

    from benchmarks.make_random_gguf import TensorPlan, _copy_tokenizer, _random_tensor
    from radixlm.model.loader import default_model_path

    T = gguf.GGMLQuantizationType
    qtype = {"q8_0": T.Q8_0, "q4_0": T.Q4_0, "f16": T.F16}[type_name]
    w = gguf.GGUFWriter(path, "olmoe")
    w.add_name("random-olmoe-shape")
    for add, v in (
        (w.add_context_length, s.context),
        (w.add_embedding_length, s.hidden),
        (w.add_block_count, s.layers),
        (w.add_feed_forward_length, s.intermediate),
        (w.add_head_count, s.heads),
        (w.add_head_count_kv, s.heads),
        (w.add_rope_dimension_count, s.hidden // s.heads),
        (w.add_rope_freq_base, s.rope_theta),
        (w.add_layer_norm_rms_eps, s.rms_eps),
        (w.add_vocab_size, s.vocab),
        (w.add_expert_count, s.experts),
        (w.add_expert_used_count, s.top_k),
    ):
        add(v)
    _copy_tokenizer(w, default_model_path(), s.vocab)
    plan = [(n, shape, qtype if q else T.F32) for n, shape, q in s.tensors()]
    for n, shape, t in plan:
        w.add_tensor_info(
            n, shape, np.float16 if t == T.F16 else np.float32, _nbytes(shape, t), raw_dtype=t
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for i, (n, shape, t) in enumerate(plan):
        rows = math.prod(shape[:-1])
        flat = TensorPlan(n, (rows, shape[-1]) if len(shape) > 1 else shape, t)
        rng = np.random.default_rng([seed, i])
        if t == T.F32 and len(shape) == 2:  # the router: float, as llama.cpp keeps it
            data = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
        else:
            data = _random_tensor(flat, rng, std)
        w.write_tensor_data(data.reshape(*shape[:-1], -1) if len(shape) > 1 else data)
    w.close()


def step_bytes(s: MoeShape, batch: int, bytes_per_value: float) -> dict:
    """Weight bytes one decode step of `batch` tokens reads (KV reads left out: short contexts)."""
    h, e, k = s.hidden, s.experts, s.top_k
    touched = e * (1 - (1 - k / e) ** batch)
    attn = 4 * h * h * bytes_per_value
    experts = touched * 3 * h * s.intermediate * bytes_per_value
    router = e * h * 4
    head = s.vocab * h * bytes_per_value
    total = s.layers * (attn + experts + router) + head
    active = s.layers * (attn + k * 3 * h * s.intermediate * bytes_per_value + router) + head
    return {
        "experts_touched_per_layer": round(touched, 1),
        "bytes_per_step": int(total),
        "active_bytes_per_token": int(active),
    }


def memory_bandwidth(gib: float = 1.0) -> float:
    """Bytes per second of a large copy (read + write), the roofline's bandwidth."""
    a = np.ones(int(gib * (1 << 30)) // 8)
    b = np.empty_like(a)
    np.copyto(b, a)
    t0 = time.perf_counter()
    np.copyto(b, a)
    return 2 * a.nbytes / (time.perf_counter() - t0)


def decode_rate(url: str, batch: int, output_len: int, prompt=None) -> float | None:
    """prompt(i): request i's prompt (text, or token ids; default a short text)."""
    import requests

    prompt = prompt or (lambda i: f"Request {i}: a story about the number {i}.")

    def run(n: int) -> float:
        def one(i: int):
            r = requests.post(
                url + "/v1/completions",
                timeout=3600,
                json={
                    "model": "default",
                    "prompt": prompt(i),
                    "max_tokens": n,
                    "temperature": 0,
                    "ignore_eos": True,
                },
            )
            r.raise_for_status()

        t0 = time.perf_counter()
        with ThreadPoolExecutor(batch) as pool:
            list(pool.map(one, range(batch)))
        return time.perf_counter() - t0

    run(2)  # warm-up
    t1, tn = run(1), run(output_len)
    return batch * (output_len - 1) / (tn - t1) if tn > t1 else None  # None: too short to tell


def measure(name: str, server, batches: list[int], output_len: int, prompt=None) -> dict:
    try:
        return {
            b: (lambda r: None if r is None else round(r, 2))(
                decode_rate(server.url, b, output_len, prompt)
            )
            for b in batches
        }
    finally:
        server.stop()
        print(f"   {name} done", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    d = MoeShape()
    p.add_argument("-o", "--output", required=True, help="the GGUF (written when missing)")
    for f in ("layers", "hidden", "heads", "intermediate", "experts", "top_k", "vocab"):
        p.add_argument(f"--{f.replace('_', '-')}", type=int, default=getattr(d, f))
    p.add_argument("--type", default="q8_0", choices=["q8_0", "q4_0", "f16"])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument(
        "--llama-server", default=None, help="llama-server binary: the same GGUF side by side"
    )
    args = p.parse_args(argv)
    s = MoeShape(
        **{
            f: getattr(args, f)
            for f in ("layers", "hidden", "heads", "intermediate", "experts", "top_k", "vocab")
        }
    )
    if not os.path.exists(args.output):
        print(f"writing {args.output} ...", flush=True)
        write_gguf(args.output, s, args.type)
    from radixlm.server.process import ServerProcess

    bpv = {"q8_0": 34 / 32, "q4_0": 18 / 32, "f16": 2.0}[args.type]
    bw = memory_bandwidth()
    result = {
        "shape": asdict(s),
        "type": args.type,
        "file_bytes": os.path.getsize(args.output),
        "memory_bandwidth_gbs": round(bw / 1e9, 1),
        "output_len": args.output_len,
        "steps": {},
    }
    for b in args.batch:
        sb = step_bytes(s, b, bpv)
        sb["roofline_tok_s"] = round(b * bw / sb["bytes_per_step"], 2)
        result["steps"][b] = sb
    slots = str(max(args.batch))
    radixlm = ServerProcess(
        "--model-path",
        args.output,
        "--num-threads",
        str(args.threads),
        "--max-running-requests",
        slots,
        timeout=1800,
    )
    result["radixlm_tok_s"] = measure("radixlm", radixlm, args.batch, args.output_len)
    if args.llama_server:
        ctx = str(max(args.batch) * (args.output_len + 64))
        server = ServerProcess(
            command=lambda port: [
                args.llama_server,
                "-m",
                args.output,
                "-np",
                slots,
                "-c",
                ctx,
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
        result["llama_server_tok_s"] = measure("llama-server", server, args.batch, args.output_len)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
