"""TorchSDPABackend: torch.nn.functional.scaled_dot_product_attention over K/V gathered from the
pool; runs on any device, with the model's dtype as the KV dtype.

Extend requests attend one by one. A decode batch goes to the first of the backend's decode paths
that plans it (decode_path.py): shared-prefix decode (requests sharing a cached prefix attend to it
once per group), the decode KV mirror (a dense copy of the decoding requests' KV), the plain gather
from the pool. The flags the backend is built with choose which paths it has.

A model with sliding-window layers, attention logit soft-capping or attention sinks
(AttentionBackendSpec) gets the window in its masks and the soft-capped or sink layers an explicit
softmax (softcap.py); its decode batches all take the gather path (the shared-prefix and mirror
paths know none of these features).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from radixlm.cache.memory_pool import kv_dtype_name
from radixlm.model.layers.attention.base import AttentionBackend, AttentionBackendSpec
from radixlm.model.layers.attention.bidirectional import add_to_mask, bidirectional_spans
from radixlm.model.layers.attention.decode_kv_mirror_path import DecodeKVMirrorPath
from radixlm.model.layers.attention.decode_path import (
    DecodeBatch,
    DecodePath,
    DecodePlan,
    gather_kv,
)
from radixlm.model.layers.attention.gather_decode_path import GatherDecodePath
from radixlm.model.layers.attention.shared_prefix_decode_path import SharedPrefixDecodePath
from radixlm.model.layers.attention.softcap import softcap_attention

if TYPE_CHECKING:
    from radixlm.model.forward_batch import ForwardBatch


def supported(spec: AttentionBackendSpec) -> str | None:
    """None where TorchSDPABackend runs spec, else why not: SDPA reads K/V in the queries' dtype."""
    if spec.attention_chunk_size is not None:
        return "no chunked attention (Llama 4's: the native backend runs it)"
    if spec.kv_dtype != spec.dtype:
        return (
            f"kv_cache_dtype {kv_dtype_name(spec.kv_dtype)} differs from the model"
            " dtype and needs the native attention backend"
        )
    return None


@dataclass
class _ExtendReq:
    start: int  # first row of this request in q
    length: int  # new tokens
    kv_indices: torch.Tensor | None  # [prefix + new] pool slots; None: no prefix
    mask: torch.Tensor | None  # [new, prefix + new] causal mask offset by the prefix
    # The windowed layers' mask (the causal one less the keys out of each query's window); None
    # where the window covers every key (the backend has no window, or the request is shorter).
    window_mask: torch.Tensor | None = None


@dataclass
class SDPAMetadata:
    extend: list[_ExtendReq] = field(default_factory=list)
    decode: DecodePlan | None = None  # the decode rows' plan (DECODE, or a MIXED batch's tail)
    # Plans of paths that let go of their kept KV for this batch: begin_forward runs them first.
    releases: list[DecodePlan] = field(default_factory=list)


def build_decode_paths(
    shared_prefix: bool = True,
    mirror_bytes: int = 0,
    sliding_window_size: int | None = None,
    logit_cap: float = 0.0,
    sinks: bool = False,
) -> list[DecodePath]:
    """The decode paths the flags enable, in the order they are tried; the gather serves any batch.
    The kept shared-prefix K/V and the mirror share the mirror's byte budget. A model with a window,
    a logit cap or sinks takes the gather path only."""
    paths: list[DecodePath] = []
    plain = sliding_window_size is None and not logit_cap and not sinks
    if shared_prefix and plain:
        paths.append(SharedPrefixDecodePath(max_kept_bytes=mirror_bytes))
    if mirror_bytes > 0 and plain:
        paths.append(DecodeKVMirrorPath(mirror_bytes))
    paths.append(GatherDecodePath(sliding_window_size))
    return paths


