"""Drive a Scheduler in-process (no ZMQ, no other processes): submit requests, abort them, step,
and collect what it sends to the detokenizer. Tests then see every step boundary."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from radixlm.config import ServerArgs
from radixlm.ipc import AbortReq, BatchTokenIDOut, FinishAbort, TokenizedGenerateReqInput
from radixlm.sampling_params import SamplingParams
from radixlm.scheduler.channels import BaseSchedulerIO
from radixlm.scheduler.config import SchedulerConfig
from radixlm.scheduler.scheduler import Scheduler

DEFAULTS = dict(num_threads=1, enable_invariant_checks=True, log_level="warning")


class InProcessIO(BaseSchedulerIO):
    """The scheduler's channels as lists: nothing arrives on its own, outputs and replies are
    kept."""

    def __init__(self):
        self.sent: list = []
        self.replies: list = []

    def recv_requests(self, timeout_ms: int) -> list:
        return []

    def send_output(self, out: BatchTokenIDOut) -> None:
        self.sent += out.chunks

    def reply(self, msg) -> None:
        self.replies.append(msg)


def make_scheduler(model_dir: str, **opts) -> Scheduler:
    threads = torch.get_num_threads()  # the runner sets the process's torch threads; give them back
    try:
        args = ServerArgs(model_path=model_dir, **{**DEFAULTS, **opts})
        return Scheduler(SchedulerConfig.from_server_args(args), InProcessIO())
    finally:
        torch.set_num_threads(threads)


def reason_dict(reason) -> dict | None:
    """A typed finish reason as the scheduler's dict of old: SGLang's JSON, plus an abort's HTTP
    status."""
    if reason is None:
        return None
    out = reason.to_json()
    if isinstance(reason, FinishAbort) and reason.status_code is not None:
        out["status_code"] = reason.status_code
    return out


@dataclass
class Result:
    output_ids: list[int] = field(default_factory=list)
    finish_reason: dict | None = None
    finishes: int = 0  # chunks that carried a finish reason (exactly one is right)
    cached_tokens: int = 0
    input_token_logprobs: list = field(default_factory=list)
    input_top_logprobs: list = field(default_factory=list)
    output_token_logprobs: list = field(default_factory=list)


class Driver:
    def __init__(self, scheduler: Scheduler):
        self.s = scheduler
        self.results: dict[str, Result] = {}
        self.steps = 0
        self._ids = itertools.count()
        self.io: InProcessIO = scheduler.io

    def submit(
        self,
        ids: list[int],
        rid: str | None = None,
        *,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        stream: bool = False,
        **sampling,
    ) -> str:
        rid = rid or f"q{next(self._ids)}"
        self.results[rid] = Result()
        self.s.intake.add(
            TokenizedGenerateReqInput(
                rid=rid,
                input_text=None,
                input_ids=list(ids),
                sampling_params=SamplingParams(**sampling),
                return_logprob=return_logprob,
                logprob_start_len=logprob_start_len,
                top_logprobs_num=top_logprobs_num,
                stream=stream,
            )
        )
        self.collect()
        return rid

    def abort(self, rid: str) -> None:
        self.s.handle(AbortReq(rid))
        self.collect()

    def idle(self) -> bool:
        return self.s.is_idle()

    def step(self) -> None:
        self.s.step()
        self.steps += 1
        self.collect()

    def collect(self) -> None:
        self.s.outputs.flush()
        chunks, self.io.sent = self.io.sent, []
        for c in chunks:
            r = self.results[c.rid]
            r.output_ids += c.new_output_ids
            r.cached_tokens = c.cached_tokens
            r.input_token_logprobs += c.input_token_logprobs or []
            r.input_top_logprobs += c.input_top_logprobs or []
            r.output_token_logprobs += c.output_token_logprobs or []
            if c.finished_reason is not None:
                r.finish_reason = reason_dict(c.finished_reason)
                r.finishes += 1

    def run(self, max_steps: int = 20000) -> None:
        for _ in range(max_steps):
            if self.idle():
                return
            q = self.s.queues
            if q.prefetching and not (q.waiting or q.running or q.prefilling):
                time.sleep(0.001)  # only storage reads are pending: give them time, not steps
            self.step()
        raise AssertionError(f"not idle after {max_steps} steps")

    def chunked(self):
        """The request between its prefill chunks, if any."""
        return next(iter(self.s.queues.prefilling), None)

    def find(self, rid: str):
        """The scheduler's Req for rid, wherever it is."""
        return self.s.queues.find(rid)


def assert_idle_memory_ok(s: Scheduler) -> None:
    """At an idle point every KV slot is free or in the tree, exactly once; no lock is held; every
    request slot is free. Uses the pools and the tree's nodes only."""
    pool, nodes, stack = (
        s.runner.token_to_kv_pool,
        [],
        list(s.tree_cache.root_node.children.values()),
    )
    while stack:
        n = stack.pop()
        nodes.append(n)
        stack.extend(n.children.values())
    owned = pool.free_slots.tolist() + [
        x for n in nodes if n.value is not None for x in n.value.tolist()
    ]
    assert sorted(owned) == list(range(1, pool.size + 1)), (
        f"{len(owned)} owned slots for {pool.size}, {len(owned) - len(set(owned))} duplicated"
    )
    assert all(n.lock_ref == 0 for n in nodes), "a lock is held at an idle point"
    rows = s.runner.req_to_token_pool
    assert rows.available_size() == rows.size, "a request slot leaked"


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    out = hf.generate(
        torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    return out[0, len(ids) :].tolist()


def hf_prompt_logprobs(hf, ids: list[int]) -> torch.Tensor:
    """[len(ids) - 1]: logprob of token i + 1 after ids[:i + 1]."""
    with torch.no_grad():
        lp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
    return lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
