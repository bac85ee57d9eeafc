"""What the fork server imports fixes what its children inherit: Triton's variables are left out
of the environment it must share with its parent (process_context._IMPORT_TIME_ENV) because
nothing it preloads imports triton, whose interpreter switch is read when a kernel is decorated."""

import subprocess
import sys

from radixlm.engine import process_context
from tests.forked_servers import SERVER_PRELOAD


def test_the_preloads_do_not_import_triton():
    modules = [process_context.PRELOAD, *SERVER_PRELOAD]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'triton'))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", r.stdout
    assert not any(p.startswith("TRITON") for p in process_context._IMPORT_TIME_ENV)
