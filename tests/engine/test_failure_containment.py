"""Failures contained where they happen, or ending the engine loudly: the tokenizer manager's
receive loop (over its real sockets, with a fake scheduler and detokenizer), the detokenizer's
step, and the watchdog's stall rule (--watchdog-timeout)."""

import asyncio
import multiprocessing as mp
import time

import pytest
import zmq
import zmq.asyncio

from radixlm.config import PortArgs
from radixlm.distributed.rank import beat, new_heartbeat
from radixlm.engine.detokenizer import IncrementalDetokenizer, _step_or_fail
from radixlm.engine.launcher import stalled_message, watch_processes
from radixlm.engine.tokenizer_manager import (
    EngineDeadError,
    InternalRequestError,
    TokenizerManager,
    TokenizerManagerConfig,
)
from radixlm.ipc import (
    AbortReq,
    BatchStrOut,
    ControlFailed,
    FinishAbort,
    FinishLength,
    GenerateReqInput,
    GetInternalStateReq,
    GetInternalStateReqOutput,
    ReqOutputChunk,
    ReqStrChunk,
)
from tests.scheduler.harness import make_scheduler


class _Vocab:
    def get_vocab(self):
        return {"a": 0, "b": 1}


def _chunk(rid, ids, reason, text="x"):
    return ReqStrChunk(
        ReqOutputChunk(rid, ids, reason, prompt_tokens=2, completion_tokens=2, cached_tokens=0),
        text,
    )


def test_tokenizer_manager_fails_one_request_for_a_bad_chunk_and_ends_the_engine_when_its_loop_breaks():  # noqa: E501 (the test id says it all)
    async def main():
        ports = PortArgs.init_new()
        ctx = zmq.asyncio.Context()
        scheduler = ctx.socket(zmq.PULL)
        scheduler.bind(ports.scheduler_input_ipc_name)
        tm = TokenizerManager(
            TokenizerManagerConfig(), ports, _Vocab(), {"context_len": 64, "vocab_size": 100}
        )
        await tm.start()
        detokenizer = ctx.socket(zmq.PUSH)
        detokenizer.connect(ports.tokenizer_ipc_name)

        async def run(rid):
            obj = GenerateReqInput(input_ids=[1, 2], rid=rid, sampling_params={"max_new_tokens": 2})
            out = None
            async for out in tm.generate_request(obj):  # noqa: B007 (the last item is the result)
                pass
            return out

        try:
            a, b = asyncio.create_task(run("a")), asyncio.create_task(run("b"))
            assert {(await scheduler.recv_pyobj()).rid for _ in range(2)} == {"a", "b"}
            assert tm.pending_age() > 0
            # a's chunk cannot be applied (no ids: a TypeError inside the loop); b's can.
            await detokenizer.send_pyobj(
                BatchStrOut([_chunk("a", None, None), _chunk("b", [5, 6], FinishLength(2))])
            )
            with pytest.raises(InternalRequestError) as e:
                await a
            assert (
                e.value.rid == "a"
                and "TypeError" not in str(e.value)
                and "(request id a)" in str(e.value)
            )
            assert (await b)["output_ids"] == [5, 6]
            abort = (
                await scheduler.recv_pyobj()
            )  # the failed request is stopped in the scheduler too
            assert isinstance(abort, AbortReq) and abort.rid == "a"
            assert tm.pending_age() == 0 and tm.dead_message is None and tm.loop_failure is None

            # A control call the scheduler failed: that call fails (a generic 500), the next is
            # answered.
            call = asyncio.create_task(tm.get_internal_state())
            assert isinstance(await scheduler.recv_pyobj(), GetInternalStateReq)
            await detokenizer.send_pyobj(ControlFailed(GetInternalStateReqOutput))
            with pytest.raises(RuntimeError, match="GetInternalStateReqOutput"):
                await call
            call = asyncio.create_task(tm.get_internal_state())
            await scheduler.recv_pyobj()
            await detokenizer.send_pyobj(GetInternalStateReqOutput({"x": 1}))
            assert await call == {"x": 1}

            # A message that does not unpickle: whose news it carried is unknown, so the engine
            # ends.
            c = asyncio.create_task(run("c"))
            await scheduler.recv_pyobj()
            await detokenizer.send(b"not a pickle")
            with pytest.raises(EngineDeadError):
                await c
            assert tm.loop_failure and tm.dead_message == tm.loop_failure
            dead: list[str] = []
            watch_processes([], dead.append, lambda: bool(dead), 0.01, tm, 300.0)
            deadline = time.monotonic() + 5
            while not dead and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert dead == [tm.loop_failure]  # the supervisor restarts the engine or exits non-zero
        finally:
            await tm.close()
            ctx.destroy(linger=0)
            ports.cleanup()

    asyncio.run(main())


