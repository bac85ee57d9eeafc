"""`radixlm bench one-batch`: one static batch straight on the ModelRunner (no scheduler, no
server), like SGLang's bench_one_batch: a prefill of batch_size x input_len random tokens,
then output_len - 1 greedy decode steps. With --shared-prefix-len P, request i's prompt is group
(i mod --num-groups)'s P-token prefix + its own input_len tokens; each prefix is computed once
first and the requests start from its KV slots, as after a radix-cache hit, so the decode runs
the shared-prefix attention path (the shape of generated-shared-prefix serving).

Each decode step is timed whole (ScheduleBatch.prepare_for_decode, the forward, sampling,
appending the tokens) and the forward alone, so "outside" = the step's Python work and
sampling. The step's linear-layer FLOPs over the forward time, against the same products run
alone (matmul_reference), say how close a decode step gets to the machine's matmul rate.
On CUDA the device is synchronized around every timed region.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics

from radixlm.bench.device_rates import DeviceTimer as _Timer
from radixlm.bench.device_rates import read_rate_gbps, tensors_read_rate_gbps
from radixlm.bench.rooflines import (
    bytes_per_step,
    compute_peak,
    linear_weights,
    matmul_reference,
    prefill_ops,
    state_step_bytes,
)
from radixlm.bench.workloads import random_prompts


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--batch-size",
        type=int,
        nargs="+",
        default=[1],
        help="one or more batch sizes, run in turn",
    )
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument(
        "--output-len",
        type=int,
        default=32,
        help="tokens per request: 1 from the prefill, the rest decoded",
    )
    p.add_argument(
        "--shared-prefix-len",
        type=int,
        default=0,
        help="tokens of a cached prefix in front of every prompt (0: none)",
    )
    p.add_argument(
        "--num-groups",
        type=int,
        default=1,
        help="distinct shared prefixes (with --shared-prefix-len)",
    )
    p.add_argument("--seed", type=int, default=0, help="of the random prompt tokens")
    p.add_argument("--output-file", default=None, help="append one JSON line per batch size")
    p.add_argument(
        "--profile",
        action="store_true",
        help="after the timed run, run each batch size again under the torch profiler",
    )
    p.add_argument(
        "--profile-dir", default="radixlm-profile", help="where --profile writes traces and tables"
    )


def sized_server_args(args, server_args):
    """The runner's pools sized for the largest batch unless the options say otherwise."""
    groups = args.num_groups if args.shared_prefix_len else 0
    need = (
        max(args.batch_size) * (args.input_len + args.output_len) + groups * args.shared_prefix_len
    )
    return dataclasses.replace(
        server_args,
        max_total_tokens=server_args.max_total_tokens or need,
        max_running_requests=max(server_args.max_running_requests, max(args.batch_size) + groups),
    )


def _forward(runner, batch, cm):
    """(forward batch, logits output) of a ScheduleBatch; the attention metadata is built in the
    runner's prepare, inside the caller's forward timing (as the model's own forward built it)."""
    fb = runner.prepare(batch.prepare(cm))
    return fb, runner.forward(fb)


