"""Backends that speak radixlm's native /generate contract (the HTTP endpoint and the in-process
Engine): generation, prefix pre-caching, and select scored by prompt logprobs."""

from __future__ import annotations

from collections.abc import Iterator

from radixlm.lang.base_backend import BaseBackend, Prompt
from radixlm.utils import common_prefix_len


def _lps(meta: dict) -> list[float]:
    return [e[0] for e in meta.get("input_token_logprobs") or [] if e and e[0] is not None]


def _images(prompt: Prompt) -> dict:
    return {"image_data": list(prompt.images)} if prompt.images else {}


class NativeBackend(BaseBackend):
    """Subclasses implement `_call(body)` (a /generate body -> its JSON answer), `_stream(body)`
    (cumulative answers) and `tokenize(texts)` (the server's own tokenization)."""

    def _call(self, body: dict):
        raise NotImplementedError

    def _stream(self, body: dict) -> Iterator[dict]:
        raise NotImplementedError

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        raise NotImplementedError

    def start_token_id(self) -> int:
        """The token a text with no context starts from (BOS, else EOS as document separator)."""
        tok = self.tokenizer
        tid = (
            None
            if tok is None
            else (tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id)
        )
        if tid is None:
            raise RuntimeError(
                "unconditional_likelihood_normalized needs the model's BOS or EOS token id"
            )
        return tid

    def generate(self, prompt: Prompt, sampling_params: dict, logprob: dict | None = None) -> dict:
        return self._call(
            {
                "text": prompt.text,
                "sampling_params": sampling_params,
                **_images(prompt),
                **(logprob or {}),
            }
        )

    def generate_stream(
        self, prompt: Prompt, sampling_params: dict, logprob: dict | None = None
    ) -> Iterator[dict]:
        return self._stream(
            {
                "text": prompt.text,
                "sampling_params": sampling_params,
                "stream": True,
                **_images(prompt),
                **(logprob or {}),
            }
        )

    def prefill(self, text) -> dict:
        """Score `text` (a string or token ids) with no generation: it lands in the radix cache."""
        key = "input_ids" if isinstance(text, list) else "text"
        return self._call({key: text, "sampling_params": {"max_new_tokens": 0}})["meta_info"]

    def score(self, prefix: str, choices: list[str], unconditional: bool = False) -> dict:
        """Logprobs of each choice's tokens after `prefix`, all choices in one batched request.

        Token healing: `prefix + choice` is tokenized whole, as the model would see it, so when
        the choice merges with the prefix's last token(s) (prefix "Answer: " + "True" -> the
        token " True"), the merged tokens are scored as part of the choice. Each choice's
        scoring starts where its tokens part from the prefix's; the prefix is sent first so
        the batch hits the cache up to there."""
        ids = self.tokenize([prefix, *(prefix + c for c in choices)])
        base, full = ids[0], ids[1:]
        starts = [common_prefix_len(base, f) for f in full]
        if base:
            self.prefill(base)
        outs = self._call(
            {
                "input_ids": full,
                "sampling_params": {"max_new_tokens": 0},
                "return_logprob": True,
                "logprob_start_len": starts,
                "return_text_in_logprobs": True,
            }
        )
        res = {
            "prompt_tokens": len(base),
            "healed_tokens": [len(base) - k for k in starts],
            "metas": [o["meta_info"] for o in outs],
            "logprobs": [_lps(o["meta_info"]) for o in outs],
        }
        if unconditional:
            # The same tokens after nothing but the start token.
            start = self.start_token_id()
            un = self._call(
                {
                    "input_ids": [[start, *f[k:]] for f, k in zip(full, starts)],
                    "sampling_params": {"max_new_tokens": 0},
                    "return_logprob": True,
                    "logprob_start_len": 1,
                }
            )
            res["unconditional"] = [_lps(o["meta_info"]) for o in un]
        return res

    def select(self, prompt: Prompt, choices: list[str], method) -> tuple[int, dict]:
        res = self.score(prompt.text, choices, unconditional=method.needs_unconditional)
        idx, meta = method(choices, res["logprobs"], res.get("unconditional"))
        return idx, {
            **meta,
            "choice_logprobs": res["logprobs"],
            "prompt_tokens": res["prompt_tokens"],
            "healed_tokens": res["healed_tokens"],
            "input_token_logprobs": [m.get("input_token_logprobs") for m in res["metas"]],
            "unconditional_logprobs": res.get("unconditional"),
        }
