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


def test_unity_files_include_every_source_once_and_isa_pragmas_alone(tmp_path):
    """The sources compile as unity files; a file that sets `#pragma GCC target` must stay out of
    them (the pragma would retarget every file after it to an ISA the baseline may lack)."""
    compiled = build.unity_sources(str(tmp_path))
    included = []
    for path in compiled:
        if os.path.dirname(path) == str(tmp_path):
            with open(path) as f:
                included += [line.split('"')[1] for line in f if line.startswith("#include")]
    alone = [p for p in compiled if os.path.dirname(p) != str(tmp_path)]
    assert sorted(included + alone) == build.sources()
    assert alone, "quant_x8_vnni.cpp sets an AVX-512 target: it compiles alone"
    for path in included:
        with open(path) as f:
            assert "#pragma GCC target" not in f.read(), path
    # A second call leaves unchanged files untouched (ninja would rebuild on a new timestamp).
    stamps = [os.stat(p).st_mtime_ns for p in compiled]
    assert [os.stat(p).st_mtime_ns for p in build.unity_sources(str(tmp_path))] == stamps
