"""EAGLE heads in their published layouts: the forward against HF's LlamaDecoderLayer (EAGLE) and a
plain torch reference of SGLang's LlamaForCausalLMEagle3 (EAGLE-3) with the same weights, and the
checkpoint reader's round trip and refusals."""

import json

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaDecoderLayer,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from radixlm.speculative.eagle_checkpoint import load_eagle_head, load_token_map, save_eagle_head
from radixlm.speculative.eagle_head import EagleHead, EagleHeadConfig, causal_attend

CFG = LlamaConfig(
    vocab_size=100,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
)
CFG._attn_implementation = "sdpa"  # HF's sdpa attention is causal when given no mask


def random_head(kind: str, seed: int = 0, **kw) -> EagleHead:
    torch.manual_seed(seed)
    head = EagleHead(EagleHeadConfig.for_target(CFG, kind, **kw))
    with torch.no_grad():
        for name, p in head.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)  # norms that are not the identity
        if head.own_vocab:
            head.d2t.copy_(
                torch.randperm(CFG.vocab_size)[: head.d2t.numel()].sort().values
                - torch.arange(head.d2t.numel())
            )
    return head.eval()


def test_eagle_head_is_fc_then_a_llama_decoder_layer_without_its_input_norm():
    head = random_head("eagle")
    hf = LlamaDecoderLayer(CFG, 0)
    own = {
        k.removeprefix("layers.0."): v
        for k, v in head.state_dict().items()
        if k.startswith("layers.0.")
    }
    assert hf.load_state_dict(own, strict=False).missing_keys == ["input_layernorm.weight"]
    hf.input_layernorm = torch.nn.Identity()  # EAGLE's first layer (SGLang: LlamaForCausalLMEagle)
    emb, h, pos = torch.randn(12, 64), torch.randn(12, 64), torch.arange(5, 17)
    with torch.no_grad():
        out, nxt = head(emb, h, pos, causal_attend(), from_target=True)
        x = head.fc(torch.cat([emb, h], -1))[None]
        ref = hf(
            x, position_embeddings=LlamaRotaryEmbedding(CFG)(x, pos[None]), position_ids=pos[None]
        )
    ref = ref[0] if isinstance(ref, tuple) else ref
    torch.testing.assert_close(out, ref[0], atol=1e-5, rtol=1e-5)
    assert out is nxt  # EAGLE: the next step reads what the LM head reads


def eagle3_reference(head: EagleHead, emb, h, pos, from_target: bool):
    """SGLang's llama_eagle3 forward written out: x = fc(features) (or the previous step's state),
    midlayer over [input_layernorm(emb), hidden_norm(x)] with x as the residual, then norm."""
    sd = head.state_dict()

    def norm(name, t):
        n = LlamaRMSNorm(64, eps=CFG.rms_norm_eps)
        n.weight.data.copy_(sd[name])
        return n(t)

    x = h @ sd["fc.weight"].T if from_target else h
    a = torch.cat(
        [norm("midlayer.input_layernorm.weight", emb), norm("midlayer.hidden_norm.weight", x)], -1
    )
    q = (a @ sd["midlayer.self_attn.q_proj.weight"].T).view(1, -1, 4, 16).transpose(1, 2)
    k = (a @ sd["midlayer.self_attn.k_proj.weight"].T).view(1, -1, 2, 16).transpose(1, 2)
    v = (a @ sd["midlayer.self_attn.v_proj.weight"].T).view(1, -1, 2, 16).transpose(1, 2)
    cos, sin = LlamaRotaryEmbedding(CFG)(x[None], pos[None])
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = (q @ k.transpose(-1, -2)) / 4.0 + torch.full((len(pos), len(pos)), float("-inf")).triu(
        1
    )
    attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(len(pos), 64)
    x = x + attn @ sd["midlayer.self_attn.o_proj.weight"].T
    m = norm("midlayer.post_attention_layernorm.weight", x)
    g, u = m @ sd["midlayer.mlp.gate_proj.weight"].T, m @ sd["midlayer.mlp.up_proj.weight"].T
    x = x + (torch.nn.functional.silu(g) * u) @ sd["midlayer.mlp.down_proj.weight"].T
    return norm("norm.weight", x), x


