"""Shared fixtures: the default model's path, and a tiny random Llama with the real tokenizer
(fast engine tests that still exercise every scheduler path)."""

import asyncio
import logging
import os

import pytest

# Under pytest-xdist (pyproject's addopts) more workers than cores share the machine: torch work
# runs on one thread per process, the test's own (the HF references) and that of the servers and
# engines it starts without --num-threads (their default: OMP_NUM_THREADS, utils.host_threads),
# rather than OpenMP threads spin-waiting for a core another worker holds. Those that ask for two
# threads wait passively (OMP_WAIT_POLICY): a spinning thread burns the core its partner needs (a
# scheduler test with two threads took 2.7x the CPU spinning). Set before torch is imported (OpenMP
# reads it when torch loads it) and before any engine's fork server starts (it imports torch under
# this environment).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # after the environment above

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


if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_configure(config):
    """Servers (ServerProcess) fork from a preloaded process: tests/forked_servers.py."""
    from tests import forked_servers

    forked_servers.install()


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config, items):
    """The cases tests/extended_cases.py lists are marked extended; the longest files first
    (tests/durations.py), so parallel workers finish together."""
    from tests import durations
    from tests.extended_cases import extended_reason

    for item in items:
        reason = extended_reason(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.extended(reason=reason))
    durations.order_longest_first(items, durations.load())


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


@pytest.fixture(autouse=True)
def root_logger_restored():
    """An in-process Engine configures logging as a server does (root at INFO, a handler on the
    stderr pytest captured and later closes): put the root logger back after the test, so a later
    test on the worker neither captures other libraries' INFO lines nor logs to a closed stream."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    for handler in root.handlers[:]:
        if handler not in handlers and not type(handler).__module__.startswith("_pytest"):
            root.removeHandler(handler)
    root.setLevel(level)


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
def hf_default_model(tmp_path_factory, default_model_path):
    """HF transformers' float32 model of the default GGUF, the reference of the tests that compare
    with it: a fresh copy per call (peft wraps it in place). HF reads a GGUF in ~20 s of one core
    (its metadata reader walks the 49k-token vocabulary in Python), so the first worker to need it
    saves HF's own result as a HF directory, shared by every xdist worker, that loads in ~1 s."""
    from filelock import FileLock
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's root, above each worker's own directory
    saved = shared / "hf-default-model"
    with FileLock(str(shared / "hf-default-model.lock")):
        if not (saved / "config.json").exists():
            d, name = os.path.split(default_model_path)
            hf = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
            # HF marks a GGUF-loaded model quantized and refuses save_pretrained, though its
            # weights are float32 by now: the config without that mark and the weights as they are.
            hf.config.__dict__.pop("quantization_config", None)
            hf.config.save_pretrained(saved)
            save_model(hf, str(saved / "model.safetensors"))

    def load():
        return AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32).eval()

    return load


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


@pytest.fixture(scope="session")
def shared_tiny_engine(tiny_model_dir):
    """One plain engine on the tiny Llama (engine_args()) for the whole session: take it through
    `tiny_engine`."""
    from radixlm import Engine

    with Engine(tiny_model_dir, **engine_args()) as e:
        yield e


@pytest.fixture
def tiny_engine(shared_tiny_engine):
    """The session's plain engine on the tiny Llama, its cache flushed: it answers as a fresh engine
    does (its counters run on: compare them before and after, never as they stand). For tests that
    only generate on it, e.g. the plain decoding another engine's outputs must equal."""
    flush_when_idle(shared_tiny_engine)
    return shared_tiny_engine


def flush_when_idle(engine, timeout: float = 30.0) -> None:
    """Empty the engine's cache once its requests are done (aborts land asynchronously)."""
    import time

    deadline = time.monotonic() + timeout
    while not engine.flush_cache():
        assert time.monotonic() < deadline, f"requests still running after {timeout} s"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def shared_radix_engine(tiny_model_dir):
    """A radix-drafting engine on the tiny Llama (fixed draft policy), one per module: take it
    through `radix_engine`."""
    from radixlm import Engine

    with Engine(
        tiny_model_dir,
        **engine_args(speculative_algorithm="radix", speculative_draft_policy="fixed"),
    ) as e:
        yield e


@pytest.fixture
def radix_engine(shared_radix_engine):
    """The module's radix-drafting engine, its cache flushed: its drafts come from the radix tree
    only, so it drafts as a fresh one does (its counters run on: compare them before and after)."""
    flush_when_idle(shared_radix_engine)
    return shared_radix_engine


@pytest.fixture(scope="session")
def plain_loop():
    """plain_loop(model_dir, chunk): the plain scheduler loop's answers to the comparison workload
    (tests/engine/workloads.py), computed by one engine per (model, chunk) per session; a copy each
    call."""
    import copy

    from tests.engine.workloads import plain_reference

    refs: dict = {}

    def get(model_dir: str, chunk: int) -> dict:
        if (model_dir, chunk) not in refs:
            refs[model_dir, chunk] = plain_reference(model_dir, chunk)
        return copy.deepcopy(refs[model_dir, chunk])

    return get


# A tiny-model server's options: one thread, a small KV pool, the invariant checks (DEVELOPERS.md).
TINY_SERVE = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")


@pytest.fixture(scope="session")
def tiny_server_process(tiny_model_dir):
    """`serve --model-path <tiny> *TINY_SERVE`, started once for the whole run (a start-up is three
    processes each importing torch): shared by the tests, in any package, that need no option of
    their own. Tests take `tiny_server` (its cache flushed first); a package-scoped fixture may take
    this one and flush where it matters."""
    from radixlm.server.process import ServerProcess

    s = ServerProcess("--model-path", tiny_model_dir, *TINY_SERVE)
    yield s
    s.stop()


@pytest.fixture
def tiny_server(tiny_server_process):
    """The shared tiny-model server with an empty radix cache: what an earlier test (of any module)
    cached cannot make this one's cached_tokens pass or fail."""
    flush_cache(tiny_server_process.url)
    return tiny_server_process


def flush_cache(url: str, headers: dict | None = None, within: float = 30) -> None:
    """Empty a server's radix cache (between the tests that share it). A flush is refused while a
    request runs: an aborted one from the test before may still be winding down, so ask again."""
    import time

    import requests

    deadline = time.monotonic() + within
    while True:
        r = requests.post(url + "/flush_cache", headers=headers, timeout=60)
        if r.status_code == 200:
            return
        assert r.status_code == 400 and time.monotonic() < deadline, (
            f"flush_cache: {r.status_code} {r.text}"
        )
        time.sleep(0.1)


def engine_args(**kw):
    """Small engines for tests: 1 thread each, so a test does not fight its reference."""
    base = dict(num_threads=1, kv_memory_gb=0.05, enable_invariant_checks=True, log_level="warning")
    base.update(kw)
    return base
