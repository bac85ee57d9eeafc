"""RuntimeEndpoint: a radixlm (or SGLang) server over its native HTTP API; Runtime: the same
over a server process it starts and stops itself."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import requests
from requests.adapters import HTTPAdapter

from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.native_backend import NativeBackend

logger = logging.getLogger(__name__)


class RuntimeEndpoint(NativeBackend):
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout: float = 600,
        admin_api_key: str | None = None,
    ):
        super().__init__()
        self.admin_api_key = (
            admin_api_key  # flush_cache is an admin action (the server's --admin-api-key)
        )
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        # fork and run_batch call from many threads at once: keep a connection each.
        self.session.mount("http://", HTTPAdapter(pool_maxsize=128))
        self.session.mount("https://", HTTPAdapter(pool_maxsize=128))
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"
        self.model_info = self._get("/get_model_info")

    def _get(self, path: str) -> dict:
        r = self.session.get(self.base_url + path, timeout=self.timeout)
        self._check(r)
        return r.json()

    def _post(self, path: str, body: dict | None = None):
        r = self.session.post(self.base_url + path, json=body, timeout=self.timeout)
        self._check(r)
        return r.json()

    @staticmethod
    def _check(r: requests.Response) -> None:
        if r.status_code != 200:
            raise RuntimeError(f"{r.request.method} {r.url} -> {r.status_code}: {r.text[:500]}")

    def _load_tokenizer(self):
        # For the chat template only (tokenization itself is the server's, via /tokenize).
        path = self.model_info.get("tokenizer_path") or self.model_info.get("model_path")
        try:
            from radixlm.model.loader import load_tokenizer

            return load_tokenizer(path)
        except Exception as e:
            logger.warning(
                "no local tokenizer at %r (%s): roles use the chat template registry", path, e
            )
            return None

    def _make_chat_template(self) -> ChatTemplate:
        tok = self.tokenizer
        if tok is not None and getattr(tok, "chat_template", None):
            return ChatTemplate(tok)
        return ChatTemplate.for_model(self.model_info.get("model_path") or "")

    def start_token_id(self) -> int:
        for key in ("bos_token_id", "eos_token_id"):
            if self.model_info.get(key) is not None:
                return self.model_info[key]
        return super().start_token_id()

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return self._post("/tokenize", {"text": list(texts)})["tokens"]

    def _call(self, body: dict):
        return self._post("/generate", body)

    def _stream(self, body: dict) -> Iterator[dict]:
        with self.session.post(
            self.base_url + "/generate", json=body, timeout=self.timeout, stream=True
        ) as r:
            self._check(r)
            for line in r.iter_lines(decode_unicode=True):
                if not line or not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                out = json.loads(data)
                if "error" in out:
                    raise RuntimeError(f"stream error: {out['error']}")
                yield out

    def flush_cache(self) -> None:
        headers = {"Authorization": f"Bearer {self.admin_api_key}"} if self.admin_api_key else None
        self._check(
            self.session.post(self.base_url + "/flush_cache", headers=headers, timeout=self.timeout)
        )


class Runtime(RuntimeEndpoint):
    """Starts `radixlm serve` in a child process (any ServerArgs field as a keyword, e.g.
    `Runtime(kv_memory_gb=0.5)`; model_path=None: the embedded default model) and talks to it
    over HTTP. `shutdown()` stops the process and its children; so does garbage collection
    or interpreter exit."""

    def __init__(self, model_path: str | None = None, *, startup_timeout: float = 300, **options):
        from radixlm.config import ServerArgs
        from radixlm.http_access import ADMIN_API_KEY_ENV, API_KEY_ENV
        from radixlm.server.process import ServerProcess

        options.pop("port", None)
        api_key, admin_api_key = options.pop("api_key", None), options.pop("admin_api_key", None)
        argv = ServerArgs.to_cli_argv(model_path=model_path, **options)
        # Keys through the environment, not the command line (`ps` shows that to every user).
        env = {API_KEY_ENV: api_key or "", ADMIN_API_KEY_ENV: admin_api_key or ""}
        self.process = ServerProcess(*argv, timeout=startup_timeout, env=env)
        try:
            super().__init__(self.process.url, api_key=api_key, admin_api_key=admin_api_key)
        except BaseException:
            self.process.stop()
            raise

    @property
    def url(self) -> str:
        return self.process.url

    def shutdown(self) -> None:
        self.session.close()
        self.process.stop()
