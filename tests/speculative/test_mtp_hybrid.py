"""A hybrid's own multi-token-prediction head drafts (`--speculative-algorithm nextn` on the `mtp.*`
block of Qwen3.5, Qwen3.5-MoE and Qwen3-Next, and on Qwen3.5's from the Q8_0 GGUF llama.cpp's
converter writes with the head kept): greedy tokens exactly those of speculation off, token for
token, alone, 8 requests of different lengths at once in prefill chunks, a second turn after its
cached first, and a branch inside a cached prompt resumed at its state snapshot; the head drafts
every step (a random head's drafts are rejected: the rows keep their roots' states) and the KV /
state invariants hold after every step (the harness checks them). Fitted to the model's own answers
(`train-eagle --mtp`, which writes the `mtp.*` names back), the head's drafts are accepted (> 0.5 by
the Engine's counters and each answer's meta_info), from the safetensors and from the Q8_0 GGUF of
them, and the outputs stay exact; at temperature 1 its drafts keep the target's distribution
(rejection sampling). With the fitted head, a regex-constrained answer, logprobs (top 2) and n = 2
are speculation off's too; LoRA with nextn is refused at start-up (as with any draft source), and
EAGLE heads trained for a model stay refused on hybrids."""

from __future__ import annotations

import os
import random

import pytest
import torch

from radixlm import Engine
from radixlm.cli import main
from radixlm.model.loader import load_tokenizer
from radixlm.speculative.eagle_prompts import default_prompts
from radixlm.speculative.mtp_train import install_mtp_fit
from tests.conftest import engine_args
from tests.model.hybrid_checkpoints import tiny_tokenizer
from tests.scheduler.harness import Driver, make_scheduler
from tests.speculative.conftest import train_args
from tests.speculative.qwen35_mtp_checkpoint import mtp_gguf, qwen35_mtp_checkpoint
from tests.speculative.test_spec_engine import check_sampling_distribution

NEW = 10
GREEDY = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
# 64-token chunks and a snapshot every 64 prompt tokens (a branch resumes inside a cached prompt).
POOL = dict(
    max_total_tokens=2048,
    max_mamba_cache_size=64,
    chunked_prefill_size=64,
    mamba_track_interval=64,
    max_running_requests=8,
)


# Where the model and its head come from: Qwen3.5's HF directory, the Q8_0 GGUF of it (the head's
# matrices kept in Q8_0 blocks), Qwen3-Next's and Qwen3.5-MoE's directories (their MTP layers'
# MLPs mixtures of experts, as the models'; Qwen3-Next's config announces no head: its tensors do).
# Qwen3.5-MoE's head is built and drafts as Qwen3-Next's (the same layer class over the same MoE),
# Qwen3-Next's GGUF loads through the same qwen35.py code as Qwen3.5's (its experts as the model's)
# and each costs ~15 s: `pytest -m extended` runs them.
EXTENDED = pytest.mark.extended(reason="the same MTP layer, MoE and GGUF code as the default cases")
SOURCES = [
    pytest.param("qwen35", id="qwen35-hf"),
    pytest.param("qwen35-gguf", id="qwen35-gguf-q8_0"),
    pytest.param("qwen3next", id="qwen3next-hf"),
    pytest.param("qwen35moe", id="qwen35moe-hf", marks=EXTENDED),
    pytest.param("qwen3next-gguf", id="qwen3next-gguf-q8_0", marks=EXTENDED),
]


@pytest.fixture(scope="module")
def mtp_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("qwen35-mtp"))
    qwen35_mtp_checkpoint(path, tiny_tokenizer(), max_position_embeddings=2048)
    return path


@pytest.fixture(scope="module")
def mtp_model(request, mtp_dir, tmp_path_factory):
    """The model path of a SOURCES entry."""
    if request.param == "qwen35":
        return mtp_dir
    if request.param == "qwen35-gguf":
        return mtp_gguf(mtp_dir, str(tmp_path_factory.mktemp("qwen35-gguf") / "m.gguf"), "q8_0")
    arch, _, fmt = request.param.partition("-")
    path = str(tmp_path_factory.mktemp(f"{arch}-mtp"))
    qwen35_mtp_checkpoint(path, tiny_tokenizer(), arch=arch, max_position_embeddings=2048)
    return mtp_gguf(path, os.path.join(path, "m.gguf"), "q8_0") if fmt == "gguf" else path


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 800) for _ in range(n)]