@pytest.mark.parametrize("from_target", [True, False])
def test_eagle3_head_matches_the_layout_written_out(from_target):
    head = random_head("eagle3", draft_vocab_size=32, aux_layer_ids=[1, 3, 5])
    assert head.cfg.capture_layers(8) == (2, 4, 6)  # SGLang: the outputs of the listed layers
    assert EagleHeadConfig.for_target(CFG, "eagle3").capture_layers(8) == (
        2,
        4,
        5,
    )  # its default: 2, n//2, n-3
    emb, pos = torch.randn(9, 64), torch.arange(9)
    h = torch.randn(9, 3 * 64 if from_target else 64)
    with torch.no_grad():
        out, nxt = head(emb, h, pos, causal_attend(), from_target=from_target)
        ref_out, ref_nxt = eagle3_reference(head, emb, h, pos, from_target)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nxt, ref_nxt, atol=1e-5, rtol=1e-5)
    ids = head.draft_token_ids()
    assert ids.shape == (32,) and ids.unique().numel() == 32 and int(ids.max()) < CFG.vocab_size


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_checkpoint_round_trip(tmp_path, kind):
    head = random_head(kind, draft_vocab_size=32 if kind == "eagle3" else None)
    save_eagle_head(head, str(tmp_path), {"rope_theta": 10000.0})
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == [
        {"eagle": "LlamaForCausalLMEagle", "eagle3": "LlamaForCausalLMEagle3"}[kind]
    ]
    loaded = load_eagle_head(str(tmp_path), kind, CFG.vocab_size, 64)
    for (n, a), (m, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert n == m and torch.equal(a, b), n
    if kind == "eagle3":
        from safetensors.torch import load_file

        t2d = load_file(str(tmp_path / "model.safetensors"))[
            "t2d"
        ]  # SGLang's inverse map, beside d2t
        assert t2d.sum() == 32 and t2d[head.draft_token_ids()].all()


def test_published_names_and_refusals(tmp_path):
    from safetensors.torch import load_file, save_file

    head = random_head("eagle")
    save_eagle_head(head, str(tmp_path), {})
    file = tmp_path / "model.safetensors"
    tensors = load_file(str(file))
    # SGLang-converted checkpoints prefix "model." and may carry what the head takes from the
    # target.
    extra = {"model." + k: v for k, v in tensors.items()} | {
        "embed_tokens.weight": torch.zeros(100, 64),
        "lm_head.weight": torch.zeros(100, 64),
        "layers.0.input_layernorm.weight": torch.ones(64),
    }
    save_file(extra, str(file))
    loaded = load_eagle_head(str(tmp_path), "eagle", 100, 64)
    assert torch.equal(loaded.fc.weight, head.fc.weight)
    with pytest.raises(ValueError, match="vocab_size 100 is not the target's 200"):
        load_eagle_head(str(tmp_path), "eagle", 200, 64)
    with pytest.raises(ValueError, match=r"not an eagle3 head .*--speculative-algorithm eagle\)"):
        load_eagle_head(str(tmp_path), "eagle3", 100, 64)
    save_file({k: v for k, v in tensors.items() if k != "fc.bias"}, str(file))
    with pytest.raises(ValueError, match=r"missing \['fc.bias'\]"):
        load_eagle_head(str(tmp_path), "eagle", 100, 64)
    save_file(tensors | {"layers.1.mlp.up_proj.weight": torch.zeros(96, 64)}, str(file))
    with pytest.raises(ValueError, match=r"unknown \['layers.1.mlp.up_proj.weight'\]"):
        load_eagle_head(str(tmp_path), "eagle", 100, 64)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_eagle_head(str(tmp_path / "nowhere"), "eagle", 100, 64)


def test_token_map(tmp_path):
    torch.save([5, 3, 3, 9], tmp_path / "map.pt")
    assert load_token_map(str(tmp_path / "map.pt"), 10).tolist() == [3, 5, 9]
    torch.save(torch.tensor([1, 10]), tmp_path / "bad.pt")
    with pytest.raises(ValueError, match=r"in \[0, 10\)"):
        load_token_map(str(tmp_path / "bad.pt"), 10)
    (tmp_path / "text.pt").write_text("not torch")
    with pytest.raises(ValueError, match="not a torch file of token ids"):
        load_token_map(str(tmp_path / "text.pt"), 10)


def test_config_refusals():
    from radixlm.config import ServerArgs
    from radixlm.speculative.config import SpeculativeConfig

    def config(**kw):
        return SpeculativeConfig.from_server_args(ServerArgs(**kw))

    with pytest.raises(ValueError, match="needs speculative_draft_model_path"):
        config(speculative_algorithm="EAGLE")  # SGLang's spelling
    with pytest.raises(
        ValueError, match="speculative_token_map is used by speculative_algorithm eagle only"
    ):
        config(
            speculative_algorithm="eagle3",
            speculative_draft_model_path="/h",
            speculative_token_map="/m.pt",
        )
    with pytest.raises(ValueError, match="not supported with tp_size 2"):
        config(speculative_algorithm="eagle", speculative_draft_model_path="/h", tp_size=2)
    with pytest.raises(ValueError, match="not supported with enable_torch_compile"):
        config(
            speculative_algorithm="eagle",
            speculative_draft_model_path="/h",
            enable_torch_compile=True,
        )
    with pytest.raises(ValueError, match="needs --speculative-algorithm"):
        config(speculative_token_map="/m.pt")
    c = config(speculative_algorithm="EAGLE3", speculative_draft_model_path="/h")
    assert c.algorithm == "eagle3" and (c.tree_shape.width, c.tree_shape.depth) == (
        4,
        5,
    )  # SGLang-like defaults
