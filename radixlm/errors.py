"""Errors every layer may raise (a leaf module)."""


class InvariantError(AssertionError):
    """A KV-ownership invariant broke (scheduler/invariants.py, the draft model's own pool): the one
    error that stops the scheduler, since serving on would hand out wrong KV."""


class StartupRefusalError(ValueError, RuntimeError):
    """A child process (the scheduler, a tp rank, a `serve --dp` server) refused its configuration
    at start-up: a bad option, or one this machine or model cannot run. The message is the child's
    one line. A ValueError, as the same refusal raised in the launching process is (the command
    line prints it as one error line, exit code 2), and a RuntimeError, as any failed start is."""


def start_failure_report(e: Exception) -> dict:
    """What a child that failed to start sends its launcher: a ValueError is a refusal (its message,
    on one line); anything else a crash (its type and message; its traceback is the child's to
    log)."""
    if isinstance(e, ValueError):
        return {"status": "refused", "message": one_line(str(e))}
    return {"status": "error", "message": f"{type(e).__name__}: {e}"}


def one_line(message: str) -> str:
    return " ".join(part.strip() for part in message.splitlines() if part.strip())
