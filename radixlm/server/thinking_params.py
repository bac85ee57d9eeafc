"""A chat request's thinking as sampling_params: whether it starts inside the think block
(require_reasoning, SGLang's) and its budget (max_thinking_tokens, or SGLang's thinking_budget, or
vLLM's thinking_token_budget). The engine side is constrained/thinking.py (docs/sampling.md)."""

from __future__ import annotations

from radixlm.reasoning import get_reasoning_format
from radixlm.server.api_common import HTTPError, ServerState

BUDGET_FIELDS = ("max_thinking_tokens", "thinking_budget", "thinking_token_budget")


def thinking_params(state: ServerState, req) -> dict:
    """The sampling_params keys of req's thinking. With --reasoning-parser, a request that thinks
    (the format's switch: Qwen3's enable_thinking, ...) starts inside the block, so its grammar
    applies after it; one that does not think has no block, and a budget has nothing to close."""
    given = {f: getattr(req, f) for f in BUDGET_FIELDS if getattr(req, f, None) is not None}
    if len(set(given.values())) > 1:
        raise HTTPError(
            400, f"{', '.join(given)} differ; give one of them", param=next(iter(given))
        )
    parser = state.server_args.reasoning_parser
    if parser is None:
        if given:
            f = next(iter(given))
            raise HTTPError(
                400,
                f"{f} needs a server started with --reasoning-parser (the think block's markers)",
                param=f,
            )
        return {}
    fmt = get_reasoning_format(parser)
    if fmt.harmony:  # gpt-oss: reasoning is a channel (reasoning/harmony.py), not a block
        if given:
            f = next(iter(given))
            raise HTTPError(
                400, f"{f}: gpt-oss's reasoning is a harmony channel, no budget closes it", param=f
            )
        # the channel split reads harmony's control tokens, special tokens all
        keep = getattr(req, "skip_special_tokens", None) is None
        return {"skip_special_tokens": False} if keep else {}
    if not fmt.thinks(req.chat_template_kwargs, getattr(req, "reasoning_effort", None)):
        return {}
    return {
        "require_reasoning": True,
        **({"max_thinking_tokens": next(iter(given.values()))} if given else {}),
    }