class TorchSDPABackend(AttentionBackend):
    """SDPA per extend request, one decode path per decode batch (see the module docstring)."""

    supports_bidirectional_spans = True

    def __init__(
        self,
        shared_prefix: bool = True,
        mirror_bytes: int = 0,
        sliding_window_size: int | None = None,
        logit_cap: float = 0.0,
        sinks: bool = False,
    ):
        self.sliding_window_size, self.logit_cap = sliding_window_size, logit_cap
        self.sinks = sinks
        self.decode_paths = build_decode_paths(
            shared_prefix, mirror_bytes, sliding_window_size, logit_cap, sinks
        )

    @classmethod
    def for_spec(cls, spec: AttentionBackendSpec) -> TorchSDPABackend:
        return cls(
            shared_prefix=spec.shared_prefix,
            mirror_bytes=spec.mirror_bytes,
            sliding_window_size=spec.sliding_window_size,
            logit_cap=spec.logit_cap,
            sinks=spec.sinks,
        )

    def _check_layer(self, layer) -> None:
        # A layer feature the backend was not built for would be silently ignored by its
        # masks/paths.
        if (
            layer.sliding_window_size not in (None, self.sliding_window_size)
            or (layer.logit_cap and not self.logit_cap)
            or (layer.sinks is not None and not self.sinks)
        ):
            raise ValueError(
                f"layer {layer.layer_id} (sliding_window_size {layer.sliding_window_size},"
                f" logit_cap {layer.logit_cap}, sinks {layer.sinks is not None}) needs a"
                " TorchSDPABackend built for them (TorchSDPABackend.for_spec)"
            )

    def reset(self) -> None:
        for path in self.decode_paths:
            path.reset()

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        fb = forward_batch
        md = fb.attn_metadata = SDPAMetadata()
        req_to_token = fb.req_to_token_pool.req_to_token
        seq_lens = fb.seq_lens_cpu or fb.seq_lens.tolist()
        if fb.batch_size == 0:
            return
        if fb.forward_mode.is_decode():
            self._plan_decode(md, fb, fb.req_pool_indices, fb.seq_lens, seq_lens)
            return
        n_ext = fb.batch_size - fb.num_decode
        if fb.num_decode:  # MIXED: the decode tail goes through the batched decode path
            self._plan_decode(
                md, fb, fb.req_pool_indices[n_ext:], fb.seq_lens[n_ext:], seq_lens[n_ext:]
            )
        if n_ext == 0:
            return
        seq_lens = seq_lens[:n_ext]
        prefix_lens = (fb.extend_prefix_lens_cpu or [0] * fb.batch_size)[:n_ext]
        extend_lens = (
            fb.extend_seq_lens_cpu[:n_ext]
            if fb.extend_seq_lens_cpu
            else [s - p for s, p in zip(seq_lens, prefix_lens)]
        )
        device = fb.out_cache_loc.device
        rows = (
            req_to_token[fb.req_pool_indices[:n_ext], : max(seq_lens)] if any(prefix_lens) else None
        )
        window, tree = self.sliding_window_size, fb.tree_mask
        spans = bidirectional_spans(fb) if fb.mm_inputs else []
        start = 0
        for i, (p, e) in enumerate(zip(prefix_lens, extend_lens)):
            req = _ExtendReq(start, e, None if p == 0 else rows[i, : p + e], None)
            own = [s for s in spans if s.req == i]
            if tree is not None and not tree.is_causal(i):
                req.mask, req.window_mask = tree.extend_masks(i, p, window, device)
            elif own:  # images whose tokens attend each other both ways (Gemma 3)
                pos_k = torch.arange(p + e, device=device)
                causal = pos_k[None, :] <= torch.arange(p, p + e, device=device)[:, None]
                req.mask, req.window_mask = add_to_mask(causal, own, p, window)
            elif p or (window is not None and p + e > window):
                pos_k = torch.arange(p + e, device=device)
                pos_q = torch.arange(p, p + e, device=device)
                causal = pos_k[None, :] <= pos_q[:, None]
                req.mask = causal if p else None  # no prefix: SDPA's is_causal
                if window is not None and p + e > window:  # the last query's window misses a key
                    req.window_mask = causal & (pos_k[None, :] > pos_q[:, None] - window)
            md.extend.append(req)
            start += e

    def _plan_decode(
        self,
        md: SDPAMetadata,
        fb: ForwardBatch,
        req_pool_indices,
        seq_lens_t,
        seq_lens: list[int],
    ) -> None:
        kv_indices = fb.req_to_token_pool.req_to_token[req_pool_indices, : max(seq_lens)]
        batch = DecodeBatch(
            req_pool_indices,
            seq_lens_t,
            seq_lens,
            kv_indices,
            fb.req_to_token_pool,
            fb.token_to_kv_pool,
        )
        for path in self.decode_paths:
            plan = path.plan(batch)
            if plan is not None:
                break
            # KV is kept across steps for a run of batches its path serves: this one ends the run.
            self._release(md, path)
        else:
            raise AssertionError(f"no decode path serves the batch: {self.decode_paths}")
        if (
            plan.claims_kv_budget
        ):  # one budget for every kept copy: the other paths let go of theirs
            for other in self.decode_paths:
                if other is not path:
                    self._release(md, other)
        md.decode = plan

    @staticmethod
    def _release(md: SDPAMetadata, path: DecodePath) -> None:
        plan = path.release()
        if plan is not None:
            md.releases.append(plan)

    def begin_forward(self, forward_batch: ForwardBatch) -> None:
        super().begin_forward(forward_batch)
        md, pool = forward_batch.attn_metadata, forward_batch.token_to_kv_pool
        for plan in md.releases:  # memory goes before the batch's own path takes any
            plan.path.begin_forward(plan, pool)
        if md.decode is not None:
            md.decode.path.begin_forward(md.decode, pool)

    def forward_extend(self, q, k, v, layer, forward_batch):
        self._check_layer(layer)
        k_buf, v_buf = forward_batch.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        out = torch.empty_like(q)
        if forward_batch.num_decode:  # MIXED: the last num_decode rows are decode queries
            t = q.shape[0] - forward_batch.num_decode
            out[t:] = self.forward_decode(q[t:], k[t:], v[t:], layer, forward_batch)
        for r in forward_batch.attn_metadata.extend:  # per request: prompts of different lengths
            s, e = r.start, r.start + r.length
            if r.kv_indices is None:  # no prefix: this request's K/V are the new ones
                ki, vi = k[s:e], v[s:e]
            else:
                ki, vi = gather_kv(k_buf, r.kv_indices), gather_kv(v_buf, r.kv_indices)
            mask = (
                r.window_mask
                if layer.sliding_window_size is not None and r.window_mask is not None
                else r.mask
            )
            if layer.logit_cap or layer.sinks is not None:
                out[s:e] = self._softcap_extend(q[s:e], ki, vi, mask, layer)
                continue
            o = F.scaled_dot_product_attention(
                q[s:e].transpose(0, 1).unsqueeze(0),
                ki.transpose(0, 1).unsqueeze(0),
                vi.transpose(0, 1).unsqueeze(0),
                attn_mask=mask,
                is_causal=mask is None,
                scale=layer.scaling,
                enable_gqa=True,
            )
            out[s:e] = o[0].transpose(0, 1)
        return out

    @staticmethod
    def _softcap_extend(q, k, v, mask, layer) -> torch.Tensor:
        """One request: q [n, heads, D] over k/v [L, kv_heads, D] (mask [n, L], None: causal, L ==
        n)."""
        n, heads, d = q.shape
        kvh = k.shape[1]
        if mask is None:
            mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril_()
        qg = q.transpose(0, 1).reshape(kvh, heads // kvh, n, d)  # each KV head's query heads
        sinks = None if layer.sinks is None else layer.sinks.view(kvh, heads // kvh, 1, 1)
        o = softcap_attention(
            qg,
            k.transpose(0, 1).unsqueeze(1),
            v.transpose(0, 1).unsqueeze(1),
            mask,
            layer.scaling,
            layer.logit_cap,
            sinks,
        )
        return o.reshape(heads, n, d).transpose(0, 1)

    def forward_decode(self, q, k, v, layer, forward_batch):
        self._check_layer(layer)
        plan = forward_batch.attn_metadata.decode
        if plan is None:  # empty batch
            return torch.empty_like(q)
        return plan.path.forward(q, k, v, layer, plan, forward_batch.token_to_kv_pool)
