"""Qwen3.5's `mtp.*` head loaded as an MtpHead (mtp_checkpoint.py): from a tiny Qwen3.5 checkpoint
with an MTP block (mtp.fc, mtp.pre_fc_norm_embedding / _hidden, mtp.layers.0.* a full-attention
layer, mtp.norm), its rows equal a reference built from transformers' own Qwen3.5 modules (the
1 + w RMSNorms, the gated full-attention decoder layer) over the target's hidden states; so do the
rows of the head read from the float32 GGUF llama.cpp's converter writes of the checkpoint
(blk.4.nextn.*, blk.4's attention and MLP: the converter's renames and 1 + w norms undone). The
hybrids draft with it (test_mtp_hybrid.py); this is the head alone against the reference. A GGUF
whose head does not fit the model is refused at start-up naming the tensor."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

from radixlm.model.executor.runner import ModelRunner
from radixlm.model.executor.runner_config import ModelRunnerConfig
from radixlm.speculative.eagle_head import causal_attend
from radixlm.speculative.mtp_checkpoint import load_mtp_head
from tests.model.hybrid_checkpoints import write_gguf
from tests.scheduler.harness import make_scheduler
from tests.speculative.qwen35_mtp_checkpoint import mtp_gguf, qwen35_mtp_checkpoint

ATOL = 1e-4


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_qwen3_5_mtp_head_matches_transformers_modules(source, tmp_path):
    path, hf, mtp = qwen35_mtp_checkpoint(str(tmp_path / "hf"))
    cfg = hf.config
    if source == "gguf":
        path = mtp_gguf(path, str(tmp_path / "model.gguf"))
    runner = ModelRunner(
        ModelRunnerConfig(model_path=path, max_total_tokens=256, max_running_requests=2)
    )
    head = load_mtp_head(runner, "nextn")
    assert head.cfg.layer_index == cfg.num_hidden_layers

    tokens = torch.randint(3, cfg.vocab_size, (24,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        feats = hf(tokens[None, :-1], output_hidden_states=True).hidden_states[-1][0]
        emb = hf.model.embed_tokens(tokens[1:])
        positions = torch.arange(len(tokens) - 1)
    with torch.inference_mode():
        got, nxt = head(emb.clone(), feats.clone(), positions, causal_attend(), from_target=True)

    # the reference: transformers' modules with the checkpoint's tensors
    full = cfg.layer_types.index("full_attention")
    layer = Qwen3_5DecoderLayer(cfg, full).float().eval()
    layer.load_state_dict(
        {k.removeprefix("mtp.layers.0."): v for k, v in mtp.items() if "layers.0." in k}
    )
    norms = {}
    for key in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        norms[key] = Qwen3_5RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        norms[key].load_state_dict({"weight": mtp[f"mtp.{key}.weight"]})
    with torch.no_grad():
        x = torch.cat((norms["pre_fc_norm_embedding"](emb), norms["pre_fc_norm_hidden"](feats)), -1)
        x = (x @ mtp["mtp.fc.weight"].T)[None]
        pos = positions[None]
        y = layer(x, hf.model.rotary_emb(x, pos), attention_mask=None, position_ids=pos)
        y = y[0] if isinstance(y, tuple) else y
        ref = norms["norm"](y[0])
    assert torch.equal(got, nxt)
    diff = (got - ref).abs().max().item()
    assert ref.abs().max() > 0.5 and diff < ATOL, diff


def test_bad_gguf_heads_are_refused(tmp_path):
    path, _, mtp = qwen35_mtp_checkpoint(str(tmp_path / "hf"))
    bad = {  # llama.cpp name -> (its rows, cols) in the file, and what the refusal says
        "blk.4.nextn.eh_proj.weight": (
            (64, 136),
            r"model\.layers\.4\.eh_proj\.weight: expected shape \(64, 128\), got \(64, 136\)",
        ),
        "blk.4.attn_q.weight": ((250, 64), r"model\.layers\.4\.self_attn\.q_proj\.weight: shard 0"),
    }
    for name, (shape, message) in bad.items():
        file = str(tmp_path / f"{name}.gguf")
        write_gguf(path, path, file, mtp=mtp, overrides={name: np.zeros(shape, np.float32)})
        with pytest.raises(ValueError, match=message):
            make_scheduler(file, speculative_algorithm="nextn", max_total_tokens=256)
    headless = write_gguf(path, path, str(tmp_path / "headless.gguf"))  # the converter's --no-mtp
    with pytest.raises(ValueError, match="has no multi-token-prediction layers"):
        make_scheduler(headless, speculative_algorithm="nextn", max_total_tokens=256)
