"""The scheduler's answers to /load_lora_adapter and /unload_lora_adapter (the runner's LoRARuntime
loads and checks; the tokenizer manager has already waited for an unloaded adapter's requests)."""

from __future__ import annotations

import logging

from radixlm.ipc import LoadLoRAAdapterReqInput, LoRAUpdateReqOutput, UnloadLoRAAdapterReqInput
from radixlm.lora.adapter import AdapterError
from radixlm.lora.config import LoRARef
from radixlm.lora.runtime import BaseLoRARuntime

logger = logging.getLogger(__name__)

LORA_MESSAGES = (LoadLoRAAdapterReqInput, UnloadLoRAAdapterReqInput)
LORA_REPLIES = {
    LoadLoRAAdapterReqInput: LoRAUpdateReqOutput,
    UnloadLoRAAdapterReqInput: LoRAUpdateReqOutput,
}


def handle_lora_message(lora: BaseLoRARuntime, msg) -> LoRAUpdateReqOutput:
    """The reply to a load or unload; a refusal (LoRA off, no such adapter, a bad one) says why."""
    try:
        if isinstance(msg, UnloadLoRAAdapterReqInput):
            lora.unload(msg.lora_uid)
        else:
            adapter = lora.load(LoRARef(msg.lora_name, msg.lora_path, msg.pinned))
    except AdapterError as e:
        return LoRAUpdateReqOutput(False, str(e))
    if isinstance(msg, UnloadLoRAAdapterReqInput):
        logger.info("LoRA adapter %s unloaded", msg.lora_uid)
        return LoRAUpdateReqOutput(True)
    logger.info(
        "LoRA adapter %s loaded from %s (rank %d)", adapter.uid, msg.lora_path, adapter.rank
    )
    info = next(a for a in lora.adapters_info() if a["uid"] == adapter.uid)
    return LoRAUpdateReqOutput(True, adapter=info)
