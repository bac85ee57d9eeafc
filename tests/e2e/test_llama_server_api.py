"""llama-server's endpoints (/completion, /props, /slots, slot files, /tokenize and /detokenize in
its shapes) against radixlm's own /generate on the same server (greedy text, logprobs) and
llama.cpp's example grammars (grammars/*.gbnf, written here), whose outputs are parsed back: JSON
by json.loads, the others by equivalent regular expressions."""

import json
import os

import jsonschema
import pytest
import regex
import requests

from radixlm.server.process import ServerProcess

PROMPT = "The capital of France is"
LONG_PROMPT = (
    "Here is a short story about a lighthouse keeper who lived alone on a small island in the"
    " north sea, and the storm that changed his life. Once upon a time"
)

# llama.cpp's grammars/json.gbnf (it uses an empty alternative, which the translation fills in).
JSON_GBNF = r"""root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"""
# llama.cpp's grammars/list.gbnf
LIST_GBNF = r"""root ::= item+

# Excludes various line break characters
item ::= "- " [^\r\n\x0b\x0c\x85\u2028\u2029]+ "\n"
"""
LIST_RE = r"(- [^\r\n\x0b\x0c\x85\u2028\u2029]+\n)+"
# llama.cpp's grammars/chess.gbnf
CHESS_GBNF = r"""# Specifies chess moves as a list in algebraic notation, using PGN conventions

# Force first move to "1. ", then any 1-2 digit number after, relying on model to follow the pattern
root    ::= "1. " move " " move "\n" ([1-9] [0-9]? ". " move " " move "\n")+
move    ::= (pawn | nonpawn | castle) [+#]?

# piece type, optional file/rank, optional capture, dest file & rank
nonpawn ::= [NBKQR] [a-h]? [1-8]? "x"? [a-h] [1-8]

# optional file & capture, dest file & rank, optional promotion
pawn    ::= ([a-h] "x")? [a-h] [1-8] ("=" [NBKQR])?

castle  ::= "O-O" "-O"?
"""
_MOVE = r"(([a-h]x)?[a-h][1-8](=[NBKQR])?|[NBKQR][a-h]?[1-8]?x?[a-h][1-8]|O-O(-O)?)[+#]?"
CHESS_RE = rf"1\. {_MOVE} {_MOVE}\n([1-9][0-9]?\. {_MOVE} {_MOVE}\n)+"


@pytest.fixture(scope="module")
def slot_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("slots"))


@pytest.fixture(scope="module")
def url(slot_dir):
    s = ServerProcess("--slot-save-path", slot_dir, "--enable-invariant-checks")
    yield s.url
    s.stop()


def post(url, path, body, **kw):
    return requests.post(url + path, json=body, timeout=300, **kw)


def completion(url, **body):
    r = post(url, "/completion", body)
    assert r.status_code == 200, r.text
    return r.json()


