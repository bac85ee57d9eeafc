"""DistConfig: how the ranks of a served model find each other and talk (from ServerArgs' --tp-size,
--pp-size, --pp-layer-partition, --nnodes, --node-rank, --dist-init-addr, --dist-timeout,
--tp-allreduce-backend,
--ep-size, and --dp-size with --enable-dp-attention)."""

from __future__ import annotations

import dataclasses
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixlm.distributed.pp_partition import parse_partition

if TYPE_CHECKING:
    from radixlm.config import ServerArgs

# auto: nccl on CUDA, shm when every rank is on this host, else gloo.
ALLREDUCE_BACKENDS = ("auto", "gloo", "shm", "nccl")


@dataclass(frozen=True)
class DistConfig:
    tp_size: int = 1
    pp_size: int = 1  # pipeline stages, each a tp group: world = tp_size x pp_size ranks
    pp_layer_partition: tuple[int, ...] | None = None  # layers per stage (None: even)
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = (
        None  # HOST:PORT of rank 0's rendezvous; None: a free local port (one node)
    )
    timeout: float = 600.0  # seconds a collective or the rendezvous may wait before it fails
    allreduce_backend: str = "auto"
    device: str = "cpu"
    # Expert parallelism (MoE layers): 1 keeps every expert on every rank; tp_size splits the
    # experts over the tp group (SGLang's --ep-size inside the tp group, --moe-a2a-backend none).
    ep_size: int = 1
    # DP attention (SGLang's --enable-dp-attention --dp-size N): the tp_size ranks form dp_size
    # attention groups of tp_size / dp_size ranks, each with its own requests and KV; the MoE layers
    # span all of them (docs/architecture.md, "DP attention"). Without it dp_size is not a
    # DistConfig matter (`--dp-size` alone: whole servers behind the router, server/dp.py).
    dp_size: int = 1
    enable_dp_attention: bool = False

    def __post_init__(self):
        if self.tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {self.tp_size}")
        if self.ep_size not in (1, self.tp_size):
            raise ValueError(
                f"ep_size must be 1 or tp_size ({self.tp_size}): experts are split over the "
                f"tensor-parallel group, got ep_size {self.ep_size}"
            )
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ValueError(
                f"node_rank must be in [0, nnodes={self.nnodes}), got {self.node_rank}"
            )
        if self.pp_size < 1:
            raise ValueError(f"pp_size must be >= 1, got {self.pp_size}")
        if self.world_size % self.nnodes:
            raise ValueError(
                f"tp_size x pp_size {self.world_size} is not divisible by nnodes {self.nnodes}"
                " (each node runs the same number of ranks)"
            )
        if self.pp_layer_partition is not None and len(self.pp_layer_partition) != self.pp_size:
            raise ValueError(
                f"pp_layer_partition {','.join(map(str, self.pp_layer_partition))} must have"
                f" pp_size {self.pp_size} entries"
            )
        if self.enable_dp_attention:
            self._check_dp_attention()
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ValueError(
                "nnodes > 1 needs --dist-init-addr HOST:PORT (rank 0's address, the same on every"
                " node)"
            )
        if self.dist_init_addr is not None:
            host, _, port = self.dist_init_addr.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"dist_init_addr must be HOST:PORT, got {self.dist_init_addr!r}")
        if self.timeout <= 0:
            raise ValueError(f"dist_timeout must be positive, got {self.timeout}")
        if self.allreduce_backend not in ALLREDUCE_BACKENDS:
            raise ValueError(
                f"tp_allreduce_backend must be one of {', '.join(ALLREDUCE_BACKENDS)}, "
                f"got {self.allreduce_backend!r}"
            )
        on_cuda = self.device.startswith("cuda")
        if self.allreduce_backend == "nccl" and not on_cuda:
            raise ValueError("tp_allreduce_backend nccl needs --device cuda")
        if self.allreduce_backend == "shm" and self.nnodes > 1:
            raise ValueError("tp_allreduce_backend shm needs every rank on one host (nnodes 1)")

    def _check_dp_attention(self) -> None:
        if self.dp_size < 2:
            raise ValueError(
                f"enable_dp_attention needs dp_size >= 2 (the attention groups), got {self.dp_size}"
            )
        if self.tp_size % self.dp_size:
            raise ValueError(
                f"enable_dp_attention: tp_size {self.tp_size} must be a multiple of dp_size"
                f" {self.dp_size} (SGLang's layout: tp_size ranks in all, tp_size / dp_size per"
                f" attention group; e.g. --tp-size {self.dp_size} --dp-size {self.dp_size})"
            )
        if self.tp_size != self.dp_size:
            raise ValueError(
                f"enable_dp_attention: tp_size {self.tp_size} with dp_size {self.dp_size} would"
                " split each attention group's heads over several ranks, which radixlm does not do"
                f" yet: use --tp-size {self.dp_size}"
            )
        if self.pp_size > 1 or self.nnodes > 1:
            raise ValueError(
                "enable_dp_attention runs on one host without pipeline stages (pp_size 1, nnodes 1)"
                " for now"
            )

    @classmethod
    def from_server_args(cls, args: ServerArgs) -> DistConfig:
        return cls(
            tp_size=args.tp_size,
            pp_size=args.pp_size,
            pp_layer_partition=parse_partition(args.pp_layer_partition),
            nnodes=args.nnodes,
            node_rank=args.node_rank,
            dist_init_addr=args.dist_init_addr,
            timeout=args.dist_timeout,
            allreduce_backend=args.tp_allreduce_backend,
            device=args.device,
            ep_size=args.ep_size,
            dp_size=args.dp_size if args.enable_dp_attention else 1,
            enable_dp_attention=args.enable_dp_attention,
        ).resolved()

    def resolved(self) -> DistConfig:
        """auto made concrete: nccl on CUDA; shm when every rank is on this host with a core of its
        own (shm ranks spin while they wait: on shared cores they would take turns with the rank
        they wait for); gloo otherwise."""
        if self.allreduce_backend != "auto":
            return self
        if self.device.startswith("cuda"):
            backend = "nccl"
        else:
            cores = (
                len(os.sched_getaffinity(0))
                if hasattr(os, "sched_getaffinity")
                else (os.cpu_count() or 1)
            )
            backend = "shm" if self.nnodes == 1 and self.ranks_per_node <= cores else "gloo"
        return dataclasses.replace(self, allreduce_backend=backend)

    def with_init_addr(self) -> DistConfig:
        """A free loopback port for the rendezvous when none was given (one node only)."""
        if self.dist_init_addr:
            return self
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return dataclasses.replace(self, dist_init_addr=f"127.0.0.1:{port}")

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def attn_tp_size(self) -> int:
        """Ranks per attention (tensor-parallel) group: tp_size, or tp_size / dp_size with DP
        attention."""
        return self.tp_size // self.dp_size if self.enable_dp_attention else self.tp_size

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nnodes

    def node_ranks(self) -> list[int]:
        """The global ranks this node runs."""
        n = self.ranks_per_node
        return list(range(self.node_rank * n, (self.node_rank + 1) * n))

    @property
    def init_method(self) -> str:
        host, _, port = (self.dist_init_addr or "").rpartition(":")
        return f"tcp://{host}:{port}"
