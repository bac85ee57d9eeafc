"""Jump-forward: forced text is appended as the canonical tokenization of the whole text."""

import json

import pytest

from radixlm.constrained.jump_forward import find_jump_forward

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.fixture(scope="module")
def backend(default_model_path):
    from radixlm.constrained.xgrammar_backend import XGrammarBackend
    from radixlm.model.loader import load_tokenizer

    tok = load_tokenizer(default_model_path)
    return tok, XGrammarBackend(tok, 49152, eos_token_ids=[2])


def matcher(backend):
    return backend[1].get_future(("json", json.dumps(SCHEMA))).result(timeout=30)


def feed(grammar, ids):
    for t in ids:
        assert grammar.accept_token(t)


def jump(g, tok, out):
    jf = find_jump_forward(g, tok, out, max_replace=len(out), max_new=100)
    return out[: jf.keep] + jf.new_tokens


def test_forced_runs_are_canonical(backend):
    tok, _ = backend
    g = matcher(backend)
    out = tok.encode("{", add_special_tokens=False)
    feed(g, out)
    out = jump(g, tok, out)
    text = tok.decode(out)
    # All of the forced '{"name": "' but its last token, which the model writes itself.
    assert '{"name": "'.startswith(text) and len(text) > 3
    assert out == tok.encode(text, add_special_tokens=False)
    rest = tok.encode('{"name": "', add_special_tokens=False)[len(out) :]
    feed(g, rest)
    out += rest
    name = tok.encode("Bob", add_special_tokens=False) + tok.encode('"', add_special_tokens=False)
    feed(g, name)
    out += name
    out = jump(g, tok, out)
    text = tok.decode(out)
    assert '{"name": "Bob", "age": '.startswith(text) and text.startswith('{"name": "Bob",')
    assert out == tok.encode(text, add_special_tokens=False), "the boundary was not re-tokenized"
    glued = tok.encode('{"name": "Bob"', add_special_tokens=False) + tok.encode(
        text[len('{"name": "Bob"') :], add_special_tokens=False
    )
    assert glued != out, "this case must need the boundary re-tokenized to prove anything"
    # The grammar followed the re-tokenization: the rest of the text completes it.
    feed(g, tok.encode('{"name": "Bob", "age": 42}', add_special_tokens=False)[len(out) :])
    assert g.is_completed()


def test_nothing_forced_and_limits(backend):
    tok, _ = backend
    g = matcher(backend)
    # From the start the first key is forced; what follows its colon is not (any whitespace may).
    jf = find_jump_forward(g, tok, [], max_replace=0, max_new=100)
    assert jf.keep == 0 and tok.decode(jf.new_tokens) == '{"name":'
    g = matcher(backend)
    out = tok.encode('{"name": "', add_special_tokens=False)
    feed(g, out)
    assert (
        find_jump_forward(g, tok, out, max_replace=len(out), max_new=100) is None
    )  # free text now
    # max_new caps the forced tokens; max_replace=0 leaves earlier tokens alone.
    g = matcher(backend)
    first = tok.encode("{", add_special_tokens=False)
    feed(g, first)
    jf = find_jump_forward(g, tok, first, max_replace=0, max_new=len(first) + 1)
    assert jf.keep == len(first) and len(jf.new_tokens) == 1
    assert (
        find_jump_forward(g, tok, first + jf.new_tokens, max_replace=0, max_new=len(first) + 1)
        is None
    )
