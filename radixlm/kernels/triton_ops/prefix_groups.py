"""The shared-prefix groups of a decode batch, found on the device (no host sync, static shapes).

The rule is the CPU backend's (model/layers/attention/shared_prefix.py): requests whose slot rows
start with the same slot share a cached prefix (a slot belongs to one sequence of tokens); a group
of at least two requests whose common leading slots number at least MIN_SHARED_LEN gets a pass over
them, and every member keeps at least its newest token for its own pass. Here each request's leader
is the first request with its first slot; its shared length with the leader is where their rows
first differ; a group's prefix is the least of its members'. Everything is a tensor op over [bs]
or [bs, width], so the decode graph captured for a batch size computes it too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_SHARED_LEN = 32  # shorter shared prefixes are not worth a second pass (as on the CPU)


@dataclass
class PrefixGroups:
    """Per request b as a possible group leader: its group's prefix length (0: b leads no group
    worth a pass), member count, first entry in member_order (the requests ordered by leader); and
    per request its own keys' start (kv_start: its group's prefix length, else 0). The leaders of
    groups worth a pass come first in `leaders` and number `num_groups` (one element): the pass's
    programs loop over them, so a batch with none costs a grid of programs that exit at once."""

    group_prefix: torch.Tensor  # [bs] int64
    group_count: torch.Tensor  # [bs] int64
    group_first: torch.Tensor  # [bs] int64
    member_order: torch.Tensor  # [bs] int64
    kv_start: torch.Tensor  # [bs] int64
    leaders: torch.Tensor  # [bs] int64: the active groups' leaders first
    num_groups: torch.Tensor  # [1] int64


def find_prefix_groups(
    kv_slots: torch.Tensor, seq_lens: torch.Tensor, min_shared: int = MIN_SHARED_LEN
) -> PrefixGroups:
    """kv_slots [bs, width >= max seq_len] slot rows, seq_lens [bs] -> the groups."""
    bs, width = kv_slots.shape
    first = kv_slots[:, 0]
    leader = (
        (first[:, None] == first[None, :]).to(torch.int32).argmax(1)
    )  # the first request with my first slot
    limit = torch.minimum(seq_lens, seq_lens[leader]) - 1  # both keep their newest token
    pos = torch.arange(width, device=kv_slots.device)
    stop = (kv_slots != kv_slots[leader]) | (pos[None, :] >= limit[:, None])
    shared = stop.to(torch.int32).argmax(
        1
    )  # the first position past the shared run (limit <= width - 1)
    group_prefix = torch.full((bs,), width, dtype=torch.int64, device=kv_slots.device)
    group_prefix.scatter_reduce_(0, leader, shared, reduce="amin")
    group_count = torch.zeros(bs, dtype=torch.int64, device=kv_slots.device)
    group_count.scatter_add_(0, leader, torch.ones_like(leader))
    active = (group_count >= 2) & (group_prefix >= min_shared)
    group_prefix = torch.where(active, group_prefix, torch.zeros_like(group_prefix))
    member_order = torch.argsort(leader, stable=True)
    group_first = torch.cumsum(group_count, 0) - group_count
    leaders = torch.argsort((~active).to(torch.int8), stable=True)
    return PrefixGroups(
        group_prefix,
        group_count,
        group_first,
        member_order,
        group_prefix[leader],
        leaders,
        active.sum().reshape(1),
    )
