"""`radixlm bench serving` against tiny-model servers (every dataset x backend), its parsing and
metrics without a server, and `radixlm bench one-batch` against the Engine's greedy output."""

import argparse
import json

import pytest
import requests

from radixlm.bench import one_batch, serving
from radixlm.bench.metrics import LATENCIES, compute_metrics
from radixlm.bench.serving_client import (
    LlamaCppBackend,
    OpenAIBackend,
    OpenAIChatBackend,
    RequestInput,
    RequestOutput,
    parse_sse_line,
)
from tests.conftest import engine_args
from tests.e2e.conftest import ServerProcess

TINY = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")
SMALL = dict(
    num_prompts=3,
    random_input_len=24,
    random_output_len=6,
    gsp_num_groups=2,
    gsp_prompts_per_group=3,
    gsp_system_prompt_len=48,
    gsp_question_len=6,
    gsp_output_len=6,
    num_conversations=2,
    num_turns=3,
    multi_turn_question_len=8,
    multi_turn_output_len=5,
    fork_prefix_len=48,
    fork_n=3,
    fork_branch_len=4,
    fork_output_len=6,
    json_output_len=120,
)
EXPECTED_REQUESTS = {"random": 3, "gsp": 6, "multi-turn": 6, "fork": 9, "json": 3}


@pytest.fixture(scope="module")
def nocache_server(tiny_model_dir):
    s = ServerProcess("--model-path", tiny_model_dir, *TINY, "--disable-radix-cache")
    yield s
    s.stop()


@pytest.fixture
def servers(tiny_server, nocache_server):
    """Two tiny-model servers: radix cache on (the run's shared one, tests/conftest.py, its cache
    flushed), and off."""
    return {"cache": tiny_server, "nocache": nocache_server}


def bench_args(url, tokenizer, *cli, **kw):
    p = argparse.ArgumentParser()
    serving.add_args(p)
    args = p.parse_args(["--base-url", url, "--tokenizer", tokenizer, "--disable-tqdm", *cli])
    for k, v in {**SMALL, **kw}.items():
        setattr(args, k, v)
    return args


def check_latencies(res):
    for name in LATENCIES:
        p50, p90, p99 = (res[f"{q}_{name}_ms"] for q in ("p50", "p90", "p99"))
        assert 0 <= p50 <= p90 <= p99, name
        assert res[f"mean_{name}_ms"] >= 0
    for o in res["outputs"]:
        assert 0 < o.ttft <= o.latency
        assert all(g >= 0 for g in o.itl)
    assert res["p99_ttft_ms"] <= res["p99_e2e_ms"]


@pytest.mark.parametrize("backend", ["radixlm", "openai", "openai-chat"])
@pytest.mark.parametrize("dataset", ["random", "gsp", "multi-turn", "fork", "json"])
def test_serving_datasets_backends(servers, tiny_model_dir, backend, dataset):
    res = serving.run(
        bench_args(servers["cache"].url, tiny_model_dir, "--backend", backend, "--dataset", dataset)
    )
    n = EXPECTED_REQUESTS[dataset]
    assert res["requests"] == res["completed"] == n and res["errors"] == 0, res["error_samples"]
    check_latencies(res)
    outs = res["outputs"]
    # radixlm reports prompt / completion / cached tokens on every API.
    assert all(
        isinstance(o.cached_tokens, int) and 0 <= o.cached_tokens < o.prompt_len for o in outs
    )
    assert res["cached_token_share"] == pytest.approx(
        sum(o.cached_tokens for o in outs) / sum(o.prompt_len for o in outs)
    )
    if dataset == "json":
        assert res["json_valid_share"] == 1.0  # the server constrains the output to the schema
        assert all(o.output_len <= SMALL["json_output_len"] for o in outs)
        return
    assert res["json_valid_share"] is None
    for o in outs:  # ignore_eos: exact output lengths
        assert o.output_len == o.request.output_len
    assert res["total_output_tokens"] == sum(o.request.output_len for o in outs)
    if dataset == "random" and backend != "openai-chat":
        # Prompts are single-token words: token-exact lengths on the completion APIs.
        assert all(o.prompt_len == SMALL["random_input_len"] for o in outs)
        assert res["cached_token_share"] == 0.0  # cache flushed, random prompts share nothing
    if dataset == "multi-turn":
        turns = SMALL["num_turns"]
        for c in range(SMALL["num_conversations"]):
            conv = [o for o in outs if o.request.messages[0] == outs[c * turns].request.messages[0]]
            assert len(conv) == turns
            for prev, cur in zip(conv, conv[1:]):  # each turn's prompt is the whole history
                assert cur.request.messages[-2] == {"role": "assistant", "content": prev.text}
                assert cur.prompt_len > prev.prompt_len + SMALL["multi_turn_question_len"]
        assert res["cached_token_share"] > 0
    if dataset in ("gsp", "fork"):
        assert res["cached_token_share"] > 0


