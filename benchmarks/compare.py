"""radixlm vs radixlm without its radix cache vs llama.cpp's llama-server, on the same GGUF and the
same workloads, one system at a time on an otherwise idle machine (DEVELOPERS.md: build
llama-server from the llama.cpp source in the llama-cpp-python sdist, outside this repo).
Optionally (--offline) radixlm's in-process Engine vs HF transformers `generate`.

    python benchmarks/compare.py --llama-server /path/to/llama-server [--model F.gguf] [--scale
    0.25] [--write-docs]

--model: the GGUF every system serves (default: the embedded SmolLM2-135M), e.g. a random-weight
file of a real model's shape from benchmarks/make_random_gguf.py.

Every system gets the same client (`radixlm bench serving --backend openai`, /v1/completions,
streaming, temperature 0, ignore_eos) and the same prompts (same seed); the `chat` workload sends
token ids through each server's own API (`--backend radixlm` / `llama-cpp`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import sys
import time
from datetime import datetime
from pathlib import Path

from radixlm.bench import serving
from radixlm.bench.rooflines import gguf_step_costs
from radixlm.model.loader import default_model_path
from radixlm.server.process import ServerProcess

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class Workload:
    name: str
    args: dict  # `radixlm bench serving` options
    target: str  # what the issue asks of it
    metric: str = "output_throughput"  # the figure the ratio compares (higher is better)
    native: bool = False  # each server's own API (token ids in and out) instead of the OpenAI one


def workloads(scale: float) -> list[Workload]:
    n = lambda x: max(1, round(x * scale))
    return [
        Workload(
            "gsp",
            dict(
                dataset="gsp",
                gsp_num_groups=16,
                gsp_prompts_per_group=n(16),
                gsp_system_prompt_len=1024,
                gsp_question_len=32,
                gsp_output_len=64,
                max_concurrency=32,
            ),
            ">= 3x llama-server, >= 2x radixlm without cache",
        ),
        Workload(
            "multi-turn",
            dict(dataset="multi-turn", num_conversations=8, num_turns=n(4), max_concurrency=8),
            ">= 1.5x llama-server",
        ),
        # A chat app: one 256-token system prompt, then turns of 64 new tokens and 64 answered,
        # sent as token ids so that each turn continues on the answer's own tokens (a real
        # model's answers re-tokenize to them; a random model's text does not).
        Workload(
            "chat",
            dict(
                dataset="multi-turn",
                num_conversations=8,
                num_turns=n(4),
                multi_turn_system_len=256,
                multi_turn_token_ids=True,
                max_concurrency=8,
            ),
            ">= 1.5x llama-server, >= 80% of prompt tokens cached",
            native=True,
        ),
        Workload(
            "random",
            dict(
                dataset="random",
                num_prompts=n(64),
                random_input_len=200,
                random_output_len=64,
                max_concurrency=8,
            ),
            ">= 1.5x llama-server",
        ),
        # One person chatting: one request at a time, the decode step's latency is everything.
        Workload(
            "single-stream",
            dict(
                dataset="random",
                num_prompts=n(8),
                random_input_len=128,
                random_output_len=128,
                random_range_ratio=1.0,
                max_concurrency=1,
            ),
            ">= 1.2x llama-server",
        ),
        # Prefill of one prompt at a time (1 output token): input tokens per second. 512 tokens
        # is a chat turn; 4,096 and 16,384 an agent's first turn (tools, instructions, files).
        *(
            Workload(
                f"prefill-{length}",
                dict(
                    dataset="random",
                    num_prompts=n(count),
                    random_input_len=length,
                    random_output_len=1,
                    random_range_ratio=1.0,
                    max_concurrency=1,
                ),
                target,
                metric="input_throughput",
            )
            for length, count, target in (
                (512, 8, ">= 1.5x llama-server"),
                (4096, 4, ">= 1.3x llama-server"),
                (16384, 2, "TTFT and input tok/s against llama-server"),
            )
        ),
    ]


def slot_context(loads: list[Workload]) -> int:
    """Tokens each of llama-server's 8 slots must hold: a gsp prompt (1,120 tokens) with margin,
    or the longest prompt of the workloads plus its output."""
    need = max(
        (w.args.get("random_input_len", 0) + w.args.get("random_output_len", 0) for w in loads),
        default=0,
    )
    return max(2048, need + 64)


# Each system's own API, for the workloads that send token ids (Workload.native).
NATIVE_BACKENDS = {"radixlm": "radixlm", "radixlm-no-cache": "radixlm", "llama-server": "llama-cpp"}


def bench_args(
    base_url: str, extra: dict, gguf: str, backend: str = "openai"
) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    serving.add_args(p)
    # The served file's tokenizer builds the prompts and counts tokens.
    args = p.parse_args(
        ["--backend", backend, "--base-url", base_url, "--disable-tqdm", "--tokenizer", gguf]
    )
    for k, v in extra.items():
        setattr(args, k, v)
    return args


def llama_server(binary: str, gguf: str, threads: int, per_slot: int = 2048) -> ServerProcess:
    # 8 slots (-c is split between them), each holding per_slot tokens (slot_context).
    return ServerProcess(
        command=lambda port: [
            binary,
            "-m",
            gguf,
            "-np",
            "8",
            "-c",
            str(8 * per_slot),
            "-t",
            str(threads),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-webui",
        ],
        name="llama-server",
        timeout=900,
    )


def run_system(name: str, start, loads: list[Workload], tokenizer: str) -> dict:
    """tokenizer: what builds the prompts and counts tokens (the served file's, or --tokenizer)."""
    server = start()
    results = {}
    try:
        for w in loads:
            print(f"== {name} / {w.name}", flush=True)
            backend = NATIVE_BACKENDS[name] if w.native else "openai"
            res = serving.run(bench_args(server.url, w.args, tokenizer, backend))
            res.pop("outputs", None)
            results[w.name] = res
            print(
                f"   output {res['output_throughput']:.1f} tok/s, TTFT p50 {res['p50_ttft_ms']:.0f}"
                f" ms, cached {res['cached_token_share']}, errors {res['errors']}",
                flush=True,
            )
    finally:
        server.stop()
    return results


def offline_compare(path: str, num: int, input_len: int, output_len: int) -> dict:
    """Greedy generation of the same token prompts, all at once: radixlm Engine vs HF generate."""
    import random

    import torch

    from radixlm.engine.engine import Engine
    from radixlm.model.loader import load_model_config

    rng = random.Random(0)
    top = min(
        49152, load_model_config(path).vocab_size
    )  # SmolLM2's vocab, also the random files' real tokens
    prompts = [[rng.randrange(256, top) for _ in range(input_len)] for _ in range(num)]
    sp = {"max_new_tokens": output_len, "temperature": 0, "ignore_eos": True}
    with Engine(path, log_level="warning") as engine:
        engine.generate(input_ids=prompts[0][:16], sampling_params={"max_new_tokens": 2})
        t = time.perf_counter()
        engine.generate(input_ids=prompts, sampling_params=sp)
        radixlm_s = time.perf_counter() - t
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), torch_dtype=torch.float32
    ).eval()
    ids = torch.tensor(prompts)
    with torch.inference_mode():
        model.generate(ids[:1, :16], max_new_tokens=2, do_sample=False)
        t = time.perf_counter()
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=output_len,
            min_new_tokens=output_len,
            do_sample=False,
        )
        hf_s = time.perf_counter() - t
    total = num * output_len
    return {
        "prompts": num,
        "input_len": input_len,
        "output_len": output_len,
        "radixlm_tok_s": total / radixlm_s,
        "hf_tok_s": total / hf_s,
        "radixlm_s": radixlm_s,
        "hf_s": hf_s,
    }


