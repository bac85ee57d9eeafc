"""The benchmarks' read rates (bench/device_rates.py) and the weight tensors they read
(model/memory/weight_memory.py: weight_tensors)."""

import torch

from radixlm.bench.device_rates import tensors_read_rate_gbps
from radixlm.model.memory.weight_memory import weight_bytes, weight_tensors


def test_tensors_read_rate_reads_the_large_tensors_only():
    big = [torch.ones(4 * 2**20), torch.zeros(2**20, dtype=torch.int64)]  # 16 and 8 MiB
    rate = tensors_read_rate_gbps(big)
    assert rate is not None and rate > 0.5  # GB/s: any machine streams 24 MiB faster than this
    small = [torch.ones(1000), torch.ones(2**20)[1:]]  # 4 KB; 4 MiB - 4 bytes (not 8-byte units)
    assert tensors_read_rate_gbps(small) is None
    assert tensors_read_rate_gbps(small, min_bytes=1024) > 0  # the first read


def test_weight_tensors_are_every_weight_storage_once():
    from radixlm.model.loader import load_model

    model = load_model(None).model  # the default GGUF: quantized matrices, a tied table
    tensors = weight_tensors(model)
    ptrs = [t.untyped_storage().data_ptr() for t in tensors]
    assert len(ptrs) == len(set(ptrs))
    assert sum(t.untyped_storage().nbytes() for t in tensors) == weight_bytes(model)
