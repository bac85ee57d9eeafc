"""What a step of `bench one-batch` must read and compute, and the machine's rates to hold it
against: the bytes of a decode step (weights as stored, a mixture's routed share, the KV), the
operations of a prefill's linear layers, the same products run alone, and the CPU's compute peak
(bench/limits.py)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from radixlm.bench.device_rates import DeviceTimer as _Timer


def lookups(model) -> set[str]:
    """Module names of the embedding tables a step only looks rows up in: every one but the table
    tied to the LM head (the token embedding of a tied model), e.g. Gemma 4's per-layer inputs."""
    from radixlm.model.layers.linear import VocabEmbedding

    tied = not any("lm_head" in n for n, _ in model.named_modules())
    return {
        n
        for n, m in model.named_modules()
        if isinstance(m, VocabEmbedding) and not (tied and n.endswith("model.embed_tokens"))
    }


def named_linear_weights(model) -> list[tuple[str, object]]:
    """(module name, weight) of the weights a decode step multiplies by: every 2-D parameter but
    the embedding lookups (the embedding itself counts when it is tied to the LM head), and the
    matrices layers hold in another form (quantized, FP8: WeightMatrix)."""
    from radixlm.model.layers.quantized import WeightMatrix

    tables = lookups(model)
    owner = lambda n: n.rpartition(".")[0]
    weights = [
        (owner(n), p)
        for n, p in model.named_parameters()
        if p.dim() == 2 and owner(n) not in tables
    ]
    return weights + [
        (n, m.qweight)
        for n, m in model.named_modules()
        if isinstance(getattr(m, "qweight", None), WeightMatrix) and n not in tables
    ]


def linear_weights(model) -> list:
    return [w for _, w in named_linear_weights(model)]


def matmul_reference(runner, bs: int, repeats: int = 20) -> dict:
    """The same matrix products as one decode step's linear layers, run back to back with nothing
    else: the machine's matmul rate at the model's shapes (what a step could reach); a held matrix
    (quantized, FP8) multiplies by its own kernel."""
    import torch
    import torch.nn.functional as F

    timer = _Timer(runner.device)
    products = [
        (w.shape[0], w.shape[1], w.dtype, lambda x, w=w: F.linear(x, w))
        if isinstance(w, torch.Tensor)
        else (w.rows, w.cols, runner.dtype, w.matmul)
        for w in linear_weights(runner.model)
    ]
    xs = {(k, dt): torch.randn(bs, k, dtype=dt, device=runner.device) for _, k, dt, _ in products}
    flops = sum(2 * bs * n * k for n, k, _, _ in products)
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 2):
            t0 = timer.now()
            for _, k, dt, product in products:
                product(xs[k, dt])
            times.append(timer.now() - t0)
    return {"linear_flops": flops, "matmul_only_ms": statistics.median(times[2:]) * 1e3}


def expert_shares(model, bs: int) -> tuple[dict[str, float], float]:
    """(parameter name -> the share of it a step of bs tokens reads, the bytes read of experts held
    outside parameters): a mixture's experts, routed top-k of E uniformly (random weights), are
    touched E (1 - (1 - k/E)^bs) at a time. SparseMoeBlock's w13 / w2, and the families' own
    (`routed` = (E, k): their direct parameters, the blocks in `quantized` / `fused`)."""
    from radixlm.model.layers.moe.moe_block import SparseMoeBlock

    shares, held = {}, 0.0
    for name, mod in model.named_modules():
        if isinstance(mod, SparseMoeBlock):
            e, k = mod.spec.num_experts, mod.spec.top_k
            for which in ("w13_weight", "w2_weight"):
                shares[f"{name}.{which}"] = 1 - (1 - k / e) ** bs
        elif getattr(mod, "routed", None):
            e, k = mod.routed
            share = 1 - (1 - k / e) ** bs
            for which, _ in mod.named_parameters(recurse=False):
                shares[f"{name}.{which}"] = share
            blocks = [*getattr(mod, "quantized", {}).values(), *getattr(mod, "fused", {}).values()]
            held += share * sum(w.data.nbytes for w in blocks)
    return shares, held


