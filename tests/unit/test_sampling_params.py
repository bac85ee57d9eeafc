import pytest

from radixlm.sampling_params import SamplingParams, SamplingParamsError


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
