"""GGUF files (llama.cpp's format) read as a HF config and HF-named weights: reader.py opens the
file, loader.py reads any architecture by its entry in registry.py (one module of archs/ per
family), shard.py reads only a tensor-parallel rank's part of a tensor."""
