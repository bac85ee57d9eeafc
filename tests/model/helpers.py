"""Drive a model through the KV pools the way the scheduler does, so tests read as
"prefill these, extend that over a shared prefix, decode these together"."""

from __future__ import annotations

import random

import torch

from radixlm.cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.cache.swa_pool import SWATokenToKVPool
from radixlm.model.forward_batch import ForwardBatch, ForwardMode
from radixlm.model.layers.attention import RadixAttention, TorchSDPABackend, attention_features
from radixlm.model.models.llama import get_head_dim
from radixlm.model.tree_mask import NO_PARENT, TreeMask

# Tiny model shape shared by the logits tests.
SMALL = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)


class PoolHarness:
    def __init__(
        self,
        model,
        config,
        max_reqs: int = 16,
        max_context: int = 512,
        kv_size: int = 4096,
        seed: int = 0,
        attn_backend=None,
        kv_dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        swa_layers: list[int] | None = None,
    ):
        """swa_layers: the windowed layers' KV in a slot space of their own (SWATokenToKVPool, as
        the server's hybrid SWA memory keeps them), as many slots as the full layers'."""
        self.model = model
        if (
            attn_backend is None
        ):  # built for the model's sliding windows and logit caps, as ModelRunner does
            window, cap, sinks, _ = attention_features(model.modules())
            attn_backend = TorchSDPABackend(sliding_window_size=window, logit_cap=cap, sinks=sinks)
        self.attn_backend = attn_backend
        self.device = torch.device(device)
        self.req_pool = ReqToTokenPool(max_reqs, max_context, device=self.device)
        # the model's own KV heads (a tensor-parallel rank's share), as ModelRunner sizes them
        shape = (
            next(m.num_kv_heads for m in model.modules() if isinstance(m, RadixAttention)),
            get_head_dim(config),
            kv_dtype,
            self.device,
        )
        if swa_layers is None:
            self.kv_pool = TokenToKVPool(kv_size, config.num_hidden_layers, *shape)
            spaces = [self.kv_pool]
        else:
            self.kv_pool = SWATokenToKVPool(
                kv_size, kv_size, config.num_hidden_layers, swa_layers, *shape
            )
            spaces = [self.kv_pool.full, self.kv_pool.swa]
        # Hand out KV slots in a scrambled order so no test passes by accident of
        # contiguous, position-ordered slots.
        g = torch.Generator().manual_seed(seed)
        for pool in spaces:
            pool.free_slots = pool.free_slots[torch.randperm(kv_size, generator=g).to(self.device)]
        self.lens: dict[int, int] = {}  # request slot -> tokens whose K/V are in the pool

    def new_request(self, share_prefix_of: int | None = None, prefix_len: int = 0) -> int:
        """A request slot; optionally starting with another request's first `prefix_len`
        KV slots (what a radix-cache hit gives the scheduler)."""
        slot = self.req_pool.alloc()
        assert slot is not None
        self.lens[slot] = 0
        if share_prefix_of is not None:
            assert prefix_len <= self.lens[share_prefix_of]
            r2t = self.req_pool.req_to_token
            r2t[slot, :prefix_len] = r2t[share_prefix_of, :prefix_len]
            self.lens[slot] = prefix_len
        return slot

    def _run(
        self,
        mode,
        reqs,
        new_tokens: list[list[int]],
        num_decode: int = 0,
        tree_parents: list[list[int]] | None = None,
    ) -> torch.Tensor:
        prefix = [self.lens[r] for r in reqs]
        extend = [len(t) for t in new_tokens]
        seq = [p + e for p, e in zip(prefix, extend)]
        tree = None if tree_parents is None else TreeMask.from_parents(tree_parents, self.device)
        out_cache_loc = self.kv_pool.alloc(sum(extend))
        assert out_cache_loc is not None, "KV pool exhausted"
        start = 0
        for r, p, e in zip(reqs, prefix, extend):
            self.req_pool.req_to_token[r, p : p + e] = out_cache_loc[start : start + e]
            self.lens[r] = p + e
            start += e
        fb = ForwardBatch(
            forward_mode=mode,
            batch_size=len(reqs),
            input_ids=torch.tensor(
                [t for ts in new_tokens for t in ts], dtype=torch.int64, device=self.device
            ),
            positions=(
                torch.cat([torch.arange(p, s, device=self.device) for p, s in zip(prefix, seq)])
                if tree is None
                else torch.tensor(
                    [p + d for b, p in enumerate(prefix) for d in tree.depths(b)],
                    device=self.device,
                )
            ),
            req_pool_indices=torch.tensor(reqs, dtype=torch.int64, device=self.device),
            seq_lens=torch.tensor(seq, dtype=torch.int64, device=self.device),
            out_cache_loc=out_cache_loc,
            req_to_token_pool=self.req_pool,
            token_to_kv_pool=self.kv_pool,
            seq_lens_cpu=seq,
            extend_prefix_lens_cpu=prefix if mode.is_extend() else None,
            extend_seq_lens_cpu=extend if mode.is_extend() else None,
            attn_backend=self.attn_backend,
            num_decode=num_decode,
            tree_mask=tree,
        )
        with torch.no_grad():
            return self.model.compute_logits(self.model(fb.input_ids, fb.positions, fb))

    def extend(self, reqs: list[int], new_tokens: list[list[int]]) -> list[torch.Tensor]:
        """One EXTEND batch; returns each request's logits [new_tokens, vocab]."""
        logits = self._run(ForwardMode.EXTEND, reqs, new_tokens)
        return list(logits.split([len(t) for t in new_tokens]))

    def decode(self, reqs: list[int], tokens: list[int]) -> torch.Tensor:
        """One DECODE batch (one token per request); returns logits [bs, vocab]."""
        return self._run(ForwardMode.DECODE, reqs, [[t] for t in tokens])

    def mixed(
        self,
        reqs: list[int],
        new_tokens: list[list[int]],
        decode_reqs: list[int],
        tokens: list[int],
    ) -> list[torch.Tensor]:
        """One MIXED batch: extends of reqs, then a decode step of decode_reqs; per request its
        logits."""
        all_tokens = new_tokens + [[t] for t in tokens]
        logits = self._run(
            ForwardMode.MIXED, reqs + decode_reqs, all_tokens, num_decode=len(decode_reqs)
        )
        return list(logits.split([len(t) for t in all_tokens]))

    def verify(
        self,
        reqs: list[int],
        new_tokens: list[list[int]],
        tree_parents: list[list[int]] | None = None,
    ) -> list[torch.Tensor]:
        """One TARGET_VERIFY batch (each request's next input and drafts); every row's logits.
        tree_parents: per request, each new token's parent among its new tokens (model/tree_mask.py:
        a draft tree under the next input); None: chains."""
        logits = self._run(ForwardMode.TARGET_VERIFY, reqs, new_tokens, tree_parents=tree_parents)
        return list(logits.split([len(t) for t in new_tokens]))


