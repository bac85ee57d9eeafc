"""Expert parallelism (--ep-size): with tp 2 and ep 2 each rank holds half of every MoE layer's
experts and computes them for all tokens, then an all-reduce; with tp 2 and ep 1 every rank holds
all experts (attention tensor-parallel either way). Both give the single-process model's greedy
tokens and, within float32 summation-order noise, its logits (real gloo ranks, 2 processes), for
each family and checkpoint layout: per-expert and stacked safetensors, GGUF (float and q8_0 experts,
sliced by expert as read)."""

from __future__ import annotations

import pytest
import torch

from radixlm.model.layers.moe.moe_block import SparseMoeBlock
from tests.distributed.ranks import run_ranks
from tests.distributed.test_tp_models import LOGITS_ATOL, greedy
from tests.model.moe_checkpoints import hf_model, save_stacked, write_gguf

CASES = {
    # name: (family, layout, --quantization)
    "qwen2_moe-per_expert": ("qwen2_moe", "per_expert", "none"),
    "qwen3_moe-stacked": ("qwen3_moe", "stacked", "none"),
    "olmoe-per_expert": ("olmoe", "per_expert", "none"),
    "mixtral-gguf": ("mixtral", "gguf", "none"),
    "qwen3_moe-gguf-q8_0": ("qwen3_moe", "gguf-q8_0", "gguf"),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[str, str]]:
    out = {}
    for name, (family, layout, quant) in CASES.items():
        tmp = tmp_path_factory.mktemp(name)
        hf = hf_model(family, vocab_size=384)  # test_tp_models.PROMPTS
        if layout == "per_expert":
            hf.save_pretrained(tmp)
            path = str(tmp)
        elif layout == "stacked":
            path = save_stacked(hf, str(tmp))
        else:
            path = write_gguf(
                hf,
                str(tmp / "m.gguf"),
                experts_type=layout.split("-")[1] if "-" in layout else "f32",
            )
        out[name] = (path, quant)
    return out


def _run_all(rank: int, checkpoints: dict) -> dict:
    from radixlm.model.loader import load_model

    out = {}
    for name, (path, quant) in checkpoints.items():
        tokens, logits = greedy(path, quant)
        blocks = [
            m
            for m in load_model(path, quantization=quant).model.modules()
            if isinstance(m, SparseMoeBlock)
        ]
        out[name] = (
            tokens,
            logits.numpy(),
            [(b.expert_start, b.num_local, b.w13.data.shape[0]) for b in blocks],
        )
    return out


@pytest.mark.parametrize("ep", [2, 1])
def test_ep_greedy_and_logits_match_single_process(ep, checkpoints):
    torch.set_num_threads(1)
    reference = {name: greedy(path, quant) for name, (path, quant) in checkpoints.items()}
    ranks = run_ranks(_run_all, 2, checkpoints, ep=ep)
    for name, (ref_tokens, ref_logits) in reference.items():
        for rank, results in enumerate(ranks):
            tokens, logits, held = results[name]
            assert tokens == ref_tokens, f"{name} ep={ep} rank {rank}: {tokens} != {ref_tokens}"
            diff = (torch.from_numpy(logits) - ref_logits).abs().max().item()
            assert diff < LOGITS_ATOL, f"{name} ep={ep} rank {rank}: logits differ by {diff}"
            # which experts this rank holds (and holds nothing else)
            want = (rank % ep * 8 // ep, 8 // ep, 8 // ep)
            assert held and all(h == want for h in held), f"{name} ep={ep} rank {rank}: {held}"
