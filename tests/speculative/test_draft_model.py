"""The draft-model source (a smaller model drafts by greedy decoding in its own KV pool): its
drafts are the draft model's greedy continuation whatever the target kept of the last ones, its
pool never leaks, and through the engine greedy outputs stay those of plain decoding."""

import pytest
import torch

from radixlm import Engine
from radixlm.config import ServerArgs
from radixlm.engine.launcher import check_server_args
from radixlm.model.executor.runner_config import ModelRunnerConfig
from radixlm.model.loader import load_model_config
from radixlm.sampling_params import SamplingParams
from radixlm.scheduler.req import Req
from radixlm.speculative.config import SpeculativeConfig
from radixlm.speculative.draft_model import DraftModelSource
from radixlm.utils import common_prefix_len
from tests.conftest import engine_args
from tests.scheduler.harness import Driver, assert_idle_memory_ok, hf_greedy, make_scheduler

GREEDY = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
PROMPTS = [
    [5 + (i % 7) for i in range(40)],
    [100, 200, 300, 100, 200, 300, 100, 200],
    list(range(1000, 1030)),
    [7, 8, 9, 10],
    list(range(3000, 3090, 3)),
]


def llama_dir(tmp_path_factory, base_dir: str, name: str, seed: int, noise: float = 0.0) -> str:
    """A tiny llama with base_dir's config and tokenizer: fresh weights from `seed`, or (noise > 0)
    base_dir's weights plus Gaussian noise (a draft that agrees with the target often, not always).
    """
    from transformers import AutoTokenizer, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if noise:
                p.add_(torch.randn_like(p) * noise * p.std())
            elif p.dim() >= 2:
                p.normal_(0.0, model.config.initializer_range)
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def other_llama_dir(tmp_path_factory, tiny_model_dir):
    return llama_dir(tmp_path_factory, tiny_model_dir, "other-llama", seed=1)


@pytest.fixture(scope="module")
def noisy_llama_dir(tmp_path_factory, tiny_model_dir):
    return llama_dir(tmp_path_factory, tiny_model_dir, "noisy-llama", seed=2, noise=0.02)


def make_source(model_dir: str, draft_dir: str, kv_tokens: int = 4096, **opts) -> DraftModelSource:
    threads = torch.get_num_threads()  # the runner sets the process's torch threads; give them back
    try:
        opts = dict(num_threads=1, enable_invariant_checks=True, log_level="warning") | opts
        args = ServerArgs(
            model_path=model_dir,
            speculative_algorithm="draft-model",
            speculative_draft_model_path=draft_dir,
            speculative_draft_kv_tokens=kv_tokens,
            **opts,
        )
        target_vocab = load_model_config(model_dir).vocab_size
        return DraftModelSource(
            SpeculativeConfig.from_server_args(args),
            ModelRunnerConfig.from_server_args(args),
            kv_tokens,
            target_vocab,
        )
    finally:
        torch.set_num_threads(threads)


def new_req(rid: str, ids: list[int]) -> Req:
    return Req(rid, list(ids), SamplingParams(max_new_tokens=64, temperature=0))


def assert_pool_full(src: DraftModelSource) -> None:
    src.check()
    assert not src._reqs
    assert src.kv_pool.available_size() == src.kv_pool.size
    assert src.req_to_token_pool.available_size() == src.req_to_token_pool.size


