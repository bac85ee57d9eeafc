"""RequestIntake: new requests and aborts.

A request arrives validated (the tokenizer manager built an immutable TokenizedGenerateReqInput)
and becomes a Req that waits for what it needs before admission: GRAMMAR_PENDING while its grammar
compiles, PREFETCHING while its prefix is read from storage, then WAITING. A step it needs nothing
for is skipped.
"""

from __future__ import annotations

from collections.abc import Callable

from radixlm.ipc import TokenizedGenerateReqInput
from radixlm.lora.runtime import BaseLoRARuntime, NoLoRA
from radixlm.scheduler.decoding.grammar_manager import GrammarManager
from radixlm.scheduler.kv.prefetcher import Prefetcher
from radixlm.scheduler.output.finisher import Finisher
from radixlm.scheduler.parallel.tp_sync import BaseStepSync, NoStepSync
from radixlm.scheduler.req import Req, ReqStatus
from radixlm.scheduler.req_queues import ReqQueues

S = ReqStatus


class RequestIntake:
    def __init__(
        self,
        queues: ReqQueues,
        grammar: GrammarManager,
        prefetcher: Prefetcher,
        finisher: Finisher,
        eos_token_ids: frozenset[int],
        sync: BaseStepSync = NoStepSync(),
        pool_all_tokens: bool = False,
        lora: BaseLoRARuntime = NoLoRA(),
    ):
        self.queues = queues
        self.sync = sync  # tensor parallelism: a compile is done when it is done on every rank
        self.grammar = grammar
        self.prefetcher = prefetcher
        self.finisher = finisher
        self.eos_token_ids = eos_token_ids
        self.pool_all_tokens = pool_all_tokens  # an embedding model whose pooling reads every token
        self.lora = lora
        # Where a ready request goes (PD decode: a request with a bootstrap room waits for its KV).
        self.ready_status: Callable[[Req], ReqStatus] = lambda req: S.WAITING

    def add(self, recv: TokenizedGenerateReqInput) -> None:
        req = Req.from_input(recv, self.eos_token_ids)
        req.pool_all_tokens = self.pool_all_tokens
        if not self.lora.serves(req.lora_id):  # unloaded while this request was being tokenized
            req.abort(
                f"lora_path: the LoRA adapter {req.lora_id.split('@')[0]!r} was unloaded", 400
            )
            self.finisher.finish(req)
            return
        self.prefetcher.start(req)
        if not req.sampling_params.grammar_key:
            req.grammar = self.grammar.with_thinking(req, None)  # a think block needs no compile
            self._ready(req)
            return
        error = self.grammar.start(req)
        if error:
            req.abort(error, 400)
            self.finisher.finish(req)
            return
        self.queues.move(req, S.GRAMMAR_PENDING)
        self._poll_grammars()  # a cached grammar is ready at once

    def _ready(self, req: Req) -> None:
        """Nothing left to compile: it waits for its prefix's reads, or for admission."""
        self.queues.move(
            req, S.PREFETCHING if self.prefetcher.pending(req) else self.ready_status(req)
        )

    def poll(self) -> None:
        """Compiled grammars and completed prefetches move their requests on."""
        if self.queues.grammar_pending:
            self._poll_grammars()
        self.prefetcher.poll()
        for req in [r for r in self.queues.prefetching if not self.prefetcher.pending(r)]:
            self.queues.move(req, self.ready_status(req))

    def _poll_grammars(self) -> None:
        pending = self.queues.grammar_pending
        done = self.sync.all_done([r.to_abort or self.grammar.compiled(r) for r in pending])
        for req in [r for r, d in zip(pending, done, strict=True) if d]:
            if req.to_abort:
                req.grammar.cancel()
                req.abort()
                self.finisher.finish(req)
                continue
            error = self.grammar.resolve(req)
            if error:
                req.abort(error, 400)
                self.finisher.finish(req)
            else:
                self._ready(req)

    def abort(self, rid: str) -> None:
        """Abort rid ("": every request). A compiling request goes when its compile ends; a waiting
        one (or the one between prefill chunks) at once; a running one before its next step."""
        q = self.queues
        for req in q.matching(rid, [S.GRAMMAR_PENDING, S.RUNNING, S.KV_BOOTSTRAP, S.KV_TRANSFER]):
            req.to_abort = True
        # A retracted request keeps its drafting state: the finisher's release drops it.
        for req in q.matching(rid, [S.PREFETCHING, S.WAITING, S.PREFILLING]):
            req.abort()
            self.finisher.finish(req)
