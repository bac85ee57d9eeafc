"""The interpreter, fork/join, roles and choice methods against a fake backend (no model)."""

import math

import pytest

import radixlm.lang as sgl
from radixlm.lang.base_backend import BaseBackend
from radixlm.lang.choices import greedy_token_selection, token_length_normalized, unconditional_likelihood_normalized


class FakeBackend(BaseBackend):
    """Generates "<n>" where n counts calls; scores choice tokens (characters) by a table."""

    def __init__(self, scores=None):
        super().__init__()
        self.calls, self.bodies, self.scores = 0, [], scores or {}

    def _call(self, body):
        self.bodies.append(body)
        texts = body["text"] if isinstance(body["text"], list) else [body["text"]]
        outs = []
        for t in texts:
            if body["sampling_params"].get("max_new_tokens") == 0:
                lps = [[None, 0, ""]] + [[self.scores.get(t, -1.0), 0, ""]] * (len(t) - 1)
                start = body.get("logprob_start_len", 0)
                outs.append({"text": "", "meta_info": {"prompt_tokens": len(t), "cached_tokens": 0,
                                                       "input_token_logprobs": lps[start:]}})
            else:
                self.calls += 1
                outs.append({"text": f"<{self.calls}>", "meta_info": {"prompt_tokens": len(t), "cached_tokens": 0}})
        return outs if isinstance(body["text"], list) else outs[0]

    def _stream(self, body):
        out = self._call(body)
        yield {**out, "text": out["text"][:1]}
        yield out


def test_text_gen_and_defaults():
    be = FakeBackend()

    @sgl.function
    def prog(s, x):
        s += "A" + x + sgl.gen("g", max_tokens=3, stop="\n", json_schema={"type": "integer"})
        s += sgl.gen("h")

    s = prog.run("b", backend=be, temperature=0, max_new_tokens=7)
    assert s.text() == "Ab<1><2>" and s["g"] == "<1>" and s["h"] == "<2>"
    sp1, sp2 = be.bodies[0]["sampling_params"], be.bodies[1]["sampling_params"]
    assert sp1 == {"max_new_tokens": 3, "temperature": 0, "stop": "\n", "json_schema": '{"type": "integer"}'}
    assert sp2 == {"max_new_tokens": 7, "temperature": 0}
    assert be.bodies[1]["text"] == "Ab<1>"


def test_roles_fallback_template_and_errors():
    be = FakeBackend()

    @sgl.function
    def chat(s):
        s += sgl.user("hi") + sgl.assistant(sgl.gen("r"))

    s = chat.run(backend=be)
    assert s.messages() == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<1>"}]
    assert s.text() == "User: hi\nAssistant: <1>\n"

    @sgl.function
    def bad(s):
        s += sgl.user_begin() + sgl.assistant_begin()

    with pytest.raises(ValueError):
        bad.run(backend=be)
    with pytest.raises(ValueError):
        sgl.ProgramState(None)


def test_select_scores_in_one_batch():
    be = FakeBackend(scores={"Q: a": -0.5, "Q: bbb": -0.2, "Q: cc": -3.0})

    @sgl.function
    def prog(s):
        s += "Q: " + sgl.select("c", choices=["a", "bbb", "cc"])

    s = prog.run(backend=be)
    assert s["c"] == "bbb"
    batch = [b for b in be.bodies if isinstance(b["text"], list)]
    assert len(batch) == 1 and batch[0]["logprob_start_len"] == 3 and batch[0]["sampling_params"]["max_new_tokens"] == 0
    assert s.get_meta_info("c")["normalized_prompt_logprobs"] == pytest.approx([-0.5, -0.2, -3.0])


def test_choice_methods():
    lps = [[-1.0], [-0.5, -9.0], [-2.0, -0.1]]
    assert token_length_normalized(["a", "b", "c"], lps)[0] == 0
    assert greedy_token_selection(["a", "b", "c"], lps)[0] == 1
    idx, meta = unconditional_likelihood_normalized(["a", "b", "c"], lps, [[-0.1], [-0.5, -9.0], [-5.0, -5.0]])
    assert idx == 2 and meta["unconditional_normalized_logprobs"][0] == pytest.approx(-0.9)
    assert token_length_normalized(["a"], [[]])[1]["normalized_prompt_logprobs"] == [-math.inf]


def test_fork_join_modes_and_prefill():
    be = FakeBackend()

    @sgl.function
    def prog(s):
        s += "P"
        forks = s.fork(3)
        for f in forks:
            f += "-" + sgl.gen("x")
        forks.join()
        s += "|"
        g = s.fork(2)
        for f in g:
            f += sgl.gen("y")
        g.join("concate_and_append")

    s = prog.run(backend=be)
    assert sorted(s["x"]) == ["<1>", "<2>", "<3>"]
    assert be.bodies[0] == {"text": "P", "sampling_params": {"max_new_tokens": 0}}
    assert s.text() in ("P|<4><5>", "P|<5><4>")


def test_run_batch_order_stream_and_errors():
    be = FakeBackend()

    @sgl.function
    def prog(s, i):
        s += f"{i}:" + sgl.gen("g")

    states = prog.run_batch([{"i": i} for i in range(8)], backend=be, num_threads=4)
    assert [st.text().split(":")[0] for st in states] == [str(i) for i in range(8)]
    st = prog.run(9, backend=be, stream=True)
    assert "".join(st.text_iter()) == st.text()

    @sgl.function
    def boom(s):
        s += 3

    with pytest.raises(TypeError):
        boom.run(backend=be)


def test_language_is_reexported_from_radixlm():
    import radixlm
    import radixlm.lang as lang

    assert radixlm.function is lang.function and radixlm.gen is lang.gen and radixlm.select is lang.select
    assert radixlm.RuntimeEndpoint is lang.RuntimeEndpoint