def test_common_prefix_len():
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix_len([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert common_prefix_len([5], [6]) == 0
    for n in range(1, 40):
        a = list(range(40))
        b = a[:n] + [-1] + a[n + 1 :]
        assert common_prefix_len(a, b) == n


def test_drafts_are_the_draft_models_greedy_continuation(tiny_model_dir, tiny_hf_model):
    """Drafts equal HF greedy decoding of the draft model (here the tiny model itself) after the
    request's tokens: fresh, after the target kept part of the last drafts, after a rewrite of
    earlier tokens, batched with another request, and with the catch-up cut into small extends.
    The K/V of what the target kept is reused, not recomputed."""
    src = make_source(tiny_model_dir, tiny_model_dir, max_prefill_tokens=16)
    a, b = new_req("a", PROMPTS[0]), new_req("b", PROMPTS[2])
    (d,) = src.propose([a], [5])
    assert d == hf_greedy(tiny_hf_model, a.all_ids(), 5)
    st = src._reqs["a"]
    assert st.ids == a.all_ids() + d[:4]
    slots_before = src.req_to_token_pool.req_to_token[st.row, : len(st.ids)].clone()

    # The target kept 2 drafts and chose its own third token: 42 of the row's positions stay.
    a.output_ids = d[:2] + [(d[2] + 1) % 1000 + 3]
    drafts = src.propose([a, b], [4, 3])
    assert drafts == [
        hf_greedy(tiny_hf_model, a.all_ids(), 4),
        hf_greedy(tiny_hf_model, b.all_ids(), 3),
    ]
    kept = len(PROMPTS[0]) + 2
    assert torch.equal(src.req_to_token_pool.req_to_token[st.row, :kept], slots_before[:kept])

    # Every draft accepted plus the bonus token; b asked for nothing this step.
    a.output_ids += drafts[0] + [17]
    assert src.propose([a, b], [2, 0]) == [hf_greedy(tiny_hf_model, a.all_ids(), 2), []]
    # An earlier output token rewritten (as a jump-forward re-tokenization would).
    a.output_ids[1] = 99
    b.output_ids = [4, 5]
    drafts = src.propose([b, a], [3, 6])
    assert drafts == [
        hf_greedy(tiny_hf_model, b.all_ids(), 3),
        hf_greedy(tiny_hf_model, a.all_ids(), 6),
    ]
    src.release(a)
    src.release(b)
    src.release(b)  # a second release (the scheduler may send one) is harmless
    assert_pool_full(src)


def test_short_pool_drafts_less_and_never_leaks(tiny_model_dir, tiny_hf_model):
    """A 48-token draft pool: a request whose context does not fit drafts nothing; one that fits
    drafts as many tokens as the free slots allow; retracted (not running) requests give their rows
    up; a request finished without a release is dropped at the next step."""
    src = make_source(tiny_model_dir, tiny_model_dir, kv_tokens=48)
    big, small = (
        new_req("big", list(range(50, 110))),
        new_req("small", PROMPTS[2]),
    )  # 60 and 30 tokens
    assert src.propose([big], [4]) == [[]]
    assert_pool_full(src)
    (d,) = src.propose(
        [small], [30]
    )  # 30 tokens + 18 free slots: 19 drafts (the last needs no K/V)
    assert d == hf_greedy(tiny_hf_model, small.all_ids(), 19)
    assert src.kv_pool.available_size() == 0
    # small is not running this step (retracted): its row goes to the request that needs room.
    other = new_req("other", PROMPTS[3])
    assert src.propose([other], [3]) == [hf_greedy(tiny_hf_model, other.all_ids(), 3)]
    assert set(src._reqs) == {"other"}
    other.abort()  # aborted while waiting: the scheduler sends no release
    assert src.propose([small], [2]) == [hf_greedy(tiny_hf_model, small.all_ids(), 2)]
    assert set(src._reqs) == {"small"}
    src.release(small)
    assert_pool_full(src)


def test_a_failing_draft_forward_drafts_nothing(tiny_model_dir, tiny_hf_model, monkeypatch):
    """Drafts only buy speed: a draft forward that raises (invariant checks off, as in serving)
    gives no drafts this step and frees the rows it touched; the next step drafts again."""
    src = make_source(tiny_model_dir, tiny_model_dir, enable_invariant_checks=False)
    a = new_req("a", PROMPTS[1])
    forward = src.runner.forward

    def fail(fb):
        raise RuntimeError("boom")

    monkeypatch.setattr(src.runner, "forward", fail)
    assert src.propose([a], [3]) == [[]]
    assert_pool_full(src)
    monkeypatch.setattr(src.runner, "forward", forward)
    assert src.propose([a], [3]) == [hf_greedy(tiny_hf_model, a.all_ids(), 3)]


def drive(model_dir: str, abort: bool, **opts) -> Driver:
    d = Driver(make_scheduler(model_dir, max_running_requests=8, **opts))
    for i, p in enumerate(PROMPTS):
        d.submit(p, f"r{i}", max_new_tokens=40, temperature=0, ignore_eos=True)
    for _ in range(4):
        d.step()
    if abort:
        d.abort("r1")
    d.run()
    return d


@pytest.mark.parametrize("pool", [600, 160])
def test_draft_pool_is_freed_after_finish_and_abort(tiny_model_dir, pool):
    """Through the scheduler (invariants of the target's pool and of the draft pool after every
    step): requests that finish and one aborted mid-generation leave both pools full; with a
    160-token pool requests are retracted and drafts compete for the draft pool's slots, and the
    outputs stay those of plain decoding."""
    ref = drive(tiny_model_dir, False, max_total_tokens=pool)
    d = drive(
        tiny_model_dir,
        True,
        max_total_tokens=pool,
        speculative_algorithm="draft-model",
        speculative_draft_model_path=tiny_model_dir,
    )
    src = d.s.spec.controller.source
    assert isinstance(src, DraftModelSource) and src.kv_pool is not d.s.runner.token_to_kv_pool
    assert d.results["r1"].finish_reason["type"] == "abort" and len(d.results["r1"].output_ids) < 40
    for i in (0, 2, 3, 4):
        assert d.results[f"r{i}"].output_ids == ref.results[f"r{i}"].output_ids
        assert len(d.results[f"r{i}"].output_ids) == 40
    assert (
        d.s.spec.controller.stats.draft_tokens > 0 and d.s.spec.controller.stats.accepted_tokens > 0
    )
    if pool == 160:
        assert d.s.stats.num_retracted > 0
    assert_idle_memory_ok(d.s)
    assert_pool_full(src)


def test_tiny_target_and_draft_greedy_equal(
    tiny_model_dir, other_llama_dir, noisy_llama_dir, tiny_engine
):
    """A tiny random target with another tiny model as its draft (fresh weights: drafts mostly
    rejected; the target's weights plus noise: some accepted, some not), several prompts batched,
    chunked prefill, invariants after every step: outputs token for token those of plain decoding
    (the session's plain engine, tests/conftest.py)."""
    outs = tiny_engine.generate(input_ids=PROMPTS, sampling_params=[GREEDY] * len(PROMPTS))
    res, states = {None: [o["output_ids"] for o in outs]}, {}
    for draft in (other_llama_dir, noisy_llama_dir):
        opts = dict(
            max_running_requests=8,
            chunked_prefill_size=16,
            speculative_algorithm="draft-model",
            speculative_draft_model_path=draft,
            speculative_draft_policy="fixed",  # drafts that rarely pay: verified anyway
        )
        with Engine(tiny_model_dir, **engine_args(**opts)) as e:
            outs = e.generate(input_ids=PROMPTS, sampling_params=[GREEDY] * len(PROMPTS))
            res[draft] = [o["output_ids"] for o in outs]
            states[draft] = e.get_internal_state()
    for draft in (other_llama_dir, noisy_llama_dir):
        assert res[draft] == res[None]
        assert states[draft]["spec_verify_steps"] > 0 and states[draft]["spec_draft_tokens"] > 0
    noisy = states[noisy_llama_dir]
    assert 0 < noisy["spec_accepted_tokens"] < noisy["spec_draft_tokens"]


def test_default_model_as_its_own_draft(default_model_path, default_engine):
    """The default model (GGUF weights on the native kernels, batch-invariant) drafting for itself:
    outputs equal plain decoding (tests/speculative/conftest.py's plain engine) and every draft is
    accepted."""
    prompts = ["Once upon a time", "def add(a, b):\n", "The capital of France is"]
    # fixed: a draft as costly as the target never pays, the adaptive policy would stop it.
    opts = dict(
        speculative_algorithm="draft-model",
        num_threads=2,
        speculative_draft_model_path=default_model_path,
        speculative_draft_policy="fixed",
    )
    with Engine(default_model_path, **engine_args(**opts)) as e:
        outs = e.generate(prompts, [GREEDY] * len(prompts))
        st = e.get_internal_state()
    assert st["spec_draft_tokens"] > 0
    assert st["spec_accepted_tokens"] == st["spec_draft_tokens"]
    assert sum(o["meta_info"]["spec_accepted_tokens"] for o in outs) == st["spec_accepted_tokens"]
    assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in outs)
    plain = default_engine.generate(prompts, [GREEDY] * len(prompts))
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in plain]


