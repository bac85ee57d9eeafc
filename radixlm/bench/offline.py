"""`radixlm bench offline`: a workload through the in-process Engine, all requests at once."""

from __future__ import annotations

import argparse
import json
import json as _json
import time

from radixlm.bench.workloads import (
    PERSON_SCHEMA,
    generated_shared_prefix,
    json_person_prompts,
    random_prompts,
)
from radixlm.scheduler.config import SchedulerConfig


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workload",
        choices=["gsp", "random", "json", "json-free"],
        default="gsp",
        help=(
            "json: chat prompts constrained by a many-key JSON schema; json-free: the same prompts"
            " unconstrained"
        ),
    )
    p.add_argument("--num-groups", type=int, default=8)
    p.add_argument("--prompts-per-group", type=int, default=16)
    p.add_argument("--system-prompt-len", type=int, default=512)
    p.add_argument("--question-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--num-prompts", type=int, default=64, help="random workload")
    p.add_argument("--input-len", type=int, default=200, help="random workload")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-file", default=None, help="append the result as one JSON line")


def run(args, server_args) -> dict:
    from radixlm.engine.engine import Engine

    kwargs = {k: v for k, v in vars(server_args).items() if k != "model_path"}
    with Engine(server_args.model_path, **kwargs) as engine:
        vocab = engine.scheduler_info["vocab_size"]
        if args.workload == "gsp":
            reqs = generated_shared_prefix(
                args.num_groups,
                args.prompts_per_group,
                args.system_prompt_len,
                args.question_len,
                args.output_len,
                vocab,
                args.seed,
            )
        elif args.workload == "random":
            reqs = random_prompts(
                args.num_prompts, args.input_len, args.output_len, vocab, seed=args.seed
            )
        else:
            reqs = None
            texts = [
                engine.tokenizer.apply_chat_template(
                    [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
                )
                for q in json_person_prompts(args.num_prompts)
            ]
            base = {"temperature": 0.7, "max_new_tokens": args.output_len}
            if args.workload == "json":
                sps = [
                    {**base, "seed": i, "json_schema": _json.dumps(PERSON_SCHEMA)}
                    for i in range(len(texts))
                ]
            else:
                sps = [{**base, "seed": i, "ignore_eos": True} for i in range(len(texts))]
        # Warm-up on an unrelated prompt, then start from an empty cache.
        engine.generate(input_ids=[300, 301, 302], sampling_params={"max_new_tokens": 2})
        engine.flush_cache()
        t0 = time.perf_counter()
        if reqs is not None:
            outs = engine.generate(
                input_ids=[r.input_ids for r in reqs],
                sampling_params=[
                    {"max_new_tokens": r.output_len, "temperature": 0, "ignore_eos": True}
                    for r in reqs
                ],
            )
        else:
            outs = engine.generate(texts, sps)
        elapsed = time.perf_counter() - t0
        state = engine.get_internal_state()
    prompt = sum(o["meta_info"]["prompt_tokens"] for o in outs)
    cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
    gen = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return {
        "workload": args.workload,
        "jump_forward": not server_args.disable_jump_forward,
        "radix_cache": not server_args.disable_radix_cache,
        "requests": len(outs),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cache_hit_rate": cached / prompt,
        "output_tokens": gen,
        "seconds": elapsed,
        "request_throughput": len(outs) / elapsed,
        "output_throughput": gen / elapsed,
        "total_token_throughput": (prompt + gen) / elapsed,
        "forward_passes_per_output_token": (
            sum(o["meta_info"]["forward_passes"] for o in outs) / max(gen, 1)
        ),
        "jump_forward_tokens": state["jump_forward_tokens"],
        "grammar_mask_ms_per_step": state["grammar_mask_ms_per_step"],
        "overlap_schedule": SchedulerConfig.from_server_args(server_args).overlap_schedule,
        "decode_steps": state["decode_steps"],
        "decode_outside_forward": state["decode_outside_share"],
        "valid_json": _valid_json_share(outs) if args.workload == "json" else None,
    }


def _valid_json_share(outs) -> float:
    ok = 0
    for o in outs:
        try:
            doc = _json.loads(o["text"])
            ok += all(k in doc for k in PERSON_SCHEMA["required"])
        except ValueError:
            pass
    return ok / len(outs)


def print_table(res: dict) -> None:
    print(f"{'metric':<26}{'value':>14}")
    for k, v in res.items():
        print(f"{k:<26}{v:>14.3f}" if isinstance(v, float) else f"{k:<26}{str(v):>14}")


def main(args, server_args) -> int:
    res = run(args, server_args)
    print_table(res)
    if args.result_file:
        with open(args.result_file, "a") as f:
            f.write(json.dumps(res) + "\n")
    return 0