def test_multi_turn_token_ids_continue_on_the_answers_tokens(servers, tiny_model_dir):
    """--multi-turn-token-ids: each turn is the previous turn's ids + the ids the server answered
    + new ones, so the radix cache reuses the answer too; --multi-turn-system-len: every
    conversation starts with the same system prompt, which later conversations reuse."""
    system = 32
    res = serving.run(
        bench_args(
            servers["cache"].url,
            tiny_model_dir,
            "--backend",
            "radixlm",
            "--dataset",
            "multi-turn",
            "--multi-turn-token-ids",
            "--multi-turn-system-len",
            str(system),
            max_concurrency=1,  # one request at a time: what each reuses is exact
        )
    )
    assert res["completed"] == 6 and res["errors"] == 0, res["error_samples"]
    outs, q = res["outputs"], SMALL["multi_turn_question_len"]
    convs: dict[tuple, list] = {}  # outputs come in completion order: group them by turn 1
    for o in outs:
        convs.setdefault(tuple(o.request.input_ids[: system + q]), []).append(o)
    convs = [sorted(c, key=lambda o: len(o.request.input_ids)) for c in convs.values()]
    assert [len(c) for c in convs] == [SMALL["num_turns"]] * SMALL["num_conversations"]
    first = sorted((c[0] for c in convs), key=outs.index)
    assert first[0].request.input_ids[:system] == first[1].request.input_ids[:system]
    assert first[0].cached_tokens == 0 and first[1].cached_tokens >= system
    for conv in convs:
        assert len(conv[0].request.input_ids) == system + q
        for prev, cur in zip(conv, conv[1:]):
            history = prev.request.input_ids + prev.output_ids
            assert len(prev.output_ids) == SMALL["multi_turn_output_len"]
            assert cur.request.input_ids[: len(history)] == history
            assert len(cur.request.input_ids) == len(history) + q == cur.prompt_len
            # the previous prompt and answer, all but the answer's last token (its KV was never
            # computed)
            assert cur.cached_tokens >= len(history) - 1
    with pytest.raises(ValueError, match="--multi-turn-token-ids"):
        serving.run(
            bench_args(
                servers["cache"].url,
                tiny_model_dir,
                "--backend",
                "openai",
                "--dataset",
                "multi-turn",
                "--multi-turn-token-ids",
            )
        )


def test_llama_cpp_backend_payload_and_chunks():
    """llama-server's /completion as its source writes the stream (tools/server/server-task.cpp:
    partial chunks carry `content` and `tokens`, the final one `timings` and the counts)."""
    be = LlamaCppBackend()
    body = be.payload(RequestInput([], 4, input_ids=[5, 6, 7]))
    assert body["prompt"] == [5, 6, 7] and body["n_predict"] == 4 and body["return_tokens"]
    assert body["cache_prompt"] and body["stream"] and body["ignore_eos"]
    assert be.payload(RequestInput([{"role": "user", "content": "hi"}], 2))["prompt"] == "hi"
    out, st = RequestOutput(), {}
    assert be.update({"content": " a", "tokens": [11], "stop": False}, out, st) == 1
    assert be.update({"content": " b c", "tokens": [12, 13], "stop": False}, out, st) == 2
    final = {
        "content": "",
        "tokens": [],
        "stop": True,
        "tokens_predicted": 3,
        "tokens_evaluated": 10,
        "timings": {"cache_n": 6, "prompt_n": 4},
    }
    assert be.update(final, out, st) == 0
    assert out.text == " a b c" and out.output_ids == [11, 12, 13]
    assert (out.prompt_len, out.cached_tokens, out.output_len) == (10, 6, 3)


