"""A refusal raised inside a child process (the scheduler, a tp rank, a node's ranks, a server of
`serve --dp`) reaches the user as the command line's refusals do: one `radixlm: error:` line naming
the option, exit code 2, no traceback (issue 62). A crash while loading is no refusal: its traceback
stays in the log and the exit code is 1. Every command here fails at start-up, on the tiny model."""

import os
import re
import shutil

from radixlm.server.process import free_port
from tests.engine.test_startup_refusal import UNSUPPORTED, unsupported_checkpoint
from tests.forked_servers import cli_popen

TRITON = "attention_backend triton: the Triton kernels run on CUDA"
SMALL = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--log-level", "warning")


def _serve(*args: str, port: bool = True):
    """`radixlm serve ARGS` (forked as the tests' servers are: tests/forked_servers.py)."""
    listen = ("--port", str(free_port())) if port else ()
    # The tests' conftest turns Triton's interpreter on for this process and its children; without
    # it the CPU refuses the Triton kernels, which only the scheduler finds out (at its attention
    # backend). The environment as it is now: torch adds variables of its own as it runs.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return cli_popen(["serve", *listen, *SMALL, *args], env=env)


def _refusal(proc) -> str:
    """The one line a refused start printed (exit code 2, nothing else, no traceback)."""
    out, err = proc.communicate(timeout=300)
    lines = err.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and out == "", (proc.returncode, out, err)
    assert lines[0].startswith("radixlm: error: ") and "Traceback" not in err
    return lines[0].removeprefix("radixlm: error: ")


def test_a_scheduler_refusal_is_one_line(tiny_model_dir):
    why = _refusal(_serve("--model-path", tiny_model_dir, "--attention-backend", "triton"))
    assert why.startswith(TRITON)


def test_a_refused_value_only_the_model_loader_checks_is_one_line(tiny_model_dir):
    why = _refusal(_serve("--model-path", tiny_model_dir, "--quantization", "gguf"))
    assert why == "quantization 'gguf' keeps a GGUF file's own formats; the model is not a GGUF"


def test_a_dp_server_refusal_is_the_server_line(tiny_model_dir):
    why = _refusal(
        _serve("--model-path", tiny_model_dir, "--dp", "2", "--attention-backend", "triton")
    )
    assert why.startswith(TRITON)


def test_a_tp_rank_refusal_is_one_line(tiny_model_dir):
    why = _refusal(_serve("--model-path", tiny_model_dir, "--tp-size", "3"))  # 4 heads
    assert why == "num_attention_heads 4 is not divisible by tp_size 3"


def test_each_node_prints_its_refusal(tiny_model_dir):
    common = ("--model-path", tiny_model_dir, "--tp-size", "2", "--nnodes", "2")
    common += ("--dist-init-addr", f"127.0.0.1:{free_port()}", "--attention-backend", "triton")
    node1 = _serve(*common, "--node-rank", "1", port=False)
    node0 = _serve(*common)
    try:
        assert _refusal(node0).startswith(TRITON)
        assert _refusal(node1).startswith(f"node 1: {TRITON}")
    finally:
        for node in (node0, node1):
            node.kill()
            node.wait()


def test_a_crash_while_loading_keeps_its_traceback(tiny_model_dir, tmp_path):
    broken = shutil.copytree(tiny_model_dir, tmp_path / "broken")
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    proc = _serve("--model-path", str(broken))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    assert "ERROR scheduler failed to start\nTraceback" in err and "SafetensorError" in err, err


def test_an_unsupported_architecture_is_one_line(tiny_model_dir, tmp_path):
    why = _refusal(_serve("--model-path", unsupported_checkpoint(tiny_model_dir, tmp_path)))
    assert re.fullmatch(UNSUPPORTED, why), why
