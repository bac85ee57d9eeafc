"""The scheduler's answers to /load_lora_adapter and /unload_lora_adapter (the runner's LoRARuntime
loads and checks; the tokenizer manager has already waited for an unloaded adapter's requests)."""

from __future__ import annotations

import logging

from radixlm.ipc import LoadLoRAAdapterReqInput, LoRAUpdateReqOutput, UnloadLoRAAdapterReqInput
from radixlm.lora.adapter import AdapterError
from radixlm.lora.config import LoRARef
from radixlm.lora.runtime import NoLoRA

logger = logging.getLogger(__name__)

LORA_MESSAGES = (LoadLoRAAdapterReqInput, UnloadLoRAAdapterReqInput)
LORA_REPLIES = {
    LoadLoRAAdapterReqInput: LoRAUpdateReqOutput,
    UnloadLoRAAdapterReqInput: LoRAUpdateReqOutput,
}


def handle_lora_message(lora: NoLoRA, msg) -> LoRAUpdateReqOutput:
    if not hasattr(lora, "load"):
        return LoRAUpdateReqOutput(False, "LoRA is off: start the server with --enable-lora")
    if isinstance(msg, UnloadLoRAAdapterReqInput):
        if msg.lora_uid not in lora.adapters:
            return LoRAUpdateReqOutput(False, f"no adapter {msg.lora_uid!r} is loaded")
        lora.unload(msg.lora_uid)
        logger.info("LoRA adapter %s unloaded", msg.lora_uid)
        return LoRAUpdateReqOutput(True)
    try:
        adapter = lora.load(LoRARef(msg.lora_name, msg.lora_path, msg.pinned))
    except AdapterError as e:
        return LoRAUpdateReqOutput(False, str(e))
    logger.info(
        "LoRA adapter %s loaded from %s (rank %d)", adapter.uid, msg.lora_path, adapter.rank
    )
    info = next(a for a in lora.adapters_info() if a["uid"] == adapter.uid)
    return LoRAUpdateReqOutput(True, adapter=info)
