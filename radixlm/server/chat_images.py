"""Images in chat messages (OpenAI's image_url content parts): the route renders the template to
text ({"type": "image"} parts where the images go), then the model's processor turns text and
images into ids, once, on the tokenizer threads; the request carries that result to the tokenizer
manager (multimodal_prompt reads it), so the route knows the prompt's length as for text."""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.engine.mm_processor import processor_of
from radixlm.ipc import GenerateReqInput
from radixlm.mm_inputs import MultimodalInputs
from radixlm.server.api_common import HTTPError, ServerState
from radixlm.server.chat_render import render_chat
from radixlm.server.chat_tools import ToolPlan
from radixlm.server.openai_protocol import ChatCompletionRequest


@dataclass
class ChatImages:
    text: str  # the rendered chat
    urls: list[str]
    ids: list[int]  # the processor's, image spans holding pad values
    mm: MultimodalInputs

    def attach(self, obj: GenerateReqInput) -> GenerateReqInput:
        obj._mm_prompt = (self.ids, self.mm)  # not a field: no client can send it
        return obj


def _image_fields(req: ChatCompletionRequest) -> tuple[list[str], list[str]]:
    urls, fields = [], []
    for mi, m in enumerate(req.messages):
        if isinstance(m.content, list):
            for pi, p in enumerate(m.content):
                if p["type"] == "image_url":
                    urls.append(p["image_url"]["url"])
                    fields.append(f"messages[{mi}].content[{pi}].image_url.url")
    return urls, fields


def _processor_template(tm) -> str:
    return getattr(processor_of(tm).processor, "chat_template", None) or ""


def _process(tm, text: str, urls: list[str], fields: list[str]):
    proc = processor_of(tm)
    images = [proc.load_image(u, f) for u, f in zip(urls, fields)]
    return proc.process(text, images, "messages")


async def chat_images(
    state: ServerState, req: ChatCompletionRequest, plan: ToolPlan | None
) -> ChatImages | None:
    """None when the messages have no image; else the prompt, processed (a 400 naming the part for a
    bad image, or for images to a text-only model)."""
    urls, fields = _image_fields(req)
    if not urls:
        return None
    if "image" not in state.scheduler_info.get("modalities", ["text"]):
        raise HTTPError(
            400, "the served model takes text only (no image_url content parts)", param=fields[0]
        )
    pool = state.tokenizer_manager.tokenizer_pool
    # A vision model's processor carries the template that places images (the tokenizer's may not).
    template = (
        ""
        if state.server_args.chat_template
        else await pool.run(
            _processor_template, state.tokenizer_manager, what="loading the processor"
        )
    )
    text = await pool.run(
        render_chat, state, req, plan, template, what="rendering the chat template"
    )
    try:
        ids, mm = await pool.run(
            _process, state.tokenizer_manager, text, urls, fields, what="processing the images"
        )
    except ValueError as e:
        field = next((f for f in fields if str(e).startswith(f)), "messages")
        raise HTTPError(400, str(e), param=field) from None
    return ChatImages(text, urls, ids, mm)
