"""The OpenAI backend against radixlm's own /v1 server (same server, native backend as the
reference), its error paths against a mock server that ignores what it does not know, and the
Runtime's process lifecycle."""

import json
import os
import signal

import httpx
import jsonschema
import psutil
import pytest
import requests

import radixlm.lang as sgl
from tests.forked_servers import exec_servers

YES_NO = ["Yes", "No"]
CHOICES = [" True", " False", " Unknown"]


@sgl.function
def two_turn_chat(s):
    s += sgl.system("You are a terse assistant.")
    s += sgl.user("Name a color.")
    s += sgl.assistant(sgl.gen("a1", max_tokens=8))
    s += sgl.user("Name another one.")
    s += sgl.assistant(sgl.gen("a2", max_tokens=8))


@sgl.function
def chat_then_select(s, method=None):
    s += sgl.user("Is the sun hot? Answer Yes or No.")
    s += sgl.assistant(sgl.select("yn", choices=YES_NO, choices_method=method))


@sgl.function
def true_false(s, statement, method="token_length_normalized"):
    s += (
        "Statement: "
        + statement
        + "\nIs the statement true? Answer True, False or Unknown.\nAnswer:"
    )
    s += sgl.select("verdict", choices=CHOICES, choices_method=method)


@pytest.fixture(scope="module")
def runtime():
    rt = sgl.Runtime(kv_memory_gb=0.3, enable_invariant_checks=True)
    yield rt
    rt.shutdown()


def test_chat_program_matches_the_native_backend(runtime):
    oa = sgl.OpenAI(base_url=runtime.url + "/v1")  # model: the server's first (only) model
    s = two_turn_chat.run(backend=oa, temperature=0)
    ref = two_turn_chat.run(backend=runtime, temperature=0)
    assert (
        s.messages() == ref.messages()
    )  # the server's chat template = the one the native text used
    assert [m["role"] for m in s.messages()] == ["system", "user", "assistant", "user", "assistant"]
    assert s.text() == ref.text()
    assert s.get_meta_info("a2")["prompt_tokens"] > s.get_meta_info("a1")["prompt_tokens"]


def test_chat_select_ranks_first_tokens(runtime):
    oa = sgl.OpenAI(base_url=runtime.url + "/v1")
    s = chat_then_select.run(backend=oa)
    # "Yes" and "No" are one token each: greedy token selection on the native backend compares
    # exactly the same first-token logprobs.
    g = chat_then_select.run("greedy_token_selection", backend=runtime)
    assert s["yn"] == g["yn"] and s.text() == g.text()
    assert s.get_meta_info("yn")["first_token_logprobs"] == pytest.approx(
        [lp[0] for lp in g.get_meta_info("yn")["choice_logprobs"]], abs=1e-3
    )


@pytest.mark.parametrize("method", ["token_length_normalized", "greedy_token_selection"])
def test_completion_select_matches_the_native_scores(runtime, method):
    oa = sgl.OpenAI(base_url=runtime.url + "/v1", is_chat_model=False)
    s = true_false.run("Fire is cold.", method, backend=oa)
    ref = true_false.run("Fire is cold.", method, backend=runtime)
    assert s["verdict"] == ref["verdict"]
    assert s.get_meta_info("verdict")["normalized_prompt_logprobs"] == pytest.approx(
        ref.get_meta_info("verdict")["normalized_prompt_logprobs"], abs=1e-3
    )
    # Healing through echo offsets: "Answer: " + "True" is scored as " True".
    healed = sgl.function(
        lambda s: s.__iadd__("Is fire hot? Answer: " + sgl.select("v", choices=["True", "False"]))
    )
    plain = sgl.function(
        lambda s: s.__iadd__("Is fire hot? Answer:" + sgl.select("v", choices=[" True", " False"]))
    )
    assert healed.run(backend=oa).get_meta_info("v")["normalized_prompt_logprobs"] == pytest.approx(
        plain.run(backend=oa).get_meta_info("v")["normalized_prompt_logprobs"], abs=1e-4
    )


def test_constrained_gen_through_extra_fields_and_response_format(runtime):
    schema = {
        "type": "object",
        "properties": {"color": {"type": "string", "maxLength": 12}},
        "required": ["color"],
        "additionalProperties": False,
    }

    @sgl.function
    def prog(s):
        s += sgl.user("Name a color and a number.")
        s += sgl.assistant(sgl.gen("json", max_tokens=32, json_schema=schema))
        s += sgl.user("Now a number.")
        s += sgl.assistant(sgl.gen("n", dtype=int, max_tokens=4))

    s = prog.run(backend=sgl.OpenAI(base_url=runtime.url + "/v1"), temperature=0)
    jsonschema.validate(json.loads(s["json"]), schema)
    int(s["n"])


