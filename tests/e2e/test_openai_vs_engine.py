"""Greedy text through the official openai client equals radixlm.Engine's for the same prompt."""

import openai
import pytest

from radixlm import Engine


@pytest.fixture(scope="module")
def engine():
    with Engine(log_level="warning", enable_invariant_checks=True) as e:
        yield e


def test_chat_and_completion_equal_engine(server, engine):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    model = client.models.list().data[0].id
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three colors."},
    ]
    chat = client.chat.completions.create(
        model=model, messages=messages, max_tokens=24, temperature=0
    )
    prompt = engine.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    ref = engine.generate(prompt, {"max_new_tokens": 24, "temperature": 0})
    assert chat.choices[0].message.content == ref["text"]
    assert chat.usage.prompt_tokens == ref["meta_info"]["prompt_tokens"]

    comp = client.completions.create(
        model=model,
        prompt="The three primary colors are",
        max_tokens=20,
        temperature=0,
        stop=["\n\n"],
    )
    ref = engine.generate(
        "The three primary colors are", {"max_new_tokens": 20, "temperature": 0, "stop": ["\n\n"]}
    )
    assert comp.choices[0].text == ref["text"]
    assert (
        comp.choices[0].finish_reason
        == {"stop": "stop", "length": "length"}[ref["meta_info"]["finish_reason"]["type"]]
    )
