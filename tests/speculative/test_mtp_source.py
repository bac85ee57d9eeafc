"""--speculative-algorithm nextn (SGLang's NEXTN): the model's own multi-token-prediction layer
drafts.

Tiny DeepSeek-V3 (MLA + MoE) and GLM-4.5 (GQA + MoE) checkpoints with a NextN layer, from HF
safetensors and from a GGUF in the converter's layout with the head kept (mtp_checkpoints.py):
greedy outputs with speculation equal plain decoding's, alone, 8 concurrent requests of different
lengths, a chunked prefill, after a cached prefix, the KV invariants checked after every step
(make_scheduler's default). A random head is accepted almost never; bad heads are refused at
start-up naming the tensor."""

from __future__ import annotations

import os

import pytest
import torch

from tests.scheduler.harness import Driver, make_scheduler
from tests.speculative.mtp_checkpoints import LAYERS, checkpoint, write_gguf

# One source per family by default, both loaders covered (HF safetensors for DeepSeek-V3, the GGUF
# for GLM-4.5); the other two pairs prove nothing these do not: `pytest -m extended` runs them.
EXTENDED = pytest.mark.extended(reason="the same head and scheduler paths as the default pairs")
CASES = [
    pytest.param("deepseek_v3", "hf", id="deepseek_v3-hf"),
    pytest.param("deepseek_v3", "gguf", id="deepseek_v3-gguf", marks=EXTENDED),
    pytest.param("glm4_moe", "hf", id="glm4_moe-hf", marks=EXTENDED),
    pytest.param("glm4_moe", "gguf", id="glm4_moe-gguf"),
]
# A pool this size (the requests below use ~300 tokens) rather than the default's: the head's own KV
# pool is allocated at the target pool's size, and the invariant checks walk the whole pool.
POOL_TOKENS = 2048


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    """family -> (HF directory, GGUF file), built once."""
    out = {}
    for family in ("deepseek_v3", "glm4_moe"):
        path = str(tmp_path_factory.mktemp(f"mtp-{family}"))
        hf, mtp = checkpoint(path, family)
        out[family] = (path, write_gguf(os.path.join(path, "model.gguf"), hf, mtp, path))
    return out


def _prompts(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 800, (n,), generator=g).tolist() for n in lengths]


def _run(path, rounds, **spec):
    """Each round's requests submitted together (prompt, max_new_tokens), run to the end; -> every
    request's output ids, cached tokens, and the speculation counters. The KV invariants are
    checked after every step of the speculative run."""
    d = Driver(
        make_scheduler(
            path,
            max_running_requests=8,
            chunked_prefill_size=32,
            max_total_tokens=POOL_TOKENS,
            enable_invariant_checks=bool(spec),
            **spec,
        )
    )
    outs, cached = [], []
    for reqs in rounds:
        rids = [d.submit(p, max_new_tokens=n, temperature=0, ignore_eos=True) for p, n in reqs]
        while not d.idle():
            d.step()
        outs += [d.results[r].output_ids for r in rids]
        cached += [d.results[r].cached_tokens for r in rids]
    return outs, cached, (d.s.spec.info() if spec else None)


@pytest.mark.parametrize("family,fmt", CASES)
def test_greedy_outputs_exact(family_dirs, family, fmt):
    """Round 1: one request alone; round 2: 8 concurrent requests of 3..90 prompt tokens (the
    longest prefilled in 32-token chunks), 5..19 new tokens; round 3: a request sharing 40 tokens of
    a round-2 prompt, which the radix cache hands over (the head's KV of those positions with
    it)."""
    path = family_dirs[family][fmt == "gguf"]
    long = _prompts([90], seed=3)[0]
    batch = _prompts([3, 11, 25, 7, 40, 17, 5], seed=4) + [long]
    rounds = [
        [(_prompts([9], seed=2)[0], 12)],
        [(p, 5 + 2 * i) for i, p in enumerate(batch)],
        [(long[:40] + _prompts([6], seed=5)[0], 10)],
    ]
    plain, _, _ = _run(path, rounds)
    spec, cached, st = _run(
        path, rounds, speculative_algorithm="nextn", speculative_draft_policy="fixed"
    )
    assert spec == plain
    assert all(len(o) == n for o, (_, n) in zip(spec, [r for rs in rounds for r in rs]))
    assert cached[-1] == 40  # the shared prefix, whole, came from the cache
    # the random head drafts every step and is almost never right: verification alone keeps it exact
    assert st["spec_verify_steps"] > 20 and st["spec_draft_tokens"] > 50, st
    assert st["spec_accepted_tokens"] <= 0.1 * st["spec_draft_tokens"], st


def test_default_shape_and_eagle_alias(family_dirs):
    """NEXTN's defaults are SGLang's for these models (3 steps, top-1 chains, 4 draft tokens);
    --speculative-algorithm eagle without a draft path on a model with heads drafts with them;
    --speculative-eagle-topk widens the tree."""
    path = family_dirs["deepseek_v3"][0]
    c = make_scheduler(
        path, speculative_algorithm="eagle", max_total_tokens=POOL_TOKENS
    ).spec.controller
    assert type(c.source.head).__name__ == "MtpHead"
    assert (c.max_shape.width, c.max_shape.depth, c.max_draft) == (1, 3, 4)
    wide = make_scheduler(
        path, speculative_algorithm="nextn", speculative_eagle_topk=4, max_total_tokens=POOL_TOKENS
    )
    assert wide.spec.controller.source.max_shape.width == 4


def _bad_copy(src: str, dst: str, name: str, shape) -> str:
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.gguf"))
    file = os.path.join(dst, "mtp.safetensors")
    tensors = load_file(file)
    tensors[name] = torch.zeros(shape)
    save_file(tensors, file, metadata={"format": "pt"})
    return dst


def test_bad_heads_are_refused(family_dirs, tmp_path, default_model_path):
    path = family_dirs["deepseek_v3"][0]
    p = f"model.layers.{LAYERS}."
    h = 64
    bad_hidden = _bad_copy(path, str(tmp_path / "h"), p + "eh_proj.weight", (h, 2 * h + 8))
    with pytest.raises(ValueError, match=rf"{p}eh_proj\.weight: expected shape \(64, 128\)"):
        make_scheduler(bad_hidden, speculative_algorithm="nextn")
    bad_vocab = _bad_copy(path, str(tmp_path / "v"), p + "shared_head.head.weight", (17, h))
    with pytest.raises(ValueError, match=rf"{p}shared_head\.head\.weight: expected shape"):
        make_scheduler(bad_vocab, speculative_algorithm="nextn")
    with pytest.raises(
        ValueError,
        match=r"has no multi-token-prediction layers \(num_nextn_predict_layers 0\)",
    ) as e:
        make_scheduler(default_model_path, speculative_algorithm="nextn")
    assert "\n" not in str(e.value)