def test_a_detokenizer_failure_fails_its_request_only():
    class Tok:
        def decode(self, ids, **kw):
            if 13 in ids:
                raise RuntimeError("cannot decode 13")
            return "".join(chr(ord("a") + i) for i in ids)

    detok = IncrementalDetokenizer(Tok())
    ok = _step_or_fail(detok, ReqOutputChunk("ok", [0, 1], None, 2, 2, 0))
    bad = _step_or_fail(detok, ReqOutputChunk("bad", [13], None, 2, 1, 0))
    assert ok.text == "ab" and ok.chunk.finished_reason is None
    assert (
        isinstance(bad.chunk.finished_reason, FinishAbort)
        and bad.chunk.finished_reason.status_code == 500
    )
    assert "bad" not in detok.states and "ok" in detok.states
    assert _step_or_fail(detok, ReqOutputChunk("ok", [2], FinishLength(3), 2, 3, 0)).text == "abc"


class _Proc:
    name, pid = "scheduler", 4242

    def __init__(self, heartbeat):
        self.loop_heartbeat, self.killed = heartbeat, False

    def is_alive(self):
        return not self.killed

    def kill(self):
        self.killed = True


class _Front:
    loop_failure = None

    def __init__(self, age):
        self.age = age

    def pending_age(self):
        return self.age


def test_a_loop_counts_as_hung_only_when_work_waited_as_long_as_its_silence():
    hb = new_heartbeat(mp.get_context("spawn"))
    p = _Proc(hb)
    assert stalled_message([p], _Front(100.0), 1.0) is None  # no beat yet: still loading
    hb.value = time.monotonic() - 10  # silent for 10 s
    assert stalled_message([p], _Front(0.0), 1.0) is None  # idle: nothing waits on it
    assert stalled_message([p], _Front(0.5), 1.0) is None  # a request came 0.5 s ago
    beat(hb)
    assert stalled_message([p], _Front(100.0), 1.0) is None  # it beats: busy, not hung
    hb.value = time.monotonic() - 10
    msg = stalled_message([p], _Front(5.0), 1.0)
    assert (
        p.killed
        and "the scheduler process (pid 4242) hung" in msg
        and "--watchdog-timeout 1" in msg
    )


def test_a_control_call_that_raises_in_the_scheduler_is_answered(tiny_model_dir, monkeypatch):
    s = make_scheduler(tiny_model_dir)

    def broken():
        raise RuntimeError("state exploded")

    monkeypatch.setattr(s, "internal_state", broken)
    s.handle(GetInternalStateReq())
    assert s.io.replies == [
        ControlFailed(GetInternalStateReqOutput)
    ]  # its caller does not wait forever


def test_every_control_call_has_a_handler_and_an_unknown_message_is_logged(tiny_model_dir, caplog):
    from radixlm.scheduler.scheduler import _CONTROL_REPLIES, _HANDLERS

    assert set(_CONTROL_REPLIES) <= set(_HANDLERS)  # a call without one would wait forever
    s = make_scheduler(tiny_model_dir)
    s.handle(object())
    assert "unknown message <class 'object'>" in caplog.text and s.io.replies == []
