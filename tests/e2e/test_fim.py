"""Fill-in-the-middle: completions' `suffix` and llama-server's /infill build the tokenizer's FIM
layout (checked against ids put together here from the tokenizer's special token ids), answer
greedy what /generate answers on those ids, and refuse a model without FIM tokens with a 400."""

import json

import ollama
import openai
import pytest
import requests
import torch

from radixlm.server.fim import FIM_SPELLINGS, fim_tokens
from radixlm.server.process import ServerProcess
from tests.forked_servers import run_cli

TINY = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")
FIM = (
    "<fim_prefix>",
    "<fim_suffix>",
    "<fim_middle>",
    "<fim_pad>",
)  # StarCoder's / SmolLM's spellings
PREFIX, SUFFIX = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"


def _tokenizer_with(default_model_path, tokens):
    from radixlm.model.loader import load_tokenizer

    tok = load_tokenizer(default_model_path)
    tok.add_special_tokens({"additional_special_tokens": list(tokens)})
    return tok


@pytest.fixture(scope="module")
def fim_model_dir(tmp_path_factory, default_model_path):
    """The tiny random Llama with a code model's FIM tokens added to its tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny-fim")
    tok = _tokenizer_with(default_model_path, FIM)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        initializer_range=0.25,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).eval().save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def fim_server(fim_model_dir):
    s = ServerProcess("--model-path", fim_model_dir, *TINY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tok(fim_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(fim_model_dir)


def special(tok, text) -> int:
    assert text in tok.get_vocab(), text
    return tok.convert_tokens_to_ids(text)


def enc(tok, text) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def generate(server, ids, **sp) -> dict:
    r = requests.post(
        server.url + "/generate",
        json={"input_ids": ids, "sampling_params": {"temperature": 0, **sp}},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_completions_suffix_is_the_fim_layout(fim_server, tok):
    client = openai.OpenAI(base_url=fim_server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    out = client.completions.create(
        model=model,
        prompt=PREFIX,
        suffix=SUFFIX,
        max_tokens=8,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    want = [
        special(tok, "<fim_prefix>"),
        *enc(tok, PREFIX),
        special(tok, "<fim_suffix>"),
        *enc(tok, SUFFIX),
        special(tok, "<fim_middle>"),
    ]
    assert tok("x").input_ids[:1] != [
        tok.bos_token_id
    ]  # this tokenizer writes no BOS: none in the layout
    choice = out.choices[0]
    assert choice.model_extra["prompt_token_ids"] == want
    ref = generate(fim_server, want, max_new_tokens=8)
    assert (
        ref["output_ids"]
        and choice.text == ref["text"]
        and choice.model_extra["token_ids"] == ref["output_ids"]
    )
    # A prompt given as token ids is the prefix's ids; an empty suffix is a plain completion
    # (SGLang).
    by_ids = client.completions.create(
        model=model,
        prompt=enc(tok, PREFIX),
        suffix=SUFFIX,
        max_tokens=1,
        extra_body={"return_token_ids": True},
    )
    assert by_ids.choices[0].model_extra["prompt_token_ids"] == want
    plain = client.completions.create(
        model=model, prompt=PREFIX, suffix="", max_tokens=1, extra_body={"return_token_ids": True}
    )
    assert plain.choices[0].model_extra["prompt_token_ids"] == tok.encode(PREFIX)


def test_ollama_generate_suffix_is_the_fim_layout(fim_server, tok):
    """Ollama's /api/generate with `suffix` (the official `ollama` client): /generate's greedy
    answer on the FIM layout's ids, the prompt counted as that layout."""
    want = [
        special(tok, "<fim_prefix>"),
        *enc(tok, PREFIX),
        special(tok, "<fim_suffix>"),
        *enc(tok, SUFFIX),
        special(tok, "<fim_middle>"),
    ]
    ref = generate(fim_server, want, max_new_tokens=8)
    client = ollama.Client(host=fim_server.url, timeout=120)
    model = client.list().models[0].model
    assert "insert" in client.show(model).capabilities
    got = client.generate(
        model=model, prompt=PREFIX, suffix=SUFFIX, options={"temperature": 0, "num_predict": 8}
    )
    assert got.response == ref["text"] and got.prompt_eval_count == len(want)
    assert got.eval_count == len(ref["output_ids"])


