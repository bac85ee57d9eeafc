"""A server's PD disaggregation mode as a scheduler component (docs/disaggregation.md).

BasePDMode is what the loop calls of a mode, and NoDisaggregation the null mode's no-op twin, so the
loop never asks which mode runs:

    on_add(recv)        a request as it arrives (prefill: it computes the first output token only)
    ready_status(req)   where a request goes once nothing is left to compile or read (decode: a
                        request with a bootstrap room waits for its KV instead of a prefill)
    poll()              once per step: move requests through the transfer's states
    pending()           transfers under way: the loop polls soon instead of sleeping
    info()              /get_server_info's internal_state["disaggregation"]

pd/prefill.py and pd/decode.py are the two modes (pd/mode.py picks one); PDContext is what they
are handed of the scheduler.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from radixlm.ipc import TokenizedGenerateReqInput
from radixlm.scheduler.kv.cache_manager import CacheManager
from radixlm.scheduler.lazy_tokenizer import LazyTokenizer
from radixlm.scheduler.output.finisher import Finisher
from radixlm.scheduler.output.output_streamer import OutputStreamer
from radixlm.scheduler.req import Req, ReqStatus
from radixlm.scheduler.req_queues import ReqQueues


@dataclass(frozen=True)
class PDContext:
    queues: ReqQueues
    cache_manager: CacheManager
    finisher: Finisher
    outputs: OutputStreamer
    tokenizer: LazyTokenizer
    context_len: int
    max_running_requests: int


class BasePDMode(ABC):
    @abstractmethod
    def on_add(self, recv: TokenizedGenerateReqInput) -> TokenizedGenerateReqInput:
        """A request as it arrives, as this mode serves it."""

    @abstractmethod
    def ready_status(self, req: Req) -> ReqStatus:
        """Where req goes once nothing is left to compile or read."""

    @abstractmethod
    def poll(self) -> None:
        """Once per step: move requests through the transfer's states."""

    @abstractmethod
    def pending(self) -> bool:
        """Transfers under way (the loop polls soon instead of sleeping)."""

    @abstractmethod
    def info(self) -> dict:
        """For /get_server_info's internal_state."""


class NoDisaggregation(BasePDMode):
    def on_add(self, recv: TokenizedGenerateReqInput) -> TokenizedGenerateReqInput:
        return recv

    def ready_status(self, req: Req) -> ReqStatus:
        return ReqStatus.WAITING

    def poll(self) -> None:
        pass

    def pending(self) -> bool:
        return False

    def info(self) -> dict:
        return {}
