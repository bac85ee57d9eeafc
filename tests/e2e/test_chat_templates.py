"""Chat templates on the OpenAI chat route: continue_final_message / add_generation_prompt against
the HF tokenizer's own rendering (the default model), and --chat-template FILE (tiny model)
against the tokenizer given that template, or SGLang's conversation rendering (the built-in
names: tests/unit/test_chat_templates.py)."""

import json

import openai
import pytest
import requests

from radixlm.engine.chat_templates import resolve_chat_template
from radixlm.server.process import ServerProcess
from tests.forked_servers import run_cli
from tests.sglang_conversation import (
    load_conversation_module,
    register_json_template,
    sglang_prompt,
)

TINY = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")
PREFILL = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is"},
]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from radixlm.model.loader import load_tokenizer

    return load_tokenizer(default_model_path)


def hf_ids(tokenizer, messages, **kw) -> list[int]:
    return tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **kw)


def generate(server, ids, n) -> dict:
    r = requests.post(
        server.url + "/generate",
        json={"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0}},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_continue_final_message_continues_the_assistant_text(server, client, model, tokenizer):
    out = client.chat.completions.create(
        model=model,
        messages=PREFILL,
        max_tokens=12,
        temperature=0,
        extra_body={"continue_final_message": True, "return_token_ids": True},
    )
    want = hf_ids(tokenizer, PREFILL, continue_final_message=True)
    assert out.model_extra["prompt_token_ids"] == want
    # The prompt ends inside the assistant's message: its text, then no end of turn.
    assert tokenizer.decode(want).endswith("<|im_start|>assistant\nThe capital of France is")
    ref = generate(server, want, 12)
    choice = out.choices[0]
    assert (
        choice.message.content == ref["text"]
        and choice.model_extra["token_ids"] == ref["output_ids"]
    )
    assert out.usage.prompt_tokens == len(want)
    # Without the flag the assistant's message is closed (its end of turn right after the text) and
    # a new turn opened: the continued prompt is that one cut before the end of turn.
    closed = client.chat.completions.create(
        model=model, messages=PREFILL, max_tokens=1, extra_body={"return_token_ids": True}
    ).model_extra["prompt_token_ids"]
    assert closed == hf_ids(tokenizer, PREFILL, add_generation_prompt=True)
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert (
        closed[: len(want)] == want
        and closed[len(want)] == end_of_turn
        and end_of_turn not in want[-3:]
    )


def test_add_generation_prompt_false_renders_without_the_assistant_header(client, model, tokenizer):
    messages = PREFILL[:1]
    out = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=1,
        extra_body={"add_generation_prompt": False, "return_token_ids": True},
    )
    assert out.model_extra["prompt_token_ids"] == hf_ids(
        tokenizer, messages, add_generation_prompt=False
    )
    assert out.model_extra["prompt_token_ids"] != hf_ids(
        tokenizer, messages, add_generation_prompt=True
    )


@pytest.mark.parametrize(
    "body, field, words",
    [
        (
            {"continue_final_message": True, "add_generation_prompt": True},
            "add_generation_prompt",
            "cannot both be true",
        ),
        ({"continue_final_message": "yes"}, "continue_final_message", "valid boolean"),
        ({"return_token_ids": True, "stream": True}, "return_token_ids", "without stream"),
    ],
)
def test_bad_template_options_are_400_naming_the_field(server, body, field, words):
    r = requests.post(
        server.url + "/v1/chat/completions",
        json={"messages": PREFILL, "max_tokens": 2, **body},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field and words in r.json()["error"]["message"]
    assert requests.get(server.url + "/health", timeout=10).status_code == 200


JINJA = (
    "{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] }}\\n{% endfor %}"
    "{% if add_generation_prompt %}[ASSISTANT]{% endif %}"
)


@pytest.fixture
def jinja_file(tmp_path):
    path = tmp_path / "mine.jinja"
    path.write_text(JINJA)
    return str(path)


def _chat(url, **body) -> dict:
    r = requests.post(
        url + "/v1/chat/completions",
        json={"max_tokens": 3, "temperature": 0, "return_token_ids": True, **body},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_template_jinja_file(tiny_model_dir, jinja_file):
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(tiny_model_dir)
    ref.chat_template = JINJA.replace(
        "\\n", "\n"
    )  # as SGLang reads a file: a literal \n is a newline
    s = ServerProcess("--model-path", tiny_model_dir, "--chat-template", jinja_file, *TINY)
    try:
        out = _chat(s.url, messages=PREFILL, continue_final_message=True)
        assert out["prompt_token_ids"] == hf_ids(ref, PREFILL, continue_final_message=True)
        assert ref.decode(out["prompt_token_ids"]).endswith("[ASSISTANT] The capital of France is")
        out = _chat(s.url, messages=PREFILL[:1])
        assert out["prompt_token_ids"] == hf_ids(ref, PREFILL[:1], add_generation_prompt=True)
    finally:
        s.stop()


def test_chat_template_json_file_and_its_stop_strings(
    tiny_model_dir, tiny_hf_model, tokenizer, tmp_path
):
    """SGLang's JSON conversation file; its stop_str ends the answer, as SGLang adds it to the
    request's stops."""
    import torch

    t = {
        "name": "mine",
        "system": "S:",
        "user": "U",
        "assistant": "A",
        "sep_style": "ADD_COLON_SINGLE",
        "sep": "\n",
    }
    sglang = load_conversation_module()
    register_json_template(sglang, {**t, "stop_str": None})
    ids = tokenizer.encode(sglang_prompt(sglang, "mine", PREFILL[:1]))
    # The tiny model's own greedy answer (HF), and a stop string from inside it.
    with torch.no_grad():
        gen = tiny_hf_model.generate(
            torch.tensor([ids]),
            max_new_tokens=24,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(ids) :].tolist()
    text = tokenizer.decode(gen)
    stop = tokenizer.decode(gen[8:10])
    assert stop.strip() and text.find(stop) > 0
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({**t, "stop_str": [stop]}))
    s = ServerProcess("--model-path", tiny_model_dir, "--chat-template", str(path), *TINY)
    try:
        out = _chat(s.url, messages=PREFILL[:1], max_tokens=24, ignore_eos=True)
        assert out["prompt_token_ids"] == ids
        choice = out["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["matched_stop"] == stop
        assert choice["message"]["content"] == text[: text.find(stop)]
    finally:
        s.stop()


def test_bad_chat_template_is_one_error_line(tiny_model_dir):
    r = run_cli(
        ["serve", "--model-path", tiny_model_dir, "--chat-template", "no-such-template"],
        timeout=120,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"radixlm: error: {_error(lambda: resolve_chat_template('no-such-template'))}"
    ]


def _error(fn) -> str:
    try:
        fn()
    except ValueError as e:
        return str(e)
    raise AssertionError("no error")
