"""The program's vocabulary: what `s += ...` accepts. Plain data; the state interprets it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from radixlm.lang.tools import ToolRequest

REGEX_INT = r"[-+]?[0-9]+"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""

# gen()'s sampling keywords -> the server's sampling_params keys.
SAMPLING_KEYS = {
    "max_tokens": "max_new_tokens",
    "max_new_tokens": "max_new_tokens",
    "min_tokens": "min_new_tokens",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty",
    "ignore_eos": "ignore_eos",
    "seed": "seed",
    "regex": "regex",
    "json_schema": "json_schema",
    "ebnf": "ebnf",
    "structural_tag": "structural_tag",
}
LOGPROB_KEYS = (
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
)


def sampling_params(kw: dict) -> dict:
    """Map gen()/run() keywords (None = unset) to server sampling_params."""
    out = {}
    for k, v in kw.items():
        if v is None or k not in SAMPLING_KEYS:
            continue
        if k == "json_schema" and not isinstance(v, str):
            v = json.dumps(v)
        out[SAMPLING_KEYS[k]] = v
    return out


class Expr:
    """Anything that can be added to a state; `a + b` makes a sequence."""

    def __add__(self, other):
        return Seq([self, other])

    def __radd__(self, other):
        return Seq([other, self])


@dataclass
class Seq(Expr):
    items: list

    def __add__(self, other):
        return Seq([*self.items, other])

    def __radd__(self, other):
        return Seq([other, *self.items])


@dataclass
class Gen(Expr):
    name: str | None
    params: dict  # sampling keywords as given (None = inherit the run's default)
    logprob: dict = field(default_factory=dict)
    dtype: Any = None
    tools: ToolRequest | None = None  # gen(tools=...): the variable holds the parsed calls


@dataclass
class Select(Expr):
    name: str | None
    choices: list
    temperature: float = 0.0
    choices_method: Any = None


@dataclass
class RoleBegin(Expr):
    role: str


@dataclass
class RoleEnd(Expr):
    role: str


@dataclass
class Image(
    Expr
):  # the backend's image token in the text, the image sent as the request's image_data
    path: str


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    stop: str | list | None = None,
    stop_token_ids: list | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: Any = None,
    choices: list | None = None,
    choices_method: Any = None,
    regex: str | None = None,
    json_schema: Any = None,
    ebnf: str | None = None,
    seed: int | None = None,
    tools: list | None = None,
    tool_choice: Any = "required",
    parallel_tool_calls: bool = True,
    tool_call_parser: str | None = None,
    lora_path: str | None = None,
) -> Expr:
    """Generate into variable `name`; with `choices` it is `select`; with `tools` the variable holds
    the parsed calls (lang/tools.py). lora_path: the LoRA adapter to generate with (a native
    backend's; the OpenAI backend names one in its model, BASE:ADAPTER)."""
    if choices is not None:
        return select(name, choices, temperature or 0.0, choices_method)
    if dtype is not None and regex is None:
        regex = {
            int: REGEX_INT,
            "int": REGEX_INT,
            float: REGEX_FLOAT,
            "float": REGEX_FLOAT,
            bool: REGEX_BOOL,
            "bool": REGEX_BOOL,
            str: REGEX_STR,
            "str": REGEX_STR,
        }.get(dtype)
        if regex is None:
            raise ValueError(f"gen: unsupported dtype {dtype!r}")
    params = dict(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        stop=stop,
        stop_token_ids=stop_token_ids,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        ignore_eos=ignore_eos,
        regex=regex,
        json_schema=json_schema,
        ebnf=ebnf,
        seed=seed,
    )
    logprob = {
        k: v
        for k, v in zip(
            LOGPROB_KEYS,
            (return_logprob, logprob_start_len, top_logprobs_num, return_text_in_logprobs),
        )
        if v is not None
    }
    if (
        lora_path is not None
    ):  # a request field beside the logprob ones (native backends pass them through)
        logprob["lora_path"] = lora_path
    if tools is not None:
        if regex or json_schema or ebnf:
            raise ValueError(
                "gen: tools cannot be combined with regex, json_schema or ebnf (the calls' grammar)"
            )
        call = ToolRequest.make(tools, tool_choice, parallel_tool_calls, tool_call_parser)
        return Gen(name, params, logprob, dtype, call)
    return Gen(name, params, logprob, dtype)


def gen_int(name: str | None = None, **kw) -> Expr:
    return gen(name, dtype=int, **kw)


def gen_string(name: str | None = None, **kw) -> Expr:
    return gen(name, dtype=str, **kw)


def select(
    name: str | None = None,
    choices: list | None = None,
    temperature: float = 0.0,
    choices_method: Any = None,
) -> Expr:
    """Pick one of `choices` by scoring each continuation (see radixlm.lang.choices)."""
    if not choices:
        raise ValueError("select: choices must be a non-empty list of strings")
    bad = [c for c in choices if not isinstance(c, str) or not c]
    if bad:
        raise ValueError(f"select: every choice must be a non-empty string, got {bad[0]!r}")
    return Select(name, list(choices), temperature, choices_method)


def _role(role: str, expr=None) -> Expr:
    return Seq([RoleBegin(role), *([] if expr is None else [expr]), RoleEnd(role)])


def system(expr=None) -> Expr:
    return _role("system", expr)


def user(expr=None) -> Expr:
    return _role("user", expr)


def assistant(expr=None) -> Expr:
    return _role("assistant", expr)


def system_begin() -> Expr:
    return RoleBegin("system")


def system_end() -> Expr:
    return RoleEnd("system")


def user_begin() -> Expr:
    return RoleBegin("user")


def user_end() -> Expr:
    return RoleEnd("user")


def assistant_begin() -> Expr:
    return RoleBegin("assistant")


def assistant_end() -> Expr:
    return RoleEnd("assistant")


def image(path: str) -> Expr:
    return Image(path)