def run_once(
    runner, prompts: list[list[int]], output_len: int, prefixes: list[list[int]] = ()
) -> dict:
    """Prefill `prompts` as one batch, then decode; returns timings and the greedy tokens.
    prefixes: prompt i continues prefixes[i % len(prefixes)], computed once before the batch."""
    import torch

    from radixlm.cache.no_prefix_cache import NoPrefixCache
    from radixlm.model.forward_batch import ForwardMode
    from radixlm.sampling_params import SamplingParams
    from radixlm.scheduler.batch import PrefillChunk, ScheduleBatch
    from radixlm.scheduler.kv.cache_manager import CacheManager
    from radixlm.scheduler.kv.state_tracker import create_state_tracker
    from radixlm.scheduler.req import Req

    need = sum(len(p) + output_len for p in prompts) + sum(map(len, prefixes))
    slots = len(prompts) + len(prefixes)
    if (
        need > runner.token_to_kv_pool.available_size()
        or slots > runner.req_to_token_pool.available_size()
    ):
        raise ValueError(
            f"batch needs {need} KV slots and {slots} request slots; raise --max-total-tokens "
            "or --max-running-requests"
        )
    sp = SamplingParams(max_new_tokens=output_len, temperature=0.0, ignore_eos=True)
    tree = NoPrefixCache()  # no radix tree: prefixes are shared by hand
    states = create_state_tracker(runner.state_pool, tree, 0)  # a hybrid's: from zero states
    cm = CacheManager.create(runner.req_to_token_pool, runner.token_to_kv_pool, tree, states)
    timer = _Timer(runner.device)

    def new_req(rid: str, ids: list[int], cached=None) -> Req:
        r = Req(rid=rid, origin_input_ids=ids, sampling_params=sp)
        # Starts from the prefix's KV slots, as a radix-cache hit does.
        cm.assign(
            r, cached if cached is not None else torch.empty(0, dtype=torch.int64), tree.root_node
        )
        return r

    def extend(reqs: list[Req]) -> ScheduleBatch:
        return ScheduleBatch(
            ForwardMode.EXTEND,
            chunks=[PrefillChunk.plan(r, r.seqlen - r.kv_committed_len) for r in reqs],
        )

    try:
        cached = []
        for g, pre in enumerate(prefixes):
            r = new_req(f"prefix{g}", list(pre))
            _forward(runner, extend([r]), cm)
            cached.append(runner.req_to_token_pool.req_to_token[r.req_pool_idx, : len(pre)].clone())
        reqs = [
            new_req(
                str(i),
                list(prefixes[i % len(prefixes)]) + list(p) if prefixes else list(p),
                cached[i % len(cached)] if cached else None,
            )
            for i, p in enumerate(prompts)
        ]
        t0 = timer.now()
        fb, out = _forward(runner, extend(reqs), cm)
        for r, tok in zip(reqs, runner.sample(fb, out.next_token_logits).tolist()):
            r.output_ids.append(tok)
        prefill = timer.now() - t0
        batch = ScheduleBatch(ForwardMode.DECODE, decode_reqs=reqs)
        steps, forwards = [], []
        for _ in range(output_len - 1):
            t0 = timer.now()
            mwb = batch.prepare(cm)
            f0 = timer.now()
            fb = runner.prepare(mwb)
            out = runner.forward(fb)
            f1 = timer.now()
            for r, tok in zip(reqs, runner.sample(fb, out.next_token_logits).tolist()):
                r.output_ids.append(tok)
            steps.append(timer.now() - t0)
            forwards.append(f1 - f0)
    finally:
        runner.req_to_token_pool.clear()
        runner.token_to_kv_pool.clear()
    return {
        "prefill_s": prefill,
        "step_s": steps,
        "forward_s": forwards,
        "output_ids": [r.output_ids for r in reqs],
    }


def summarize(bs: int, input_len: int, output_len: int, t: dict) -> dict:
    steps, fwd = t["step_s"], t["forward_s"]
    res = {
        "batch_size": bs,
        "input_len": input_len,
        "output_len": output_len,
        "prefill_latency_s": t["prefill_s"],
        "prefill_throughput": bs * input_len / t["prefill_s"],
        "decode_steps": len(steps),
    }
    if steps:
        q = (
            statistics.quantiles(steps, n=10, method="inclusive")
            if len(steps) > 1
            else [steps[0]] * 9
        )
        med = statistics.median(steps)
        total = sum(steps)
        res.update(
            {
                "decode_median_ms": med * 1e3,
                "decode_p90_ms": q[8] * 1e3,
                "decode_throughput": bs / med,  # tokens/s at the median step
                "decode_mean_throughput": bs * len(steps) / total,
                "forward_median_ms": statistics.median(fwd) * 1e3,
                "outside_forward_median_ms": (
                    statistics.median(s - f for s, f in zip(steps, fwd)) * 1e3
                ),
                "outside_forward_share": (total - sum(fwd)) / total,
            }
        )
    total = t["prefill_s"] + sum(steps)
    res["total_latency_s"] = total
    res["total_throughput"] = bs * (input_len + output_len) / total
    return res


