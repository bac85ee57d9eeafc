"""OutputStreamer: each request's news for the detokenizer, sent as one BatchTokenIDOut per step.

A request's chunk carries its new token ids (and logprobs) since the last one: when it finished,
or, streaming, its first token at once and then every stream_interval tokens (SGLang's rule).
Chunks carry the detokenization options too; the stop strings and patterns only in a request's
first chunk (the detokenizer keeps them with its decode state).
A stream leaves out the last hold_back(req) tokens until the request finishes: jump-forward may
still re-tokenize them (scheduler/output/jump_forward.py), and what was sent never changes.
"""

from __future__ import annotations

from collections.abc import Callable

from radixlm.ipc import BatchTokenIDOut, FinishAbort, ReqOutputChunk
from radixlm.scheduler.channels import BaseSchedulerIO
from radixlm.scheduler.req import Req


class OutputStreamer:
    def __init__(self, io: BaseSchedulerIO, stream_interval: int):
        self.io = io
        self.stream_interval = stream_interval
        self._chunks: list[ReqOutputChunk] = []
        self.hold_back: Callable[[Req], int] = lambda req: 0  # the scheduler's jump-forward says

    def emit(self, req: Req) -> None:
        """Queue the request's news (finished, or streaming and past its interval)."""
        if not req.finished() and not req.stream:
            return
        end = (
            len(req.output_ids)
            if req.finished()
            else max(len(req.output_ids) - self.hold_back(req), 0)
        )
        new = req.output_ids[req.sent_output_len : end]
        first = req.sent_output_len == 0
        # SGLang's rule: the first token at once, then every stream_interval tokens (its
        # `len(output_ids) % interval == 1`), so a larger interval never delays the TTFT.
        interval = req.sampling_params.stream_interval or self.stream_interval
        if not req.finished() and len(new) < (1 if first else interval):
            return
        # The stop options go with the first chunk only: the detokenizer keeps them with the
        # request's decode state (up to 16 strings and 16 patterns, not re-sent per token).
        req.sent_output_len = end
        sp = req.sampling_params
        chunk = ReqOutputChunk(
            rid=req.rid,
            new_output_ids=new,
            finished_reason=req.finished_reason,
            prompt_tokens=len(req.origin_input_ids),
            completion_tokens=len(req.output_ids),
            cached_tokens=req.cached_tokens,
            skip_special_tokens=sp.skip_special_tokens,
            spaces_between_special_tokens=sp.spaces_between_special_tokens,
            trim_stop=not sp.no_stop_trim,
            stop_strs=(sp.stop_strs or None) if first else None,
            stop_regex=(sp.stop_regex_list or None) if first else None,
            forward_passes=req.forward_passes,
            spec_verify_ct=req.spec_verify_ct,
            spec_accepted_tokens=req.spec_accepted_tokens,
            first_token_time=req.first_token_time,
            embedding=req.embedding,
        )
        if req.return_logprob:
            chunk.input_token_logprobs, req.input_token_logprobs = req.input_token_logprobs, []
            chunk.input_top_logprobs, req.input_top_logprobs = req.input_top_logprobs, []
            chunk.output_token_logprobs, req.output_token_logprobs = req.output_token_logprobs, []
            chunk.output_top_logprobs, req.output_top_logprobs = req.output_top_logprobs, []
        self._chunks.append(chunk)

    def reject(self, rid: str, prompt_len: int, reason: FinishAbort) -> None:
        """The answer to a request that never became a Req."""
        self._chunks.append(
            ReqOutputChunk(
                rid, [], reason, prompt_tokens=prompt_len, completion_tokens=0, cached_tokens=0
            )
        )

    def flush(self) -> list[ReqOutputChunk]:
        chunks, self._chunks = self._chunks, []
        if chunks:
            self.io.send_output(BatchTokenIDOut(chunks))
        return chunks