def table(results: dict, loads: list[Workload]) -> str:
    systems = list(results)
    lines = [
        "| workload | figure | "
        + " | ".join(systems)
        + " | radixlm / llama-server | radixlm / no cache | target |",
        "|---" * (len(systems) + 5) + "|",
    ]
    for w in loads:
        tps = {s: results[s][w.name][w.metric] for s in systems if w.name in results[s]}
        r = tps.get("radixlm")
        ratio = lambda other: f"{r / tps[other]:.2f}x" if r and tps.get(other) else "-"
        figure = "in tok/s" if w.metric == "input_throughput" else "out tok/s"
        lines.append(
            f"| {w.name} | {figure} | "
            + " | ".join(f"{tps.get(s, float('nan')):.1f}" for s in systems)
            + f" | {ratio('llama-server')} | {ratio('radixlm-no-cache')} | {w.target} |"
        )
    lines.append("")
    lines.append(
        "| workload | system | TTFT p50 / p99 ms | TPOT p50 ms | ITL p50 / p99 ms | cached share |"
        " errors |"
    )
    lines.append("|---|---|---|---|---|---|---|")
    for w in loads:
        for s in systems:
            m = results[s].get(w.name)
            if m is None:
                continue
            cs = "n/a" if m["cached_token_share"] is None else f"{m['cached_token_share']:.0%}"
            # One-token outputs (prefill-512) have no TPOT or ITL.
            f = lambda key, spec: "n/a" if m.get(key) is None else format(m[key], spec)
            lines.append(
                f"| {w.name} | {s} | {f('p50_ttft_ms', '.0f')} / {f('p99_ttft_ms', '.0f')} |"
                f" {f('p50_tpot_ms', '.1f')} | {f('p50_itl_ms', '.1f')} / {f('p99_itl_ms', '.1f')}"
                f" | {cs} | {m['errors']} |"
            )
    return "\n".join(lines)


