"""ModelRunnerConfig: built from ServerArgs field for field, and a bad value is an error that names
its field."""

import dataclasses

import pytest
import torch

from radixlm.config import ServerArgs
from radixlm.model.executor.runner_config import ModelRunnerConfig

# A value other than ModelRunnerConfig's default for every field ServerArgs sets.
OPTIONS = dict(
    model_path="/models/m.gguf",
    device="cuda:1",
    dtype="bfloat16",
    quantization="q8_0",
    kv_cache_dtype="int8",
    attention_backend="torch",
    prefill_attention_backend="native",
    decode_attention_backend="torch",
    max_total_tokens=1234,
    kv_memory_gb=0.25,
    mem_fraction_static=0.6,
    decode_kv_mirror_gb=0.5,
    disable_shared_prefix_attention=True,
    max_running_requests=7,
    context_length=300,
    num_threads=3,
    random_seed=5,
    tp_size=4,  # with nnodes 2: memory_share 2 (this host's ranks)
    nnodes=2,
    enable_torch_compile=True,
    torch_compile_max_bs=8,
    cuda_graph_max_bs=48,
    cuda_graph_bs=[8, 48],
    disable_cuda_graph=True,
    is_embedding=True,
    pp_max_micro_batch_size=2,
    mm_cache_size_mb=16,
    max_mamba_cache_size=40,
    mamba_full_memory_ratio=2.0,
    mamba_ssm_dtype="bfloat16",
    linear_attn_backend="torch",
    swa_full_tokens_ratio=0.3,
    json_model_override_args='{"rope_theta": 5.0}',
)


def test_from_server_args_maps_every_field():
    args = ServerArgs(**OPTIONS)
    config = ModelRunnerConfig.from_server_args(args)
    default = ModelRunnerConfig()
    for f in dataclasses.fields(ModelRunnerConfig):
        # lora: built from the LoRA flags, which refuse tp_size > 1 (tests/lora/test_lora_flags.py);
        # spec_draft_tokens: set by SchedulerConfig from the speculative options (the hybrids'
        # draft-state slots: tests/hybrid/test_hybrid_speculative.py)
        if f.name in ("lora", "spec_draft_tokens"):
            continue
        # decode_kv_mirror_bytes comes from decode_kv_mirror_gb, memory_share from tp_size / nnodes,
        # swa_memory_off from the options that keep one slot space, model_overrides from
        # json_model_override_args (below)
        derived = ("decode_kv_mirror_bytes", "memory_share", "swa_memory_off", "model_overrides")
        if f.name not in derived:
            want = getattr(args, f.name)  # a list flag is a tuple in the (frozen) config
            assert getattr(config, f.name) == (tuple(want) if isinstance(want, list) else want), (
                f.name
            )
        assert getattr(config, f.name) != getattr(default, f.name), f"{f.name}: OPTIONS must set it"
    assert config.decode_kv_mirror_bytes == 2**29
    assert config.model_overrides == {"rope_theta": 5.0}
    assert config.memory_share == 2
    assert "ranks" in config.swa_memory_off  # tp_size 4: one slot space


def test_server_args_defaults():
    config = ModelRunnerConfig.from_server_args(ServerArgs())
    assert config.decode_kv_mirror_bytes == 2**30  # 1 GiB on CPU
    assert dataclasses.replace(config, decode_kv_mirror_bytes=0) == ModelRunnerConfig()
    cuda = ModelRunnerConfig.from_server_args(ServerArgs(device="cuda"))
    assert cuda.decode_kv_mirror_bytes == 0 and cuda.resolved_dtype() == torch.bfloat16


def test_resolved_dtypes():
    assert ModelRunnerConfig().resolved_dtype() == torch.float32
    assert ModelRunnerConfig().resolved_kv_cache_dtype() == torch.float32
    assert ModelRunnerConfig(dtype="float16").resolved_kv_cache_dtype() == torch.float16
    assert (
        ModelRunnerConfig(dtype="bfloat16", kv_cache_dtype="int8").resolved_kv_cache_dtype()
        == torch.int8
    )


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ModelRunnerConfig().device = "cuda"


@pytest.mark.parametrize(
    "field,value,message",
    [
        (
            "attention_backend",
            "flash",
            "attention_backend must be one of native, triton, torch, mla, got 'flash'",
        ),
        (
            "prefill_attention_backend",
            "flash",
            "prefill_attention_backend must be one of native, triton, torch, mla, got 'flash'",
        ),
        (
            "decode_attention_backend",
            "",
            "decode_attention_backend must be one of native, triton, torch, mla, got ''",
        ),
        (
            "quantization",
            "q3_k",
            (
                "quantization must be one of none, gguf, int8, q4_0, q8_0, q4_k, f16, bf16, fp8,"
                " awq, gptq, mxfp4, compressed-tensors, fp8_serialized, got 'q3_k'"
            ),
        ),
        (
            "kv_cache_dtype",
            "fp8",
            "kv_cache_dtype must be one of auto, float32, float16, bfloat16, int8, int4, got 'fp8'",
        ),
        (
            "dtype",
            "float64",
            "dtype must be one of auto, float32, float16, bfloat16, half, float, got 'float64'",
        ),
        ("device", "mps", "device must be cpu or cuda, got 'mps'"),
        ("max_total_tokens", 0, "max_total_tokens must be positive, got 0"),
        ("context_length", -1, "context_length must be positive, got -1"),
        ("num_threads", 0, "num_threads must be positive, got 0"),
        ("max_running_requests", 0, "max_running_requests must be positive, got 0"),
        ("torch_compile_max_bs", 0, "torch_compile_max_bs must be positive, got 0"),
        ("cuda_graph_max_bs", 0, "cuda_graph_max_bs must be positive, got 0"),
        ("kv_memory_gb", 0.0, "kv_memory_gb must be positive, got 0.0"),
        ("decode_kv_mirror_bytes", -1, "decode_kv_mirror_bytes must be >= 0, got -1"),
    ],
)
def test_bad_value_names_the_field(field, value, message):
    with pytest.raises(ValueError) as e:
        ModelRunnerConfig(**{field: value})
    assert str(e.value) == message


@pytest.mark.parametrize(
    "field", ["prefill_attention_backend", "decode_attention_backend", "kv_memory_gb"]
)
def test_from_server_args_rejects_what_server_args_lets_through(field):
    """ServerArgs leaves these to the component's config."""
    value = 0.0 if field == "kv_memory_gb" else "flash"
    args = ServerArgs(**{field: value})
    with pytest.raises(ValueError, match=f"^{field} must be"):
        ModelRunnerConfig.from_server_args(args)
