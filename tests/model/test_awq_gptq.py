"""Pre-quantized AWQ and GPTQ checkpoints (quant/awq_gptq.py): tiny Llama / Qwen2 / Qwen3 models
quantized here and packed as AutoAWQ (GEMM) and AutoGPTQ (v1) write them, selected by their
config.json alone, held in the native block formats (never float), and generating HF's greedy
tokens (float32 on the dequantized weights; near-tie rule) through prefill and decode. Each
packing's unpacking also matches a plain loop decode of the producers' layouts."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import transformers

from radixlm.kernels.formats import dequantize_reference
from radixlm.model.layers.attention.native import NativeCPUBackend
from radixlm.model.layers.permuted_matrix import PermutedInputMatrix
from radixlm.model.layers.quantized import QuantizedMatrix
from radixlm.model.loader import load_model
from radixlm.model.quant.awq_gptq_repack import AWQ_ORDER, repack, unpack_awq, unpack_gptq
from tests.model.helpers import PoolHarness, randomize
from tests.model.test_gguf_mixed_quants import on_kernel_grids

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SHAPE = dict(
    vocab_size=256,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)
NEW = 12  # greedy tokens per prompt
# The native kernels round each activation row to int8 per 32 values (llama.cpp's Q8 dots) and Q4_1
# rounds its min -s*z to f16: against HF's float32 on the exact dequantized weights the logits here
# move by up to ~0.4 (max |logit| ~30; observed 0.30-0.40 in every case). A flip where HF's top-2
# gap is under NEAR_TIE is within that; a wrong nibble order, zero, scale or permutation moves
# logits by O(10). The exact check is per matrix (test_each_matrix_is_the_checkpoints_product).
NEAR_TIE = 1.0
# Each matrix's output vs the float product of its dequantized weights with its input on the int8
# grid, relative to max |output|: observed ~7e-7 (float32 summation order).
REL_TOL = 1e-5


@dataclass(frozen=True)
class Case:
    method: str
    bits: int
    group: int
    sym: bool = False
    desc_act: bool = False
    arch: str = "llama"
    fmt: str = "q4_1x8"  # what the native kernels hold


CASES = {
    "awq-4bit-g128": Case("awq", 4, 128, arch="qwen2"),
    "gptq-4bit-g128-asym": Case("gptq", 4, 128),
    "gptq-4bit-g32-act-order": Case("gptq", 4, 32, sym=True, desc_act=True, fmt="q4_0x8"),
    "gptq-8bit-g128-sym": Case("gptq", 8, 128, sym=True, arch="qwen3", fmt="q8_0x8"),
}


# ----------------------------------------------------------------------------- the producers' side
def quantize_groups(w: torch.Tensor, case: Case, g_idx: torch.Tensor):
    """RTN per group (what AWQ / GPTQ leave after their search): q [out, in], z and s
    [groups, out] (s float16, z integer), the dequantized float32 (q - z) * s."""
    maxq = 2**case.bits - 1
    groups = int(g_idx.max()) + 1
    q, z, s = torch.empty_like(w), torch.empty(groups, w.shape[0]), torch.empty(groups, w.shape[0])
    for g in range(groups):
        cols = w[:, g_idx == g]
        if case.sym:  # GPTQ sym: zero at the middle code
            scale = cols.abs().amax(1) * 2 / maxq
            zero = torch.full_like(scale, (maxq + 1) // 2)
        else:
            lo, hi = cols.amin(1).clamp(max=0), cols.amax(1).clamp(min=0)
            scale = (hi - lo) / maxq
            # GPTQ v1 stores z - 1 (AutoGPTQ's wrap of z = 0 is its own bug): keep z >= 1 there.
            zero = torch.round(-lo / scale).clamp(1 if case.method == "gptq" else 0, maxq)
        scale = scale.half().float()
        q[:, g_idx == g] = torch.clamp(torch.round(cols / scale[:, None]) + zero[:, None], 0, maxq)
        z[g], s[g] = zero, scale
    deq = (q - z[g_idx].T) * s[g_idx].T
    return q.to(torch.int64), z.to(torch.int64), s.half(), deq


def _as_int32(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a.astype(np.uint32).view(np.int32))


def pack_awq(q: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """AutoAWQ's WQLinear_GEMM.from_linear: [in, out/8], nibble i = column 8c + AWQ_ORDER[i]."""

    def pack(m: np.ndarray) -> np.ndarray:  # m [rows, cols] -> [rows, cols/8]
        out = np.zeros((m.shape[0], m.shape[1] // 8), np.uint64)
        for i, col in enumerate(AWQ_ORDER):
            out |= m[:, col::8].astype(np.uint64) << np.uint64(4 * i)
        return out

    return _as_int32(pack(q.T.numpy())), _as_int32(pack(z.numpy()))


def pack_gptq(q: torch.Tensor, z: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """AutoGPTQ's QuantLinear.pack (v1): qweight [in*bits/32, out] (row r, value j = input
    r*32/bits + j), qzeros [groups, out*bits/32] of z - 1 packed the same way along the output."""
    per = 32 // bits
    intw, zeros = q.T.numpy().astype(np.uint64), (z - 1).numpy().astype(np.uint64)
    qweight = np.zeros((intw.shape[0] // per, intw.shape[1]), np.uint64)
    qzeros = np.zeros((zeros.shape[0], zeros.shape[1] // per), np.uint64)
    for j in range(per):
        qweight |= intw[j::per] << np.uint64(bits * j)
        qzeros |= zeros[:, j::per] << np.uint64(bits * j)
    return _as_int32(qweight), _as_int32(qzeros)


def _hf_config(case: Case):
    cls = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
    }[case.arch]
    cfg = cls(**SHAPE)
    cfg.architectures = [cls.__name__.replace("Config", "ForCausalLM")]
    return cfg


def _quantization_config(case: Case) -> dict:
    if case.method == "awq":
        return dict(
            quant_method="awq", bits=4, group_size=case.group, zero_point=True, version="gemm"
        )
    return dict(
        quant_method="gptq",
        bits=case.bits,
        group_size=case.group,
        desc_act=case.desc_act,
        sym=case.sym,
        checkpoint_format="gptq",
    )


def write_checkpoint(path: str, case: Case, seed: int = 0):
    """The checkpoint at path and HF's float32 model of its dequantized weights (the reference)."""
    cfg = _hf_config(case)
    torch.manual_seed(seed)
    hf = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    randomize(hf)
    gen = torch.Generator().manual_seed(seed + 1)
    tensors: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        hf.lm_head.weight.mul_(8)  # logits of a real model's spread: greedy choices off ties
        for p in hf.parameters():  # the float tensors as such checkpoints keep them: float16
            p.copy_(p.half().float())
        orders: dict[tuple, torch.Tensor] = {}  # act-order: one per input (q/k/v, gate/up share)
        for name, p in hf.named_parameters():
            prefix, _, kind = name.rpartition(".")
            if kind != "weight" or prefix.rpartition(".")[2] not in LINEARS:
                tensors[name] = p.detach().half()
                continue
            cols = p.shape[1]
            g_idx = torch.arange(cols) // case.group
            if case.desc_act:  # GPTQ's act-order: groups follow a permutation of the input
                key = (prefix.rsplit(".", 2)[0], cols, "o_proj" in prefix, "down" in prefix)
                if key not in orders:
                    orders[key] = torch.argsort(torch.randperm(cols, generator=gen))
                g_idx = orders[key] // case.group
            q, z, s, deq = quantize_groups(p.detach(), case, g_idx)
            p.copy_(deq)
            if case.method == "awq":
                tensors[prefix + ".qweight"], tensors[prefix + ".qzeros"] = pack_awq(q, z)
            else:
                packed = pack_gptq(q, z, case.bits)
                tensors[prefix + ".qweight"], tensors[prefix + ".qzeros"] = packed
                tensors[prefix + ".g_idx"] = g_idx.to(torch.int32)
            tensors[prefix + ".scales"] = s
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    d = cfg.to_dict()
    d["quantization_config"] = _quantization_config(case)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(d, f)
    return hf, tensors


def checkpoint_cache(tmp_path_factory, write):
    """key -> (path, hf, tensors, loaded model), each written by write(path, key) and loaded once
    per module."""
    made: dict[str, tuple] = {}

    def get(key: str):
        if key not in made:
            path = str(tmp_path_factory.mktemp(key))
            hf, tensors = write(path, key)
            made[key] = path, hf, tensors, load_model(path)
        return made[key]

    return get


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, native_kernels_built):
    assert native_kernels_built, "the native kernels failed to build"
    return checkpoint_cache(tmp_path_factory, lambda path, key: write_checkpoint(path, CASES[key]))


# ----------------------------------------------------------------------------- loading and running
def _greedy_radixlm(loaded, prompt: list[int]) -> list[int]:
    h = PoolHarness(loaded.model, loaded.hf_config, attn_backend=NativeCPUBackend())
    r = h.new_request()
    tok = int(h.extend([r], [prompt])[0][-1].argmax())
    out = [tok]
    for _ in range(NEW - 1):
        tok = int(h.decode([r], [tok])[0].argmax())
        out.append(tok)
    return out


def _reference(hf, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    """HF's greedy tokens and its logits along them."""
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, eos_token_id=None
        )
        gen = out[0, len(prompt) :].tolist()
        logits = hf(torch.tensor([prompt + gen])).logits[0, len(prompt) - 1 :]
    return gen, logits


def _greedy_matches(got: list[int], gen: list[int], logits: torch.Tensor, label: str) -> int:
    """How many of HF's tokens radixlm gave before a near-tie flip (all of them: NEW)."""
    for k, (a, b) in enumerate(zip(got, gen)):
        if a != b:
            top2 = torch.topk(logits[k], 2).values
            gap = (top2[0] - top2[1]).item()
            assert gap < NEAR_TIE, f"{label}: token {k} is {a}, HF's {b}, top-2 gap {gap:.3g}"
            return k  # a genuine near-tie: the tokens up to here matched
    assert got == gen, label
    return len(gen)


def _matrices(loaded):
    for layer in loaded.model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        yield from (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)


@pytest.mark.parametrize("key", list(CASES))
def test_checkpoint_loads_quantized_and_generates_hf_greedy(checkpoints, key):
    path, hf, tensors, loaded = checkpoints(key)
    case = CASES[key]
    assert loaded.quantization == case.method  # from config.json alone
    packed_bytes = 0
    for m in _matrices(loaded):
        assert m.weight is None, "a float weight is held"
        inner = m.qweight
        if case.desc_act:  # each act-order layer gathers its input
            assert isinstance(inner, PermutedInputMatrix)
            inner = inner.inner
        assert isinstance(inner, QuantizedMatrix) and inner.formats == [case.fmt]
    for name, t in tensors.items():
        if name.rpartition(".")[2] in ("qweight", "qzeros", "scales", "g_idx"):
            packed_bytes += t.nbytes
    held = sum(m.qweight.nbytes for m in _matrices(loaded))
    # Q4_1 keeps an f16 scale and min per 32 values (5.0 bits a weight) where AWQ / GPTQ g128
    # keep 4 + 20/128 bits: 1.20x; Q4_0 (4.5 bits) and Q8_0 (8.5 bits) less (act-order's int64
    # permutation included).
    assert held <= (1.21 if case.fmt == "q4_1x8" else 1.2) * packed_bytes, (held, packed_bytes)
    # The whole model within 1.2x the file: the embeddings and the LM head stay float16 on the f16
    # kernels (float32 would double them).
    for m in (loaded.model.model.embed_tokens, loaded.model.lm_head):
        assert m.weight is None and m.qweight.formats == ["f16"]
    file_bytes = os.path.getsize(os.path.join(path, "model.safetensors"))
    assert loaded.weight_bytes <= 1.2 * file_bytes, (loaded.weight_bytes, file_bytes)
    # The one-op fused decoder (native backend, CPU) takes the plain layouts (with Qwen3's q/k
    # norms); act-order's gathered input keeps the Python layers.
    fused = bool(loaded.model.model.fused_layers())
    assert fused == (not case.desc_act), fused
    # Generation: prefill, then decode steps one token at a time.
    gen, matched, lengths = torch.Generator().manual_seed(5), 0, (5, 12, 20, 30)
    for n in lengths:
        prompt = torch.randint(3, SHAPE["vocab_size"], (n,), generator=gen).tolist()
        ref, logits = _reference(hf, prompt)
        matched += _greedy_matches(_greedy_radixlm(loaded, prompt), ref, logits, f"{key} #{n}")
    # Near-ties end a comparison early; most tokens must still have been compared.
    assert matched >= NEW * len(lengths) // 2, matched


@pytest.mark.parametrize("key", list(CASES))
def test_each_matrix_is_the_checkpoints_product(checkpoints, key):
    """On the inputs each projection receives in the model's forward: its output is the float
    product of its dequantized weights with the input on the kernels' int8 grid (act-order: the
    grid of the gathered input, as the kernels see it)."""
    _, _, _, loaded = checkpoints(key)
    seen = []
    hooks = [
        m.register_forward_hook(lambda m, a, out: seen.append((m, a[0].clone(), out.clone())))
        for m in _matrices(loaded)
    ]
    try:
        h = PoolHarness(loaded.model, loaded.hf_config)
        h.extend([h.new_request()], [list(range(3, 40))])
    finally:
        for hook in hooks:
            hook.remove()
    assert len(seen) == 4 * SHAPE["num_hidden_layers"]
    for m, x, out in seen:
        w = m.qweight
        if isinstance(w, PermutedInputMatrix):
            x, w = x[:, w.perm], w.inner
        want = on_kernel_grids(w, x, w.dequantize())
        if m.bias is not None:
            want += m.bias
        rel = (out - want).abs().max().item() / want.abs().max().item()
        assert rel < REL_TOL, (key, rel)


def test_dequantized_weights_are_the_checkpoints(checkpoints):
    """Every held matrix is the checkpoint's (q - z) * s in the input's own order (act-order's
    permutation undone), Q4_1's min rounded to f16 its only difference."""
    for key in ("awq-4bit-g128", "gptq-4bit-g32-act-order", "gptq-8bit-g128-sym"):
        _, hf, _, loaded = checkpoints(key)
        for i, layer in enumerate(loaded.model.model.layers):
            theirs = hf.model.layers[i]
            want = torch.cat(
                [
                    theirs.self_attn.q_proj.weight,
                    theirs.self_attn.k_proj.weight,
                    theirs.self_attn.v_proj.weight,
                ]
            )
            got = layer.self_attn.qkv_proj.qweight.dequantize()
            exact = CASES[key].fmt != "q4_1x8"
            tol = 0 if exact else 1e-3 * want.abs().max().item()
            assert (got - want).abs().max().item() <= tol, (key, i)
            got = layer.mlp.down_proj.qweight.dequantize()
            want = theirs.mlp.down_proj.weight
            assert (got - want).abs().max().item() <= tol, (key, i)


# ----------------------------------------------------------------------------- unpacking, refusals
def test_unpacking_matches_a_loop_decode_of_each_layout():
    g = torch.Generator().manual_seed(0)
    out, cols = 16, 64
    for bits in (4, 8):
        maxq = 2**bits - 1
        q = torch.randint(0, maxq + 1, (out, cols), generator=g)
        z = torch.randint(1, maxq + 1, (2, out), generator=g)
        if bits == 4:
            qw, qz = pack_awq(q, z)
            got_q, got_z = unpack_awq(qw, qz)
            w, zz = qw.numpy().view(np.uint32), qz.numpy().view(np.uint32)
            for r in range(cols):  # AWQ: [in, out/8], column c at nibble AWQ_ORDER.index(c % 8)
                for c in range(out):
                    nib = AWQ_ORDER.index(c % 8)
                    assert got_q[c, r] == (int(w[r, c // 8]) >> (4 * nib)) & 15
            for grp in range(2):
                for c in range(out):
                    nib = AWQ_ORDER.index(c % 8)
                    assert got_z[grp, c] == (int(zz[grp, c // 8]) >> (4 * nib)) & 15
            assert torch.equal(got_q.long(), q) and torch.equal(got_z.long(), z)
        qw, qz = pack_gptq(q, z, bits)
        got_q, got_z = unpack_gptq(qw, qz, bits, zero_offset=1)
        w, zz, per = qw.numpy().view(np.uint32), qz.numpy().view(np.uint32), 32 // bits
        for r in range(cols):  # GPTQ: [in*bits/32, out], input r at value r % per of row r // per
            for c in range(out):
                assert got_q[c, r] == (int(w[r // per, c]) >> (bits * (r % per))) & maxq
        for grp in range(2):  # v1: z - 1 stored
            for c in range(out):
                assert got_z[grp, c] == ((int(zz[grp, c // per]) >> (bits * (c % per))) & maxq) + 1
        assert torch.equal(got_q.long(), q) and torch.equal(got_z.long(), z)
        assert torch.equal(unpack_gptq(qw, qz, bits, zero_offset=0)[1].long(), z - 1)  # v2


def test_repacked_blocks_decode_to_the_group_values():
    """Each format's blocks against gguf's numpy dequantizer: Q4_1 d = s, m = f16(-s*z); Q4_0 and
    Q8_0 exact; act-order's permuted columns."""
    g = torch.Generator().manual_seed(1)
    rows, cols, group = 8, 128, 32
    s = (0.01 + 0.02 * torch.rand(cols // group, rows, generator=g)).half()
    g_idx = torch.arange(cols) // group
    for bits, zero, fmt in ((4, None, "q4_1"), (4, 8, "q4_0"), (8, 128, "q8_0")):
        q = torch.randint(0, 2**bits, (rows, cols), generator=g)
        z = (
            torch.randint(0, 16, (cols // group, rows), generator=g)
            if zero is None
            else torch.full((cols // group, rows), zero)
        )
        t, perm = repack(q.to(torch.uint8), z, s, g_idx, bits, "w")
        assert t.fmt.name == fmt and perm is None
        sf, zf = s.float()[g_idx].T, z.float()[g_idx].T
        want = sf * q.float() + (-sf * zf).half().float() if fmt == "q4_1" else (q - zf) * sf
        assert torch.equal(dequantize_reference(t.data, fmt, cols), want), fmt
    # Act-order: the blocks hold the columns sorted by group; perm is that order.
    shuffled = g_idx[torch.randperm(cols, generator=g)]
    t, perm = repack(q.to(torch.uint8), z, s, shuffled, 8, "w")
    want = ((q - z.float()[shuffled].T) * s.float()[shuffled].T)[:, perm]
    assert torch.equal(dequantize_reference(t.data, "q8_0", cols), want)
    assert torch.equal(shuffled[perm], g_idx)


@pytest.mark.parametrize(
    "config, named",
    [
        (dict(quant_method="awq", bits=4, group_size=128, version="gemv"), "version 'gemv'"),
        (dict(quant_method="gptq", bits=3, group_size=128), "bits 3"),
        (dict(quant_method="gptq", bits=4, group_size=128, checkpoint_format="marlin"), "marlin"),
        (dict(quant_method="gptq", bits=4, group_size=48), "group_size 48"),
        (dict(quant_method="gptq", bits=8, group_size=128, sym=False), "sym False"),
        (dict(quant_method="exl2", bits=4), "quant_method 'exl2'"),
    ],
)
def test_unsupported_configs_are_refused_by_name(checkpoints, tmp_path, config, named):
    path, _, _, _ = checkpoints("gptq-4bit-g128-asym")
    with open(os.path.join(path, "config.json")) as f:
        d = json.load(f)
    d["quantization_config"] = config
    os.symlink(os.path.join(path, "model.safetensors"), tmp_path / "model.safetensors")
    with open(tmp_path / "config.json", "w") as f:
        json.dump(d, f)
    with pytest.raises(ValueError, match="quantization_config quant_method") as e:
        load_model(str(tmp_path))
    assert named in str(e.value) and "\n" not in str(e.value)


def test_another_quantization_for_a_quantized_checkpoint_is_refused(checkpoints):
    path, _, _, _ = checkpoints("awq-4bit-g128")
    with pytest.raises(ValueError, match="quant_method 'awq'"):
        load_model(path, quantization="none")
    assert load_model(path, quantization="awq").quantization == "awq"
    with pytest.raises(ValueError, match="awq"):
        load_model(path, quantization="gptq")


def test_engine_serves_an_act_order_checkpoint_from_its_config(checkpoints):
    """The server path: ModelRunnerConfig takes the checkpoint's method unasked, KV float16 (the
    native formats' default), greedy tokens HF's."""
    from radixlm import Engine
    from tests.model.hybrid_checkpoints import tiny_tokenizer

    path, hf, _, _ = checkpoints("gptq-4bit-g32-act-order")
    tiny_tokenizer().save_pretrained(path)
    prompt = list(range(3, 23))
    ref, logits = _reference(hf, prompt)
    sp = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
    with Engine(model_path=path, log_level="warning", enable_invariant_checks=True) as engine:
        out = engine.generate(input_ids=prompt, sampling_params=sp)
    assert _greedy_matches(out["output_ids"], ref, logits, "engine") >= NEW // 2


def test_fused_shards_with_different_act_orders_are_refused(checkpoints, tmp_path):
    """q/k/v share their input, so one permutation gathers it: a k_proj whose g_idx differs from
    q_proj's is refused by name."""
    from safetensors.torch import load_file, save_file

    path, _, _, _ = checkpoints("gptq-4bit-g32-act-order")
    tensors = load_file(os.path.join(path, "model.safetensors"))
    name = "model.layers.0.self_attn.k_proj.g_idx"
    tensors[name] = tensors[name].flip(0).contiguous()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with open(os.path.join(path, "config.json")) as f, open(tmp_path / "config.json", "w") as g:
        g.write(f.read())
    with pytest.raises(
        ValueError,
        match=r"layers.0.self_attn.[qkv]_proj.weight: act-order shards .* differ in g_idx",
    ):
        load_model(str(tmp_path))
