"""Which implementation of each optional scheduler component a server runs, chosen once from its
config: the real one, or its no-op twin. Both implement the component's interface (a Base* class
of the component's module, every method abstract), so the loop never asks whether a feature is on.

    speculation      BaseSpeculation      NoSpeculation / SpecDecoding
    executor         BaseExecutor         InlineExecutor / OverlapExecutor
    prefill folding  BasePrefillFold      NoPrefillFold / PrefillFold (speculation picks it)
    jump-forward     BaseJumpForward      NoJumpForward / JumpForward
    invariants       BaseInvariantChecks  NoInvariantChecks / InvariantChecker (/ TPStateCheck)

The others are chosen where their inputs are: the PD mode (pd/mode.py), session pins
(kv/session_pins.py), the step sync and DP attention (rank.py), LoRA (lora/runtime.py), the
storage tier (cache/hiradix_cache.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from radixlm.cache.base_prefix_cache import BasePrefixCache
from radixlm.cache.tree_node import TreeNode
from radixlm.disaggregation.config import DisaggregationMode
from radixlm.model.executor.runner import ModelRunner
from radixlm.scheduler.config import SchedulerConfig
from radixlm.scheduler.decoding.grammar_manager import GrammarManager
from radixlm.scheduler.decoding.prefill_fold import BasePrefillFold, NoPrefillFold
from radixlm.scheduler.decoding.spec_decoding import BaseSpeculation, NoSpeculation, SpecDecoding
from radixlm.scheduler.execution.executor import BaseExecutor, InlineExecutor, OverlapExecutor
from radixlm.scheduler.invariants import BaseInvariantChecks, InvariantChecker, NoInvariantChecks
from radixlm.scheduler.kv.cache_manager import CacheManager
from radixlm.scheduler.lazy_tokenizer import LazyTokenizer
from radixlm.scheduler.output.jump_forward import BaseJumpForward, JumpForward, NoJumpForward
from radixlm.scheduler.parallel.tp_sync import AgreedStepCosts, BaseStepSync
from radixlm.scheduler.req_queues import ReqQueues
from radixlm.scheduler.stats import SchedulerStats

logger = logging.getLogger(__name__)


def create_speculation(
    config: SchedulerConfig,
    tree_cache: BasePrefixCache,
    runner: ModelRunner,
    grammar: GrammarManager,
    sync: BaseStepSync,
) -> BaseSpeculation:
    """SpecDecoding with --speculative-algorithm (its draft source, controller and tree shape),
    else NoSpeculation."""
    spec = config.speculative
    if not spec:
        return NoSpeculation()
    from radixlm.speculative.controller import SpecController
    from radixlm.speculative.draft_tree import TreeShape
    from radixlm.speculative.factory import create_draft_source

    source = create_draft_source(
        spec, tree_cache, runner.token_to_kv_pool.size, config.runner, runner.vocab_size, runner
    )
    shape = spec.tree_shape
    if shape.width > 1 and not runner.attn_backend.supports_tree_mask:
        logger.warning(
            "%r cannot verify draft trees for this model: chains only", runner.attn_backend
        )
        shape = TreeShape(1, shape.depth)
    controller = SpecController(source, spec.num_draft_tokens, spec.draft_policy, shape)
    controller.costs = AgreedStepCosts(controller.costs, sync)  # draft lengths alike on every rank
    pool = runner.state_pool
    room = None if pool is None else lambda: len(pool.free_drafts)
    return SpecDecoding(controller, grammar, room)


def create_executor(
    config: SchedulerConfig,
    runner: ModelRunner,
    cache_manager: CacheManager,
    grammar: GrammarManager,
    spec: BaseSpeculation,
) -> BaseExecutor:
    executor_cls = OverlapExecutor if config.overlap_schedule else InlineExecutor
    return executor_cls(runner, cache_manager, grammar, spec)


def create_prefill_fold(config: SchedulerConfig, spec: BaseSpeculation) -> BasePrefillFold:
    # A PD prefill server hands every request over after its prefill: none joins a decode step
    # there.
    if config.disaggregation.mode is DisaggregationMode.PREFILL:
        return NoPrefillFold()
    return spec.prefill_fold()


def create_jump_forward(
    config: SchedulerConfig,
    queues: ReqQueues,
    cache_manager: CacheManager,
    tokenizer: LazyTokenizer,
    stats: SchedulerStats,
    context_len: int,
    executor: BaseExecutor,
) -> BaseJumpForward:
    """JumpForward where a prefix cache takes the jumped request back, unless
    --disable-jump-forward."""
    if cache_manager.tree_cache.capabilities().shares_prefixes and not config.disable_jump_forward:
        return JumpForward(queues, cache_manager, tokenizer, stats, context_len, executor)
    return NoJumpForward()


def create_invariant_checks(
    config: SchedulerConfig,
    sync: BaseStepSync,
    cache_manager: CacheManager,
    queues: ReqQueues,
    pins: Callable[[], Iterable[TreeNode]],
) -> BaseInvariantChecks:
    """--enable-invariant-checks: the checks of this scheduler (and, with tp > 1, the ranks'
    agreement); pins: the sessions' locked nodes."""
    if not config.enable_invariant_checks:
        return NoInvariantChecks()
    return sync.checked(InvariantChecker(cache_manager, queues, pins), cache_manager, queues)