def machine_limits(threads: int) -> dict:
    """`radixlm bench limits` in this (otherwise idle) process: the fresh-buffer read rate and the
    integer peak of the level the kernels run (RADIXLM_KERNEL_ISA=avx2 holds it to AVX2's)."""
    from radixlm.bench import limits

    lim = limits.measure(threads)
    int8 = {k: v for k, v in lim.peaks.items() if k.startswith("int8")}
    if os.environ.get("RADIXLM_KERNEL_ISA") == "avx2":
        int8 = {k: v for k, v in int8.items() if k == "int8_avx2"}
    kind, peak = max(int8.items(), key=lambda kv: kv[1])
    print(f"   limits: read {lim.read_gbps:.1f} GB/s, {kind} {peak / 1e12:.3f} TOPS", flush=True)
    return {"cpu": lim.cpu, "read_gbps": lim.read_gbps, "int8_kind": kind, "int8_ops": peak}


def limits_table(results: dict, loads: list[Workload], around: dict, gguf: str) -> str:
    """Each system's single-stream decode as a share of the read rate (the file's bytes a step
    reads / TPOT p50) and each prefill as a share of the integer peak, against the mean of the
    readings taken just before and just after that system ran."""
    costs = gguf_step_costs(gguf)
    lines = [
        f"Against the machine's limits ({around[next(iter(around))][0]['cpu']}; a decode step"
        f" reads {costs.decode_bytes / 1e6:.0f} MB, a prompt token costs"
        f" {costs.prefill_ops / 1e9:.2f} G integer ops):",
        "",
        "| system | read GB/s (before / after) | int8 peak TOPS (before / after) | workload |"
        " achieved | share of the limit |",
        "|---|---|---|---|---|---|",
    ]
    for system, (before, after) in around.items():
        read = (before["read_gbps"] + after["read_gbps"]) / 2
        peak = (before["int8_ops"] + after["int8_ops"]) / 2
        head = (
            f"| {system} | {before['read_gbps']:.1f} / {after['read_gbps']:.1f} |"
            f" {before['int8_ops'] / 1e12:.3f} / {after['int8_ops'] / 1e12:.3f} |"
        )
        for w in loads:
            m = results[system].get(w.name)
            if not m:
                continue
            if w.name == "single-stream" and m.get("p50_tpot_ms"):
                gbps = costs.decode_bytes / (m["p50_tpot_ms"] / 1e3) / 1e9
                lines.append(f"{head} {w.name} | {gbps:.1f} GB/s | {gbps / read:.0%} |")
            elif w.metric == "input_throughput":
                ops = (
                    m["input_throughput"] * costs.prefill_ops
                    + m["request_throughput"] * costs.head_ops
                )
                lines.append(f"{head} {w.name} | {ops / 1e12:.3f} TOPS | {ops / peak:.0%} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--llama-server", help="path to a llama-server binary (omit to skip it)")
    p.add_argument(
        "--model", help="the GGUF every system serves (default: the embedded SmolLM2-135M)"
    )
    p.add_argument("--systems", default="radixlm,radixlm-no-cache,llama-server")
    p.add_argument("--workloads", default="gsp,multi-turn,chat,random,single-stream,prefill-512")
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="shrink the request counts (1.0: the issue's sizes)",
    )
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="llama-server -t")
    p.add_argument(
        "--radixlm-args", default="", help="extra `radixlm serve` flags for both radixlm systems"
    )
    p.add_argument(
        "--offline", action="store_true", help="also radixlm Engine vs HF transformers generate"
    )
    p.add_argument(
        "--limits",
        action="store_true",
        help="measure the machine's read rate and integer peak (`radixlm bench limits`) before"
        " the first system and after each, and hold each system's single-stream TPOT and"
        " prefills against the readings around it",
    )
    p.add_argument(
        "--tokenizer",
        help="the client's tokenizer (a GGUF or HF directory; default: the served file's), for a"
        " random file whose vocabulary transformers cannot read under its architecture (give"
        " radixlm the same with --radixlm-args '--tokenizer-path ...')",
    )
    p.add_argument("--output", default=None, help="write all results as JSON")
    p.add_argument(
        "--write-docs", action="store_true", help="append the tables to docs/benchmarks.md"
    )
    a = p.parse_args()
    gguf = os.path.abspath(a.model) if a.model else default_model_path()
    loads = [w for w in workloads(a.scale) if w.name in a.workloads.split(",")]
    extra = shlex.split(a.radixlm_args)
    starters = {
        # Big files load for minutes: the timeouts only bound a server that never comes up.
        "radixlm": lambda: ServerProcess("--model-path", gguf, *extra, timeout=900),
        "radixlm-no-cache": lambda: ServerProcess(
            "--model-path", gguf, "--disable-radix-cache", *extra, timeout=900
        ),
        "llama-server": lambda: llama_server(a.llama_server, gguf, a.threads, slot_context(loads)),
    }
    results = {}
    readings = [machine_limits(a.threads)] if a.limits else []
    around = {}
    for name in a.systems.split(","):
        if name == "llama-server" and not a.llama_server:
            print("skipping llama-server (no --llama-server)")
            continue
        results[name] = run_system(name, starters[name], loads, a.tokenizer or gguf)
        if a.limits:
            readings.append(machine_limits(a.threads))
            around[name] = readings[-2:]
    md = table(results, loads)
    if around:
        md += "\n\n" + limits_table(results, loads, around, gguf)
    offline = offline_compare(gguf, 16, 200, 64) if a.offline else None
    if offline:
        md += (
            f"\n\nOffline, {offline['prompts']} prompts x {offline['input_len']} tokens,"
            f" {offline['output_len']} out each, all at once, greedy: radixlm Engine"
            f" {offline['radixlm_tok_s']:.1f} out tok/s, HF transformers generate"
            f" {offline['hf_tok_s']:.1f} out tok/s"
            f" ({offline['radixlm_tok_s'] / offline['hf_tok_s']:.2f}x)."
        )
    print(md)
    if a.output:
        Path(a.output).write_text(
            json.dumps(
                {"results": results, "offline": offline, "limits": readings},
                indent=1,
                default=str,
            )
        )
    if a.write_docs:
        cmd = "python benchmarks/compare.py " + shlex.join(sys.argv[1:])
        with open(ROOT / "docs" / "benchmarks.md", "a") as f:
            f.write(
                f"\n## radixlm vs llama-server ({datetime.now():%Y-%m-%d %H:%M},"
                f" {platform.processor() or 'cpu'}, {os.cpu_count()} cores,"
                f" {os.path.basename(gguf)})\n\n`{cmd}`\n\n{md}\n"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
