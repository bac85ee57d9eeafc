"""OpenAI: any OpenAI-compatible server (radixlm's /v1, vLLM, llama-server, OpenAI itself).

Chat models (the default) generate inside `assistant()` from the state's messages; completion
models (`is_chat_model=False`) continue the state's text. `select` goes through logprobs:
completions score every choice exactly (echo + logprobs over `text + choice`; the unconditional
method needs a native backend); chat models can only rank the choices' first tokens among the
top 20. `regex` / `ebnf` / other SGLang fields go as extra fields (radixlm, SGLang and vLLM read
them), `json_schema` as response_format (chat) or the extra field (completions); since a server
may ignore a field it does not know, constrained outputs are checked here and a clear error is
raised when the server did not honour the constraint."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator

from radixlm.lang.base_backend import BaseBackend, Prompt
from radixlm.lang.chat_template import ChatTemplate

# sampling_params keys the OpenAI API has under the same meaning (ours -> theirs).
_STANDARD = {
    "max_new_tokens": "max_tokens",
    "stop": "stop",
    "temperature": "temperature",
    "top_p": "top_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "seed": "seed",
}
_CHAT_TOP_LOGPROBS = 20  # OpenAI's maximum


class OpenAI(BaseBackend):
    def __init__(
        self,
        model_name: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        model: str | None = None,
        is_chat_model: bool = True,
        chat_template: str | None = None,
        **client_kwargs,
    ):
        super().__init__()
        import openai

        if api_key is None:
            api_key = os.environ.get("OPENAI_API_KEY") or ("EMPTY" if base_url else None)
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, **client_kwargs)
        self.model_name = model_name or model or self.client.models.list().data[0].id
        self.is_chat_model = is_chat_model
        self._template_name = chat_template

    def _make_chat_template(self) -> ChatTemplate:
        if self._template_name:
            return ChatTemplate(None, self._template_name)
        return ChatTemplate.for_model(self.model_name)

    # ------------------------------------------------------------------ requests
    def _request(self, sp: dict, logprob: dict | None) -> dict:
        if logprob:
            raise ValueError(
                f"gen: {sorted(logprob)} need a native radixlm backend (RuntimeEndpoint / Engine)"
            )
        kw = {_STANDARD[k]: v for k, v in sp.items() if k in _STANDARD}
        extra = {k: v for k, v in sp.items() if k not in _STANDARD and k != "json_schema"}
        if "json_schema" in sp and self.is_chat_model:
            kw["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": json.loads(sp["json_schema"])},
            }
        elif (
            "json_schema" in sp
        ):  # the completions API has no response_format: SGLang's extra field
            extra["json_schema"] = sp["json_schema"]
        if extra:
            kw["extra_body"] = extra
        return kw

    def _messages(self, prompt: Prompt) -> list[dict]:
        if prompt.role != "assistant":
            raise ValueError(
                "gen on a chat model runs inside assistant(); for a completion-style program "
                "use OpenAI(..., is_chat_model=False)"
            )
        if prompt.role_text:
            raise ValueError(
                "a chat model cannot continue a partly written assistant message "
                f"({prompt.role_text[:40]!r}); put gen first in assistant()"
            )
        return [dict(m) for m in prompt.messages]

    def _create(self, prompt: Prompt, sp: dict, logprob: dict | None, stream: bool):
        kw = self._request(sp, logprob)
        if stream:
            kw.update(stream=True, stream_options={"include_usage": True})
        if self.is_chat_model:
            return self.client.chat.completions.create(
                model=self.model_name, messages=self._messages(prompt), **kw
            )
        return self.client.completions.create(model=self.model_name, prompt=prompt.text, **kw)

    @staticmethod
    def _meta(resp, finish: str | None) -> dict:
        usage = getattr(resp, "usage", None)
        meta = {"id": resp.id, "finish_reason": {"type": finish} if finish else None}
        if usage is not None:
            details = getattr(usage, "prompt_tokens_details", None)
            meta.update(
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                cached_tokens=getattr(details, "cached_tokens", None) if details else None,
            )
        return meta

    def _check(self, text: str, sp: dict) -> None:
        """A server may drop fields it does not know: make sure the constraint held."""
        if "regex" in sp and re.fullmatch(sp["regex"], text) is None:
            raise RuntimeError(
                f"the server at {self.client.base_url} did not apply the regex constraint "
                f"{sp['regex']!r} (output {text[:80]!r}); it may not support regex"
            )
        if "json_schema" in sp:
            try:
                value = json.loads(text)
                import jsonschema

                jsonschema.validate(value, json.loads(sp["json_schema"]))
            except ImportError:
                pass
            except Exception as e:
                raise RuntimeError(
                    f"the server at {self.client.base_url} did not honour response_format "
                    f"json_schema (output {text[:80]!r}: {e})"
                ) from None

    def generate(self, prompt: Prompt, sampling_params: dict, logprob: dict | None = None) -> dict:
        resp = self._create(prompt, sampling_params, logprob, stream=False)
        c = resp.choices[0]
        text = (c.message.content or "") if self.is_chat_model else c.text
        self._check(text, sampling_params)
        return {"text": text, "meta_info": self._meta(resp, c.finish_reason)}

    def generate_stream(
        self, prompt: Prompt, sampling_params: dict, logprob: dict | None = None
    ) -> Iterator[dict]:
        text, finish, last = "", None, None
        for chunk in self._create(prompt, sampling_params, logprob, stream=True):
            last = chunk
            for c in chunk.choices:
                delta = (c.delta.content or "") if self.is_chat_model else (c.text or "")
                finish = c.finish_reason or finish
                if delta:
                    text += delta
                    yield {"text": text, "meta_info": {"id": chunk.id}}
        self._check(text, sampling_params)
        yield {"text": text, "meta_info": self._meta(last, finish) if last is not None else {}}

    # ------------------------------------------------------------------ select
    def select(self, prompt: Prompt, choices: list[str], method) -> tuple[int, dict]:
        if self.is_chat_model:
            return self._select_first_token(prompt, choices)
        if method.needs_unconditional:
            # Scoring a choice "with no context" means after the model's start token, which an
            # OpenAI server gives no portable way to send.
            raise ValueError(
                f"choices_method {type(method).__name__} needs a native radixlm backend"
            )
        logprobs = self._echo_logprobs(prompt.text, choices)
        idx, meta = method(choices, logprobs)
        return idx, {**meta, "choice_logprobs": logprobs}

    def _echo_logprobs(self, prefix: str, choices: list[str]) -> list[list[float]]:
        """Logprobs of the tokens that carry each choice's text after `prefix` (a token that
        straddles the boundary counts: token healing), read from an echoed completion."""
        texts = [prefix + c for c in choices]
        try:
            resp = self.client.completions.create(
                model=self.model_name,
                prompt=texts,
                max_tokens=1,
                echo=True,
                logprobs=1,
                temperature=0,
            )
        except Exception as e:
            raise RuntimeError(
                "select needs prompt logprobs (completions with echo and logprobs), which the "
                f"server at {self.client.base_url} refused: {e}"
            ) from None
        out: list[list[float] | None] = [None] * len(texts)
        for c in resp.choices:
            lp = c.logprobs
            if lp is None or not lp.text_offset:
                raise RuntimeError(
                    f"the server at {self.client.base_url} returned no prompt logprobs for select"
                )
            end = len(texts[c.index])
            out[c.index] = [
                v
                for tok, off, v in zip(lp.tokens, lp.text_offset, lp.token_logprobs)
                if off < end and off + len(tok) > len(prefix) and v is not None
            ]
        return out

    def _select_first_token(self, prompt: Prompt, choices: list[str]) -> tuple[int, dict]:
        """Chat APIs cannot score given text: rank the choices by the logprob of their first
        token among the next token's top candidates."""
        resp = self.client.chat.completions.create(
            model=self.model_name,
            messages=self._messages(prompt),
            max_tokens=1,
            temperature=0,
            logprobs=True,
            top_logprobs=_CHAT_TOP_LOGPROBS,
        )
        content = resp.choices[0].logprobs.content if resp.choices[0].logprobs else None
        if not content:
            raise RuntimeError(
                f"select on a chat model needs logprobs, which the server at {self.client.base_url}"
                " did not return"
            )
        top = [(t.token, t.logprob) for t in content[0].top_logprobs]
        scores = []
        for c in choices:
            matches = [(len(tok), lp) for tok, lp in top if tok and c.startswith(tok)]
            scores.append(max(matches)[1] if matches else -math.inf)
        if all(s == -math.inf for s in scores):
            raise RuntimeError(
                "select: none of the choices starts with one of the model's top "
                f"{_CHAT_TOP_LOGPROBS} next tokens {[t for t, _ in top]}"
            )
        idx = max(range(len(choices)), key=scores.__getitem__)
        return idx, {"first_token_logprobs": scores, "top_logprobs": top}
