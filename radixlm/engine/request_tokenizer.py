"""RequestTokenizer: a GenerateReqInput turned into the TokenizedGenerateReqInputs the scheduler
runs, one per sequence (a batch and n > 1 expanded), each field validated: a bad one is a
ValueError naming it, before anything reaches the scheduler. Runs on the tokenizer threads
(tokenizer_pool.py)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable

from radixlm.disaggregation.config import parse_bootstrap
from radixlm.engine.lora_control import LoRAControl, cache_namespace, lora_namespace
from radixlm.engine.request_sampling import RequestSampling
from radixlm.engine.tokenizer_manager_config import TokenizerManagerConfig
from radixlm.ipc import GenerateReqInput, TokenizedGenerateReqInput
from radixlm.mm_inputs import MultimodalInputs
from radixlm.sampling_params import brief_repr

MAX_CACHE_SALT_CHARS = 1024

# (obj, i, text) -> (ids, images) for item i of obj when it has images, else None.
Multimodal = Callable[[GenerateReqInput, int, str], tuple[list[int], MultimodalInputs] | None]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class RequestTokenizer:
    def __init__(
        self,
        config: TokenizerManagerConfig,
        tokenizer,
        scheduler_info: dict,
        lora: LoRAControl,
        multimodal: Multimodal,
    ):
        """lora: resolves a request's adapter name; multimodal: a prompt's images
        (engine/mm_processor.py)."""
        self.config = config
        self.tokenizer = tokenizer
        self.context_len = scheduler_info["context_len"]
        self.vocab_size = scheduler_info["vocab_size"]
        self.sampling = RequestSampling.from_info(tokenizer, scheduler_info)
        self.lora = lora
        self.multimodal = multimodal
        # Characters of text one token can cover at most (its byte-level / piece form is no
        # shorter).
        self.max_token_chars = max((len(t) for t in tokenizer.get_vocab()), default=1) + 1

    def tokenize_one(self, obj: GenerateReqInput, i: int) -> tuple[TokenizedGenerateReqInput, int]:
        text, mm = obj.text if obj.is_single or obj.text is None else obj.text[i], None
        if obj.input_ids is not None:
            ids = obj.input_ids if obj.is_single else obj.input_ids[i]
            if not isinstance(ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in ids
            ):
                raise ValueError("input_ids must be a list of integers (or a list of such lists)")
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(
                    f"input_ids has token id {bad[0]} outside the vocabulary [0, {self.vocab_size})"
                )
        else:
            if not isinstance(text, str):
                raise ValueError("text must be a string or a list of strings")
            ids, mm = self.multimodal(obj, i, text) or (self.encode_prompt(text), None)
        if not ids:
            raise ValueError("the prompt is empty (text / input_ids)")
        if len(ids) >= self.context_len:
            raise ValueError(
                f"the prompt has {len(ids)} tokens, which does not fit the context length"
                f" {self.context_len}"
            )
        sp = self.sampling.params(
            obj.item(i, "sampling_params")
        )  # the defaults under it, validated
        if len(ids) + sp.max_new_tokens > self.context_len:
            raise ValueError(
                f"sampling_params.max_new_tokens {brief_repr(sp.max_new_tokens)} plus the prompt's"
                f" {len(ids)} tokens exceed the context length {self.context_len}; ask for at most"
                f" {self.context_len - len(ids)}"
            )
        if sp.n > self.config.max_n:
            raise ValueError(
                f"sampling_params.n must be <= {self.config.max_n} (--max-n), got"
                f" {brief_repr(sp.n)}"
            )
        rid = obj.item(i, "rid") or uuid.uuid4().hex
        lp_start = obj.item(i, "logprob_start_len", -1)
        top_n = obj.item(i, "top_logprobs_num", 0)
        return_logprob = obj.item(i, "return_logprob", False)
        priority = obj.item(i, "priority")
        salt, lora_id = obj.item(i, "cache_salt"), self.lora.resolve(obj.item(i, "lora_path"))
        if not isinstance(rid, str):
            raise ValueError(
                f"rid must be a string (a list of them for a batch), got {brief_repr(rid)}"
            )
        if not isinstance(return_logprob, bool):
            raise ValueError(
                "return_logprob must be a boolean (a list of them for a batch), got"
                f" {brief_repr(return_logprob)}"
            )
        if not _is_int(lp_start) or lp_start < -1:
            raise ValueError(
                f"logprob_start_len must be an integer >= -1, got {brief_repr(lp_start)}"
            )
        if return_logprob and lp_start >= len(ids):
            raise ValueError(
                f"logprob_start_len {lp_start} must be below the prompt length {len(ids)}"
            )
        if (
            mm is not None and return_logprob and 0 <= lp_start < mm.last_end
        ):  # an image token has no logprob
            raise ValueError(
                f"logprob_start_len must be -1 or >= {mm.last_end} (after the last image) with"
                " image_data"
            )
        if not _is_int(top_n) or not 0 <= top_n <= self.config.max_top_logprobs_num:
            raise ValueError(
                f"top_logprobs_num must be an integer in [0, {self.config.max_top_logprobs_num}] "
                f"(--max-top-logprobs-num), got {brief_repr(top_n)}"
            )
        # The scheduler sorts its queue by priority: anything but an integer would kill it there.
        if priority is not None and not _is_int(priority):
            raise ValueError(
                "priority must be an integer (a list of them for a batch), got"
                f" {brief_repr(priority)}"
            )
        if salt is not None and not (
            isinstance(salt, str) and 0 < len(salt) <= MAX_CACHE_SALT_CHARS
        ):
            raise ValueError(
                f"cache_salt must be a non-empty string of at most {MAX_CACHE_SALT_CHARS}"
                f" characters (a list of them for a batch), got {brief_repr(salt)}"
            )
        req = TokenizedGenerateReqInput(
            rid=rid,
            input_text=text,
            input_ids=ids,
            sampling_params=sp,
            return_logprob=return_logprob,
            logprob_start_len=lp_start,
            top_logprobs_num=top_n,
            stream=obj.stream,
            priority=priority if self.config.enable_priority_scheduling else None,
            cache_namespace=lora_namespace(lora_id, cache_namespace(salt)),
            lora_id=lora_id,
            mm_inputs=mm,
            bootstrap=parse_bootstrap(
                obj.item(i, "bootstrap_host"),
                obj.item(i, "bootstrap_port"),
                obj.item(i, "bootstrap_room"),
                self.config.disaggregation_mode,
                sp.n,
            ),
        )
        return req, sp.n

    def encode_prompt(self, text: str) -> list[int]:
        """Tokenize, refusing a text longer than the context before tokenizing all of it: no token
        spans more than max_token_chars characters, and a prefix with more tokens than the context
        already decides it."""
        ctx = self.context_len
        if len(text) > ctx * self.max_token_chars:
            raise ValueError(
                f"the prompt has {len(text)} characters, more than the context length {ctx} tokens "
                "can hold"
            )
        probe = ctx * 8
        if len(text) > probe and len(self.tokenizer.encode(text[:probe])) > ctx + 1:
            raise ValueError(
                f"the prompt has more tokens than the context length {ctx} "
                f"(its first {probe} characters alone do)"
            )
        return self.tokenizer.encode(text)

    def expand(self, obj: GenerateReqInput) -> list[TokenizedGenerateReqInput]:
        """All requests of obj, each n-sampled one split into n copies (seed offset per copy)."""
        out = []
        for i in range(obj.batch_size):
            req, n = self.tokenize_one(obj, i)
            if n == 1:
                out.append(req)
                continue
            for j in range(n):
                sp = dataclasses.replace(req.sampling_params, n=1)
                if sp.seed is not None:
                    sp.seed += j
                out.append(dataclasses.replace(req, rid=f"{req.rid}-{j}", sampling_params=sp))
        return out