def test_config_validation(tiny_model_dir, other_llama_dir, default_model_path):
    def check(**options):  # what the engine does with the options before it starts a process
        check_server_args(ServerArgs(**options))

    with pytest.raises(ValueError, match="speculative_draft_model_path"):
        check(speculative_algorithm="draft-model")
    with pytest.raises(ValueError, match="speculative_draft_model_path"):
        check(speculative_algorithm="ngram", speculative_draft_model_path=tiny_model_dir)
    with pytest.raises(ValueError, match="speculative_draft_model_path"):
        check(speculative_draft_model_path=tiny_model_dir)
    with pytest.raises(ValueError, match="speculative_draft_kv_tokens"):
        check(
            speculative_algorithm="draft-model",
            speculative_draft_model_path=tiny_model_dir,
            speculative_draft_kv_tokens=0,
        )
    import argparse

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = ServerArgs.from_cli_args(
        parser.parse_args(
            [
                "--speculative-algorithm",
                "draft-model",
                "--speculative-draft-model-path",
                other_llama_dir,
                "--speculative-draft-kv-tokens",
                "512",
            ]
        )
    )
    assert (args.speculative_draft_model_path, args.speculative_draft_kv_tokens) == (
        other_llama_dir,
        512,
    )
    assert ServerArgs.to_cli_argv(
        speculative_algorithm="draft-model", speculative_draft_model_path="x"
    ) == ["--speculative-algorithm", "draft-model", "--speculative-draft-model-path", "x"]


