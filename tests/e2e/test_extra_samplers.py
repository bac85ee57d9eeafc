"""The extra samplers over HTTP (issue 49), on a tiny random Llama, against HF transformers' logits
with each sampler's definition applied by hand (tests/sampler_refs.py), through native /generate
and the `openai` client. Each test runs on a server with overlap scheduling and on one with ngram
speculative decoding: rows with these samplers are neither overlapped nor drafted."""

import openai
import pytest
import requests
import torch

from radixlm.sampling_params import SamplingParams
from radixlm.server.process import ServerProcess
from tests.sampler_refs import ref_bad_word_bans, ref_dry, vllm_bad_word_forms

TINY = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")
PROMPT = "Once upon a time, in a land far away, there lived a"
N = 16


@pytest.fixture(scope="module", params=["overlap", "ngram"])
def srv(request, tiny_model_dir):
    extra = (
        ("--enable-overlap-schedule",)
        if request.param == "overlap"
        else ("--speculative-algorithm", "ngram")
    )
    s = ServerProcess("--model-path", tiny_model_dir, *TINY, *extra)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from radixlm.model.loader import load_tokenizer

    return load_tokenizer(tiny_model_dir)


def served(s) -> str:
    return requests.get(s.url + "/v1/models", timeout=30).json()["data"][0]["id"]


