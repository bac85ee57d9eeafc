"""How a LoRA target layer adds its adapters' delta for a batch: the batch's tokens in one segment
per request, each under an adapter slot (-1: the base model). LoRARuntime builds one of these at
start-up for its device and hands it each batch's segments; the layer hooks call `apply`.

- NativeLoRADelta (CPU, float32, the native kernels loaded): one op per layer for the whole batch
  (kernels/csrc/lora.cpp), each token's delta computed by the same operations whatever else is
  batched and on any CPU, so an adapter's requests keep the quantized path's batch invariance.
- GatherLoRADelta (elsewhere, without Triton: bfloat16 on CPU, no native kernels): the tokens of
  each adapter gathered by index, one shrink and one expand per adapter in the batch (torch's GEMM:
  a row's last bits depend on how many rows it is batched with).
- SegmentedLoRADelta (CUDA): the Triton segmented gather matmul (kernels/triton_ops/lora.py), one
  shrink and one expand launch per layer for the whole batch, nothing read back to the host.
"""

from __future__ import annotations

import torch


class GatherLoRADelta:
    def __init__(self):
        self._groups: list[tuple[int, torch.Tensor | None]] = []

    @property
    def active(self) -> bool:
        return bool(self._groups)

    def begin(self, slots: list[int], counts: list[int], device: torch.device) -> None:
        """slots: per request its adapter slot (-1: none); counts: its tokens (consecutive)."""
        self._groups = []
        used = sorted({s for s in slots if s >= 0})
        if not used:
            return
        if len(set(slots)) == 1:
            self._groups = [(used[0], None)]
            return
        per_token = torch.repeat_interleave(torch.tensor(slots), torch.tensor(counts))
        for slot in used:
            self._groups.append((slot, (per_token == slot).nonzero().squeeze(1).to(device)))

    def end(self) -> None:
        self._groups = []

    def apply(self, x: torch.Tensor, flat: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        """flat [T, out] += each adapter's delta on its tokens of x [T, in]; a / b: the layer's
        slots."""
        for slot, idx in self._groups:
            xs = x if idx is None else x.index_select(0, idx)
            delta = (xs @ a[slot].T) @ b[slot].T  # shrink to the rank blocks, expand to every part
            if idx is None:
                flat += delta.to(flat.dtype)
            else:
                flat.index_add_(0, idx, delta.to(flat.dtype))


class NativeLoRADelta:
    def __init__(self):
        self._slots: torch.Tensor | None = None  # per token its slot (-1: none)

    @property
    def active(self) -> bool:
        return self._slots is not None

    def begin(self, slots: list[int], counts: list[int], device: torch.device) -> None:
        if all(s < 0 for s in slots):
            self._slots = None
            return
        self._slots = torch.repeat_interleave(torch.tensor(slots), torch.tensor(counts))

    def end(self) -> None:
        self._slots = None

    def apply(self, x: torch.Tensor, flat: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        from radixlm.kernels.ops import ops

        ops().lora_delta_(x, a, b, self._slots, flat)


class SegmentedLoRADelta:
    def __init__(self):
        self._segments: torch.Tensor | None = None  # [3, requests]: first token, tokens, slot
        self._max_len = 0

    @property
    def active(self) -> bool:
        return self._segments is not None

    def begin(self, slots: list[int], counts: list[int], device: torch.device) -> None:
        if all(s < 0 for s in slots):
            self._segments = None
            return
        starts = [0]
        for n in counts[:-1]:
            starts.append(starts[-1] + n)
        self._segments = torch.tensor([starts, counts, slots], dtype=torch.int64, device=device)
        self._max_len = max(counts)

    def end(self) -> None:
        self._segments = None

    def apply(self, x: torch.Tensor, flat: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        from radixlm.kernels.triton_ops.lora import lora_delta

        lora_delta(x, a, b, flat, self._segments, self._max_len)


def create_lora_delta(
    device: torch.device, dtype: torch.dtype
) -> GatherLoRADelta | NativeLoRADelta | SegmentedLoRADelta:
    from radixlm import kernels
    from radixlm.kernels import triton_ops

    if device.type == "cuda" and triton_ops.available(device):
        return SegmentedLoRADelta()
    if device.type == "cpu" and dtype == torch.float32 and kernels.available():
        return NativeLoRADelta()
    return GatherLoRADelta()