def test_infill_is_llama_servers_layout(fim_server, tok):
    extra = [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}]
    body = {
        "input_prefix": PREFIX,
        "input_suffix": SUFFIX,
        "input_extra": extra,
        "prompt": "a",
        "n_predict": 6,
        "temperature": 0,
        "return_tokens": True,
    }
    r = requests.post(fim_server.url + "/infill", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    # This vocabulary has <reponame> (llama.cpp's FIM_REP) and no <|file_sep|>: the repo name, then
    # each chunk after llama-server's snippet separator; <FIM_MID> then `prompt` (its README).
    want = [
        special(tok, "<reponame>"),
        *enc(tok, "myproject\n"),
        *enc(tok, "\n\n--- snippet ---\n\n"),
        *enc(tok, extra[0]["text"]),
        special(tok, "<fim_prefix>"),
        *enc(tok, PREFIX),
        special(tok, "<fim_suffix>"),
        *enc(tok, SUFFIX),
        special(tok, "<fim_middle>"),
        *enc(tok, "a"),
    ]
    assert out["prompt"] == tok.decode(want) and out["tokens_evaluated"] == len(want)
    # llama.cpp ends a FIM answer at its pad / repo / file-separator tokens too.
    ref = generate(
        fim_server,
        want,
        max_new_tokens=6,
        stop_token_ids=[special(tok, "<fim_pad>"), special(tok, "<reponame>")],
    )
    assert (
        ref["output_ids"] and out["content"] == ref["text"] and out["tokens"] == ref["output_ids"]
    )
    stop_type = "limit" if ref["meta_info"]["finish_reason"]["type"] == "length" else "eos"
    assert (
        out["stop"] is True
        and out["stop_type"] == stop_type
        and out["tokens_predicted"] == len(ref["output_ids"])
    )
    # Streamed: the same text in pieces, the last event with stop true.
    r = requests.post(
        fim_server.url + "/infill", json={**body, "stream": True}, timeout=120, stream=True
    )
    events = [line[6:] for line in r.iter_lines(decode_unicode=True) if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events]
    assert "".join(c["content"] for c in chunks) == ref["text"] and chunks[-1]["stop"] is True
    assert [t for c in chunks for t in c["tokens"]] == ref["output_ids"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"input_prefix": "a"}, "input_suffix"),
        (
            {"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "x"}]},
            "input_extra.0.text",
        ),
        ({"input_prefix": "a", "input_suffix": "b", "n_predict": -2}, "n_predict"),
        ({"input_prefix": "a", "input_suffix": "b", "top_p": 7}, "top_p"),
        ({"input_prefix": "a", "input_suffix": "b", "mirostat": 2}, "mirostat"),
        ({"input_prefix": [1.5], "input_suffix": "b"}, "input_prefix"),
    ],
)
def test_infill_bad_fields_are_400_naming_them(fim_server, body, field):
    r = requests.post(fim_server.url + "/infill", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
    assert requests.get(fim_server.url + "/health", timeout=10).status_code == 200


def test_model_without_fim_tokens_is_a_400(server):
    """The default model (SmolLM2's tokenizer has no FIM tokens)."""
    r = requests.post(
        server.url + "/v1/completions", json={"prompt": PREFIX, "suffix": SUFFIX}, timeout=60
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    assert "fill-in-the-middle" in r.json()["error"]["message"]
    r = requests.post(
        server.url + "/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX}, timeout=60
    )
    assert r.status_code == 400 and "fill-in-the-middle" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "spellings",
    [
        ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, SmolLM, Granite
        ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-coder
        ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-coder
    ],
)
def test_fim_tokens_are_found_by_their_spellings(default_model_path, spellings):
    tok = _tokenizer_with(default_model_path, spellings)
    fim = fim_tokens(tok)
    assert (fim.pre, fim.suf, fim.mid) == tuple(tok.convert_tokens_to_ids(list(spellings)))
    assert all(s in FIM_SPELLINGS[r] for r, s in zip(("pre", "suf", "mid"), spellings))


def test_completion_template_naming_missing_tokens_is_one_error_line(fim_model_dir):
    r = run_cli(
        ["serve", "--model-path", fim_model_dir, "--completion-template", "qwen_coder"],
        timeout=120,
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and "--completion-template qwen_coder" in lines[0]
        and "<|fim_prefix|>" in lines[0]
    )
