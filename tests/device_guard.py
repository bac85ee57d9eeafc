"""DeviceGuard: proves, without a GPU, that code would neither wait for the GPU nor mix devices on
one.

On CUDA a forward runs ahead of the host: `.item()`, `.tolist()`, `.cpu()`, `bool(t)`, `int(t)` and
the ops whose output size depends on the data (nonzero, bincount, unique, masked_select, boolean
indexing, repeat_interleave without output_size, torch.equal) make the host wait for every kernel
queued before them; and a tensor made on the host (torch.arange(n) with no device) meeting a GPU
tensor in an op is an error there. On a CPU both go unnoticed. The guard is a TorchFunctionMode
that sees every torch call the code under it makes and tells *device* tensors from *host* ones:

- device: everything that existed before the guard (the model's weights, the KV pools, the
  request rows: the state that lives on the GPU), what a factory made with an explicit `device=`
  (how code asks for a tensor on the model's device), `host.to(device)`, and every op's result
  with a device tensor among its inputs;
- host: what a factory made without a `device=` (torch.tensor(list), torch.arange(n)), and the
  results of ops on host tensors alone.

It raises on a sync-causing call whose tensor is a device one, on a blocking host-to-device copy
(`torch.tensor(data, device=)`, `host.to(device)` without non_blocking: on CUDA the stream is
synchronized before it, so a step built while another runs would wait for it), and on an op that
mixes a host tensor (other than a 0-d scalar, which CUDA accepts) with device tensors. Triton's
interpreter (which copies a kernel's arguments to numpy and back) runs unguarded. Limits: on a CPU
the model's device is `cpu`, so an explicit `device="cpu"` literal reads as the device (the
repository is grepped for those instead: tests/triton/test_no_host_sync.py), and data-dependent
Python control flow on host lists is not a sync and is not seen.
"""

from __future__ import annotations

import contextlib
import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

T = torch.Tensor
# Calls that read a device tensor's values back to the host (the host waits for the GPU).
SYNC = {
    T.item,
    T.tolist,
    T.cpu,
    T.numpy,
    T.__bool__,
    T.__int__,
    T.__float__,
    T.__index__,
    T.nonzero,
    torch.nonzero,
    T.argwhere,
    torch.argwhere,
    torch.bincount,
    T.bincount,
    torch.unique,
    T.unique,
    torch.unique_consecutive,
    T.unique_consecutive,
    torch.masked_select,
    T.masked_select,
    torch.equal,
    T.equal,
    torch.allclose,
    T.allclose,
    T.__repr__,
    T.__format__,
}
FACTORIES = {
    torch.tensor,
    torch.as_tensor,
    torch.arange,
    torch.zeros,
    torch.ones,
    torch.empty,
    torch.full,
    torch.rand,
    torch.randn,
    torch.randint,
    torch.randperm,
    torch.linspace,
    torch.eye,
    torch.empty_strided,
}
# Factories that copy their data argument: given device= and host data, a blocking copy on CUDA.
COPIES = {torch.tensor, torch.as_tensor}
PASSTHROUGH = {
    T.__setstate__,
    T.__reduce_ex__,
    T.data_ptr,
    T.dim,
    T.size,
    T.stride,
    T.numel,
    T.is_contiguous,
    T.storage_offset,
    T.element_size,
    T.untyped_storage,
    T.__hash__,
    T.__len__,
}


class DeviceSyncError(AssertionError):
    pass


