"""EAGLE on the default model: train a head with `radixlm train-eagle`, then single-stream chat
(held-out prompts) with no speculation, the head's chains, the head's trees and prompt-lookup
chains: output tok/s, the speedup over no speculation and the mean accepted length.

    python benchmarks/eagle.py --head-dir /tmp/eagle-smollm2            # train (or reuse), then measure
    python benchmarks/eagle.py --head-dir D --train-num-prompts 8 --train-max-new-tokens 32 \\
        --train-epochs 0.2 --num-prompts 2 --max-tokens 32                # a smoke run (minutes)

1. Training (skipped when D holds a finished run; an unfinished one is resumed): `radixlm
   train-eagle --output D` with --train-* (the target answers the package's chat prompts, greedy;
   the head learns from those answers). Its time and data come from D/training.json.
2. One `radixlm serve` per configuration, one after another (run it alone: every figure is a
   single-stream rate), each sent the same --num-prompts chat prompts the head never saw, one at a
   time through /v1/chat/completions (temperature 0, up to --max-tokens, answers end at EOS):

    off          no speculation
    eagle-chain  --speculative-algorithm eagle (D, its token map) --speculative-eagle-topk 1
    eagle-tree   the same with --speculative-eagle-topk 4
    ngram-chain  --speculative-algorithm ngram --speculative-eagle-topk 1 (prompt lookup)

tok/s is completion tokens over the wall time of the requests (prefill included); the mean accepted
length is the server's spec_accept_length (tokens per drafted request per verify step, the
target's own token included). The drafts never change an answer: the script checks that every
configuration returns the same text.
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

import requests

from radixlm.model.loader import default_model_path
from radixlm.server.process import ServerProcess
from radixlm.speculative.eagle_prompts import default_prompts


def configs(head: str) -> dict[str, list[str]]:
    eagle = [
        "--speculative-algorithm",
        "eagle",
        "--speculative-draft-model-path",
        head,
        "--speculative-token-map",
        os.path.join(head, "token_map.pt"),
    ]
    return {
        "off": [],
        "eagle-chain": eagle + ["--speculative-eagle-topk", "1"],
        "eagle-tree": eagle + ["--speculative-eagle-topk", "4"],
        "ngram-chain": ["--speculative-algorithm", "ngram", "--speculative-eagle-topk", "1"],
    }


def train(a: argparse.Namespace, gguf: str) -> dict:
    report = os.path.join(a.head_dir, "training.json")
    if os.path.exists(report):
        done = json.load(open(report))
        if done["step"] == done["total_steps"] and not a.retrain:
            print(f"== training: reusing the head in {a.head_dir}", flush=True)
            return done
    cmd = [
        sys.executable,
        "-m",
        "radixlm.cli",
        "train-eagle",
        "--model-path",
        gguf,
        "--output",
        a.head_dir,
        "--num-prompts",
        str(a.train_num_prompts),
        "--max-new-tokens",
        str(a.train_max_new_tokens),
        "--epochs",
        str(a.train_epochs),
        *shlex.split(a.train_args),
    ]
    if os.path.exists(os.path.join(a.head_dir, "checkpoint.pt")):
        cmd.append("--resume")
    print("== training:", shlex.join(cmd), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    done = json.load(open(report))
    done["wall_seconds"] = time.perf_counter() - t0
    return done


def run_config(
    name: str, args: list[str], gguf: str, prompts: list[str], a: argparse.Namespace
) -> dict:
    server = ServerProcess("--model-path", gguf, *args, *shlex.split(a.server_args), timeout=900)
    try:

        def chat(text: str, max_tokens: int) -> dict:
            r = requests.post(
                server.url + "/v1/chat/completions",
                timeout=3600,
                json={
                    "model": "default",
                    "messages": [{"role": "user", "content": text}],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                },
            )
            r.raise_for_status()
            return r.json()

        chat("Say hello.", 8)  # warm-up, not measured
        requests.post(server.url + "/flush_cache", timeout=60)
        texts, tokens, seconds = [], 0, 0.0
        for p in prompts:
            t0 = time.perf_counter()
            out = chat(p, a.max_tokens)
            seconds += time.perf_counter() - t0
            tokens += out["usage"]["completion_tokens"]
            texts.append(out["choices"][0]["message"]["content"])
        state = requests.get(server.url + "/get_server_info", timeout=30).json()["internal_state"]
    finally:
        server.stop()
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tok_s": tokens / seconds,
        "texts": texts,
        "spec": {k: v for k, v in state.items() if k.startswith("spec_")},
    }


def table(results: dict, training: dict) -> str:
    off = results.get("off", {}).get("tok_s")
    lines = [
        (
            "| drafts | tok/s | vs off | mean accepted length | verify steps | drafted / accepted"
            " tokens |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        s, ratio = r["spec"], (f"{r['tok_s'] / off:.2f}x" if off else "-")
        lines.append(
            f"| {name} | {r['tok_s']:.1f} | {ratio} | "
            f"{s.get('spec_accept_length', '-')} | {s.get('spec_verify_steps', '-')} | "
            f"{s.get('spec_draft_tokens', '-')} / {s.get('spec_accepted_tokens', '-')} |"
        )
    t = training
    lines.append("")
    lines.append(
        f"head: {t.get('train_samples')} answers, {t.get('train_positions')} training positions,"
        f" {t.get('step')} steps; answering {t.get('data_seconds', 0):.0f} s, training"
        f" {t.get('seconds', 0):.0f} s; held-out top-1 agreement"
        f" {t.get('accuracy', float('nan')):.3f}"
    )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model", help="the GGUF to serve and train for (default: the embedded SmolLM2-135M)"
    )
    p.add_argument(
        "--head-dir", required=True, help="where train-eagle writes (and later runs find) the head"
    )
    p.add_argument(
        "--retrain",
        action="store_true",
        help="train again even if --head-dir holds a finished head",
    )
    p.add_argument("--train-num-prompts", type=int, default=800)
    p.add_argument("--train-max-new-tokens", type=int, default=256)
    p.add_argument("--train-epochs", type=float, default=3.0)
    p.add_argument("--train-args", default="", help="more `radixlm train-eagle` flags")
    p.add_argument("--configs", default="off,eagle-chain,eagle-tree,ngram-chain")
    p.add_argument(
        "--num-prompts", type=int, default=16, help="held-out chat prompts, sent one at a time"
    )
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument(
        "--server-args", default="", help="extra `radixlm serve` flags for every configuration"
    )
    p.add_argument("--output", default=None, help="write the results as JSON")
    a = p.parse_args()
    gguf = os.path.abspath(a.model) if a.model else default_model_path()
    training = train(a, gguf)
    # Prompts the head never saw: the package's pool past the ones it was trained on.
    prompts = default_prompts(a.num_prompts, seed=0, skip=a.train_num_prompts)
    results = {}
    for name in a.configs.split(","):
        args = configs(a.head_dir)[name]
        print(f"== {name}: radixlm serve {shlex.join(args)} {a.server_args}", flush=True)
        results[name] = run_config(name, args, gguf, prompts, a)
        print(f"   {results[name]['tok_s']:.1f} tok/s, {results[name]['spec']}", flush=True)
    same = {
        name: r["texts"] == next(iter(results.values()))["texts"] for name, r in results.items()
    }
    print(table(results, training))
    print("same answers as", next(iter(results)), ":", same)
    if a.output:
        with open(a.output, "w") as f:
            json.dump(
                {"training": training, "results": results, "same_answers": same},
                f,
                indent=1,
                default=str,
            )
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
