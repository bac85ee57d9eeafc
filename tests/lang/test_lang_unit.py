"""The interpreter, fork/join, roles and choice methods against a fake backend (no model)."""

import math

import pytest

import radixlm.lang as sgl
from radixlm.lang.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixlm.lang.native_backend import NativeBackend


def fake_tokenize(text: str) -> list[str]:
    """Characters, except that a space joins the character after it (" T"), as BPE vocabularies
    do."""
    toks, i = [], 0
    while i < len(text):
        n = 2 if text[i] == " " and i + 1 < len(text) else 1
        toks.append(text[i : i + n])
        i += n
    return toks


class FakeBackend(NativeBackend):
    """Generates "<n>" where n counts calls. Tokens are fake_tokenize's pieces (ids: the pieces
    themselves); a prompt token's logprob comes from `scores` (by token), else -1."""

    def __init__(self, scores=None):
        super().__init__()
        self.calls, self.bodies, self.scores = 0, [], scores or {}

    def tokenize(self, texts):
        return [fake_tokenize(t) for t in texts]

    def start_token_id(self):
        return "^"

    def _call(self, body):
        self.bodies.append(body)
        prompts = (
            body["text"]
            if "text" in body
            else (
                ["".join(ids) for ids in body["input_ids"]]
                if isinstance(body["input_ids"][0], list)
                else "".join(body["input_ids"])
            )
        )
        single = isinstance(prompts, str)
        prompts = [prompts] if single else prompts
        starts = body.get("logprob_start_len", 0)
        outs = []
        for j, t in enumerate(prompts):
            toks = fake_tokenize(t)
            if body["sampling_params"].get("max_new_tokens") == 0:
                lps = [[None, 0, toks[0]]] + [
                    [self.scores.get(tok, -1.0), 0, tok] for tok in toks[1:]
                ]
                start = starts[j] if isinstance(starts, list) else starts
                outs.append(
                    {
                        "text": "",
                        "meta_info": {
                            "prompt_tokens": len(toks),
                            "cached_tokens": 0,
                            "input_token_logprobs": lps[start:],
                        },
                    }
                )
            else:
                self.calls += 1
                outs.append(
                    {
                        "text": f"<{self.calls}>",
                        "meta_info": {"prompt_tokens": len(toks), "cached_tokens": 0},
                    }
                )
        return outs[0] if single else outs

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
    assert sp1 == {
        "max_new_tokens": 3,
        "temperature": 0,
        "stop": "\n",
        "json_schema": '{"type": "integer"}',
    }
    assert sp2 == {"max_new_tokens": 7, "temperature": 0}
    assert be.bodies[1]["text"] == "Ab<1>"


def test_roles_fallback_template_and_errors():
    be = FakeBackend()

    @sgl.function
    def chat(s):
        s += sgl.user("hi") + sgl.assistant(sgl.gen("r"))

    s = chat.run(backend=be)
    assert s.messages() == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<1>"},
    ]
    assert s.text() == "User: hi\nAssistant: <1>\n"

    @sgl.function
    def bad(s):
        s += sgl.user_begin() + sgl.assistant_begin()

    with pytest.raises(ValueError):
        bad.run(backend=be)
    with pytest.raises(ValueError):
        sgl.ProgramState(None)


