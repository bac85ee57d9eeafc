"""PD disaggregation (issue 39): what it is for, and what moving KV costs.

1. ITL under long-prompt arrivals: `--streams` chat streams decode continuously (short prompts,
   streamed) while a long prompt (`--long-len` tokens, 4096 by default) arrives every
   `--long-every` seconds. Colocated: one server does both (each long prefill stalls every stream's
   next token). Disaggregated: a prefill and a decode server behind `radixlm router
   --pd-disaggregation`; the streams decode on a server that never prefills a long prompt. The
   cores are split the same way in both (colocated: all `--threads`; disaggregated: half each).
   Reported: the streams' inter-token latency p50 / p99 and the long prompts' TTFT.
2. Transfer throughput: the KV of `--transfer-tokens` tokens of the model's layout moved by the
   tcp and the shm backends (their real classes, in this process: tcp over a loopback ZMQ socket
   into a pool, shm into a pool file), in GB/s.

    python benchmarks/disaggregation.py                         # default model, both parts
    python benchmarks/disaggregation.py --model-path M --streams 2 --long-len 256 --duration 5 \\
        --transfer-tokens 512                                   # a quick check
    python benchmarks/disaggregation.py --skip-itl              # transfer throughput only

Run it on an otherwise idle machine; the figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def chat_stream(
    url: str, i: int, output_len: int, stop: threading.Event, itls: list, lock: threading.Lock
) -> None:
    import requests

    while not stop.is_set():
        body = {
            "text": f"Chat {i}: tell me a story about the number {random.randint(0, 999)}.",
            "stream": True,
            "sampling_params": {"max_new_tokens": output_len, "temperature": 0, "ignore_eos": True},
        }
        last = None
        with requests.post(url + "/generate", json=body, stream=True, timeout=600) as r:
            for line in r.iter_lines():
                if not line.startswith(b"data: {"):
                    continue
                now = time.perf_counter()
                if last is not None:
                    with lock:
                        itls.append(now - last)
                last = now


def long_prompts(
    url: str, tokens: int, every: float, stop: threading.Event, ttfts: list, errors: list
) -> None:
    import requests

    while not stop.wait(every):
        # token ids: exactly `tokens` of them (a text's count depends on the tokenizer), random so
        # never cached
        body = {
            "input_ids": [random.randint(100, 40000) for _ in range(tokens)],
            "sampling_params": {"max_new_tokens": 4, "temperature": 0},
        }
        t0 = time.perf_counter()
        r = requests.post(url + "/generate", json=body, timeout=600)
        if r.status_code == 200:
            ttfts.append(time.perf_counter() - t0)
        else:
            errors.append(f"{r.status_code}: {r.text[:200]}")


def measure_itl(url: str, args) -> dict:
    stop, lock, itls, ttfts, errors = threading.Event(), threading.Lock(), [], [], []
    threads = [
        threading.Thread(
            target=chat_stream, args=(url, i, args.output_len, stop, itls, lock), daemon=True
        )
        for i in range(args.streams)
    ]
    threads.append(
        threading.Thread(
            target=long_prompts,
            args=(url, args.long_len, args.long_every, stop, ttfts, errors),
            daemon=True,
        )
    )
    for t in threads:
        t.start()
    time.sleep(args.duration)
    stop.set()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise SystemExit(f"{len(errors)} long prompts failed, the first: {errors[0]}")
    # A long prefill stalls every stream once per chunk: rare among thousands of ITLs, so the tail
    # (p99.9, max, the share over 100 ms) shows it where p99 may not.
    return {
        "itl_ms_p50": 1e3 * pct(itls, 0.5),
        "itl_ms_p99": 1e3 * pct(itls, 0.99),
        "itl_ms_p999": 1e3 * pct(itls, 0.999),
        "itl_ms_max": 1e3 * max(itls, default=float("nan")),
        "itl_over_100ms": sum(x > 0.1 for x in itls),
        "itl_samples": len(itls),
        "long_ttft_s_mean": statistics.mean(ttfts) if ttfts else None,
        "long_prompts": len(ttfts),
    }


def itl_part(args) -> dict:
    from radixlm.server.process import ServerProcess, free_port

    model = ["--model-path", args.model_path] if args.model_path else []
    common = [
        *model,
        "--log-level",
        "warning",
        "--chunked-prefill-size",
        str(args.chunk),
        *args.server_args.split(),
    ]
    half = max(1, args.threads // 2)
    out = {}
    s = ServerProcess(*common, "--num-threads", str(args.threads))
    try:
        out["colocated"] = measure_itl(s.url, args)
    finally:
        s.stop()
    bport = free_port()
    p = ServerProcess(
        *common,
        "--num-threads",
        str(half),
        "--disaggregation-mode",
        "prefill",
        "--disaggregation-bootstrap-port",
        str(bport),
        "--disaggregation-transfer-backend",
        args.backend,
    )
    d = ServerProcess(
        *common,
        "--num-threads",
        str(half),
        "--disaggregation-mode",
        "decode",
        "--disaggregation-transfer-backend",
        args.backend,
    )
    r = ServerProcess(
        command=lambda port: [
            sys.executable,
            "-m",
            "radixlm.cli",
            "router",
            "--pd-disaggregation",
            "--port",
            str(port),
            "--prefill",
            p.url,
            str(bport),
            "--decode",
            d.url,
            "--log-level",
            "warning",
        ],
        name="the PD router",
    )
    try:
        out["disaggregated"] = measure_itl(r.url, args)
    finally:
        for x in (r, p, d):
            x.stop()
    return out


def transfer_part(args) -> dict:
    """GB/s of the tcp and shm backends for one prompt's KV in the model's layout."""
    import torch
    import zmq

    from radixlm.cache.memory_pool import TokenToKVPool
    from radixlm.disaggregation.backends import make_backend
    from radixlm.disaggregation.protocol import AuxRecord, KVLayout, TransferDest
    from radixlm.model.loader import default_model_path

    layers, heads, dim = args.layout or _model_layout(args.model_path or default_model_path())
    n = args.transfer_tokens
    results = {
        "layout": {"layers": layers, "kv_heads": heads, "head_dim": dim, "dtype": args.kv_dtype},
        "tokens": n,
    }
    dtype = getattr(torch, args.kv_dtype)
    for name in ("tcp", "shm"):
        src, dst = (TokenToKVPool(n + 8, layers, heads, dim, dtype) for _ in range(2))
        for layer in range(layers):
            for t in src.get_kv_buffer(layer):
                t.copy_(torch.randn(t.shape).to(dtype))
        backend_src, backend_dst = make_backend(name), make_backend(name)
        shm = backend_dst.prepare_pool(dst)
        src_slots = torch.arange(1, n + 1)
        dst_slots = torch.randperm(n) + 1
        ctx = zmq.Context.instance()
        pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        push.connect(f"tcp://127.0.0.1:{port}")
        dest = TransferDest(1, "", "", dst_slots.tolist(), 0, KVLayout.of(dst), shm)
        best = float("inf")
        for _ in range(args.repeats):

            def receive():
                import pickle

                while True:
                    frames = pull.recv_multipart(copy=False)
                    msg = pickle.loads(frames[0].buffer)
                    if isinstance(msg, AuxRecord):
                        return
                    backend_dst.on_chunk(msg, [f.buffer for f in frames[1:]], dst, dst_slots)

            th = threading.Thread(target=receive)
            th.start()
            t0 = time.perf_counter()
            moved = backend_src.write(dest, src, src_slots, push.send_multipart)
            push.send(__import__("pickle").dumps(AuxRecord(1, 0)))
            th.join()
            best = min(best, time.perf_counter() - t0)
        k0, _ = dst.get_kv_buffer(0)
        assert torch.equal(k0[dst_slots], src.get_kv_buffer(0)[0][src_slots]), f"{name}: KV differs"
        results[name] = {"bytes": moved, "seconds": best, "GB_per_s": moved / best / 1e9}
        pull.close(0)
        push.close(0)
    return results


def _model_layout(path: str) -> tuple[int, int, int]:
    from radixlm.model.loader import load_model_config

    cfg = load_model_config(path)
    heads = cfg.num_attention_heads
    return (
        cfg.num_hidden_layers,
        getattr(cfg, "num_key_value_heads", heads),
        cfg.hidden_size // heads,
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model-path", default=None, help="default: the embedded SmolLM2-135M")
    ap.add_argument(
        "--threads", type=int, default=2, help="cores in all (disaggregated: half each)"
    )
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument(
        "--long-len", type=int, default=4096, help="tokens of a long prompt (random token ids)"
    )
    ap.add_argument("--long-every", type=float, default=10.0, help="seconds between long prompts")
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument(
        "--chunk", type=int, default=2048, help="--chunked-prefill-size of every server"
    )
    ap.add_argument(
        "--server-args",
        default="",
        help="more `radixlm serve` flags for every server, e.g. --enable-mixed-chunk",
    )
    ap.add_argument("--backend", default="tcp", choices=("tcp", "shm"))
    ap.add_argument("--transfer-tokens", type=int, default=4096)
    ap.add_argument("--kv-dtype", default="float32")
    ap.add_argument(
        "--layout", type=int, nargs=3, default=None, metavar=("LAYERS", "KV_HEADS", "HEAD_DIM")
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-itl", action="store_true")
    ap.add_argument("--skip-transfer", action="store_true")
    args = ap.parse_args()
    out = {}
    if not args.skip_transfer:
        out["transfer"] = transfer_part(args)
    if not args.skip_itl:
        out["itl"] = itl_part(args)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
