"""A hybrid model with the hierarchical cache, end to end (Engine, Qwen3.5's tiny checkpoint): a
prompt's state snapshots, pushed off a small device state pool by unrelated prompts, go to the
host tier and come back for the prompt's continuation, which reuses past what the device alone
kept (the same run without the host tier is the baseline) and answers HF's greedy tokens.
Invariant checks (every KV, state and host snapshot slot owned once) run after every step, with
the overlap scheduler on (host copies queue behind the forward in flight). A storage tier (L3)
is refused for a hybrid in one line."""

from __future__ import annotations

import random

import pytest
import torch

from radixlm import Engine
from radixlm.errors import StartupRefusalError
from tests.e2e.test_default_model_greedy import assert_greedy_equal

NEW = 8
SP = {"max_new_tokens": NEW, "temperature": 0}
INTERVAL = 64  # --mamba-track-interval
VOCAB = 800  # the tiny tokenizer's ordinary tokens
# 12 state slots: 6 request rows (5 running), 6 snapshots; 1,024 KV tokens.
SMALL = dict(
    quantization="none",
    enable_invariant_checks=True,
    enable_overlap_schedule=True,
    chunked_prefill_size=100,
    max_total_tokens=1024,
    max_mamba_cache_size=12,
    mamba_track_interval=INTERVAL,
    log_level="warning",
)
# The host: 8 x the device's KV tokens and snapshot slots, KV kept exact (float32).
HOST = dict(enable_hierarchical_cache=True, hicache_ratio=8.0, hicache_dtype="float32")


@pytest.fixture(scope="module")
def qwen35(hybrid_checkpoint_dir):
    return hybrid_checkpoint_dir("qwen35")


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, VOCAB) for _ in range(n)]


def _churn(engine: Engine) -> tuple[list[int], dict]:
    """A 200-token prompt, then 8 unrelated ones of 120 (past the device's 6 snapshot slots and
    its KV), then the prompt's continuation: (the continuation, its output)."""
    rng = random.Random(7)
    first = _tokens(rng, 200)
    one = engine.generate(input_ids=first, sampling_params=SP)
    others = [_tokens(rng, 120) for _ in range(8)]
    assert len(engine.generate(input_ids=others, sampling_params=SP)) == len(others)
    turn2 = first + one["output_ids"] + _tokens(rng, 5)
    return turn2, engine.generate(input_ids=turn2, sampling_params=SP)


def test_snapshots_pushed_off_the_device_come_back_from_the_host(qwen35):
    from transformers import AutoModelForCausalLM

    with Engine(model_path=qwen35, **SMALL) as engine:  # the device alone
        _, alone = _churn(engine)
    with Engine(model_path=qwen35, **SMALL, **HOST) as engine:
        turn2, two = _churn(engine)
        state = engine.get_internal_state()
        assert engine.flush_cache()
        flushed = engine.get_internal_state()

    device_kept = alone["meta_info"]["cached_tokens"]
    cached = two["meta_info"]["cached_tokens"]
    first_len = 200
    assert cached >= first_len - INTERVAL, (cached, device_kept)
    assert cached > device_kept, (cached, device_kept)
    hc = state["hicache"]
    assert hc["state_l1_to_l2"] > 0 and hc["state_l2_loads"] >= 1, hc
    assert hc["state_corrupt"] == 0
    assert state["state_host_snapshot_slots"] == hc["l2_state_slots"] == 8 * 6

    hf = AutoModelForCausalLM.from_pretrained(qwen35, dtype=torch.float32).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([turn2]), max_new_tokens=NEW, do_sample=False)
        gen = out[0, len(turn2) :].tolist()
        logits = hf(torch.tensor([turn2 + gen])).logits[0, len(turn2) - 1 :]
    assert_greedy_equal(two["output_ids"], (turn2, gen, logits), "continuation via the host")
    # A flush empties the device pools; what moved down stays on the host.
    assert flushed["available_kv_tokens"] == flushed["max_total_num_tokens"]
    assert flushed["state_snapshot_slots_free"] == flushed["state_snapshot_slots"]


def test_a_storage_tier_is_refused_for_a_hybrid_in_one_line(qwen35, tmp_path):
    with pytest.raises(StartupRefusalError) as refused:
        Engine(
            model_path=qwen35,
            **SMALL,
            **HOST,
            hicache_storage_backend="file",
            hicache_storage_dir=str(tmp_path),
        )
    assert str(refused.value) == (
        "--hicache-storage-backend: a hybrid model's state snapshots have no storage tier;"
        " use the host tier alone"
    )
