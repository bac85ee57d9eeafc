"""Mooncake in the tests: PyPI's mooncake-transfer-engine-non-cuda (the test extra) loads Debian's
libibverbs1 librdmacm1 libnuma1. Where they are missing the Mooncake tests are skipped with that
reason, unless RADIXLM_REQUIRE_MOONCAKE=1 (.ci/run sets it, as it installs them): there a missing
library fails them by name, as the browser tests do with chromium."""

from __future__ import annotations

import os
import shutil

import pytest


def mooncake_missing() -> str | None:
    """Why Mooncake cannot run here, or None."""
    if shutil.which("mooncake_master") is None:
        return "no mooncake_master (pip install -e '.[test]')"
    try:
        from mooncake.engine import TransferEngine  # noqa: F401
        from mooncake.store import MooncakeDistributedStore  # noqa: F401
    except ImportError as e:
        return f"Mooncake's client does not load ({e}; .ci/run installs its Debian libraries)"
    return None


_WHY = mooncake_missing()
requires_mooncake = pytest.mark.skipif(
    _WHY is not None and os.environ.get("RADIXLM_REQUIRE_MOONCAKE") != "1",
    reason=f"Mooncake unavailable: {_WHY}",
)