def test_speculation_datasets(servers, tiny_model_dir):
    """grounded: each prompt an edit task followed by a passage of the benchmark's sentences;
    recurring: every agent call sent `repeats` times (its repeats hit the cache)."""
    from radixlm.bench.spec_datasets import SENTENCES, TASKS

    res = serving.run(
        bench_args(
            servers["cache"].url,
            tiny_model_dir,
            "--dataset",
            "grounded",
            grounded_sentences=5,
            grounded_output_len=6,
        )
    )
    assert res["completed"] == SMALL["num_prompts"] and res["errors"] == 0
    for o in res["outputs"]:
        text = o.request.text
        assert sum(s in text for s in SENTENCES) == 5 and any(
            text.startswith(t + ":\n\n") for t in TASKS
        )
        assert 0 < o.output_len <= 6
    res = serving.run(
        bench_args(
            servers["cache"].url,
            tiny_model_dir,
            "--dataset",
            "recurring",
            recurring_num_prompts=3,
            recurring_repeats=3,
            recurring_output_len=5,
            # one at a time: a repeat sent while its first copy's prefill is still in flight (a
            # loaded machine's timing) finds nothing cached yet
            max_concurrency=1,
        )
    )
    assert res["completed"] == 9 and res["errors"] == 0
    counts: dict = {}
    for o in res["outputs"]:
        counts[o.request.text] = counts.get(o.request.text, 0) + 1
    assert sorted(counts.values()) == [3, 3, 3]
    assert res["cached_token_share"] > 0


def test_gsp_cached_share_radix_cache_on_vs_off(servers, tiny_model_dir):
    kw = dict(
        gsp_num_groups=2, gsp_prompts_per_group=4, gsp_system_prompt_len=96, gsp_question_len=8
    )
    cli = ("--dataset", "gsp", "--max-concurrency", "2")
    on = serving.run(bench_args(servers["cache"].url, tiny_model_dir, *cli, **kw))
    off = serving.run(bench_args(servers["nocache"].url, tiny_model_dir, *cli, **kw))
    assert on["completed"] == off["completed"] == 8
    # 2 of 8 prompts compute their group's 96-token prefix; the rest reuse it.
    assert on["cached_token_share"] > 0.5
    assert off["cached_token_share"] == 0.0


def test_cli_writes_json_lines_and_png(servers, tiny_model_dir, tmp_path, capsys):
    from radixlm.cli import main

    out, png = tmp_path / "result.jsonl", tmp_path / "plot.png"
    common = [
        "bench",
        "serving",
        "--base-url",
        servers["cache"].url,
        "--tokenizer",
        tiny_model_dir,
        "--disable-tqdm",
        "--num-prompts",
        "4",
        "--random-input-len",
        "16",
        "--random-output-len",
        "4",
        "--output-file",
        str(out),
    ]
    assert (
        main(
            [
                *common,
                "--backend",
                "openai",
                "--request-rate",
                "50",
                "--seed",
                "3",
                "--plot",
                str(png),
            ]
        )
        == 0
    )
    assert (
        main([*common, "--backend", "radixlm", "--max-concurrency", "1", "--warmup-requests", "0"])
        == 0
    )
    printed = capsys.readouterr().out
    assert "Output throughput (tok/s)" in printed and "TTFT" in printed
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["backend"] for x in lines] == ["openai", "radixlm"]
    for x in lines:
        assert x["completed"] == 4 and x["total_output_tokens"] == 16 and x["errors"] == 0
        assert x["args"]["random_input_len"] == 16 and "outputs" not in x
    assert lines[0]["args"]["request_rate"] == 50.0 and lines[1]["args"]["request_rate"] == "inf"
    assert lines[1]["concurrency"] <= 1.01  # --max-concurrency 1: one request in flight at a time
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_unreachable_server_counts_errors(tiny_model_dir):
    res = serving.run(bench_args("http://127.0.0.1:9", tiny_model_dir, "--backend", "radixlm"))
    assert res["completed"] == 0 and res["errors"] == 3 and res["error_samples"]
    assert res["mean_ttft_ms"] is None and res["cached_token_share"] is None


