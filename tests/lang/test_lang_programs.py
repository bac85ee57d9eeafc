"""radixlm.lang programs end to end on the default model, through both backends: the native HTTP
endpoint (one server for the module) and the in-process Engine (started after the server stops)."""

import importlib
import json
import re
import sys
from pathlib import Path

import jsonschema
import pytest
import requests

import radixlm.lang as sgl
from radixlm.lang.ir import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR
from tests.conftest import engine_args

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example(name: str):
    """An example script as a module (they import their sibling _backend.py)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module(name)


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
def legs(s):
    s += "Q: How many legs does a spider have?\nA: " + sgl.gen("n", dtype=int, max_tokens=4)


@pytest.fixture(scope="module", params=["http", "engine"])
def backend(request):
    if request.param == "http":
        be = sgl.Runtime(
            kv_memory_gb=0.3, enable_invariant_checks=True
        )  # a server process of its own, over the native HTTP API
        yield be
        be.shutdown()
    else:
        be = sgl.EngineBackend(None, **engine_args(kv_memory_gb=0.2))
        yield be
        be.shutdown()


def raw(backend, body):
    """A /generate call made directly (not through the lang backend's helpers)."""
    if isinstance(backend, sgl.RuntimeEndpoint):
        r = requests.post(backend.base_url + "/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()
    return backend.engine.generate(
        body.get("text"),
        body["sampling_params"],
        input_ids=body.get("input_ids"),
        return_logprob=body.get("return_logprob", False),
        logprob_start_len=body.get("logprob_start_len", -1),
        top_logprobs_num=body.get("top_logprobs_num", 0),
    )


def test_few_shot_qa_with_stop(backend):
    s = few_shot_qa.run("What is the capital of Italy?", backend=backend, temperature=0)
    ans = s["answer"]
    assert "\n" not in ans and ans.strip()
    assert s.text() == FEW_SHOT + "Q: What is the capital of Italy?\nA:" + ans
    meta = s.get_meta_info("answer")
    assert meta["finish_reason"]["type"] in ("stop", "length")
    # The same request sent by hand gives the same greedy answer.
    prompt = FEW_SHOT + "Q: What is the capital of Italy?\nA:"
    ref = raw(
        backend,
        {"text": prompt, "sampling_params": {"max_new_tokens": 16, "stop": "\n", "temperature": 0}},
    )
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


def _prompt_logprobs(backend, text: str, start: int) -> list[float]:
    out = raw(
        backend,
        {
            "text": text,
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True,
            "logprob_start_len": start,
        },
    )
    return [e[0] for e in out["meta_info"]["input_token_logprobs"] if e[0] is not None]


@pytest.mark.parametrize(
    "method",
    ["token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized"],
)
def test_select_picks_the_best_score_computed_from_generate(backend, method):
    @sgl.function
    def prog(s, statement):
        s += (
            "Statement: "
            + statement
            + "\nIs the statement true? Answer True, False or Unknown.\nAnswer:"
        )
        s += sgl.select("verdict", choices=CHOICES, choices_method=method)

    s = prog.run("The sky is blue on a clear day.", backend=backend)
    prefix = (
        "Statement: The sky is blue on a clear day.\nIs the statement true? Answer True, False or"
        " Unknown.\nAnswer:"
    )
    n = raw(backend, {"text": prefix, "sampling_params": {"max_new_tokens": 0}})["meta_info"][
        "prompt_tokens"
    ]
    cond = [_prompt_logprobs(backend, prefix + c, n) for c in CHOICES]
    assert all(cond)
    mean = lambda xs: sum(xs) / len(xs)
    if method == "token_length_normalized":
        scores = [mean(lp) for lp in cond]
    elif (
        method == "greedy_token_selection"
    ):  # token by token, as greedy decoding would compare them
        width = max(map(len, cond))
        scores = [tuple(lp + [mean(lp)] * (width - len(lp))) for lp in cond]
    else:  # each token's logprob minus its logprob with no context (after the start token only)
        tok = backend.tokenizer
        start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        uncond = []
        for c in CHOICES:
            ids = tok.encode(prefix + c)
            assert ids[:n] == tok.encode(prefix)  # no token straddles prefix and choice here
            out = raw(
                backend,
                {
                    "input_ids": [start] + ids[n:],
                    "sampling_params": {"max_new_tokens": 0},
                    "return_logprob": True,
                    "logprob_start_len": 1,
                },
            )
            uncond.append([e[0] for e in out["meta_info"]["input_token_logprobs"]])
        assert len(cond) == len(uncond) == len(CHOICES) and all(
            len(lp) == len(u) for lp, u in zip(cond, uncond)
        )
        scores = [mean([a - b for a, b in zip(lp, u)]) for lp, u in zip(cond, uncond)]
    assert s["verdict"] == CHOICES[max(range(3), key=scores.__getitem__)]
    assert s.text() == prefix + s["verdict"]
    meta = s.get_meta_info("verdict")
    assert meta["normalized_prompt_logprobs"] == pytest.approx([mean(lp) for lp in cond], abs=1e-3)
    if method == "unconditional_likelihood_normalized":
        assert meta["unconditional_normalized_logprobs"] == pytest.approx(scores, abs=1e-3)


def test_select_heals_the_token_boundary(backend):
    """ "Answer: " + "True" is scored as the model sees it: the space joins the choice's first
    token, so the scores equal those of "Answer:" + " True"."""

    @sgl.function
    def prog(s, prefix, choices):
        s += "Is fire hot? Answer True or False.\n" + prefix + sgl.select("v", choices=choices)

    healed = prog.run("Answer: ", ["True", "False"], backend=backend)
    plain = prog.run("Answer:", [" True", " False"], backend=backend)
    assert healed.get_meta_info("v")["healed_tokens"] == [1, 1]
    assert plain.get_meta_info("v")["healed_tokens"] == [0, 0]
    assert healed.get_meta_info("v")["normalized_prompt_logprobs"] == pytest.approx(
        plain.get_meta_info("v")["normalized_prompt_logprobs"], abs=1e-4
    )
    assert healed["v"] == plain["v"].lstrip()
    assert healed.text() == "Is fire hot? Answer True or False.\nAnswer: " + healed["v"]


def test_int_via_regex(backend):
    s = legs.run(backend=backend, temperature=0)
    assert re.fullmatch(REGEX_INT, s["n"]), s["n"]
    assert s.get_meta_info("n")["completion_tokens"] <= 4


@pytest.mark.parametrize(
    "dtype,parse,question",
    [
        (int, int, "How many legs does a cat have?"),
        (float, float, "What is pi, to two decimals?"),
        (bool, {"True": True, "False": False}.__getitem__, "Is water wet? Answer True or False."),
        (str, json.loads, 'What is the capital of France? Answer in double quotes, like "London".'),
    ],
)
def test_dtype_gen(backend, dtype, parse, question):
    @sgl.function
    def prog(s):
        s += "Q: " + question + "\nA: " + sgl.gen("v", dtype=dtype, max_tokens=12)

    s = prog.run(backend=backend, temperature=0)
    value = s["v"]
    # The dtype's regex holds and the text parses back to the type (str is a quoted string).
    assert re.fullmatch(
        {int: REGEX_INT, float: REGEX_FLOAT, bool: REGEX_BOOL, str: REGEX_STR}[dtype], value
    ), value
    assert isinstance(parse(value), dtype)


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_json_via_regex_pieces_and_json_schema(backend):
    @sgl.function
    def pieces(s):
        s += "Describe Alice, aged 30, as JSON.\n"
        s += '{\n  "name": "' + sgl.gen("name", max_tokens=8, regex=r"[A-Za-z ]{1,16}") + '",\n'
        s += (
            '  "age": '
            + sgl.gen("age", max_tokens=4, regex=r"(120|1[01][0-9]|[1-9]?[0-9])")
            + "\n}"
        )

    @sgl.function
    def whole(s):
        s += sgl.user("Describe Alice, aged 30, as JSON with name and age.")
        s += sgl.assistant(sgl.gen("json", max_tokens=48, json_schema=PERSON))

    a = pieces.run(backend=backend, temperature=0)
    obj = json.loads(a.text().split("\n", 1)[1])
    jsonschema.validate(obj, PERSON)
    assert obj == {"name": a["name"], "age": int(a["age"])}
    b = whole.run(backend=backend, temperature=0)
    jsonschema.validate(json.loads(b["json"]), PERSON)


def test_tool_use_with_a_stop_string(backend):
    calls = []

    def calculator(expr):
        calls.append(expr)
        return "4"

    @sgl.function
    def tool_use(s):
        s += (
            "Use the calculator like this: calc[3 + 5] gives 8.\n"
            "Question: what is 2 + 2?\nAction: calc[" + sgl.gen("expr", max_tokens=12, stop="]")
        )
        s += (
            "]\nResult: "
            + calculator(s["expr"])
            + "\nAnswer:"
            + sgl.gen("answer", max_tokens=8, stop="\n")
        )

    s = tool_use.run(backend=backend, temperature=0)
    assert "]" not in s["expr"] and calls == [s["expr"]]
    meta = s.get_meta_info("expr")
    assert (
        meta["finish_reason"] == {"type": "stop", "matched": "]"}
        or meta["finish_reason"]["type"] == "length"
    )
    assert s.text().endswith("]\nResult: 4\nAnswer:" + s["answer"])


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "name": "add",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
}  # a bare function


def test_gen_with_tools_returns_the_parsed_calls(backend):
    """gen(tools=...): the variable holds the calls, each valid for its tool's schema, whether the
    model must call (required, a named function) or may (auto, in the Hermes format)."""

    @sgl.function
    def agent(s, choice, parser=None, parallel=True):
        s += sgl.system(
            "You can call get_weather(city, unit) and add(a, b). Answer with tool calls."
        )
        s += sgl.user("What is the weather in Paris, in celsius? And what is 2 + 3?")
        s += sgl.assistant(
            sgl.gen(
                "calls",
                max_tokens=64,
                tools=[WEATHER, ADD],
                tool_choice=choice,
                tool_call_parser=parser,
                parallel_tool_calls=parallel,
            )
        )

    schemas = {"get_weather": WEATHER["function"]["parameters"], "add": ADD["parameters"]}
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        s = agent.run(choice, backend=backend, temperature=0)
        calls = s["calls"]
        assert calls and all(set(c) == {"name", "arguments"} for c in calls), calls
        for c in calls:
            jsonschema.validate(c["arguments"], schemas[c["name"]])
        if isinstance(choice, dict):
            assert {c["name"] for c in calls} == {"add"}
        # What the model wrote is the JSON array the calls were read from.
        assert [{"name": c["name"], "parameters": c["arguments"]} for c in calls] == json.loads(
            s.text().split("assistant\n")[-1].split("<|im_end|>")[0]
        )
    one = agent.run("required", parallel=False, backend=backend, temperature=0)
    assert len(one["calls"]) == 1
    # auto: the model may write text; whatever calls it opens are complete and valid.
    auto = agent.run("auto", "hermes", backend=backend, temperature=0)
    for c in auto["calls"]:
        jsonschema.validate(c["arguments"], schemas[c["name"]])
    written = auto.text().split("assistant\n")[-1].split("<|im_end|>")[0]
    content = auto.get_meta_info("calls")["content"]
    if auto["calls"]:  # the content is what the model wrote outside its calls
        assert all(c["name"] in written for c in auto["calls"]) and "<tool_call>" not in content
    else:
        assert content == written
    with pytest.raises(ValueError, match="tool_call_parser"):
        sgl.gen("x", tools=[WEATHER], tool_choice="auto")
    with pytest.raises(ValueError, match="not among the tools"):
        sgl.gen(
            "x", tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}
        )


