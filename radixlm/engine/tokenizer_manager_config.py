"""TokenizerManagerConfig: the tokenizer manager's options (--max-n, --max-top-logprobs-num, the
tokenizer threads' timeout, ...), checked when built."""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.config import ServerArgs
from radixlm.engine.media import MediaConfig


@dataclass(frozen=True)
class TokenizerManagerConfig:
    max_n: int = 128  # largest n a request may ask for
    max_top_logprobs_num: int = 20
    # Prefill a prompt that a batch repeats once first, so the copies share it (off without a prefix
    # cache).
    cache_shared_prompts: bool = True
    # Seconds a request's tokenization may take on the tokenizer threads (tokenizer_pool.py).
    tokenizer_timeout: float = 30.0
    # Requests' `priority` reaches the scheduler only with --enable-priority-scheduling (else it is
    # ignored, as SGLang does): otherwise any client could put itself ahead of every other.
    enable_priority_scheduling: bool = False
    media: MediaConfig = (
        MediaConfig()
    )  # images in requests: sources, size and pixel bounds (engine/media.py)
    disaggregation_mode: str = (
        "null"  # PD disaggregation: which requests may carry bootstrap fields
    )

    def __post_init__(self):
        if self.max_n < 1:
            raise ValueError(f"max_n must be >= 1, got {self.max_n}")
        if not self.tokenizer_timeout > 0:
            raise ValueError(f"tokenizer_timeout must be > 0, got {self.tokenizer_timeout}")
        if self.max_top_logprobs_num < 0:
            raise ValueError(f"max_top_logprobs_num must be >= 0, got {self.max_top_logprobs_num}")

    @classmethod
    def from_server_args(cls, args: ServerArgs) -> TokenizerManagerConfig:
        return cls(
            args.max_n,
            args.max_top_logprobs_num,
            not args.disable_radix_cache,
            tokenizer_timeout=args.tokenizer_timeout,
            enable_priority_scheduling=args.enable_priority_scheduling,
            media=MediaConfig.from_server_args(args),
            disaggregation_mode=args.disaggregation_mode,
        )