def test_openai_chunks_llama_server_style():
    """llama-server: cached tokens in usage.prompt_tokens_details or timings.cache_n; missing =
    unknown."""
    be, out, st = OpenAIBackend("m"), RequestOutput(), {}
    assert be.update({"choices": [{"index": 0, "text": "Hi"}]}, out, st) == 1
    assert (
        be.update(
            {"choices": [{"index": 0, "text": ""}], "timings": {"cache_n": 7, "prompt_n": 3}},
            out,
            st,
        )
        == 0
    )
    assert out.text == "Hi" and out.cached_tokens == 7 and out.prompt_len is None
    be.update(
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 10,
                "completion_tokens": 2,
                "prompt_tokens_details": {"cached_tokens": 8},
            },
        },
        out,
        st,
    )
    assert (out.prompt_len, out.output_len, out.cached_tokens) == (10, 2, 8)
    chat, out2 = OpenAIChatBackend("m"), RequestOutput()
    assert (
        chat.update(
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}, out2, {}
        )
        == 0
    )
    assert (
        chat.update(
            {"choices": [{"index": 0, "delta": {"content": "yo"}}], "usage": None}, out2, {}
        )
        == 1
    )
    assert out2.text == "yo" and out2.cached_tokens is None  # never reported: unknown, not 0
    assert parse_sse_line("data: [DONE]") is None and parse_sse_line(": keep-alive") is None
    with pytest.raises(Exception, match="bad schema"):
        parse_sse_line('data: {"error": {"message": "bad schema"}}')


def test_metrics_formulas():
    outs = [
        RequestOutput(
            success=True,
            prompt_len=10,
            output_len=5,
            cached_tokens=4,
            ttft=0.1,
            latency=0.5,
            itl=[0.1] * 4,
        ),
        RequestOutput(
            success=True, prompt_len=30, output_len=1, cached_tokens=None, ttft=0.2, latency=0.2
        ),
        RequestOutput(success=False, error="boom"),
    ]
    res = compute_metrics(outs, duration=2.0)
    assert (res["completed"], res["errors"]) == (2, 1)
    assert res["output_throughput"] == 3.0 and res["input_throughput"] == 20.0
    assert res["mean_tpot_ms"] == pytest.approx(
        100.0
    )  # (0.5 - 0.1) / 4; one-token outputs have none
    assert res["cached_token_share"] == pytest.approx(0.4)  # over the requests that report it
    assert res["mean_ttft_ms"] == pytest.approx(150.0) and res["error_samples"] == ["boom"]