def generate(url, prompt, n, **extra):
    body = {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": n}, **extra}
    r = post(url, "/generate", body)
    assert r.status_code == 200, r.text
    return r.json()


def stream_events(url, **body):
    r = post(url, "/completion", {**body, "stream": True}, stream=True)
    assert r.status_code == 200, r.text
    lines = [ln for ln in r.iter_lines() if ln]
    assert all(ln.startswith(b"data: ") for ln in lines), lines
    assert lines[-1] != b"data: [DONE]"  # llama-server's /completion sends none
    return [json.loads(ln[6:]) for ln in lines]


def prompt_ids(url, text):
    r = post(url, "/tokenize", {"text": text})  # radixlm's shape: the ids /generate runs on
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def error_of(r, status, field):
    """llama-server's error shape, naming the field."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["type"] and field in err["message"], err
    return err


def test_completion_equals_generate_greedy(url):
    ref = generate(url, PROMPT, 16)
    out = completion(url, prompt=PROMPT, temperature=0, n_predict=16, return_tokens=True)
    assert out["content"] == ref["text"]
    assert out["tokens"] == ref["output_ids"]
    assert out["stop"] is True and out["stop_type"] == "limit" and out["stopping_word"] == ""
    assert out["tokens_predicted"] == 16
    assert out["tokens_evaluated"] == len(prompt_ids(url, PROMPT))
    assert out["truncated"] is False
    t = out["timings"]
    assert t["predicted_n"] == 16 and t["prompt_n"] + t["cache_n"] == out["tokens_evaluated"]
    assert t["cache_n"] == out["tokens_cached"] and t["prompt_ms"] > 0 and t["predicted_ms"] > 0
    assert out["generation_settings"]["n_predict"] == 16
    assert out["generation_settings"]["temperature"] == 0

    events = stream_events(url, prompt=PROMPT, temperature=0, n_predict=16)
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == ref["text"]
    assert [t for e in events for t in e["tokens"]] == ref["output_ids"]
    assert events[-1]["stop_type"] == "limit" and events[-1]["tokens_predicted"] == 16


def test_token_id_prompt_and_stop_word(url):
    ids = prompt_ids(url, PROMPT)
    by_text = completion(url, prompt=PROMPT, temperature=-1, n_predict=8)  # < 0: greedy
    by_ids = completion(url, prompt=ids, temperature=0, n_predict=8)
    assert by_ids["content"] == by_text["content"] and by_ids["tokens_evaluated"] == len(ids)
    word = by_text["content"].split()[1]  # a word the greedy answer reaches
    stopped = completion(url, prompt=PROMPT, temperature=0, n_predict=8, stop=[word])
    assert stopped["stop_type"] == "word" and stopped["stopping_word"] == word
    assert stopped["content"] == by_text["content"][: by_text["content"].index(word)]


def test_n_probs_match_generate_logprobs(url):
    ref = generate(url, PROMPT, 6, return_logprob=True, top_logprobs_num=3)["meta_info"]
    out = completion(url, prompt=PROMPT, temperature=0, n_predict=6, n_probs=3)
    probs = out["completion_probabilities"]
    assert len(probs) == len(ref["output_token_logprobs"]) == len(ref["output_top_logprobs"]) == 6
    for p, (lp, tid, _), top in zip(
        probs, ref["output_token_logprobs"], ref["output_top_logprobs"]
    ):
        assert p["id"] == tid and p["logprob"] == pytest.approx(lp, abs=1e-5)
        assert p["bytes"] == list(p["token"].encode())
        assert [e["id"] for e in p["top_logprobs"]] == [t for _, t, _ in top]
        assert [e["logprob"] for e in p["top_logprobs"]] == pytest.approx(
            [x for x, _, _ in top], abs=1e-5
        )
    streamed = stream_events(url, prompt=PROMPT, temperature=0, n_predict=6, n_probs=3)
    per_token = [p for e in streamed for p in e.get("completion_probabilities", [])]
    assert [p["id"] for p in per_token] == [p["id"] for p in probs]


@pytest.mark.parametrize(
    "grammar, prompt, check",
    [
        (JSON_GBNF, 'A cat as JSON: {"name": "Tom", "age": 3}\nA dog as JSON:', "json"),
        (LIST_GBNF, "My favourite fruits are", LIST_RE),
        (CHESS_GBNF, "The moves of a famous chess game:\n", CHESS_RE),
    ],
    ids=["json.gbnf", "list.gbnf", "chess.gbnf"],
)
def test_gbnf_grammar_constrains_output(url, grammar, prompt, check):
    out = completion(url, prompt=prompt, temperature=0, n_predict=40, grammar=grammar)
    text = out["content"]
    if check == "json":  # the grammar's root is a complete object: the model ends it
        assert out["stop_type"] == "eos", text
        assert isinstance(json.loads(text), dict)
        return
    assert out["stop_type"] in ("eos", "limit")
    # At the limit the output is a prefix of a sentence of the grammar (partial match).
    assert regex.fullmatch(check, text, partial=out["stop_type"] == "limit"), text
    assert out["stop_type"] == "eos" or out["tokens_predicted"] == 40
    free = completion(url, prompt=prompt, temperature=0, n_predict=12)["content"]
    assert not regex.fullmatch(check, free, partial=True), free  # the grammar made the difference


def test_json_schema_output_is_valid(url):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    out = completion(
        url, prompt="A person as JSON:\n", temperature=0, n_predict=64, json_schema=schema
    )
    assert out["stop_type"] == "eos"
    jsonschema.validate(json.loads(out["content"]), schema)


def test_props_and_slots(url):
    info = requests.get(url + "/get_server_info", timeout=60).json()
    props = requests.get(url + "/props", timeout=60).json()
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == info["context_len"] and settings["is_processing"] is False
    assert settings["params"]["n_predict"] == -1
    assert props["total_slots"] == info["max_running_requests"]
    model_info = requests.get(url + "/get_model_info", timeout=60).json()
    assert props["model_path"] == model_info["model_path"]
    assert "{%" in props["chat_template"]  # the tokenizer's Jinja template
    completion(url, prompt=PROMPT, temperature=0, n_predict=3, id_slot=2)
    slots = requests.get(url + "/slots", timeout=60).json()
    assert [s["id"] for s in slots] == list(range(props["total_slots"]))
    s2 = slots[2]
    assert s2["is_processing"] is False and s2["next_token"]["n_decoded"] == 3
    assert s2["n_prompt_tokens"] == len(prompt_ids(url, PROMPT))
    assert s2["params"]["n_predict"] == 3


def test_slot_save_flush_restore(url, slot_dir):
    n = len(prompt_ids(url, LONG_PROMPT))
    first = completion(url, prompt=LONG_PROMPT, temperature=0, n_predict=16, id_slot=1)
    saved = post(url, "/slots/1?action=save", {"filename": "story.bin"})
    assert saved.status_code == 200, saved.text
    assert saved.json()["n_saved"] == n and saved.json()["n_written"] > 0
    assert os.path.getsize(os.path.join(slot_dir, "story.bin")) == saved.json()["n_written"]

    assert post(url, "/flush_cache", None).status_code == 200
    cold = completion(url, prompt=LONG_PROMPT, temperature=0, n_predict=1)
    assert cold["tokens_cached"] == 0  # flushed: nothing of it is cached
    assert post(url, "/flush_cache", None).status_code == 200

    restored = post(url, "/slots/0?action=restore", {"filename": "story.bin"})
    assert restored.status_code == 200, restored.text
    assert restored.json()["n_restored"] == n
    warm = completion(url, prompt=LONG_PROMPT, temperature=0, n_predict=16)
    assert warm["tokens_cached"] == n - 1  # all but the last prompt token, which is recomputed
    assert warm["content"] == first["content"]  # the restored KV is the prompt's

    erased = post(url, "/slots/0?action=erase", None)
    assert erased.status_code == 200 and erased.json() == {"id_slot": 0, "n_erased": n}
    error_of(post(url, "/slots/0?action=save", {"filename": "x.bin"}), 400, "no prompt")


def test_tokenize_detokenize_llama_shapes(url):
    text = "Hello wörld"
    plain = post(url, "/tokenize", {"content": text}).json()["tokens"]
    pieces = post(url, "/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == plain
    assert "".join(p["piece"] for p in pieces) == text
    assert post(url, "/detokenize", {"tokens": plain}).json()["content"] == text
    # radixlm's own shapes still answer
    assert post(url, "/tokenize", {"text": text}).json()["count"] == len(prompt_ids(url, text))
    assert post(url, "/detokenize", {"tokens": plain}).json()["text"] == text


@pytest.mark.parametrize(
    "body, field",
    [
        ({"prompt": PROMPT, "n_predict": "x"}, "n_predict"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"prompt": PROMPT, "top_p": 2.0}, "top_p"),
        ({"prompt": PROMPT, "repeat_penalty": -1.0}, "repeat_penalty"),
        ({"prompt": PROMPT, "grammar": "root ::= undefined-rule"}, "grammar"),
        ({"prompt": PROMPT, "grammar": "root ::= <[1000]>"}, "grammar"),
        ({"prompt": PROMPT, "grammar": "root ::= x", "json_schema": {}}, "grammar"),
        ({"prompt": PROMPT, "id_slot": 10_000}, "id_slot"),
        ({"prompt": PROMPT, "mirostat": 2}, "mirostat"),
    ],
)
def test_bad_completion_input(url, body, field):
    error_of(post(url, "/completion", body), 400, field)


def test_bad_slot_actions(url):
    completion(url, prompt=PROMPT, temperature=0, n_predict=1, id_slot=3)
    for name in ("../escape.bin", "/etc/passwd", "..", ".hidden", "a\\b", ""):
        error_of(post(url, "/slots/3?action=save", {"filename": name}), 400, "filename")
    error_of(post(url, "/slots/3?action=restore", {"filename": "missing.bin"}), 404, "missing")
    error_of(post(url, "/slots/3?action=explode", {"filename": "a.bin"}), 400, "action")
    error_of(post(url, "/slots/99999?action=save", {"filename": "a.bin"}), 400, "id_slot")
    error_of(post(url, "/tokenize", {"content": 3}), 400, "content")
    # the server still serves
    assert completion(url, prompt=PROMPT, temperature=0, n_predict=2)["tokens_predicted"] == 2
