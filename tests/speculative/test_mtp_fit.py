"""A model's NextN head fitted to its own greedy answers (`radixlm train-eagle --mtp`: the EAGLE
trainer on the MtpHead's eh_proj and norms, seconds on a tiny DeepSeek-V3) drafts mostly right:
through an Engine, the acceptance rate its metrics and each answer's meta_info report is above 0.5
while outputs stay exactly plain decoding's; sampled at temperature 1, the output distribution is
plain sampling's (the rejection-sampling test of test_spec_engine.py on this source)."""

from __future__ import annotations

import os

import pytest

from radixlm import Engine
from radixlm.cli import main
from radixlm.model.loader import load_tokenizer
from radixlm.speculative.eagle_prompts import default_prompts
from radixlm.speculative.mtp_train import install_mtp_fit
from tests.conftest import engine_args
from tests.scheduler.harness import Driver, make_scheduler
from tests.speculative.conftest import train_args
from tests.speculative.mtp_checkpoints import checkpoint
from tests.speculative.test_spec_engine import check_sampling_distribution

# Chains of 2 under the fixed policy: the fit trains the first level (the target's hidden state in);
# deeper levels read the head's own output, which it is not trained on (measured at 3 levels: 0.48
# of drafted tokens accepted, the first level's 0.97 held-out accuracy diluted).
STEPS = 2
# The in-process schedulers' KV pool (6 requests of ~60 tokens), not the default 1 GB one.
POOL_TOKENS = 4096


@pytest.fixture(scope="module")
def fitted_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("mtp-fitted"))
    checkpoint(path, "deepseek_v3", transparent=True)
    out = str(tmp_path_factory.mktemp("mtp-fit-out"))
    assert main(train_args(path, out, "--mtp", "--epochs", "40", "--save-every", "1000")) == 0
    install_mtp_fit(os.path.join(out, "mtp_fit.safetensors"), path)
    return path


def _chat_prompts(path, n, seed):
    tok = load_tokenizer(path)
    return [
        tok.encode(
            tok.apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
            )
        )
        for p in default_prompts(n, seed=seed)
    ]


def test_fitted_head_accepts_most_drafts_exactly(fitted_dir):
    prompts = _chat_prompts(fitted_dir, 6, seed=9)
    d = Driver(make_scheduler(fitted_dir, max_total_tokens=POOL_TOKENS))
    rids = [d.submit(p, max_new_tokens=32, temperature=0, ignore_eos=True) for p in prompts]
    while not d.idle():
        d.step()
    plain = [d.results[r].output_ids for r in rids]
    with Engine(
        fitted_dir,
        **engine_args(
            speculative_algorithm="nextn",
            speculative_draft_policy="fixed",
            speculative_num_steps=STEPS,
        ),
    ) as e:
        outs = e.generate(
            input_ids=prompts,
            sampling_params={"max_new_tokens": 32, "temperature": 0, "ignore_eos": True},
        )
        st = e.get_internal_state()
    assert [o["output_ids"] for o in outs] == plain
    rate = st["spec_accepted_tokens"] / st["spec_draft_tokens"]
    assert rate > 0.5, st
    meta = [o["meta_info"] for o in outs]
    accepted = sum(m["spec_accepted_tokens"] for m in meta)
    drafted = sum(STEPS * m["spec_verify_ct"] for m in meta)  # at most; fewer near the end
    assert accepted / drafted > 0.5, meta


def test_sampling_distribution_unchanged(fitted_dir):
    """Temperature 1, top-k 4: the fitted head's drafts are accepted or rejected by rejection
    sampling, and the 3-token outcomes' frequencies match plain sampling's."""
    prompt = _chat_prompts(fitted_dir, 1, seed=4)[0]
    check_sampling_distribution(fitted_dir, "nextn", prompt, n=768)
