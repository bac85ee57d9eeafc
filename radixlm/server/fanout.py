"""Fan-out: how many sequences a request starts (its prompts x n, each one the scheduler runs),
bounded by --max-client-batch-size and counted against the queue (--max-queued-requests) before
any of its work is done; the tokenizer manager counts them again, exactly, as it registers them
(`admit_to_queue`), so concurrent requests cannot all pass on the same free room."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixlm.ipc import GenerateReqInput
from radixlm.server.api_common import HTTPError, ServerState, check_queue


def _n(sampling_params: Any) -> int:
    n = sampling_params.get("n") if isinstance(sampling_params, dict) else None
    # A bad n is refused later, by the validation that names it; here it counts as one.
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


def native_sequences(obj: GenerateReqInput) -> int:
    """Sequences a /generate body starts (a per-item sampling_params list: each item's n)."""
    sps = obj.sampling_params
    if not obj.is_single and isinstance(sps, list) and len(sps) == obj.batch_size:
        return sum(_n(sp) for sp in sps)
    return obj.batch_size * _n(sps)


def check_fanout(state: ServerState, sequences: int, prompts: int, batch_field: str) -> None:
    """400 past --max-client-batch-size (naming the batch field, or n for one prompt); 429 (or 400
    when it could never fit) past the queue limit."""
    cap = state.server_args.max_client_batch_size
    field = batch_field if prompts > 1 else "n"
    if sequences > cap:
        raise HTTPError(
            400,
            f"the request starts {sequences} sequences ({prompts} prompt(s) x n), more than "
            f"--max-client-batch-size {cap}",
            param=field,
        )
    check_queue(state, sequences, field)


def admit_to_queue(state: ServerState) -> Callable[[int], None]:
    """The tokenizer manager's last check, right before it registers the request's sequences."""
    return lambda sequences: check_queue(state, sequences)
