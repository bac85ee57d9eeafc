"""SpecController: which running requests draft how many tokens this step, and the counters.

A request drafts when the verifier can keep its output exact and cheap: no penalties and no
pending min_new_tokens ban (they change with every accepted token). A constrained request's draft
is cut where its grammar rejects (grammar.py; verification masks each row as decoding would). How
many tokens each drafts is a batch-level choice: draft token j of a request is worth the chance that
it and the j - 1 before it are accepted (its recent per-token acceptance rate to the power j); the
step costs what StepCostModel measured for that many rows. The controller adds draft tokens in order
of worth while they raise the expected tokens per second of the step, so drafting stops where it
does not pay: large batches (the step is already compute-bound), text where drafts keep failing,
slow hardware.

Classes. A source may tell what kind of draft a request would get now (DraftSource.draft_class:
the radix source's recorded answer under the request's own context, or a lookup's guess): each
class keeps its own global rate, and a request without a record of its own starts from its class's.
So a repeated call drafts its whole recorded answer in its first step (those are accepted nearly
always at temperature 0), while the lookups of new requests, right far less often, stay short.

Trees. The budget k of a request is then the most nodes its tree may have; a tree source spends it
on depth or on branches (draft_source.py). A node's worth is the chance that its whole path is
accepted: along the path, a first child counts its request's rate, a j-th child (j >= 1) the
measured rate at which j-th children are accepted when their parent is (global, learned from every
verified tree). Nodes worth less than MIN_WORTH are dropped, and the step's trees are at most as
wide (TreeShape.width, up to --speculative-eagle-topk) as the sibling ranks that are still worth
proposing, and as deep as the longest budget (up to --speculative-num-steps).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from radixlm.speculative.cost_model import PRIOR_ROW_SHARE, StepCostModel
from radixlm.speculative.draft_source import Draft, DraftReq, DraftSource
from radixlm.speculative.draft_tree import CHAIN, ROOT, DraftTree, TreeShape
from radixlm.speculative.grammar import cut_tree

ACCEPT_DECAY = (
    0.8  # a request's acceptance counts fade by this per verify step (recent behaviour counts)
)
IDLE_DECAY = (
    0.97  # ... and per step it does not draft: its estimate drifts back to its class's rate
)
PRIOR_WEIGHT = 2.0  # pseudo-trials of its class's rate in a request's estimate
INITIAL_RATE = 0.7  # a class's rate before anything was verified ...
CLASS_PRIOR_TRIALS = 2.0  # ... as this many pseudo-trials (a verify step brings tens of real ones)
MIN_WORTH = 0.05  # draft tokens less likely than this to be accepted are never proposed
# After this many steps in a row where drafts were possible but did not pay, one step drafts as
# the prior cost model would: a measurement taken during a transient slowdown must not turn
# speculation off for good.
PROBE_INTERVAL = 32
INITIAL_SIBLING_RATE = 0.2  # a j-th child's acceptance (j >= 1) before any was verified


@dataclass
class SpecStats:
    verify_steps: int = 0  # forwards that verified at least one draft
    draft_tokens: int = 0  # draft tokens sent to verification
    accepted_tokens: int = 0  # of them, accepted
    drafted_requests: int = 0  # request-steps that carried a draft
    tree_drafts: int = 0  # of them, drafts that branch (a node with several children)
    branch_accepted: int = 0  # accepted tokens that were not their parent's first child

    @property
    def accept_length(self) -> float:
        """Tokens emitted per drafted request per verify step (accepted drafts + the model's
        own)."""
        return (
            (self.accepted_tokens + self.drafted_requests) / self.drafted_requests
            if self.drafted_requests
            else 0.0
        )

    def as_dict(self) -> dict:
        return {
            "spec_verify_steps": self.verify_steps,
            "spec_draft_tokens": self.draft_tokens,
            "spec_accepted_tokens": self.accepted_tokens,
            "spec_accept_length": round(self.accept_length, 3),
            "spec_tree_drafts": self.tree_drafts,
            "spec_branch_accepted": self.branch_accepted,
        }


def tree_capacity(depth: int, width: int) -> int:
    """The most nodes a tree of `depth` levels with `width` children per node has (capped)."""
    total, level = 0, 1
    for _ in range(depth):
        level = min(level * width, 1 << 20)
        total = min(total + level, 1 << 20)
    return total


def as_tree(draft: Draft) -> DraftTree:
    return draft if isinstance(draft, DraftTree) else DraftTree.chain(draft)


class SpecController:
    def __init__(
        self,
        source: DraftSource,
        num_draft_tokens: int,
        policy: str = "adaptive",
        max_shape: TreeShape = CHAIN,
    ):
        """max_shape: the widest and deepest trees drafted (--speculative-eagle-topk,
        --speculative-num-steps); CHAIN: chains."""
        if num_draft_tokens < 1:
            raise ValueError(f"speculative_num_draft_tokens must be >= 1, got {num_draft_tokens}")
        self.source = source
        self.max_draft = num_draft_tokens
        self.max_shape = max_shape
        self.adaptive = policy != "fixed"
        if policy == "fixed":
            self.allocate = self.allocate_all
        self.stats = SpecStats()
        self.costs = StepCostModel()
        self._rates: dict[str, _Rate] = {}
        self._classes: dict[str, _Rate] = {}  # draft class -> its global rate
        self._class_of: dict[str, str] = {}  # rid -> the class of the draft it verifies this step
        self._propose_seconds = 0.0
        self._idle_steps = 0  # steps in a row with drafts possible and none chosen
        # A cheap source (a lookup, no forward) also drafts for requests that do not draft this
        # step: rid -> (output length then, its first draft token, its class), scored against the
        # token the step produces. So rates are learned where drafting is off (a large batch, a
        # new request), and drafting starts when they rise.
        self._shadow: dict[str, tuple[int, int, str]] = {}
        self._shadows = bool(getattr(source, "cheap", False))
        # Acceptance of a j-th child (j >= 1, index j - 1) when its parent was accepted.
        self._siblings = [
            _Rate(INITIAL_SIBLING_RATE * 10, 10.0) for _ in range(max_shape.width - 1)
        ]

    @staticmethod
    def can_draft(req: DraftReq) -> bool:
        sp = req.sampling_params
        # Verification takes the argmax of the model's logits (grammar-masked): what the sampler
        # would add to them (penalties, logit_bias, bans before min_new_tokens) rules drafting out.
        return (
            not sp.frequency_penalty
            and not sp.presence_penalty
            and sp.repetition_penalty == 1.0
            and not sp.logit_bias
            and len(req.output_ids) >= sp.min_new_tokens
            and not sp.uses_extra_samplers
        )  # typical_p, bad_words, allowed ids, DRY, XTC: not in verification

    def propose(self, reqs: list[DraftReq], spare_slots: int, context_len: int) -> list[DraftTree]:
        """Per request, the draft tree to verify with its next token (maybe empty). Uses at most
        spare_slots KV slots beyond one per request."""
        t0 = time.perf_counter()
        caps, depths, classes = [], [], []  # per request: most nodes, most levels, draft class
        for req in reqs:
            cap = depth = 0
            if self.can_draft(req):
                room = context_len - req.seqlen - 1  # a node's KV column, past the root's
                left = (
                    req.sampling_params.max_new_tokens - len(req.output_ids) - 1
                )  # room for the bonus token
                depth = max(0, min(left, room, self.max_shape.depth))
                cap = max(0, min(self.max_draft, room, tree_capacity(depth, self.max_shape.width)))
            caps.append(cap)
            depths.append(depth)
            classes.append(self.source.draft_class(req) if cap > 0 else "")
            shadow = self._shadow.pop(req.rid, None)
            if shadow is not None and cap > 0 and len(req.output_ids) > shadow[0]:
                self._learn(req.rid, int(req.output_ids[shadow[0]] == shadow[1]), 1, shadow[2])
        rates = [self.rate(r.rid, c) for r, c in zip(reqs, classes)]
        ks = self.allocate(rates, caps, spare_slots)
        if any(ks) or not any(caps):
            self._idle_steps = 0
        else:
            self._idle_steps += 1
            if self._idle_steps >= PROBE_INTERVAL:
                self._idle_steps = 0
                base = self.costs.cost(len(reqs))
                ks = self.allocate(
                    rates,
                    caps,
                    spare_slots,
                    lambda rows: base * (1 + PRIOR_ROW_SHARE * (rows - len(reqs))),
                )
        idle = [i for i, (k, cap) in enumerate(zip(ks, caps)) if k == 0 and cap > 0]
        if idle and self._shadows:
            for i, d in zip(
                idle, self.source.propose([reqs[i] for i in idle], [1] * len(idle), CHAIN)
            ):
                d = as_tree(d)
                if len(d):
                    self._shadow[reqs[i].rid] = (len(reqs[i].output_ids), d.tokens[0], classes[i])
        else:
            for i in idle:
                self._rates.setdefault(reqs[i].rid, _Rate()).fade(IDLE_DECAY)
        for r, k, c in zip(reqs, ks, classes):
            if k:
                self._class_of[r.rid] = c
        shape = self.shape(max((d for d, k in zip(depths, ks) if k), default=0))
        drafts = self.source.propose(reqs, ks, shape) if any(ks) else [[] for _ in reqs]
        trees = [
            self._fit(r, as_tree(d), k, TreeShape(shape.width, min(shape.depth, depth)), rate)
            for r, d, k, depth, rate in zip(reqs, drafts, ks, depths, rates)
        ]
        self._propose_seconds = time.perf_counter() - t0
        return trees

    def shape(self, depth: int) -> TreeShape:
        """This step's tree bounds: as wide as the sibling ranks still worth a node (up to
        max_shape.width), as deep as `depth` (up to max_shape.depth)."""
        width = 1
        while width < self.max_shape.width and (
            not self.adaptive or self._siblings[width - 1].value() >= MIN_WORTH
        ):
            width += 1
        return TreeShape(width, min(depth, self.max_shape.depth))

    def _fit(
        self, req: DraftReq, tree: DraftTree, k: int, shape: TreeShape, rate: float
    ) -> DraftTree:
        """tree within shape (the step's, no deeper than req's tokens left) and k nodes, without
        nodes worth less than MIN_WORTH (the adaptive policy), and cut where req's grammar
        rejects."""
        if not len(tree):
            return tree
        tree = tree.bounded(shape, k)
        if self.adaptive:
            worth: list[float] = []
            for p, r in zip(tree.parents, tree.ranks):
                worth.append(
                    (1.0 if p == ROOT else worth[p])
                    * (rate if r == 0 else self._siblings[r - 1].value())
                )
            if min(worth, default=1.0) < MIN_WORTH:
                tree = tree.select(i for i, w in enumerate(worth) if w >= MIN_WORTH)
        if len(tree) and req.grammar is not None:
            tree = cut_tree(req.grammar, tree)
        return tree

    def allocate(
        self, rates: list[float], caps: list[int], spare_slots: int, cost=None
    ) -> list[int]:
        """Draft lengths maximizing expected tokens per second of the step: request i's j-th
        draft token adds rates[i] ** j expected tokens and one row to the step. cost(rows): the
        step's seconds (default: the measured model)."""
        cost = cost or self.costs.cost
        worth = []
        for i, (a, cap) in enumerate(zip(rates, caps)):
            w = 1.0
            for _ in range(cap):
                w *= a
                if w < MIN_WORTH:
                    break
                worth.append((w, i))
        worth.sort(key=lambda x: -x[0])
        del worth[max(spare_slots, 0) :]
        bs = len(rates)
        best_n, best, total = 0, bs / cost(bs), float(bs)
        for n, (w, _) in enumerate(worth, 1):
            total += w
            rate = total / cost(bs + n)
            if rate > best:
                best_n, best = n, rate
        ks = [0] * bs
        for _, i in worth[:best_n]:
            ks[i] += 1
        return ks

    @staticmethod
    def allocate_all(rates: list[float], caps: list[int], spare_slots: int, cost=None) -> list[int]:
        """The fixed policy: every request its whole cap, while the KV room lasts."""
        ks = []
        for cap in caps:
            ks.append(min(cap, max(spare_slots, 0)))
            spare_slots -= ks[-1]
        return ks

    def rate(self, rid: str, draft_class: str = "") -> float:
        """Recent per-token acceptance of rid's drafts, pulled towards its draft class's global
        rate."""
        g = self._class_rate(draft_class).value()
        r = self._rates.get(rid)
        if r is None:
            return g
        return (r.accepted + PRIOR_WEIGHT * g) / (r.trials + PRIOR_WEIGHT)

    def on_step(self, rows: int, seconds: float) -> None:
        """A decode or verify step of `rows` query rows ran in `seconds` (forward + sampling +
        acceptance); this step's drafting time is added here."""
        self.costs.observe(rows, seconds + self._propose_seconds)
        self._propose_seconds = 0.0

    def on_verified(
        self, req: DraftReq, tree: DraftTree, path: list[int], kept: int, rows: list[int]
    ) -> None:
        """req's verify step accepted `path` of `tree` (the nodes the target agreed with) and kept
        its first `kept` nodes (fewer where a stop or a forced jump came first); rows: the forward's
        row of the root, then of each kept node. The source hears what was kept."""
        if not len(tree):
            return
        self.stats.draft_tokens += len(tree)
        self.stats.accepted_tokens += len(path)
        self.stats.drafted_requests += 1
        ranks = tree.ranks
        self.stats.tree_drafts += any(ranks)
        self.stats.branch_accepted += sum(ranks[n] > 0 for n in path)
        # Per level of the accepted path (and the level below its end): each child there was a
        # trial at its rank, a success where it is the accepted one. A chain's trials are every
        # accepted draft plus the first rejected one (the chain broke before the rest).
        kids: dict[int, list[int]] = {}
        for i, p in enumerate(tree.parents):
            kids.setdefault(p, []).append(i)
        first, first_trials, node = 0, 0, ROOT
        for nxt in path + [None]:
            for r, c in enumerate(kids.get(node, ())):
                if r == 0:
                    first += c == nxt
                    first_trials += 1
                elif r <= len(self._siblings):
                    self._siblings[r - 1].add(int(c == nxt), 1, 0.99)
            node = nxt
        self._learn(req.rid, first, first_trials, self._class_of.pop(req.rid, ""))
        self.source.on_verified(req, tree, path[:kept], rows[: kept + 1])

    def _learn(self, rid: str, accepted: int, trials: int, draft_class: str) -> None:
        self._rates.setdefault(rid, _Rate()).add(accepted, trials, ACCEPT_DECAY)
        self._class_rate(draft_class).add(accepted, trials, 0.99)

    def _class_rate(self, draft_class: str) -> _Rate:
        if draft_class not in self._classes:
            self._classes[draft_class] = _Rate(
                INITIAL_RATE * CLASS_PRIOR_TRIALS, CLASS_PRIOR_TRIALS
            )
        return self._classes[draft_class]

    def release(self, req: DraftReq) -> None:
        self._rates.pop(req.rid, None)
        self._shadow.pop(req.rid, None)
        self._class_of.pop(req.rid, None)
        self.source.release(req)


@dataclass
class _Rate:
    """Discounted counts of accepted draft tokens out of the tokens tried."""

    accepted: float = 0.0
    trials: float = 0.0

    def add(self, accepted: int, trials: int, decay: float) -> None:
        self.accepted = decay * self.accepted + accepted
        self.trials = decay * self.trials + trials

    def fade(self, decay: float) -> None:
        self.accepted *= decay
        self.trials *= decay

    def value(self) -> float:
        return self.accepted / self.trials if self.trials else INITIAL_RATE
