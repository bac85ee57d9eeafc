"""The one-op gpt-oss decoder stack (model/layers/fused_gpt_oss_layers.py) against the Python layers
it replaces, on a GGUF of the tiny gpt-oss with Q8_0 attention and MXFP4 experts, as the released
GGUFs store them: bitwise the same logits in a batched prefill of uneven prompts (every one longer
than the window) and the decode steps after it, with the windowed layers' KV in their own pool and
in one pool; run in segments (an EAGLE head's captured layers), bitwise the single op."""

from __future__ import annotations

import random

import pytest
import torch

from radixlm.model.hidden_capture import NoHiddenCapture
from tests.model.gpt_oss_checkpoint import gpt_oss_checkpoint, write_gguf
from tests.model.helpers import logits_of_run
from tests.model.windowed_checkpoints import VOCAB


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gpt_oss_fused"))
    hf = gpt_oss_checkpoint(path)
    return write_gguf(hf, path, f"{path}/q8_0-mxfp4.gguf", experts="MXFP4", attention="Q8_0")


@pytest.fixture(scope="module", params=["two pools", "one pool"])
def runner(request, gguf_path):
    from radixlm import kernels
    from radixlm.model.executor.runner import ModelRunner
    from radixlm.model.executor.runner_config import ModelRunnerConfig

    assert kernels.available(), f"native kernels: {kernels.unavailable_reason()}"
    threads = torch.get_num_threads()
    off = None if request.param == "two pools" else "--disable-hybrid-swa-memory"
    try:
        runner = ModelRunner(
            ModelRunnerConfig(
                model_path=gguf_path,
                num_threads=2,
                max_total_tokens=1024,
                max_running_requests=4,
                swa_memory_off=off,
            )
        )
        assert hasattr(runner.token_to_kv_pool, "translate") == (off is None)
        yield runner
    finally:
        torch.set_num_threads(threads)


class _Recorder:
    def __init__(self, aux_layers):
        self.aux_layers = aux_layers

    def record_layer(self, layer, stream):
        pass

    def on_forward(self, fb, hidden):
        pass


def test_fused_gpt_oss_layers_equal_python_layers(runner):
    stack = runner.model.model
    pool = runner.token_to_kv_pool
    # Windowed slots held aside, so that a token's windowed slot is not its full slot's number.
    held = pool.swa.alloc(7) if hasattr(pool, "translate") else None
    rng = random.Random(11)
    prompts = [[rng.randrange(10, VOCAB) for _ in range(n)] for n in (23, 9, 40)]
    try:
        runs = []
        for fused, capture in ((True, ()), (True, (1, 3)), (False, ())):
            stack.use_fused_layers, stack._fused = fused, None
            runner.set_hidden_capture(_Recorder(capture) if capture else NoHiddenCapture())
            try:
                # a batch of three, then one alone (other KV slots)
                runs.append(
                    (logits_of_run(runner, prompts, 12), logits_of_run(runner, prompts[1:2], 10))
                )
            finally:
                runner.set_hidden_capture(NoHiddenCapture())
            if fused:
                f = stack._fused
                assert f, "the quantized gpt-oss should take the fused path"
                windows = [layer.ints[0] for layer in f.layers]
                assert windows == [8, 0, 8, 0], "sliding and full layers alternate"
    finally:
        stack.use_fused_layers, stack._fused = True, None
        if held is not None:
            pool.swa.free(held)
    for other in runs[1:]:
        for (a, a_ids), (b, b_ids) in zip(runs[0], other):
            assert len(a) == len(b) > 1
            assert all(torch.equal(x, y) for x, y in zip(a, b))
            assert a_ids == b_ids


def test_a_float_attention_keeps_the_python_layers(tmp_path):
    """Projections the op does not run (float32 here) leave every layer to Python."""
    from radixlm.model.layers.fused_gpt_oss_layers import build_fused_gpt_oss_layers
    from radixlm.model.loader import load_model

    hf = gpt_oss_checkpoint(str(tmp_path))
    path = write_gguf(hf, str(tmp_path), str(tmp_path / "mxfp4.gguf"), experts="MXFP4")
    stack = load_model(path).model.model
    assert stack.layers[0].mlp.experts.fused, "the experts run on the native op"
    assert build_fused_gpt_oss_layers(stack) is None
