"""What a low-precision KV cache costs at length: perplexity of a long text and needle-in-a-haystack
retrieval at several context lengths, per --kv-cache-dtype, one Engine at a time.

    python benchmarks/long_context.py --lengths 2048 4096 8000 --kv-dtypes float16 int8 int4

Model: --model-path (default: the embedded SmolLM2-135M-Instruct, a real checkpoint and the only
one obtainable here; its context is 8,192 tokens). Weights: the model's own quantization for every
KV type, so the figures differ by the KV cache alone.
- Perplexity: the prompt logprobs of the first L tokens of a fixed long text (this repository's
  docs, concatenated in a fixed order: English prose about the engine, offline and stable).
- Needle: a sentence "The secret code for the blue door is NNNN." placed at 10%, 50% and 90% of an
  L-token filler (the same text), then the question; greedy, 8 tokens; a hit when NNNN is in the
  answer. Each (length, depth) uses its own code.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DOCS = ("architecture.md", "speculative.md", "hicache.md", "benchmarks.md", "sglang_flags.md")
DEPTHS = (0.1, 0.5, 0.9)


def long_text() -> str:
    parts = [(ROOT / "docs" / name).read_text() for name in DOCS if (ROOT / "docs" / name).exists()]
    return "\n\n".join(parts)


def needle_prompt(tok, filler: list[int], length: int, depth: float, code: int) -> list[int]:
    """A chat turn: the filler with the needle at `depth`, the question, and the answer's start
    (the assistant turn begun with "The secret code for the blue door is")."""
    needle = tok.encode(f" The secret code for the blue door is {code}. ")
    head, tail = tok.apply_chat_template(
        [{"role": "user", "content": "@@"}], tokenize=False, add_generation_prompt=True
    ).split("@@")
    question = "\n\nWhat is the secret code for the blue door?"
    answer = "The secret code for the blue door is"
    pre, post = tok.encode(head), tok.encode(question + tail + answer)
    room = length - len(pre) - len(needle) - len(post)
    at = int(room * depth)
    return pre + filler[:at] + needle + filler[at:room] + post


def run(model_path, kv_dtype: str, lengths: list[int], threads: int) -> dict:
    from radixlm.bench.quality import perplexity
    from radixlm.config import ServerArgs
    from radixlm.engine.engine import Engine
    from radixlm.model.loader import load_tokenizer

    tok = load_tokenizer(model_path)
    ids = tok.encode(long_text())
    if len(ids) < max(lengths):
        raise SystemExit(f"the text has {len(ids)} tokens, fewer than --lengths' {max(lengths)}")
    args = ServerArgs(
        model_path=model_path,
        kv_cache_dtype=kv_dtype,
        num_threads=threads,
        context_length=max(lengths) + 64,
        log_level="warning",
        disable_radix_cache=True,  # every prompt computed in full, with this KV type
    )
    res = {"kv_cache_dtype": kv_dtype, "ppl": {}, "needle": {}}
    with Engine(**dataclasses.asdict(args)) as engine:
        for n in lengths:
            t0 = time.time()
            res["ppl"][n] = perplexity(engine, ids[:n])
            hits = []
            for i, depth in enumerate(DEPTHS):
                code = 1000 + (7919 * (n + i)) % 9000
                prompt = needle_prompt(tok, ids, n, depth, code)
                out = engine.generate(
                    input_ids=prompt, sampling_params={"max_new_tokens": 8, "temperature": 0}
                )
                hits.append(str(code) in out["text"])
            res["needle"][n] = hits
            print(
                f"{kv_dtype} L={n}: ppl {res['ppl'][n]:.4f}, needle {sum(hits)}/{len(hits)}"
                f" ({time.time() - t0:.0f} s)",
                flush=True,
            )
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default=None)
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8000])
    p.add_argument("--kv-dtypes", nargs="+", default=["float16", "int8", "int4"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--output", default=None, help="write the results as JSON")
    a = p.parse_args()
    results = [run(a.model_path, d, a.lengths, a.threads) for d in a.kv_dtypes]
    base = results[0]
    print(f"\n| KV | {' | '.join(f'ppl @{n}' for n in a.lengths)} | needle hits |")
    print(f"|---|{'---|' * len(a.lengths)}---|")
    for r in results:
        cells = [
            f"{r['ppl'][n]:.3f} ({(r['ppl'][n] / base['ppl'][n] - 1) * 100:+.1f}%)"
            for n in a.lengths
        ]
        hits = sum(sum(h) for h in r["needle"].values())
        total = sum(len(h) for h in r["needle"].values())
        print(f"| {r['kv_cache_dtype']} | {' | '.join(cells)} | {hits}/{total} |")
    if a.output:
        Path(a.output).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
