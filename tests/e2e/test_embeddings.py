"""Embedding models (--is-embedding): /v1/embeddings through the official `openai` client and
SGLang's /encode, against HF transformers' pooled, normalized final hidden states (fp32) of tiny
random models: a Llama with sentence-transformers' mean pooling (safetensors and GGUF), a Qwen2
base model (`Qwen2Model`: tensor names without `model.`, no lm_head) with last-token pooling."""

import base64
import json
import os

import numpy as np
import openai
import pytest
import requests
import torch

from radixlm.server.process import ServerProcess

# Different lengths in one request: they share a forward (one batch).
TEXTS = [
    "The capital of France is Paris.",
    "hi",
    "A longer sentence about embeddings, pooling and the radix cache.",
]
SERVE = (
    "--is-embedding",
    "--num-threads",
    "1",
    "--kv-memory-gb",
    "0.05",
    "--enable-invariant-checks",
)


def _small_config(tiny_model_dir, family: str):
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(tiny_model_dir).to_dict()
    keep = {
        k: v
        for k, v in cfg.items()
        if k not in ("architectures", "model_type", "transformers_version")
    }
    return getattr(transformers, f"{family}Config")(**keep)


@pytest.fixture(scope="module")
def llama_mean_dir(tmp_path_factory, tiny_model_dir):
    """A LlamaForCausalLM checkpoint with a sentence-transformers mean Pooling module."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    path = str(tmp_path_factory.mktemp("emb-llama"))
    torch.manual_seed(1)
    LlamaForCausalLM(_small_config(tiny_model_dir, "Llama")).eval().save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(path)
    with open(os.path.join(path, "modules.json"), "w") as f:
        json.dump(
            [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.models.Transformer",
                },
                {
                    "idx": 1,
                    "name": "1",
                    "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling",
                },
                {
                    "idx": 2,
                    "name": "2",
                    "path": "2_Normalize",
                    "type": "sentence_transformers.models.Normalize",
                },
            ],
            f,
        )
    os.makedirs(os.path.join(path, "1_Pooling"))
    with open(os.path.join(path, "1_Pooling", "config.json"), "w") as f:
        json.dump(
            {
                "word_embedding_dimension": 64,
                "pooling_mode_cls_token": False,
                "pooling_mode_mean_tokens": True,
                "pooling_mode_max_tokens": False,
                "pooling_mode_lasttoken": False,
            },
            f,
        )
    return path


@pytest.fixture(scope="module")
def qwen2_base_dir(tmp_path_factory, tiny_model_dir):
    """A Qwen2Model checkpoint (no lm_head, names without `model.`), no pooling config:
    last-token."""
    from transformers import AutoTokenizer, Qwen2Model

    path = str(tmp_path_factory.mktemp("emb-qwen2"))
    torch.manual_seed(2)
    Qwen2Model(_small_config(tiny_model_dir, "Qwen2")).eval().save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def llama_mean_gguf(tmp_path_factory, llama_mean_dir):
    """llama_mean_dir's weights as a float32 llama GGUF with pooling_type mean."""
    import gguf
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.checkpoints import add_llama_header
    from tests.model.test_gguf_archs import _NAMES, add_hf_tensors, write_and_close

    path = str(tmp_path_factory.mktemp("emb-gguf") / "emb.gguf")
    cfg = AutoConfig.from_pretrained(llama_mean_dir)
    hf = AutoModelForCausalLM.from_pretrained(llama_mean_dir, dtype=torch.float32)
    w = gguf.GGUFWriter(path, "llama")
    add_llama_header(w, cfg)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    add_hf_tensors(w, hf, cfg, "llama", _NAMES)
    write_and_close(w)
    return path


