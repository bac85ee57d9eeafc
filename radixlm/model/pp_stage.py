"""This rank's pipeline stage: which layers it builds, and the hand-over of the residual stream.

Stage 0 embeds the tokens, runs its layers and sends (hidden, residual) to stage 1 (one tensor:
the two stacked); each later stage receives them, runs its layers and sends on; the last stage
applies the final norm and the LM head. Every stage knows the step's token count (every rank runs
the same scheduler on the same messages), so only the activations travel, once per stage boundary
per step. The modules a stage does not hold are PPMissingLayer (no parameters), so layer ids, and
the checkpoint's names, stay global (SGLang's make_layers / PPMissingLayer).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from radixlm.distributed.communicator import Communicator
from radixlm.distributed.parallel_state import get_parallel_state
from radixlm.distributed.pp_partition import layer_counts, stage_layers


class PPMissingLayer(nn.Module):
    """A module another pipeline stage holds."""

    def forward(self, *args, **kwargs):
        raise RuntimeError("this module is held by another pipeline stage")


@dataclass(frozen=True)
class PPStage:
    rank: int  # this stage's index
    size: int  # stages
    layers: range  # the decoder layers this stage holds (global ids)
    comm: Communicator | None = None  # the pp group's device communicator (None: one stage)
    cpu_comm: Communicator | None = None  # its gloo communicator (pickled objects)
    # Sends not yet complete (their tensors stay referenced until then): a stage goes on with its
    # next micro-batch while the next stage still works on the last one.
    pending: list = field(default_factory=list)

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.size - 1

    def recv(
        self,
        num_tokens: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
        residual: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The previous stage's (hidden, residual), [num_tokens, hidden_size] each (residual
        False: a stack whose layers carry no residual sends hidden only, and None comes back)."""
        buf = torch.empty(
            (2 if residual else 1, num_tokens, hidden_size), dtype=dtype, device=device
        )
        if num_tokens:
            self.comm.recv(buf, self.rank - 1)
        return buf[0], (buf[1] if residual else None)

    def send(self, hidden: torch.Tensor, residual: torch.Tensor | None) -> None:
        if hidden.shape[0]:
            t = hidden[None].contiguous() if residual is None else torch.stack((hidden, residual))
            self.pending.append((self.comm.isend(t, self.rank + 1), t))

    def wait_sends(self) -> None:
        while self.pending:
            self.pending.pop(0)[0].wait()

    def from_last(self, obj):
        """obj of the last stage on every stage (an exception there is raised on every stage, so no
        stage waits for a result that will not come)."""
        self.wait_sends()
        obj = self.cpu_comm.broadcast_pyobj(obj, src=self.size - 1)
        if isinstance(obj, BaseException):
            raise obj
        return obj

    def agree_min(self, value: int) -> int:
        """The smallest of every stage's value (the KV pools hold the same slots on every stage)."""
        if self.size == 1:
            return value
        return int(self.cpu_comm.all_gather(torch.tensor([value], dtype=torch.int64), dim=0).min())


def pp_stage(num_layers: int, last_from: int | None = None) -> PPStage:
    """This process's stage for a model of num_layers layers (one stage holding all of them when
    no pipeline was set up); a ValueError naming both numbers when they cannot be split. last_from:
    the first of the layers the last stage must hold (pp_partition.layer_counts)."""
    state = get_parallel_state()
    pp = state.pp
    counts = layer_counts(num_layers, pp.world_size, state.pp_layer_partition, last_from)
    layers = stage_layers(counts, pp.rank_in_group)
    if pp.world_size == 1:
        return PPStage(0, 1, layers)
    return PPStage(pp.rank_in_group, pp.world_size, layers, pp.device_comm, pp.cpu_comm)


def stage_owns(model: nn.Module, name: str) -> bool:
    """Whether checkpoint tensor `name` belongs to a module this stage holds (False: it lies under a
    PPMissingLayer; names that match no module are kept, so load_weights still names them)."""
    module = model
    for part in name.split(".")[:-1]:
        module = module._modules.get(part) if isinstance(module, nn.Module) else None
        if module is None:
            return True
        if isinstance(module, PPMissingLayer):
            return False
    return True