def test_one_batch_matches_engine_greedy(tiny_model_dir, tiny_server, tmp_path):
    from radixlm.config import ServerArgs

    p = argparse.ArgumentParser()
    one_batch.add_args(p)
    args = p.parse_args(
        [
            "--batch-size",
            "1",
            "3",
            "--input-len",
            "20",
            "--output-len",
            "6",
            "--profile",
            "--profile-dir",
            str(tmp_path / "prof"),
            "--output-file",
            str(tmp_path / "ob.jsonl"),
        ]
    )
    server_args = ServerArgs(model_path=tiny_model_dir, num_threads=1, log_level="warning")
    results = one_batch.run(args, server_args)
    assert [r["batch_size"] for r in results] == [1, 3]
    for r in results:
        assert r["decode_steps"] == 5 and r["prefill_throughput"] > 0 and r["decode_throughput"] > 0
        assert r["decode_median_ms"] <= r["decode_p90_ms"]
        assert 0 < r["forward_median_ms"] <= r["decode_median_ms"]
        assert 0 <= r["outside_forward_share"] < 1
        assert r["step_bytes_mb"] > 0 and r["read_gbps"] > 0 and r["roofline_share"] > 0
        assert (
            (tmp_path / "prof" / f"one_batch_bs{r['batch_size']}_in20_out6.txt").read_text().strip()
        )
        assert len(r["output_ids"]) == r["batch_size"] and all(len(t) == 6 for t in r["output_ids"])
    prompts = [
        q.input_ids for q in one_batch.random_prompts(3, 20, 6, results[1]["vocab_size"], seed=0)
    ]
    # The Engine's greedy tokens, served: the run's shared tiny-model server (default options).
    sp = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    r = requests.post(
        tiny_server.url + "/generate",
        json={"input_ids": prompts, "sampling_params": sp},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert [o["output_ids"] for o in r.json()] == results[1]["output_ids"]
    assert results[0]["output_ids"] == results[1]["output_ids"][:1]  # batching changes nothing
    one_batch.main(args, server_args)
    lines = [json.loads(x) for x in (tmp_path / "ob.jsonl").read_text().splitlines()]
    assert [x["batch_size"] for x in lines] == [1, 3] and "output_ids" not in lines[0]


def test_one_batch_shared_prefix_matches_engine_greedy(tiny_model_dir, monkeypatch):
    """--shared-prefix-len: requests start from their group's cached prefix (so decode takes the
    torch backend's shared-prefix attention path) and still give the Engine's greedy tokens for the
    whole prompts."""
    from radixlm.config import ServerArgs
    from radixlm.engine.engine import Engine
    from radixlm.model.layers.attention import shared_prefix_decode_path

    calls = []
    real = shared_prefix_decode_path.shared_prefix_decode
    monkeypatch.setattr(
        shared_prefix_decode_path,
        "shared_prefix_decode",
        lambda *a, **k: calls.append(1) or real(*a, **k),
    )

    p = argparse.ArgumentParser()
    one_batch.add_args(p)
    args = p.parse_args(
        [
            "--batch-size",
            "5",
            "--input-len",
            "7",
            "--output-len",
            "5",
            "--shared-prefix-len",
            "40",
            "--num-groups",
            "2",
        ]
    )
    server_args = ServerArgs(
        model_path=tiny_model_dir, num_threads=1, log_level="warning", attention_backend="torch"
    )
    (res,) = one_batch.run(args, server_args)
    assert res["num_groups"] == 2 and res["shared_prefix_len"] == 40 and res["decode_steps"] == 4
    assert calls  # the decode steps attended to the shared prefixes once per group
    vocab = res["vocab_size"]
    prefixes = [q.input_ids for q in one_batch.random_prompts(2, 40, 1, vocab, seed=1)]
    prompts = [
        prefixes[i % 2] + q.input_ids
        for i, q in enumerate(one_batch.random_prompts(5, 7, 5, vocab, seed=0))
    ]
    with Engine(tiny_model_dir, **engine_args(attention_backend="torch")) as engine:
        sp = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
        outs = engine.generate(input_ids=prompts, sampling_params=sp)
    assert [o["output_ids"] for o in outs] == res["output_ids"]


def _one_answer_per_connection_server():
    """A raw HTTP/1.1 server that promises keep-alive but closes each connection, unanswered, when
    its second request arrives (as llama-server drops idle connections a client pool reuses)."""
    import asyncio

    sse = b'data: {"choices":[{"index":0,"text":"ok"}]}\n\ndata: [DONE]\n\n'
    stats = {"connections": 0, "answered": 0, "dropped": 0}

    async def read_request(reader) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(h.split(b":")[1])
                for h in head.split(b"\r\n")
                if h.lower().startswith(b"content-length")
            ),
            0,
        )
        await reader.readexactly(length)
        return True

    async def handle(reader, writer):
        stats["connections"] += 1
        try:
            await read_request(reader)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: keep-alive\r\n"
                b"Content-Length: %d\r\n\r\n" % len(sse) + sse
            )
            await writer.drain()
            stats["answered"] += 1
            await read_request(reader)
            stats["dropped"] += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    return handle, stats


def test_stale_keepalive_connection_is_retried_not_counted_as_error():
    import asyncio

    import httpx

    from radixlm.bench.serving_client import RequestInput, send_request

    async def main():
        handle, stats = _one_answer_per_connection_server()
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with httpx.AsyncClient() as client:
            outs = [
                await send_request(
                    client, url, OpenAIBackend("m"), RequestInput([{"content": "hi"}], 2), {}
                )
                for _ in range(4)
            ]
        server.close()
        return outs, stats

    outs, stats = asyncio.run(main())
    assert all(o.success and o.text == "ok" for o in outs), [o.error for o in outs]
    assert (
        stats["answered"] == 4 and stats["dropped"] == 3
    )  # requests 2-4 each met a dropped connection first
    assert [o.retries for o in outs] == [0, 1, 1, 1]
    assert compute_metrics(outs, 1.0)["retried_requests"] == 3


def test_request_rejected_with_an_answer_is_not_retried():
    import asyncio

    import httpx

    from radixlm.bench.serving_client import RequestInput, send_request

    calls = []

    def app(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(503, text="overloaded")

    async def main():
        async with httpx.AsyncClient(transport=httpx.MockTransport(app)) as client:
            return await send_request(
                client, "http://x", OpenAIBackend("m"), RequestInput([{"content": "hi"}], 2), {}
            )

    out = asyncio.run(main())
    assert (
        not out.success
        and out.error.startswith("HTTP 503")
        and len(calls) == 1
        and out.retries == 0
    )