class DeviceGuard(TorchFunctionMode):
    def __init__(self, device: torch.device):
        super().__init__()
        self.device = torch.device(device)
        self._host: dict[int, weakref.ref] = {}
        self.paused = False
        self.calls = 0  # torch calls seen (a guard that saw nothing proves nothing)

    # -- taint ---------------------------------------------------------------------------------
    def is_host(self, t: torch.Tensor) -> bool:
        ref = self._host.get(id(t))
        return ref is not None and ref() is t

    def _mark_host(self, out) -> None:
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._host[id(t)] = weakref.ref(t)

    def _mark_device(self, out) -> None:
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._host.pop(id(t), None)

    # -- the mode ------------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused or func in PASSTHROUGH:
            return func(*args, **kwargs)
        self.calls += 1
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        device_ins = [t for t in tensors if not self.is_host(t)]
        name = getattr(func, "__qualname__", getattr(func, "__name__", repr(func)))
        if func in SYNC and device_ins:
            raise DeviceSyncError(
                f"{name} on a device tensor {tuple(device_ins[0].shape)}: a host sync on CUDA"
            )
        if func in (T.__getitem__, T.__setitem__) and _bool_index(args):
            raise DeviceSyncError(
                f"{name} with a boolean mask: its size is read back (a host sync on CUDA)"
            )
        if (
            func in (torch.repeat_interleave, T.repeat_interleave)
            and "output_size" not in kwargs
            and len(args) > 1
            and isinstance(args[1], torch.Tensor)
        ):
            raise DeviceSyncError(
                "repeat_interleave of tensor repeats without output_size: a host sync on CUDA"
            )
        if func in FACTORIES:
            if (
                func in COPIES
                and kwargs.get("device") is not None
                and not _data_on_device(self, args)
            ):
                raise DeviceSyncError(
                    f"{name}(host data, device=...): a blocking copy (on CUDA the stream waits for "
                    "the GPU first); radixlm.model.host_copy.to_device copies without the wait"
                )
            out = func(*args, **kwargs)
            if kwargs.get("device") is None and not _data_on_device(self, args):
                self._mark_host(out)
            return out
        if func is T.to or func is T.cuda:
            return self._to(func, args, kwargs)
        if func is torch.where and len(args) == 1 and device_ins:
            raise DeviceSyncError("torch.where(condition): nonzero, a host sync on CUDA")
        if func is T.copy_ and self.is_host(args[0]) and device_ins:
            raise DeviceSyncError("copy_ of a device tensor into a host one: a host sync on CUDA")
        host_ins = [t for t in tensors if self.is_host(t) and t.dim() > 0]
        if host_ins and device_ins and func is not T.copy_:
            raise DeviceSyncError(
                f"{name}: a host tensor {tuple(host_ins[0].shape)} meets device tensors "
                "(made without device=: on CUDA a device mismatch or a copy each step)"
            )
        out = func(*args, **kwargs)
        if tensors and not device_ins:
            self._mark_host(out)
        else:
            self._mark_device(out)
        return out

    def _to(self, func, args, kwargs):
        src = args[0]
        target = kwargs.get("device")
        for a in args[1:]:
            if isinstance(a, (str, torch.device)):
                target = a
            elif isinstance(a, torch.Tensor):
                target = a.device
        out = func(*args, **kwargs)
        if target is None:  # a dtype change keeps the side
            if self.is_host(src):
                self._mark_host(out)
            return out
        if self.is_host(
            src
        ):  # host -> device: a copy on CUDA (here a new tensor, so src stays host)
            if not kwargs.get("non_blocking"):
                raise DeviceSyncError(
                    "host.to(device) without non_blocking=True: a blocking copy (on CUDA the "
                    "stream waits for the GPU first); radixlm.model.host_copy.to_device copies "
                    "without it"
                )
            out = out.clone() if out is src else out
            self._mark_device(out)
        return out

    @contextlib.contextmanager
    def pause(self):
        self.paused, was = True, self.paused
        try:
            yield
        finally:
            self.paused = was


def _bool_index(args) -> bool:
    index = args[1] if len(args) > 1 else None
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool and p.dim() > 0 for p in parts)


def _data_on_device(guard: DeviceGuard, args) -> bool:
    """torch.tensor(data) where data holds device tensors: a read-back, flagged by the caller's
    op."""
    return any(isinstance(t, torch.Tensor) and not guard.is_host(t) for t in tree_flatten(args)[0])


@contextlib.contextmanager
def device_guard(device: torch.device):
    """Run the block under a DeviceGuard; Triton's interpreter (kernel launches) runs unguarded."""
    guard = DeviceGuard(device)
    patches = []
    try:
        from triton.runtime import interpreter

        original = interpreter.GridExecutor.__call__

        def unguarded(self, *args, **kwargs):
            with guard.pause():
                return original(self, *args, **kwargs)

        interpreter.GridExecutor.__call__ = unguarded
        patches.append((interpreter.GridExecutor, original))
    except ImportError:
        pass
    try:
        with guard:
            yield guard
    finally:
        for cls, original in patches:
            cls.__call__ = original