def _mock_openai(handler) -> "sgl.OpenAI":
    client = httpx.Client(transport=httpx.MockTransport(handler))
    return sgl.OpenAI(
        "mock-model",
        base_url="http://mock/v1",
        api_key="k",
        http_client=client,
        is_chat_model=False,
    )


def test_clear_errors_where_the_server_cannot():
    def ignores_everything(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if body.get("echo"):
            return httpx.Response(
                400, json={"error": {"message": "echo is not supported", "type": "invalid_request"}}
            )
        return httpx.Response(
            200,
            json={
                "id": "x",
                "object": "text_completion",
                "created": 0,
                "model": "mock-model",
                "choices": [
                    {
                        "index": 0,
                        "text": "not a number",
                        "finish_reason": "length",
                        "logprobs": None,
                    }
                ],
            },
        )

    be = _mock_openai(ignores_everything)
    with pytest.raises(RuntimeError, match="regex"):
        sgl.function(lambda s: s.__iadd__("n = " + sgl.gen("n", dtype=int))).run(backend=be)
    with pytest.raises(RuntimeError, match="json_schema"):
        sgl.function(lambda s: s.__iadd__(sgl.gen("j", json_schema={"type": "object"}))).run(
            backend=be
        )
    with pytest.raises(RuntimeError, match="prompt logprobs"):
        sgl.function(lambda s: s.__iadd__("A:" + sgl.select("c", choices=[" x", " y"]))).run(
            backend=be
        )
    with pytest.raises(ValueError, match="native radixlm backend"):
        sgl.function(lambda s: s.__iadd__(sgl.gen("g", return_logprob=True))).run(backend=be)
    with pytest.raises(ValueError, match="native radixlm backend"):
        true_false.run("x", "unconditional_likelihood_normalized", backend=be)
    chat = sgl.OpenAI(
        "mock-model",
        base_url="http://mock/v1",
        api_key="k",
        http_client=httpx.Client(transport=httpx.MockTransport(ignores_everything)),
    )
    with pytest.raises(ValueError, match="inside assistant"):
        sgl.function(lambda s: s.__iadd__("no roles " + sgl.gen("g"))).run(backend=chat)


def test_runtime_stops_its_server_and_children(tiny_model_dir):
    with exec_servers():  # exec'd, as outside the tests: its command line is read below
        rt = sgl.Runtime(
            str(tiny_model_dir),
            kv_memory_gb=0.05,
            enable_invariant_checks=True,
            api_key="rt-user-key",
            admin_api_key="rt-admin-key",
        )
    server = psutil.Process(rt.process.proc.pid)
    children = server.children(recursive=True)
    assert len(children) >= 2  # scheduler and detokenizer
    # The server's ipc socket directory: where its processes' sockets are bound (other servers, of
    # other test workers, make theirs under the same temporary directory meanwhile).
    mine = {
        os.path.dirname(c.laddr)
        for p in [server, *children]
        for c in p.net_connections(kind="unix")
        if c.laddr and os.path.basename(os.path.dirname(c.laddr)).startswith("radixlm-")
    }
    assert mine and all(os.path.isdir(d) for d in mine)
    # The keys reach the server through its environment, not its command line (public in `ps`).
    assert not any("rt-" in " ".join(p.cmdline()) for p in [server, *children])
    assert requests.post(rt.url + "/flush_cache", timeout=10).status_code == 401
    rt.flush_cache()  # an admin action: with the admin key
    out = sgl.function(
        lambda s: s.__iadd__("Hello" + sgl.gen("g", max_tokens=3, ignore_eos=True))
    ).run(backend=rt)
    assert out.get_meta_info("g")["completion_tokens"] == 3
    rt.shutdown()
    # Exited through its SIGTERM handler, which runs the cleanup (not the SIGKILL fallback: -9).
    assert rt.process.proc.poll() == 128 + signal.SIGTERM
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive
    assert not any(os.path.exists(d) for d in mine)  # removed on the way out
    with pytest.raises(ValueError, match="unknown server option"):
        sgl.Runtime(str(tiny_model_dir), not_an_option=1)
