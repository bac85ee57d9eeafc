"""engine/sessions.py without an engine: a turn's prompt from session_params, the limits, the
timeout, and what goes to the scheduler (bind before the request, close when it ends)."""

import asyncio
import time

import pytest

from radixlm.engine.sessions import SessionConfig, SessionError, SessionManager
from radixlm.ipc import BindSessionReq, CloseSessionReq, GenerateReqInput

BOS = 1


class FakeTM:
    """What SessionManager uses of a TokenizerManager; each request answers its prompt's length
    followed by 99 as output."""

    context_len = 100
    dead_message = None

    def __init__(self):
        self.sent: list = []
        self.send_to_scheduler = self
        self.tokenizer = type("Tok", (), {"bos_token_id": BOS})()
        self.tokenizer_pool = self

    def send_pyobj(self, msg):
        self.sent.append(msg)

    async def run(self, fn, arg):
        return fn(arg)

    def encode_prompt(self, text: str) -> list[int]:
        return [BOS] + [ord(c) for c in text]

    async def generate_request(self, obj, admit=None):
        self.sent.append(obj)
        meta = {
            "id": obj.rid,
            "finish_reason": {"type": "length", "length": 2},
            "prompt_tokens": len(obj.input_ids),
        }
        yield {"text": "", "output_ids": [len(obj.input_ids), 99], "meta_info": meta}


def run(coro):
    return asyncio.run(coro)


async def turn(m: SessionManager, ids, owner="k", **params) -> dict:
    plan = await m.prepare(
        owner, GenerateReqInput(input_ids=ids, sampling_params={"max_new_tokens": 2}), params
    )
    out = None
    async for out in m.run(plan):  # noqa: B007 (the last item is the result)
        pass
    return out


def prompts(tm: FakeTM) -> list[list[int]]:
    return [m.input_ids for m in tm.sent if isinstance(m, GenerateReqInput)]


def test_turns_append_branch_and_bind_first():
    async def main():
        tm = FakeTM()
        m = SessionManager(tm, SessionConfig())
        sid = m.open("k", {})
        a = await turn(m, [BOS, 5, 6], id=sid)
        await turn(m, [BOS, 7], id=sid)  # the BOS of an appended turn goes: the history has one
        await turn(m, [8], id=sid, rid=a["meta_info"]["id"], drop_previous_output=True)
        await turn(m, [9], id=sid, rid=a["meta_info"]["id"], offset=2)
        await turn(m, [10], id=sid, replace=True)  # no rid: a fresh start
        assert prompts(tm) == [
            [BOS, 5, 6],
            [BOS, 5, 6, 3, 99, 7],
            [BOS, 5, 6, 8],
            [BOS, 5, 9],
            [10],
        ]
        # Each request is bound to the session right before it is sent.
        kinds = [type(x).__name__ for x in tm.sent]
        assert kinds == ["BindSessionReq", "GenerateReqInput"] * 5
        assert all(b.session_id == sid for b in tm.sent if isinstance(b, BindSessionReq))
        m.close("k", sid)
        assert tm.sent[-1] == CloseSessionReq(sid)

    run(main())


def test_replace_with_rid_drops_the_turns_after_it():
    async def main():
        m = SessionManager(FakeTM(), SessionConfig())
        sid = m.open("k", {})
        a = (await turn(m, [5], id=sid))["meta_info"]["id"]
        b = (await turn(m, [6], id=sid))["meta_info"]["id"]
        c = (await turn(m, [7], id=sid))["meta_info"]["id"]
        await turn(m, [8], id=sid, rid=a, replace=True)
        assert (
            a in m.sessions[sid].turns
            and b not in m.sessions[sid].turns
            and c not in m.sessions[sid].turns
        )

    run(main())


@pytest.mark.parametrize(
    "params, field",
    [
        ({"id": "nope"}, "session_params.id"),
        ({"rid": "nope"}, "session_params.rid"),
        ({"offset": 5}, "session_params.offset"),
        ({"offset": True}, "session_params.offset"),
        ({"drop_previous_output": 1}, "session_params.drop_previous_output"),
        ({"extra": 1}, "session_params.extra"),
    ],
)
def test_bad_session_params_name_the_field(params, field):
    async def main():
        m = SessionManager(FakeTM(), SessionConfig())
        sid = m.open("k", {})
        await turn(m, [5, 6], id=sid)
        with pytest.raises(SessionError) as e:
            await turn(m, [7], **{"id": sid, **params})
        assert e.value.status == 400 and e.value.param == field

    run(main())


def test_limits_per_key_and_in_all_and_other_keys_cannot_use_a_session():
    async def main():
        m = SessionManager(FakeTM(), SessionConfig(max_sessions=3, max_sessions_per_key=2))
        mine = [m.open("a", {}), m.open("a", {})]
        with pytest.raises(SessionError) as e:
            m.open("a", {})
        assert e.value.status == 429 and "--max-sessions-per-key" in e.value.message
        m.open("b", {})
        with pytest.raises(SessionError) as e:
            m.open("c", {})
        assert e.value.status == 429 and "--max-sessions)" in e.value.message
        with pytest.raises(SessionError) as e:
            m.close("b", mine[0])
        assert e.value.param == "session_id"
        with pytest.raises(SessionError):
            await turn(m, [1], owner="b", id=mine[0])
        m.close("a", mine[0])
        m.open("c", {})

    run(main())


def test_idle_sessions_time_out_and_the_scheduler_hears_it():
    async def main():
        tm = FakeTM()
        m = SessionManager(tm, SessionConfig(timeout=0.2))
        assert (
            m.sessions[m.open("k", {"timeout": 10**400})].timeout == 0.2
        )  # no float overflow: a 500
        sid = m.open("k", {"timeout": 60})  # the server's timeout bounds the session's
        assert m.sessions[sid].timeout == 0.2
        await turn(m, [5], id=sid)
        deadline = time.monotonic() + 3
        while m.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not m.sessions and tm.sent[-1] == CloseSessionReq(sid)
        with pytest.raises(SessionError):
            await turn(m, [6], id=sid)
        assert m._sweeper.done()  # the sweeper ends with the last session

    run(main())


def test_one_turn_at_a_time():
    async def main():
        m = SessionManager(FakeTM(), SessionConfig())
        sid = m.open("k", {})
        m.sessions[sid].busy = True
        with pytest.raises(SessionError) as e:
            await turn(m, [5], id=sid)
        assert e.value.status == 409

    run(main())


def test_the_owner_is_the_key_however_it_is_sent():
    """The server's session owner: the API key from Authorization or Anthropic's x-api-key alike."""
    from types import SimpleNamespace

    from starlette.datastructures import Headers

    from radixlm.server.session_api import owner

    def of(**headers):
        return owner(SimpleNamespace(headers=Headers(headers)))

    assert of(authorization="Bearer alice") == of(**{"x-api-key": "alice"})
    assert of(**{"x-api-key": "alice"}) != of(**{"x-api-key": "mallory"})