def generate(srv, **sp) -> dict:
    body = {
        "text": PROMPT,
        "sampling_params": {"max_new_tokens": N, "ignore_eos": True, "temperature": 0, **sp},
    }
    r = requests.post(srv.url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def completion(srv, **extra) -> str:
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
    return (
        c.completions.create(
            model=served(srv),
            prompt=PROMPT,
            max_tokens=N,
            temperature=0,
            extra_body={"ignore_eos": True, **extra},
        )
        .choices[0]
        .text
    )


def hf_decode(hf, tokenizer, adjust, n=N) -> list[int]:
    """HF's greedy decoding with adjust(logits, output so far, whole sequence) applied at each
    step."""
    seq, out = tokenizer.encode(PROMPT), []
    for _ in range(n):
        with torch.no_grad():
            logits = hf(torch.tensor([seq])).logits[0, -1].float()
        t = int(adjust(logits.clone(), out, seq).argmax())
        out.append(t)
        seq.append(t)
    return out


def contains(ids, form) -> bool:
    return any(
        tuple(ids[i : i + len(form)]) == tuple(form) for i in range(len(ids) - len(form) + 1)
    )


def test_bad_words_never_appear_where_greedy_output_has_them(srv, tokenizer, tiny_hf_model):
    plain = generate(srv)["output_ids"]
    word = next(
        w
        for w in (tokenizer.decode([t]).strip() for t in plain)
        if w.isalpha() and any(contains(plain, f) for f in vllm_bad_word_forms(tokenizer, w))
    )
    forms = vllm_bad_word_forms(tokenizer, word)
    out = generate(srv, bad_words=[word])
    assert not any(contains(out["output_ids"], f) for f in forms), (word, forms, out["output_ids"])

    def ban(logits, output, _seq):
        logits[list(ref_bad_word_bans(forms, output))] = -torch.inf
        return logits

    assert out["output_ids"] == hf_decode(tiny_hf_model, tokenizer, ban)
    assert completion(srv, bad_words=[word]) == out["text"]


def test_allowed_token_ids_confine_the_output(srv, tokenizer, tiny_hf_model):
    g = torch.Generator().manual_seed(0)
    allowed = sorted(torch.randperm(len(tokenizer), generator=g)[:40].tolist())
    out = generate(srv, allowed_token_ids=allowed)
    assert set(out["output_ids"]) <= set(allowed)

    def confine(logits, _out, _seq):
        keep = torch.full_like(logits, -torch.inf)
        keep[allowed] = 0
        return logits + keep

    assert out["output_ids"] == hf_decode(tiny_hf_model, tokenizer, confine)
    for seed in range(3):  # sampled rows too
        assert set(
            generate(srv, allowed_token_ids=allowed, temperature=1.0, sampling_seed=seed)[
                "output_ids"
            ]
        ) <= set(allowed)
    assert completion(srv, allowed_token_ids=allowed) == out["text"]


def test_dry_follows_llama_cpps_penalty(srv, tokenizer, tiny_hf_model):
    """Confined to five tokens (allowed_token_ids) the output must repeat itself: DRY then decides
    tokens, as llama.cpp defines it (the prompt counts, the default sequence breakers)."""
    from radixlm.engine.request_sampling import RequestSampling
    from radixlm.sampling_params import DRY_SEQUENCE_BREAKERS

    allowed = tokenizer.encode(" the cat sat on mat", add_special_tokens=False)
    dry = dict(dry_multiplier=4.0, dry_base=1.75, dry_allowed_length=2)
    plain, out = (
        generate(srv, allowed_token_ids=allowed),
        generate(srv, allowed_token_ids=allowed, **dry),
    )
    assert out["output_ids"] != plain["output_ids"]
    sp = SamplingParams(**dry)
    single, multi = RequestSampling(tokenizer, len(tokenizer)).breaker_forms(DRY_SEQUENCE_BREAKERS)

    def confine_and_penalize(logits, _out, seq):
        keep = torch.full_like(logits, -torch.inf)
        keep[allowed] = 0
        logits = logits + keep
        for tok, pen in ref_dry(seq, sp, single, multi).items():
            logits[tok] -= pen
        return logits

    assert out["output_ids"] == hf_decode(tiny_hf_model, tokenizer, confine_and_penalize)
    assert completion(srv, allowed_token_ids=allowed, **dry) == out["text"]


def test_typical_p_and_xtc_at_their_deterministic_extremes(srv, tokenizer, tiny_hf_model):
    """typical_p near 0 keeps only the most typical token; XTC with probability 1 and threshold 0
    keeps only the least likely of the candidates (here the top 5): any seed gives those tokens."""
    from transformers.generation.logits_process import TypicalLogitsWarper

    typical = [
        generate(srv, temperature=1.0, typical_p=1e-6, sampling_seed=s)["output_ids"]
        for s in range(2)
    ]
    want = hf_decode(
        tiny_hf_model,
        tokenizer,
        lambda x, _o, _s: TypicalLogitsWarper(1e-6)(None, x.unsqueeze(0))[0],
    )
    assert typical == [want, want]
    xtc = [
        generate(
            srv, temperature=1.0, top_k=5, xtc_probability=1.0, xtc_threshold=0.0, sampling_seed=s
        )
        for s in range(2)
    ]

    def fifth(logits, _o, _s):
        out = torch.full_like(logits, -torch.inf)
        out[logits.topk(5).indices[-1]] = 0
        return out

    want = hf_decode(tiny_hf_model, tokenizer, fifth)
    assert [x["output_ids"] for x in xtc] == [want, want]
    assert (
        completion(srv, temperature=1.0, top_k=5, xtc_probability=1.0, xtc_threshold=0.0)
        == xtc[0]["text"]
    )


def test_min_tokens_is_min_new_tokens(srv):
    plain = generate(srv)["output_ids"]
    stop = {"stop_token_ids": [plain[1]], "ignore_eos": False}
    assert len(generate(srv, **stop)["output_ids"]) == 2
    out, same = generate(srv, min_tokens=6, **stop), generate(srv, min_new_tokens=6, **stop)
    assert len(out["output_ids"]) >= 6 and (out["output_ids"], out["text"]) == (
        same["output_ids"],
        same["text"],
    )
    assert completion(srv, min_tokens=6, **stop) == out["text"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("typical_p", 0),
        ("xtc_threshold", 2),
        ("xtc_probability", -1),
        ("dry_base", 0.5),
        ("dry_allowed_length", 0),
        ("dry_penalty_last_n", -5),
        ("dry_sequence_breakers", [""]),
        ("bad_words", [" "]),
        ("allowed_token_ids", []),
        ("allowed_token_ids", [10**9]),
        ("min_tokens", -1),
    ],
)
def test_bad_values_are_a_400_naming_the_field(srv, field, value):
    why = f"{field} must"  # the range it breaks (not "unknown field")
    r = requests.post(
        srv.url + "/generate", json={"text": "hi", "sampling_params": {field: value}}, timeout=60
    )
    assert r.status_code == 400 and why in r.json()["error"]["message"], r.text
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError, match=why):
        c.completions.create(
            model=served(srv), prompt="hi", max_tokens=2, extra_body={field: value}
        )
    with pytest.raises(openai.BadRequestError, match=why):
        c.chat.completions.create(
            model=served(srv),
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            extra_body={field: value},
        )
    assert len(generate(srv, max_new_tokens=2)["output_ids"]) == 2  # still serving