def _profile(runner, prompts, args, bs: int, prefixes) -> str:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if runner.device.type == "cuda" else []
    )
    with profile(activities=acts) as prof:
        run_once(runner, prompts, args.output_len, prefixes)
    os.makedirs(args.profile_dir, exist_ok=True)
    stem = os.path.join(
        args.profile_dir, f"one_batch_bs{bs}_in{args.input_len}_out{args.output_len}"
    )
    prof.export_chrome_trace(stem + ".trace.json")
    sort = "self_cuda_time_total" if runner.device.type == "cuda" else "self_cpu_time_total"
    with open(stem + ".txt", "w") as f:
        f.write(prof.key_averages().table(sort_by=sort, row_limit=40))
    return stem


def run(args, server_args) -> list[dict]:
    """One result per batch size; each carries its greedy tokens under 'output_ids'."""
    from radixlm.model.executor.runner import ModelRunner
    from radixlm.model.executor.runner_config import ModelRunnerConfig

    if args.input_len < 1 or args.output_len < 1:
        raise ValueError("--input-len and --output-len must be at least 1")
    if args.shared_prefix_len < 0 or args.num_groups < 1:
        raise ValueError("--shared-prefix-len must be >= 0 and --num-groups >= 1")
    runner = ModelRunner(ModelRunnerConfig.from_server_args(sized_server_args(args, server_args)))
    prefixes = []
    if args.shared_prefix_len and runner.state_pool is not None:
        raise ValueError("--shared-prefix-len: a hybrid model's prefix states are not carried over")
    if args.shared_prefix_len:
        prefixes = [
            r.input_ids
            for r in random_prompts(
                args.num_groups, args.shared_prefix_len, 1, runner.vocab_size, seed=args.seed + 1
            )
        ]
    peak = compute_peak(runner)
    results = []
    for bs in args.batch_size:
        reqs = random_prompts(
            bs, args.input_len, args.output_len, runner.vocab_size, seed=args.seed
        )
        prompts = [r.input_ids for r in reqs]
        run_once(
            runner, prompts, min(args.output_len, 4), prefixes
        )  # warm-up: first-call allocations, kernels
        t = run_once(runner, prompts, args.output_len, prefixes)
        res = summarize(bs, args.input_len, args.output_len, t)
        res.update(
            shared_prefix_len=args.shared_prefix_len,
            num_groups=len(prefixes),
            device=str(runner.device),
            dtype=str(runner.dtype).replace("torch.", ""),
            quantization=runner.loaded.quantization,
            model=server_args.model_path or "default",
            vocab_size=runner.vocab_size,
            output_ids=t["output_ids"],
        )
        if peak:  # the compute roofline: the prefill's products at the CPU's peak rate
            ops = prefill_ops(runner, bs, args.input_len)
            res.update(
                peak_kind=peak[0],
                peak_tops=peak[1] / 1e12,
                prefill_tops=ops / res["prefill_latency_s"] / 1e12,
                prefill_peak_share=ops / res["prefill_latency_s"] / peak[1],
            )
        if res.get("decode_median_ms"):
            # The bandwidth roofline: the step's bytes at the machine's read rate, against the step.
            step_bytes = bytes_per_step(
                runner,
                bs,
                (len(prefixes[0]) if prefixes else 0) + args.input_len + (args.output_len - 1) / 2,
            )
            rate = read_rate_gbps(runner.device)
            step_s = res["decode_median_ms"] / 1e3
            res.update(
                step_bytes_mb=step_bytes / 1e6,
                state_bytes_mb=state_step_bytes(runner, bs) / 1e6,
                read_gbps=rate,
                roofline_share=step_bytes / (rate * 1e9) / step_s,
            )
            if runner.device.type == "cpu":  # the weights' own pages' rate (device_rates.py)
                from radixlm.model.memory.weight_memory import weight_tensors

                own = tensors_read_rate_gbps(weight_tensors(runner.model))
                if own:
                    res.update(
                        weights_read_gbps=own, roofline_share_own=step_bytes / own / 1e9 / step_s
                    )
        if res.get("forward_median_ms") and linear_weights(runner.model):
            ref = matmul_reference(runner, bs)
            res.update(ref)
            if peak:
                res["decode_peak_share"] = (
                    ref["linear_flops"] / (res["decode_median_ms"] / 1e3) / peak[1]
                )
            res["model_gflops"] = ref["linear_flops"] / res["forward_median_ms"] / 1e6
            res["matmul_gflops"] = ref["linear_flops"] / ref["matmul_only_ms"] / 1e6
            res["share_of_matmul_rate"] = ref["matmul_only_ms"] / res["forward_median_ms"]
        if args.profile:
            res["profile"] = _profile(runner, prompts, args, bs, prefixes)
        results.append(res)
    return results


