"""The OpenAI routes' answers: a translated request (Job) shapes the native outputs into
OpenAI's objects (chat.completion, text_completion) and stream chunks; a chat choice's message
goes through chat_output.py (reasoning_content, tool_calls) when the request needs it."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from radixlm.ipc import GenerateReqInput
from radixlm.server.chat_output import ChoiceStream, OutputSpec, shape_message
from radixlm.server.openai_protocol import chat_logprobs, completion_logprobs


def finish_reason(fr: dict | None) -> tuple[str | None, Any]:
    """Native finish_reason -> (OpenAI finish_reason, matched_stop). Aborts read "abort", as in
    vLLM."""
    if fr is None:
        return None, None
    kind = fr.get("type")
    return (kind if kind in ("stop", "length") else "abort"), fr.get("matched")


@dataclasses.dataclass
class Job:
    """One OpenAI request, translated: what the native request is and how to shape its answers."""

    chat: bool
    id: str
    model: str
    n: int
    obj: GenerateReqInput
    echo_texts: list[str] | None = None  # completions with echo: each prompt's text
    logprobs: bool = False
    include_usage: bool = False
    prompt_ids: list | None = None  # return_token_ids: each prompt's token ids
    output: OutputSpec = dataclasses.field(
        default_factory=OutputSpec
    )  # chat: reasoning, tool calls
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def body(self, choices: list, **extra) -> dict:
        obj = self.object + (".chunk" if self.obj.stream and self.chat else "")
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def usage(self, outs: list[dict]) -> dict:
        # A prompt is counted once however many (n) completions share it.
        firsts = [o["meta_info"] for o in outs[:: self.n]]
        prompt = sum(m["prompt_tokens"] for m in firsts)
        completion = sum(o["meta_info"]["completion_tokens"] for o in outs)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {
                "cached_tokens": sum(m.get("cached_tokens", 0) for m in firsts)
            },
        }

    def logprob_entries(self, meta: dict, start: int, with_prompt: bool) -> tuple[list, list]:
        toks = meta.get("output_token_logprobs") or []
        tops = meta.get("output_top_logprobs") or []
        toks, tops = toks[start:], tops[start:]
        if with_prompt:
            toks = (meta.get("input_token_logprobs") or []) + toks
            tops = (meta.get("input_top_logprobs") or []) + tops
        return toks, tops

    def choice(self, i: int, out: dict) -> dict:
        meta = out["meta_info"]
        reason, matched = finish_reason(meta["finish_reason"])
        echo = self.echo_texts is not None
        toks, tops = self.logprob_entries(meta, 0, echo) if self.logprobs else ([], [])
        c: dict[str, Any] = {"index": i}
        if self.chat:
            c["message"] = {"role": "assistant", "content": out["text"], "refusal": None}
            if self.output.active:
                fields, calls = shape_message(self.output, out["text"])
                c["message"].update(fields)
                reason = "tool_calls" if calls and reason == "stop" else reason
            c["logprobs"] = {"content": chat_logprobs(toks, tops)} if self.logprobs else None
        else:
            c["text"] = (self.echo_texts[i // self.n] if echo else "") + out["text"]
            c["logprobs"] = completion_logprobs(toks, tops, 0)[0] if self.logprobs else None
        if (
            self.prompt_ids is not None
        ):  # vLLM's return_token_ids (a chat's prompt ids are the response's)
            c["token_ids"] = out["output_ids"]
            if not self.chat:
                c["prompt_token_ids"] = self.prompt_ids[i // self.n]
        return {**c, "finish_reason": reason, "matched_stop": matched}


@dataclasses.dataclass
class Sent:
    """What a stream already sent for one choice."""

    text: str = ""
    n_logprobs: int = 0
    offset: int = 0
    started: bool = False
    shaper: ChoiceStream | None = None  # a chat choice's reasoning / tool-call parsing


def stream_chunks(job: Job, idx: int, out: dict, st: Sent) -> list[dict]:
    """The chunks for one native update of choice idx (cumulative text -> deltas)."""
    meta, text = out["meta_info"], out["text"]
    reason, matched = finish_reason(meta["finish_reason"])
    chunks = []
    first = not st.started
    if job.chat and first:
        chunks.append(
            {
                "index": idx,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        )
    # The cumulative text only grows, except where a final stop-string trim cuts text already
    # streamed: that cannot be taken back, so nothing more is sent then.
    delta = text[len(st.text) :] if text.startswith(st.text) else ""
    st.text = text if text.startswith(st.text) else st.text
    echo = job.echo_texts is not None and first
    if echo:
        delta = job.echo_texts[idx // job.n] + delta
    lp = None
    if job.logprobs:
        toks, tops = job.logprob_entries(meta, st.n_logprobs, echo)
        st.n_logprobs = len(meta.get("output_token_logprobs") or [])
        if toks:
            if job.chat:
                lp = {"content": chat_logprobs(toks, tops)}
            else:
                lp, st.offset = completion_logprobs(toks, tops, st.offset)
    st.started = True
    # The ids on the finishing chunk: for internal callers only (the route refuses
    # return_token_ids with stream); Ollama's generate `context` is built from them.
    ids = (
        {"token_ids": out["output_ids"], "prompt_token_ids": job.prompt_ids[idx // job.n]}
        if reason and job.prompt_ids is not None
        else {}
    )
    if job.chat:
        if job.output.active:
            st.shaper = st.shaper or ChoiceStream(job.output)
            deltas = (st.shaper.feed(delta) if delta else []) + (
                st.shaper.finish() if reason else []
            )
            reason = "tool_calls" if st.shaper.has_calls and reason == "stop" else reason
        else:
            deltas = [{"content": delta}] if delta else []
        if lp and not deltas:
            deltas = [{"content": ""}]
        for k, d in enumerate(deltas):  # the logprobs go with the first delta of the update
            chunks.append(
                {
                    "index": idx,
                    "delta": d,
                    "logprobs": lp if k == 0 else None,
                    "finish_reason": None,
                }
            )
        if reason:
            chunks.append(
                {
                    "index": idx,
                    "delta": {},
                    "logprobs": None,
                    "finish_reason": reason,
                    "matched_stop": matched,
                    **ids,
                }
            )
    elif delta or lp or reason:
        chunks.append(
            {
                "index": idx,
                "text": delta,
                "logprobs": lp,
                "finish_reason": reason,
                "matched_stop": matched,
                **ids,
            }
        )
    return [job.body([c]) for c in chunks]
