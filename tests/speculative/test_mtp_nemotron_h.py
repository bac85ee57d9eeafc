"""Nemotron-3's multi-token-prediction block (NemotronH with num_nextn_predict_layers 1 and
mtp_layers_block_type [full_attention, moe]) as a draft head (`--speculative-algorithm nextn`).

transformers' NemotronH has no MTP modules (it ignores `mtp.*` on load), so the reference is
built from the checkpoint's tensors with transformers' own NemotronHBlock (the attention block,
then the MoE block, each pre-norm + residual) between the fusion (enorm, hnorm, eh_proj) and the
final_layernorm (NemotronHRMSNorm), as SGLang's / vLLM's nemotron_h_mtp.py run them: the head's
rows equal it from the safetensors and from the float32 GGUF llama.cpp's converter writes (the
block folded into blk.6). Drafting on the hybrid gives exactly speculation off's greedy tokens
alone, 8 requests of different lengths at once in prefill chunks, after a cached turn and after a
branch inside a cached prompt (a random head: its drafts rejected), from the safetensors and the
Q8_0 GGUF; fitted with `train-eagle --mtp` (which writes the fit back under the `mtp.layers.*`
names) its drafts are accepted (> 0.5 by the Engine's counters and each answer's meta_info) and
the outputs stay exact. A head that does not fit the model is refused at start-up, naming the
tensor."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHBlock, NemotronHRMSNorm

from radixlm.cli import main
from radixlm.model.executor.runner import ModelRunner
from radixlm.model.executor.runner_config import ModelRunnerConfig
from radixlm.speculative.eagle_head import causal_attend
from radixlm.speculative.mtp_checkpoint import load_mtp_head
from radixlm.speculative.mtp_train import install_mtp_fit
from tests.model.hybrid_checkpoints import tiny_tokenizer
from tests.scheduler.harness import Driver, make_scheduler
from tests.speculative.conftest import train_args
from tests.speculative.nemotron_mtp_checkpoint import (
    MTP_TYPES,
    mtp_gguf,
    nemotron_mtp_checkpoint,
    stacked_block,
)
from tests.speculative.test_mtp_hybrid import POOL, _workload, assert_fitted_head_accepted_exactly

ATOL = 1e-4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return nemotron_mtp_checkpoint(str(tmp_path_factory.mktemp("nemotron-mtp")), tiny_tokenizer())


def _reference(hf, mtp: dict, emb: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    """The MTP block over rows (emb of token t + 1, the target's normed hidden state at t), causal
    over the rows, from transformers' modules holding the checkpoint's tensors."""
    cfg = copy.deepcopy(hf.config)
    cfg.layers_block_type = MTP_TYPES
    norm = lambda name: _norm(cfg, mtp[name])
    x = torch.cat(
        (norm("mtp.layers.0.enorm.weight")(emb), norm("mtp.layers.0.hnorm.weight")(feats)), -1
    )
    x = (x @ mtp["mtp.layers.0.eh_proj.weight"].T)[None]
    n = x.shape[1]
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
    for i in range(len(MTP_TYPES)):
        block = NemotronHBlock(cfg, i).float().eval()
        block.load_state_dict(stacked_block(mtp, i))
        x = block(x, attention_mask=mask, position_ids=torch.arange(n)[None])
    return norm(f"mtp.layers.{len(MTP_TYPES) - 1}.final_layernorm.weight")(x[0])


def _norm(cfg, weight: torch.Tensor) -> NemotronHRMSNorm:
    norm = NemotronHRMSNorm(cfg.hidden_size, eps=cfg.layer_norm_epsilon)
    norm.load_state_dict({"weight": weight})
    return norm


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_head_matches_transformers_blocks(model_dir, source, tmp_path):
    path, hf, mtp = model_dir
    if source == "gguf":
        path = mtp_gguf(path, str(tmp_path / "model.gguf"))
    runner = ModelRunner(
        ModelRunnerConfig(model_path=path, max_total_tokens=256, max_running_requests=2)
    )
    head = load_mtp_head(runner, "nextn")
    assert head.cfg.layer_index == hf.config.num_hidden_layers == 6
    assert [b.block_type for b in head.layer.blocks] == MTP_TYPES

    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(3, hf.config.vocab_size, (24,), generator=g)
    with torch.no_grad():
        feats = hf.model(tokens[None, :-1]).last_hidden_state[0]  # after norm_f
        emb = hf.model.embeddings(tokens[1:])
        ref = _reference(hf, mtp, emb, feats)
    positions = torch.arange(len(tokens) - 1)
    with torch.inference_mode():
        got, nxt = head(emb.clone(), feats.clone(), positions, causal_attend(), from_target=True)
    assert torch.equal(got, nxt)
    diff = (got - ref).abs().max().item()
    assert ref.abs().max() > 0.5 and diff < ATOL, diff


@pytest.fixture(scope="module")
def q8_gguf(model_dir, tmp_path_factory):
    return mtp_gguf(model_dir[0], str(tmp_path_factory.mktemp("nemotron-gguf") / "m.gguf"), "q8_0")


@pytest.mark.parametrize("source", ["hf", "gguf-q8_0"])
def test_nextn_gives_the_plain_greedy_tokens(model_dir, q8_gguf, source):
    path = model_dir[0] if source == "hf" else q8_gguf
    plain = _workload(Driver(make_scheduler(path, **POOL)))
    d = Driver(make_scheduler(path, speculative_algorithm="nextn", **POOL))
    head = d.s.spec.controller.source.head
    assert type(head).__name__ == "MtpHead" and head.cfg.layer_index == 6
    if source != "hf":  # in the file's own quantization
        for linear in [head.layer.eh_proj, head.layer.blocks[0].mixer.qkv_proj]:
            assert linear.qweight is not None and linear.weight is None
    spec = _workload(d)
    assert spec == plain
    assert plain["turn2_cached"] >= 40 + 10 - 1 and plain["branch_cached"] >= 64
    info = d.s.spec.info()
    assert info["spec_verify_steps"] > 0 and info["spec_draft_tokens"] >= info["spec_verify_steps"]


@pytest.fixture(scope="module")
def fitted_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("nemotron-mtp-fitted"))
    nemotron_mtp_checkpoint(path, tiny_tokenizer(), transparent=True)
    out = str(tmp_path_factory.mktemp("nemotron-mtp-fit-out"))
    assert main(train_args(path, out, "--mtp", "--epochs", "40", "--save-every", "1000")) == 0
    install_mtp_fit(os.path.join(out, "mtp_fit.safetensors"), path)
    return path


def test_fitted_head_drafts_are_accepted_exactly(fitted_dir):
    assert_fitted_head_accepted_exactly(fitted_dir)


def test_heads_that_do_not_fit_are_refused(model_dir, tmp_path):
    """A fusion of the wrong width, from the safetensors and from the GGUF (named as loaded: the
    head's model.layers.6.*), and MTP blocks radixlm's head does not run (a Mamba block)."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    path = str(tmp_path / "bad")
    shutil.copytree(model_dir[0], path)
    mtp = load_file(os.path.join(path, "mtp.safetensors"))
    mtp["mtp.layers.0.eh_proj.weight"] = torch.zeros(64, 136)
    save_file(mtp, os.path.join(path, "mtp.safetensors"), metadata={"format": "pt"})
    message = r"model\.layers\.6\.eh_proj\.weight: expected shape \(64, 128\), got \(64, 136\)"
    for bad in (path, mtp_gguf(path, str(tmp_path / "bad.gguf"))):
        with pytest.raises(ValueError, match=message):
            make_scheduler(bad, speculative_algorithm="nextn", max_total_tokens=256)
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    cfg["mtp_layers_block_type"] = ["full_attention", "linear_attention"]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ValueError, match=r"mtp_layers_block_type \['full_attention', 'linear_"):
        make_scheduler(path, speculative_algorithm="nextn", max_total_tokens=256)
