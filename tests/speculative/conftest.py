"""EAGLE test models: a tiny target whose answers a head can learn in seconds, random heads in the
published layouts, and a head trained by `radixlm train-eagle` (session-scoped: trained once)."""

import pytest
import torch

from radixlm.speculative.eagle_checkpoint import save_eagle_head
from radixlm.speculative.eagle_head import EagleHead, EagleHeadConfig
from tests.conftest import engine_args, flush_when_idle

HOT_TOKENS = (
    24  # the tiny target's answers keep to these (their embeddings are 4x longer): learnable fast
)


@pytest.fixture(scope="session")
def hot_model_dir(tmp_path_factory, default_model_path):
    """A 2-layer random Llama (hidden 64, SmolLM2's tokenizer) whose greedy answers are walks over
    HOT_TOKENS tokens that depend on the context, its second layer's outputs scaled down (0.1) so
    that a one-layer head can learn much of it from a few thousand positions."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from radixlm.model.loader import load_tokenizer

    tok = load_tokenizer(default_model_path)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.25,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        hot = torch.randperm(len(tok), generator=torch.Generator().manual_seed(1))[:HOT_TOKENS]
        model.model.embed_tokens.weight[hot] *= 4
        model.model.layers[1].self_attn.o_proj.weight *= 0.1
        model.model.layers[1].mlp.down_proj.weight *= 0.1
    path = tmp_path_factory.mktemp("hot-llama")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="package")
def shared_default_engine(default_model_path):
    """One plain engine on the default model (engine_args(num_threads=2)) for tests/speculative:
    take it through `default_engine`."""
    from radixlm import Engine

    with Engine(default_model_path, **engine_args(num_threads=2)) as e:
        yield e


@pytest.fixture
def default_engine(shared_default_engine):
    """The plain engine on the default model, its cache flushed: it answers as a fresh engine does
    (plain decoding's outputs, the reference of the speculative engines; its counters run on)."""
    flush_when_idle(shared_default_engine)
    return shared_default_engine


def random_head_dir(path, target_config, kind: str, seed: int = 0, **kw) -> str:
    """A random-weight head for target_config in the published layout (an EAGLE-3 head with its own
    vocabulary maps it onto random target tokens)."""
    torch.manual_seed(seed)
    head = EagleHead(EagleHeadConfig.for_target(target_config, kind, **kw))
    if head.own_vocab:
        n = head.d2t.numel()
        ids = (
            torch.randperm(target_config.vocab_size, generator=torch.Generator().manual_seed(seed))[
                :n
            ]
            .sort()
            .values
        )
        head.d2t.copy_(ids - torch.arange(n))
    save_eagle_head(head, str(path), {})
    return str(path)


def train_args(model_dir: str, out: str, *extra: str) -> list[str]:
    return [
        "train-eagle",
        "--model-path",
        model_dir,
        "--output",
        out,
        "--num-prompts",
        "24",
        "--max-new-tokens",
        "40",
        "--batch-size",
        "8",
        "--batch-tokens",
        "512",
        "--hot-vocab",
        "512",
        "--lr",
        "3e-3",
        "--num-threads",
        "1",
        *extra,
    ]


@pytest.fixture(scope="session")
def trained_head_dir(tmp_path_factory, hot_model_dir):
    from radixlm.cli import main

    out = str(tmp_path_factory.mktemp("trained-eagle"))
    assert main(train_args(hot_model_dir, out, "--epochs", "30", "--save-every", "1000")) == 0
    return out
