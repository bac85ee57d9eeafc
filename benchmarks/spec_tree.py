"""Tree vs chain drafts from the radix cache, and no speculation, on the speculative benchmark's
recurring-prompt workload (radixlm/bench/spec_datasets.py: agent calls sent again and again), one
stream at a time: output tok/s, the speedup over no speculation and the mean accepted length.

    python benchmarks/spec_tree.py [--model F.gguf] [--temperature 0.7] [--repeats 8] [--output-len 64]

One `radixlm serve` per configuration, one after another on this machine (run it alone: every
figure is a single-stream rate):

    off     no speculation
    chain   --speculative-algorithm radix --speculative-eagle-topk 1   (the most taken branch only)
    tree    --speculative-algorithm radix --speculative-eagle-topk 4   (up to 4 branches per node)

At temperature 0 a repeated call gets its earlier answer again: the tree under its prompt is one
chain and tree equals chain. Above 0 each repeat samples another answer, the radix tree records
them all as branches, and the tree drafts several of them at once. The mean accepted length is the
server's (`spec_accept_length`: tokens per drafted request per verify step, the model's own token
included); `spec_tree_drafts` / `spec_branch_accepted` count the drafts that branched and the
accepted tokens that were not their parent's first choice.
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

import requests

from radixlm.bench import serving
from radixlm.model.loader import default_model_path
from radixlm.server.process import ServerProcess

CONFIGS = {
    "off": [],
    "chain": ["--speculative-algorithm", "radix", "--speculative-eagle-topk", "1"],
    "tree": ["--speculative-algorithm", "radix", "--speculative-eagle-topk", "4"],
}


def bench_args(url: str, gguf: str, a: argparse.Namespace) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    serving.add_args(p)
    return p.parse_args(
        [
            "--backend",
            "openai",
            "--base-url",
            url,
            "--tokenizer",
            gguf,
            "--disable-tqdm",
            "--dataset",
            "recurring",
            "--recurring-num-prompts",
            str(a.num_prompts),
            "--recurring-repeats",
            str(a.repeats),
            "--recurring-output-len",
            str(a.output_len),
            "--max-concurrency",
            "1",
            "--no-ignore-eos",
            "--temperature",
            str(a.temperature),
            "--seed",
            str(a.seed),
        ]
    )


def run_config(name: str, gguf: str, a: argparse.Namespace) -> dict:
    server = ServerProcess(
        "--model-path", gguf, *CONFIGS[name], *shlex.split(a.server_args), timeout=900
    )
    try:
        res = serving.run(bench_args(server.url, gguf, a))
        state = requests.get(server.url + "/get_server_info", timeout=30).json()["internal_state"]
    finally:
        server.stop()
    res.pop("outputs", None)
    res["spec"] = {k: v for k, v in state.items() if k.startswith("spec_")}
    return res


def table(results: dict) -> str:
    off = results.get("off", {}).get("output_throughput")
    keys = (
        "spec_accept_length",
        "spec_verify_steps",
        "spec_draft_tokens",
        "spec_accepted_tokens",
        "spec_tree_drafts",
        "spec_branch_accepted",
    )
    lines = [
        (
            "| drafts | out tok/s | vs off | mean accepted length | verify steps | drafted tokens |"
            " accepted tokens | tree drafts | branch tokens accepted | errors |"
        ),
        "|---" * 10 + "|",
    ]
    for name, r in results.items():
        tps = r["output_throughput"]
        cells = [name, f"{tps:.1f}", f"{tps / off:.2f}x" if off else "-"]
        cells += [str(r["spec"].get(k, "-")) for k in keys] + [str(r["errors"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", help="the GGUF to serve (default: the embedded SmolLM2-135M)")
    p.add_argument("--configs", default="off,chain,tree")
    p.add_argument("--num-prompts", type=int, default=8, help="distinct recurring calls")
    p.add_argument("--repeats", type=int, default=8, help="times each call is sent (shuffled)")
    p.add_argument(
        "--output-len", type=int, default=64, help="max tokens of an answer (answers end at EOS)"
    )
    p.add_argument(
        "--temperature", type=float, default=0.7, help="0: greedy (repeats give the same answer)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--server-args", default="", help="extra `radixlm serve` flags for every configuration"
    )
    p.add_argument("--output", default=None, help="write the results as JSON")
    a = p.parse_args()
    gguf = os.path.abspath(a.model) if a.model else default_model_path()
    results = {}
    for name in a.configs.split(","):
        print(f"== {name}: radixlm serve {shlex.join(CONFIGS[name])} {a.server_args}", flush=True)
        results[name] = run_config(name, gguf, a)
        print(
            f"   {results[name]['output_throughput']:.1f} out tok/s, {results[name]['spec']}",
            flush=True,
        )
    print(table(results))
    if a.output:
        with open(a.output, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
