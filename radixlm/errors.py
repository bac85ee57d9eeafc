"""Errors every layer may raise (a leaf module)."""


class InvariantError(AssertionError):
    """A KV-ownership invariant broke (scheduler/invariants.py, the draft model's own pool): the one
    error that stops the scheduler, since serving on would hand out wrong KV."""
