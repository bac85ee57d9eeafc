"""Grammar backend (xgrammar) with the real SmolLM2 tokenizer: compile, cache, thread pool,
masks, and a seeded fake model whose every output must satisfy its constraint."""

import json
import re
import threading

import pytest
import torch

pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

from radixlm.constrained import (  # noqa: E402 (after the importorskip checks above)
    ANY_JSON_OBJECT,
    BaseGrammarBackend,
    InvalidGrammar,
    create_grammar_backend,
)

EOS = 2  # SmolLM2's <|im_end|>


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from radixlm.model.loader import load_tokenizer

    return load_tokenizer(default_model_path)


@pytest.fixture(scope="module")
def backend(tokenizer):
    b = create_grammar_backend(
        "xgrammar", tokenizer, len(tokenizer), eos_token_ids=[EOS], num_threads=2
    )
    yield b
    b.shutdown()


def compile_ok(backend, kind, text):
    g = backend.get_future((kind, text)).result(timeout=30)
    assert not isinstance(g, InvalidGrammar), g.message
    return g


def allowed_ids(mask_row: torch.Tensor) -> list[int]:
    return [v for v in range(mask_row.numel() * 32) if (int(mask_row[v // 32]) >> (v % 32)) & 1]


def generate(backend, grammar, tokenizer, seed, max_steps=400):
    """Fake model: seeded random logits, a bias toward closing tokens that grows each step
    (so strings, arrays and recursion end), grammar mask, argmax. Returns the text before EOS."""
    vocab = len(tokenizer)
    closers = [EOS] + [
        ids[0] for c in '"}]),' if len(ids := tokenizer.encode(c, add_special_tokens=False)) == 1
    ]
    gen = torch.Generator().manual_seed(seed)
    mask = BaseGrammarBackend.allocate_vocab_mask(vocab, 1)
    out = []
    for step in range(max_steps):
        if grammar.is_terminated():
            break
        logits = torch.randn(1, vocab, generator=gen)
        logits[0, closers] += 0.2 * step
        grammar.fill_vocab_mask(mask, 0)
        BaseGrammarBackend.apply_vocab_mask(logits, mask)
        token = int(logits.argmax())
        assert logits[0, token] > float("-inf")
        assert grammar.accept_token(token), f"grammar rejected token {token} its own mask allowed"
        out.append(token)
    assert grammar.is_terminated() and out[-1] == EOS, "fake model did not finish"
    return tokenizer.decode(out[:-1])


# --- compile: valid and invalid, per kind ---

INVALID = [
    ("json", '{"type": "object", "properties": '),  # truncated JSON
    ("json", '{"type": "foo"}'),
    ("regex", "(ab"),
    ("regex", "[z-a]"),
    ("ebnf", 'root ::= "a" | '),
    ("ebnf", 'start ::= "a"'),  # no root rule
    ("ebnf", "root ::= undefined_rule"),
    ("yaml", "a: b"),
]


@pytest.mark.parametrize("key", INVALID, ids=[f"{k}-{i}" for i, (k, _) in enumerate(INVALID)])
def test_invalid_grammar_is_a_result_with_message(backend, key):
    res = backend.get_future(key).result(timeout=30)
    assert isinstance(res, InvalidGrammar)
    assert res.key == key and len(res.message) > 5 and "/project/cpp" not in res.message


def test_valid_grammars_and_dict_schema(backend):
    compile_ok(backend, "json", '{"type": "string"}')
    compile_ok(backend, "regex", r"\d+")
    compile_ok(backend, "ebnf", 'root ::= "yes" | "no"')
    g = compile_ok(
        backend,
        "json",
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    )
    assert g.find_jump_forward_str() == '{"a": '


def test_create_grammar_backend_names(tokenizer):
    assert create_grammar_backend("none", tokenizer, len(tokenizer)) is None
    with pytest.raises(ValueError, match="unknown grammar backend"):
        create_grammar_backend("outlines", tokenizer, len(tokenizer))


# --- cache and thread pool ---


def test_cache_hit_shares_compiled_grammar_fresh_matcher(backend):
    key = ("regex", r"[a-f]{4}-cache")
    g1 = backend.get_future(key).result(timeout=30)
    fut = backend.get_future(key)
    assert fut.done(), "a cache hit must resolve at once"
    g2 = fut.result()
    assert g2.ctx is g1.ctx and g2.matcher is not g1.matcher
    # invalid results are cached too
    bad = ("regex", "(cached")
    assert isinstance(backend.get_future(bad).result(timeout=30), InvalidGrammar)
    assert backend.get_future(bad).done()


def test_compiles_run_on_the_pool_and_never_block(backend, monkeypatch):
    # Compiles are held at a gate: if get_future compiled on the caller's thread
    # (or waited for the pool), submitting would deadlock or see finished futures.
    gate, calls = threading.Event(), []
    real = backend.dispatch_json

    def gated(schema):
        calls.append(schema)
        assert gate.wait(timeout=60), "gate never opened"
        return real(schema)

    monkeypatch.setattr(backend, "dispatch_json", gated)
    keys = [
        ("json", json.dumps({"type": "object", "properties": {f"f{i}": {"enum": [i, "x"]}}}))
        for i in range(16)
    ]
    futs = [backend.get_future(k) for k in keys] + [
        backend.get_future(keys[0])
    ]  # in-flight duplicate
    assert not any(f.done() for f in futs), "get_future waited for a compile"
    gate.set()
    results = [f.result(timeout=60) for f in futs]
    assert all(not isinstance(r, InvalidGrammar) for r in results)
    assert sorted(calls) == sorted(k[1] for k in keys), "the in-flight duplicate compiled twice"
    assert results[0].ctx is results[-1].ctx and results[0].matcher is not results[-1].matcher


def test_lru_eviction(tokenizer):
    b = create_grammar_backend("xgrammar", tokenizer, len(tokenizer), num_threads=1, cache_size=2)
    try:
        for r in ("a+", "b+", "c+"):
            b.get_future(("regex", r)).result(timeout=30)
        assert b.get_future(("regex", "c+")).done()
        assert b.get_future(("regex", "b+")).done()
        fut = b.get_future(("regex", "a+"))  # evicted: compiles again
        assert not isinstance(fut.result(timeout=30), InvalidGrammar)
    finally:
        b.shutdown()


# --- the fake model's outputs satisfy their constraint ---

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 12},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["name", "tags"],
            }
        },
        "required": ["user"],
    },
    "array_bounds": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4},
    "enum": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"type": "string", "enum": ["S", "M"]},
        },
        "required": ["color", "size"],
    },
    "int_bounds": {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": -5, "maximum": 120},
            "x": {"type": "number"},
        },
        "required": ["n", "x"],
    },
    "pattern": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
        "required": ["code"],
    },
    "optional": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "nick": {"type": "string"},
            "active": {"type": "boolean"},
        },
        "required": ["id"],
    },
}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_json_schema_outputs_validate(backend, tokenizer, name):
    schema = SCHEMAS[name]
    template = compile_ok(backend, "json", json.dumps(schema))
    for seed in range(3):
        text = generate(backend, template.copy(), tokenizer, seed)
        jsonschema.validate(json.loads(text), schema)
        assert "\n" not in text  # compact: any_whitespace=False


