"""radixlm.lang programs end to end on the default model, through both backends: the native HTTP
endpoint (one server for the module) and the in-process Engine (started after the server stops)."""

import pytest
import requests

import radixlm.lang as sgl
from tests.conftest import engine_args

FEW_SHOT = "Q: What is 2+2?\nA: 4\n\nQ: What is the capital of France?\nA: Paris\n\n"
CHOICES = [" True", " False", " Unknown"]


@sgl.function
def few_shot_qa(s, question):
    s += FEW_SHOT
    s += "Q: " + question + "\nA:" + sgl.gen("answer", max_tokens=16, stop="\n")


@sgl.function
def two_turn_chat(s):
    s += sgl.system("You are a terse assistant.")
    s += sgl.user("Name a color.")
    s += sgl.assistant(sgl.gen("a1", max_tokens=8))
    s += sgl.user_begin() + "Name another one." + sgl.user_end()
    s += sgl.assistant_begin()
    s += sgl.gen("a2", max_tokens=8)
    s += sgl.assistant_end()


@sgl.function
def true_false(s, statement):
    s += "Statement: " + statement + "\nIs the statement true? Answer True, False or Unknown.\nAnswer:"
    s += sgl.select("verdict", choices=CHOICES)


@sgl.function
def legs(s):
    s += "Q: How many legs does a spider have?\nA: " + sgl.gen("n", dtype=int, max_tokens=4)


@sgl.function
def fruits(s):
    s += "Here are four fruit names, one per branch. This introduction is shared by every branch.\n"
    forks = s.fork(4)
    for i, f in enumerate(forks):
        f += f"Fruit {i + 1}:" + sgl.gen("fruit", max_tokens=6, stop="\n")
    forks.join()


@pytest.fixture(scope="module", params=["http", "engine"])
def backend(request):
    if request.param == "http":
        from tests.e2e.conftest import ServerProcess

        server = ServerProcess()
        be = sgl.RuntimeEndpoint(server.url)
        yield be
        server.stop()
    else:
        be = sgl.EngineBackend(None, **engine_args(kv_memory_gb=0.2, debug_memory_check=False))
        yield be
        be.shutdown()


def raw(backend, body):
    """A /generate call made directly (not through the lang backend's helpers)."""
    if isinstance(backend, sgl.RuntimeEndpoint):
        r = requests.post(backend.base_url + "/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()
    return backend.engine.generate(body["text"], body["sampling_params"], return_logprob=body.get("return_logprob", False),
                                   logprob_start_len=body.get("logprob_start_len", -1))


def test_few_shot_qa_with_stop(backend):
    s = few_shot_qa.run("What is the capital of Italy?", backend=backend, temperature=0)
    ans = s["answer"]
    assert "\n" not in ans and ans.strip()
    assert s.text() == FEW_SHOT + "Q: What is the capital of Italy?\nA:" + ans
    meta = s.get_meta_info("answer")
    assert meta["finish_reason"]["type"] in ("stop", "length")
    # The same request sent by hand gives the same greedy answer.
    prompt = FEW_SHOT + "Q: What is the capital of Italy?\nA:"
    ref = raw(backend, {"text": prompt, "sampling_params": {"max_new_tokens": 16, "stop": "\n", "temperature": 0}})
    assert ref["text"] == ans


def test_two_turn_chat_uses_the_chat_template(backend):
    s = two_turn_chat.run(backend=backend, temperature=0)
    msgs = s.messages()
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    assert msgs[1]["content"] == "Name a color." and msgs[3]["content"] == "Name another one."
    assert msgs[2]["content"] == s["a1"] and msgs[4]["content"] == s["a2"]
    tok = backend.tokenizer
    rendered = tok.apply_chat_template(msgs, tokenize=False)
    assert s.text() == rendered


def test_select_is_argmax_of_mean_prompt_logprobs(backend):
    s = true_false.run("The sky is blue on a clear day.", backend=backend)
    prefix = "Statement: The sky is blue on a clear day.\nIs the statement true? Answer True, False or Unknown.\nAnswer:"
    n = raw(backend, {"text": prefix, "sampling_params": {"max_new_tokens": 0}})["meta_info"]["prompt_tokens"]
    scores = []
    for c in CHOICES:
        out = raw(backend, {"text": prefix + c, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
                            "logprob_start_len": n})
        lps = [e[0] for e in out["meta_info"]["input_token_logprobs"]]
        assert lps
        scores.append(sum(lps) / len(lps))
    assert s["verdict"] == CHOICES[max(range(3), key=scores.__getitem__)]
    assert s.text() == prefix + s["verdict"]
    got = s.get_meta_info("verdict")["normalized_prompt_logprobs"]
    assert got == pytest.approx(scores, abs=1e-3)


def test_select_other_methods(backend):
    for method in ("greedy_token_selection", "unconditional_likelihood_normalized"):
        @sgl.function
        def prog(s):
            s += "The opposite of hot is" + sgl.select("w", choices=[" cold", " warm", " blue"], choices_method=method)

        s = prog.run(backend=backend)
        assert s["w"] in (" cold", " warm", " blue")
        assert len(s.get_meta_info("w")["normalized_prompt_logprobs"]) == 3


def test_int_via_regex(backend):
    s = legs.run(backend=backend, temperature=0)
    assert s["n"].lstrip("+-").isdigit()
    int(s["n"])


def test_fork_join_hits_the_cache(backend):
    s = fruits.run(backend=backend, temperature=0)
    prefix_tokens = s.fork_prefill_meta["prompt_tokens"]
    metas = s.get_meta_info("fruit")
    assert len(s["fruit"]) == 4 and len(metas) == 4
    for m in metas:
        assert m["cached_tokens"] >= prefix_tokens
    assert all("\n" not in f for f in s["fruit"])


def test_run_batch_keeps_order(backend):
    qs = ["What is 1+1?", "What is the capital of Italy?", "What is 5+5?", "What color is grass?"]
    states = few_shot_qa.run_batch([{"question": q} for q in qs], backend=backend, temperature=0, num_threads=4)
    assert [st.text().split("Q: ")[-1].split("\n")[0] for st in states] == qs
    alone = [few_shot_qa.run(q, backend=backend, temperature=0)["answer"] for q in qs]
    assert [st["answer"] for st in states] == alone


def test_stream_text_iter(backend):
    s = few_shot_qa.run("What is 3+3?", backend=backend, temperature=0, stream=True)
    chunks = list(s.text_iter("answer"))
    assert "".join(chunks) == s["answer"]