def bytes_per_step(runner, bs: int, context: float) -> int:
    """What one decode step must read: every weight as stored (quantized blocks as they are, FP8
    weights with their scales: WeightMatrix.nbytes; the embedding table only when it is the tied
    LM head; a mixture's experts as far as the step routes to them: expert_shares) and the K/V of
    `context` tokens per request. A hybrid's recurrent states are left out (state_step_bytes)."""
    model = runner.model
    tables = lookups(model)
    total = 0
    for name, mod in model.named_modules():
        q = getattr(mod, "qweight", None)
        if q is not None and name not in tables:
            total += q.nbytes
    shares, held = expert_shares(model, bs)
    total += held + sum(
        p.nbytes * shares.get(n, 1.0)
        for n, p in model.named_parameters()
        if n.rpartition(".")[0] not in tables
    )
    pool = runner.token_to_kv_pool
    per_token = pool.bytes_per_token(
        pool.num_layers, pool.num_kv_heads, pool.head_dim, pool.dtype, pool.v_head_dim
    )
    return int(total + bs * context * per_token)


def state_step_bytes(runner, bs: int) -> int:
    """A hybrid's recurrent states a decode step reads and writes back (0 without state layers)."""
    pool = getattr(runner, "state_pool", None)
    return 0 if pool is None else 2 * bs * pool.state_bytes


def _size(w) -> int:
    return w.shape[0] * w.shape[1] if hasattr(w, "shape") else w.rows * w.cols


def prefill_ops(runner, bs: int, input_len: int) -> float:
    """Integer / float operations of a prefill's linear layers (2 per multiply-add): every prompt
    token through every matrix but the LM head (or the embedding tied to it), which computes each
    request's last token only. Attention's products are left out (at 512 tokens a few percent of
    a 1B's)."""
    sizes = [(n, _size(w)) for n, w in named_linear_weights(runner.model)]
    head = sum(v for n, v in sizes if n.endswith(("lm_head", "embed_tokens")))
    return 2.0 * (bs * input_len * (sum(v for _, v in sizes) - head) + bs * head)


def compute_peak(runner) -> tuple[str, float] | None:
    """(kind, ops/s) of the loop a step's products run on this CPU at the runner's threads: the
    fastest integer dot product for quantized weights, float32 FMA otherwise (bench/limits.py);
    None off the CPU or without the native kernels."""
    from radixlm.kernels import build

    if runner.device.type != "cpu" or not build.load():
        return None
    from radixlm.bench import limits

    int8 = runner.loaded.quantization not in ("none", None)
    rates = limits.peaks("int8" if int8 else "fp32")
    return max(rates.items(), key=lambda kv: kv[1]) if rates else None


@dataclass(frozen=True)
class GGUFStepCosts:
    """What serving a GGUF costs per token, from its tensors alone (no model built), so that two
    engines serving the same file are held to the same limits."""

    decode_bytes: int  # a decode step of one request: weights as stored, routed experts only
    prefill_ops: float  # integer ops (2 per multiply-add) per prompt token, LM head aside
    head_ops: float  # the LM head's, once per prompt (its last token)


def gguf_step_costs(path: str) -> GGUFStepCosts:
    """The bytes a decode step reads and the operations a prompt token costs, counted from a GGUF's
    tensor table: the token embedding is a lookup unless it is the tied LM head (no
    `output.weight`); a mixture's expert tensors (`*_exps`) count at expert_used_count /
    expert_count. K/V and recurrent states are left out (at a few hundred tokens a few MB)."""
    from radixlm.model.gguf.reader import open_gguf

    reader = open_gguf(path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()

    def meta(key: str, default: int) -> int:
        f = reader.fields.get(f"{arch}.{key}")
        return int(f.parts[-1][0]) if f is not None else default

    routed = meta("expert_used_count", 1) / max(meta("expert_count", 1), 1)
    names = {t.name for t in reader.tensors}
    tied = "output.weight" not in names
    step = ops = head = 0.0
    for t in reader.tensors:
        if len(t.shape) < 2:  # norms and biases
            step += t.n_bytes
            continue
        values = float(t.n_elements)
        share = routed if "_exps" in t.name else 1.0
        if t.name == "output.weight" or (tied and t.name == "token_embd.weight"):
            step += t.n_bytes
            head += 2 * values
        elif t.name != "token_embd.weight":
            step += t.n_bytes * share
            ops += 2 * values * share
    return GGUFStepCosts(decode_bytes=int(step), prefill_ops=ops, head_ops=head)
