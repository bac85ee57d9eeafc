"""Drafts of constrained requests: cut where the grammar rejects, each verify row masked with the
matcher's state at that position, the matcher rolled back to where it was; through the engine,
greedy outputs equal plain constrained decoding while the constrained requests themselves draft."""

import json
import re

import jsonschema
import pytest
import torch

from radixlm import Engine
from radixlm.speculative.grammar import cut_draft, masked_draft_rows
from tests.conftest import engine_args

pytest.importorskip("xgrammar")

FRUITS = "apple|banana|cherry|date|fig|grape"
REGEX = f"({FRUITS})(, ({FRUITS})){{3,6}}"
SCHEMA = {
    "type": "object",
    "properties": {"fruits": {"type": "array", "items": {"type": "string"}, "maxItems": 8}},
    "required": ["fruits"],
}
PROMPT = (
    "Fruits: apple, banana, cherry, date, elderberry, fig, grape.\nThe same fruits, as a list:"
    " apple, banana,"
)


@pytest.fixture(scope="module")
def backend(default_model_path):
    from radixlm.constrained.xgrammar_backend import XGrammarBackend
    from radixlm.model.loader import load_tokenizer

    tok = load_tokenizer(default_model_path)
    return tok, XGrammarBackend(tok, 49152, eos_token_ids=[2])


def mask_of(backend, grammar):
    m = backend.allocate_vocab_mask(49152, 1)
    grammar.fill_vocab_mask(m, 0)
    return m


def test_cut_draft_stops_at_the_first_rejected_token_and_restores_the_matcher(backend):
    tok, be = backend
    g = be.get_future(("regex", REGEX)).result(timeout=30)
    for t in tok.encode("apple, ", add_special_tokens=False):
        assert g.accept_token(t)
    before = mask_of(be, g)
    good = tok.encode("banana, cherry", add_special_tokens=False)
    bad = tok.encode(", elderberry, fig", add_special_tokens=False)
    draft = good + bad
    cut = cut_draft(g, draft)
    # The cut keeps every token a matcher accepts one by one, and stops where one is rejected.
    probe = g.fork()
    n = 0
    while n < len(draft) and probe.accept_token(draft[n]):
        n += 1
    assert cut == draft[:n] and len(good) <= n < len(draft)
    assert torch.equal(mask_of(be, g), before)  # rolled back: the same next-token mask
    assert cut_draft(g, []) == []


def test_verify_rows_masked_as_decoding_would(backend):
    tok, be = backend
    g = be.get_future(("json", json.dumps(SCHEMA))).result(timeout=30)
    prefix = tok.encode('{"fruits": ["app', add_special_tokens=False)
    for t in prefix:
        assert g.accept_token(t)
    draft = cut_draft(g, tok.encode('le", "banana", "ch', add_special_tokens=False))
    assert len(draft) >= 4
    before = mask_of(be, g)
    rows = torch.randn(len(draft) + 1, 49152, generator=torch.Generator().manual_seed(0))
    masked = masked_draft_rows(be, g, draft, rows)
    assert torch.equal(mask_of(be, g), before)
    step = g.fork()
    for j in range(len(draft) + 1):
        ref = rows[j : j + 1].clone()
        be.apply_vocab_mask(ref, mask_of(be, step))
        assert torch.equal(masked[j], ref[0]), f"row {j}"
        if j < len(draft):
            assert step.accept_token(draft[j])
    assert torch.isinf(masked).any() and not torch.isinf(rows).any()  # a copy, masked


SPS = [
    {"max_new_tokens": 40, "temperature": 0, "regex": REGEX},
    {"max_new_tokens": 48, "temperature": 0, "json_schema": json.dumps(SCHEMA)},
    {"max_new_tokens": 24, "temperature": 0},
]


def constrained_outputs(e) -> list:
    """The batch twice (the second time radix drafts the first answers), each answer checked
    against its grammar."""
    outs = [e.generate([PROMPT] * 3, SPS) for _ in range(2)]
    for out in outs:
        assert re.fullmatch(REGEX, out[0]["text"]), out[0]["text"]
        jsonschema.validate(json.loads(out[1]["text"]), SCHEMA)
    return outs


@pytest.mark.parametrize("algorithm", ["ngram", "radix"])
def test_constrained_requests_draft_and_equal_plain_decoding(
    default_model_path, algorithm, default_engine
):
    """The default model copies the prompt's list under a regex (prompt lookup drafts the copy,
    and cuts it at "elderberry", which the regex forbids) and under a JSON schema; run twice, so
    radix drafts the first answers. Outputs equal plain decoding (tests/speculative/conftest.py's
    plain engine) and satisfy their grammar."""
    spec = dict(speculative_algorithm=algorithm, speculative_draft_policy="fixed")
    with Engine(default_model_path, **engine_args(num_threads=2, **spec)) as e:
        outs = constrained_outputs(e)
    plain = constrained_outputs(default_engine)
    assert [[o["output_ids"] for o in out] for out in outs] == [
        [o["output_ids"] for o in out] for out in plain
    ]
    metas = [o["meta_info"] for out in outs for o in out[:2]]
    # The constrained requests themselves verified drafts and accepted some.
    assert (
        sum(m["spec_verify_ct"] for m in metas) > 0
        and sum(m["spec_accepted_tokens"] for m in metas) > 0
    )


def test_tree_cut_and_rows_follow_each_path(backend):
    """A tree of several continuations (some the regex forbids part way): cut_tree keeps exactly
    the nodes whose whole path a fresh matcher accepts; each kept node's row is masked with the
    matcher's state after its path, the root's with the state now; the matcher is restored."""
    from radixlm.speculative.draft_tree import ROOT, DraftTree, TreeShape, trie_children
    from radixlm.speculative.grammar import cut_tree, masked_tree_rows

    tok, be = backend
    g = be.get_future(("regex", REGEX)).result(timeout=30)
    for t in tok.encode("apple, ", add_special_tokens=False):
        assert g.accept_token(t)
    texts = ["banana, cherry", "banana; fig", "grape, fig", "pear, fig", "banana, kiwi"]
    paths = [(tok.encode(x, add_special_tokens=False), 1.0) for x in texts]
    root, children = trie_children(paths)
    tree = DraftTree.grow(root, children, 64, TreeShape(width=8))
    before = mask_of(be, g)
    cut = cut_tree(g, tree)
    assert torch.equal(mask_of(be, g), before)

    def accepted(path_tokens):
        probe = g.fork()
        return all(probe.accept_token(t) for t in path_tokens)

    want = [
        tree.path_tokens(tree.ancestors(i))
        for i in range(len(tree))
        if accepted(tree.path_tokens(tree.ancestors(i)))
    ]
    assert sorted(cut.path_tokens(cut.ancestors(i)) for i in range(len(cut))) == sorted(want)
    assert 0 < len(cut) < len(tree)
    rows = torch.randn(len(cut) + 1, 49152, generator=torch.Generator().manual_seed(1))
    masked = masked_tree_rows(be, g, cut, rows)
    assert torch.equal(mask_of(be, g), before)
    for node in [ROOT] + list(range(len(cut))):
        probe = g.fork()
        for t in cut.path_tokens(cut.ancestors(node) if node != ROOT else []):
            assert probe.accept_token(t)
        ref = rows[node + 1 : node + 2].clone()
        be.apply_vocab_mask(ref, mask_of(be, probe))
        assert torch.equal(masked[node + 1], ref[0]), f"node {node}"
