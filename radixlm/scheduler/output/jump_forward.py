"""Jump-forward as a scheduler component: text a request's grammar forces is appended at once and
the request comes back through one extend step over the forced tokens (its prefix from the cache),
instead of decoding them one by one. BaseJumpForward is what ResultProcessor and the streamer ask
of it; NoJumpForward: --disable-jump-forward, or no prefix cache to come back through. The forced
text itself is constrained/jump_forward.py's.

A jump re-tokenizes the request's last RETOKENIZE_TOKENS tokens with the forced text whether it
streams or not and whatever the tree holds (their KV is recomputed), so greedy outputs do not
depend on `stream` or on the cache: a stream holds those tokens back until they can no longer
change (hold_back). SGLang's jump-forward re-tokenized the whole output for both as well."""

from __future__ import annotations

from abc import ABC, abstractmethod

from radixlm.constrained.jump_forward import RETOKENIZE_TOKENS, find_jump_forward
from radixlm.scheduler.kv.cache_manager import CacheManager
from radixlm.scheduler.lazy_tokenizer import LazyTokenizer
from radixlm.scheduler.output.finisher import StepsInFlight
from radixlm.scheduler.req import Req, ReqStatus
from radixlm.scheduler.req_queues import ReqQueues
from radixlm.scheduler.stats import SchedulerStats


class BaseJumpForward(ABC):
    @abstractmethod
    def can_jump(self, req: Req) -> bool:
        """Whether req may jump forward at all."""

    @abstractmethod
    def try_jump(self, req: Req) -> bool:
        """Jump req forward over its grammar's forced text; True when it was requeued."""

    @abstractmethod
    def hold_back(self, req: Req) -> int:
        """How many of req's last tokens a stream may not send yet (a jump may re-tokenize them)."""


class NoJumpForward(BaseJumpForward):
    def can_jump(self, req: Req) -> bool:
        return False

    def try_jump(self, req: Req) -> bool:
        return False

    def hold_back(self, req: Req) -> int:
        return 0


class JumpForward(BaseJumpForward):
    def __init__(
        self,
        queues: ReqQueues,
        cache_manager: CacheManager,
        tokenizer: LazyTokenizer,
        stats: SchedulerStats,
        context_len: int,
        in_flight: StepsInFlight,
    ):
        self.in_flight = in_flight
        self.queues = queues
        self.cache_manager = cache_manager
        self.tokenizer = tokenizer
        self.stats = stats
        self.context_len = context_len

    def can_jump(self, req: Req) -> bool:
        """Constrained requests without logprobs (a jump has no logprobs to report)."""
        return req.grammar is not None and not req.return_logprob

    def hold_back(self, req: Req) -> int:
        return RETOKENIZE_TOKENS if self.can_jump(req) else 0

    def try_jump(self, req: Req) -> bool:
        """Append the text req's grammar forces; the request then leaves its batch for the front of
        the waiting queue. True when it was requeued (False: nothing forced, or it finished)."""
        if not self.can_jump(req):
            return False
        assert not self.in_flight.holds(req), "constrained requests never overlap"
        # Streamed tokens are never re-tokenized; hold_back keeps the last ones unsent, so this
        # is the same tail as unstreamed (the tree's share of it does not count: release_from).
        frozen = req.sent_output_len
        tokenizer = self.tokenizer.get()
        jf = find_jump_forward(
            req.grammar,
            tokenizer,
            req.output_ids,
            len(req.output_ids) - frozen,
            req.sampling_params.max_new_tokens,
        )
        if jf is None:
            return False
        # KV of re-tokenized tokens is dropped (the tree's copy stays, for the old tokenization).
        self.cache_manager.release_from(
            req, min(req.kv_committed_len, len(req.origin_input_ids) + jf.keep)
        )
        req.output_ids = req.output_ids[: jf.keep] + jf.new_tokens
        self.stats.jump_forward_tokens += len(jf.new_tokens)
        req.check_finished(tokenizer, self.context_len)
        if req.finished():
            return False  # the caller finishes it
        self.cache_manager.release(req)  # shares the valid prefix, releases slot and lock
        self.queues.move(req, ReqStatus.WAITING, front=True)
        return True
