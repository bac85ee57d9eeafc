"""glibc's allocation policy around a CPU ModelRunner's load: the load hands its large frees back
to the OS (model/memory/weight_memory.py), and serving afterwards keeps freed memory in the heap,
so a forward's activations (MBs each) reuse pages instead of faulting fresh ones every step
(utils.py). The load used to set its policy after the runner had set the serving one, and every
prefill re-faulted."""

import ctypes

import pytest
import torch


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",  # bytes held in mmapped blocks
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def mmapped_bytes() -> int:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    return libc.mallinfo2().hblkhd


def test_activations_after_load_come_from_the_heap(default_model_path):
    try:
        mmapped_bytes()
    except (OSError, AttributeError):
        pytest.fail("glibc >= 2.33 (mallinfo2) is what radixlm's CPU images run on")
    from radixlm.model.executor.runner import ModelRunner
    from radixlm.model.executor.runner_config import ModelRunnerConfig

    threads = torch.get_num_threads()
    try:
        runner = ModelRunner(
            ModelRunnerConfig(
                model_path=default_model_path,
                num_threads=1,
                max_total_tokens=256,
                max_running_requests=1,
            )
        )
        before = mmapped_bytes()
        # a 512-token prefill's MLP activations for this model: 512 x 3072 floats (6 MiB)
        held = [torch.empty(512, 3072) for _ in range(3)]
        grown = mmapped_bytes() - before
        del held, runner
    finally:
        torch.set_num_threads(threads)
    assert grown < 2**20, f"{grown} bytes of new mmapped blocks for 18 MiB of activations"