def test_json_object_mode(backend, tokenizer):
    template = compile_ok(backend, "json", ANY_JSON_OBJECT)
    for seed in range(3):
        assert isinstance(json.loads(generate(backend, template.copy(), tokenizer, seed)), dict)


REGEXES = {
    "ipv4": r"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)",
    "date": r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
    "phone": r"\(\d{3}\) \d{3}-\d{4}",
    "alternation": r"(cat|dog|bird)s?( and (cat|dog|bird)s?)*",
}


@pytest.mark.parametrize("name", list(REGEXES))
def test_regex_outputs_fullmatch(backend, tokenizer, name):
    template = compile_ok(backend, "regex", REGEXES[name])
    for seed in range(4):
        text = generate(backend, template.copy(), tokenizer, seed)
        assert re.fullmatch(REGEXES[name], text), text


ARITH = r"""
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")"
number ::= [0-9]+
"""


def parse_arith(s: str) -> bool:
    """Recursive descent for ARITH; True iff all of s is one expr."""
    pos = 0

    def number():
        nonlocal pos
        start = pos
        while pos < len(s) and s[pos].isdigit():
            pos += 1
        return pos > start

    def factor():
        nonlocal pos
        if pos < len(s) and s[pos] == "(":
            pos += 1
            if not expr() or pos >= len(s) or s[pos] != ")":
                return False
            pos += 1
            return True
        return number()

    def chain(item, ops):
        nonlocal pos
        if not item():
            return False
        while pos < len(s) and s[pos] in ops:
            pos += 1
            if not item():
                return False
        return True

    def term():
        return chain(factor, "*/")

    def expr():
        return chain(term, "+-")

    return expr() and pos == len(s)


def test_ebnf_arithmetic_outputs_parse(backend, tokenizer):
    assert parse_arith("(1+2)*30/4") and not parse_arith("1+") and not parse_arith("(1")
    template = compile_ok(backend, "ebnf", ARITH)
    for seed in range(4):
        text = generate(backend, template.copy(), tokenizer, seed)
        assert parse_arith(text), text


# --- matcher semantics ---

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def accept_text(grammar, tokenizer, text):
    for t in tokenizer.encode(text, add_special_tokens=False):
        assert grammar.accept_token(t)


def test_jump_forward_string(backend, tokenizer):
    g = compile_ok(backend, "json", json.dumps(PERSON))
    assert g.find_jump_forward_str() == '{"name": "'
    accept_text(g, tokenizer, "{")
    assert g.find_jump_forward_str() == '"name": "'
    accept_text(g, tokenizer, '"name": "Bob"')
    assert g.find_jump_forward_str() == ', "age": '
    accept_text(g, tokenizer, ', "age": 4')
    assert g.find_jump_forward_str() == ""  # more digits or "}": a choice


