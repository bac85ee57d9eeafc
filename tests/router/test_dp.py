"""`radixlm serve --dp 2`: one command, one endpoint (the router in front of two servers), every
API through it, the language's RuntimeEndpoint and the openai client unchanged, and a clean stop
of every process. Each replica is a TP group of 2 (`--dp 2 --tp-size 2`): the router sees one worker
per replica, spreads concurrent requests over both and they answer with TP=1's greedy tokens."""

import json
import re
from concurrent.futures import ThreadPoolExecutor

import openai
import psutil
import requests

import radixlm.lang as sgl
from radixlm.server.dp import core_shares
from radixlm.server.process import ServerProcess

KEY = "dp-secret"


def test_core_shares():
    assert core_shares(2, [0, 1]) == [[0], [1]]
    assert core_shares(2, [0, 1, 2, 3, 4]) == [[0, 1, 2], [3, 4]]
    assert core_shares(3, [0, 1]) == [[0], [1], [0]]


@sgl.function
def chat_then_number(s):
    s += sgl.user("Say hello.")
    s += sgl.assistant(sgl.gen("hello", max_tokens=8))
    s += sgl.user("How many legs does a spider have?")
    s += sgl.assistant(sgl.gen("n", dtype=int, max_tokens=4))


PROMPTS = [f"{p} (take {k})" for k in range(2) for p in ("The capital of France is", "def fib(n):")]
GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}


def test_serve_dp_two_is_one_endpoint(tiny_model_dir, tiny_engine):
    want = [o["output_ids"] for o in tiny_engine.generate(PROMPTS, GREEDY)]  # TP=1, no router
    srv = ServerProcess(
        "--dp",
        "2",
        "--tp-size",
        "2",
        "--num-threads",
        "1",
        "--model-path",
        tiny_model_dir,
        "--kv-memory-gb",
        "0.05",
        "--api-key",
        KEY,
        "--enable-invariant-checks",
    )
    try:
        children = psutil.Process(srv.proc.pid).children(recursive=True)
        servers = [c for c in children if "serve" in c.cmdline()]
        assert len(servers) >= 2  # two servers (and their scheduler / detokenizer processes)
        auth = {"Authorization": f"Bearer {KEY}"}
        workers = requests.get(srv.url + "/list_workers", headers=auth, timeout=5).json()["workers"]
        assert len(workers) == 2 and all(w["healthy"] for w in workers)
        body = {"text": "Hello there", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
        out = requests.post(srv.url + "/generate", json=body, headers=auth, timeout=60)
        assert out.status_code == 200 and out.json()["meta_info"]["completion_tokens"] == 8
        with requests.post(
            srv.url + "/generate",
            json={**body, "stream": True},
            headers=auth,
            stream=True,
            timeout=60,
        ) as r:
            events = [
                line
                for line in r.iter_lines()
                if line.startswith(b"data: ") and line != b"data: [DONE]"
            ]
        assert len(events) > 1 and json.loads(events[-1][6:])["text"] == out.json()["text"]
        assert requests.post(srv.url + "/generate", json=body, timeout=10).status_code == 401
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY)
        model = client.models.list().data[0].id
        assert (
            client.completions.create(
                model=model, prompt="Hi", max_tokens=4, temperature=0
            ).usage.completion_tokens
            == 4
        )
        state = chat_then_number.run(
            backend=sgl.RuntimeEndpoint(srv.url, api_key=KEY), temperature=0
        )
        assert re.fullmatch(r"-?\d+", state["n"]) and isinstance(
            state["hello"], str
        )  # dtype=int: an integer's text
        info = requests.get(srv.url + "/get_server_info", headers=auth, timeout=10).json()
        assert sorted(info["workers"]) == sorted(w["url"] for w in workers)
        assert all(v["status"] == 200 for v in info["workers"].values())
        assert [v["body"]["tp_size"] for v in info["workers"].values()] == [2, 2]
        # sent together, the requests spread over both replicas (least loaded)
        one = {"sampling_params": GREEDY}
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            got = pool.map(
                lambda text: requests.post(
                    srv.url + "/generate", json={**one, "text": text}, headers=auth, timeout=120
                ).json()["output_ids"],
                PROMPTS,
            )
        assert list(got) == want
        workers = requests.get(srv.url + "/list_workers", headers=auth, timeout=5).json()["workers"]
        assert len(workers) == 2 and all(w["routed"] >= 1 for w in workers), workers
    finally:
        code = srv.stop()
    assert code is not None
    gone = psutil.wait_procs(children, timeout=30)[1]
    assert not gone, f"processes left after the stop: {[p.pid for p in gone]}"