def _run(d: Driver, prompts: list[list[int]], together: bool) -> tuple[list[list[int]], int]:
    """Outputs, and the prompt tokens the last request found cached."""
    rids = []
    for p in prompts:
        rids.append(d.submit(p, **GREEDY))
        if not together:
            d.run()
    d.run()
    return [d.results[r].output_ids for r in rids], d.results[rids[-1]].cached_tokens


def _workload(d: Driver) -> dict:
    rng = random.Random(3)
    out = {"alone": _run(d, [_tokens(rng, 6), _tokens(rng, 40)], together=False)[0]}
    batch = [_tokens(rng, 8 + 19 * i) for i in range(8)]  # 8 to 141 tokens, in 64-token chunks
    out["batch"] = _run(d, batch, together=True)[0]
    turn1 = _tokens(rng, 40)
    (first,), _ = _run(d, [turn1], together=False)
    out["turns"], out["turn2_cached"] = _run(d, [turn1 + first + _tokens(rng, 7)], together=False)
    long = _tokens(rng, 140)
    out["branch"], out["branch_cached"] = _run(d, [long, long[:100] + _tokens(rng, 20)], False)
    return out


@pytest.mark.parametrize("mtp_model", SOURCES, indirect=True)
def test_nextn_on_a_hybrid_gives_the_plain_greedy_tokens(mtp_model):
    plain = _workload(Driver(make_scheduler(mtp_model, **POOL)))
    d = Driver(make_scheduler(mtp_model, speculative_algorithm="nextn", **POOL))
    head = d.s.spec.controller.source.head  # the checkpoint's own MTP block drafts
    assert type(head).__name__ == "MtpHead" and head.cfg.layer_index == 4
    if mtp_model.endswith(".gguf"):  # in the file's own quantization
        ly = head.layer
        mlp = [ly.mlp.down_proj] if hasattr(ly.mlp, "down_proj") else []  # dense (MoE: experts)
        for linear in [ly.eh_proj, ly.self_attn.qkv_proj, ly.self_attn.o_proj, *mlp]:
            assert linear.qweight is not None and linear.weight is None
    spec = _workload(d)
    assert spec == plain
    assert plain["turn2_cached"] >= 40 + NEW - 1 and plain["branch_cached"] >= 64
    info = d.s.spec.info()
    # every decode step of every request drafted with the head and verified the drafts
    assert info["spec_verify_steps"] > 0 and info["spec_draft_tokens"] >= info["spec_verify_steps"]


def test_trained_eagle_heads_stay_refused_on_hybrids(mtp_dir):
    with pytest.raises(ValueError, match=r"a hybrid model\) is not served with EAGLE heads"):
        make_scheduler(mtp_dir, speculative_algorithm="eagle", speculative_draft_model_path=mtp_dir)


@pytest.fixture(scope="module")
def fitted_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("qwen35-mtp-fitted"))
    qwen35_mtp_checkpoint(path, tiny_tokenizer(), transparent=True, max_position_embeddings=2048)
    out = str(tmp_path_factory.mktemp("qwen35-mtp-fit-out"))
    assert main(train_args(path, out, "--mtp", "--epochs", "40", "--save-every", "1000")) == 0
    install_mtp_fit(os.path.join(out, "mtp_fit.safetensors"), path)
    return path


def _chat_prompts(tok, n: int, seed: int) -> list[list[int]]:
    return [
        tok.encode(
            tok.apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
            )
        )
        for p in default_prompts(n, seed=seed)
    ]


def assert_fitted_head_accepted_exactly(path: str) -> None:
    """nextn's greedy tokens = the plain scheduler's, with > 0.5 of the drafts accepted by the
    Engine's counters and by meta_info."""
    d = Driver(make_scheduler(path))
    prompts = _chat_prompts(d.s.tokenizer.get(), 6, seed=9)
    sp = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}
    rids = [d.submit(p, **sp) for p in prompts]
    d.run()
    plain = [d.results[r].output_ids for r in rids]
    steps = 2
    with Engine(
        path,
        **engine_args(
            speculative_algorithm="nextn",
            speculative_draft_policy="fixed",
            speculative_num_steps=steps,
        ),
    ) as e:
        outs = e.generate(input_ids=prompts, sampling_params=sp)
        st = e.get_internal_state()
    assert [o["output_ids"] for o in outs] == plain
    assert st["spec_accepted_tokens"] / st["spec_draft_tokens"] > 0.5, st
    meta = [o["meta_info"] for o in outs]
    drafted = sum(steps * m["spec_verify_ct"] for m in meta)  # at most; fewer near the end
    assert sum(m["spec_accepted_tokens"] for m in meta) / drafted > 0.5, meta


