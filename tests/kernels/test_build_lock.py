"""A builder killed mid-build leaves torch's `lock` file in the kernel cache: later starts must not
wait on it."""

import os
import subprocess
import sys

import pytest

from radixlm.kernels import build


def test_a_stale_build_lock_does_not_block_the_next_start():
    if not build.load():
        pytest.fail(f"native kernels must build on this machine: {build.unavailable_reason()}")
    stale = os.path.join(build.build_dir(), "lock")
    with open(stale, "w"):  # what torch's FileBaton leaves when its process is killed
        pass
    code = "from radixlm.kernels import build; import sys; sys.exit(0 if build.load() else 3)"
    try:
        r = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        os.remove(stale)
        pytest.fail("the next start waited on the stale build lock")
    assert r.returncode == 0, r.stderr[-2000:]
    assert not os.path.exists(stale)
