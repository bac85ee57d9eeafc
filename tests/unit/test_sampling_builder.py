"""server/sampling_builder.py: one builder, each API's field mapping and names in its 400s."""

from types import SimpleNamespace

import pytest

from radixlm.server.api_common import HTTPError
from radixlm.server.sampling_builder import ClientNames, build_sampling_params

OPENAI = ClientNames({"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}, True)
LLAMA = ClientNames({"repetition_penalty": "repeat_penalty", "max_new_tokens": "n_predict"})


def test_copies_what_the_request_set_in_order_and_spells_values_natively():
    req = SimpleNamespace(temperature=0.5, top_k=None, repeat_penalty=1.1)
    fields = {
        "temperature": "temperature",
        "top_k": "top_k",
        "repeat_penalty": "repetition_penalty",
    }
    sp = build_sampling_params(
        req, fields, 100, LLAMA, first={"max_new_tokens": 8}, then={"stop": ["\n"]}
    )
    assert list(sp.items()) == [
        ("max_new_tokens", 8),
        ("temperature", 0.5),
        ("repetition_penalty", 1.1),
        ("stop", ["\n"]),
    ]
    off = build_sampling_params(  # a value the API spells as "off" is left out
        req, fields, 100, LLAMA, first={}, value=lambda f, v: None if f == "temperature" else v
    )
    assert "temperature" not in off


@pytest.mark.parametrize(
    "names, first, then, message, param",
    [
        # OpenAI names each native field wherever the message says it
        (
            OPENAI,
            {"max_new_tokens": 4},
            {"min_new_tokens": 9},
            "min_tokens must be <= max_tokens (4), got 9",
            "min_tokens",
        ),
        # llama-server's routes name the field the message is about
        (LLAMA, {"max_new_tokens": -1}, {}, "n_predict must be >= 0, got -1", "n_predict"),
        (
            LLAMA,
            {"repetition_penalty": 3.0},
            {},
            "repeat_penalty must be in (0, 2], got 3.0",
            "repeat_penalty",
        ),
    ],
)
def test_a_refused_value_is_a_400_in_the_clients_names(names, first, then, message, param):
    with pytest.raises(HTTPError) as e:
        build_sampling_params(SimpleNamespace(), {}, 100, names, first=first, then=then)
    assert (e.value.status, e.value.message, e.value.param) == (400, message, param)
