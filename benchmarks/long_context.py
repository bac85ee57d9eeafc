"""What a low-precision KV cache costs at length: perplexity of a long text and needle-in-a-haystack
retrieval at several context lengths, per --kv-cache-dtype, one Engine at a time.

    python benchmarks/long_context.py --lengths 2048 4096 8000 --kv-dtypes float16 int8 int4
    python benchmarks/long_context.py --dump-text /tmp/long.txt  # the text, for llama-perplexity -f
    python benchmarks/long_context.py --chunk-ppl 2048 --chunks 4 --text-file /tmp/long.txt

Model: --model-path (default: the embedded SmolLM2-135M-Instruct, a real checkpoint and the only
one obtainable here; its context is 8,192 tokens). Weights: the model's own quantization for every
KV type, so the figures differ by the KV cache alone.
- Perplexity: the prompt logprobs of the first L tokens of a fixed long text (this repository's
  docs, concatenated in a fixed order: English prose about the engine, offline and stable).
- --chunk-ppl N --chunks K [--text-file F]: perplexity as llama.cpp's `llama-perplexity -c N
  --chunks K` computes it (K consecutive chunks of N tokens, each computed alone, only its second
  half scored), so that the peer's `-ctk / -ctv` figures on the same text (--dump-text) compare
  with radixlm's KV types.
- Needle: a sentence "The secret code for the blue door is NNNN." placed at 10%, 50% and 90% of an
  L-token filler (the same text), then the question; greedy, 8 tokens; a hit when NNNN is in the
  answer. Each (length, depth) uses its own code.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
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


def chunk_perplexity(engine, ids: list[int], n_ctx: int, chunks: int, bos: int | None) -> float:
    """llama-perplexity's figure: chunk i is ids[i n_ctx, (i+1) n_ctx) with its first token made
    BOS (where the model has one), and the tokens after its first half are scored."""
    nll, count = 0.0, 0
    for i in range(chunks):
        chunk = ids[i * n_ctx : (i + 1) * n_ctx]
        if len(chunk) < n_ctx:
            raise SystemExit(f"the text has {len(ids)} tokens, fewer than {chunks} x {n_ctx}")
        if bos is not None:
            chunk = [bos] + chunk[1:]
        out = engine.generate(
            input_ids=chunk,
            sampling_params={"max_new_tokens": 1},
            return_logprob=True,
            logprob_start_len=0,
        )
        lps = out["meta_info"]["input_token_logprobs"]
        scored = [lp for lp, *_ in lps[n_ctx // 2 + 1 :]]
        nll -= sum(scored)
        count += len(scored)
    return math.exp(nll / count)


def run_chunked(model_path, kv_dtype: str, n_ctx: int, chunks: int, threads: int, text: str):
    from radixlm.config import ServerArgs
    from radixlm.engine.engine import Engine
    from radixlm.model.loader import load_tokenizer

    tok = load_tokenizer(model_path)
    ids = tok.encode(text, add_special_tokens=False)
    args = ServerArgs(
        model_path=model_path,
        kv_cache_dtype=kv_dtype,
        num_threads=threads,
        context_length=n_ctx + 64,
        log_level="warning",
        disable_radix_cache=True,
    )
    with Engine(**dataclasses.asdict(args)) as engine:
        ppl = chunk_perplexity(engine, ids, n_ctx, chunks, tok.bos_token_id)
    print(f"{kv_dtype} {chunks} x {n_ctx} (second halves): ppl {ppl:.4f}", flush=True)
    return ppl


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
    p.add_argument("--dump-text", default=None, help="write the text to this file and stop")
    p.add_argument("--chunk-ppl", type=int, default=0, help="llama-perplexity's -c (see above)")
    p.add_argument("--chunks", type=int, default=4, help="llama-perplexity's --chunks")
    p.add_argument("--text-file", default=None, help="--chunk-ppl's text (default: the docs)")
    a = p.parse_args()
    if a.dump_text:
        Path(a.dump_text).write_text(long_text())
        return 0
    if a.chunk_ppl:
        text = Path(a.text_file).read_text() if a.text_file else long_text()
        ppl = {
            d: run_chunked(a.model_path, d, a.chunk_ppl, a.chunks, a.threads, text)
            for d in a.kv_dtypes
        }
        base = ppl[a.kv_dtypes[0]]
        for d, v in ppl.items():
            print(f"| {d} | {v:.4f} ({(v / base - 1) * 100:+.1f}%) |")
        return 0
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
