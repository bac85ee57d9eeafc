"""What quantized weights and a low-precision KV cache cost in quality, against float32 weights.

    radixlm bench quality [--num-prompts 50] [--quantization ...] [--kv-cache-dtype ...]

Two engines on the same model: the reference (--quantization none, float32 KV) and the candidate
(the flags given; default: the model's own quantization). Reports
- perplexity of a fixed text (prompt logprobs; the candidate prefills it in chunks of 16 tokens
  so every matrix product runs the batch-1..16 quantized kernels that decode uses, not the
  dequantize-and-GEMM path of long prompts), and
- greedy agreement on chat prompts: share of identical continuations, and the mean share of
  tokens before the first difference.
"""

from __future__ import annotations

import argparse
import dataclasses
import math

from radixlm.config import ServerArgs

TEXT = (
    "The river town woke slowly. Before the sun cleared the hills, the baker had already lit his"
    " ovens, and the smell of bread drifted down to the docks where the fishermen were mending"
    " their nets. Most of them had worked the same stretch of water for thirty years, and they"
    " could read the weather from the color of the morning sky. Today it was a pale, even grey,"
    " which meant a calm day and a good catch. On the hill above the town stood an old library,"
    " built of yellow stone by a merchant who had made his fortune in the salt trade. He had"
    " believed that a town without books was a town without a memory, and he left most of his money"
    " to keep the doors open. The librarian, a patient woman named Clara, opened those doors every"
    " morning at eight. Children came after school to read about distant countries, about the stars"
    " and the planets, about animals that lived at the bottom of the sea. Their parents came in the"
    " evening, tired from work, to borrow novels and newspapers. In winter, when the river froze"
    " and the boats stayed in the harbor, the library was the warmest room in town, and people"
    " stayed late, talking quietly between the shelves. Clara kept a notebook of every question she"
    " could not answer, and once a month she wrote letters to universities in the capital asking"
    " for help. Some answers took a year to arrive. She read each one aloud to whoever happened to"
    " be in the reading room, and the town slowly learned to be curious."
)

TOPICS = [
    "the water cycle",
    "how vaccines work",
    "the history of the printing press",
    "photosynthesis",
    "black holes",
    "the French Revolution",
    "machine learning",
    "the human heart",
    "volcanoes",
    "the Roman Empire",
    "climate change",
    "how airplanes fly",
    "the immune system",
    "plate tectonics",
    "the invention of the telephone",
    "DNA",
    "renewable energy",
    "the Great Wall of China",
    "honey bees",
    "the stock market",
    "the Moon landing",
    "earthquakes",
    "the Internet",
    "the Renaissance",
    "coral reefs",
    "electric cars",
    "the Industrial Revolution",
    "sleep",
    "the solar system",
    "rainforests",
    "chess",
    "the Olympic Games",
    "coffee",
    "the ancient Egyptians",
    "tides",
    "recycling",
    "the human brain",
    "rainbows",
    "the Silk Road",
    "penguins",
    "nuclear energy",
    "the piano",
    "deserts",
    "antibiotics",
    "the printing of money",
    "glaciers",
    "the theory of evolution",
    "bridges",
    "the Amazon river",
    "bread",
]


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--num-prompts", type=int, default=50, help=f"chat prompts (at most {len(TOPICS)})"
    )
    p.add_argument("--max-new-tokens", type=int, default=64)


def _engine(server_args: ServerArgs):
    from radixlm.engine.engine import Engine

    return Engine(**dataclasses.asdict(server_args))


def perplexity(engine, ids: list[int]) -> float:
    out = engine.generate(
        input_ids=ids,
        sampling_params={"max_new_tokens": 1},
        return_logprob=True,
        logprob_start_len=0,
    )
    lps = [lp for lp, _tok, *_ in out["meta_info"]["input_token_logprobs"] if lp is not None]
    return math.exp(-sum(lps) / len(lps))


def greedy(engine, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    outs = engine.generate(prompts, {"max_new_tokens": max_new_tokens, "temperature": 0})
    return [o["output_ids"] for o in outs]


def compare(candidate: ServerArgs, num_prompts: int = 50, max_new_tokens: int = 64) -> dict:
    """Run the reference then the candidate (one engine at a time) and compare."""
    from radixlm.model.loader import load_tokenizer

    tok = load_tokenizer(candidate.model_path)
    ids = tok.encode(TEXT)
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": f"Write a short paragraph about {t}."}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for t in TOPICS[:num_prompts]
    ]
    reference = dataclasses.replace(
        candidate,
        quantization="none",
        kv_cache_dtype="float32",
        chunked_prefill_size=candidate.chunked_prefill_size,
    )
    candidate = dataclasses.replace(
        candidate, chunked_prefill_size=16, quantization=candidate.quantization or "gguf"
    )
    res = {}
    for name, args in (("reference", reference), ("candidate", candidate)):
        with _engine(args) as engine:
            res[name] = {
                "ppl": perplexity(engine, ids),
                "outputs": greedy(engine, prompts, max_new_tokens),
            }
    same, prefix_share = 0, []
    for a, b in zip(res["reference"]["outputs"], res["candidate"]["outputs"]):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        same += a == b
        prefix_share.append(n / max(len(a), 1))
    return {
        "text_tokens": len(ids),
        "ppl_reference": res["reference"]["ppl"],
        "ppl_candidate": res["candidate"]["ppl"],
        "ppl_ratio": res["candidate"]["ppl"] / res["reference"]["ppl"],
        "prompts": len(prompts),
        "identical_share": same / len(prompts),
        "mean_agreeing_prefix": sum(prefix_share) / len(prefix_share),
    }


def main(args, server_args: ServerArgs) -> int:
    r = compare(server_args, args.num_prompts, args.max_new_tokens)
    print(
        f"perplexity of a {r['text_tokens']}-token text: float32 weights {r['ppl_reference']:.4f}, "
        f"candidate {r['ppl_candidate']:.4f} ({(r['ppl_ratio'] - 1) * 100:+.2f}%)"
    )
    print(
        f"greedy, {r['prompts']} prompts x {args.max_new_tokens} tokens: {r['identical_share']:.0%}"
        f" identical, {r['mean_agreeing_prefix']:.0%} of tokens before the first difference on"
        " average"
    )
    return 0
