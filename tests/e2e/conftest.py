"""Radixlm servers on free ports for end-to-end tests (default model unless said), each started once
and shared by the tests that need no option of their own."""

import pytest

from radixlm.server.process import ServerProcess
from tests.conftest import TINY_SERVE, flush_cache


@pytest.fixture(scope="session")
def server():
    """The default model with default options, shared by the e2e tests that only read."""
    s = ServerProcess("--enable-invariant-checks")
    yield s
    s.stop()


@pytest.fixture
def fresh_server(server):
    """The shared default-model server with an empty radix cache, for a test whose assertions
    count cached tokens (or need its own prompts to be the first)."""
    flush_cache(server.url)
    return server


@pytest.fixture(scope="session")
def reasoning_server(tiny_model_dir):
    """The tiny model with --reasoning-parser qwen3 (test_thinking, test_anthropic_api)."""
    s = ServerProcess("--model-path", tiny_model_dir, "--reasoning-parser", "qwen3", *TINY_SERVE)
    yield s
    s.stop()