def test_react_loop_mixes_gen_and_select(backend):
    react_tools = _example("react_tools")
    s = react_tools.react.run(
        "How long is the Nile in metres?", max_steps=2, backend=backend, temperature=0
    )
    steps = 0
    for step in range(2):
        if f"action_{step}" not in s:
            break
        steps += 1
        action = s[f"action_{step}"]
        assert action in react_tools.ACTIONS and s[f"thought_{step}"].strip()
        if action.strip() != "finish":  # the program ran the tool on what the model chose
            tool = react_tools.TOOLS[action.strip()]
            assert s[f"observation_{step}"] == tool(s[f"input_{step}"])
    assert steps >= 1 and s.text().startswith(react_tools.INSTRUCTIONS)


LONG_PREFIX = "Background notes, shared by every branch.\n" + "".join(
    f"Note {i}: the warehouse in district {i} stores {i * 7 % 50} crates of apples and {i * 3 % 20}"
    " of pears.\n"
    for i in range(20)
)


@sgl.function
def four_branches(s):
    s += LONG_PREFIX
    forks = s.fork(4)
    for i, f in enumerate(forks):
        f += f"Summary {i + 1}:" + sgl.gen("summary", max_tokens=4)
    forks.join()


def test_fork_sends_the_shared_prefix_once(backend):
    backend.flush_cache()
    s = four_branches.run(backend=backend, temperature=0)
    prefix_tokens = s.fork_prefill_meta["prompt_tokens"]
    assert prefix_tokens >= 500
    metas = s.get_meta_info("summary")
    assert len(s["summary"]) == 4 and len(metas) == 4
    assert all(m["cached_tokens"] >= prefix_tokens for m in metas), [
        m["cached_tokens"] for m in metas
    ]
    # Without pre-caching, the branches race for the prefix: one of them computes it.
    backend.flush_cache()
    t = four_branches.run(backend=backend, temperature=0, precache=False)
    assert t.fork_prefill_meta is None
    cold = [m["cached_tokens"] for m in t.get_meta_info("summary")]
    assert min(cold) < prefix_tokens, cold
    assert t["summary"] == s["summary"]


