"""What the tokenizer manager keeps of one request in flight: its output so far and the event its
consumer waits on."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from radixlm.ipc import FinishReason


@dataclass
class ReqState:
    rid: str
    prompt_text: str | None
    return_text_in_logprobs: bool
    created: float = field(default_factory=time.perf_counter)
    created_wall: float = field(default_factory=time.time)
    event: asyncio.Event = field(default_factory=asyncio.Event)
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finished_reason: FinishReason | None = None
    meta: dict = field(default_factory=dict)
    logprobs: dict = field(default_factory=dict)
    dirty: bool = False  # news since the consumer last looked
    lora_id: str | None = None  # its LoRA adapter (unloading one waits for its requests)
