"""Logprobs of a request's tokens: prompt logprobs from an extend step's rows, output logprobs from
the row that sampled each token. Reported from the model's own distribution (before grammar masks).
"""

from __future__ import annotations

import torch

from radixlm.scheduler.batch import PrefillChunk
from radixlm.scheduler.req import Req


def topk(lp_row: torch.Tensor, k: int) -> list:
    vals, idx = torch.topk(lp_row, min(k, lp_row.shape[-1]))
    return [[v, i] for v, i in zip(vals.tolist(), idx.tolist())]


def add_output_logprob(req: Req, tok: int, logits_row: torch.Tensor) -> None:
    lp = torch.log_softmax(logits_row, dim=-1)
    req.output_token_logprobs.append([float(lp[tok]), tok])
    if req.top_logprobs_num > 0:
        req.output_top_logprobs.append(topk(lp, req.top_logprobs_num))


def add_input_logprobs(req: Req, lp: torch.Tensor, chunk: PrefillChunk) -> None:
    """lp rows are positions chunk.logprob_start .. chunk.end - 1; row p predicts token p + 1.
    Adds the logprobs of the prompt tokens still owed that these rows predict."""
    first, ids = chunk.logprob_start, req.origin_input_ids
    assert lp.shape[0] == chunk.end - first, (req.rid, lp.shape, chunk)
    if req.logprob_pos == 0:  # the first token has no logprob
        req.input_token_logprobs.append([None, ids[0]])
        if req.top_logprobs_num > 0:
            req.input_top_logprobs.append(None)
        req.logprob_pos = 1
    lo, hi = req.logprob_pos, min(len(ids), chunk.end + 1)
    if hi <= lo:
        return
    assert lo - 1 >= first, (req.rid, lo, first)
    targets = torch.tensor(ids[lo:hi], dtype=torch.int64)
    rows = lp[lo - 1 - first : hi - 1 - first]
    vals = rows.gather(1, targets.unsqueeze(1)).squeeze(1).tolist()
    req.input_token_logprobs.extend([v, t] for v, t in zip(vals, ids[lo:hi]))
    if req.top_logprobs_num > 0:
        req.input_top_logprobs.extend(topk(row, req.top_logprobs_num) for row in rows)
    req.logprob_pos = hi
