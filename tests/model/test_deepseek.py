"""DeepseekV2ForCausalLM / DeepseekV3ForCausalLM against transformers on tiny random models
(fp32), loaded from safetensors and run over the latent KV pool with the MLA backend: prefill
decompresses the latents, decode absorbs kv_b_proj (torch and native paths).

V2: no q LoRA, softmax group_limited_greedy routing, routed_scaling_factor, YaRN with mscale.
V3: q LoRA, sigmoid scores + e_score_correction_bias, grouped top-k, norm_topk_prob."""

from __future__ import annotations

import pytest
import torch

from radixlm.cache.mla_pool import MLATokenToKVPool
from radixlm.model.loader import load_model
from tests.model.deepseek_refs import CONFIGS, MLAHarness, make_hf
from tests.model.helpers import hf_logits

ATOL = 1e-4


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matmuls: one thread each (torch's team only waits on a busy machine), restored after."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module", params=list(CONFIGS))
def models(request, tmp_path_factory):
    hf, cfg = make_hf(request.param)
    path = tmp_path_factory.mktemp(f"deepseek-{request.param}")
    hf.save_pretrained(path)
    loaded = load_model(str(path))
    assert loaded.architecture == cfg.architectures[0]
    return request.param, hf, loaded


def _prompts(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("native", [False, True], ids=["torch-decode", "native-decode"])
def test_logits_prefill_shared_prefix_and_decode(models, native):
    """One extend batch of three prompts, a fourth request extending the first one's cached prefix
    (as a radix-cache hit hands it over), then two decode steps of all four: every row equals
    transformers' logits for the whole sequence."""
    name, hf, loaded = models
    h = MLAHarness(loaded.model, loaded.hf_config, native=native)
    assert isinstance(h.kv_pool, MLATokenToKVPool)
    seqs = _prompts([9, 33, 70], seed=5)
    reqs = [h.new_request() for _ in seqs]
    outs = h.extend(reqs, [s[:-2] for s in seqs])
    shared = h.new_request(
        share_prefix_of=reqs[1], prefix_len=20
    )  # 20 tokens of seqs[1] from the pool
    tail = _prompts([15], seed=6)[0]
    seqs.append(seqs[1][:20] + tail)
    reqs.append(shared)
    outs.append(torch.cat([torch.zeros(20, outs[0].shape[1]), h.extend([shared], [tail[:-2]])[0]]))
    for step in (2, 1):
        dec = h.decode(reqs, [s[-step] for s in seqs])
        outs = [torch.cat([o, d[None]]) for o, d in zip(outs, dec)]
    for i, (s, o) in enumerate(zip(seqs, outs)):
        ref = hf_logits(hf, s)
        lo = 20 if i == 3 else 0  # the shared prefix's rows were computed by request 1
        diff = (o[lo:] - ref[lo:]).abs().max().item()
        assert ref.abs().max() > 1.0
        assert diff < ATOL, f"{name} request {i}: max|diff| {diff:.2e}"


def _greedy(loaded, prompts, n=32, **kw):
    h = MLAHarness(loaded.model, loaded.hf_config, **kw)
    reqs = [h.new_request() for _ in prompts]
    tokens = [[int(o[-1].argmax())] for o in h.extend(reqs, prompts)]
    for _ in range(n - 1):
        for t, nxt in zip(tokens, h.decode(reqs, [t[-1] for t in tokens]).argmax(-1).tolist()):
            t.append(nxt)
    return tokens


def _hf_generate(hf, prompt, n=32):
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    with torch.no_grad():
        return hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)[
            0, len(prompt) :
        ].tolist()


def test_greedy_matches_generate_alone_and_batched(models):
    """32 greedy tokens equal transformers' generate, each prompt alone and all three batched, with
    absorbed decode and with decompressed decode."""
    name, hf, loaded = models
    prompts = _prompts([6, 25, 48], seed=7)
    refs = [_hf_generate(hf, p) for p in prompts]
    assert [_greedy(loaded, [p])[0] for p in prompts] == refs
    assert _greedy(loaded, prompts) == refs
    assert _greedy(loaded, prompts, absorb=False) == refs


def test_startup_summary_reports_mla_bytes(models):
    from radixlm.model.memory.kv_layout import kv_layout
    from radixlm.model.model_summary import parameter_counts, summary

    name, hf, loaded = models
    cfg = loaded.hf_config
    layout = kv_layout(loaded.model, cfg)
    assert layout.mla and layout.head_dim == cfg.kv_lora_rank + cfg.qk_rope_head_dim
    L = cfg.num_hidden_layers
    assert (
        layout.bytes_per_token(L, torch.float32)
        == L * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 4
    )
    assert (
        layout.mha_bytes_per_token(L, torch.float32)
        == L
        * cfg.num_attention_heads
        * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim)
        * 4
    )
    total, active = parameter_counts(loaded.model)
    biases = [
        b for n, b in hf.named_buffers() if n.endswith("e_score_correction_bias")
    ]  # HF: buffers
    assert total == sum(p.numel() for p in hf.parameters()) + sum(b.numel() for b in biases)
    per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    moe_layers = L - cfg.first_k_dense_replace
    assert total - active == moe_layers * per_expert * (
        cfg.n_routed_experts - cfg.num_experts_per_tok
    )
    line = summary(loaded.architecture, loaded.model, cfg, layout, L, torch.float32)
    assert (
        loaded.architecture in line
        and "MHA would be" in line
        and f"top-{cfg.num_experts_per_tok}" in line
    )
    assert f"{active / 1e6:.2f}M active" in line


def test_other_backends_refuse_the_latent_pool():
    """--attention-backend native / torch on an MLA model: a ValueError naming the option and why;
    auto picks mla, which in turn refuses a model with per-head K/V."""
    from radixlm.model.layers.attention import resolve_attention_backends
    from radixlm.model.layers.attention.base import AttentionBackendSpec

    spec = AttentionBackendSpec(
        head_dim=40,
        dtype=torch.float32,
        kv_dtype=torch.float32,
        device=torch.device("cpu"),
        mla=True,
    )
    assert resolve_attention_backends(spec) == ("mla", "mla")
    for name in ("native", "torch"):
        with pytest.raises(ValueError, match=f"attention_backend {name}: reads per-head K/V"):
            resolve_attention_backends(spec, name)
    with pytest.raises(ValueError, match="decode_attention_backend torch"):
        resolve_attention_backends(spec, decode_attention_backend="torch")
    plain = AttentionBackendSpec(
        head_dim=64, dtype=torch.float32, kv_dtype=torch.float32, device=torch.device("cpu")
    )
    assert resolve_attention_backends(plain)[0] != "mla"
    with pytest.raises(
        ValueError, match="attention_backend mla: runs multi-head latent attention models"
    ):
        resolve_attention_backends(plain, "mla")
