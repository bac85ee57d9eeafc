"""Structured generation on the default model: JSON schemas (validated with jsonschema), regex,
EBNF, mixed batches, invalid grammars."""

import json
import re

import jsonschema
import openai
import pytest
import requests

S = {"type": "string", "maxLength": 16}
SCHEMAS = [
    {
        "type": "object",
        "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
    },
    {"type": "object", "properties": {"city": S, "country": S}, "required": ["city", "country"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}},
        "required": ["color"],
    },
    {
        "type": "object",
        "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["score"],
    },
    {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": S, "minItems": 1, "maxItems": 3}},
        "required": ["tags"],
    },
    {
        "type": "object",
        "properties": {
            "nums": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 9},
                "minItems": 2,
                "maxItems": 4,
            }
        },
        "required": ["nums"],
    },
    {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}},
        "required": ["code"],
    },
    {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9999}, "name": S},
                "required": ["id", "name"],
            }
        },
        "required": ["user"],
    },
    {
        "type": "object",
        "properties": {
            "title": S,
            "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
            "genre": {"enum": ["drama", "comedy"]},
        },
        "required": ["title", "year", "genre"],
    },
    {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": -5, "maximum": 5},
            "b": {"type": "integer", "minimum": -5, "maximum": 5},
        },
        "required": ["a", "b"],
    },
    {"type": "object", "properties": {"name": S, "nickname": S}, "required": ["name"]},
    {
        "type": "object",
        "properties": {
            "point": {
                "type": "object",
                "properties": {
                    "x": {"type": "number", "minimum": -10, "maximum": 10},
                    "y": {"type": "number", "minimum": -10, "maximum": 10},
                },
                "required": ["x", "y"],
            }
        },
        "required": ["point"],
    },
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": S,
                        "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                    },
                    "required": ["sku", "qty"],
                },
                "minItems": 1,
                "maxItems": 2,
            }
        },
        "required": ["items"],
    },
    {
        "type": "object",
        "properties": {
            "answer": {"enum": ["yes", "no", "maybe"]},
            "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
        },
        "required": ["answer", "confidence"],
    },
    {
        "type": "object",
        "properties": {"date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}},
        "required": ["date"],
    },
    {
        "type": "object",
        "properties": {"email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}},
        "required": ["email"],
    },
    {
        "type": "object",
        "properties": {
            "flags": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3}
        },
        "required": ["flags"],
    },
    {
        "type": "object",
        "properties": {"level": {"type": "integer", "enum": [1, 2, 3]}, "label": S},
        "required": ["level", "label"],
    },
    {
        "type": "object",
        "properties": {
            "meta": {
                "type": "object",
                "properties": {
                    "version": {"type": "integer", "minimum": 1, "maximum": 5},
                    "stable": {"type": "boolean"},
                },
                "required": ["version", "stable"],
            },
            "name": S,
        },
        "required": ["meta", "name"],
    },
    {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 99},
        "minItems": 1,
        "maxItems": 4,
    },
    {
        "type": "object",
        "properties": {
            "first": S,
            "last": S,
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
        },
        "required": ["first", "last", "age"],
    },
]
REGEXES = [
    r"((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(25[0-5]|2[0-4]\d|1?\d?\d)",  # IPv4
    r"20\d{2}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",  # date
    r"\(\d{3}\) \d{3}-\d{4}",  # phone
    r"(yes|no|maybe)",  # alternation
    r"[A-Z][a-z]{2,8} [A-Z][a-z]{2,8}",  # a name
]
EBNF = """root ::= expr
expr ::= term ((" + " | " - ") term){0,3}
term ::= factor ((" * " | " / ") factor){0,2}
factor ::= number | "(" expr ")"
number ::= [1-9] [0-9]{0,2}
"""


