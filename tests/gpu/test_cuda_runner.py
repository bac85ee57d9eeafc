"""On a GPU, in-process: a decode step replayed from a CUDA graph gives the logits of the same step
run eagerly, at a captured batch size and at one padded up to the next (float32, so the comparison
is tight); the runner never calls the native CPU ops."""

from __future__ import annotations

import torch

from radixlm.model.executor.compiled_decode import EagerDecode
from radixlm.model.executor.cuda_graph_runner import CudaGraphDecode
from tests.gpu.conftest import CUDA

pytestmark = CUDA


def _runner(path, **kw):
    from radixlm.model.executor.runner import ModelRunner
    from radixlm.model.executor.runner_config import ModelRunnerConfig

    return ModelRunner(
        ModelRunnerConfig(
            model_path=path,
            device="cuda",
            max_total_tokens=8192,
            max_running_requests=16,
            cuda_graph_max_bs=8,
            **kw,
        )
    )


def _prefill_then_decode_batch(runner, bs):
    from radixlm.cache.no_prefix_cache import NoPrefixCache
    from radixlm.model.forward_batch import ForwardMode
    from radixlm.sampling_params import SamplingParams
    from radixlm.scheduler.batch import PrefillChunk, ScheduleBatch
    from radixlm.scheduler.kv.cache_manager import CacheManager
    from radixlm.scheduler.req import Req

    runner.req_to_token_pool.clear()
    runner.token_to_kv_pool.clear()
    tree = NoPrefixCache()
    cm = CacheManager.create(runner.req_to_token_pool, runner.token_to_kv_pool, tree)
    g = torch.Generator().manual_seed(bs)
    reqs = []
    for i in range(bs):
        ids = torch.randint(
            10, 40000, (20 + 7 * i,), generator=g
        ).tolist()  # within SmolLM2's vocabulary
        r = Req(
            rid=str(i),
            origin_input_ids=ids,
            sampling_params=SamplingParams(max_new_tokens=8, temperature=0),
        )
        cm.assign(r, torch.empty(0, dtype=torch.int64), tree.root_node)
        reqs.append(r)
    fb = runner.prepare(
        ScheduleBatch(
            ForwardMode.EXTEND, chunks=[PrefillChunk.plan(r, r.seqlen) for r in reqs]
        ).prepare(cm)
    )
    for r, tok in zip(reqs, runner.sample(fb, runner.forward(fb).next_token_logits).tolist()):
        r.output_ids.append(tok)
        r.kv_committed_len = r.kv_allocated_len
    return runner.prepare(ScheduleBatch(ForwardMode.DECODE, decode_reqs=reqs).prepare(cm))


def test_cuda_graph_replay_equals_eager_decode(gpu_model):
    runner = _runner(gpu_model[0], dtype="float32")
    graphs = runner.decode_graphs
    assert isinstance(graphs, CudaGraphDecode), graphs.info()
    assert graphs.batch_sizes == (1, 2, 4, 8)
    for bs in (4, 3):  # a captured size, and one padded up to 4
        fb = _prefill_then_decode_batch(runner, bs)
        replayed = runner.forward(fb).next_token_logits
        steps = graphs.decode_steps
        runner.decode_graphs = EagerDecode()
        try:
            eager = runner.forward(
                fb
            ).next_token_logits  # the same step again: same K/V written, same reads
        finally:
            runner.decode_graphs = graphs
        assert graphs.decode_steps == steps
        diff = (replayed - eager).abs().max().item()
        assert diff < 1e-3, f"bs {bs}: graph vs eager logits differ by {diff}"
        assert torch.equal(replayed.argmax(-1), eager.argmax(-1))


def test_no_native_cpu_op_on_cuda(gpu_model, monkeypatch):
    """The native kernels (the fused decoder op, the quantized GEMMs, the paged CPU attention) are
    never handed CUDA tensors: any call of torch.ops.radixlm fails the test."""
    import radixlm.kernels.ops as kops

    def refuse(*a, **kw):
        raise AssertionError("a native CPU op was called on the CUDA path")

    monkeypatch.setattr(kops, "ops", refuse)
    monkeypatch.setattr(kops, "_cpu_ops", False)
    runner = _runner(gpu_model[0], dtype="bfloat16", disable_cuda_graph=True)
    fb = _prefill_then_decode_batch(runner, 3)
    logits = runner.forward(fb).next_token_logits
    assert logits.is_cuda and torch.isfinite(logits).all()
