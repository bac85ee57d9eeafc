"""One soak request over HTTP: sent, disconnected as planned (after a delay or a number of stream
events), its answer (whole or streamed) folded into a SoakResult. run_request never raises."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

from radixlm.bench.soak.config import SoakConfig
from radixlm.bench.soak.workload import SoakRequest


@dataclasses.dataclass
class SoakResult:
    idx: int
    kind: str
    status: Any = None  # HTTP status, or "disconnected", "hang", "transport_error"
    http_status: int | None = None
    latency: float = 0.0
    started: float = 0.0  # wall-clock time (time.time()) it was sent: placed against chaos events
    disconnected: bool = False
    disconnect_phase: str | None = None  # before_response, before_first_event, mid_stream, body
    disconnect_delay: float | None = None  # a timed disconnect's delay (s)
    stream_error: dict | None = None
    error: str | None = None
    events: int = 0
    choices: dict = dataclasses.field(
        default_factory=dict
    )  # index -> {"text", "ids", "finish", "lp", "top"}
    usage: dict | None = None
    prompt_tokens: int | None = None

    def outputs(self) -> list[dict]:
        """What the quiet run must reproduce: per choice its text, token ids (native) and finish
        reason."""
        return [
            {k: self.choices[i].get(k) for k in ("text", "ids", "finish")}
            for i in sorted(self.choices)
        ]


class _Disconnect(Exception):
    pass


def _native_finish(fr) -> str | None:
    return None if fr is None else fr.get("type")


class _Folder:
    """Folds responses (whole or streamed events) of one request into its SoakResult."""

    def __init__(self, req: SoakRequest, res: SoakResult, incremental: bool):
        self.req, self.res, self.incremental = req, res, incremental

    def choice(self, i: int) -> dict:
        return self.res.choices.setdefault(
            i,
            {
                "text": "",
                "ids": [] if self.req.api == "native" else None,
                "finish": None,
                "lp": None,
                "top": None,
            },
        )

    def native(self, out: dict, index: int | None = None, delta: bool = False) -> None:
        c = self.choice(out.get("index", 0) if index is None else index)
        meta = out.get("meta_info", {})
        if delta:
            c["text"] += out.get("text", "")
            c["ids"] += out.get("output_ids", [])
        else:
            c["text"], c["ids"] = out.get("text", ""), list(out.get("output_ids", []))
        c["finish"] = _native_finish(meta.get("finish_reason"))
        if "output_token_logprobs" in meta:
            c["lp"] = len(meta["output_token_logprobs"])
        if "output_top_logprobs" in meta:
            c["top"] = [len(t) if t is not None else None for t in meta["output_top_logprobs"]]
        self.res.prompt_tokens = meta.get("prompt_tokens", self.res.prompt_tokens)

    def openai_choice(self, ch: dict, delta: bool) -> None:
        c = self.choice(ch.get("index", 0))
        if self.req.api == "chat":
            text = ((ch.get("delta") if delta else ch.get("message")) or {}).get("content") or ""
            lp = (ch.get("logprobs") or {}).get("content")
            n_lp = len(lp) if lp is not None else None
        else:
            text = ch.get("text") or ""
            lp = (ch.get("logprobs") or {}).get("tokens")
            n_lp = len(lp) if lp is not None else None
        c["text"] = c["text"] + text if delta else text
        if n_lp is not None:
            c["lp"] = (c["lp"] or 0) + n_lp if delta else n_lp
        if ch.get("finish_reason") is not None:
            c["finish"] = ch["finish_reason"]

    def whole(self, body: Any) -> None:
        if self.req.api == "native":
            for i, out in enumerate(body if isinstance(body, list) else [body]):
                self.native(out, index=i)
        else:
            for ch in body.get("choices", []):
                self.openai_choice(ch, delta=False)
            self.res.usage = body.get("usage")
            self.res.prompt_tokens = (self.res.usage or {}).get("prompt_tokens")

    def event(self, ev: dict) -> None:
        if self.req.api == "native":
            self.native(ev, delta=self.incremental)
        else:
            for ch in ev.get("choices", []):
                self.openai_choice(ch, delta=True)
            if ev.get("usage"):
                self.res.usage = ev["usage"]
                self.res.prompt_tokens = ev["usage"].get("prompt_tokens")


async def _send(client, url: str, req: SoakRequest, res: SoakResult, incremental: bool) -> None:
    fold = _Folder(req, res, incremental)
    res.disconnect_phase = "before_response"
    async with client.stream("POST", url + req.path, json=req.body) as resp:
        res.http_status = res.status = resp.status_code
        if resp.status_code != 200 or not req.stream:
            res.disconnect_phase = "body"
            raw = await resp.aread()
            try:
                body = json.loads(raw)
            except ValueError:
                res.error = raw[:300].decode(errors="replace")
                return
            if resp.status_code != 200:
                res.error = str(
                    (body.get("error") or {}).get("message") if isinstance(body, dict) else body
                )[:300]
                return
            fold.whole(body)
            return
        res.disconnect_phase = "before_first_event"
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                continue
            ev = json.loads(data)
            res.events += 1
            res.disconnect_phase = "mid_stream"
            if isinstance(ev, dict) and ev.get("error"):
                res.stream_error = ev["error"]
                res.status = ev["error"].get("code", "stream_error")
                res.error = str(ev["error"].get("message"))[:300]
                continue
            fold.event(ev)
            if req.disconnect == "events" and res.events >= req.disconnect_after:
                raise _Disconnect


async def run_request(
    client,
    url: str,
    req: SoakRequest,
    cfg: SoakConfig,
    incremental: bool,
    disconnect: bool = True,
    max_delay: float = 8.0,
) -> SoakResult:
    """Send one request; never raises. disconnect=False: the quiet replay (no client disconnects).
    max_delay: the latest moment (s) of a timed disconnect."""
    import httpx

    res = SoakResult(req.idx, req.kind, started=time.time())
    t0 = time.perf_counter()

    async def go():
        try:
            if disconnect and req.disconnect in ("now", "timer"):
                lo, hi = (0.0, 0.2) if req.disconnect == "now" else (0.2, max(max_delay, 0.2))
                res.disconnect_delay = lo + req.disconnect_after * (hi - lo)
                await asyncio.wait_for(
                    _send(client, url, req, res, incremental), res.disconnect_delay
                )
            else:
                await _send(client, url, req, res, incremental)
        except (TimeoutError, _Disconnect):
            res.disconnected = True

    try:
        await asyncio.wait_for(go(), cfg.request_timeout)
    except TimeoutError:
        res.status, res.error = "hang", f"not over after {cfg.request_timeout} s"
    except (httpx.HTTPError, ValueError) as e:  # a dropped connection, a broken stream
        res.status, res.error = "transport_error", f"{type(e).__name__}: {e}"[:300]
    res.latency = time.perf_counter() - t0
    if res.disconnected:
        res.status = "disconnected"
    elif res.status == 200 and not res.choices:
        res.status, res.error = "transport_error", "200 without any answer"
    if not res.disconnected:
        res.disconnect_phase = None
    return res
