"""Host data onto the device, and a step's sampled ids back, without waiting for the GPU.

On CUDA a plain host-to-device copy (`torch.tensor(xs, device=cuda)`, `host.to(cuda)`) synchronizes
the stream before it returns: a step built while the previous one runs (overlap scheduling) would
wait for that step to finish, and the GPU would idle while the rest of it is built. A copy from
pinned memory with non_blocking=True is queued behind the running kernels instead (PyTorch's pinned
allocator keeps the buffer until the copy has run). On a CPU both are the plain tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def to_device(
    data: Sequence | torch.Tensor, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """`data` (a list, or a host tensor) as a `dtype` tensor on `device`, copied without a sync."""
    if isinstance(data, torch.Tensor):
        if data.device.type != "cpu":
            return data.to(device, dtype)  # already on a device: no host copy
        host = data.to(dtype)
        if device.type == "cuda" and not host.is_pinned():
            host = host.pin_memory()
    else:
        host = torch.tensor(data, dtype=dtype, pin_memory=device.type == "cuda")
    return host.to(device, non_blocking=True)  # on a CPU: host itself


class HostCopy:
    """A device tensor's values on their way to the host: queued behind the kernels that make
    them (into pinned memory on CUDA); `tolist()` waits for that copy alone (once)."""

    def __init__(self, t: torch.Tensor):
        self._list: list | None = None
        if t.device.type == "cuda":
            self._host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            self._host.copy_(t, non_blocking=True)
            self._done = torch.cuda.Event()
            self._done.record()
        else:  # a copy: a later step may reuse the tensor (a static decode buffer)
            self._host, self._done = t.clone(), None

    def tolist(self) -> list:
        if self._list is None:
            if self._done is not None:
                self._done.synchronize()
            self._list = self._host.tolist()
        return self._list
