"""Prefill/decode disaggregation (SGLang's design; docs/disaggregation.md).

A prefill server runs prompts and sends their KV; a decode server reserves KV slots, receives the
KV there and decodes. This package is what both sides share below the scheduler: the config
(config.py), the messages and the state machine (protocol.py), the bootstrap service where prefill
ranks register (bootstrap.py), the transfer backends behind one interface (backends.py: tcp, shm,
fake) and the per-process managers that run them on threads (prefill_manager.py,
decode_manager.py). The scheduler's PD modes (scheduler/pd/prefill.py, scheduler/pd/decode.py)
move requests through them.
"""
