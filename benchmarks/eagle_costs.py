"""What an EAGLE proposal costs against a decode step, default model, in-process: the head's
catch-up and tree levels (EagleDraftSource.propose) and the verify forward they lead to, by draft
shape and draft vocabulary, beside a plain decode step. No acceptance figures: the head's weights do
not change these times (a random head is used unless --head-dir names one).

    python benchmarks/eagle_costs.py [--head-dir DIR] [--shapes 1x1,1x3,1x5,4x3,4x5] [--vocab
    0,4096,8192]

A shape WxD is --speculative-eagle-topk W, --speculative-num-steps D (trees of up to
--speculative-num-draft-tokens nodes, default 8); vocab V: a token map of V tokens (0: the target's
whole LM head). Every step drafts (--speculative-draft-policy fixed). It drives the scheduler with
the tests' in-process harness (tests/scheduler/harness.py); medians over the decode steps of
--requests requests of --output-len tokens after a --prefix-token prompt.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

import radixlm  # noqa: F401  (before torch: huge pages for torch's buffers)
from radixlm.model.loader import default_model_path, load_model_config
from radixlm.speculative.eagle_checkpoint import save_eagle_head, save_token_map
from radixlm.speculative.eagle_head import EagleHead, EagleHeadConfig

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # the repository root
from tests.scheduler.harness import Driver, make_scheduler


def measure(model: str, opts: dict, a: argparse.Namespace) -> tuple[float, float, float]:
    """(median propose ms, median forward ms, median step ms) over the decode / verify steps."""
    s = make_scheduler(model, enable_invariant_checks=False, num_threads=a.num_threads, **opts)
    d = Driver(s)
    propose_t, forward_t, step_t = [], [], []
    forward = s.runner.forward

    def timed_forward(fb):
        t = time.perf_counter()
        out = forward(fb)
        if not fb.forward_mode.is_extend() or fb.forward_mode.is_verify():
            forward_t.append(time.perf_counter() - t)
        return out

    s.runner.forward = timed_forward
    if s.spec.__class__.__name__ == "SpecDecoding":
        source = s.spec.controller.source
        propose = source.propose

        def timed_propose(*args):
            t = time.perf_counter()
            out = propose(*args)
            propose_t.append(time.perf_counter() - t)
            return out

        source.propose = timed_propose
    g = torch.Generator().manual_seed(0)
    for _r in range(a.requests):
        prompt = torch.randint(100, 40000, (a.prefix,), generator=g).tolist()
        d.submit(prompt, max_new_tokens=a.output_len, temperature=0, ignore_eos=True)
        d.step()  # the prefill
        while not d.idle():
            t = time.perf_counter()
            d.step()
            step_t.append(time.perf_counter() - t)
    med = lambda xs: 1000 * statistics.median(xs) if xs else 0.0
    return med(propose_t), med(forward_t), med(step_t)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model-path", default=None, help="default: the embedded SmolLM2 GGUF")
    p.add_argument(
        "--head-dir", default=None, help="an EAGLE head (default: a random one for the model)"
    )
    p.add_argument("--shapes", default="1x1,1x3,1x5,4x3,4x5")
    p.add_argument(
        "--vocab", default="0,4096,8192", help="token map sizes (0: the whole vocabulary)"
    )
    p.add_argument("--num-draft-tokens", type=int, default=8)
    p.add_argument("--prefix", type=int, default=300)
    p.add_argument("--output-len", type=int, default=24)
    p.add_argument("--requests", type=int, default=2)
    p.add_argument("--num-threads", type=int, default=None, help="default: every core")
    a = p.parse_args()
    model = a.model_path or default_model_path()
    cfg = load_model_config(model)
    tmp = tempfile.mkdtemp(prefix="eagle-costs-")
    head = a.head_dir
    if head is None:
        torch.manual_seed(0)
        head = os.path.join(tmp, "head")
        save_eagle_head(EagleHead(EagleHeadConfig.for_target(cfg, "eagle")), head, {})
    _, fwd, step = measure(model, {}, a)
    print(f"no speculation: forward {fwd:.2f} ms, decode step {step:.2f} ms")
    print("| shape (topk x steps) | token map | propose ms | verify forward ms | step ms |")
    print("|---|---|---|---|---|")
    for vocab in (int(v) for v in a.vocab.split(",")):
        opts = dict(
            speculative_algorithm="eagle",
            speculative_draft_model_path=head,
            speculative_draft_policy="fixed",
            speculative_num_draft_tokens=a.num_draft_tokens,
        )
        if vocab:
            save_token_map(torch.arange(vocab), os.path.join(tmp, f"map{vocab}.pt"))
            opts["speculative_token_map"] = os.path.join(tmp, f"map{vocab}.pt")
        for shape in a.shapes.split(","):
            width, depth = (int(x) for x in shape.split("x"))
            prop, fwd, step = measure(
                model, {**opts, "speculative_eagle_topk": width, "speculative_num_steps": depth}, a
            )
            print(
                f"| {shape} | {vocab or cfg.vocab_size} | {prop:.2f} | {fwd:.2f} | {step:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
