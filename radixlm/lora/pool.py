"""LoRAPool: the adapter slots the batched compute reads, one pair of stacked buffers per target
layer.

For each target linear layer (the model's own modules: qkv_proj holds q/k/v, gate_up_proj gate/up)
A is [slots, parts * R, in] and B [slots, out, parts * R], R = --max-lora-rank: part p's A rows
and B columns are its rank block, zero-padded past the adapter's rank, and B's rows of the other
parts' outputs stay zero. So a fused layer's delta is one shrink (x A^T, every part at once) and
one expand (by B^T). A batch's adapters are copied into slots as it starts (acquire); when the
slots are full, an unpinned adapter the batch does not use leaves: the least recently used one
(lru) or the first loaded (fifo). Pinned adapters keep their slot until unloaded. On CPU the slots
are host memory, the memory the kernels read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from radixlm.lora.adapter import AdapterError, LoRAAdapter


@dataclass
class TargetLayer:
    name: str  # the model's module (model.layers.0.self_attn.qkv_proj)
    module: nn.Module
    parts: list[
        tuple[str, int, int]
    ]  # (HF projection, first output row, rows), in A's rank-block order
    A: torch.Tensor
    B: torch.Tensor

    def hf_path(self, part: str) -> str:
        return self.name.rsplit(".", 1)[0] + "." + part


def find_target_layers(
    model: nn.Module, targets: frozenset[str]
) -> list[tuple[str, nn.Module, list]]:
    """(module name, module, parts) of every linear layer holding a targeted HF projection: a fused
    layer (the model's stacked_params_mapping) holds its parts at its `offsets`, a plain one its
    own.
    """
    fused: dict[str, list[tuple[str, int]]] = {}
    for name, part, shard in getattr(model, "stacked_params_mapping", ()):
        fused.setdefault(name, []).append((part, shard))
    out = []
    for name, module in model.named_modules():
        last = name.rsplit(".", 1)[-1]
        if last in fused and hasattr(module, "offsets"):
            parts = [
                (p, module.offsets[s], module.output_sizes[s])
                for p, s in fused[last]
                if p in targets
            ]
        elif last in targets and hasattr(module, "out_features"):
            parts = [(last, 0, module.out_features)]
        else:
            continue
        if parts:
            out.append((name, module, parts))
    return out


class LoRAPool:
    def __init__(
        self,
        model: nn.Module,
        num_slots: int,
        max_rank: int,
        targets: frozenset[str],
        policy: str,
        dtype: torch.dtype,
        device: torch.device,
    ):
        self.num_slots, self.max_rank, self.targets, self.policy = (
            num_slots,
            max_rank,
            targets,
            policy,
        )
        self.layers: list[TargetLayer] = []
        for name, module, parts in find_target_layers(model, targets):
            width = len(parts) * max_rank
            a = torch.zeros(num_slots, width, module.in_features, dtype=dtype, device=device)
            b = torch.zeros(num_slots, module.out_features, width, dtype=dtype, device=device)
            self.layers.append(TargetLayer(name, module, parts, a, b))
        if not self.layers:
            raise ValueError(
                f"lora_target_modules {sorted(targets)}: the model has no such linear layer"
            )
        self._paths = {
            layer.hf_path(p[0]): (layer, i)
            for layer in self.layers
            for i, p in enumerate(layer.parts)
        }
        self.slot_uid: list[str | None] = [None] * num_slots
        self.pinned: set[str] = set()
        self._stamp = [0] * num_slots  # last use (lru) or load (fifo)
        self._clock = 0

    @property
    def nbytes(self) -> int:
        return sum(t.A.nbytes + t.B.nbytes for t in self.layers)

    def check(self, adapter: LoRAAdapter) -> None:
        """AdapterError unless every one of the adapter's tensors has a place here."""
        name = adapter.ref.lora_name
        if adapter.rank > self.max_rank:
            raise AdapterError(
                f"adapter {name!r} has rank {adapter.rank}, above max_lora_rank {self.max_rank}"
            )
        for path, (a, b) in adapter.weights.items():
            hit = self._paths.get(path)
            if hit is None:
                raise AdapterError(
                    f"adapter {name!r} targets {path}, which is not among lora_target_modules "
                    f"({', '.join(sorted(self.targets))}) of this model"
                )
            layer, i = hit
            _, _, rows = layer.parts[i]
            if a.shape[1] != layer.A.shape[2] or b.shape[0] != rows:
                raise AdapterError(
                    f"adapter {name!r}: {path} has lora_A {tuple(a.shape)} and lora_B"
                    f" {tuple(b.shape)}, the model's layer takes [r, {layer.A.shape[2]}] and"
                    f" [{rows}, r]"
                )

    def acquire(self, adapters: list[LoRAAdapter]) -> dict[str, int]:
        """The slot of each of this batch's adapters, copying in those not held (evicting
        others)."""
        self._clock += 1
        slots, needed = {}, {a.uid for a in adapters}
        for a in adapters:
            if a.uid in slots:
                continue
            if a.uid in self.slot_uid:
                slot = self.slot_uid.index(a.uid)
            else:
                slot = self._victim(needed)
                self._write(slot, a)
                self._stamp[slot] = self._clock
            if self.policy == "lru":
                self._stamp[slot] = self._clock
            slots[a.uid] = slot
        return slots

    def pin(self, adapter: LoRAAdapter) -> None:
        self.pinned.add(adapter.uid)
        self.acquire([adapter])

    def release(self, uid: str) -> None:
        self.pinned.discard(uid)
        if uid in self.slot_uid:
            self.slot_uid[self.slot_uid.index(uid)] = None

    def _victim(self, needed: set[str]) -> int:
        free = [i for i, u in enumerate(self.slot_uid) if u is None]
        if free:
            return free[0]
        movable = [
            i for i, u in enumerate(self.slot_uid) if u not in needed and u not in self.pinned
        ]
        if not movable:  # admission keeps a batch's adapters within the slots: a bug if reached
            raise RuntimeError(
                f"no LoRA slot free among {self.num_slots} (pinned {len(self.pinned)})"
            )
        return min(movable, key=lambda i: self._stamp[i])

    def _write(self, slot: int, adapter: LoRAAdapter) -> None:
        r, R = adapter.rank, self.max_rank
        for layer in self.layers:
            layer.A[slot].zero_()
            layer.B[slot].zero_()
            for i, (part, start, rows) in enumerate(layer.parts):
                ab = adapter.weights.get(layer.hf_path(part))
                if ab is not None:
                    layer.A[slot, i * R : i * R + r].copy_(ab[0])
                    layer.B[slot, start : start + rows, i * R : i * R + r].copy_(ab[1])
        self.slot_uid[slot] = adapter.uid
