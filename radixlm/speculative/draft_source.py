"""DraftSource: what proposes draft tokens for a running request.

A source sees the request (its tokens, prompt + output, and where it sits in the radix tree) and
returns up to `k` tokens it expects the model to produce next: a chain (a list of token ids), or a
DraftTree (draft_tree.py) where it has several candidates (the radix tree's recorded branches,
prompt lookup's several earlier continuations, a draft head's top-k). Proposals cost no forward of
the target model; a wrong one costs only the verify step's extra query rows, and the verifier keeps
the output distribution exact.

After the verify step the source hears what happened (on_verified): which nodes of its tree the
request kept and where they sat in the verify forward, so a source that reads the target's hidden
states (EAGLE) can take the accepted rows' states from that forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from radixlm.ipc import FinishReason
from radixlm.sampling_params import SamplingParams
from radixlm.speculative.draft_tree import CHAIN, DraftTree, TreeShape

if TYPE_CHECKING:
    from radixlm.cache.base_prefix_cache import BasePrefixCache
    from radixlm.model.executor.runner import ModelRunner
    from radixlm.model.executor.runner_config import ModelRunnerConfig

Draft = Sequence[int] | DraftTree  # a chain, or a tree


class DraftReq(Protocol):
    """What a draft source may read of a running request (the scheduler's Req has it all)."""

    rid: str
    req_pool_idx: int | None  # its row of the target's ReqToTokenPool (None: not running)
    origin_input_ids: list[int]
    output_ids: list[int]
    sampling_params: SamplingParams
    grammar: Any  # its grammar matcher, or None
    last_node: Any  # the prefix-cache node it holds (None: none)
    cache_protected_len: int  # tokens of its prefix held in the prefix cache
    cache_namespace: str | None
    finished_reason: FinishReason | None

    @property
    def seqlen(self) -> int: ...

    def all_ids(self) -> list[int]: ...

    def finished(self) -> bool: ...


@dataclass(frozen=True)
class DraftTarget:
    """What a source is built over (its registry entry is called as factory(config, target)): the
    target's prefix cache, KV capacity, runner options and vocabulary size (a draft model runs with
    the options and must match the vocabulary), and the target's runner itself (an EAGLE head reads
    its hidden states, embedding and LM head)."""

    tree_cache: BasePrefixCache
    kv_pool_size: int
    runner_config: ModelRunnerConfig
    vocab_size: int
    runner: ModelRunner | None = None


class DraftSource(Protocol):
    # True where proposing costs no forward (a lookup): the controller then also drafts for
    # requests it does not verify this step, to learn their acceptance rates for free.
    cheap: bool
    # True where a request's draft needs only its tokens: its one-token prefill may then be the root
    # of its first verify step (scheduler/decoding/prefill_fold.py). EAGLE's head also needs the
    # target's features of the prompt's last token, which that prefill computes.
    drafts_from_tokens: bool

    def propose(self, reqs: list[DraftReq], ks: list[int], shape: TreeShape = CHAIN) -> list[Draft]:
        """Per request, at most ks[i] draft tokens (tree nodes) to follow its tokens (prompt +
        output so far); ks[i] == 0: none. A tree source keeps within shape (children per node,
        levels); the controller cuts every draft to it, so a chain source may ignore it. One call
        per step, so a source that runs a model batches it."""
        ...

    def draft_class(self, req: DraftReq) -> str:
        """The kind of draft req would get now, for acceptance rates learned per kind (a request
        with no record of its own starts from its kind's): a recorded answer, a lookup's guess. A
        cheap call (once per drafting request per step); the default: one kind, ""."""
        ...

    def on_verified(
        self, req: DraftReq, tree: DraftTree, accepted: list[int], rows: list[int]
    ) -> None:
        """The verify step checked `tree` (as the controller sent it: cut and bounded, a chain as a
        DraftTree.chain) for req and req kept `accepted`: node indices of tree, root excluded, in
        path order (its output grew by their tokens, then the target's own next token; they are
        the nodes whose KV the request keeps). rows[0] is the verify forward's row (an index into
        the step's input_ids, positions and hidden states) of the root, the request's next input,
        and rows[1 + j] that of accepted[j]. Called once per drafted request per verify step,
        before release; the default does nothing."""
        ...

    def release(self, req: DraftReq) -> None:
        """The request finished or left: drop (or learn from) what the source keeps for it."""
        ...


class DraftSourceBase:
    """The protocol's defaults: not cheap, drafts from tokens, one draft class, a no-op on_verified
    and release."""

    cheap = False
    drafts_from_tokens = True

    def draft_class(self, req: DraftReq) -> str:
        return ""

    def on_verified(
        self, req: DraftReq, tree: DraftTree, accepted: list[int], rows: list[int]
    ) -> None:
        pass

    def release(self, req: DraftReq) -> None:
        pass


class PerRequestDraftSource(DraftSourceBase):
    """A source whose drafts come one request at a time (lookups, no forward)."""

    cheap = True  # drafting costs next to nothing: the controller may draft to learn rates

    def propose(self, reqs: list[DraftReq], ks: list[int], shape: TreeShape = CHAIN) -> list[Draft]:
        return [self.draft_for(r, k, shape) if k > 0 else [] for r, k in zip(reqs, ks)]

    def draft_for(self, req: DraftReq, k: int, shape: TreeShape = CHAIN) -> Draft:
        raise NotImplementedError
