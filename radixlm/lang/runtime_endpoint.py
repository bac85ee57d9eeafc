"""RuntimeEndpoint: a radixlm (or SGLang) server over its native HTTP API."""

from __future__ import annotations

import json
from typing import Iterator, Optional

import requests

from radixlm.lang.base_backend import BaseBackend


class RuntimeEndpoint(BaseBackend):
    def __init__(self, base_url: str, api_key: Optional[str] = None, timeout: float = 600):
        super().__init__()
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"
        self.model_info = self._get("/get_model_info")

    def _get(self, path: str) -> dict:
        r = self.session.get(self.base_url + path, timeout=self.timeout)
        self._check(r)
        return r.json()

    @staticmethod
    def _check(r: requests.Response) -> None:
        if r.status_code != 200:
            raise RuntimeError(f"{r.request.method} {r.url} -> {r.status_code}: {r.text[:500]}")

    def _load_tokenizer(self):
        from radixlm.model.loader import load_tokenizer

        return load_tokenizer(self.model_info.get("tokenizer_path") or self.model_info["model_path"])

    def _call(self, body: dict):
        r = self.session.post(self.base_url + "/generate", json=body, timeout=self.timeout)
        self._check(r)
        return r.json()

    def _stream(self, body: dict) -> Iterator[dict]:
        with self.session.post(self.base_url + "/generate", json=body, timeout=self.timeout, stream=True) as r:
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
        self._check(self.session.post(self.base_url + "/flush_cache", timeout=self.timeout))
