"""A tiny random DeepSeek-V3 (q LoRA, sigmoid grouped routing, MLA) through the Engine: greedy
outputs equal transformers' alone and batched, a shared prefix is served from the radix cache, and
the scheduler reports the latent pool's size."""

import pytest
import torch

from radixlm import Engine
from tests.conftest import engine_args
from tests.model.deepseek_refs import (
    save_hf,
)


@pytest.fixture(scope="module")
def deepseek_v3(tmp_path_factory, default_model_path):
    return save_hf("v3", tmp_path_factory.mktemp("deepseek-v3"), default_model_path)


def test_engine_greedy_batched_and_prefix_cache(deepseek_v3):
    path, hf, cfg = deepseek_v3
    g = torch.Generator().manual_seed(11)
    doc = torch.randint(3, 256, (60,), generator=g).tolist()
    prompts = [doc + torch.randint(3, 256, (n,), generator=g).tolist() for n in (5, 9, 14)]
    with torch.no_grad():
        refs = [
            hf.generate(torch.tensor([p]), max_new_tokens=32, do_sample=False)[0, len(p) :].tolist()
            for p in prompts
        ]
    sp = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}
    with Engine(path, **engine_args()) as e:
        info = e.scheduler_info
        assert info["architecture"] == "DeepseekV3ForCausalLM"
        latent = cfg.num_hidden_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 4
        assert info["kv_cache_bytes"] == (info["max_total_num_tokens"] + 1) * latent
        first = e.generate(input_ids=prompts[0], sampling_params=sp)
        assert first["output_ids"] == refs[0]
        rest = e.generate(input_ids=prompts[1:], sampling_params=sp)
        assert [o["output_ids"] for o in rest] == refs[1:]
        assert all(
            o["meta_info"]["cached_tokens"] >= len(doc) for o in rest
        )  # the document from the tree