def test_draft_vocab_must_match(tmp_path, tiny_model_dir):
    """A draft model with another vocabulary is refused at startup, naming both sizes."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig.from_pretrained(tiny_model_dir)
    cfg.vocab_size = 1000
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="vocab size 1000 differs"):
        make_source(tiny_model_dir, str(tmp_path))


def test_draft_runner_config_is_the_targets_for_another_model(tiny_model_dir, other_llama_dir):
    """The draft runner keeps the target's device, dtype, attention backends, threads and seed; it
    gets its own model and pool size, float weights where the target named a GGUF's own formats, and
    no decode KV mirror (the draft rewrites positions below a row's length)."""
    import dataclasses

    from radixlm.model.executor.runner_config import ModelRunnerConfig
    from radixlm.speculative.draft_model import draft_runner_config

    args = ServerArgs(
        model_path=tiny_model_dir,
        quantization="gguf",
        attention_backend="torch",
        decode_attention_backend="native",
        num_threads=3,
        random_seed=9,
        context_length=200,
        speculative_algorithm="draft-model",
        speculative_draft_model_path=other_llama_dir,
    )
    target = ModelRunnerConfig.from_server_args(args)
    assert target.decode_kv_mirror_bytes > 0
    draft = draft_runner_config(target, other_llama_dir, kv_tokens=321)
    changed = {
        "model_path": other_llama_dir,
        "quantization": None,
        "max_total_tokens": 321,
        "decode_kv_mirror_bytes": 0,
    }
    for f in dataclasses.fields(ModelRunnerConfig):
        assert getattr(draft, f.name) == changed.get(f.name, getattr(target, f.name)), f.name
    int8 = dataclasses.replace(target, quantization="int8")
    assert draft_runner_config(int8, other_llama_dir, kv_tokens=1).quantization == "int8"
