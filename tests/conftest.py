"""Shared fixtures: the default model's path, and a tiny random Llama with the real tokenizer
(fast engine tests that still exercise every scheduler path)."""

import asyncio
import os

import pytest
import torch

# Without a GPU the Triton kernels run only in Triton's interpreter, and @triton.jit decides between
# interpreting and compiling when a function is decorated: triton's own library (tl.sum, tl.cdiv,
# ...) when triton is first imported, a kernel when its module is. So the interpreter is on from the
# start and triton is imported under it here, whichever test would have imported it first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        import triton  # noqa: F401 (imported for its side effect: the interpreter mode is read at import)
    except ImportError:  # not installed: tests/triton says so, module by module
        pass


@pytest.fixture(scope="module", autouse=True)
def no_event_loop_left_running():
    """A module that leaves an event loop running on the main thread (Playwright's sync API left
    open) breaks every later test's asyncio.run(): name the module that did it instead."""
    yield
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # none running: as it should be
        return
    pytest.fail("this module left an asyncio event loop running")


@pytest.fixture(scope="session", autouse=True)
def native_kernels_built():
    """Build the native kernels (first use on a fresh machine: a minute or more) here, before any
    test starts a server whose start-up wait would otherwise include the compile."""
    from radixlm.kernels import build

    return build.load()


@pytest.fixture(scope="session")
def default_model_path():
    from radixlm.model.loader import default_model_path as find

    return find()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, default_model_path):
    """A 2-layer Llama (hidden 64) with SmolLM2's tokenizer, saved as a HF directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from radixlm.model.loader import load_tokenizer

    path = tmp_path_factory.mktemp("tiny-llama")
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
        # Peaked logits: greedy choices far from ties, so batching cannot flip them.
        initializer_range=0.25,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def engine_args(**kw):
    """Small engines for tests: 1 thread each, so a test does not fight its reference."""
    base = dict(num_threads=1, kv_memory_gb=0.05, enable_invariant_checks=True, log_level="warning")
    base.update(kw)
    return base
