"""The one decoder stack (model/decoder_stack.py) gives every family what its loop gives: the hidden
states an EAGLE-3 head reads (the residual stream entering chosen layers) are HF's
`output_hidden_states` for a dense, an MoE, an MLA, a windowed, a post-norm, a hybrid and a
Gemma 4 model — through the ModelRunner, as the speculative worker installs its capture — and the
final hidden states are the ones its logits come from."""

from __future__ import annotations

import pytest
import torch

from radixlm.model.decoder_stack import DecoderStack, decoder_stack_of
from tests.model.hybrid_checkpoints import hybrid_checkpoint, tiny_tokenizer
from tests.model.windowed_checkpoints import WINDOW, checkpoint

PROMPT = [5, 17, 200, 33, 9, 120, 77, 250, 3, 3, 90, 11, 64, 19, 35, 100, 7, 12, 41, 8]


class Recorder:
    def __init__(self, aux_layers):
        self.aux_layers = aux_layers
        self.streams: dict[int, list[torch.Tensor]] = {}
        self.hidden: list[torch.Tensor] = []

    def record_layer(self, layer, stream):
        self.streams.setdefault(layer, []).append(stream.clone())

    def on_forward(self, fb, hidden):
        self.hidden.append(hidden.clone())


def _saved(hf, path) -> str:
    hf.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


def _moe(path):
    from tests.model.moe_checkpoints import hf_model

    hf = hf_model("qwen3_moe")
    return _saved(hf, path), hf


def _mla(path):
    from tests.model.deepseek_refs import make_hf

    hf, _ = make_hf("v2")
    return _saved(hf, path), hf


def _llama(path):
    return str(path), checkpoint("LlamaConfig", "LlamaForCausalLM", str(path))


def _windowed(config_cls, arch, **kw):
    def make(path):
        return str(path), checkpoint(config_cls, arch, str(path), **kw)

    return make


def _hybrid(arch):
    def make(path):
        p, hf = hybrid_checkpoint(arch, str(path))
        return p, hf

    return make


def _gemma4(path):
    from tests.model.gemma4_checkpoint import DENSE, gemma4_checkpoint

    return str(path), gemma4_checkpoint(str(path), **DENSE)


FAMILIES = {
    "dense-llama": _llama,
    "moe-qwen3": _moe,
    "mla-deepseek-v2": _mla,
    "windowed-gemma2": _windowed(
        "Gemma2Config",
        "Gemma2ForCausalLM",
        sliding_window=WINDOW,
        head_dim=16,
        query_pre_attn_scalar=16,
        hidden_activation="gelu_pytorch_tanh",
    ),
    "postnorm-windowed-olmo3": _windowed(
        "Olmo3Config",
        "Olmo3ForCausalLM",
        sliding_window=WINDOW,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
    ),
    "hybrid-qwen3_5": _hybrid("qwen35"),
    "hybrid-lfm2": _hybrid("lfm2"),
    "gemma4": _gemma4,
}


@pytest.mark.parametrize("family", FAMILIES)
def test_capture_is_hf_hidden_states(family, tmp_path):
    from radixlm.bench.one_batch import run_once
    from radixlm.model.executor.runner import ModelRunner
    from radixlm.model.executor.runner_config import ModelRunnerConfig

    path, hf = FAMILIES[family](tmp_path / family)
    threads = torch.get_num_threads()
    try:
        runner = ModelRunner(
            ModelRunnerConfig(
                model_path=path,
                quantization="none",
                num_threads=1,
                max_total_tokens=512,
                max_running_requests=2,
            )
        )
        stack = decoder_stack_of(runner.model)
        assert isinstance(stack, DecoderStack)
        n = runner.num_layers
        aux = tuple(sorted({0, 1, n // 2, n - 1}))
        rec = Recorder(aux)
        runner.set_hidden_capture(rec)
        out = run_once(runner, [PROMPT], 3)
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT]), output_hidden_states=True)
    for layer in aux:
        got = rec.streams[layer][0]  # the prefill's
        want = ref.hidden_states[layer][0]
        scale = want.abs().max().item()
        diff = (got - want).abs().max().item()
        assert got.shape == want.shape and diff <= 1e-4 * max(1.0, scale), (family, layer, diff)
        assert len(rec.streams[layer]) == 3  # the prefill and each decode step
    # the final hidden state is what the first token's logits come from: HF's argmax
    with torch.inference_mode():
        first = runner.model.compute_logits(rec.hidden[0][-1:]).float()
    assert int(first.argmax()) == int(ref.logits[0, -1].argmax()) == out["output_ids"][0][0]
