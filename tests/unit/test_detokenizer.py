"""Incremental detokenization with the real tokenizer: UTF-8 safe, cumulative, stop trimming."""

import pytest

from radixlm.engine.detokenizer import IncrementalDetokenizer
from radixlm.ipc import FinishLength, FinishStop, ReqOutputChunk

TEXT = "Héllo wörld 👋🏽 — 東京タワー is tall. ∑x² ≥ 0 🎉!"


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from radixlm.model.loader import load_tokenizer

    return load_tokenizer(default_model_path)


def chunk(rid, ids, finished=None, trim=True):
    return ReqOutputChunk(rid, ids, finished, 0, 0, 0, trim_stop=trim)


def test_one_token_at_a_time_never_shows_a_broken_character(tokenizer):
    ids = tokenizer.encode(TEXT)
    assert any("\ufffd" in tokenizer.decode(ids[:i]) for i in range(1, len(ids))), (
        "the text must split a character"
    )
    detok = IncrementalDetokenizer(tokenizer)
    seen = ""
    for tok in ids[:-1]:
        text = detok.step(chunk("r", [tok]))
        assert "\ufffd" not in text
        assert text.startswith(seen) and TEXT.startswith(text)
        seen = text
    final = detok.step(chunk("r", [ids[-1]], FinishLength(len(ids))))
    assert final == tokenizer.decode(ids) == TEXT
    assert "r" not in detok.states


def test_stop_string_and_stop_token_are_trimmed(tokenizer):
    ids = tokenizer.encode("The answer is 42. Done")
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.step(chunk("a", ids, FinishStop("42"))) == "The answer is "
    assert detok.step(chunk("b", ids, FinishStop("42"), trim=False)) == "The answer is 42. Done"
    assert detok.step(chunk("c", ids, FinishStop(ids[-1]))) == tokenizer.decode(ids[:-1])


def test_streaming_holds_back_a_possible_stop_string(tokenizer):
    ids = tokenizer.encode(" Paris.\n\nThe answer")
    detok = IncrementalDetokenizer(tokenizer)
    stop = ["\n\nThe"]
    shown = []
    for i, tok in enumerate(ids):
        if "\n\nThe" in tokenizer.decode(ids[: i + 1]):
            break  # the scheduler finishes the request here
        c = chunk("s", [tok])
        c.stop_strs = stop
        shown.append(detok.step(c))
    assert len(shown) >= 3 and shown[-1] == " Paris."
    assert all(not t.endswith("\n") for t in shown), shown