def test_select_scores_in_one_batch_with_token_healing():
    be = FakeBackend(scores={" a": -0.5, " b": -0.2, "b": -0.2, " c": -3.0, "c": -3.0, " ": -7.0})

    @sgl.function
    def prog(s, prefix, choices):
        s += prefix + sgl.select("c", choices=choices)

    # "Q: " ends in a space that each choice's first character absorbs (" a"): the merged token is
    # scored as the choice's, exactly as if the space had been written in the choices.
    s = prog.run("Q: ", ["a", "bbb", "cc"], backend=be)
    assert s["c"] == "bbb" and s.text() == "Q: bbb"
    batch = [b for b in be.bodies if "input_ids" in b and isinstance(b["input_ids"][0], list)]
    assert len(batch) == 1 and batch[0]["logprob_start_len"] == [2, 2, 2]
    assert batch[0]["sampling_params"]["max_new_tokens"] == 0
    meta = s.get_meta_info("c")
    assert (
        meta["normalized_prompt_logprobs"] == pytest.approx([-0.5, -0.2, -3.0])
        and meta["healed_tokens"] == [1] * 3
    )

    healed = FakeBackend(scores=be.scores)
    s2 = prog.run("Q:", [" a", " bbb", " cc"], backend=healed)
    assert s2["c"] == " bbb" and s2.get_meta_info("c")["healed_tokens"] == [0] * 3
    assert s2.get_meta_info("c")["normalized_prompt_logprobs"] == meta["normalized_prompt_logprobs"]
    # The prefix is sent first (as tokens) so the batch hits the cache.
    assert be.bodies[0] == {"input_ids": ["Q", ":", " "], "sampling_params": {"max_new_tokens": 0}}
    with pytest.raises(ValueError, match="non-empty string"):
        sgl.select("c", choices=["a", ""])


def test_choice_methods():
    lps = [[-1.0], [-0.5, -9.0], [-2.0, -0.1]]
    assert token_length_normalized(["a", "b", "c"], lps)[0] == 0
    assert greedy_token_selection(["a", "b", "c"], lps)[0] == 1
    idx, meta = unconditional_likelihood_normalized(
        ["a", "b", "c"], lps, [[-0.1], [-0.5, -9.0], [-5.0, -5.0]]
    )
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

    assert (
        radixlm.function is lang.function
        and radixlm.gen is lang.gen
        and radixlm.select is lang.select
    )
    assert radixlm.RuntimeEndpoint is lang.RuntimeEndpoint


def test_run_batch_precaches_the_traced_prefix_and_keeps_errors_per_program(capsys):
    @sgl.function
    def prog(s, q):
        s += sgl.user("Shared instructions.\nQ: " + q) + sgl.assistant(sgl.gen("a"))
        if q == "boom":
            raise KeyError("boom")

    be = FakeBackend()
    states = prog.run_batch(
        [{"q": "x1"}, {"q": "boom"}, {"q": "x2"}], backend=be, progress_bar=True, num_threads=2
    )
    # Traced up to the first gen; what the inputs share (roles rendered) is sent first, once.
    assert be.bodies[0] == {
        "text": "User: Shared instructions.\nQ: ",
        "sampling_params": {"max_new_tokens": 0},
    }
    assert sum(b["sampling_params"].get("max_new_tokens") == 0 for b in be.bodies) == 1
    assert "3/3" in capsys.readouterr().err  # the progress bar ran to the end
    assert states[0].error() is None and states[2].error() is None
    assert isinstance(states[1].error(), KeyError)
    with pytest.raises(KeyError):
        states[1].text()
    assert [st.messages()[0]["content"][-2:] for st in (states[0], states[2])] == ["x1", "x2"]

    be2 = FakeBackend()
    prog.run_batch([{"q": "x1"}, {"q": "x2"}], backend=be2, precache=False)
    assert all(b["sampling_params"].get("max_new_tokens") != 0 for b in be2.bodies)


def test_named_chat_templates_match_the_models_own():
    from radixlm.lang.chat_template import ChatTemplate, template_name_for_model
    from radixlm.model.loader import default_model_path, load_tokenizer

    assert template_name_for_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "smollm2"
    assert template_name_for_model("meta-llama/Meta-Llama-3-8B-Instruct") == "llama-3-instruct"
    own, named = (
        ChatTemplate(load_tokenizer(default_model_path())),
        ChatTemplate.for_model("SmolLM2-135M-Instruct.gguf"),
    )
    for role in ("system", "user", "assistant"):
        for first in (True, False):
            assert own.parts(role, first) == named.parts(role, first)
    with pytest.raises(ValueError, match="unknown chat template"):
        ChatTemplate(None, "nope")
