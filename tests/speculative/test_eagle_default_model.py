"""Random-weight EAGLE and EAGLE-3 heads on the default model (SmolLM2-135M GGUF on the native
kernels; EAGLE-3 reads three of its layers, which then run as segments of the fused op): greedy
outputs are plain decoding's (the near-tie rule of tests/e2e/test_default_model_greedy.py: a
divergence only where plain decoding's top-2 logits are within NEAR_TIE), in a mixed batch with a
JSON-schema request, and streamed."""

import json

import jsonschema
import pytest

from radixlm import Engine
from radixlm.model.loader import load_model_config
from radixlm.speculative.eagle_checkpoint import save_token_map
from tests.conftest import engine_args
from tests.speculative.conftest import random_head_dir

NEAR_TIE = 1e-3
CHAT = [
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku about the sea.",
    "Give me a Python function that reverses a string.",
]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "rank": {"type": "integer"}},
    "required": ["city", "rank"],
}
SP = {"max_new_tokens": 20, "temperature": 0}


def outputs(path, **spec):
    """The batch (two free chats and a JSON-schema one) and a stream of the first chat."""
    constrained = {**SP, "max_new_tokens": 40, "json_schema": json.dumps(SCHEMA)}
    with Engine(path, **engine_args(**spec)) as e:
        chats = [
            e.tokenizer.apply_chat_template(
                [{"role": "user", "content": c}], tokenize=False, add_generation_prompt=True
            )
            for c in CHAT
        ]
        outs = e.generate(chats, [SP, SP, constrained], return_logprob=True, top_logprobs_num=2)
        stream = list(e.generate(chats[0], SP, stream=True))
        st = e.get_internal_state()
    jsonschema.validate(json.loads(outs[2]["text"]), SCHEMA)
    assert stream[-1]["output_ids"] == outs[0]["output_ids"]
    return outs, st


def assert_near_tie_equal(got: list[int], ref: dict, label: str) -> None:
    top2 = ref["meta_info"]["output_top_logprobs"]
    for k, (a, b) in enumerate(zip(got, ref["output_ids"])):
        if a != b:
            gap = top2[k][0][0] - top2[k][1][0]
            assert gap < NEAR_TIE, (
                f"{label}: token {k} differs ({a} vs {b}) with a clear top-2 gap {gap:.4g}"
            )
            return
    assert len(got) == len(ref["output_ids"]), label


@pytest.fixture(scope="module")
def plain(default_model_path):
    return outputs(default_model_path)[0]


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_random_heads_keep_greedy_outputs(kind, default_model_path, plain, tmp_path):
    cfg = load_model_config(default_model_path)
    spec = dict(
        speculative_algorithm=kind, speculative_draft_policy="fixed", speculative_num_steps=3
    )
    if (
        kind == "eagle"
    ):  # its draft steps rank a token map's tokens (the whole vocabulary costs a full LM head)
        spec["speculative_draft_model_path"] = random_head_dir(tmp_path / "head", cfg, kind)
        import torch

        save_token_map(torch.arange(0, cfg.vocab_size, 6), str(tmp_path / "map.pt"))
        spec["speculative_token_map"] = str(tmp_path / "map.pt")
    else:  # own vocabulary of 2048, SGLang's default layers (2, 15, 27)
        spec["speculative_draft_model_path"] = random_head_dir(
            tmp_path / "head", cfg, kind, draft_vocab_size=2048
        )
    outs, st = outputs(default_model_path, **spec)
    assert st["spec_verify_steps"] > 0 and st["spec_draft_tokens"] > 0
    for i, (o, ref) in enumerate(zip(outs, plain)):
        assert_near_tie_equal(o["output_ids"], ref, f"{kind} #{i}")
