"""The draft source of --speculative-algorithm: its config.DRAFT_SOURCE_REGISTRY entry (a new
source: a module implementing DraftSource in draft_source.py, and one registration there naming
its factory, called as factory(config, DraftTarget)). The factories of radixlm's own sources are
below; each imports its source's module when chosen."""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixlm.cache.base_prefix_cache import BasePrefixCache
from radixlm.model.executor.runner_config import ModelRunnerConfig
from radixlm.speculative.config import DRAFT_SOURCE_REGISTRY, SpeculativeConfig
from radixlm.speculative.draft_source import DraftSource, DraftTarget

if TYPE_CHECKING:
    from radixlm.model.executor.runner import ModelRunner


def create_draft_source(
    config: SpeculativeConfig,
    tree_cache: BasePrefixCache,
    kv_pool_size: int,
    target: ModelRunnerConfig,
    target_vocab_size: int,
    target_runner: ModelRunner | None = None,
) -> DraftSource:
    """target, target_vocab_size: the target model's runner options and vocabulary (a draft model
    runs with the former and must match the latter); target_runner: the target itself (an EAGLE head
    reads its hidden states, embedding and LM head)."""
    factory = DRAFT_SOURCE_REGISTRY.get(config.algorithm)
    return factory(
        config, DraftTarget(tree_cache, kv_pool_size, target, target_vocab_size, target_runner)
    )


def create_ngram_source(config: SpeculativeConfig, target: DraftTarget) -> DraftSource:
    from radixlm.speculative.ngram import NgramDraftSource

    return NgramDraftSource(config.ngram_min_match_window_size, config.ngram_max_match_window_size)


def create_radix_source(config: SpeculativeConfig, target: DraftTarget) -> DraftSource:
    from radixlm.speculative.radix import RadixDraftSource

    suffix_index = None
    if config.suffix_index_tokens > 0:
        from radixlm.speculative.suffix_index import SuffixIndex

        suffix_index = SuffixIndex(
            config.suffix_index_tokens,
            config.ngram_min_match_window_size,
            config.ngram_max_match_window_size,
        )
    return RadixDraftSource(target.tree_cache, suffix_index, create_ngram_source(config, target))


def create_draft_model_source(config: SpeculativeConfig, target: DraftTarget) -> DraftSource:
    from radixlm.speculative.draft_model import DraftModelSource

    # The draft pool defaults to the target's KV capacity: the running requests never hold more.
    return DraftModelSource(
        config,
        target.runner_config,
        config.draft_kv_tokens or target.kv_pool_size,
        target.vocab_size,
    )


def create_eagle_source(config: SpeculativeConfig, target: DraftTarget) -> DraftSource:
    from radixlm.speculative.eagle import EagleDraftSource

    if target.runner is None:
        raise ValueError(f"speculative_algorithm {config.algorithm} needs the target's runner")
    return EagleDraftSource(config, target.runner)
