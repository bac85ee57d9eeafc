"""Chat messages -> prompt token ids through the served model's chat template (the OpenAI chat
route's rendering; template choice, tools, assistant prefill and template kwargs live here)."""

from __future__ import annotations

from radixlm.engine.chat_templates import resolve_chat_template
from radixlm.server.api_common import HTTPError, ServerState
from radixlm.server.chat_tools import ToolPlan, template_inputs
from radixlm.server.openai_protocol import ChatCompletionRequest
from radixlm.server.tool_template import tool_setup

# chat_template_kwargs go to HF's apply_chat_template and into the template; these names are the
# server's to set: apply_chat_template's own parameters (a client's `chat_template` would run its
# own Jinja, nested loops burning the CPU; `tokenize` / `return_*` / `padding` change what comes
# back) and the template's inputs the request has fields for (`messages`, `tools`, `documents`).
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "chat_template",
        "tokenize",
        "add_generation_prompt",
        "continue_final_message",
        "conversation",
        "messages",
        "tools",
        "documents",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


def render_chat(
    state: ServerState,
    req: ChatCompletionRequest,
    plan: ToolPlan | None = None,
    mm_template: str | None = None,
):
    """On a tokenizer thread (the route runs it through the TokenizerPool). `plan`: the request's
    tools as chat_tools.plan_tools decided them (else `tools` go to the template as sent).
    mm_template: images (server/chat_images.py): the rendered text instead of its ids (the model's
    processor tokenizes it), with this template (the processor's; "": the tokenizer's)."""
    tok = state.tokenizer_manager.tokenizer
    kwargs = dict(req.chat_template_kwargs or {})
    reserved = sorted(RESERVED_TEMPLATE_KWARGS.intersection(kwargs))
    if reserved:
        raise HTTPError(
            400,
            f"chat_template_kwargs may not set {', '.join(reserved)} (the server's template and "
            "the request's own fields decide them)",
            param="chat_template_kwargs",
        )
    if req.reasoning_effort is not None:
        # OpenAI's field, a template variable as SGLang and vLLM pass it (gpt-oss's "Reasoning:
        # low|medium|high"); chat_template_kwargs' own value wins.
        kwargs.setdefault("reasoning_effort", req.reasoning_effort)
    messages = [m.for_template() for m in req.messages]
    if plan is not None:
        messages, tools = template_inputs(
            plan, tool_setup(tok, state.server_args.tool_call_parser), messages
        )
        if tools:
            kwargs["tools"] = tools
    elif req.tools:
        kwargs["tools"] = req.tools
    if mm_template:
        kwargs["chat_template"] = mm_template
    continue_final, add_generation = _turn_options(req)
    if continue_final and messages[-1]["content"] == "":
        # Nothing to continue: HF's search for the final content would match the whole text (and
        # keep its end of turn); an empty final message means a fresh open turn.
        messages, continue_final, add_generation = messages[:-1], False, True
    try:
        text = tok.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=add_generation,
            continue_final_message=continue_final,
            **kwargs,
        )
    except Exception as e:  # a template error (bad roles, no template) is the request's problem
        raise HTTPError(
            400, f"cannot apply the chat template to messages: {e}", param="messages"
        ) from None
    if len(text) > state.context_len * state.tokenizer_manager.max_token_chars:
        raise HTTPError(
            400,
            f"the messages have {len(text)} characters, more than the context length "
            f"{state.context_len} tokens can hold",
            param="messages",
        )
    # A Jinja template already wrote any BOS: encoding it again would double it (as SGLang does); a
    # conversation template (--chat-template NAME or .json) writes none, so the encoder adds it.
    template = resolve_chat_template(state.server_args.chat_template)
    if mm_template is not None:
        return text
    return tok.encode(text, add_special_tokens=template.encode_special_tokens)


def _turn_options(req: ChatCompletionRequest) -> tuple[bool, bool]:
    """(continue_final_message, add_generation_prompt) with vLLM's defaults: a new assistant turn,
    unless the final message is to be continued; asking for both is a contradiction."""
    continue_final = bool(req.continue_final_message)
    add_generation = (
        not continue_final if req.add_generation_prompt is None else req.add_generation_prompt
    )
    if continue_final and add_generation:
        raise HTTPError(
            400,
            "continue_final_message and add_generation_prompt cannot both be true (continue the "
            "final message, or open a new assistant turn)",
            param="add_generation_prompt",
        )
    return continue_final, add_generation


def chat_stop(state: ServerState) -> list[str]:
    """The stop strings of a conversation template (--chat-template NAME or .json), as SGLang adds
    them."""
    return list(resolve_chat_template(state.server_args.chat_template).stop)
