"""The GPU path waits for the GPU only for the sampled tokens: a tiny model's steps (a prefill over
a prefix shared in the pool, decode steps with the group pass, a MIXED batch, a TARGET_VERIFY
batch), each from the scheduler's ScheduleBatch.prepare through ModelRunner.prepare, the forward, a
grammar mask and sampling, run under tests/device_guard.py's DeviceGuard with the Triton backend
(its kernels in the interpreter), which raises on any host sync and on host tensors meeting device
ones. Then the runner, model, sampler and KV pool sources are grepped for CPU-only assumptions
outside the places that choose by device."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

from radixlm.constrained.base_grammar_backend import BaseGrammarBackend
from radixlm.model.executor.runner import ModelRunner
from radixlm.model.executor.runner_config import ModelRunnerConfig
from radixlm.model.forward_batch import ForwardMode
from radixlm.model.layers.moe.moe_block import MoeSpec, SparseMoeBlock
from radixlm.sampling_params import SamplingParams
from radixlm.speculative.draft_tree import ROOT, DraftTree
from tests.device_guard import device_guard
from tests.model.helpers import SMALL, save_random_llama
from tests.triton.conftest import requires_triton

pytestmark = requires_triton


@pytest.fixture(scope="module")
def runner(tmp_path_factory, triton_device):
    path = tmp_path_factory.mktemp("guarded")
    save_random_llama(path)
    threads = torch.get_num_threads()
    try:
        # bfloat16: the layers run the torch code a GPU runs where no fused kernel applies.
        yield ModelRunner(
            ModelRunnerConfig(
                model_path=str(path),
                device=str(triton_device),
                dtype="bfloat16",
                attention_backend="triton",
                max_total_tokens=1024,
                max_running_requests=8,
                num_threads=1,
            )
        )
    finally:
        torch.set_num_threads(threads)


def test_steps_never_wait_for_the_device(runner, triton_device):
    from radixlm.cache.no_prefix_cache import NoPrefixCache
    from radixlm.scheduler.batch import PrefillChunk, ScheduleBatch
    from radixlm.scheduler.kv.cache_manager import CacheManager
    from radixlm.scheduler.req import Req

    tree = NoPrefixCache()
    cm = CacheManager.create(runner.req_to_token_pool, runner.token_to_kv_pool, tree)
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(3, SMALL["vocab_size"], (n,), generator=g).tolist()
    samplings = [
        SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True),
        SamplingParams(max_new_tokens=16, temperature=0.8, top_p=0.9, top_k=20, ignore_eos=True),
        SamplingParams(max_new_tokens=16, temperature=0.7, min_p=0.05, seed=5, ignore_eos=True),
    ]

    def req(rid, prompt, sp, cached=None):
        r = Req(rid=rid, origin_input_ids=prompt, sampling_params=sp)
        cm.assign(
            r, cached if cached is not None else torch.empty(0, dtype=torch.int64), tree.root_node
        )
        return r

    def extend(reqs):
        return ScheduleBatch(
            ForwardMode.EXTEND,
            chunks=[PrefillChunk.plan(r, r.seqlen - r.kv_committed_len) for r in reqs],
        )

    def step(batch, guard_mask=False):
        """One step under the guard; the sampled ids read back after it (the one sync a step
        has)."""
        with device_guard(triton_device) as guard:
            fb = runner.prepare(batch.prepare(cm))
            out = runner.forward(fb)
            logits = out.next_token_logits
            if guard_mask:  # a constrained row: the host-filled bitmask moved over and applied
                mask = BaseGrammarBackend.allocate_vocab_mask(
                    runner.vocab_size, fb.batch_size, logits.device
                )
                mask[0, :2] = 0
                logits = logits.clone()
                BaseGrammarBackend.apply_vocab_mask(
                    logits, BaseGrammarBackend.move_vocab_mask(mask, logits.device)
                )
            next_ids = runner.sample(fb, logits)
        assert guard.calls > 100, "the guard saw the step"
        for r, tok in zip(batch.reqs, next_ids.tolist()):
            r.output_ids.append(tok)
            r.kv_committed_len = r.kv_allocated_len
        return out

    shared = ids(40)
    a = req("a", shared + ids(5), samplings[0])
    step(extend([a]))
    b = req(
        "b",
        shared + ids(7),
        samplings[1],
        cached=runner.req_to_token_pool.req_to_token[a.req_pool_idx, :40],
    )
    c = req("c", ids(9), samplings[2])
    step(extend([b, c]), guard_mask=True)
    running = [a, b, c]
    for _ in range(2):  # a and b share 40 slots: the decode group pass
        step(ScheduleBatch(ForwardMode.DECODE, decode_reqs=running), guard_mask=True)
    d = req("d", ids(6), samplings[0])
    step(
        ScheduleBatch(
            ForwardMode.MIXED, chunks=[PrefillChunk.plan(d, d.seqlen)], decode_reqs=running
        )
    )
    out = step(
        ScheduleBatch(
            ForwardMode.TARGET_VERIFY,
            decode_reqs=[a, c, d],
            drafts=[
                DraftTree(tuple(ids(3)), (ROOT, ROOT, 0)),
                DraftTree.empty(),
                DraftTree.chain(ids(2)),
            ],
        )
    )  # a tree: its mask too
    assert [tuple(r.shape) for r in out.row_logits] == [
        (4, SMALL["vocab_size"]),
        (1, SMALL["vocab_size"]),
        (3, SMALL["vocab_size"]),
    ]


def test_overlap_steps_queue_without_waiting(runner, triton_device):
    """The overlap executor's decode steps: building step N+1 while N is queued, resolving N+1's
    inputs from N's future slots, storing the sampled ids and starting their copy to the host all
    run without a wait (on CUDA the worker queues N+1 behind N); the ids are read once the guard is
    gone, and equal those of the same steps run one after the other."""
    from radixlm.cache.no_prefix_cache import NoPrefixCache
    from radixlm.scheduler.batch import PrefillChunk, ScheduleBatch
    from radixlm.scheduler.decoding.spec_decoding import NoSpeculation
    from radixlm.scheduler.execution.executor import InlineExecutor, OverlapExecutor
    from radixlm.scheduler.kv.cache_manager import CacheManager
    from radixlm.scheduler.req import Req

    no_grammar = type("NoGrammar", (), {"mask": staticmethod(lambda batch, lg: (lg, {}))})()
    sp = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)

    def three_steps(executor_cls, guarded: bool) -> list[list[int]]:
        tree = NoPrefixCache()
        cm = CacheManager.create(runner.req_to_token_pool, runner.token_to_kv_pool, tree)
        ex = executor_cls(runner, cm, no_grammar, NoSpeculation())
        reqs = []
        for i, n in enumerate((5, 9)):
            r = Req(rid=str(i), origin_input_ids=list(range(3, 3 + n)), sampling_params=sp)
            cm.assign(r, torch.empty(0, dtype=torch.int64), tree.root_node)
            reqs.append(r)

        def take(launched):
            ids = launched.result.result().wait().next_ids
            assert len(ids) == len(reqs)
            for r, tok in zip(reqs, ids):
                r.output_ids.append(tok)
                r.kv_committed_len = r.kv_allocated_len
            return ids

        chunks = [PrefillChunk.plan(r, r.seqlen) for r in reqs]
        out = [take(ex.launch(ScheduleBatch(ForwardMode.EXTEND, chunks=chunks)))]
        decode = lambda: ScheduleBatch(ForwardMode.DECODE, decode_reqs=reqs)
        try:
            if not guarded:
                out += [take(ex.launch(decode())), take(ex.launch(decode()))]
                return out
            for r in reqs:
                r.future_slot = None
            with device_guard(triton_device) as guard:
                a = ex.launch(decode())
                a.result.result()  # queued, its ids not read back
                b = ex.launch(decode())  # built while a is in flight: a's future slots
                b.result.result()
            assert guard.calls > 50, "the guard saw both steps"  # 100 on CUDA (graph replays)
            assert b.worker_batch.input_ids == [-(s + 1) for s in a.future_slots]
            assert a.result.result().seconds > 0
            out += [take(a), take(b)]
            return out
        finally:
            ex.shutdown()

    assert three_steps(OverlapExecutor, True) == three_steps(InlineExecutor, False)


def test_moe_layer_on_the_triton_path_never_waits(triton_device):
    """A MoE block whose experts take the Triton grouped GEMM (CUDA's path): routing, the expert
    load count and the sorted pairs stay on the device."""
    from radixlm.model.layers.moe import triton as moe_triton

    torch.manual_seed(0)
    with torch.device(triton_device):
        block = SparseMoeBlock(
            32, MoeSpec(num_experts=4, top_k=2, intermediate_size=24, renormalize=True), 0
        )
        for p in block.parameters():
            p.data.normal_(0, 0.2)
        block.finish_loading()
        x = torch.randn(5, 32)
    if triton_device.type == "cuda":
        assert block._experts is moe_triton.run
    block._experts = moe_triton.run  # what experts_path picks for float experts on CUDA
    with device_guard(triton_device):
        out = block(x)
    assert torch.isfinite(out).all() and int(block.expert_load.sum()) == 10


# Device literals and CPU-only calls, where a GPU run would keep work on the host or wait for it, in
# the modules of a GPU step; each allowed line is a choice made by device or a fallback (named).
CPU_ONLY = re.compile(
    r'device="cpu"|device=\'cpu\'|\.cpu\(\)|\.numpy\(\)|set_num_threads|pin_memory=True|'
    r"\.item\(\)|bincount"
)
ALLOWED = {
    "model/executor/runner.py": [
        "torch.set_num_threads(config.num_threads"
    ],  # inside `if self.device.type == "cpu"`
    "model/layers/moe/fused_moe.py": [
        "bincount"
    ],  # fused_experts_torch: the fallback where no kernel applies
    "model/layers/moe/moe_block.py": ["bincount"],  # the docstring saying why not
    "model/layers/sampler.py": [],
    "model/layers/sampler_extras.py": [],
    "model/layers/moe/triton.py": [],
    "model/layers/attention/triton_backend.py": [],
    "model/executor/cuda_graph_runner.py": [],
    "model/executor/static_decode.py": [],
    "cache/memory_pool.py": [],
    "lora/delta.py": [],
    "scheduler/batch.py": [],
    "model/host_copy.py": ["pin_memory=True"],  # HostCopy's CUDA branch
    "scheduler/execution/overlap.py": [],
    "scheduler/execution/executor.py": [],
    **{
        f"kernels/triton_ops/{m}.py": []
        for m in (
            "decode_attention",
            "extend_attention",
            "elementwise",
            "fused_moe",
            "lora",
            "prefix_groups",
            "tiles",
        )
    },
}


@pytest.mark.parametrize("path", sorted(ALLOWED))
def test_no_cpu_only_assumptions_in_the_hot_path(path):
    source = pathlib.Path(__file__).parents[2] / "radixlm" / path
    hits = [line.strip() for line in source.read_text().splitlines() if CPU_ONLY.search(line)]
    unexplained = [h for h in hits if not any(a in h for a in ALLOWED[path])]
    assert not unexplained, f"{path}: {unexplained}"
