"""The hierarchical cache with windowed models (Engine, tiny float32 checkpoints): Gemma 4 (sliding
and global layers of different KV shapes, shared-KV layers) and gpt-oss (sliding and full layers,
sinks). A prompt's KV, pushed off a small device pool by unrelated prompts, goes to the host tier
and comes back for the prompt's continuation, which reuses past what the device alone kept (the
same run without the host tier is the baseline, `cached_tokens`) and answers HF's greedy tokens.
Invariant checks run after every step. Gemma 4 with a storage tier (L3) is refused in one line."""

from __future__ import annotations

import random

import pytest

from radixlm import Engine
from radixlm.errors import StartupRefusalError
from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.model.windowed_checkpoints import VOCAB, reference

NEW = 8
SP = {"max_new_tokens": NEW, "temperature": 0}
SMALL = dict(
    quantization="none",
    enable_invariant_checks=True,
    chunked_prefill_size=64,
    max_total_tokens=600,
    log_level="warning",
)
HOST = dict(enable_hierarchical_cache=True, hicache_ratio=8.0, hicache_dtype="float32")


def _gemma4(path):
    from tests.model.gemma4_checkpoint import DENSE, gemma4_checkpoint

    return gemma4_checkpoint(path, **DENSE)


def _gpt_oss(path):
    from tests.model.gpt_oss_checkpoint import gpt_oss_checkpoint

    return gpt_oss_checkpoint(path)


FAMILIES = {"gemma4": _gemma4, "gpt-oss": _gpt_oss}


def _churn(engine: Engine) -> tuple[list[int], dict]:
    """A 150-token prompt, then 8 unrelated ones of 100 (past the device pool's 600 tokens), then
    the prompt's continuation: (the continuation, its output)."""
    rng = random.Random(7)
    tokens = lambda n: [rng.randrange(10, VOCAB) for _ in range(n)]
    first = tokens(150)
    one = engine.generate(input_ids=first, sampling_params=SP)
    for other in [tokens(100) for _ in range(8)]:
        engine.generate(input_ids=other, sampling_params=SP)
    turn2 = first + one["output_ids"] + tokens(5)
    return turn2, engine.generate(input_ids=turn2, sampling_params=SP)


@pytest.mark.parametrize("family", FAMILIES)
def test_prefix_pushed_off_the_device_comes_back_from_the_host(family, tmp_path):
    path = str(tmp_path / family)
    hf = FAMILIES[family](path)
    with Engine(model_path=path, **SMALL) as engine:  # the device alone
        _, alone = _churn(engine)
    with Engine(model_path=path, **SMALL, **HOST) as engine:
        turn2, two = _churn(engine)
        state = engine.get_internal_state()
    device_kept, cached = alone["meta_info"]["cached_tokens"], two["meta_info"]["cached_tokens"]
    assert cached >= 150 and cached > device_kept, (cached, device_kept)
    assert state["hicache"]["l2_loads"] >= 1, state["hicache"]
    assert_greedy_equal(two["output_ids"], reference(hf, turn2, NEW), f"{family} from the host")


def test_gemma4_storage_tier_is_refused(tmp_path):
    path = str(tmp_path / "gemma4")
    _gemma4(path)
    with pytest.raises(StartupRefusalError, match="a shape per layer, which the storage tier"):
        Engine(
            model_path=path,
            **SMALL,
            **HOST,
            hicache_storage_backend="file",
            hicache_storage_dir=str(tmp_path / "l3"),
        )
