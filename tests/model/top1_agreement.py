"""Top-1 agreement of a quantized file served by radixlm with HF holding the file's dequantized
weights, along HF's own greedy text (a random start, then what the float model writes: text the
model "likes", where near ties are rare): the quantized-GGUF tests of several families."""

from __future__ import annotations

import random

import torch

from radixlm import Engine


def top1_agreement(
    model_path: str, hf, held, vocab: int, new_tokens: int, seqs: int = 2, start_len: int = 40
) -> tuple[int, int]:
    """(positions where radixlm's top-1 equals `held`'s, positions compared)."""
    rng = random.Random(4)
    texts = []
    with torch.no_grad():
        for _ in range(seqs):
            start = torch.tensor([[rng.randrange(10, vocab) for _ in range(start_len)]])
            texts.append(hf.generate(start, max_new_tokens=new_tokens, do_sample=False)[0])
    agree = total = 0
    with Engine(model_path=model_path, enable_invariant_checks=True, log_level="warning") as e:
        for ids in texts:
            out = e.generate(
                input_ids=ids.tolist(),
                sampling_params={"max_new_tokens": 0},
                return_logprob=True,
                logprob_start_len=0,
                top_logprobs_num=1,
            )
            ours = [row[0][1] for row in out["meta_info"]["input_top_logprobs"][1:]]
            with torch.no_grad():
                theirs = held(ids[None]).logits[0, :-1].argmax(-1).tolist()
            assert len(ours) == len(theirs)
            agree += sum(a == b for a, b in zip(ours, theirs))
            total += len(theirs)
    return agree, total
