"""One builder of a request's native sampling_params for the APIs' routes: OpenAI's (and through
its pipelines Anthropic's, the Responses API's and Ollama's: server/chat_pipeline.py),
llama-server's /completion (llama_protocol.py) and /infill (infill_api.py). Each API gives its field
mapping (its request's field -> the native one) and its names for the native fields; the builder
copies what the request set, checks the result as the engine will (so that a stream fails with a
400 before it starts) and names a refused field as the client sent it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from radixlm.sampling_params import SamplingParams, SamplingParamsError
from radixlm.server.api_common import HTTPError


@dataclass(frozen=True)
class ClientNames:
    """An API's names for the native sampling fields (native -> the client's), as its 400s say
    them."""

    names: Mapping[str, str]
    # OpenAI's routes rename each native name wherever the message says it ("min_tokens must be <=
    # max_tokens"); llama-server's rename the field the message is about.
    every_name: bool = False

    def error(self, e: SamplingParamsError) -> HTTPError:
        msg = str(e)
        if self.every_name:
            for native, client in self.names.items():
                msg = msg.replace(native, client)
            field = msg.split()[0].removeprefix("sampling_params.")
            return HTTPError(400, msg.replace("sampling_params.", ""), param=field)
        field = msg.split()[0].removeprefix("sampling_params.")
        name = self.names.get(field, field)
        return HTTPError(400, msg.replace("sampling_params.", "").replace(field, name), param=name)


def _as_given(_: str, value: Any) -> Any:
    return value


def build_sampling_params(
    req: Any,
    fields: Mapping[str, str],
    vocab_size: int,
    names: ClientNames,
    first: Mapping[str, Any],
    then: Mapping[str, Any] | None = None,
    value: Callable[[str, Any], Any] = _as_given,
) -> dict:
    """The native sampling_params of `req`: `first` (max_new_tokens, ...), then each of `fields`
    (request field -> native field) the request set, then `then`; `value(field, v)`: an API's
    spelling of a value as the native one (None: not set). A refused value is a 400 in the
    client's names."""
    sp = dict(first)
    for field, native in fields.items():
        v = getattr(req, field)
        if v is not None and (v := value(field, v)) is not None:
            sp[native] = v
    sp.update(then or {})
    try:
        SamplingParams.from_dict(dict(sp)).verify(vocab_size)
    except SamplingParamsError as e:
        raise names.error(e) from None
    return sp
