"""How a child's failed start is told apart (errors.py, server/process.py): a ValueError is a
refusal (one line, exit code 2 on the command line), anything else a crash."""

from radixlm.errors import StartupRefusalError, start_failure_report
from radixlm.server.process import _exit_error


def test_a_value_error_is_a_refusal_on_one_line():
    report = start_failure_report(ValueError("tp_size 3:\n  4 heads do not divide\n"))
    assert report == {"status": "refused", "message": "tp_size 3: 4 heads do not divide"}


def test_anything_else_is_a_crash_named_with_its_type():
    report = start_failure_report(KeyError("model.layers.0.weight"))
    assert report == {"status": "error", "message": "KeyError: 'model.layers.0.weight'"}


def test_a_server_that_exits_2_after_its_error_line_refused():
    out = "[12:00:00] WARNING something\nradixlm: error: attention_backend triton: no CUDA\n"
    e = _exit_error("dp worker 0", 2, out)
    assert type(e) is StartupRefusalError and str(e) == "attention_backend triton: no CUDA"


def test_any_other_exit_is_a_runtime_error_with_the_output():
    for code, out in [(1, "radixlm: error: x\n"), (2, "usage: radixlm\nTraceback ...\n")]:
        e = _exit_error("dp worker 0", code, out)
        assert type(e) is RuntimeError and str(e) == f"dp worker 0 exited ({code}): {out}"