def parses_arithmetic(s: str) -> bool:
    pos = 0

    def number():
        nonlocal pos
        m = re.compile(r"[1-9][0-9]{0,2}").match(s, pos)
        if not m:
            return False
        pos = m.end()
        return True

    def factor():
        nonlocal pos
        if s.startswith("(", pos):
            pos += 1
            if not expr() or not s.startswith(")", pos):
                return False
            pos += 1
            return True
        return number()

    def chain(item, ops, most):
        nonlocal pos
        if not item():
            return False
        n = 0
        while any(s.startswith(op, pos) for op in ops):
            pos += 3
            n += 1
            if n > most or not item():
                return False
        return True

    def term():
        return chain(factor, (" * ", " / "), 2)

    def expr():
        return chain(term, (" + ", " - "), 3)

    return expr() and pos == len(s)


def chat_prompt(tok, content):
    return tok.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )


@pytest.fixture(scope="module")
def tok(default_model_path):
    from radixlm.model.loader import load_tokenizer

    return load_tokenizer(default_model_path)


def generate(server, body):
    r = requests.post(server.url + "/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_json_schemas_native(server, tok):
    prompts = [
        chat_prompt(tok, f"Reply with JSON matching this schema: {json.dumps(s)}") for s in SCHEMAS
    ]
    sps = [{"max_new_tokens": 128, "temperature": 0, "json_schema": json.dumps(s)} for s in SCHEMAS]
    outs = generate(server, {"text": prompts, "sampling_params": sps})
    for schema, out in zip(SCHEMAS, outs):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        jsonschema.validate(json.loads(out["text"]), schema)


def test_json_schemas_openai_response_format(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    model = client.models.list().data[0].id
    for i, schema in enumerate(SCHEMAS):
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Produce an example JSON object."}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": f"s{i}", "schema": schema, "strict": True},
            },
            max_tokens=128,
            temperature=0.7 if i % 2 else 0,
            top_p=0.9,
            seed=i,
        )
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = client.completions.create(
        model=model,
        prompt="My IP address is ",
        max_tokens=24,
        temperature=0.8,
        seed=3,
        extra_body={"regex": REGEXES[0]},
    )
    assert re.fullmatch(REGEXES[0], r.choices[0].text)
    with pytest.raises(openai.BadRequestError, match="regex"):
        client.completions.create(model=model, prompt="x", max_tokens=4, extra_body={"regex": "(a"})
    r = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": "Reply with a JSON object with one key, name."}],
        response_format={"type": "json_object"},
        max_tokens=128,
        temperature=0,
    )
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_regex_and_ebnf(server, tok):
    prompts = [chat_prompt(tok, "Answer: ")] * len(REGEXES)
    sps = [
        {"max_new_tokens": 48, "temperature": 0.8, "seed": i, "regex": rx}
        for i, rx in enumerate(REGEXES)
    ]
    for rx, out in zip(REGEXES, generate(server, {"text": prompts, "sampling_params": sps})):
        assert re.fullmatch(rx, out["text"]), (rx, out["text"])
    outs = generate(
        server,
        {
            "text": [chat_prompt(tok, "Write an arithmetic expression.")] * 4,
            "sampling_params": [
                {"max_new_tokens": 96, "temperature": 0.7, "seed": i, "ebnf": EBNF}
                for i in range(4)
            ],
        },
    )
    for out in outs:
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        assert parses_arithmetic(out["text"]), out["text"]


def test_mixed_batch_leaves_unconstrained_requests_alone(server, tok):
    plain = [chat_prompt(tok, q) for q in ("What is 2+2?", "Name a fruit.", "Say hi.")]
    sp = {"max_new_tokens": 24, "temperature": 0}
    alone = [generate(server, {"text": p, "sampling_params": sp})["text"] for p in plain]
    texts = [
        plain[0],
        chat_prompt(tok, "JSON please"),
        plain[1],
        chat_prompt(tok, "An IP?"),
        plain[2],
    ]
    sps = [sp, {**sp, "json_schema": json.dumps(SCHEMAS[0])}, sp, {**sp, "regex": REGEXES[0]}, sp]
    outs = generate(server, {"text": texts, "sampling_params": sps})
    assert [outs[0]["text"], outs[2]["text"], outs[4]["text"]] == alone
    assert re.fullmatch(REGEXES[0], outs[3]["text"])


