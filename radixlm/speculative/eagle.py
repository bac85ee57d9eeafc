"""Drafts from an EAGLE / EAGLE-3 head (SGLang's EAGLE and EAGLE3 speculative algorithms), or
from the model's own multi-token-prediction layer (SGLang's NEXTN: mtp_head.py, the same contract).

The head (eagle_head.py) predicts the target's next hidden state from the target's own hidden
states, which the runner hands over from every forward (EagleCapture: no extra pass). Position t of
the head's sequence reads the token at t + 1 and the target's features at t; its output predicts
the features at t + 1, and through the LM head the token at t + 2.

A proposal, for the requests the controller asks to draft (one batch for all of them):
  1. catch up: the positions the target computed since the last proposal (a prefill, a decode step,
     the accepted part of a verified draft) run through the head in one extend, each request's rows
     attending its committed head KV and each other causally; their K/V go to the head's pool at the
     target's slots (eagle_attention.py), so a prefix the radix tree hands to a later request brings
     the head's KV with it. The last row's output is the root's: it ranks the first draft tokens.
  2. expand (EAGLE-2): up to --speculative-num-steps levels; at each, the head runs on the level's
     best --speculative-eagle-topk nodes per request (by the product of their draft probabilities
     along the path), each giving its top-k children. The tree is then the k best nodes of all those
     ranked (k: the controller's budget for the request), siblings best first. With topk 1 it is the
     head's greedy chain.
The head's KV of positions a request no longer has (rejected drafts, a rewrite by jump-forward) is
recomputed where the request's tokens changed; positions whose target features were never seen (a
rewrite past the last capture, a request idle for MAX_ROWS_PER_REQUEST rows) read zeros: only the
drafts' quality suffers, verification keeps outputs exact.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from radixlm.speculative.draft_source import Draft, DraftReq, DraftSourceBase
from radixlm.speculative.draft_tree import CHAIN, ROOT, DraftTree, TreeShape
from radixlm.speculative.eagle_attention import HeadKVPool, ProposalAttention, RequestKV
from radixlm.speculative.eagle_capture import EagleCapture
from radixlm.speculative.eagle_checkpoint import head_summary, load_eagle_head, load_token_map
from radixlm.speculative.eagle_vocab import DraftVocab, own_vocab, target_vocab
from radixlm.utils import common_prefix_len

if TYPE_CHECKING:
    from radixlm.model.executor.runner import ModelRunner
    from radixlm.speculative.config import SpeculativeConfig

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _State:
    req: DraftReq
    # the target's request row, and its generation (a retracted request comes back in another)
    row: int
    gen: int
    ids: list[int] = field(default_factory=list)  # the request's tokens when last caught up
    done: int = 0  # positions [0, done) hold the head's KV


@dataclass(eq=False)
class _Node:
    token: int
    parent: int  # index in the request's node list, ROOT for the first level
    score: float  # log-probability of the path
    depth: int
    hidden: torch.Tensor | None = None  # the head's next-state output at the parent's row


@dataclass(eq=False)
class _Work:
    st: _State
    k: int  # most nodes
    depth: int  # most levels
    ids: torch.Tensor  # catch-up rows: the token at t + 1 ...
    hidden: torch.Tensor  # ... the target's features at t
    positions: torch.Tensor
    slots: torch.Tensor  # their KV slots
    prefix_slots: torch.Tensor  # committed positions before them
    tokens: torch.Tensor  # the request's tokens (prompt + output)
    kv: RequestKV | None = None
    nodes: list[_Node] = field(default_factory=list)
    frontier: list[int] = field(default_factory=list)


class EagleDraftSource(DraftSourceBase):
    cheap = False  # a proposal is a forward of the head
    drafts_from_tokens = False  # ... on the target's features of the request's last token

    def __init__(self, config: SpeculativeConfig, runner: ModelRunner):
        kind = config.algorithm
        target, hidden_size = runner.model, runner.hf_config.hidden_size
        if config.is_mtp:  # the model's own MTP layer (mtp_head.py), loaded from its file
            from radixlm.speculative.mtp_checkpoint import load_mtp_head

            self.head = load_mtp_head(runner, kind)
        else:
            self.head = load_eagle_head(
                config.draft_model_path, kind, runner.vocab_size, hidden_size
            ).to(runner.device)
        cfg = self.head.cfg
        # Beside quantized target weights (the native kernels) the head runs in Q8_0 too: a draft
        # step reads all its weights for a row or two, and reads a quarter of float32's bytes then.
        quantize = "q8_0" if runner.loaded.quantization != "none" else None
        self.head.for_serving(quantize)
        aux = cfg.capture_layers(runner.num_layers) if kind == "eagle3" else ()
        features = 3 * hidden_size if kind == "eagle3" else hidden_size
        self.capture = EagleCapture(runner.req_to_token_pool, features, aux)
        runner.set_hidden_capture(self.capture)
        self.req_to_token_pool = runner.req_to_token_pool
        kv_dtype = runner.kv_dtype if runner.kv_dtype.is_floating_point else torch.float16
        self.kv_pool = HeadKVPool(
            runner.token_to_kv_pool.size,
            cfg.num_layers,
            cfg.num_kv_heads,
            cfg.head_dim,
            kv_dtype,
            runner.device,
        )
        self.embed = target.model.embed_tokens
        token_map = (
            load_token_map(config.token_map, runner.vocab_size) if config.token_map else None
        )
        self.vocab: DraftVocab = (
            own_vocab(self.head.lm_head, self.head.draft_token_ids(), quantize)
            if self.head.own_vocab
            else target_vocab(target, token_map, hidden_size, quantize)
        )
        self.max_shape = config.tree_shape  # the controller narrows it per step
        self.topk = (
            self.max_shape.width
        )  # this proposal's width (propose sets it from the step's shape)
        self.check_invariants = config.check_invariants
        self.missing_rows = (
            0  # catch-up rows whose target features were not captured (zeros instead)
        )
        self._states: dict[str, _State] = {}
        # chained MTP heads (mtp_head.py): level k runs head k, each with its own KV layer
        self.chained = getattr(self.head, "num_chained", 1)
        logger.info(
            "%s, up to %d levels x top-%d, weights %s; head KV %.1f MiB (%s)",
            head_summary(self.head, token_map),
            self.max_shape.depth,
            self.max_shape.width,
            quantize or "float",
            self.kv_pool.total_bytes / 2**20,
            str(kv_dtype).replace("torch.", ""),
        )

    # ------------------------------------------------------------------ DraftSource
    def propose(self, reqs: list[DraftReq], ks: list[int], shape: TreeShape = CHAIN) -> list[Draft]:
        running = {id(r) for r in reqs}
        for st in [
            s for s in self._states.values() if s.req.finished() and id(s.req) not in running
        ]:
            self._forget(st)
        out: list[Draft] = [[] for _ in reqs]
        self.topk = max(1, min(shape.width, self.max_shape.width))
        depth = max(1, min(shape.depth, self.max_shape.depth))
        if self.chained > 1:  # one level per head (llama.cpp caps its drafts there too)
            depth = min(depth, self.chained)
        work = [
            (i, w)
            for i, (r, k) in enumerate(zip(reqs, ks))
            if k > 0
            for w in [self._plan(r, k, depth)]
            if w
        ]
        if not work:
            return out
        try:
            with torch.inference_mode():
                trees = self._draft([w for _, w in work])
        except Exception:
            if self.check_invariants:
                raise
            # Drafts only buy speed: the target decodes on; these requests' head KV starts over.
            logger.exception("EAGLE head forward failed: no drafts this step")
            for _, w in work:
                self._forget(w.st)
            return out
        for (i, _), tree in zip(work, trees):
            out[i] = tree
        return out

    def on_verified(
        self, req: DraftReq, tree: DraftTree, accepted: list[int], rows: list[int]
    ) -> None:
        if req.req_pool_idx is not None:
            self.capture.add_accepted(req.req_pool_idx, rows)

    def release(self, req: DraftReq) -> None:
        st = self._states.get(req.rid)
        if st is not None and st.req is req:
            self._forget(st)

    def _forget(self, st: _State) -> None:
        self._states.pop(st.req.rid, None)
        if self.req_to_token_pool.generation[st.row] == st.gen:
            self.capture.drop(st.row)

    # ------------------------------------------------------------------ planning
    def _plan(self, req: DraftReq, k: int, depth: int) -> _Work | None:
        """The positions req's head KV lacks (the target computed them since), with their
        features."""
        row = req.req_pool_idx
        if row is None:
            return None
        gen, tokens = self.req_to_token_pool.generation[row], req.all_ids()
        st = self._states.get(req.rid)
        first = self.capture.first_position(row)
        if st is None or st.req is not req or (st.row, st.gen) != (row, gen):
            # Positions before the first the target computed for it came from the radix tree, with
            # the head's KV some earlier request wrote there.
            st = self._states[req.rid] = _State(
                req, row, gen, done=len(tokens) - 1 if first is None else first
            )
        else:
            # The head's KV at t read the token at t + 1: valid while tokens up to t + 1 are
            # unchanged.
            st.done = min(st.done, max(common_prefix_len(st.ids, tokens) - 1, 0))
            if first is not None:
                st.done = min(st.done, first)  # the target recomputed from there (a re-prefill)
        lo, hi = st.done, len(tokens) - 1
        if hi <= lo:
            return None  # nothing new since the last proposal: no root to draft from
        ids = torch.tensor(tokens, dtype=torch.int64)
        hidden, found = self.capture.take(row, ids, lo, hi)
        self.missing_rows += (hi - lo) - found
        st.ids, st.done = tokens, hi
        r2t = self.req_to_token_pool.req_to_token
        device = self.kv_pool.k[0].device
        return _Work(
            st,
            k,
            min(k, depth),
            ids[lo + 1 : hi + 1].to(device),
            hidden.to(device),
            torch.arange(lo, hi, device=device),
            r2t[row, lo:hi].to(device),
            r2t[row, :lo].to(device),
            ids,
        )

    # ------------------------------------------------------------------ forwards
    def _draft(self, work: list[_Work]) -> list[DraftTree]:
        attn = ProposalAttention(self.kv_pool, self.head.cfg.head_dim**-0.5)
        for w in work:
            levels = max(w.depth - 1, 0)
            # chained heads recompute a node's ancestors under each level's head
            nodes = levels * (levels + 1) // 2 if self.chained > 1 else levels
            w.kv = attn.add_request(w.prefix_slots, w.tokens, w.ids.numel(), self.topk * nodes)
        # 1. catch-up: every request's new rows in one forward; the last row of each is its root.
        attn.set_batch(
            [(w.kv, w.ids.numel(), None) for w in work],
            [w.slots for w in work],
            [torch.stack([w.positions, w.ids], dim=1) for w in work],
        )
        rows_in = (
            self.embed(torch.cat([w.ids for w in work])).float(),
            torch.cat([w.hidden for w in work]),
            torch.cat([w.positions for w in work]),
        )
        logit_h, next_h = self.head(*rows_in, attn, from_target=True)
        for h in range(1, self.chained):  # every chained head's KV of these rows, from the target's
            self.head(*rows_in, attn, from_target=True, head=h)
        ends = torch.tensor([w.ids.numel() for w in work]).cumsum(0) - 1
        self._expand(work, [None] * len(work), logit_h[ends], next_h[ends])
        # 2. levels 2..depth: the head on each request's frontier.
        for level in range(2, max(w.depth for w in work) + 1):
            active = [w for w in work if w.depth >= level and w.frontier]
            if not active:
                break
            if self.chained > 1:
                self._chained_level(attn, active, level)
                continue
            parts, ids, hidden, positions, rows = [], [], [], [], []
            for w in active:
                base = w.kv.used
                sees = [[w.kv.node_entry[a] for a in self._ancestors(w, n)] for n in w.frontier]
                parts.append((w.kv, len(w.frontier), sees))
                for i, n in enumerate(w.frontier):
                    node = w.nodes[n]
                    ids.append(node.token)
                    hidden.append(node.hidden)
                    positions.append(
                        int(w.positions[-1]) + level - 1
                    )  # a depth-d node sits d after the root's row
                    w.kv.node_entry[n] = base + i
                rows.append(list(w.frontier))
            empty = torch.empty(0, dtype=torch.int64)
            attn.set_batch(parts, [empty] * len(active))
            device = self.kv_pool.k[0].device
            logit_h, next_h = self.head(
                self.embed(torch.tensor(ids, device=device)).float(),
                torch.stack(hidden),
                torch.tensor(positions, device=device),
                attn,
                from_target=False,
            )
            self._expand(active, rows, logit_h, next_h)
        return [self._tree(w) for w in work]

    def _chained_level(self, attn: ProposalAttention, active: list[_Work], level: int) -> None:
        """Level `level` under head level - 1 (its own KV layer): its frontier's paths from the
        root run again under this head (each node from its stored inputs: its token, the state
        its parent's row gave), as llama.cpp's chained heads re-add the draft before each step;
        only the frontier's rows expand."""
        head = level - 1
        parts, ids, hidden, positions, rows, keep = [], [], [], [], [], []
        for w in active:
            paths = {a for n in w.frontier for a in self._ancestors(w, n)}
            order = sorted(paths, key=lambda n: w.nodes[n].depth) + list(w.frontier)
            entry = {n: w.kv.used + i for i, n in enumerate(order)}
            parts.append(
                (w.kv, len(order), [[entry[a] for a in self._ancestors(w, n)] for n in order])
            )
            for n in order:
                node = w.nodes[n]
                ids.append(node.token)
                hidden.append(node.hidden)
                positions.append(int(w.positions[-1]) + node.depth)  # depth d: d after the root
            keep.extend(range(len(ids) - len(w.frontier), len(ids)))
            rows.append(list(w.frontier))
        empty = torch.empty(0, dtype=torch.int64)
        attn.set_batch(parts, [empty] * len(active), last_layer=head)
        device = self.kv_pool.k[0].device
        logit_h, next_h = self.head(
            self.embed(torch.tensor(ids, device=device)).float(),
            torch.stack(hidden),
            torch.tensor(positions, device=device),
            attn,
            from_target=False,
            head=head,
        )
        keep = torch.tensor(keep, device=device)
        self._expand(active, rows, logit_h[keep], next_h[keep])

    def _expand(
        self, work: list[_Work], parents: list, logit_h: torch.Tensor, next_h: torch.Tensor
    ) -> None:
        """Each row's top-k children become candidates; each request's next frontier is its best
        topk of them. parents[i]: the nodes whose rows request i had in this batch (None: its root
        row).
        """
        logits = self.vocab.logits(logit_h)
        if self.topk == 1:  # a chain: no scores to rank by
            cols = torch.argmax(logits, dim=-1, keepdim=True)
            tokens, scores = self.vocab.to_target(cols).tolist(), [[0.0]] * cols.shape[0]
        else:
            top = torch.topk(
                torch.log_softmax(logits, dim=-1), min(self.topk, logits.shape[-1]), dim=-1
            )
            tokens, scores = self.vocab.to_target(top.indices).tolist(), top.values.tolist()
        r = 0
        for w, rows in zip(work, parents):
            fresh = []
            for parent in rows if rows is not None else [ROOT]:
                base = 0.0 if parent == ROOT else w.nodes[parent].score
                depth = 1 if parent == ROOT else w.nodes[parent].depth + 1
                for tok, s in zip(tokens[r], scores[r]):
                    fresh.append(len(w.nodes))
                    w.nodes.append(_Node(tok, parent, base + s, depth, next_h[r]))
                r += 1
            fresh.sort(key=lambda n: -w.nodes[n].score)
            w.frontier = fresh[: self.topk]

    @staticmethod
    def _ancestors(w: _Work, n: int) -> list[int]:
        out = []
        n = w.nodes[n].parent
        while n != ROOT:
            out.append(n)
            n = w.nodes[n].parent
        return out

    @staticmethod
    def _tree(w: _Work) -> DraftTree:
        """The w.k most likely nodes (a parent is never less likely than its child, and comes first
        on a tie), ordered by level, siblings best first."""
        best = sorted(range(len(w.nodes)), key=lambda n: (-w.nodes[n].score, n))
        keep: set[int] = set()
        for n in best:
            if len(keep) == w.k:
                break
            if w.nodes[n].parent == ROOT or w.nodes[n].parent in keep:
                keep.add(n)
        order = sorted(keep, key=lambda n: (w.nodes[n].depth, -w.nodes[n].score, n))
        index = {ROOT: ROOT}
        for n in order:
            index[n] = len(index) - 1
        return DraftTree(
            tuple(w.nodes[n].token for n in order), tuple(index[w.nodes[n].parent] for n in order)
        )
