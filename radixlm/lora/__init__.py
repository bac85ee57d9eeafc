"""Multi-LoRA serving (issue 37; docs/lora.md): many peft adapters on one base model, mixed in one
batch.

config.py (the flags, --lora-paths entries), adapter.py (peft adapters read and checked), pool.py
(the slots the batched compute reads, padded to the max rank, LRU/FIFO eviction, pinned adapters),
runtime.py (the per-forward segments and the delta added to each target linear layer's output).
Names -> ids and live loading are the tokenizer manager's (engine/lora_control.py); the scheduler's
answers to those calls are scheduler/control/lora_admin.py.
"""
