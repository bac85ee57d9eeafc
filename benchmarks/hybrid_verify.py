"""What keeping a hybrid's states exact under speculation costs: a verify step of k + 1 rows
against a plain decode step, on a random Qwen3.5 of a small but real shape (hidden 1024, 16 Gated
DeltaNet heads of 128 x 128, 3 linear layers : 1 attention, float32), in-process.

    python benchmarks/hybrid_verify.py [--k 1,3,7] [--repeat 8] [--num-threads 2]

Per k, the median forward time of:
  decode         a plain decode step (1 row)
  verify levels  what radixlm runs (model/layers/linear_attn/draft_states.py): the state layers
                 advance level by level, the state after each draft node kept in a draft slot
  verify flat    the same rows as one extend (the state layers run once over the k + 1 tokens;
                 "python": in the Python layers, as the levels run, else maybe the one-op stack):
                 a snapshot-and-recompute design's verify step, which leaves the state after
                 every draft token and so needs...
  recompute      ...a forward of the accepted tokens from the snapshot when a draft is rejected
                 (timed here as an extend of k rows, the worst case: k - 1 accepted + the root)
  snapshot       the copy of one request's states into a snapshot slot before the step
It drives the scheduler with the tests' in-process harness (tests/scheduler/harness.py) and radix
drafts of a repeated prompt (the recorded answer: every step drafts k tokens).
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import statistics
import sys
import tempfile
import time

import radixlm  # noqa: F401  (before torch: huge pages for torch's buffers)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.model.hybrid_checkpoints import hybrid_checkpoint, tiny_tokenizer
from tests.scheduler.harness import Driver, make_scheduler

SHAPE = dict(
    hidden_size=1024,
    num_hidden_layers=4,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=128,
    intermediate_size=3072,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=16,
    max_position_embeddings=4096,
)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--k", default="1,3,7", help="draft tokens per verify step")
    p.add_argument("--repeat", type=int, default=8)
    p.add_argument("--num-threads", type=int, default=2)
    a = p.parse_args()
    path = tempfile.mkdtemp(prefix="hybrid-verify-")
    hybrid_checkpoint("qwen35", path, tiny_tokenizer(), **SHAPE)
    prompt = [random.Random(0).randrange(10, 800) for _ in range(200)]
    opts = dict(enable_invariant_checks=False, num_threads=a.num_threads, quantization="none")
    decode: list[float] = []
    for k in [int(x) for x in a.k.split(",")]:
        times: dict[str, list[float]] = collections.defaultdict(list)
        flat = [0]
        spec = make_scheduler(
            path,
            speculative_algorithm="radix",
            speculative_draft_policy="fixed",
            speculative_num_draft_tokens=k,
            speculative_eagle_topk=1,
            **opts,
        )
        forward = spec.runner.forward

        def timed(fb, forward=forward, times=times, flat=flat):
            name = "extend"
            if fb.forward_mode.is_verify():
                name = ["verify levels", "verify flat", "verify flat python"][flat[0]]
                if flat[0]:
                    fb.state_drafts = None  # timing only: the states are not kept exact
                if flat[0] == 2:  # a track that copies nothing: the Python layers, one call
                    fb.state_tracks = [[(0, 0)]] * fb.batch_size
            elif fb.forward_mode.is_decode():
                name = "decode"
            t = time.perf_counter()
            out = forward(fb)
            times[f"{name} {len(fb.input_ids)}"].append(time.perf_counter() - t)
            return out

        spec.runner.forward = timed
        d = Driver(spec)
        sp = {"max_new_tokens": (k + 1) * a.repeat, "temperature": 0, "ignore_eos": True}
        d.submit(prompt, **sp)  # records the answer (decode and verify steps of what it drafts)
        d.run()
        for f in (0, 1, 2):
            flat[0] = f
            d.submit(prompt, **sp)
            d.run()
        if not decode:  # plain decode steps, once
            plain = make_scheduler(path, **opts)
            run = plain.runner.forward

            def timed_decode(fb, run=run):
                t = time.perf_counter()
                out = run(fb)
                if fb.forward_mode.is_decode():
                    decode.append(time.perf_counter() - t)
                return out

            plain.runner.forward = timed_decode
            pd = Driver(plain)
            pd.submit(prompt, **sp)
            pd.run()
        pool = spec.runner.state_pool
        snap = []
        for _ in range(a.repeat):
            t = time.perf_counter()
            pool.apply_copies([(0, pool.rows)])
            snap.append(time.perf_counter() - t)
        med = {n: statistics.median(v) * 1e3 for n, v in times.items() if len(v) >= 3}
        med = {n: ms for n, ms in med.items() if n.startswith("verify")}
        print(f"k={k}: " + ", ".join(f"{n}: {ms:.2f} ms" for n, ms in sorted(med.items())))
        print(f"  snapshot copy: {statistics.median(snap) * 1e3:.2f} ms", end="")
        print(f"; decode (1 row): {statistics.median(decode) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
