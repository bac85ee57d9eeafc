"""DeepseekRouting against transformers' routers on random hidden states: the same experts with the
same weights for V2's greedy and group_limited_greedy (softmax) and V3's noaux_tc (sigmoid +
e_score_correction_bias, groups by their two best, normalized, scaled)."""

import pytest
import torch
import transformers
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

from radixlm.model.layers.moe.deepseek_routing import DeepseekRouting, TopkMethod

E, K, HIDDEN = 16, 4, 32


def _sorted(weights, ids):
    order = ids.argsort(dim=-1)
    return weights.gather(1, order), ids.gather(1, order)


@pytest.mark.parametrize(
    "method,v3", [("greedy", False), ("group_limited_greedy", False), ("noaux_tc", True)]
)
def test_same_experts_and_weights_as_transformers(method, v3):
    g = torch.Generator().manual_seed(3)
    common = dict(
        hidden_size=HIDDEN,
        n_routed_experts=E,
        num_experts_per_tok=K,
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
    )
    if v3:
        cfg = transformers.DeepseekV3Config(**common, norm_topk_prob=True)
        ref = DeepseekV3TopkRouter(cfg)
        ref.e_score_correction_bias.copy_(0.5 * torch.randn(E, generator=g))
    else:
        cfg = transformers.DeepseekV2Config(**common, topk_method=method)
        ref = DeepseekV2TopkRouter(cfg)
    with torch.no_grad():
        ref.weight.copy_(torch.randn(E, HIDDEN, generator=g))
    ours = DeepseekRouting.from_config(cfg, v3)
    assert ours.method == TopkMethod(method)
    x = torch.randn(64, HIDDEN, generator=g)
    with torch.no_grad():
        logits, ref_w, ref_ids = ref(x)
    w, ids = ours.select(x @ ref.weight.T, getattr(ref, "e_score_correction_bias", None))
    ref_w, ref_ids = _sorted(ref_w, ref_ids)
    w, ids = _sorted(w, ids)
    assert torch.equal(ids, ref_ids)
    assert torch.allclose(w, ref_w, atol=1e-6, rtol=0)
    if (
        method != "greedy"
    ):  # the group limit did bite: a plain top-k would pick other experts somewhere
        plain = torch.topk(logits.softmax(-1) if not v3 else logits.sigmoid(), K, dim=-1)[1].sort(
            -1
        )[0]
        assert not torch.equal(plain, ids)


def test_bad_grouping_is_refused():
    with pytest.raises(ValueError, match="n_group 3 must divide n_routed_experts 16"):
        DeepseekRouting(E, K, TopkMethod.GROUP_LIMITED_GREEDY, n_group=3, topk_group=1)
    with pytest.raises(ValueError, match="topk_group must be in 1..n_group"):
        DeepseekRouting(E, K, TopkMethod.NOAUX_TC, n_group=4, topk_group=5)
