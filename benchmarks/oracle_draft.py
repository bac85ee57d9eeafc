"""End-to-end speed of speculative decoding at a chosen acceptance rate, with an oracle draft used
only here (issue 91's speed model): the drafts are the model's own recorded greedy continuation,
each draft token replaced by a wrong one with probability 1 - p, so a verify step sees the
acceptance an MTP / EAGLE head with per-token rate p would give, for any model file.

    python benchmarks/oracle_draft.py --model-path FILE [--batch-sizes 1,8]
        [--acceptance 0.5,0.7,0.9] [--draft-tokens 3] [--new-tokens 64] [--prompt-len 128]
        [--num-threads N] [--draft-step-ms MS]

Per batch size: a plain greedy run (prompts cached first, so each run is its decode), then one run
per acceptance rate with the oracle drafting `--draft-tokens` a step through the tree-verify path
(fixed policy: every request drafts every step, as SGLang's EAGLE / NEXTN). Outputs are compared
with the plain run's: a request that left it (a near-tie the verify forward's float order flips, on
the hybrids) is counted, its acceptance after that is lost. Reported: decode tok/s, the speed-up
over plain, tokens per verify step, and the same speed-up with a draft head's cost added:
`--draft-step-ms` per draft token and step (default: this model's LM head over the batch's rows,
measured here, the dominant part of an MTP draft step; 0 to leave it out)."""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import radixlm  # noqa: F401  (before torch: huge pages for torch's buffers)
from radixlm.model.loader import default_model_path
from radixlm.speculative.config import DRAFT_SOURCE_REGISTRY, DraftSourceInfo
from radixlm.speculative.draft_source import PerRequestDraftSource

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # the repository root
from tests.scheduler.harness import Driver, make_scheduler

ORACLE = "oracle"


class OracleDraftSource(PerRequestDraftSource):
    """Drafts the recorded continuation of the request's prompt, each token wrong with probability
    1 - p (a wrong token: the recorded one + 1), seeded by the request's position."""

    def __init__(self, recorded: dict[tuple, list[int]], p: float, vocab_size: int, seed: int = 0):
        self.recorded, self.p, self.vocab, self.seed = recorded, p, vocab_size, seed

    def draft_for(self, req, k, shape=None):
        out = self.recorded[tuple(req.origin_input_ids)]
        pos = len(req.output_ids)
        rng = random.Random(f"{self.seed}:{req.rid}:{pos}")
        return [t if rng.random() < self.p else (t + 1) % self.vocab for t in out[pos : pos + k]]


_oracle: dict = {}  # what the registered factory builds the next source from


def _create_oracle(config, target):
    return OracleDraftSource(_oracle["recorded"], _oracle["p"], target.vocab_size)


def decode_run(scheduler, prompts: list[list[int]], new_tokens: int) -> tuple[float, dict]:
    """Cached prompts, then `new_tokens` greedy tokens each, all at once: (seconds, outputs)."""
    d = Driver(scheduler)
    for p in prompts:  # cache the prompts: the timed run's prefill is one token each
        d.submit(p, max_new_tokens=1, temperature=0)
    d.run()
    rids = [d.submit(p, max_new_tokens=new_tokens, temperature=0, ignore_eos=True) for p in prompts]
    t = time.perf_counter()
    d.run()
    seconds = time.perf_counter() - t
    return seconds, {tuple(p): d.results[r].output_ids for p, r in zip(prompts, rids)}


def expected(p: float, k: int) -> float:
    """Tokens a verify step yields with k chained drafts, each accepted with probability p."""
    return sum(p**i for i in range(k + 1))


def off_path(outs: dict, recorded: dict) -> str:
    """Requests whose output left the recorded greedy run, with where: on an exact path none do;
    where the verify forward's float order differs from a decode step's (the hybrids' recurrent
    layers run chunked there) a near-tie can flip, and that request's later drafts are wrong."""
    firsts = [
        next((i for i, (x, y) in enumerate(zip(out, recorded[k])) if x != y), len(out))
        for k, out in outs.items()
        if out != recorded[k]
    ]
    return f"{len(firsts)} (at {sorted(firsts)})" if firsts else "0"


def lm_head_ms(scheduler, rows: int, repeat: int = 20) -> float:
    """The model's LM head over `rows` rows (median ms): an MTP draft step's dominant cost."""
    import torch

    model = scheduler.runner.model
    hidden = torch.randn(rows, scheduler.runner.hf_config.hidden_size)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        model.compute_logits(hidden)
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model-path", default=None, help="default: the embedded SmolLM2 GGUF")
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--acceptance", default="0.5,0.7,0.9")
    ap.add_argument("--draft-tokens", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--num-threads", type=int, default=None, help="default: every core")
    ap.add_argument("--draft-step-ms", type=float, default=None, help="default: the LM head's")
    a = ap.parse_args()
    model = a.model_path or default_model_path()
    opts = {"enable_invariant_checks": False}
    if a.num_threads:
        opts["num_threads"] = a.num_threads
    DRAFT_SOURCE_REGISTRY.register(ORACLE, _create_oracle, DraftSourceInfo(topk=1))
    plain = make_scheduler(model, **opts)
    vocab = plain.runner.vocab_size
    rng = random.Random(0)
    print(f"model {os.path.basename(model)}, {a.draft_tokens} draft tokens a step, "
          f"{a.new_tokens} new tokens after a cached {a.prompt_len}-token prompt")  # fmt: skip
    print(
        "| batch | p | decode tok/s | vs plain | tokens / verify | draft ms | with draft cost"
        " | off the recorded path |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for b in (int(x) for x in a.batch_sizes.split(",")):
        prompts = [[rng.randrange(100, vocab - 1) for _ in range(a.prompt_len)] for _ in range(b)]
        base_s, recorded = decode_run(plain, prompts, a.new_tokens)
        base = b * a.new_tokens / base_s
        draft_ms = a.draft_step_ms if a.draft_step_ms is not None else lm_head_ms(plain, b)
        print(f"| {b} | plain | {base:.1f} | 1.00x | 1 | | | |")
        for p in (float(x) for x in a.acceptance.split(",")):
            _oracle.update(recorded=recorded, p=p)
            spec = make_scheduler(
                model,
                **opts,
                speculative_algorithm=ORACLE,
                speculative_num_draft_tokens=a.draft_tokens,
                speculative_eagle_topk=1,
                speculative_draft_policy="fixed",
            )
            seconds, outs = decode_run(spec, prompts, a.new_tokens)
            left = off_path(outs, recorded)
            info = spec.spec.info()
            steps, per_step = info["spec_verify_steps"], info["spec_accept_length"]
            with_cost = seconds + steps * a.draft_tokens * draft_ms / 1000
            spec.executor.shutdown()
            print(
                f"| {b} | {p:g} | {b * a.new_tokens / seconds:.1f} | {base_s / seconds:.2f}x"
                f" | {per_step:.2f} (expected {expected(p, a.draft_tokens):.2f}) | {draft_ms:.1f}"
                f" | {base_s / with_cost:.2f}x | {left} |"
            )
    plain.executor.shutdown()


if __name__ == "__main__":
    main()
