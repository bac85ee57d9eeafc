"""Pipeline parallelism (issue 45): decode throughput at PP=1 and PP=2 with and without decode
micro-batches (the pipeline bubble), the time to first token of a long prompt under chunked prefill,
the bytes one step sends across a stage boundary, and on paper PP against TP for two nodes.

    python benchmarks/pipeline.py                                # default model, float32, PP 1 and 2
    python benchmarks/pipeline.py --model-path M --pp 1 2 3 --batch 8 --output-len 64 --ttft-len 8192
    python benchmarks/pipeline.py --paper                        # the 70B arithmetic only (no engine)

Each engine runs with --num-threads 1 per rank (PP=2 uses two cores; PP=1 one core: compare against
PP=1 at --threads-pp1 2 too). "no micro" sets --pp-max-micro-batch-size to the batch, so a decode
step goes through the stages as one group. Run it on an otherwise idle machine; the figures go to
docs/benchmarks.md.
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def boundary_bytes(tokens: int, hidden: int, dtype_bytes: int, rows: int, vocab: int) -> dict:
    """Per step and stage boundary: (hidden, residual) forward; the last stage's logits go back
    once."""
    return {"activations": 2 * tokens * hidden * dtype_bytes, "logits_back": rows * vocab * 4}


def paper(
    layers: int = 80,
    hidden: int = 8192,
    tokens: int = 64,
    link_gbps: float = 400,
    nvlink_gbs: float = 450,
):
    """70B (80 layers, hidden 8192, bf16) on 2 nodes x 8 GPUs, a decode step of `tokens` requests:
    TP=16 all-reduces twice per layer across the nodes; PP=2 x TP=8 sends one (hidden, residual)
    pair over the link and all-reduces inside each node over NVLink."""
    act = tokens * hidden * 2
    tp16_bytes = 2 * layers * act * 2 * 15 / 16  # ring all-reduce: 2 (n-1)/n of the data per rank
    pp2_link = 2 * act  # hidden + residual, once per step
    pp2_nvlink = 2 * (layers // 2) * act * 2 * 7 / 8
    link = link_gbps / 8 * 1e9
    return {
        "tp16_cross_node_bytes": tp16_bytes,
        "tp16_link_ms": tp16_bytes / link * 1e3,
        "pp2_link_bytes": pp2_link,
        "pp2_link_ms": pp2_link / link * 1e3,
        "pp2_nvlink_ms_per_stage": pp2_nvlink / (nvlink_gbs * 1e9) * 1e3,
    }


def run(model: str | None, pp: int, micro: bool, args) -> dict:
    from radixlm import Engine

    kw = dict(
        num_threads=1,
        quantization=args.quantization,
        chunked_prefill_size=args.chunk,
        log_level="warning",
    )
    if pp > 1:
        kw.update(pp_size=pp, **({} if micro else {"pp_max_micro_batch_size": args.batch}))
    elif args.threads_pp1:
        kw["num_threads"] = args.threads_pp1
    with Engine(model, **kw) as e:
        sp = {"max_new_tokens": args.output_len, "temperature": 0, "ignore_eos": True}
        prompts = [
            f"Request {i}: tell me a long story about the number {i}." for i in range(args.batch)
        ]
        e.generate(prompts[:1], dict(sp, max_new_tokens=4))  # warm-up
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.batch) as pool:
            list(pool.map(lambda p: e.generate(p, sp), prompts))
        decode = args.batch * args.output_len / (time.perf_counter() - t0)
        # token ids, so the prompt is exactly --ttft-len tokens (a text's count depends on the
        # tokenizer)
        long = [(1000 + 7 * i) % 40000 + 100 for i in range(args.ttft_len)]
        t0 = time.perf_counter()
        first = next(
            iter(
                e.generate(
                    input_ids=long,
                    sampling_params={"max_new_tokens": 1, "temperature": 0},
                    stream=True,
                )
            )
        )
        ttft = time.perf_counter() - t0
        info = e.scheduler_info
    from radixlm.model.loader import default_model_path, load_model_config

    cfg = load_model_config(model or default_model_path())
    return {
        "pp": pp,
        "micro": micro,
        "decode_tok_s": round(decode, 1),
        "ttft_s": round(ttft, 3),
        "prompt_tokens": first["meta_info"]["prompt_tokens"],
        "context_len": info["context_len"],
        "decode_step_bytes_per_boundary": boundary_bytes(
            args.batch, cfg.hidden_size, 4, args.batch, cfg.vocab_size
        ),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model-path", default=None)
    p.add_argument("--quantization", default="none")
    p.add_argument("--pp", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument(
        "--ttft-len", type=int, default=8000, help="tokens of the long prompt (the context is 8192)"
    )
    p.add_argument("--chunk", type=int, default=512, help="--chunked-prefill-size")
    p.add_argument("--threads-pp1", type=int, default=0, help="threads of the PP=1 engine (0: 1)")
    p.add_argument(
        "--paper", action="store_true", help="print the 70B PP-vs-TP arithmetic and stop"
    )
    args = p.parse_args()
    print(json.dumps({"paper_70b_2x8": paper()}, indent=1))
    if args.paper:
        return
    for pp in args.pp:
        for micro in [True, False] if pp > 1 else [False]:
            print(json.dumps(run(args.model_path, pp, micro, args)), flush=True)


if __name__ == "__main__":
    main()
