"""llama-server's slot files on the radix cache (/slots/{id}?action=save|restore, server/llama_slots
.py): save writes a prompt's cached prefix (its token ids and their KV, as the pool holds it) to a
file; restore reads one back into the pool and inserts it into the tree, so that the next request
with that prefix finds it cached.

A file is safetensors (no pickle: nothing in it runs on load): `token_ids`, `k`, `v` (and an int8
pool's `k_scale`, `v_scale`) as KVData lays them out ([layers, tokens, kv_heads, head_dim]), with
the model key (cache/storage.py: the weights, tokenizer and element type the KV depends on) and the
prefix's namespace in its metadata. A file of another model, layout or element type is refused.
Both run between steps, as admission does: the tree's KV is final, restore takes free slots.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from radixlm.cache.base_prefix_cache import PrefixKey
from radixlm.cache.kv_data import KVData, gather, scatter
from radixlm.ipc import SlotFileReqOutput, SlotRestoreReq, SlotSaveReq
from radixlm.scheduler.kv.cache_manager import CacheManager

SLOT_MESSAGES = (SlotSaveReq, SlotRestoreReq)
SLOT_REPLIES = {SlotSaveReq: SlotFileReqOutput, SlotRestoreReq: SlotFileReqOutput}
FORMAT = "radixlm-slot-1"
# The trees whose KV is the pool's alone (a hybrid's states, a windowed pool's slots are not saved).
_SUPPORTED = ("RadixCache", "HiRadixCache")
_NAMES = ("k", "v", "k_scale", "v_scale")


def _bufs(pool) -> tuple:
    return pool.k_buffer, pool.v_buffer, pool.k_scale_buffer, pool.v_scale_buffer


def handle_slot_message(
    msg, cm: CacheManager, model_key: Callable[[torch.dtype], str]
) -> SlotFileReqOutput:
    tree = cm.tree_cache
    if type(tree).__name__ not in _SUPPORTED:
        return SlotFileReqOutput(
            False, "slot files need the radix cache of an attention-only model"
        )
    try:
        if isinstance(msg, SlotSaveReq):
            return _save(msg, cm, model_key)
        return _restore(msg, cm, model_key)
    except OSError as e:  # the file: its name only, never the directory
        return SlotFileReqOutput(False, f"{os.path.basename(msg.path)}: {e.strerror or e}")


def _save(msg: SlotSaveReq, cm: CacheManager, model_key) -> SlotFileReqOutput:
    pool = cm.token_to_kv_pool
    match = cm.tree_cache.peek_prefix(PrefixKey(list(msg.token_ids), msg.cache_namespace))
    n = len(match.indices)
    if n == 0:
        return SlotFileReqOutput(False, "nothing of the slot's prompt is cached")
    data = gather(*_bufs(pool), match.indices, pool.dtype)
    tensors = dict(zip(_NAMES, (t.contiguous() for t in data.tensors())))
    tensors["token_ids"] = torch.tensor(msg.token_ids[:n], dtype=torch.int64)
    meta = {
        "format": FORMAT,
        "model_key": model_key(pool.dtype),
        "namespace": msg.cache_namespace or "",
    }
    # Written beside the target and renamed: a reader never sees half a file.
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(msg.path), suffix=".part")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=meta)
        os.replace(tmp, msg.path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return SlotFileReqOutput(True, n_tokens=n, n_bytes=os.path.getsize(msg.path))


def _restore(msg: SlotRestoreReq, cm: CacheManager, model_key) -> SlotFileReqOutput:
    pool = cm.token_to_kv_pool
    try:
        with safe_open(msg.path, framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                return SlotFileReqOutput(False, "not a slot file of this server")
            if meta.get("model_key") != model_key(pool.dtype):
                return SlotFileReqOutput(
                    False, "the slot file holds another model's KV (or another KV element type)"
                )
            names = set(f.keys())
            tensors = {k: f.get_tensor(k) for k in (*_NAMES, "token_ids") if k in names}
    except (ValueError, RuntimeError) as e:  # safetensors' refusal of a malformed file
        return SlotFileReqOutput(False, f"the slot file is not valid: {type(e).__name__}")
    ids = tensors.pop("token_ids", None)
    parts = [tensors.get(k) for k in _NAMES]
    if ids is None or parts[0] is None or parts[1] is None:
        return SlotFileReqOutput(False, "the slot file is not valid: tensors are missing")
    data = KVData(*parts)
    one = gather(*_bufs(pool), torch.zeros(1, dtype=torch.int64), pool.dtype)  # the layout
    want = [((t.shape[0], len(ids), *t.shape[2:]), t.dtype) for t in one.tensors()]
    if ids.dim() != 1 or [(tuple(t.shape), t.dtype) for t in data.tensors()] != want:
        return SlotFileReqOutput(False, "the slot file's KV does not fit this server's pool")
    token_ids = ids.tolist()
    slots = cm.alloc_kv(len(token_ids))
    if slots is None:
        return SlotFileReqOutput(False, "not enough free KV slots to restore the slot file")
    scatter(*_bufs(pool), slots, data)
    shared = cm.tree_cache.insert(PrefixKey(token_ids, meta.get("namespace") or None), slots)
    if shared:  # the tree already held the first `shared` tokens: these copies are ours to free
        pool.free(slots[:shared])
    return SlotFileReqOutput(
        True, n_tokens=len(token_ids), n_bytes=os.path.getsize(msg.path), token_ids=token_ids
    )
