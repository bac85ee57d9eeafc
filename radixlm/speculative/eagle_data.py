"""Self-distillation data for an EAGLE head: the target answers prompts on its own ModelRunner, and
the hidden states it computes while answering are kept (EagleCapture, as when serving: the head
trains on exactly the features it will read, from the same kernels), so no second pass runs.

A sample is one conversation: its tokens (prompt + answer) and the target's final hidden state at
every position but the last (the last token is never fed back).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixlm.model.executor.worker_batch import ModelWorkerBatch
from radixlm.model.forward_batch import ForwardMode
from radixlm.speculative.eagle_capture import EagleCapture


@dataclass
class Sample:
    tokens: list[int]  # prompt + answer
    prompt_len: int
    hidden: (
        torch.Tensor
    )  # [len(tokens) - 1, hidden] float32: the target's final hidden state at each position


def generate_samples(
    runner,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float,
    batch_size: int,
    eos_ids: list[int],
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> list[Sample]:
    """The target's answers to `prompts` (token ids), batch_size at a time: greedy at temperature 0,
    else sampled (seeded). progress(n): n more prompts answered."""
    capture = EagleCapture(runner.req_to_token_pool, runner.hf_config.hidden_size)
    runner.set_hidden_capture(capture)
    gen = torch.Generator().manual_seed(seed)
    samples: list[Sample] = []
    with torch.inference_mode():
        for a in range(0, len(prompts), batch_size):
            samples += _answer(
                runner,
                capture,
                prompts[a : a + batch_size],
                max_new_tokens,
                temperature,
                set(eos_ids),
                gen,
            )
            if progress is not None:
                progress(len(prompts[a : a + batch_size]))
    return samples


def _answer(
    runner,
    capture: EagleCapture,
    prompts: list[list[int]],
    max_new: int,
    temperature: float,
    eos: set,
    gen: torch.Generator,
) -> list[Sample]:
    r2t_pool, kv_pool = runner.req_to_token_pool, runner.token_to_kv_pool
    rows = [r2t_pool.alloc() for _ in prompts]
    lens = [min(len(p) + max_new, runner.context_len) for p in prompts]
    slots = kv_pool.alloc(sum(lens))
    if None in rows or slots is None:
        raise ValueError(
            "train-eagle: the KV pool is too small for a batch (lower --batch-size or"
            " --max-new-tokens)"
        )
    r2t, off = r2t_pool.req_to_token, 0
    for row, n in zip(rows, lens):
        r2t[row, :n] = slots[off : off + n].to(r2t.device)
        off += n
    tokens = [list(p) for p in prompts]
    try:
        nxt = _forward(
            runner,
            ForwardMode.EXTEND,
            [t for p in prompts for t in p],
            [i for p in prompts for i in range(len(p))],
            rows,
            [len(p) for p in prompts],
            torch.cat([r2t[row, : len(p)] for row, p in zip(rows, prompts)]),
            temperature,
            gen,
            prefix=[0] * len(prompts),
            ext=[len(p) for p in prompts],
        )
        active = list(range(len(prompts)))
        while True:
            for i, t in zip(active, nxt):
                tokens[i].append(t)
            active = [i for i in active if tokens[i][-1] not in eos and len(tokens[i]) < lens[i]]
            if not active:
                break
            pos = [len(tokens[i]) - 1 for i in active]
            loc = r2t[torch.tensor([rows[i] for i in active]), torch.tensor(pos)]
            nxt = _forward(
                runner,
                ForwardMode.DECODE,
                [tokens[i][-1] for i in active],
                pos,
                [rows[i] for i in active],
                [p + 1 for p in pos],
                loc,
                temperature,
                gen,
            )
        out = []
        for i, row in enumerate(rows):
            ids = torch.tensor(tokens[i])
            hidden, found = capture.take(row, ids, 0, len(tokens[i]) - 1)
            assert found == len(tokens[i]) - 1, (found, len(tokens[i]))
            out.append(Sample(tokens[i], len(prompts[i]), hidden))
        return out
    finally:
        kv_pool.free(slots)
        for row in rows:
            capture.drop(row)
            r2t_pool.free(row)


def _forward(
    runner,
    mode: ForwardMode,
    ids,
    positions,
    rows,
    seq_lens,
    out_loc,
    temperature: float,
    gen: torch.Generator,
    prefix=None,
    ext=None,
) -> list[int]:
    fb = runner.prepare(
        ModelWorkerBatch(
            mode,
            ids,
            positions,
            rows,
            seq_lens,
            out_loc,
            extend_prefix_lens=prefix,
            extend_seq_lens=ext,
        )
    )
    logits = runner.forward(fb).next_token_logits.float()
    if temperature <= 0:
        return torch.argmax(logits, dim=-1).tolist()
    probs = torch.softmax(logits / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=gen).flatten().tolist()
