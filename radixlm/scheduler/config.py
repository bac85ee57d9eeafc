"""SchedulerConfig: everything the scheduler process is built from, validated where its choices
live (ServerArgs stays the one CLI surface; the engine builds this from it before it starts any
process, so a bad option is an error in the caller's process, naming the option)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from radixlm.cache.hicache_config import HiCacheConfig
from radixlm.cache.kv_events_config import KVEventsConfig
from radixlm.config import ServerArgs
from radixlm.constrained import GRAMMAR_BACKEND_REGISTRY
from radixlm.disaggregation.config import DisaggregationConfig
from radixlm.model.executor.runner_config import ModelRunnerConfig
from radixlm.scheduler.batching.policy import SCHEDULE_POLICY_REGISTRY
from radixlm.scheduler.parallel.dp_dispatch import LOAD_BALANCE_METHODS
from radixlm.speculative.config import SpeculativeConfig


@dataclass(frozen=True)
class SchedulerConfig:
    runner: ModelRunnerConfig
    hicache: HiCacheConfig | None = None  # None: no hierarchical cache
    speculative: SpeculativeConfig | None = None  # None: no speculative decoding
    tokenizer_path: str | None = None  # None: the model's own
    schedule_policy: str = "lpm"
    chunk_size: int | None = 2048  # new tokens of one request per extend step; None: no chunking
    max_prefill_tokens: int = 4096  # new tokens per extend batch
    new_token_ratio: float = (
        0.4  # share of a running request's remaining max_new_tokens reserved at admission
    )
    min_new_token_ratio: float = 0.1
    new_token_ratio_decay: float = 0.001
    enable_mixed_chunk: bool = False
    overlap_schedule: bool = False
    disable_radix_cache: bool = False
    # A hybrid model's snapshots inside a prompt's prefill (ServerArgs.mamba_track_interval).
    mamba_track_interval: int = 256
    disable_jump_forward: bool = False
    grammar_backend: str = "xgrammar"
    stream_interval: int = 1
    decode_log_interval: int = 40
    enable_invariant_checks: bool = False
    random_seed: int = 42
    log_level: str = "info"
    disaggregation: DisaggregationConfig = (
        DisaggregationConfig()
    )  # PD: this server's role (default: both)
    load_balance_method: str = "auto"  # DP attention: which rank a request goes to (dp_dispatch.py)
    kv_events: KVEventsConfig | None = None  # --kv-events-config; None: no events published

    def __post_init__(self):
        if self.schedule_policy not in SCHEDULE_POLICY_REGISTRY:
            raise SCHEDULE_POLICY_REGISTRY.unknown(self.schedule_policy)
        if self.grammar_backend not in GRAMMAR_BACKEND_REGISTRY:
            choices = ", ".join(GRAMMAR_BACKEND_REGISTRY.names())
            raise ValueError(
                f"grammar_backend must be one of {choices}, got {self.grammar_backend!r}"
            )
        if self.load_balance_method not in LOAD_BALANCE_METHODS:
            raise ValueError(
                f"load_balance_method must be one of {', '.join(LOAD_BALANCE_METHODS)}, "
                f"got {self.load_balance_method!r}"
            )
        if self.chunk_size is not None and self.chunk_size <= 0:
            raise ValueError("chunked_prefill_size must be positive or -1 (off)")
        for name in ("max_prefill_tokens", "stream_interval", "decode_log_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if (
            not 0 <= self.min_new_token_ratio <= self.new_token_ratio <= 1
            or self.new_token_ratio_decay < 0
        ):
            raise ValueError(
                "new token ratios need 0 <= min_new_token_ratio <= new_token_ratio <= 1 and a "
                "decay >= 0"
            )

    @classmethod
    def from_server_args(cls, args: ServerArgs) -> SchedulerConfig:
        if args.chunked_prefill_size == 0 or args.chunked_prefill_size < -1:
            raise ValueError("chunked_prefill_size must be positive or -1 (off)")
        speculative = SpeculativeConfig.from_server_args(args)
        runner = ModelRunnerConfig.from_server_args(args)
        if speculative is not None:  # a hybrid's verify steps keep a state per draft node
            runner = dataclasses.replace(runner, spec_draft_tokens=speculative.num_draft_tokens)
        # Overlap scheduling is on by default on CUDA only: on a CPU the forward already uses every
        # core, and the scheduler's ~1% of a step is not worth the GIL contention. Off with
        # speculative decoding: a verify step's inputs are the previous step's outputs.
        overlap = speculative is None and (
            args.enable_overlap_schedule
            or (runner.device != "cpu" and not args.disable_overlap_schedule)
        )
        disaggregation = DisaggregationConfig.from_server_args(args)
        overlap = (
            overlap and not disaggregation.enabled
        )  # the PD modes hand KV over between whole steps
        # DP attention: every rank's forward of a step is launched after the step's exchange
        # (parallel/dp_attention.py).
        overlap = overlap and not args.enable_dp_attention
        kv_events = KVEventsConfig.from_cli(args.kv_events_config)
        if kv_events is not None and args.enable_dp_attention:
            raise ValueError(
                "--kv-events-config with --enable-dp-attention: not yet (each attention rank's"
                " tree would need its own publisher)"
            )
        return cls(
            runner=runner,
            hicache=HiCacheConfig.from_server_args(args),
            speculative=speculative,
            tokenizer_path=args.tokenizer_path,
            schedule_policy=args.schedule_policy,
            chunk_size=None if args.chunked_prefill_size == -1 else args.chunked_prefill_size,
            max_prefill_tokens=args.max_prefill_tokens,
            # SGLang's --schedule-conservativeness scales the reserve for running requests' future
            # tokens.
            new_token_ratio=min(1.0, args.new_token_ratio * args.schedule_conservativeness),
            min_new_token_ratio=min(1.0, args.min_new_token_ratio * args.schedule_conservativeness),
            new_token_ratio_decay=args.new_token_ratio_decay,
            enable_mixed_chunk=args.enable_mixed_chunk,
            overlap_schedule=overlap,
            disable_radix_cache=args.disable_radix_cache,
            mamba_track_interval=args.mamba_track_interval,
            disable_jump_forward=args.disable_jump_forward,
            grammar_backend=args.grammar_backend,
            stream_interval=args.stream_interval,
            decode_log_interval=args.decode_log_interval,
            enable_invariant_checks=args.enable_invariant_checks,
            random_seed=args.random_seed,
            log_level=args.log_level,
            disaggregation=disaggregation,
            load_balance_method=args.load_balance_method,
            kv_events=kv_events,
        )
