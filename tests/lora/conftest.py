"""peft adapters made here on the tiny random Llama (tests/conftest.py), and their HF + peft
reference."""

import copy

import pytest
import torch

# name -> LoraConfig fields: several ranks and target sets, rsLoRA scaling once.
ADAPTERS = {
    "a8": dict(r=8, lora_alpha=16, target_modules="all-linear"),
    "b4": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_rslora=True),
    "c16": dict(
        r=16, lora_alpha=32, target_modules=["o_proj", "gate_proj", "up_proj", "down_proj"]
    ),
}


def make_adapter(base, path, seed, **fields):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = get_peft_model(
        copy.deepcopy(base), LoraConfig(init_lora_weights=False, lora_dropout=0.0, **fields)
    )
    model.save_pretrained(path)
    return model.eval()


@pytest.fixture(scope="session")
def lora_adapters(tiny_hf_model, tmp_path_factory):
    """name -> (peft directory, the peft model: the reference)."""
    root = tmp_path_factory.mktemp("lora")
    return {
        name: (str(root / name), make_adapter(tiny_hf_model, root / name, seed, **fields))
        for seed, (name, fields) in enumerate(ADAPTERS.items())
    }


def hf_greedy(model, ids, n):
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([ids]),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(ids) :].tolist()
