"""A model's sampling defaults (issue 49): a tiny model whose generation_config.json sets top_k 1.
A request that sets no sampling parameter is greedy (the same tokens as temperature 0, whatever the
seed); explicit values win field by field (the outputs of a server ignoring the file, given the
same values); `--sampling-defaults openai` ignores the file. Native /generate and the `openai`
client; a GGUF's general.sampling.* metadata through the in-process Engine."""

import json
import shutil

import openai
import pytest
import requests

from radixlm.server.process import ServerProcess

TINY = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")
GEN = {"top_k": 1, "temperature": 0.8, "top_p": 0.9}  # what the file recommends
SEEDS = range(6)
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def gen_model_dir(tiny_model_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-gen") / "model"
    shutil.copytree(tiny_model_dir, path)
    file = path / "generation_config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **GEN}))
    return str(path)


@pytest.fixture(scope="module")
def model_server(gen_model_dir):
    s = ServerProcess("--model-path", gen_model_dir, *TINY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def openai_server(gen_model_dir):
    s = ServerProcess("--model-path", gen_model_dir, "--sampling-defaults", "openai", *TINY)
    yield s
    s.stop()


def served(s) -> str:
    return requests.get(s.url + "/v1/models", timeout=30).json()["data"][0]["id"]


def generate(server, **sp) -> list[int]:
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 12, "ignore_eos": True, **sp}}
    r = requests.post(server.url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


def completion(server, extra_body=None, **kw) -> str:
    out = client(server).completions.create(
        model=served(server),
        prompt=PROMPT,
        max_tokens=12,
        **kw,
        extra_body={"ignore_eos": True, **(extra_body or {})},
    )
    return out.choices[0].text


def chat(server, **kw) -> str:
    out = client(server).chat.completions.create(
        model=served(server),
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=12,
        **kw,
        extra_body={"ignore_eos": True},
    )
    return out.choices[0].message.content


def test_model_info_shows_what_requests_get(model_server, openai_server, gen_model_dir):
    with open(gen_model_dir + "/generation_config.json") as f:
        on_file = {
            k: v
            for k, v in json.load(f).items()
            if k in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")
        }
    assert (
        requests.get(model_server.url + "/get_model_info").json()["preferred_sampling_params"]
        == on_file
    )
    assert (
        requests.get(openai_server.url + "/get_model_info").json()["preferred_sampling_params"]
        is None
    )


def test_a_request_without_sampling_parameters_is_greedy(model_server, openai_server):
    greedy = generate(model_server, temperature=0)
    assert all(generate(model_server, sampling_seed=s) == greedy for s in SEEDS)
    greedy_text = completion(model_server, temperature=0)
    assert all(completion(model_server, seed=s) == greedy_text for s in SEEDS)
    greedy_chat = chat(model_server, temperature=0)
    assert all(chat(model_server, seed=s) == greedy_chat for s in SEEDS)
    # The file decides it: a server that ignores it samples (temperature 1) for the same requests.
    assert any(generate(openai_server, sampling_seed=s) != greedy for s in SEEDS)
    assert any(completion(openai_server, seed=s) != greedy_text for s in SEEDS)
    assert any(chat(openai_server, seed=s) != greedy_chat for s in SEEDS)


def test_explicit_values_win_field_by_field(model_server, openai_server):
    """An explicit top_k lifts the file's top_k 1: the rest (temperature 0.8, top_p 0.9) still comes
    from the file; an explicit temperature replaces the file's (other tokens for some seeds)."""
    for s in SEEDS:
        assert generate(model_server, top_k=50, sampling_seed=s) == generate(
            openai_server, top_k=50, temperature=0.8, top_p=0.9, sampling_seed=s
        )
        assert generate(model_server, top_k=50, temperature=1.7, sampling_seed=s) == generate(
            openai_server, top_k=50, temperature=1.7, top_p=0.9, sampling_seed=s
        )
        assert completion(
            model_server, temperature=1.7, seed=s, extra_body={"top_k": 50}
        ) == completion(openai_server, temperature=1.7, top_p=0.9, seed=s, extra_body={"top_k": 50})
    assert any(
        generate(model_server, top_k=50, temperature=1.7, sampling_seed=s)
        != generate(model_server, top_k=50, sampling_seed=s)
        for s in SEEDS
    )
    assert generate(model_server, temperature=None, sampling_seed=1) == generate(
        model_server, temperature=0
    )  # null: unset


def test_openai_mode_ignores_the_file(openai_server):
    for s in SEEDS[:3]:
        assert generate(openai_server, sampling_seed=s) == generate(
            openai_server, temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0, sampling_seed=s
        )


def test_gguf_sampling_metadata_reaches_the_engine(default_model_path, tmp_path):
    """The default model's GGUF with llama.cpp's general.sampling.top_k = 1 added (gguf-py's own
    copier): the in-process Engine's requests without sampling parameters are greedy."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    from radixlm import Engine
    from tests.conftest import engine_args

    path = str(tmp_path / "smollm2-top-k-1.gguf")
    reader = gguf.GGUFReader(default_model_path)
    writer = gguf.GGUFWriter(path, arch=reader.get_field(gguf.Keys.General.ARCHITECTURE).contents())
    copy_with_new_metadata(
        reader,
        writer,
        {
            gguf.Keys.General.SAMPLING_TOP_K: MetadataDetails(gguf.GGUFValueType.INT32, 1),
            gguf.Keys.General.SAMPLING_TEMP: MetadataDetails(gguf.GGUFValueType.FLOAT32, 0.7),
        },
        [],
    )
    with Engine(
        path, **engine_args(tokenizer_path=default_model_path)
    ) as e:  # its tokenizer is cached
        assert e.scheduler_info["sampling_defaults"] == {"top_k": 1, "temperature": 0.7}
        sp = {"max_new_tokens": 8, "ignore_eos": True}
        greedy = e.generate(PROMPT, {**sp, "temperature": 0})["output_ids"]
        assert all(
            e.generate(PROMPT, {**sp, "sampling_seed": s})["output_ids"] == greedy
            for s in SEEDS[:4]
        )
        assert any(
            e.generate(PROMPT, {**sp, "top_k": -1, "sampling_seed": s})["output_ids"] != greedy
            for s in SEEDS[:4]
        )