@pytest.mark.parametrize(
    "sp, word",
    [
        ({"json_schema": "{not json"}, "json_schema"),
        (
            {
                "json_schema": json.dumps(
                    {"type": "object", "properties": {"a": {"type": "nonsense"}}}
                )
            },
            "json_schema",
        ),
        ({"regex": "(a"}, "parenthesis"),
        ({"ebnf": 'rule ::= "a"'}, "root"),
        ({"ebnf": "root ::= 'a"}, "ebnf"),
        ({"regex": "a", "ebnf": 'root ::= "a"'}, "only one"),
    ],
)
def test_invalid_grammar_is_400_then_serving_continues(server, sp, word):
    r = requests.post(
        server.url + "/generate",
        json={"text": "hi", "sampling_params": {"max_new_tokens": 4, **sp}},
        timeout=60,
    )
    assert r.status_code == 400 and word in r.json()["error"]["message"], r.text
    ok = requests.post(
        server.url + "/generate",
        json={"text": "hi", "sampling_params": {"max_new_tokens": 4, "regex": "[a-z]+"}},
        timeout=60,
    )
    assert ok.status_code == 200 and re.fullmatch("[a-z]+", ok.json()["text"])


HEAVY = {  # many fixed keys: long forced runs
    "type": "object",
    "properties": {
        "first_name": S,
        "last_name": S,
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "is_employed": {"type": "boolean"},
        "favorite_color": {"enum": ["red", "green", "blue"]},
        "home_city": S,
        "number_of_children": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": [
        "first_name",
        "last_name",
        "age",
        "is_employed",
        "favorite_color",
        "home_city",
        "number_of_children",
    ],
}


def test_jump_forward_on_and_off(server, tok):
    from radixlm import Engine

    prompts = [chat_prompt(tok, f"Invent person number {i} as JSON.") for i in range(4)]
    sps = [
        {"max_new_tokens": 160, "temperature": 0.7, "seed": i, "json_schema": json.dumps(HEAVY)}
        for i in range(4)
    ]

    def passes_per_token(outs):
        for out in outs:
            assert out["meta_info"]["finish_reason"]["type"] == "stop"
            jsonschema.validate(json.loads(out["text"]), HEAVY)
        return sum(o["meta_info"]["forward_passes"] for o in outs) / sum(
            o["meta_info"]["completion_tokens"] for o in outs
        )

    on = passes_per_token(generate(server, {"text": prompts, "sampling_params": sps}))
    with Engine(disable_jump_forward=True, log_level="warning", enable_invariant_checks=True) as e:
        off = passes_per_token(e.generate(prompts, sps))
    assert off == 1.0  # one decode step per token
    assert on <= 0.7 * off, f"jump-forward saved too little: {on:.2f} vs {off:.2f} passes per token"


def test_grammar_with_n_stop_and_logprobs(server, tok):
    p = chat_prompt(tok, "Pick a color.")
    outs = generate(
        server,
        {
            "text": p,
            "sampling_params": {
                "max_new_tokens": 32,
                "temperature": 1.0,
                "n": 3,
                "seed": 1,
                "json_schema": json.dumps(SCHEMAS[3]),
            },
        },
    )
    assert len(outs) == 3
    for out in outs:
        jsonschema.validate(json.loads(out["text"]), SCHEMAS[3])
    r = generate(
        server,
        {
            "text": p,
            "sampling_params": {
                "max_new_tokens": 32,
                "temperature": 0,
                "regex": "(red|green|blue), (one|two)",
                "stop": ",",
            },
            "return_logprob": True,
        },
    )
    assert (
        r["text"] in ("red", "green", "blue") and r["meta_info"]["finish_reason"]["matched"] == ","
    )
    assert len(r["meta_info"]["output_token_logprobs"]) == len(r["output_ids"])
