"""The issue's reference: the default model (SmolLM2-135M-Instruct) dequantized (--quantization
none) with peft adapters made here at two ranks and target sets, greedy outputs against HF
transformers + peft on the same dequantized weights, alone and in one mixed batch."""

import pytest
import torch

from radixlm import Engine
from tests.conftest import engine_args
from tests.hf_generate import greedy_batch
from tests.lora.conftest import make_adapter

pytestmark = pytest.mark.slow

NEW_TOKENS = 16
NEAR_TIE = (
    1e-3  # as tests/e2e/test_default_model_greedy.py: a flip is accepted only at a float32 near-tie
)
# Scale 1 (alpha = r): enough for peft's random adapters (init_lora_weights=False) to change the
# greedy text.
ADAPTERS = {
    "r8": dict(r=8, lora_alpha=8, target_modules="all-linear"),
    "r16": dict(r=16, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
}
PROMPTS = ["The quick brown fox", "Once upon a time, in a small village by the mountains,"]


@pytest.fixture(scope="module")
def setup(default_model_path, hf_default_model, tmp_path_factory):
    from radixlm.model.loader import load_tokenizer

    tok = load_tokenizer(default_model_path)
    hf = hf_default_model()
    root = tmp_path_factory.mktemp("lora-default")
    models = {
        n: make_adapter(hf, root / n, seed, **f) for seed, (n, f) in enumerate(ADAPTERS.items())
    }
    models[None] = hf
    ids = [tok.encode(p) for p in PROMPTS]
    refs = {}
    for n, m in models.items():
        gens = greedy_batch(m, ids, NEW_TOKENS, eos_token_id=None, pad_token_id=0)
        with torch.no_grad():
            for i, (p, gen) in enumerate(zip(ids, gens)):
                logits = m(input_ids=torch.tensor([p + gen])).logits[0, len(p) - 1 :].float()
                refs[n, i] = (gen, logits)
    return ids, refs, {n: str(root / n) for n in ADAPTERS}


def assert_greedy_equal(got, ref, label):
    gen, logits = ref
    for k, (a, b) in enumerate(zip(got, gen)):
        if a != b:
            top2 = torch.topk(logits[k], 2).values
            assert (top2[0] - top2[1]).item() < NEAR_TIE, (
                f"{label}: token {k}: {a} != {b} (no near-tie)"
            )
            return
    assert len(got) == len(gen), label


def test_default_model_adapters_match_peft_alone_and_mixed(setup, default_model_path):
    ids, refs, paths = setup
    assert refs["r8", 0][0] != refs[None, 0][0] and refs["r16", 0][0] != refs[None, 0][0]
    sp = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    lora_paths = [f"{n}={p}" for n, p in paths.items()]
    with Engine(
        default_model_path, **engine_args(quantization="none", lora_paths=lora_paths, num_threads=2)
    ) as e:
        for n in (None, *ADAPTERS):
            for i, p in enumerate(ids):
                got = e.generate(input_ids=p, sampling_params=sp, lora_path=n)["output_ids"]
                assert_greedy_equal(got, refs[n, i], f"{n} prompt {i}")
        names = ["r8", None, "r16", "r8"]
        rows = (0, 1, 0, 1)
        outs = e.generate(input_ids=[ids[p] for p in rows], sampling_params=sp, lora_path=names)
    for k, (o, n, p) in enumerate(zip(outs, names, rows)):
        assert_greedy_equal(o["output_ids"], refs[n, p], f"mixed batch row {k} ({n})")


# The served default (its own Q4_1 blocks on the native kernels, activations rounded to int8 per
# block) against peft on the same weights dequantized: the first token's top-4 logprobs. The base
# model alone is up to 0.16 off (the int8 activations), with adapters up to 0.34 (r8 on prompt 0);
# the adapters themselves move those logprobs by 0.35-1.75, so a lost delta fails (checked below).
# These figures are the same on every CPU (the native kernels, the adapters' delta included, give
# the same bits everywhere). They were not while the delta was torch's GEMM: the int8 grid amplifies
# its last bits, which follow MKL's code path for the CPU (r8 on prompt 0: 0.24 measured on
# 2026-11-25's machine, 0.40 through MKL's AVX-512 path). Any change to a float operation on the
# adapters' path redraws that error from a spread of about 0.25-0.40: re-measure then, do not widen
# this.
Q4_1_TOLERANCE = 0.35


def test_quantized_default_model_with_adapters_within_tolerance(setup, default_model_path):
    ids, refs, paths = setup
    first = {"max_new_tokens": 1, "temperature": 0}
    lora_paths = [f"{n}={p}" for n, p in paths.items()]
    with Engine(default_model_path, **engine_args(lora_paths=lora_paths, num_threads=2)) as e:
        tops = {
            (n, i): e.generate(
                input_ids=ids[i],
                sampling_params=first,
                lora_path=n,
                return_logprob=True,
                top_logprobs_num=20,
            )["meta_info"]["output_top_logprobs"][0]
            for n in (None, *ADAPTERS)
            for i in range(len(ids))
        }
    worst, moved = {}, {}
    for (n, i), top in tops.items():
        ours = {tid: lp for lp, tid, _ in top}
        ref = torch.log_softmax(refs[n, i][1][0], -1)
        want = ref.topk(4).indices.tolist()
        assert all(t in ours for t in want), (n, i, want, sorted(ours))
        worst[n, i] = max(abs(ours[t] - ref[t].item()) for t in want)
        # a lost adapter delta would show: the adapter moves these logprobs far past the tolerance
        if n:
            base = torch.log_softmax(refs[None, i][1][0], -1)
            moved[n, i] = max(abs(base[t] - ref[t]).item() for t in want)
    print(
        "worst |logprob diff| per (adapter, prompt):",
        {k: round(v, 4) for k, v in worst.items()},
        "adapter's own move:",
        {k: round(v, 4) for k, v in moved.items()},
    )
    assert max(worst.values()) < Q4_1_TOLERANCE, worst
    assert max(moved.values()) > 2 * Q4_1_TOLERANCE, moved  # adapters whose loss would show
