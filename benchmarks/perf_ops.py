"""Where a step's time goes, by kind of work: Linux `perf record` (cpu-clock sampling, every
thread of one process) around radixlm's decode steps or prefills on the ModelRunner, or around
any process (--attach PID: llama-server while a client loads it), the samples summed by what their
function does (GEMV/GEMM by weight type, activation quantization, threads waiting, attention, the
recurrences, norms, sampling, Python, torch, the OS). Inlined kernels count under the op that
inlines them (radixlm's one-op decoder stack names its GEMMs by weight type).

    python benchmarks/perf_ops.py --model-path FILE --phase decode --batch-size 1
    python benchmarks/perf_ops.py --model-path FILE --phase prefill --input-len 512
    python benchmarks/perf_ops.py --attach PID --seconds 20
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# (kind, pattern on "dso<TAB>symbol"), first match wins; case-insensitive. radixlm's kernels name
# their formats Q4K / Q6K / Q8 / MXFP4 (X8Kind) and gemm_gguf; ggml names its q4_K / q8_0 ...
KINDS = (
    (
        "threads waiting (barriers, spins)",
        r"libgomp|gomp_|GOMP_|blas_thread_server|do_spin|ggml_barrier|sched_yield|futex|omp_.*barrier|do_wait",
    ),
    # radixlm's tiles by X8Kind (0 Q4, 1 Q8, 2 Q4_K, 3 Q6_K, 4 MXFP4, 5 Q5, 6 Q4_0, 7 Q5_0)
    ("GEMV/GEMM Q4_K", r"q4_?k|X8Kind\)2"),
    ("GEMV/GEMM Q6_K", r"q6_?k|X8Kind\)3"),
    ("GEMV/GEMM Q5_K", r"q5_?k"),
    ("GEMV/GEMM Q5_0/Q5_1", r"q5_[01]|FQ5|X8Kind\)[57]"),
    ("GEMV/GEMM Q8_0", r"q8_0|X8Kind\)1|q8x8|row1_q8|FQ8"),
    ("GEMV/GEMM Q4_0/Q4_1", r"q4_[01]|X8Kind\)[06]|q4x8|FQ4"),
    ("GEMV/GEMM MXFP4", r"mxfp4|X8Kind\)4"),
    ("GEMV/GEMM other formats", r"gemm_gguf|iq4|q3_?k|q2_?k|float16_gemm|f16_gemm|bf16"),
    ("activation quantization", r"quantize_act|quantize_row_q8|act_sums16|from_float"),
    ("attention", r"attention|flash_attn|soft_max|softmax"),
    (
        "recurrences (delta rule, conv, SSM)",
        r"delta|conv1d|ssd_|ssm_|kda|linear_attn|recurrent|gla",
    ),
    ("MoE routing and experts", r"moe|expert|router_gemm|argsort|top_k"),
    (
        "norms, RoPE, element-wise",
        r"rmsnorm|rms_norm|silu|swiglu|rotary|rope|kv_store|add_|mul_|gated_rmsnorm|cpy|scale",
    ),
    ("sampling (argmax)", r"argmax|sampling::"),
    ("float GEMM (MKL / oneDNN)", r"mkl_|sgemm|dnnl|gemm"),
    ("Python interpreter", r"libpython|python3|_Py|PyObject|PyEval"),
    ("torch (dispatch, allocation, other ops)", r"libtorch|libc10"),
    ("OS kernel", r"\[kernel|kallsyms"),
    ("memory (libc)", r"libc\.so|memcpy|memset|malloc|free"),
)
_COMPILED = [(k, re.compile(p, re.IGNORECASE)) for k, p in KINDS]


def classify(dso: str, symbol: str) -> str:
    text = f"{dso}\t{symbol}"
    for kind, pat in _COMPILED:
        if pat.search(text):
            return kind
    return "other"


def record(pid: int, out: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        ["perf", "record", "-F", "1999", "-e", "cpu-clock", "-p", str(pid), "-o", out, "-q"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # never read: a pipe could fill and stall perf
    )
    time.sleep(0.5)  # perf attaches to every thread before the measured work starts
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)


def summarize(data: str) -> tuple[dict[str, float], list[tuple[float, str, str]]]:
    """(kind -> share of samples, the top symbols) of a perf.data file."""
    text = subprocess.run(
        [
            "perf",
            "report",
            "-i",
            data,
            "--no-children",
            "--sort",
            "dso,sym",
            "--stdio",
            "--field-separator",
            "\t",
            "--percent-limit",
            "0",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    kinds: dict[str, float] = defaultdict(float)
    top = []
    for line in text.splitlines():
        parts = [x.strip() for x in line.split("\t")]
        if len(parts) < 3 or not parts[0].endswith("%"):
            continue
        share = float(parts[0].rstrip("%")) / 100
        dso, sym = parts[1], parts[2].removeprefix("[.] ").removeprefix("[k] ")
        kinds[classify(dso, sym)] += share
        top.append((share, dso, sym))
    top.sort(reverse=True)
    return dict(kinds), top


def format_summary(title: str, kinds: dict[str, float], top, n_top: int) -> str:
    lines = [title, "| kind of work | share of samples |", "|---|---|"]
    for kind, share in sorted(kinds.items(), key=lambda kv: -kv[1]):
        if share >= 0.001:
            lines.append(f"| {kind} | {share:.1%} |")
    lines += ["", "top functions:"]
    for share, dso, sym in top[:n_top]:
        lines.append(f"  {share:6.1%}  {os.path.basename(dso)}  {sym[:140]}")
    return "\n".join(lines)


def profile_radixlm(a) -> str:
    from radixlm.bench.one_batch import run_once, sized_server_args
    from radixlm.bench.workloads import random_prompts
    from radixlm.config import ServerArgs
    from radixlm.model.executor.runner import ModelRunner
    from radixlm.model.executor.runner_config import ModelRunnerConfig

    decode = a.phase == "decode"
    input_len, output_len = (a.input_len, a.output_len) if decode else (a.input_len, 1)
    sized = argparse.Namespace(
        batch_size=[a.batch_size],
        input_len=input_len,
        output_len=output_len,
        num_groups=1,
        shared_prefix_len=0,
    )
    server_args = sized_server_args(sized, ServerArgs(model_path=a.model_path))
    runner = ModelRunner(ModelRunnerConfig.from_server_args(server_args))
    prompts = [
        r.input_ids
        for r in random_prompts(a.batch_size, input_len, output_len, runner.vocab_size, seed=0)
    ]
    run_once(runner, prompts, min(output_len, 4))  # warm: first-call allocations, threads
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        proc = record(os.getpid(), data)
        t0 = time.perf_counter()
        for _ in range(a.repeats):
            t = run_once(runner, prompts, output_len)
        wall = time.perf_counter() - t0
        stop(proc)
        kinds, top = summarize(data)
    what = (
        f"decode, batch {a.batch_size}, {len(t['step_s'])} steps x {a.repeats}"
        if decode
        else f"prefill of {a.batch_size} x {input_len} tokens x {a.repeats}"
    )
    return format_summary(
        f"radixlm, {os.path.basename(a.model_path)}: {what}, {wall:.2f} s", kinds, top, a.top
    )


def profile_pid(a) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        proc = record(a.attach, data)
        time.sleep(a.seconds)
        stop(proc)
        kinds, top = summarize(data)
    return format_summary(f"process {a.attach}, {a.seconds} s", kinds, top, a.top)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model-path", help="the model radixlm loads (a GGUF file)")
    p.add_argument("--phase", choices=("decode", "prefill"), default="decode")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--input-len", type=int, default=None, help="default: 32 decode, 512 prefill")
    p.add_argument("--output-len", type=int, default=129, help="decode: tokens per request")
    p.add_argument("--repeats", type=int, default=None, help="default: 1 decode, 3 prefill")
    p.add_argument("--attach", type=int, help="profile this process instead (e.g. llama-server)")
    p.add_argument("--seconds", type=float, default=20.0, help="--attach: how long")
    p.add_argument("--top", type=int, default=15, help="functions listed")
    a = p.parse_args()
    if a.input_len is None:
        a.input_len = 32 if a.phase == "decode" else 512
    if a.repeats is None:
        a.repeats = 1 if a.phase == "decode" else 3
    if a.attach is None and not a.model_path:
        p.error("--model-path or --attach is required")
    print(profile_pid(a) if a.attach else profile_radixlm(a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
