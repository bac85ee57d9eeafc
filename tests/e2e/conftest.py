"""A radixlm server on a free port for end-to-end tests (default model unless said)."""

import pytest

from radixlm.server.process import ServerProcess


@pytest.fixture(scope="session")
def server():
    """The default model with default options, shared by the e2e tests that only read."""
    s = ServerProcess("--enable-invariant-checks")
    yield s
    s.stop()