def test_run_batch_32_in_order_with_progress_bar_and_a_failing_program(backend, capsys):
    @sgl.function
    def qa(s, i):
        if i == 13:
            raise ValueError("program 13 fails")
        s += FEW_SHOT + f"Q: What is {i} plus 1?\nA:" + sgl.gen("answer", max_tokens=4, stop="\n")

    states = qa.run_batch(
        [{"i": i} for i in range(32)], backend=backend, temperature=0, progress_bar=True
    )
    assert "32/32" in capsys.readouterr().err
    assert len(states) == 32
    assert isinstance(states[13].error(), ValueError)
    for i, st in enumerate(states):
        if i != 13:
            assert st.error() is None and f"Q: What is {i} plus 1?" in st.text()
    # The common prefix (the few-shot examples) was traced and sent first: every program hit it.
    n = raw(backend, {"text": FEW_SHOT, "sampling_params": {"max_new_tokens": 0}})["meta_info"][
        "prompt_tokens"
    ]
    assert all(
        st.get_meta_info("answer")["cached_tokens"] >= n - 1
        for i, st in enumerate(states)
        if i != 13
    )
    assert states[7]["answer"] == qa.run(7, backend=backend, temperature=0)["answer"]


def test_stream_text_iter(backend):
    s = few_shot_qa.run("What is 3+3?", backend=backend, temperature=0, stream=True)
    chunks = list(s.text_iter("answer"))
    assert "".join(chunks) == s["answer"]


def test_examples_run(backend):
    """Every example in examples/ runs as it is (given this backend) and does what it says."""
    states = _example("few_shot_qa").main(backend)
    assert [st["answer"].strip() for st in states][0] and all(
        "\n" not in st["answer"] for st in states
    )
    chat = _example("multi_turn_chat").main(backend)
    assert [m["role"] for m in chat.messages()] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    fork = _example("parallel_fork")
    s = fork.main(backend)
    assert len(s["tip"]) == len(fork.ASPECTS) and s.text().endswith(
        f"- {fork.ASPECTS[-1]}:{s['tip'][-1]}\n"
    )
    jx = _example("json_extraction")
    for person in jx.main(backend):
        jsonschema.validate(person, jx.SCHEMA)
    chunks, st = _example("streaming").main(backend)
    assert len(chunks) > 1 and "".join(chunks) == st["story"]
    react = _example("react_tools").main(backend)
    assert react["action_0"] in _example("react_tools").ACTIONS
