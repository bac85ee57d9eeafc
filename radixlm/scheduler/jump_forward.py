"""Jump-forward as a scheduler component: text a request's grammar forces is appended at once and
the request comes back through one extend step over the forced tokens (its prefix from the cache),
instead of decoding them one by one. NoJumpForward: --disable-jump-forward, or no prefix cache to
come back through. The forced text itself is constrained/jump_forward.py's."""

from __future__ import annotations

from radixlm.constrained.jump_forward import find_jump_forward
from radixlm.scheduler.cache_manager import CacheManager
from radixlm.scheduler.finisher import StepsInFlight
from radixlm.scheduler.lazy_tokenizer import LazyTokenizer
from radixlm.scheduler.req import Req, ReqStatus
from radixlm.scheduler.req_queues import ReqQueues
from radixlm.scheduler.stats import SchedulerStats


class NoJumpForward:
    def can_jump(self, req: Req) -> bool:
        return False

    def try_jump(self, req: Req) -> bool:
        return False


class JumpForward(NoJumpForward):
    def __init__(self, queues: ReqQueues, cache_manager: CacheManager, tokenizer: LazyTokenizer,
                 stats: SchedulerStats, context_len: int, in_flight: StepsInFlight):
        self.in_flight = in_flight
        self.queues = queues
        self.cache_manager = cache_manager
        self.tokenizer = tokenizer
        self.stats = stats
        self.context_len = context_len

    def can_jump(self, req: Req) -> bool:
        """Constrained requests without logprobs (a jump has no logprobs to report)."""
        return req.grammar is not None and not req.return_logprob

    def try_jump(self, req: Req) -> bool:
        """Append the text req's grammar forces; the request then leaves its batch for the front of
        the waiting queue. True when it was requeued (False: nothing forced, or it finished)."""
        if not self.can_jump(req):
            return False
        assert not self.in_flight.holds(req), "constrained requests never overlap"
        # Tokens that were streamed, or whose KV the tree shares, are never re-tokenized.
        frozen = max(req.sent_output_len, req.cache_protected_len - len(req.origin_input_ids), 0)
        tokenizer = self.tokenizer.get()
        jf = find_jump_forward(req.grammar, tokenizer, req.output_ids, len(req.output_ids) - frozen,
                               req.sampling_params.max_new_tokens)
        if jf is None:
            return False
        # KV of re-tokenized tokens: the request's own, never the tree's.
        self.cache_manager.free_tail(req, min(req.kv_committed_len, len(req.origin_input_ids) + jf.keep))
        req.output_ids = req.output_ids[: jf.keep] + jf.new_tokens
        self.stats.jump_forward_tokens += len(jf.new_tokens)
        req.check_finished(tokenizer, self.context_len)
        if req.finished():
            return False  # the caller finishes it
        self.cache_manager.release(req)  # shares the valid prefix, releases slot and lock
        self.queues.move(req, ReqStatus.WAITING, front=True)
        return True
