"""`radixlm serve` on a tiny random DeepSeek-V2 (MLA, grouped softmax routing) through the official
`openai` client: /v1/completions with token-id prompts answers transformers' greedy tokens, alone
and concurrently with a shared prefix; a bad request is a 400 naming the field and the server
keeps serving."""

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import requests
import torch

from radixlm.server.process import ServerProcess
from tests.model.deepseek_refs import save_hf


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory, default_model_path):
    path, hf, _ = save_hf("v2", tmp_path_factory.mktemp("deepseek-v2-server"), default_model_path)
    server = ServerProcess(
        "--model-path",
        path,
        "--num-threads",
        "1",
        "--kv-memory-gb",
        "0.02",
        "--enable-invariant-checks",
        "--chunked-prefill-size",
        "32",
    )
    yield hf, server, path
    server.stop()


def test_completions_match_transformers(deepseek):
    hf, server, path = deepseek
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(21)
        doc = torch.randint(3, 256, (50,), generator=g).tolist()
        prompts = [doc + torch.randint(3, 256, (k,), generator=g).tolist() for k in (4, 7, 12)]
        with torch.no_grad():
            refs = [
                hf.generate(torch.tensor([p]), max_new_tokens=16, do_sample=False)[
                    0, len(p) :
                ].tolist()
                for p in prompts
            ]
    finally:
        torch.set_num_threads(n)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    model = client.models.list().data[0].id

    def complete(p):
        return client.completions.create(
            model=model, prompt=p, max_tokens=16, temperature=0, extra_body={"ignore_eos": True}
        )

    first = complete(prompts[0])
    with ThreadPoolExecutor(2) as pool:
        rest = list(pool.map(complete, prompts[1:]))
    from radixlm.model.loader import load_tokenizer

    tok = load_tokenizer(path)
    assert [r.choices[0].text for r in [first, *rest]] == [
        tok.decode(ref, skip_special_tokens=True) for ref in refs
    ]
    for p, ref in zip(
        prompts, refs
    ):  # the native route: the token ids, and the prefix from the tree
        out = requests.post(
            server.url + "/generate",
            json={
                "input_ids": p,
                "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True},
            },
            timeout=120,
        ).json()
        assert out["output_ids"] == ref
        assert out["meta_info"]["cached_tokens"] >= len(doc)
    assert all(r.usage.completion_tokens == 16 for r in [first, *rest])
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=model, prompt=prompts[0], max_tokens=-1)
    assert (
        complete(prompts[0]).choices[0].text == first.choices[0].text
    )  # still serving, same answer