COLUMNS = (
    ("batch_size", "bs", "{}"),
    ("prefill_latency_s", "prefill s", "{:.3f}"),
    ("prefill_throughput", "prefill tok/s", "{:.1f}"),
    ("prefill_tops", "prefill TOPS", "{:.3f}"),  # its linear layers' ops (bench/limits.py)
    ("prefill_peak_share", "of peak", "{:.0%}"),  # ... against the CPU's peak (peak_kind)
    ("decode_median_ms", "step p50 ms", "{:.2f}"),
    ("decode_p90_ms", "step p90 ms", "{:.2f}"),
    ("decode_throughput", "decode tok/s", "{:.1f}"),
    ("forward_median_ms", "fwd p50 ms", "{:.2f}"),
    ("outside_forward_median_ms", "outside ms", "{:.2f}"),
    ("outside_forward_share", "outside %", "{:.1%}"),
    ("model_gflops", "fwd GFLOP/s", "{:.1f}"),
    ("matmul_gflops", "matmul GFLOP/s", "{:.1f}"),
    ("share_of_matmul_rate", "of matmul", "{:.0%}"),
    ("step_bytes_mb", "MB/step", "{:.1f}"),
    ("state_bytes_mb", "state MB", "{:.1f}"),  # read + written, outside MB/step and the roofline
    ("read_gbps", "mem GB/s", "{:.1f}"),  # CPU: a read; CUDA: a copy (read + write)
    ("roofline_share", "of roofline", "{:.0%}"),
    ("weights_read_gbps", "weights GB/s", "{:.1f}"),  # the weights' own memory, read alone
    ("roofline_share_own", "of their rate", "{:.0%}"),
    ("decode_peak_share", "step of peak", "{:.1%}"),  # the step's products at the peak rate
)


def format_table(results: list[dict]) -> str:
    lines = ["".join(f"{h:>15}" for _, h, _ in COLUMNS)]
    for r in results:
        lines.append(
            "".join(
                f"{(f.format(r[k]) if r.get(k) is not None else 'n/a'):>15}" for k, _, f in COLUMNS
            )
        )
    return "\n".join(lines)


def main(args, server_args) -> int:
    results = run(args, server_args)
    r0 = results[0]
    shared = (
        f" after a cached {args.shared_prefix_len}-token prefix ({r0['num_groups']} groups)"
        if r0["num_groups"]
        else ""
    )
    weights = "" if r0["quantization"] == "none" else f", {r0['quantization']} weights"
    print(
        f"one batch: input {args.input_len}{shared}, output {args.output_len}, {r0['device']},"
        f" {r0['dtype']}{weights}, {r0['model']}"
    )
    print(format_table(results))
    if r0.get("peak_kind"):
        print(f"peak: {r0['peak_kind']} {r0['peak_tops']:.3f} TOPS (radixlm bench limits)")
    for r in results:
        if r.get("profile"):
            print(f"profile: {r['profile']}.trace.json and .txt")
    if args.output_file:
        with open(args.output_file, "a") as f:
            for r in results:
                f.write(json.dumps({k: v for k, v in r.items() if k != "output_ids"}) + "\n")
    return 0
