"""`radixlm train-eagle` on a tiny target (seconds): it writes the published layout and a token map,
the head it trains drafts with a higher acceptance than an untrained one while outputs stay exactly
plain decoding's, and --resume continues a run to the very weights an uninterrupted run reaches."""

import json
import os
import shutil

import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from radixlm.cli import main
from radixlm.speculative.eagle_checkpoint import load_eagle_head, load_token_map
from radixlm.speculative.eagle_prompts import default_prompts
from tests.scheduler.harness import Driver, make_scheduler
from tests.speculative.conftest import random_head_dir, train_args


def test_writes_the_published_layout(trained_head_dir, hot_model_dir):
    cfg = json.loads(open(os.path.join(trained_head_dir, "config.json")).read())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle"] and cfg["num_hidden_layers"] == 1
    names = set(load_file(os.path.join(trained_head_dir, "model.safetensors")))
    assert {
        "fc.weight",
        "fc.bias",
        "layers.0.self_attn.q_proj.weight",
        "layers.0.mlp.down_proj.weight",
        "layers.0.post_attention_layernorm.weight",
    } <= names
    assert (
        "layers.0.input_layernorm.weight" not in names and "lm_head.weight" not in names
    )  # EAGLE's layout
    target = AutoConfig.from_pretrained(hot_model_dir)
    load_eagle_head(trained_head_dir, "eagle", target.vocab_size, target.hidden_size)
    assert (
        load_token_map(os.path.join(trained_head_dir, "token_map.pt"), target.vocab_size).numel()
        == 512
    )
    report = json.loads(open(os.path.join(trained_head_dir, "training.json")).read())
    assert report["step"] == report["total_steps"] > 0 and report["train_positions"] > 500


def _decode(model_dir, prompts, **spec):
    d = Driver(make_scheduler(model_dir, disable_radix_cache=True, **spec))
    rids = [d.submit(p, max_new_tokens=32, temperature=0, ignore_eos=True) for p in prompts]
    while not d.idle():
        d.step()
    return [d.results[r].output_ids for r in rids], d.s.spec.info()


def test_trained_head_accepts_more_than_an_untrained_one(trained_head_dir, hot_model_dir, tmp_path):
    d = Driver(make_scheduler(hot_model_dir))
    tok = d.s.tokenizer.get()
    prompts = [
        tok.encode(
            tok.apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
            )
        )
        for p in default_prompts(6, seed=9)
    ]
    plain, _ = _decode(hot_model_dir, prompts)
    untrained = random_head_dir(
        tmp_path, AutoConfig.from_pretrained(hot_model_dir), "eagle", seed=3
    )
    rates = {}
    for name, head in (("trained", trained_head_dir), ("untrained", untrained)):
        outs, st = _decode(
            hot_model_dir,
            prompts,
            speculative_algorithm="eagle",
            speculative_draft_model_path=head,
            speculative_token_map=os.path.join(trained_head_dir, "token_map.pt"),
            speculative_draft_policy="fixed",
            speculative_num_steps=3,
        )
        assert outs == plain, name
        rates[name] = st
    trained, untrained = rates["trained"], rates["untrained"]
    # Measured: about 40 accepted (1.3 tokens per verify step) against about 10 (1.06).
    assert trained["spec_accepted_tokens"] >= 2 * untrained["spec_accepted_tokens"] + 5, rates
    assert trained["spec_accept_length"] >= untrained["spec_accept_length"] + 0.15, rates


def test_resume_continues_to_the_same_weights(trained_head_dir, hot_model_dir, tmp_path):
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    for out in (straight, resumed):  # the answers once: both runs read them
        os.makedirs(out)
        shutil.copy(os.path.join(trained_head_dir, "data.pt"), out)
    assert (
        main(
            train_args(
                hot_model_dir, straight, "--epochs", "10", "--max-steps", "6", "--save-every", "3"
            )
        )
        == 0
    )
    assert (
        main(
            train_args(
                hot_model_dir, resumed, "--epochs", "10", "--max-steps", "3", "--save-every", "3"
            )
        )
        == 0
    )
    assert (
        main(
            train_args(
                hot_model_dir, resumed, "--epochs", "10", "--max-steps", "6", "--save-every", "3"
            )
        )
        == 2
    )  # no --resume
    assert (
        main(
            train_args(
                hot_model_dir,
                resumed,
                "--epochs",
                "10",
                "--max-steps",
                "6",
                "--save-every",
                "3",
                "--resume",
            )
        )
        == 0
    )
    a, b = (
        load_file(os.path.join(straight, "model.safetensors")),
        load_file(os.path.join(resumed, "model.safetensors")),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads(open(os.path.join(resumed, "training.json")).read())["step"] == 6
