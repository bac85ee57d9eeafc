"""DisaggregationConfig: a server's PD role and its transfer settings (SGLang's flag names), and
the checks of a request's bootstrap fields."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from radixlm.config import ServerArgs
from radixlm.ipc import BootstrapInfo
from radixlm.registry import Registry


class DisaggregationMode(Enum):
    NULL = "null"  # one server runs prefill and decode
    PREFILL = "prefill"
    DECODE = "decode"


DISAGGREGATION_MODES = tuple(m.value for m in DisaggregationMode)
# --disaggregation-transfer-backend: each entry a backends.py TransferBackend class, made with no
# arguments on both sides (its module imported only when chosen: Mooncake's package is optional).
TRANSFER_BACKEND_REGISTRY = Registry[Callable[..., Any], None]("PD transfer backend")
TRANSFER_BACKEND_REGISTRY.register("tcp", "radixlm.disaggregation.backends:TcpBackend")
TRANSFER_BACKEND_REGISTRY.register("shm", "radixlm.disaggregation.backends:ShmBackend")
TRANSFER_BACKEND_REGISTRY.register(
    "mooncake", "radixlm.disaggregation.mooncake_backend:MooncakeBackend"
)
TRANSFER_BACKEND_REGISTRY.register("fake", "radixlm.disaggregation.backends:FakeBackend")
TRANSFER_BACKENDS = tuple(TRANSFER_BACKEND_REGISTRY.names())


@dataclass(frozen=True)
class DisaggregationConfig:
    mode: DisaggregationMode = DisaggregationMode.NULL
    transfer_backend: str = "tcp"
    bootstrap_port: int = 8998
    host: str = "127.0.0.1"  # where this server's transfer sockets and bootstrap service listen
    num_reserved_decode_tokens: int = 512
    bootstrap_timeout: float = 300.0
    waiting_timeout: float = 300.0
    debug_checksum: bool = False

    def __post_init__(self):
        if self.transfer_backend not in TRANSFER_BACKENDS:
            raise ValueError(
                f"disaggregation_transfer_backend must be one of {', '.join(TRANSFER_BACKENDS)},"
                f" got {self.transfer_backend!r} (NIXL is a GPU-cluster backend:"
                " docs/disaggregation.md says how one plugs in)"
            )
        if not 0 < self.bootstrap_port < 65536:
            raise ValueError(
                f"disaggregation_bootstrap_port must be a port number, got {self.bootstrap_port}"
            )
        if self.num_reserved_decode_tokens < 0:
            raise ValueError(
                f"num_reserved_decode_tokens must be >= 0, got {self.num_reserved_decode_tokens}"
            )
        if not (self.bootstrap_timeout > 0 and self.waiting_timeout > 0):
            raise ValueError(
                "disaggregation_bootstrap_timeout and disaggregation_waiting_timeout must be > 0"
            )

    @property
    def enabled(self) -> bool:
        return self.mode is not DisaggregationMode.NULL

    @classmethod
    def from_server_args(cls, args: ServerArgs) -> DisaggregationConfig:
        if args.disaggregation_mode not in DISAGGREGATION_MODES:
            raise ValueError(
                f"disaggregation_mode must be one of {', '.join(DISAGGREGATION_MODES)}, "
                f"got {args.disaggregation_mode!r}"
            )
        mode = DisaggregationMode(args.disaggregation_mode)
        if mode is not DisaggregationMode.NULL:
            if args.tp_size > 1 or args.pp_size > 1:
                raise ValueError(
                    "disaggregation_mode prefill/decode runs with tp_size 1 and pp_size 1 for now"
                )
            if args.kv_cache_dtype == "int8":
                raise ValueError(
                    "disaggregation_mode prefill/decode does not move int8 KV (its scales) yet: "
                    "use another kv_cache_dtype"
                )
            if args.enable_hierarchical_cache and mode is DisaggregationMode.DECODE:
                raise ValueError(
                    "disaggregation_mode decode keeps its received KV in the radix cache (L1 only):"
                    " drop enable_hierarchical_cache"
                )
        return cls(
            mode,
            args.disaggregation_transfer_backend,
            args.disaggregation_bootstrap_port,
            args.host,
            args.num_reserved_decode_tokens,
            args.disaggregation_bootstrap_timeout,
            args.disaggregation_waiting_timeout,
            args.disaggregation_debug_checksum,
        )


def parse_bootstrap(host: Any, port: Any, room: Any, mode: str, n: int) -> BootstrapInfo | None:
    """A request's bootstrap fields (all three, or none), checked; ValueError names the field."""
    given = [v is not None for v in (host, port, room)]
    if not any(given):
        return None
    if not all(given):
        missing = [
            k
            for k, g in zip(("bootstrap_host", "bootstrap_port", "bootstrap_room"), given)
            if not g
        ][0]
        raise ValueError(
            f"{missing} is missing: bootstrap_host, bootstrap_port and bootstrap_room go together"
        )
    if mode == DisaggregationMode.NULL.value:
        raise ValueError(
            "bootstrap_room: this server runs without --disaggregation-mode (send the request to a "
            "prefill and a decode server, or through `radixlm router --pd-disaggregation`)"
        )
    if not isinstance(host, str) or not host or len(host) > 255:
        raise ValueError(f"bootstrap_host must be a host name or address, got {host!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"bootstrap_port must be a port number, got {port!r}")
    if isinstance(room, bool) or not isinstance(room, int) or not 0 <= room < 2**63:
        raise ValueError(f"bootstrap_room must be an integer in [0, 2**63), got {room!r}")
    if n != 1:
        raise ValueError(
            f"sampling_params.n must be 1 with bootstrap_room (one transfer per room), got {n}"
        )
    return BootstrapInfo(host, port, room)
