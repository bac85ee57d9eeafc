"""SGLang's request log (--log-requests, --log-requests-level, --log-requests-format): each request
as received ("Receive: obj=...") and as finished ("Finish: obj=..., out=..."), on a logger of its
own (radixlm.requests: stdout, INFO, whatever --log-level says, as SGLang's).

Levels (SGLang's): 0 the metadata only (rid, flags; no sampling_params, no text or ids in or out);
1 also sampling_params; 2 also the inputs and outputs, each string or list past 2048 items cut to
its first and last 1024; 3 everything. Secrets never appear at any level: the keys travel in
headers, which are not logged, and a cache_salt (a tenant's cache namespace) shows as ***."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from dataclasses import dataclass
from datetime import datetime
from typing import Any

LOG_REQUESTS_LEVELS = (0, 1, 2, 3)
LOG_REQUESTS_FORMATS = ("text", "json")
TRUNCATE_AT = 2048  # level 2: SGLang's max_length
UNLIMITED = 1 << 30
SECRET_FIELDS = frozenset({"cache_salt"})
_INPUTS = frozenset({"text", "input_ids"})
_OUTPUTS = frozenset({"text", "output_ids"})
# meta_info's logprobs may carry token texts (return_text_in_logprobs): outputs, left out with them.
_LOGPROBS = frozenset(
    {"input_token_logprobs", "input_top_logprobs", "output_token_logprobs", "output_top_logprobs"}
)


@dataclass(frozen=True)
class RequestLogConfig:
    enabled: bool = False
    level: int = 2  # SGLang's default
    format: str = "text"

    def __post_init__(self):
        if not isinstance(self.enabled, bool):
            raise ValueError(f"log_requests must be a boolean, got {self.enabled!r:.40}")
        if self.level not in LOG_REQUESTS_LEVELS or isinstance(self.level, bool):
            raise ValueError(
                f"log_requests_level must be one of 0, 1, 2, 3, got {self.level!r:.40}"
            )
        if self.format not in LOG_REQUESTS_FORMATS:
            raise ValueError(f"log_requests_format must be text or json, got {self.format!r:.40}")

    @classmethod
    def from_server_args(cls, args) -> RequestLogConfig:
        return cls(args.log_requests, args.log_requests_level, args.log_requests_format)

    def skips(self) -> tuple[frozenset, frozenset]:
        """(request fields, output fields) this level leaves out."""
        if self.level == 0:
            return _INPUTS | {"sampling_params"}, _OUTPUTS
        if self.level == 1:
            return _INPUTS, _OUTPUTS
        return frozenset(), frozenset()


@dataclass(frozen=True)
class LoggedRequest:
    type_name: str  # GenerateReqInput
    fields: dict  # its fields as the log shows them (input_ids also as text at level >= 2)


class _StdoutHandler(logging.StreamHandler):
    """Writes to sys.stdout as it is at each line (a script or a test may replace it after
    start)."""

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, _value):
        pass


def _stdout_logger() -> logging.Logger:
    log = logging.getLogger("radixlm.requests")
    log.setLevel(logging.INFO)
    log.propagate = False  # its own format and level, not the server log's
    if not log.handlers:
        handler = _StdoutHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    return log


def loggable(value: Any, max_len: int, skip: frozenset = frozenset()) -> Any:
    """value as JSON-able data: dataclasses as dicts without the `skip` fields (top level only, as
    SGLang's), strings and lists past max_len cut in the middle, secrets masked."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {
            k: "***" if k in SECRET_FIELDS and v is not None else loggable(v, max_len)
            for k, v in value.items()
            if k not in skip
        }
    if isinstance(value, str):
        return (
            value
            if len(value) <= max_len
            else value[: max_len // 2] + "..." + value[-(max_len // 2) :]
        )
    if isinstance(value, (list, tuple)):
        if len(value) > max_len:
            value = [*value[: max_len // 2], "...", *value[-(max_len // 2) :]]
        return [loggable(v, max_len) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(value)


class RequestLogger:
    def __init__(self, config: RequestLogConfig = RequestLogConfig()):
        self.config = config
        self._log = _stdout_logger()

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def configure(self, **changes) -> RequestLogConfig:
        """SGLang's /configure_logging: change some of enabled / level / format (checked)."""
        self.config = dataclasses.replace(self.config, **changes)
        return self.config

    def received(self, obj, tokenizer=None) -> LoggedRequest | None:
        """Log a request as it arrives; what its Finish line shows of it again (None: logging is
        off)."""
        if not self.enabled:
            return None
        fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        if (
            self.config.level >= 2
            and fields.get("text") is None
            and fields.get("input_ids")
            and tokenizer is not None
        ):
            fields["text"] = self._decoded(
                fields["input_ids"], tokenizer
            )  # SGLang's: ids shown as text too
        req = LoggedRequest(type(obj).__name__, fields)
        self._emit("request.received", "Receive", req)
        return req

    def finished(self, req: LoggedRequest | None, out: Any) -> None:
        if req is not None and self.enabled:
            self._emit("request.finished", "Finish", req, out=out)

    def failed(self, req: LoggedRequest | None, error: str) -> None:
        if req is not None and self.enabled:
            self._emit("request.failed", "Fail", req, error=error)

    def _decoded(self, ids: list, tokenizer) -> Any:
        if ids and isinstance(ids[0], list):
            return [self._decoded(i, tokenizer) for i in ids]
        half = (
            TRUNCATE_AT // 2
        )  # level 2 shows the first and last 1024 characters: no more is decoded
        try:
            if self.config.level == 2 and len(ids) > TRUNCATE_AT:
                return (
                    tokenizer.decode(ids[:half], skip_special_tokens=False)
                    + "..."
                    + tokenizer.decode(ids[-half:], skip_special_tokens=False)
                )
            return tokenizer.decode(ids, skip_special_tokens=False)
        except Exception:
            return None

    @staticmethod
    def _out(out: Any, max_len: int, skip: frozenset) -> Any:
        logged = loggable(out, max_len, skip)
        if skip and isinstance(logged, dict) and isinstance(logged.get("meta_info"), dict):
            logged["meta_info"] = {
                k: v for k, v in logged["meta_info"].items() if k not in _LOGPROBS
            }
        return logged

    def _emit(
        self,
        event: str,
        verb: str,
        req: LoggedRequest,
        out: Any = None,
        error: str | None = None,
    ) -> None:
        skip_in, skip_out = self.config.skips()
        max_len = TRUNCATE_AT if self.config.level == 2 else UNLIMITED
        data = {
            "rid": loggable(req.fields.get("rid"), max_len),
            "obj": loggable(req.fields, max_len, skip_in),
        }
        if out is not None:
            outs = [
                self._out(o, max_len, skip_out) for o in (out if isinstance(out, list) else [out])
            ]
            data["out"] = outs if isinstance(out, list) else outs[0]
        if error is not None:
            data["error"] = error
        if self.config.format == "json":
            self._log.info(
                json.dumps(
                    {"timestamp": datetime.now().isoformat(), "event": event, **data},
                    ensure_ascii=False,
                )
            )
            return
        text = f"{verb}: obj={req.type_name}({_fields_text(data['obj'])})"
        if "out" in data:
            text += f", out={data['out']!r}"
        if error is not None:
            text += f", error={error!r}"
        self._log.info(text)


def _fields_text(fields: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in fields.items())
