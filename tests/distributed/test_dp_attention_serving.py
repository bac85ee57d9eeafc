"""`radixlm serve --tp-size 2 --dp-size 2 --enable-dp-attention --ep-size 2` on a tiny random
DeepSeek-V3 through the official openai client: two concurrent completions give transformers'
greedy text and ran on different ranks (/get_server_info's per-rank state), a bad request is a 400
naming the field and the server keeps serving; then rank 1 is killed while a request streams on
rank 0: the request ends with a 503 at once, /health turns 503, the server exits 1 and no process
is left behind."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import psutil
import pytest
import requests
import torch

from radixlm.server.process import ServerProcess
from tests.model.deepseek_refs import save_hf
from tests.server_faults import health_status, stream_events, wait_until


def test_dp_attention_server(tmp_path_factory, default_model_path):
    path, hf, _ = save_hf("v3", tmp_path_factory.mktemp("dp-serve-v3"), default_model_path)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (14, 23)]
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            refs = [
                hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False)[
                    0, len(p) :
                ].tolist()
                for p in prompts
            ]
    finally:
        torch.set_num_threads(n)
    s = ServerProcess(
        "--model-path",
        path,
        "--tp-size",
        "2",
        "--dp-size",
        "2",
        "--enable-dp-attention",
        "--ep-size",
        "2",
        "--num-threads",
        "1",
        "--kv-memory-gb",
        "0.02",
        "--enable-invariant-checks",
        "--engine-failure-exit-delay",
        "0.5",
    )
    kids = psutil.Process(s.proc.pid).children(recursive=True)
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=120)
        model = client.models.list().data[0].id

        def complete(p):
            return client.completions.create(
                model=model, prompt=p, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
            )

        with ThreadPoolExecutor(2) as pool:
            outs = list(pool.map(complete, prompts))
        from radixlm.model.loader import load_tokenizer

        tok = load_tokenizer(path)
        assert [o.choices[0].text for o in outs] == [
            tok.decode(r, skip_special_tokens=True) for r in refs
        ]
        info = requests.get(s.url + "/get_server_info", timeout=10).json()
        assert info["enable_dp_attention"] and info["dp_size"] == 2
        ranks = info["internal_state"]["dp_ranks"]
        assert sorted(r["prompt_tokens"] for r in ranks) == [14, 23]  # one request on each rank
        # decode steps' tokens (each request's first came from its prefill), counted per rank and
        # summed
        assert [r["generated_tokens"] for r in ranks] == [11, 11] and info["internal_state"][
            "generated_tokens"
        ] == 22
        with pytest.raises(openai.BadRequestError, match="max_tokens"):
            client.completions.create(model=model, prompt=prompts[0], max_tokens=-1)
        assert complete(prompts[0]).choices[0].text == outs[0].choices[0].text  # still serving
        assert requests.post(s.url + "/flush_cache", timeout=10).status_code == 200

        # A request streaming on rank 0 (every rank idle: the dispatcher's lowest), then rank 1
        # dies.
        stream: dict = {}
        body = {
            "input_ids": prompts[1],
            "sampling_params": {"max_new_tokens": 400, "ignore_eos": True},
        }
        t = threading.Thread(target=stream_events, args=(s.url, body, stream))
        t.start()
        assert wait_until(lambda: stream.get("started"), 30)
        killed = time.monotonic()
        os.kill(ranks[1]["pid"], signal.SIGKILL)
        assert wait_until(lambda: health_status(s.url) != 200, 5.0), (
            "/health still 200 after a rank died"
        )
        t.join(timeout=20)
        assert not t.is_alive() and stream["ended"] - killed < 5.0, "the streaming request hung"
        last = json.loads(stream["events"][-2])  # the error event, then [DONE]
        assert last["error"]["code"] == 503 and "scheduler rank" in last["error"]["message"]
        assert s.proc.wait(timeout=30) == 1
        _, alive = psutil.wait_procs(kids, timeout=15)
        assert not alive, alive
    finally:
        s.stop()
