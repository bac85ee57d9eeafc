"""One module per llama.cpp architecture family: what its converter writes, read back as HF's
config and tensors (each registered in radixlm/model/gguf/registry.py)."""
