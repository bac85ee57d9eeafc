"""A TARGET_VERIFY forward of draft trees (model/tree_mask.py: each node at its prefix + depth,
attending its prefix and ancestors) gives every node the logits transformers gives the sequence
prompt + root + the node's path: tiny Llama on the torch and native backends, tiny DeepSeek-V2 on
the MLA backend, several requests with trees and a chain beside them."""

from __future__ import annotations

import random

import pytest
import torch
import transformers

from radixlm.model.forward_batch import ForwardBatch, ForwardMode
from radixlm.model.layers.attention import NativeCPUBackend, TorchSDPABackend
from radixlm.model.loader import load_model
from radixlm.model.tree_mask import NO_PARENT, TreeMask
from tests.model.deepseek_refs import MLAHarness, make_hf
from tests.model.helpers import SMALL, PoolHarness, hf_logits, randomize

ATOL = 1e-4  # as tests/model/test_logits.py


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def verify(h: PoolHarness, reqs: list[int], parents: list[list[int]], tokens: list[list[int]]) -> list[torch.Tensor]:
    """One TARGET_VERIFY batch: per request its new tokens (the root, then its nodes) with their
    parents among them; returns each request's logits rows."""
    prefix = [h.lens[r] for r in reqs]
    ext = [len(t) for t in tokens]
    mask = TreeMask.from_parents(parents, torch.device("cpu"))
    out_loc = h.kv_pool.alloc(sum(ext))
    start = 0
    for r, p, e in zip(reqs, prefix, ext):
        h.req_pool.req_to_token[r, p : p + e] = out_loc[start : start + e]
        h.lens[r] = p + e
        start += e
    positions = [p + d for b, p in enumerate(prefix) for d in mask.depths(b)]
    seq = [p + e for p, e in zip(prefix, ext)]
    fb = ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY, batch_size=len(reqs),
        input_ids=torch.tensor([t for ts in tokens for t in ts]), positions=torch.tensor(positions),
        req_pool_indices=torch.tensor(reqs), seq_lens=torch.tensor(seq), out_cache_loc=out_loc,
        req_to_token_pool=h.req_pool, token_to_kv_pool=h.kv_pool, seq_lens_cpu=seq, extend_prefix_lens_cpu=prefix,
        extend_seq_lens_cpu=ext, attn_backend=h.attn_backend, tree_mask=mask)
    with torch.no_grad():
        return list(h.model.compute_logits(h.model(fb.input_ids, fb.positions, fb)).split(ext))


def check_trees(h: PoolHarness, hf, vocab: int, seed: int) -> None:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (5, 40, 17)]
    reqs = [h.new_request() for _ in prompts]
    h.extend(reqs, prompts)
    parents, tokens = [], []
    for b in range(len(prompts)):
        n = rng.randrange(4, 12)
        chain = b == 1  # a chain beside the trees
        parents.append([NO_PARENT] + [r - 1 if chain else rng.randrange(r) for r in range(1, n)])
        tokens.append([rng.randrange(3, vocab) for _ in range(n)])
    outs = verify(h, reqs, parents, tokens)
    for prompt, par, toks, rows in zip(prompts, parents, tokens, outs):
        for r in range(len(toks)):
            path, a = [], r
            while a != NO_PARENT:
                path.append(toks[a])
                a = par[a]
            ref = hf_logits(hf, prompt + path[::-1])[-1]
            diff = (rows[r] - ref).abs().max().item()
            assert diff < ATOL, f"node {r}: max|diff| {diff:.2e}"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    config = transformers.LlamaConfig(**SMALL, tie_word_embeddings=False)
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    randomize(hf)
    hf.eval()
    path = tmp_path_factory.mktemp("tree-llama")
    hf.save_pretrained(path)
    return hf, load_model(str(path))


@pytest.mark.parametrize("backend", ["torch", "native"])
def test_llama_tree_verify_rows_equal_transformers(llama, backend, native_kernels_built):
    assert backend == "torch" or native_kernels_built, "the native kernels failed to build"
    hf, loaded = llama
    h = PoolHarness(loaded.model, loaded.hf_config, attn_backend=TorchSDPABackend() if backend == "torch"
                    else NativeCPUBackend())
    check_trees(h, hf, SMALL["vocab_size"], seed=3)


def test_deepseek_mla_tree_verify_rows_equal_transformers(tmp_path):
    hf, cfg = make_hf("v2")
    hf.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    check_trees(MLAHarness(loaded.model, loaded.hf_config), hf, cfg.vocab_size, seed=4)
