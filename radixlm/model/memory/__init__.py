"""Memory sizing: what the weights hold (weight_memory.py), the KV pool's byte budget
(kv_budget.py: --mem-fraction-static) and layout (kv_layout.py), a hybrid model's recurrent states
beside it (state_memory.py) and sliding-window layers' second slot space (swa_memory.py). The pools
themselves are radixlm/cache/'s."""
