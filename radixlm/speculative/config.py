"""SpeculativeConfig: the speculative-decoding options (SGLang's --speculative-* flags), validated
here, where their choices live."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from radixlm.speculative.draft_tree import TreeShape

if TYPE_CHECKING:
    from radixlm.config import ServerArgs

SPECULATIVE_ALGORITHMS = ("ngram", "radix", "draft-model")
DRAFT_POLICIES = ("adaptive", "fixed")
# Children per draft-tree node when --speculative-eagle-topk is not given: the lookups have several
# recorded continuations to branch on; the draft model decodes one chain.
DEFAULT_TOPK = {"ngram": 4, "radix": 4, "draft-model": 1}


@dataclass(frozen=True)
class SpeculativeConfig:
    algorithm: str  # SPECULATIVE_ALGORITHMS
    num_draft_tokens: int = 16  # most draft tokens per request and step
    draft_policy: str = "adaptive"  # adaptive: what pays by the cost model; fixed: every draft, up to the maximum
    ngram_min_match_window_size: int = 2  # shortest suffix a lookup match may use (ngram, radix's index)
    ngram_max_match_window_size: int = 8  # longest suffix tried first
    suffix_index_tokens: int = 16384  # radix: tokens of finished outputs kept to draft from (0: off)
    draft_model_path: Optional[str] = None  # draft-model: a HF directory or GGUF with the target's vocabulary
    draft_kv_tokens: Optional[int] = None  # draft-model: its KV pool (None: the target's size)
    max_extend_tokens: int = 4096  # draft-model: tokens per catch-up forward (the target's max_prefill_tokens)
    check_invariants: bool = False  # draft-model: check its own pool after every proposal
    eagle_topk: Optional[int] = None  # most children per tree node (None: DEFAULT_TOPK)
    num_steps: Optional[int] = None  # most tree levels (None: num_draft_tokens)

    def __post_init__(self):
        def bad(field: str, why: str):
            raise ValueError(f"speculative_{field} {why}, got {getattr(self, field)!r}")

        if self.algorithm not in SPECULATIVE_ALGORITHMS:
            bad("algorithm", f"must be one of {', '.join(SPECULATIVE_ALGORITHMS)}")
        if self.num_draft_tokens < 1:
            bad("num_draft_tokens", "must be >= 1")
        if self.draft_policy not in DRAFT_POLICIES:
            bad("draft_policy", f"must be one of {', '.join(DRAFT_POLICIES)}")
        if not 1 <= self.ngram_min_match_window_size <= self.ngram_max_match_window_size:
            raise ValueError("speculative ngram match window sizes need 1 <= min <= max")
        if self.suffix_index_tokens < 0:
            bad("suffix_index_tokens", "must be >= 0")
        if self.algorithm == "draft-model" and not self.draft_model_path:
            raise ValueError("speculative_algorithm draft-model needs speculative_draft_model_path "
                             "(--speculative-draft-model-path: a HF directory or GGUF file with the target's vocabulary)")
        if self.draft_model_path and self.algorithm != "draft-model":
            raise ValueError(f"speculative_draft_model_path is used by speculative_algorithm draft-model only, "
                             f"got speculative_algorithm {self.algorithm!r}")
        if self.draft_kv_tokens is not None and self.draft_kv_tokens <= 0:
            bad("draft_kv_tokens", "must be positive")
        if self.eagle_topk is not None and self.eagle_topk < 1:
            bad("eagle_topk", "must be >= 1")
        if self.eagle_topk is not None and self.eagle_topk > 1 and DEFAULT_TOPK[self.algorithm] == 1:
            bad("eagle_topk", f"must be 1 for speculative_algorithm {self.algorithm} (it drafts chains)")
        if self.num_steps is not None and self.num_steps < 1:
            bad("num_steps", "must be >= 1")

    @property
    def tree_shape(self) -> TreeShape:
        """The widest and deepest draft trees (the controller narrows them per step)."""
        return TreeShape(self.eagle_topk or DEFAULT_TOPK[self.algorithm], self.num_steps or self.num_draft_tokens)

    @classmethod
    def from_server_args(cls, args: "ServerArgs") -> Optional["SpeculativeConfig"]:
        """None when speculative decoding is off (no --speculative-algorithm)."""
        if args.speculative_algorithm is None:
            if args.speculative_draft_model_path:
                raise ValueError(f"speculative_draft_model_path is used by speculative_algorithm draft-model only, "
                                 f"got speculative_algorithm {args.speculative_algorithm!r}")
            return None
        return cls(args.speculative_algorithm, args.speculative_num_draft_tokens, args.speculative_draft_policy,
                   args.speculative_ngram_min_match_window_size, args.speculative_ngram_max_match_window_size,
                   args.speculative_suffix_index_tokens, args.speculative_draft_model_path,
                   args.speculative_draft_kv_tokens, args.max_prefill_tokens, args.enable_invariant_checks,
                   args.speculative_eagle_topk, args.speculative_num_steps)