def save_random_llama(path) -> tuple:
    """A random Llama of SMALL's shape (GQA 2, head_dim 16, untied), every weight drawn (randomize),
    saved as HF safetensors at path: (transformers' model, its config)."""
    import transformers

    config = transformers.LlamaConfig(**SMALL, tie_word_embeddings=False)
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="eager"
    )
    randomize(hf)
    hf.eval().save_pretrained(path)
    return hf, config


def hf_logits(hf_model, ids: list[int]) -> torch.Tensor:
    """Reference logits [len(ids), vocab] from a transformers model, one sequence, no padding."""
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float()


def randomize(model: torch.nn.Module) -> None:
    """HF init leaves norms at 1 and biases at 0, which would hide a mis-loaded norm or
    bias; draw everything, scaled so logits are O(1) and ATOL is a tight bound."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(
                    torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5
                )  # [.., out, in]: 3-D experts too


def check_trees(h: PoolHarness, hf, vocab: int, seed: int) -> None:
    """Three prompts prefilled, then one TARGET_VERIFY batch of random draft trees (a chain beside
    them): every node's logits equal transformers' for prompt + the node's path (root included)."""
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
    outs = h.verify(reqs, tokens, parents)
    for prompt, par, toks, rows in zip(prompts, parents, tokens, outs):
        for r in range(len(toks)):
            path, a = [], r
            while a != NO_PARENT:
                path.append(toks[a])
                a = par[a]
            ref = hf_logits(hf, prompt + path[::-1])[-1]
            diff = (rows[r].cpu() - ref).abs().max().item()
            assert diff < 1e-4, f"node {r}: max|diff| {diff:.2e}"


def logits_of_run(runner, prompts: list[list[int]], output_len: int) -> tuple[list, list]:
    """bench one-batch's run_once on a ModelRunner, recording every forward's next-token logits (the
    batched prefill, each decode step); -> (those logits, the output tokens)."""
    from radixlm.bench.one_batch import run_once

    seen = []
    forward = runner.forward

    def recording(fb):
        out = forward(fb)
        seen.append(out.next_token_logits.clone())
        return out

    runner.forward = recording
    try:
        out = run_once(runner, prompts, output_len)
    finally:
        del runner.forward
    return seen, out["output_ids"]
