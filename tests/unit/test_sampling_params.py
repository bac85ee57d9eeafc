import pytest

from radixlm.sampling_params import SamplingParams, SamplingParamsError
from radixlm.stop_match import STOP_REGEX_WINDOW


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"n": 0}, "n"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_new_tokens": 5, "max_new_tokens": 2}, "min_new_tokens"),
        ({"stop": [""]}, "stop"),
        ({"max_new_tokens": "10"}, "max_new_tokens"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"bogus_key": 1}, "bogus_key"),
        ({"stop_regex": "("}, "stop_regex"),
        ({"stop_regex": "a*"}, "stop_regex"),  # matches the empty string: would stop at once
        ({"stop_regex": [3]}, "stop_regex"),
        ({"stop_regex": 5}, "stop_regex"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"5": float("inf")}}, "logit_bias"),
        ({"logit_bias": [1, 2]}, "logit_bias"),
        ({"stream_interval": 0}, "stream_interval"),
        ({"structural_tag": 5}, "structural_tag"),
        ({"regex": "a", "structural_tag": "{}"}, "structural_tag"),
        ({"seed": 1, "sampling_seed": 2}, "sampling_seed"),
        # Stop conditions run per token: bounded in number, length and compiled size.
        ({"stop": ["s"] * 17}, "stop"),
        ({"stop": "s" * 257}, "stop"),
        ({"stop_regex": ["a"] * 17}, "stop_regex"),
        ({"stop_regex": "a" * 257}, "stop_regex"),
        (
            {"stop_regex": "(?:a{1000}){1000}"},
            "stop_regex",
        ),  # the regex module unrolls counted repeats
        ({"stop_regex": "((((x{65535}){65535}){65535}){65535})"}, "stop_regex"),
        ({"stop_regex": r"\p{L}x"}, "stop_regex"),  # the regex module's syntax, not re's: no window
    ],
)
def test_bad_values_name_the_field(bad, field):
    with pytest.raises(SamplingParamsError, match=field):
        SamplingParams.from_dict(bad)


def test_defaults_and_greedy():
    sp = SamplingParams.from_dict({"temperature": 0, "stop": "x"})
    assert sp.is_greedy and sp.stop_strs == ["x"] and sp.max_new_tokens == 128
    assert not SamplingParams.from_dict({}).is_greedy
    with pytest.raises(SamplingParamsError, match="vocab"):
        SamplingParams.from_dict({"stop_token_ids": [10]}).verify(vocab_size=5)


def test_sglang_frontend_payload():
    """What SGLang 0.5's RuntimeEndpoint sends for a plain gen: every key, unset ones null or
    empty."""
    sent = {
        "skip_special_tokens": True,
        "spaces_between_special_tokens": True,
        "max_new_tokens": 16,
        "min_new_tokens": 0,
        "n": 1,
        "stop": [],
        "stop_token_ids": [],
        "stop_regex": [],
        "temperature": 0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "ignore_eos": False,
        "regex": None,
        "json_schema": None,
    }
    sp = SamplingParams.from_dict(sent)
    assert (
        sp.is_greedy and sp.stop_strs == [] and sp.stop_regex_list == [] and sp.grammar_key is None
    )
    assert SamplingParams.from_dict({"temperature": None, "n": None}) == SamplingParams()


def test_stop_regex_window_and_grammar_keys():
    assert SamplingParams.from_dict({"stop_regex": [r"ab\d{2}", "xyz"]}).stop_regex_window == 4
    assert (
        SamplingParams.from_dict({"stop_regex": r"a.*b"}).stop_regex_window == STOP_REGEX_WINDOW
    )  # unbounded: the cap
    tag = {"structures": [], "triggers": []}
    assert SamplingParams.from_dict({"structural_tag": tag}).grammar_key == (
        "structural_tag",
        '{"structures": [], "triggers": []}',
    )
    sp = SamplingParams.from_dict({"sampling_seed": 5})
    assert sp.seed == sp.sampling_seed == 5
    SamplingParams.from_dict({"logit_bias": {"3": -100, 4: 2.5}}).verify(vocab_size=10)
    with pytest.raises(SamplingParamsError, match="logit_bias"):
        SamplingParams.from_dict({"logit_bias": {"10": 1}}).verify(vocab_size=10)
