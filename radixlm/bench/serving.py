"""`radixlm bench serving`: an asyncio load generator for a running server (radixlm's native
API, or any OpenAI-compatible server such as llama.cpp's llama-server, vLLM or SGLang).

Requests stream; each one's TTFT, inter-token gaps and end-to-end latency are taken on the
client. Sessions (one request, a fork's N branches, or a whole conversation) arrive as a
Poisson process (--request-rate; inf: all at once), and at most --max-concurrency requests
are in flight. Workloads: bench/serving_datasets.py; metrics, table and plot: bench/metrics.py.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import random
import sys
import time
from datetime import datetime

from radixlm.bench.metrics import compute_metrics, format_table, plot
from radixlm.bench.serving_client import BACKENDS, RequestOutput, make_backend, send_request
from radixlm.bench.serving_datasets import (
    DATASETS,
    Session,
    WordVocab,
    build_sessions,
    json_valid,
    warmup_request,
)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="radixlm",
        help=(
            "radixlm: native /generate; openai: /v1/completions; openai-chat: /v1/chat/completions"
        ),
    )
    p.add_argument("--base-url", default="http://127.0.0.1:30000")
    p.add_argument(
        "--model",
        default=None,
        help="model name for the OpenAI backends (default: the first of /v1/models)",
    )
    p.add_argument("--api-key", default=None)
    p.add_argument(
        "--admin-api-key", default=None, help="the server's admin key, for --flush-cache"
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help=(
            "HF directory or GGUF whose tokenizer builds the prompts and counts tokens the server "
            "does not report (default: the embedded SmolLM2)"
        ),
    )
    p.add_argument("--dataset", choices=DATASETS, default="random")
    p.add_argument(
        "--num-prompts", type=int, default=64, help="random and json: requests; fork: fork points"
    )
    p.add_argument("--random-input-len", type=int, default=200)
    p.add_argument("--random-output-len", type=int, default=64)
    p.add_argument(
        "--random-range-ratio",
        type=float,
        default=1.0,
        help="lengths drawn uniformly from [len * ratio, len]; 1.0: exact",
    )
    p.add_argument("--gsp-num-groups", type=int, default=16)
    p.add_argument("--gsp-prompts-per-group", type=int, default=16)
    p.add_argument("--gsp-system-prompt-len", type=int, default=1024)
    p.add_argument("--gsp-question-len", type=int, default=32)
    p.add_argument("--gsp-output-len", type=int, default=64)
    p.add_argument(
        "--gsp-order",
        choices=["interleaved", "shuffled"],
        default="interleaved",
        help="arrival order: round-robin over the groups, or random (many clients)",
    )
    p.add_argument("--num-conversations", type=int, default=8)
    p.add_argument("--num-turns", type=int, default=4)
    p.add_argument(
        "--multi-turn-question-len", type=int, default=64, help="new user tokens per turn"
    )
    p.add_argument("--multi-turn-output-len", type=int, default=64)
    p.add_argument(
        "--multi-turn-system-len",
        type=int,
        default=0,
        help="tokens of a system prompt every conversation starts with (0: none)",
    )
    p.add_argument(
        "--multi-turn-token-ids",
        action="store_true",
        help=(
            "send the conversation as token ids, each turn continuing on the ids the server"
            " answered (backends radixlm and llama-cpp): answers reused as a real model's are"
        ),
    )
    p.add_argument("--fork-prefix-len", type=int, default=512)
    p.add_argument("--fork-n", type=int, default=4, help="branches per fork point, sent at once")
    p.add_argument(
        "--fork-branch-len", type=int, default=16, help="tokens of each branch after the prefix"
    )
    p.add_argument("--fork-output-len", type=int, default=64)
    p.add_argument("--json-output-len", type=int, default=160, help="max tokens of a JSON answer")
    p.add_argument(
        "--grounded-sentences", type=int, default=8, help="sentences of each grounded passage"
    )
    p.add_argument(
        "--grounded-output-len", type=int, default=160, help="max tokens of a grounded answer"
    )
    p.add_argument(
        "--recurring-num-prompts", type=int, default=8, help="distinct recurring agent calls"
    )
    p.add_argument(
        "--recurring-repeats", type=int, default=4, help="times each recurring call is sent"
    )
    p.add_argument(
        "--recurring-output-len", type=int, default=64, help="max tokens of a recurring answer"
    )
    p.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="sessions per second (Poisson arrivals); inf: all at once",
    )
    p.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight")
    p.add_argument(
        "--warmup-requests",
        type=int,
        default=1,
        help="short unrelated requests first, not measured",
    )
    p.add_argument(
        "--flush-cache",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=(
            "POST /flush_cache after the warm-up, so runs start from an empty prefix cache "
            "(radixlm and SGLang; ignored where the server has no such route)"
        ),
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help=(
            "sampling temperature of every request (0: greedy; above 0 repeated prompts get "
            "different answers, which the radix tree records as branches)"
        ),
    )
    p.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=(
            "generate the full output length past EOS (default on: exact output lengths; "
            "the json dataset never sets it)"
        ),
    )
    p.add_argument("--disable-tqdm", action="store_true")
    p.add_argument(
        "--output-file", default=None, help="append the result (args + metrics) as one JSON line"
    )
    p.add_argument("--plot", default=None, help="write a PNG of throughput and latency percentiles")


def _headers(args) -> dict:
    return {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}


async def _default_model(client, args) -> str:
    import httpx

    try:
        r = await client.get(args.base_url + "/v1/models", headers=_headers(args))
    except httpx.HTTPError as e:
        raise ValueError(f"cannot reach {args.base_url}: {e}") from None
    if r.status_code != 200:
        raise ValueError(f"GET {args.base_url}/v1/models: HTTP {r.status_code}; pass --model")
    return r.json()["data"][0]["id"]


async def _run_sessions(
    client, args, backend, sessions: list[Session], pbar
) -> list[RequestOutput]:
    headers = _headers(args)
    limit = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
    outputs: list[RequestOutput] = []

    async def one(req) -> RequestOutput:
        if limit is None:
            out = await send_request(client, args.base_url, backend, req, headers)
        else:
            async with limit:
                out = await send_request(client, args.base_url, backend, req, headers)
        if pbar is not None:
            pbar.update(1)
        return out

    async def session(s: Session) -> None:
        history: list[dict] = []
        history_ids: list[int] = []
        for t, turn in enumerate(s.turns):
            reqs = (
                [
                    dataclasses.replace(
                        r,
                        messages=history + r.messages,
                        input_ids=None if r.input_ids is None else history_ids + r.input_ids,
                    )
                    for r in turn
                ]
                if s.chained
                else turn
            )
            outs = await asyncio.gather(*(one(r) for r in reqs))
            outputs.extend(outs)
            if s.chained:
                if not outs[0].success:  # the conversation cannot go on: its later turns fail
                    rest = s.turns[t + 1 :]
                    outputs.extend(
                        _failed("an earlier turn of this conversation failed")
                        for tn in rest
                        for _ in tn
                    )
                    if pbar is not None:
                        pbar.update(sum(len(tn) for tn in rest))
                    return
                history = reqs[0].messages + [{"role": "assistant", "content": outs[0].text}]
                if reqs[0].input_ids is not None:
                    history_ids = reqs[0].input_ids + outs[0].output_ids

    rng = random.Random(args.seed)
    tasks = []
    for i, s in enumerate(sessions):
        if i and args.request_rate != float("inf"):
            await asyncio.sleep(rng.expovariate(args.request_rate))
        tasks.append(asyncio.create_task(session(s)))
    await asyncio.gather(*tasks)
    return outputs


def _failed(error: str) -> RequestOutput:
    return RequestOutput(success=False, error=error)


def _fill_counts(outputs: list[RequestOutput], tokenizer) -> None:
    """Token counts the server did not report, from the tokenizer; the JSON check."""
    for o in outputs:
        req = o.request
        if req is None or not o.success:
            continue
        if o.prompt_len is None and req.input_ids is not None:
            o.prompt_len = len(req.input_ids)
        if o.prompt_len is None:
            o.prompt_len = len(tokenizer(req.text, add_special_tokens=False)["input_ids"])
        if o.output_len is None and o.output_ids:
            o.output_len = len(o.output_ids)
        if o.output_len is None:
            o.output_len = len(tokenizer(o.text, add_special_tokens=False)["input_ids"])
        if req.json_schema is not None:
            o.json_valid = json_valid(o.text, req.json_schema)


@functools.lru_cache(maxsize=4)
def prompt_vocab(tokenizer_path):
    """The tokenizer and its single-token words (seconds to build; kept for repeated runs)."""
    from radixlm.model.loader import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_path)
    return tokenizer, WordVocab(tokenizer)


async def benchmark(args) -> dict:
    import httpx

    tokenizer, words = prompt_vocab(args.tokenizer)
    sessions = build_sessions(args, words)
    for s in sessions:
        for turn in s.turns:
            for r in turn:
                r.ignore_eos = r.ignore_eos and args.ignore_eos
                r.temperature = args.temperature
    total = sum(s.num_requests for s in sessions)
    timeout = httpx.Timeout(connect=30.0, read=None, write=60.0, pool=None)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        model = args.model
        if model is None and args.backend != "radixlm":
            model = await _default_model(client, args)
        backend = make_backend(args.backend, model)
        warm = [warmup_request(words, args.seed + i) for i in range(args.warmup_requests)]
        warm_outs = await asyncio.gather(
            *(send_request(client, args.base_url, backend, r, _headers(args)) for r in warm)
        )
        bad = [o.error for o in warm_outs if not o.success]
        if bad:
            print(f"warm-up failed: {bad[0]}", file=sys.stderr)
        if args.flush_cache:
            try:
                admin = (
                    {"Authorization": f"Bearer {args.admin_api_key}"} if args.admin_api_key else {}
                )
                r = await client.post(
                    args.base_url + "/flush_cache", headers={**_headers(args), **admin}
                )
                if r.status_code in (
                    401,
                    403,
                ):  # an admin action: the run would start from a warm cache
                    print(
                        f"warning: /flush_cache refused ({r.status_code}); pass --admin-api-key",
                        file=sys.stderr,
                    )
            except httpx.HTTPError:
                pass  # the requests below say what is wrong with the server
        pbar = None
        if not args.disable_tqdm:
            from tqdm.auto import tqdm

            pbar = tqdm(total=total, desc=f"{args.backend}/{args.dataset}")
        t0 = time.perf_counter()
        outputs = await _run_sessions(client, args, backend, sessions, pbar)
        duration = time.perf_counter() - t0
        if pbar is not None:
            pbar.close()
    _fill_counts(outputs, tokenizer)
    date = datetime.now().isoformat(timespec="seconds")
    res = {"backend": args.backend, "dataset": args.dataset, "model": model, "date": date}
    res.update(compute_metrics(outputs, duration))
    res["requests"] = total
    res["args"] = {
        k: "inf" if v == float("inf") else v for k, v in vars(args).items() if not callable(v)
    }
    res["outputs"] = outputs  # dropped from the JSON line; for callers and tests
    return res


def run(args) -> dict:
    return asyncio.run(benchmark(args))


def main(args) -> int:
    res = run(args)
    print(format_table(res))
    line = {k: v for k, v in res.items() if k != "outputs"}
    if args.output_file:
        with open(args.output_file, "a") as f:
            f.write(json.dumps(line) + "\n")
    if args.plot:
        plot(res, args.plot)
        print(f"plot written to {args.plot}")
    return 0 if res["completed"] else 1
