"""A bare HF config.json as the model path: a model of that shape with random weights (speed
figures for shapes whose weights cannot travel, benchmarks/configs/)."""

import argparse
import json

import pytest
import torch

from tests.model.helpers import SMALL


def write_config(tmp_path, **extra):
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                **SMALL,
                "tie_word_embeddings": False,
                "eos_token_id": 2,
                "vocab_size": 1024,
                **extra,
            }
        )
    )
    return str(path)


def test_config_json_loads_a_random_model(tmp_path):
    from radixlm.model.loader import RANDOM_WEIGHTS_STD, load_model, load_model_config

    path = write_config(tmp_path)
    loaded = load_model(path)
    assert loaded.architecture == "LlamaForCausalLM" and loaded.eos_token_ids == [2]
    assert load_model_config(path).hidden_size == SMALL["hidden_size"]
    params = dict(loaded.model.named_parameters())
    assert "lm_head.weight" in params
    for name, p in params.items():
        assert torch.isfinite(p).all(), name
        if p.dim() == 2:
            assert abs(p.std().item() - RANDOM_WEIGHTS_STD) < 0.2 * RANDOM_WEIGHTS_STD, name
        else:
            assert torch.equal(p, torch.ones_like(p)), name  # norm weights
    again = load_model(path)  # seeded: the same weights every time
    assert all(torch.equal(p, dict(again.model.named_parameters())[n]) for n, p in params.items())


def test_one_batch_runs_a_random_weight_model(tmp_path):
    from radixlm.bench import one_batch
    from radixlm.config import ServerArgs

    p = argparse.ArgumentParser()
    one_batch.add_args(p)
    args = p.parse_args(["--batch-size", "1", "3", "--input-len", "8", "--output-len", "4"])
    results = one_batch.run(args, ServerArgs(model_path=write_config(tmp_path), num_threads=1))
    assert [r["batch_size"] for r in results] == [1, 3]
    assert all(
        r["decode_throughput"] > 0 and len(r["output_ids"]) == r["batch_size"] for r in results
    )
    # The roofline's bytes: every weight once (the untied embedding only for the looked-up rows, not
    # counted) and each request's K/V at the mid-decode context (8 + 1.5 tokens), float32.
    from radixlm.model.loader import load_model

    model = load_model(write_config(tmp_path)).model
    weights = sum(p.nbytes for n, p in model.named_parameters() if "embed" not in n)
    kv_per_token = 2 * SMALL["num_hidden_layers"] * SMALL["num_key_value_heads"] * 16 * 4
    for r in results:
        assert r["step_bytes_mb"] * 1e6 == pytest.approx(
            weights + r["batch_size"] * 9.5 * kv_per_token, rel=1e-9
        )
        assert r["read_gbps"] > 0 and r["roofline_share"] > 0
        # The compute roofline: a float32 model's products against the CPU's fp32 FMA peak;
        # the prefill's operations are every prompt token through every matrix but the LM head
        # (untied here: the last token only).
        assert r["peak_kind"].startswith("fp32") and r["peak_tops"] > 0
        head = 1024 * SMALL["hidden_size"]  # write_config's vocabulary
        matrices = sum(
            p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n
        )
        ops = 2 * r["batch_size"] * (8 * (matrices - head) + head)
        assert r["prefill_tops"] * 1e12 * r["prefill_latency_s"] == pytest.approx(ops, rel=1e-9)
        assert 0 < r["prefill_peak_share"] < 1 and 0 < r["decode_peak_share"] < 1
    one_batch.format_table(results)
