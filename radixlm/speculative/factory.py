"""The draft source of --speculative-algorithm (a new source: a module implementing DraftSource in
draft_source.py, its name in config.SPECULATIVE_ALGORITHMS and a branch here)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixlm.cache.base_prefix_cache import BasePrefixCache
from radixlm.model.runner_config import ModelRunnerConfig
from radixlm.speculative.config import SpeculativeConfig
from radixlm.speculative.draft_source import DraftSource

if TYPE_CHECKING:
    from radixlm.model.runner import ModelRunner


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
    if config.is_eagle:
        from radixlm.speculative.eagle import EagleDraftSource

        if target_runner is None:
            raise ValueError(f"speculative_algorithm {config.algorithm} needs the target's runner")
        return EagleDraftSource(config, target_runner)
    from radixlm.speculative.ngram import NgramDraftSource

    lookup = NgramDraftSource(
        config.ngram_min_match_window_size, config.ngram_max_match_window_size
    )
    if config.algorithm == "ngram":
        return lookup
    if config.algorithm == "radix":
        from radixlm.speculative.radix import RadixDraftSource

        suffix_index = None
        if config.suffix_index_tokens > 0:
            from radixlm.speculative.suffix_index import SuffixIndex

            suffix_index = SuffixIndex(
                config.suffix_index_tokens,
                config.ngram_min_match_window_size,
                config.ngram_max_match_window_size,
            )
        return RadixDraftSource(tree_cache, suffix_index, lookup)
    from radixlm.speculative.draft_model import DraftModelSource

    # The draft pool defaults to the target's KV capacity: the running requests never hold more.
    return DraftModelSource(
        config, target, config.draft_kv_tokens or kv_pool_size, target_vocab_size
    )
