"""GLM-4.5 (Glm4MoeForCausalLM) against transformers on a tiny random float32 checkpoint: hidden 64,
3 layers (the first dense: first_k_dense_replace 1), 8 routed experts in 2 groups (topk_group 1),
top-4, 1 shared expert, q/k/v bias, qk-norm, partial RoPE (factor 0.5 of head_dim 16), plus one
MTP layer's tensors in the checkpoint (skipped at load). Logits through the KV pools to 1e-4
(prefill batched, an extend over a shared prefix, decode), from save_pretrained's per-expert
tensors, transformers 5's stacked ones and the `glm4moe` GGUF llama.cpp's converter writes (MTP
layer included); greedy tokens equal HF's (near-tie rule) through the Engine alone, batched and in
prefill chunks smaller than the prompt, and from the GGUF through the pools."""

from __future__ import annotations

import random

import pytest
import torch

from radixlm import Engine
from radixlm.model.layers.moe.deepseek_routing import TopkMethod
from radixlm.model.loader import load_model
from radixlm.model.models.deepseek_moe import DeepseekMoE
from radixlm.model.models.llama import LlamaMLP
from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.model.glm4_moe_checkpoints import checkpoint, write_gguf
from tests.model.helpers import PoolHarness, hf_logits
from tests.model.moe_checkpoints import save_stacked

ATOL = 1e-4
NEW = 16
CHUNK = 16  # prefill chunk: the longer prompts take 2-3


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matmuls: one thread each (torch's team only waits on a busy machine), restored after."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    """(checkpoint path, HF model, HF's greedy references)."""
    path = str(tmp_path_factory.mktemp("glm4_moe"))
    hf = checkpoint(path)
    prompts = _prompts([5, 20, 45, 33], seed=7)
    return path, hf, [_reference(hf, p) for p in prompts]


@pytest.fixture
def glm_gguf(glm, tmp_path):
    path, hf, _ = glm
    return write_gguf(hf, path, str(tmp_path / "f32.gguf"))


def _prompts(lengths, seed):
    rng = random.Random(seed)
    return [[rng.randrange(10, 800) for _ in range(n)] for n in lengths]


def _check_logits(loaded, hf) -> None:
    """Two prompts prefilled together, a third extending the second's cached prefix, then two
    decode steps of all three: every row equals transformers' logits for the whole sequence."""
    h = PoolHarness(loaded.model, loaded.hf_config)
    seqs = _prompts([9, 30], seed=5)
    reqs = [h.new_request() for _ in seqs]
    outs = list(h.extend(reqs, [s[:-2] for s in seqs]))
    shared = h.new_request(share_prefix_of=reqs[1], prefix_len=12)
    tail = _prompts([10], seed=6)[0]
    seqs.append(seqs[1][:12] + tail)
    reqs.append(shared)
    outs.append(torch.cat([torch.zeros(12, outs[0].shape[1]), h.extend([shared], [tail[:-2]])[0]]))
    for step in (2, 1):
        dec = h.decode(reqs, [s[-step] for s in seqs])
        outs = [torch.cat([o, d[None]]) for o, d in zip(outs, dec)]
    for i, (s, o) in enumerate(zip(seqs, outs)):
        ref = hf_logits(hf, s)
        lo = 12 if i == 2 else 0  # the shared prefix's rows were computed by request 1
        torch.testing.assert_close(o[lo:], ref[lo:], atol=ATOL, rtol=0, msg=f"request {i}")


def test_structure_and_logits_match_hf(glm):
    path, hf, _ = glm
    loaded = load_model(path, quantization="none")
    assert loaded.architecture == "Glm4MoeForCausalLM"
    layers = loaded.model.model.layers
    assert len(layers) == 3  # the MTP layer is not built
    assert type(layers[0].mlp) is LlamaMLP
    assert all(isinstance(layer.mlp, DeepseekMoE) for layer in layers[1:])
    routing = layers[1].mlp.routing
    assert (routing.method, routing.n_group, routing.topk_group, routing.top_k) == (
        TopkMethod.NOAUX_TC,
        2,
        1,
        4,
    )
    assert (routing.norm_topk_prob, routing.routed_scaling_factor) == (True, 2.5)
    attn = layers[0].self_attn
    assert attn.rotary_emb.rotary_dim == 8 and attn.qk_norm
    assert attn.qkv_proj.bias is not None and attn.o_proj.bias is None
    _check_logits(loaded, hf)


def test_stacked_experts_match_hf(glm, tmp_path):
    """transformers 5's in-memory names (mlp.experts.gate_up_proj [E, 2I, H], down_proj)."""
    _, hf, _ = glm
    loaded = load_model(save_stacked(hf, str(tmp_path)), quantization="none")
    _check_logits(loaded, hf)


def test_gguf_config_logits_and_tokens_match_hf(glm, glm_gguf):
    """llama.cpp's glm4moe file: the config read back is HF's (MTP layers out of the count, the
    partial rotary factor from rope.dimension_count), the logits are HF's, and so are the greedy
    tokens of the longest prompt (prefill, then decode steps; near-tie rule)."""
    _, hf, refs = glm
    loaded = load_model(glm_gguf, quantization="none")
    assert loaded.architecture == "Glm4MoeForCausalLM"
    cfg, ref = loaded.hf_config, hf.config
    for key in (
        "num_hidden_layers",
        "num_nextn_predict_layers",
        "head_dim",
        "attention_bias",
        "use_qk_norm",
        "first_k_dense_replace",
        "n_routed_experts",
        "n_shared_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "n_group",
        "topk_group",
        "norm_topk_prob",
        "routed_scaling_factor",
    ):
        assert getattr(cfg, key) == getattr(ref, key), key
    assert cfg.rope_parameters["partial_rotary_factor"] == 0.5
    _check_logits(loaded, hf)
    ids = refs[2][0]
    h = PoolHarness(loaded.model, cfg)
    r = h.new_request()
    tokens = [int(h.extend([r], [ids])[0][-1].argmax())]
    for _ in range(NEW - 1):
        tokens.append(int(h.decode([r], [tokens[-1]])[0].argmax()))
    assert_greedy_equal(tokens, refs[2], "gguf")


def _reference(hf, ids: list[int]) -> tuple:
    """(ids, HF's greedy tokens, HF's logits along them)."""
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, eos_token_id=None
        )
        gen = out[0, len(ids) :].tolist()
        logits = hf(torch.tensor([ids + gen])).logits[0, len(ids) - 1 :]
    return ids, gen, logits


def _check_greedy(model_path: str, refs: list[tuple], label: str) -> None:
    """Prompts of 5 to 45 tokens (all but the first longer than the prefill chunk), each alone and
    then all batched: radixlm's greedy tokens are HF's."""
    sp = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
    with Engine(
        model_path=model_path,
        quantization="none",
        enable_invariant_checks=True,
        chunked_prefill_size=CHUNK,
        log_level="warning",
    ) as engine:
        for i, (p, _, _) in enumerate(refs):
            assert engine.flush_cache()
            out = engine.generate(input_ids=p, sampling_params=sp)
            assert_greedy_equal(out["output_ids"], refs[i], f"{label} alone #{i}")
        assert engine.flush_cache()
        outs = engine.generate(input_ids=[r[0] for r in refs], sampling_params=sp)
        for i, out in enumerate(outs):
            assert_greedy_equal(out["output_ids"], refs[i], f"{label} batched #{i}")


def test_engine_greedy_matches_hf(glm):
    path, _, refs = glm
    _check_greedy(path, refs, "safetensors")
