"""The xgrammar backend: JSON schema, regex and EBNF compiled to token-level matchers.

Install without its triton dependency (on CPU the mask is applied by a table lookup; on CUDA
xgrammar's own kernel applies it, with the triton that the GPU path brings):
  pip install --no-deps xgrammar==0.2.8 && pip install apache-tvm-ffi pydantic numpy
  typing-extensions
"""

from __future__ import annotations

import json
import os

import torch
import xgrammar as xgr

from radixlm.constrained.base_grammar_backend import (
    ANY_JSON_OBJECT,
    BaseGrammarBackend,
    BaseGrammarObject,
)


class XGrammarGrammar(BaseGrammarObject):
    def __init__(self, matcher: xgr.GrammarMatcher, ctx: xgr.CompiledGrammar):
        self.matcher = matcher
        self.ctx = ctx  # the compiled grammar, shared by every copy (and the cache)

    def accept_token(self, token_id: int) -> bool:
        # xgrammar already returns False for a rejected token or after termination.
        return self.matcher.accept_token(int(token_id))

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0:
            self.matcher.rollback(num_tokens)

    def is_completed(self) -> bool:
        return self.matcher.is_completed()

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None:
        if self.matcher.is_terminated():
            # xgrammar raises on a terminated matcher; a finished request still in the
            # batch (overlap) gets "stop tokens only", so the row is never stale.
            vocab_mask[idx].zero_()
            for t in self.matcher.stop_token_ids:
                vocab_mask[idx, t // 32] |= _bit(t % 32)
            return
        self.matcher.fill_next_token_bitmask(vocab_mask, idx)

    def find_jump_forward_str(self) -> str:
        try:
            return self.matcher.find_jump_forward_string()
        except UnicodeDecodeError:
            # The forced bytes end (or start, after a token that held part of a character) inside a
            # UTF-8 character: not text to re-tokenize, so no jump; the model generates them.
            return ""

    def copy(self) -> XGrammarGrammar:
        return XGrammarGrammar(xgr.GrammarMatcher(self.ctx), self.ctx)

    def fork(self) -> XGrammarGrammar:
        return XGrammarGrammar(self.matcher.fork(), self.ctx)


def _bit(j: int) -> int:
    """Bit j of an int32 word as a Python int in int32 range (bit 31 is negative)."""
    return -(1 << 31) if j == 31 else 1 << j


class XGrammarBackend(BaseGrammarBackend):
    """xgrammar compiler for one tokenizer.

    `vocab_size` is the model's (its logits' width), which may exceed len(tokenizer):
    the padding ids are never allowed. `eos_token_ids` are the stop tokens the mask
    allows once the grammar is complete (default: what xgrammar finds in the tokenizer).
    JSON is compact and canonical (any_whitespace=False): separators ", " and ": "
    like json.dumps, no newlines, so fixed keys become long forced runs for
    jump-forward and a weak model cannot loop on whitespace.
    """

    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        eos_token_ids: list[int] | None = None,
        num_threads: int = 4,
        cache_size: int = 256,
        any_whitespace: bool = False,
    ):
        super().__init__(num_threads=num_threads, cache_size=cache_size)
        self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=eos_token_ids or None
        )
        self.vocab_size = vocab_size
        self.any_whitespace = any_whitespace
        # Our LRU is the one cache (bounded); xgrammar's own would grow without limit.
        self.compiler = xgr.GrammarCompiler(
            self.tokenizer_info, max_threads=min(8, os.cpu_count() or 1), cache_enabled=False
        )
        self._batch_matcher = xgr.BatchGrammarMatcher(max_threads=os.cpu_count() or 1)

    def fill_vocab_masks(self, grammars: list, vocab_mask: torch.Tensor, rows: list[int]) -> None:
        # xgrammar fills a batch on its own threads (inside a JSON string a row takes ~0.5 ms).
        live = [(g, i) for g, i in zip(grammars, rows) if not g.matcher.is_terminated()]
        for g, i in zip(grammars, rows):
            if g.matcher.is_terminated():
                g.fill_vocab_mask(vocab_mask, i)
        if len(live) == 1:
            live[0][0].fill_vocab_mask(vocab_mask, live[0][1])
        elif live:
            self._batch_matcher.batch_fill_next_token_bitmask(
                [g.matcher for g, _ in live], vocab_mask, [i for _, i in live]
            )

    @staticmethod
    def apply_vocab_mask(logits: torch.Tensor, vocab_mask: torch.Tensor) -> None:
        """On CUDA xgrammar's own kernel applies the bitmask in place (its Triton kernel: one
        launch, no host sync); elsewhere the base class's table lookup (faster on a CPU than
        xgrammar's)."""
        if logits.device.type != "cuda":
            BaseGrammarBackend.apply_vocab_mask(logits, vocab_mask)
            return
        xgr.apply_token_bitmask_inplace(
            logits, vocab_mask.to(logits.device, non_blocking=True), vocab_size=logits.shape[-1]
        )

    def _grammar(self, ctx: xgr.CompiledGrammar) -> XGrammarGrammar:
        return XGrammarGrammar(xgr.GrammarMatcher(ctx), ctx)

    def dispatch_json(self, schema: str) -> XGrammarGrammar:
        if schema == ANY_JSON_OBJECT:
            # json_object mode: any object (xgrammar's builtin JSON grammar would also allow an
            # array).
            schema = '{"type": "object"}'
        try:
            json.loads(schema)  # Python's message for malformed JSON is clearer than the C++ one
        except ValueError as e:
            raise ValueError(f"json_schema is not valid JSON: {e}") from None
        ctx = self.compiler.compile_json_schema(schema, any_whitespace=self.any_whitespace)
        return self._grammar(ctx)

    def dispatch_regex(self, regex: str) -> XGrammarGrammar:
        return self._grammar(self.compiler.compile_regex(regex))

    def dispatch_ebnf(self, ebnf: str) -> XGrammarGrammar:
        return self._grammar(self.compiler.compile_grammar(ebnf, root_rule_name="root"))

    def dispatch_structural_tag(self, tag: str) -> XGrammarGrammar:
        """SGLang's two forms: {"structures": [{begin, schema, end}], "triggers": [...]} (free text
        until a trigger, then a begin, JSON by the schema, the end), or xgrammar's own
        {"type": "structural_tag", "format": {...}}."""
        try:
            obj = json.loads(tag)
        except ValueError as e:
            raise ValueError(f"structural_tag is not valid JSON: {e}") from None
        if not isinstance(obj, dict):
            raise ValueError("structural_tag must be a JSON object")
        if "structures" in obj:
            try:
                items = [
                    xgr.StructuralTagItem(
                        begin=s["begin"],
                        end=s["end"],
                        schema=(
                            s["schema"] if isinstance(s["schema"], str) else json.dumps(s["schema"])
                        ),
                    )
                    for s in obj["structures"]
                ]
                triggers = list(obj["triggers"])
            except (KeyError, TypeError) as e:
                raise ValueError(
                    f"structural_tag structures need begin, schema and end, and triggers: {e!r}"
                ) from None
            return self._grammar(self.compiler.compile_structural_tag(items, triggers))
        return self._grammar(self.compiler.compile_structural_tag(tag))
