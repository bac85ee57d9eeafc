"""The one-op Qwen3.5 decoder stack (model/layers/fused_qwen3_5_layers.py) against the Python layers
it replaces, on a quantized GGUF of the tiny Qwen3.5: bitwise the same logits in a batched prefill
of uneven prompts and the decode steps after it (which read the prompts' KV and states)."""

from __future__ import annotations

import random

import gguf
import numpy as np
import pytest
import torch

from tests.model.helpers import logits_of_run
from tests.model.hybrid_checkpoints import write_gguf


@pytest.fixture(scope="module", params=["qwen35", "qwen35moe", "qwen3next"])
def runner(request, hybrid_checkpoint_dir, tmp_path_factory):
    """A ModelRunner on the tiny model as Q8_0, each Gated DeltaNet layer's attn_gate as Q4_0 in the
    Qwen3.5s (their in_proj_qkvz then has two segments, as a Q4_K_M file's Q6_K qkv beside its Q4_K
    gate). The mixtures' sparse MLPs (routing, the experts' op, the shared expert) run in the op
    too, the shared expert inside the experts' op; Qwen3.5-MoE's shared up as Q4_0 (its gate_up then
    has two segments in two formats)."""
    from transformers import AutoModelForCausalLM

    from radixlm import kernels
    from radixlm.model.executor.runner import ModelRunner
    from radixlm.model.executor.runner_config import ModelRunnerConfig

    assert kernels.available(), f"native kernels: {kernels.unavailable_reason()}"
    path = hybrid_checkpoint_dir(request.param)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    overrides = {}
    for i, kind in enumerate(hf.config.layer_types):
        if kind == "linear_attention" and request.param != "qwen3next":  # (its qkvz is one tensor)
            z = hf.model.layers[i].linear_attn.in_proj_z.weight.detach().numpy()
            q4 = gguf.quants.quantize(np.ascontiguousarray(z), gguf.GGMLQuantizationType.Q4_0)
            overrides[f"blk.{i}.attn_gate.weight"] = (q4, gguf.GGMLQuantizationType.Q4_0)
        if request.param == "qwen35moe":
            up = hf.model.layers[i].mlp.shared_expert.up_proj.weight.detach().numpy()
            q4 = gguf.quants.quantize(np.ascontiguousarray(up), gguf.GGMLQuantizationType.Q4_0)
            overrides[f"blk.{i}.ffn_up_shexp.weight"] = (q4, gguf.GGMLQuantizationType.Q4_0)
    out = tmp_path_factory.mktemp(f"{request.param}-fused") / "q8_0.gguf"
    model_path = write_gguf(hf, path, str(out), qtype="q8_0", overrides=overrides)
    threads = torch.get_num_threads()
    try:
        yield (
            request.param,
            ModelRunner(
                ModelRunnerConfig(
                    model_path=model_path,
                    num_threads=2,
                    max_total_tokens=2048,
                    max_running_requests=4,
                )
            ),
        )
    finally:
        torch.set_num_threads(threads)


def test_fused_qwen3_5_layers_equal_python_layers(runner):
    arch, runner = runner
    stack = runner.model.model
    loads = [m.expert_load for m in runner.model.modules() if hasattr(m, "expert_load")]
    assert bool(loads) == (arch != "qwen35"), "the mixtures' sparse blocks count their load"
    rng = random.Random(7)
    vocab = runner.vocab_size
    prompts = [[rng.randrange(10, vocab) for _ in range(n)] for n in (37, 5, 70)]
    runs, counted = [], []
    for fused in (True, False):
        before = [x.clone() for x in loads]
        stack.use_fused_layers, stack._fused = fused, None
        # a batch of three, then one alone (other state rows and KV slots)
        runs.append((logits_of_run(runner, prompts, 6), logits_of_run(runner, prompts[1:2], 4)))
        counted.append([x - b for x, b in zip(loads, before)])
        if fused:
            f = stack._fused
            assert f, f"the quantized {arch} should take the fused path"
            assert sum(f.layer_is_linear) == 3 and len(f.layer_is_linear) == 4
            assert sum(f.mlp_is_moe) == (len(loads) if arch != "qwen35" else 0) and len(
                f.expert_loads
            ) == len(loads)
            if arch == "qwen35":
                assert f.seg_counts[:4] == [2, 1, 1, 1], "in_proj_qkvz: Q8_0 qkv beside a Q4_0 gate"
            if arch == "qwen35moe":
                assert f.seg_counts[:4] == [2, 1, 2, 1], "the shared gate_up: Q8_0 beside Q4_0"
    stack.use_fused_layers, stack._fused = True, None
    for (a, a_ids), (b, b_ids) in zip(*runs):
        assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
        assert a_ids == b_ids
    # the experts' load is counted alike (every routed token once)
    assert all(torch.equal(x, y) and int(x.sum()) > 0 for x, y in zip(*counted))


def test_fused_qwen3_5_layers_leave_state_snapshots_to_the_layers(runner):
    runner = runner[1]
    """A forward that keeps a state after some of its tokens cuts the recurrence there: the Python
    layers run it (runs_fused), and the op any other."""
    from radixlm.model.layers.attention.native import NativeMetadata
    from radixlm.model.layers.fused_qwen3_5_layers import runs_fused

    empty = torch.zeros(0, dtype=torch.int64)

    class Batch:
        linear_attn_backend = runner.linear_attn_backend
        uses_lora = False
        attn_backend = runner.attn_backend
        attn_metadata = NativeMetadata(empty, empty, empty.view(0, 0), empty)
        state_tracks = [[], []]
        state_drafts = None

    fb = Batch()
    assert runs_fused(fb)
    fb.state_drafts = [([0, 0], [5, 6])]  # a verify step's draft tree: run level by level
    assert not runs_fused(fb)
    fb.state_drafts = None
    fb.state_tracks = [[], [(3, 1)]]
    assert not runs_fused(fb)
