"""SpeculativeConfig: the speculative-decoding options (SGLang's --speculative-* flags), validated
here, where their choices live."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixlm.registry import Registry
from radixlm.speculative.draft_tree import TreeShape

if TYPE_CHECKING:
    from radixlm.config import ServerArgs
    from radixlm.speculative.draft_source import DraftSource, DraftTarget

DRAFT_POLICIES = ("adaptive", "fixed")
# Most draft tokens per request and step when --speculative-num-draft-tokens is not given (and the
# source's entry says no other).
NUM_DRAFT_TOKENS = 16
EAGLE_NUM_STEPS = (
    5  # an EAGLE head's levels when --speculative-num-steps is not given (SGLang's default)
)
# A source is made as factory(config, DraftTarget) (factory.py: create_draft_source).
DraftSourceFactory = Callable[["SpeculativeConfig", "DraftTarget"], "DraftSource"]


@dataclass(frozen=True)
class DraftSourceInfo:
    """What the options read of a draft source without loading it."""

    topk: int  # children per draft-tree node when --speculative-eagle-topk is not given (1: chains)
    num_draft_tokens: int = NUM_DRAFT_TOKENS  # when --speculative-num-draft-tokens is not given
    draft_model_path: str | None = None  # what --speculative-draft-model-path names (None: unused)
    eagle: bool = False  # a draft head on the target's hidden states (speculative/eagle.py)
    mtp: bool = False  # ... the model's own multi-token-prediction layer (mtp_checkpoint.py)
    num_steps: int | None = None  # tree levels when --speculative-num-steps is not given


# --speculative-algorithm, a source per name. topk: the lookups have several recorded continuations
# to branch on, an EAGLE head its top candidates (SGLang's usual 4); the draft model decodes one
# chain. radix proposes recorded answers to the same context: a repeated call's whole answer
# verifies in one step where the cost model says it pays (on 2 cores a 60-row step costs ~8
# single-row steps); the controller drafts fewer where acceptance or the batch says so.
DRAFT_SOURCE_REGISTRY = Registry[DraftSourceFactory, DraftSourceInfo](
    "speculative algorithm", unknown="speculative_algorithm must be one of {choices}, got {name!r}"
)
DRAFT_SOURCE_REGISTRY.register(
    "ngram", "radixlm.speculative.factory:create_ngram_source", DraftSourceInfo(topk=4)
)
DRAFT_SOURCE_REGISTRY.register(
    "radix",
    "radixlm.speculative.factory:create_radix_source",
    DraftSourceInfo(topk=4, num_draft_tokens=64),
)
DRAFT_SOURCE_REGISTRY.register(
    "draft-model",
    "radixlm.speculative.factory:create_draft_model_source",
    DraftSourceInfo(
        topk=1, draft_model_path="a HF directory or GGUF file with the target's vocabulary"
    ),
)
_EAGLE = DraftSourceInfo(
    topk=4,
    draft_model_path="the draft head's directory, config.json + safetensors; `radixlm train-eagle`"
    " writes one",
    eagle=True,
)
DRAFT_SOURCE_REGISTRY.register("eagle", "radixlm.speculative.factory:create_eagle_source", _EAGLE)
DRAFT_SOURCE_REGISTRY.register("eagle3", "radixlm.speculative.factory:create_eagle_source", _EAGLE)
# SGLang's NEXTN: the model's own MTP / NextN layer drafts, through the EAGLE source. Its
# defaults are SGLang's for the models that carry one (auto_choose_speculative_params: 3 steps,
# top-1, 4 draft tokens).
DRAFT_SOURCE_REGISTRY.register(
    "nextn",
    "radixlm.speculative.factory:create_eagle_source",
    DraftSourceInfo(topk=1, num_draft_tokens=4, eagle=True, mtp=True, num_steps=3),
)


def _path_users() -> str:
    """The algorithms that read --speculative-draft-model-path: "draft-model, eagle and eagle3"."""
    names = [n for n in DRAFT_SOURCE_REGISTRY if DRAFT_SOURCE_REGISTRY.meta(n).draft_model_path]
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


@dataclass(frozen=True)
class SpeculativeConfig:
    algorithm: str  # DRAFT_SOURCE_REGISTRY
    num_draft_tokens: int = NUM_DRAFT_TOKENS  # most draft tokens per request and step
    draft_policy: str = (
        "adaptive"  # adaptive: what pays by the cost model; fixed: every draft, up to the maximum
    )
    ngram_min_match_window_size: int = (
        2  # shortest suffix a lookup match may use (ngram, radix's index)
    )
    ngram_max_match_window_size: int = 8  # longest suffix tried first
    suffix_index_tokens: int = (
        16384  # radix: tokens of finished outputs kept to draft from (0: off)
    )
    draft_model_path: str | None = (
        None  # draft-model: a HF directory or GGUF with the target's vocabulary
    )
    draft_kv_tokens: int | None = None  # draft-model: its KV pool (None: the target's size)
    max_extend_tokens: int = (
        4096  # draft-model: tokens per catch-up forward (the target's max_prefill_tokens)
    )
    check_invariants: bool = False  # draft-model: check its own pool after every proposal
    eagle_topk: int | None = None  # most children per tree node (None: the source's topk)
    num_steps: int | None = (
        None  # most tree levels (None: EAGLE_NUM_STEPS for a head, else num_draft_tokens)
    )
    token_map: str | None = None  # eagle: the token ids the head ranks (None: the whole vocabulary)

    @property
    def source_info(self) -> DraftSourceInfo:
        return DRAFT_SOURCE_REGISTRY.meta(self.algorithm)

    @property
    def is_eagle(self) -> bool:
        return self.source_info.eagle

    @property
    def is_mtp(self) -> bool:
        return self.source_info.mtp

    def __post_init__(self):
        def bad(field: str, why: str):
            raise ValueError(f"speculative_{field} {why}, got {getattr(self, field)!r}")

        if self.algorithm not in DRAFT_SOURCE_REGISTRY:
            raise DRAFT_SOURCE_REGISTRY.unknown(self.algorithm)
        if self.num_draft_tokens < 1:
            bad("num_draft_tokens", "must be >= 1")
        if self.draft_policy not in DRAFT_POLICIES:
            bad("draft_policy", f"must be one of {', '.join(DRAFT_POLICIES)}")
        if not 1 <= self.ngram_min_match_window_size <= self.ngram_max_match_window_size:
            raise ValueError("speculative ngram match window sizes need 1 <= min <= max")
        if self.suffix_index_tokens < 0:
            bad("suffix_index_tokens", "must be >= 0")
        path = self.source_info.draft_model_path
        if path and not self.draft_model_path:
            raise ValueError(
                f"speculative_algorithm {self.algorithm} needs speculative_draft_model_path"
                f" (--speculative-draft-model-path: {path})"
            )
        if self.draft_model_path and not path:
            raise ValueError(
                f"speculative_draft_model_path is used by speculative_algorithm {_path_users()}"
                f" only, got speculative_algorithm {self.algorithm!r}"
            )
        if self.token_map is not None and self.algorithm != "eagle":
            raise ValueError(
                "speculative_token_map is used by speculative_algorithm eagle only (an EAGLE-3"
                f" head carries its own vocabulary), got speculative_algorithm {self.algorithm!r}"
            )
        if self.draft_kv_tokens is not None and self.draft_kv_tokens <= 0:
            bad("draft_kv_tokens", "must be positive")
        if self.eagle_topk is not None and self.eagle_topk < 1:
            bad("eagle_topk", "must be >= 1")
        if (
            self.eagle_topk is not None
            and self.eagle_topk > 1
            and self.source_info.topk == 1
            and not self.is_eagle
        ):
            bad(
                "eagle_topk",
                f"must be 1 for speculative_algorithm {self.algorithm} (it drafts chains)",
            )
        if self.num_steps is not None and self.num_steps < 1:
            bad("num_steps", "must be >= 1")

    @property
    def tree_shape(self) -> TreeShape:
        """The widest and deepest draft trees (the controller narrows them per step)."""
        eagle_steps = self.source_info.num_steps or EAGLE_NUM_STEPS
        depth = self.num_steps or (eagle_steps if self.is_eagle else self.num_draft_tokens)
        return TreeShape(self.eagle_topk or self.source_info.topk, depth)

    @classmethod
    def from_server_args(cls, args: ServerArgs) -> SpeculativeConfig | None:
        """None when speculative decoding is off (no --speculative-algorithm)."""
        if args.speculative_algorithm is None:
            for name in ("speculative_draft_model_path", "speculative_token_map"):
                if getattr(args, name):
                    raise ValueError(
                        f"{name} needs --speculative-algorithm (it is used by {_path_users()}),"
                        " got speculative_algorithm None"
                    )
            return None
        algorithm = args.speculative_algorithm
        if algorithm == "eagle" and not args.speculative_draft_model_path and _has_mtp(args):
            algorithm = "nextn"  # SGLang's EAGLE on a model with its own heads drafts with them
        source = DRAFT_SOURCE_REGISTRY.meta(algorithm)  # an unknown name: raises
        if source.eagle:
            _check_eagle_args(args)
        num_draft_tokens = args.speculative_num_draft_tokens
        if num_draft_tokens is None:
            num_draft_tokens = source.num_draft_tokens
        return cls(
            algorithm,
            num_draft_tokens,
            args.speculative_draft_policy,
            args.speculative_ngram_min_match_window_size,
            args.speculative_ngram_max_match_window_size,
            args.speculative_suffix_index_tokens,
            args.speculative_draft_model_path,
            args.speculative_draft_kv_tokens,
            args.max_prefill_tokens,
            args.enable_invariant_checks,
            args.speculative_eagle_topk,
            args.speculative_num_steps,
            args.speculative_token_map,
        )


def _has_mtp(args: ServerArgs) -> bool:
    """Whether the model's config announces multi-token-prediction layers (its header only)."""
    from radixlm.model.loader import load_model_config

    if not args.model_path:
        return False  # the default model has none
    try:
        config = load_model_config(args.model_path)
    except (OSError, ValueError):
        return False  # the model's own loading names what is wrong with it
    return bool(getattr(config, "num_nextn_predict_layers", 0))


def _check_eagle_args(args: ServerArgs) -> None:
    """What an EAGLE head cannot run with yet: it reads the target's whole embedding and LM head and
    its hidden states in this process, from every forward."""
    refused = {
        "tp_size": args.tp_size > 1,
        "pp_size": args.pp_size > 1,
        "enable_torch_compile": args.enable_torch_compile,
        "is_embedding": args.is_embedding,
    }
    for name, on in refused.items():
        if on:
            raise ValueError(
                f"speculative_algorithm {args.speculative_algorithm} is not supported with {name}"
                f" {getattr(args, name)!r} yet (the draft head reads the whole target's hidden"
                " states, embedding and LM head in one process, from every forward)"
            )