def test_copy_fork_rollback_independent(backend, tokenizer):
    g = compile_ok(backend, "json", json.dumps(PERSON))
    accept_text(g, tokenizer, '{"name": "Al')
    fresh = g.copy()
    assert fresh.find_jump_forward_str() == '{"name": "'
    accept_text(fresh, tokenizer, "{")
    forked = g.fork()
    accept_text(forked, tokenizer, 'ice"')
    assert forked.find_jump_forward_str() == ', "age": '
    assert g.find_jump_forward_str() == ""  # g is still inside the string

    vocab = len(tokenizer)
    before, after = (BaseGrammarBackend.allocate_vocab_mask(vocab, 1) for _ in range(2))
    g.fill_vocab_mask(before, 0)
    ids = tokenizer.encode('ice", "age": 7', add_special_tokens=False)
    for t in ids:
        assert g.accept_token(t)
    g.rollback(len(ids))
    g.fill_vocab_mask(after, 0)
    assert torch.equal(before, after)


def test_eos_only_when_complete_then_terminated(backend, tokenizer):
    g = compile_ok(backend, "regex", r"(ab)+")
    mask = BaseGrammarBackend.allocate_vocab_mask(len(tokenizer), 2)
    assert not g.accept_token(EOS) and not g.is_completed()
    accept_text(g, tokenizer, "ab")
    assert g.is_completed() and not g.is_terminated()
    g.fill_vocab_mask(mask, 0)
    assert EOS in allowed_ids(mask[0])
    assert g.accept_token(EOS) and g.is_terminated()
    assert not g.accept_token(tokenizer.encode("ab", add_special_tokens=False)[0])
    g.fill_vocab_mask(mask, 1)  # a terminated matcher still in the batch: stop tokens only
    assert allowed_ids(mask[1]) == [EOS]


def test_padded_vocab_never_allowed(tokenizer):
    vocab = len(tokenizer) + 64  # model vocab wider than the tokenizer
    b = create_grammar_backend("xgrammar", tokenizer, vocab, num_threads=1)
    try:
        g = b.get_future(("json", ANY_JSON_OBJECT)).result(timeout=30)
        accept_text(g, tokenizer, '{"a": "')  # inside a string: nearly every token allowed
        mask = b.allocate_vocab_mask(vocab, 1)
        g.fill_vocab_mask(mask, 0)
        ids = allowed_ids(mask[0])
        assert len(ids) > 40000 and max(ids) < len(tokenizer)
    finally:
        b.shutdown()


# --- apply_vocab_mask ---


def naive_apply(logits, mask):
    out = logits.clone()
    for b in range(logits.shape[0]):
        for v in range(logits.shape[1]):
            if not (int(mask[b, v // 32]) >> (v % 32)) & 1:
                out[b, v] = float("-inf")
    return out


@pytest.mark.parametrize("vocab", [1000, 1024])
def test_apply_vocab_mask_matches_naive(vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=gen)
    mask = BaseGrammarBackend.allocate_vocab_mask(vocab, 5)
    words = mask.shape[1]
    for row in (0, 2, 4):  # rows 1 and 3: requests without a grammar, left all ones
        mask[row] = torch.randint(-(2**31), 2**31, (words,), generator=gen, dtype=torch.int64).to(
            torch.int32
        )
    mask[4, :] = 0
    mask[4, 3] = -(2**31)  # only bit 31 of word 3: token 127
    expected = naive_apply(logits, mask)
    got = logits.clone()
    BaseGrammarBackend.apply_vocab_mask(got, mask)
    assert torch.equal(got, expected)
    assert torch.equal(got[1], logits[1]) and torch.equal(got[3], logits[3])
    assert (got[4] > float("-inf")).nonzero().view(-1).tolist() == [127]


def test_apply_vocab_mask_matches_xgrammar():
    import xgrammar as xgr

    gen = torch.Generator().manual_seed(0)
    vocab = 49152
    logits = torch.randn(8, vocab, generator=gen)
    mask = torch.randint(-(2**31), 2**31, (8, vocab // 32), generator=gen, dtype=torch.int64).to(
        torch.int32
    )
    ref = logits.clone()
    xgr.apply_token_bitmask_inplace(ref, mask)
    BaseGrammarBackend.apply_vocab_mask(logits, mask)
    assert torch.equal(logits, ref)
    with pytest.raises(ValueError, match="does not cover"):
        BaseGrammarBackend.apply_vocab_mask(torch.zeros(8, vocab + 64), mask)


def test_cancelled_future_does_not_break_the_compile(backend):
    key = ("regex", r"[0-9]{2}-cancel")
    fut = backend.get_future(key)
    fut.cancel()  # an aborted request
    assert not isinstance(backend.get_future(key).result(timeout=30), InvalidGrammar)