@pytest.mark.parametrize("source", ["hf", "gguf-q8_0"])
def test_fitted_head_drafts_are_accepted_exactly(fitted_dir, source, tmp_path):
    """From the directory, and from its Q8_0 GGUF (target and head in Q8_0 blocks, plain decoding
    of that file the reference): `--model-path X.gguf --speculative-algorithm nextn`."""
    path = fitted_dir if source == "hf" else mtp_gguf(fitted_dir, str(tmp_path / "f.gguf"), "q8_0")
    assert_fitted_head_accepted_exactly(path)


def test_sampling_distribution_unchanged(fitted_dir):
    """Top-k 4 on the hybrid: the fitted head's drafts accepted or rejected by rejection sampling
    (some of each, each rejected draft's state dropped), the 3-token outcomes' frequencies match
    plain sampling's. Temperature 24: this model's top logit stands ~36 above the next three
    (hybrid_checkpoints' LM head x8, the transparent layers), so temperature 1 is greedy; at 24 the
    top 4 are ~0.61 / 0.13 / 0.13 / 0.13 at every step."""
    prompt = _chat_prompts(load_tokenizer(fitted_dir), 1, seed=4)[0]
    check_sampling_distribution(fitted_dir, "nextn", prompt, n=768, temperature=24.0)


def test_structured_output_logprobs_and_n_with_the_fitted_head(fitted_dir):
    """What a request may ask beside drafting, on the hybrid with the fitted head (its drafts
    accepted in each case): a regex that forces a token the head never drafts (the tree is cut
    there, the masked rows verify), logprobs with the top 2 (the verify rows' log-softmax is the
    decode step's), and n = 2: token for token speculation off's."""
    prompts = _chat_prompts(load_tokenizer(fitted_dir), 4, seed=9)
    sp = {"max_new_tokens": 20, "temperature": 0, "ignore_eos": True}
    cases = {
        "regex": dict(sampling_params=dict(sp, regex="\n{3}x\n{5,14}", ignore_eos=False)),
        "logprobs": dict(sampling_params=sp, return_logprob=True, top_logprobs_num=2),
        "n": dict(sampling_params=dict(sp, n=2)),
    }
    outs = {}
    nextn = dict(speculative_algorithm="nextn", speculative_draft_policy="fixed")
    for spec in ({}, dict(nextn, speculative_num_steps=2)):
        with Engine(fitted_dir, **engine_args(**spec)) as e:
            for name, kw in cases.items():
                outs[name, bool(spec)] = e.generate(input_ids=prompts, **kw)
    for name in cases:
        plain, spec = outs[name, False], outs[name, True]
        assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain], name
        assert sum(o["meta_info"]["spec_accepted_tokens"] for o in spec) > 0, name
    assert len(outs["n", True]) == 2 * len(prompts)
    assert all(o["text"].startswith("\n\n\nx\n") for o in outs["regex", True])
    for p, q in zip(outs["logprobs", False], outs["logprobs", True]):
        a, b = p["meta_info"], q["meta_info"]
        assert [t[1] for t in a["output_token_logprobs"]] == [
            t[1] for t in b["output_token_logprobs"]
        ]
        lp_a = torch.tensor([t[0] for t in a["output_token_logprobs"]])
        lp_b = torch.tensor([t[0] for t in b["output_token_logprobs"]])
        assert torch.allclose(lp_a, lp_b, atol=1e-5, rtol=0), (lp_a - lp_b).abs().max()
        tops = lambda m: [[t[1] for t in pos] for pos in m["output_top_logprobs"]]
        assert tops(a) == tops(b)


def test_lora_with_nextn_is_refused_in_one_line(mtp_dir):
    with pytest.raises(ValueError, match=r"^enable_lora does not work with speculative_algorithm"):
        make_scheduler(mtp_dir, speculative_algorithm="nextn", enable_lora=True)
