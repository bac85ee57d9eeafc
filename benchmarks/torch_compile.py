"""Eager vs --enable-torch-compile decode steps on the ModelRunner (`radixlm bench one-batch`'s
loop: a prefill, then greedy decode steps), the two runners alternated, medians over the repeats;
and what the compile cost at start-up.

    python benchmarks/torch_compile.py --quantization none --batch-size 1 8 --repeats 5
    python benchmarks/torch_compile.py --batch-size 1 8 --force              # the default GGUF, fused op compiled
    python benchmarks/torch_compile.py --batch-size 1 8 --unfused            # GGUF, the Python layers

--force compiles where radixlm declines to (the native fused decoder op runs the layers);
--unfused runs the Python layers instead of that op in both runners (what a model the op does not
cover runs, e.g. Qwen3's q/k norms); --freezing sets inductor's weight freezing (SGLang sets it).
A fresh TORCHINDUCTOR_CACHE_DIR makes the compile cold (the default cache survives runs).
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model-path", default=None, help="default: the embedded SmolLM2-135M Q4_1 GGUF"
    )
    p.add_argument(
        "--quantization", default=None, help="none: the float path (dequantized to float32)"
    )
    p.add_argument("--batch-size", type=int, nargs="+", default=[1, 8])
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--force", action="store_true", help="compile where radixlm declines to")
    p.add_argument(
        "--unfused", action="store_true", help="the Python layers instead of the native fused op"
    )
    p.add_argument("--freezing", action="store_true", help="torch._inductor.config.freezing = True")
    p.add_argument("--output-file", default=None, help="append the results as one JSON line")
    args = p.parse_args()

    import torch._inductor.config

    from radixlm.bench import one_batch
    from radixlm.bench.workloads import random_prompts
    from radixlm.model.executor import compiled_decode
    from radixlm.model.executor.runner import ModelRunner
    from radixlm.model.executor.runner_config import ModelRunnerConfig
    from radixlm.model.models import llama

    torch._inductor.config.freezing = args.freezing
    if args.force:
        compiled_decode.why_not_compiled = lambda runner: None
    if args.unfused:
        llama.build_fused_layers = lambda model: None
    max_bs = max(args.batch_size)
    kw = dict(
        model_path=args.model_path,
        quantization=args.quantization,
        num_threads=args.num_threads,
        max_total_tokens=max_bs * (args.input_len + args.output_len) + 64,
        max_running_requests=max_bs,
    )
    eager = ModelRunner(ModelRunnerConfig(**kw))
    compiled = ModelRunner(
        ModelRunnerConfig(**kw, enable_torch_compile=True, torch_compile_max_bs=max_bs)
    )
    info = compiled.decode_graphs.info()["torch_compile"]
    print(f"compile: {json.dumps(info)}", flush=True)
    rows = []
    for bs in args.batch_size:
        prompts = [
            r.input_ids
            for r in random_prompts(bs, args.input_len, args.output_len, eager.vocab_size, seed=0)
        ]
        runs: dict[str, list[dict]] = {"eager": [], "compiled": []}
        for runner in (eager, compiled):  # warm-up
            one_batch.run_once(runner, prompts, 4)
        for _ in range(args.repeats):
            for name, runner in (("eager", eager), ("compiled", compiled)):
                runs[name].append(one_batch.run_once(runner, prompts, args.output_len))
        med = {
            name: {
                k: statistics.median(statistics.median(r[k]) for r in rs) * 1e3
                for k in ("step_s", "forward_s")
            }
            for name, rs in runs.items()
        }
        same = all(
            r["output_ids"] == runs["eager"][0]["output_ids"] for rs in runs.values() for r in rs
        )
        row = {
            "batch_size": bs,
            "eager_step_ms": med["eager"]["step_s"],
            "compiled_step_ms": med["compiled"]["step_s"],
            "eager_forward_ms": med["eager"]["forward_s"],
            "compiled_forward_ms": med["compiled"]["forward_s"],
            "same_tokens": same,
        }
        row["speedup"] = row["eager_step_ms"] / row["compiled_step_ms"]
        rows.append(row)
        print(
            f"bs {bs}: step p50 eager {row['eager_step_ms']:.2f} ms, compiled"
            f" {row['compiled_step_ms']:.2f} ms (x{row['speedup']:.3f}); forward"
            f" {row['eager_forward_ms']:.2f} / {row['compiled_forward_ms']:.2f} ms; same tokens:"
            f" {same}",
            flush=True,
        )
    if args.output_file:
        with open(args.output_file, "a") as f:
            f.write(json.dumps({"args": vars(args), "compile": info, "rows": rows}) + "\n")


if __name__ == "__main__":
    main()
