"""Tracing a program's constant prefix: run it on a backend that stops at the first model call,
so run_batch can send the text every input shares once, before the batch."""

from __future__ import annotations

import os

from radixlm.lang.base_backend import BaseBackend


class _StopTrace(Exception):
    pass


class TracingBackend(BaseBackend):
    """Renders roles like the real backend; any call that needs the model ends the trace."""

    def __init__(self, real: BaseBackend):
        super().__init__()
        self.real = real

    @property
    def chat_template(self):
        return self.real.chat_template

    def generate(self, *a, **k):
        raise _StopTrace

    generate_stream = select = prefill = generate


def trace_text(program, kwargs: dict, backend: BaseBackend) -> str | None:
    """The text `program(**kwargs)` writes before its first gen / select / fork; None if the
    program failed before reaching one (its text says nothing of the others')."""
    from radixlm.lang.state import ProgramState

    s = ProgramState(TracingBackend(backend))
    raised = False
    try:
        program.func(s, **kwargs)
    except _StopTrace:
        pass
    except Exception:
        raised = True
    err = s.error()  # waits for the queued text
    if isinstance(err, _StopTrace) or (err is None and not raised):
        return s._text
    return None


def common_prefix(program, batch_kwargs: list[dict], backend: BaseBackend) -> str:
    texts = [t for t in (trace_text(program, kw, backend) for kw in batch_kwargs) if t is not None]
    return os.path.commonprefix(texts) if texts else ""