def reference(model_dir: str, ids: list[list[int]], pooling: str) -> list[np.ndarray]:
    """HF transformers: each input alone, the base model's last hidden state (after the final
    norm), pooled and L2-normalized."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for x in ids:
            h = model(torch.tensor([x])).last_hidden_state[0].double()
            v = h.mean(0) if pooling == "mean" else h[-1]
            out.append(torch.nn.functional.normalize(v, dim=-1).numpy())
    return out


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


def _ids(model_dir: str, texts: list[str]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return [tok.encode(t) for t in texts]


def _check(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, dtype=np.float64), w, atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def llama_server(llama_mean_dir):
    # Chunks of 4 tokens: a long input's mean is folded over several forwards.
    s = ServerProcess("--model-path", llama_mean_dir, "--chunked-prefill-size", "4", *SERVE)
    yield s
    s.stop()


def test_mean_pooling_matches_hf_float_and_base64(llama_server, llama_mean_dir):
    client = _client(llama_server)
    ids = _ids(llama_mean_dir, TEXTS)
    want = reference(llama_mean_dir, ids, "mean")
    res = client.embeddings.create(model="any", input=TEXTS, encoding_format="float")
    assert [d.index for d in res.data] == [0, 1, 2]
    _check([d.embedding for d in res.data], want)
    assert (
        res.usage.prompt_tokens == sum(map(len, ids))
        and res.usage.total_tokens == res.usage.prompt_tokens
    )
    # Token-id inputs, base64 (the client decodes it as little-endian float32).
    raw = requests.post(
        llama_server.url + "/v1/embeddings",
        json={"input": ids, "encoding_format": "base64"},
        timeout=60,
    ).json()
    _check(
        [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in raw["data"]], want
    )
    # Without encoding_format the client asks for base64 and decodes it itself.
    b64 = client.embeddings.create(model="any", input=ids[0])
    _check([b64.data[0].embedding], want[:1])
    # Repeated: the answer does not depend on what the cache holds (mean pooling takes no cached
    # prefix).
    again = requests.post(llama_server.url + "/encode", json={"text": TEXTS[0]}, timeout=60).json()
    assert again["meta_info"]["cached_tokens"] == 0
    _check([again["embedding"]], want[:1])


def test_encode_native_route(llama_server, llama_mean_dir):
    ids = _ids(llama_mean_dir, TEXTS)
    want = reference(llama_mean_dir, ids, "mean")
    one = requests.post(llama_server.url + "/encode", json={"text": TEXTS[2]}, timeout=60).json()
    _check([one["embedding"]], want[2:])
    assert one["meta_info"]["prompt_tokens"] == len(ids[2])
    batch = requests.post(
        llama_server.url + "/encode", json={"input_ids": ids[:2]}, timeout=60
    ).json()
    _check([b["embedding"] for b in batch], want[:2])


def test_bad_input_is_400_naming_input(llama_server):
    url = llama_server.url
    cases = [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": ["a", ""]}, "input"),
        ({"input": [[1, 2], [1, 10**9]]}, "input"),
        ({"input": "word " * 1100}, "input"),
        ({"input": "x", "dimensions": 8}, "dimensions"),
        ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
    ]
    for body, param in cases:
        r = requests.post(url + "/v1/embeddings", json=body, timeout=60)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == param, (body, r.text)
    r = requests.post(url + "/encode", json={"input_ids": [5, -1]}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_ids", r.text
    # Generation routes on an embedding server: a 400 that says why; the server goes on serving.
    for route, body in [
        ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}}),
        ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2}),
    ]:
        r = requests.post(url + route, json=body, timeout=60)
        assert r.status_code == 400 and "embedding model" in r.text, (route, r.text)
    assert requests.get(url + "/health_generate", timeout=60).status_code == 200
    assert requests.get(url + "/get_model_info", timeout=60).json()["is_generation"] is False
    info = requests.get(url + "/get_server_info", timeout=60).json()
    assert info["is_embedding"] is True and info["pooling"] == "mean"


def test_qwen2_base_model_last_token_pooling(qwen2_base_dir):
    s = ServerProcess("--model-path", qwen2_base_dir, *SERVE)
    try:
        ids = _ids(qwen2_base_dir, TEXTS)
        want = reference(qwen2_base_dir, ids, "last")
        res = _client(s).embeddings.create(model="any", input=TEXTS)
        _check([d.embedding for d in res.data], want)
        # Last-token pooling reuses a cached prefix: a longer input after a shorter one.
        longer = ids[0] + ids[2]
        out = requests.post(s.url + "/encode", json={"input_ids": longer}, timeout=60).json()
        assert out["meta_info"]["cached_tokens"] == len(ids[0])
        _check([out["embedding"]], reference(qwen2_base_dir, [longer], "last"))
        assert requests.get(s.url + "/get_server_info", timeout=60).json()["pooling"] == "last"
    finally:
        s.stop()


def test_gguf_embedding_model(llama_mean_gguf, llama_mean_dir):
    # float32 KV: a GGUF's default is float16 KV (llama.cpp's), which the 1e-4 check would measure
    # instead.
    s = ServerProcess(
        "--model-path",
        llama_mean_gguf,
        "--tokenizer-path",
        llama_mean_dir,
        "--kv-cache-dtype",
        "float32",
        *SERVE,
    )
    try:
        ids = _ids(llama_mean_dir, TEXTS)
        res = _client(s).embeddings.create(model="any", input=ids)
        _check([d.embedding for d in res.data], reference(llama_mean_dir, ids, "mean"))
    finally:
        s.stop()


def test_embeddings_on_a_generation_server_is_400(tiny_server):
    s = tiny_server  # the run's shared tiny-model server (a generation model)
    with pytest.raises(openai.BadRequestError, match="--is-embedding"):
        _client(s).embeddings.create(model="any", input="hi")
    r = requests.post(s.url + "/encode", json={"text": "hi"}, timeout=60)
    assert r.status_code == 400 and "--is-embedding" in r.text
    r = requests.post(
        s.url + "/generate",
        json={"text": "hi", "sampling_params": {"max_new_tokens": 1}},
        timeout=60,
    )
    assert r.status_code == 200


def test_engine_encode(qwen2_base_dir):
    """The Python API: Engine(is_embedding=True).encode, one input and a batch of ids; generate
    refused."""
    from radixlm import Engine
    from tests.conftest import engine_args

    ids = _ids(qwen2_base_dir, TEXTS)
    want = reference(qwen2_base_dir, ids, "last")
    with Engine(qwen2_base_dir, **engine_args(is_embedding=True)) as engine:
        one = engine.encode(TEXTS[1])
        _check([one["embedding"]], want[1:2])
        assert one["meta_info"]["prompt_tokens"] == len(ids[1])
        _check([o["embedding"] for o in engine.encode(ids)], want)
        with pytest.raises(ValueError, match="embedding model"):
            engine.generate("hi", {"max_new_tokens": 1})
