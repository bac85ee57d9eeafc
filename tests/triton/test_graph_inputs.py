"""CUDA graphs' logic without CUDA: CudaGraphDecode (model/executor/cuda_graph_runner.py) with each
captured graph replaced by a replay that runs the model eagerly on the static batch, on CPU with the
Triton backend in the interpreter. A decode batch of 3 (two requests sharing a 40-slot prefix) goes
through the static buffers padded up to 4 (padded rows on the dummy slot 0, the group pass found on
the static slot rows) and gives the logits of the same step run eagerly. The batch sizes captured
come from --cuda-graph-bs / --cuda-graph-max-bs (graph_batch_sizes). The capture itself is
tests/gpu's (test_cuda_graph_replay_equals_eager_decode)."""

from __future__ import annotations

import pytest
import torch

from radixlm.model.executor import cuda_graph_runner
from radixlm.model.executor.cuda_graph_runner import CudaGraphDecode, NoCudaGraph, graph_batch_sizes
from radixlm.model.executor.runner import ModelRunner
from radixlm.model.executor.runner_config import ModelRunnerConfig
from radixlm.model.executor.static_decode import decode_logits
from radixlm.model.forward_batch import ForwardMode
from radixlm.sampling_params import SamplingParams
from tests.model.helpers import SMALL, save_random_llama
from tests.triton.conftest import requires_triton

pytestmark = [
    requires_triton,
    pytest.mark.skipif(
        torch.cuda.is_available(), reason="a GPU is present: tests/gpu captures real graphs"
    ),
]


class EagerReplay:
    """Stands in for a captured torch.cuda.CUDAGraph: replay() runs the step it holds."""

    def __init__(self, fn):
        self.fn = fn

    def replay(self):
        self.fn()


def test_graph_runner_pads_and_replays_like_eager(tmp_path, triton_device):
    from radixlm.cache.no_prefix_cache import NoPrefixCache
    from radixlm.scheduler.batch import PrefillChunk, ScheduleBatch
    from radixlm.scheduler.kv.cache_manager import CacheManager
    from radixlm.scheduler.req import Req

    save_random_llama(tmp_path)
    threads = torch.get_num_threads()
    try:
        runner = ModelRunner(
            ModelRunnerConfig(
                model_path=str(tmp_path),
                attention_backend="triton",
                max_total_tokens=512,
                max_running_requests=4,
                num_threads=1,
            )
        )
    finally:
        torch.set_num_threads(threads)
    # --cuda-graph-bs 4 2 1 8 2: sorted, once each, 8 left out (above --max-running-requests 4).
    sizes = graph_batch_sizes(ModelRunnerConfig(cuda_graph_bs=(4, 2, 1, 8, 2)), 4)
    assert sizes == [1, 2, 4]
    graphs = CudaGraphDecode(runner, sizes)
    for bs, fb in graphs.static.items():
        out = graphs.outputs[bs] = torch.empty(bs, SMALL["vocab_size"])
        graphs.graphs[bs] = EagerReplay(
            lambda fb=fb, out=out: out.copy_(decode_logits(runner.model, fb))
        )

    tree = NoPrefixCache()
    cm = CacheManager.create(runner.req_to_token_pool, runner.token_to_kv_pool, tree)
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(3, SMALL["vocab_size"], (n,), generator=g).tolist()
    sp = SamplingParams(max_new_tokens=8, temperature=0.0)
    shared = ids(40)
    reqs = [
        Req(rid=str(i), origin_input_ids=p, sampling_params=sp)
        for i, p in enumerate([shared + ids(3), shared + ids(5), ids(11)])
    ]
    for i, r in enumerate(reqs):
        cached = (
            runner.req_to_token_pool.req_to_token[reqs[0].req_pool_idx, :40] if i == 1 else None
        )
        cm.assign(
            r, cached if cached is not None else torch.empty(0, dtype=torch.int64), tree.root_node
        )
        fb = runner.prepare(
            ScheduleBatch(
                ForwardMode.EXTEND, chunks=[PrefillChunk.plan(r, r.seqlen - r.kv_committed_len)]
            ).prepare(cm)
        )
        r.output_ids.append(int(runner.sample(fb, runner.forward(fb).next_token_logits)))
        r.kv_committed_len = r.kv_allocated_len
    fb = runner.prepare(ScheduleBatch(ForwardMode.DECODE, decode_reqs=reqs).prepare(cm))
    assert graphs.can_run(fb)
    replayed = graphs.forward(fb)
    assert graphs.static[4].attn_metadata.prefix.kv_start.tolist() == [
        40,
        40,
        0,
        0,
    ]  # padded row 4: no group
    assert graphs.inputs.seq_lens[3].item() == 1 and graphs.inputs.kv_slots[3, 0].item() == 0
    eager = runner.forward(
        fb
    ).next_token_logits  # the same step again, eagerly (bs 3, its own splits)
    diff = (replayed - eager).abs().max().item()
    assert diff < 1e-4, f"replayed vs eager logits differ by {diff}"


def test_cuda_graph_bs_and_max_bs_choose_the_captured_sizes(monkeypatch):
    def sizes(**kw):  # with --max-running-requests 64
        return graph_batch_sizes(ModelRunnerConfig(**kw), 64)

    # SGLang's list (1, 2, 4, 8, 12, then every 8) up to --cuda-graph-max-bs and the cap itself.
    assert sizes() == [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64]
    assert sizes(cuda_graph_max_bs=20) == [1, 2, 4, 8, 12, 16, 20]
    # --cuda-graph-bs: exactly those, sorted and once each; none above --max-running-requests (no
    # decode batch is larger) or --cuda-graph-max-bs when that is given too.
    assert sizes(cuda_graph_bs=(64, 1)) == [1, 64]
    assert sizes(cuda_graph_bs=(1, 3, 3, 96)) == [1, 3]
    assert sizes(cuda_graph_bs=(1, 32, 64), cuda_graph_max_bs=32) == [1, 32]
    with pytest.raises(ValueError, match="cuda_graph_bs must be batch sizes >= 1"):
        ModelRunnerConfig(cuda_graph_bs=(0, 4))
    # create_cuda_graphs captures what they chose (the capture itself stubbed: no GPU here), and
    # says why nothing is captured when no size fits.
    made = []

    class Captured:
        def __init__(self, runner, batch_sizes):
            made.append(batch_sizes)

        def capture(self):
            return 0.0

    monkeypatch.setattr(cuda_graph_runner, "CudaGraphDecode", Captured)
    monkeypatch.setattr(cuda_graph_runner, "why_not_captured", lambda runner: None)
    runner = type("Runner", (), {"max_running_requests": 8})()
    config = ModelRunnerConfig(cuda_graph_bs=(8, 1, 4))
    assert isinstance(cuda_graph_runner.create_cuda_graphs(runner, config), Captured)
    assert made == [[1, 4, 8]]
    graphs = cuda_graph_runner.create_cuda_graphs(runner, ModelRunnerConfig(cuda_graph_bs=(16,)))
    assert isinstance(graphs, NoCudaGraph) and graphs.info()["cuda_graph"]["reason"] == (
        "no --cuda-graph-bs size is within --max-running-requests 8 and --cuda-graph-max-bs"
    )
