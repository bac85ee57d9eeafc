"""A random-weight GGUF with a real model's shape, for speed benchmarks on realistic sizes
(issue 34): both radixlm and llama.cpp's llama-server load it, so compare.py --model can serve
the same file to both.

    python benchmarks/make_random_gguf.py --shape llama-3.2-1b --type q8_0 -o /data/llama-3.2-1b.q8_0.gguf
    python benchmarks/make_random_gguf.py --shape llama-3-8b --type q4_k_m -o /data/llama-3-8b.q4_k_m.gguf \\
        --llama-quantize ~/.cache/peers/llama_cpp_python-*/vendor/llama.cpp/build/bin/llama-quantize
    python benchmarks/make_random_gguf.py --shape qwen2.5-1.5b --type q4_0 --dry-run   # the plan, no file
    python benchmarks/make_random_gguf.py --shape qwen3.5-0.8b --type q4_k_m -o /data/qwen3.5-0.8b.q4_k_m.gguf \\
        --llama-quantize ~/.cache/peers/llama_cpp_python-*/vendor/llama.cpp/build/bin/llama-quantize

Qwen3.5 shapes (qwen35 / qwen35moe, model_shapes.HybridShape) are written as the converter writes
their text model, without the MTP block (no nextn_predict_layers).

f16 / q8_0 / q4_0 are written directly; k-quants and iq4_xs go through llama.cpp's llama-quantize
from an F16 (Q8_0 above 4B parameters, to halve the intermediate file) file. Outputs of random
weights are noise: benchmarks must fix output lengths (ignore_eos), as compare.py's client does.
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: benchmarks/ is on the path, the repo root is not
    sys.path.insert(0, str(ROOT))

from benchmarks.model_shapes import (  # noqa: E402 (after the sys.path insert above)
    SHAPES,
    Gemma3Shape,
    Gemma4Shape,
    GptOssShape,
    HybridShape,
    Shape,
)

DIRECT_TYPES = ("f16", "q8_0", "q4_0")
# --type -> llama-quantize's type name
LLAMA_QUANTIZE_TYPES = {"q4_k_m": "Q4_K_M", "q5_k_m": "Q5_K_M", "q6_k": "Q6_K", "iq4_xs": "IQ4_XS"}
BUILD_HINT = (
    "build it with /work/shared/peers/build-llama-server.sh (or ../shared/peers/ from the repo),"
    " then `cmake --build build --target llama-quantize` in the llama.cpp tree it prints; the"
    " binary is <that tree>/build/bin/llama-quantize"
)
PAD_TOKEN = "[PAD{}]"  # what llama.cpp's converter names the vocab's padding tokens
# Matrices the converter keeps F32 whatever --outtype (and llama-quantize leaves alone): the
# routers and the Gated DeltaNet conv (convert_hf_to_gguf's FFN_GATE_INP, FFN_GATE_INP_SHEXP,
# SSM_CONV1D).
F32_MATRICES = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight")
CHUNK_VALUES = 1 << 22  # values drawn per step: bounds the float32 scratch to 16 MB


@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]  # numpy order: [rows, cols] or [n]
    ggml_type: object  # gguf.GGMLQuantizationType

    @property
    def nbytes(self) -> int:
        import gguf

        block, type_size = gguf.GGML_QUANT_SIZES[self.ggml_type]
        return math.prod(self.shape) // block * type_size


def _output_name(shape: Shape) -> str:
    # A tied model's token_embd is its output matrix too; llama.cpp types it as the output.
    return "token_embd.weight" if shape.tied else "output.weight"


def tensor_type(name: str, dims: tuple[int, ...], shape: Shape, type_name: str):
    """The GGML type of a tensor in a `type_name` file, as llama.cpp makes one: 1-D tensors F32;
    f16 and q8_0 (convert_hf_to_gguf --outtype) every matrix; q4_0 every matrix except the output,
    which llama-quantize makes Q6_K and gguf-py cannot write, so Q8_0, the nearest it can."""
    import gguf

    T = gguf.GGMLQuantizationType
    if len(dims) == 1 or name.endswith(F32_MATRICES) or name.endswith(".bias"):
        return T.F32
    if isinstance(shape, GptOssShape) and len(dims) == 3:
        return T.MXFP4  # the released GGUFs' experts, whatever the rest
    if type_name == "q4_0" and name == _output_name(shape):
        return T.Q8_0
    return {"f16": T.F16, "q8_0": T.Q8_0, "q4_0": T.Q4_0}[type_name]


def plan(shape: Shape, type_name: str) -> list[TensorPlan]:
    """Every tensor of the file, in order (rope_freqs first, as the converter writes it)."""
    import gguf

    out = []
    if shape.llama3_rope or isinstance(shape, Gemma4Shape):
        half = (shape.global_head_dim if isinstance(shape, Gemma4Shape) else shape.head_dim) // 2
        out.append(TensorPlan("rope_freqs.weight", (half,), gguf.GGMLQuantizationType.F32))
    out += [TensorPlan(n, d, tensor_type(n, d, shape, type_name)) for n, d in shape.tensors()]
    return out


def llama3_rope_freqs(theta: float, head_dim: int, rs: dict) -> np.ndarray:
    """llama.cpp's rope_freqs for HF's llama3 rope_scaling: per frequency, the factor its
    wavelength is divided by (1 for short wavelengths, `factor` for long ones, smooth between)."""
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / freqs
    orig, lo, hi, factor = (
        rs["original_max_position_embeddings"],
        rs["low_freq_factor"],
        rs["high_freq_factor"],
        rs["factor"],
    )
    smooth = (orig / wavelen - lo) / (hi - lo)
    mid = 1 / ((1 - smooth) / factor + smooth)
    out = np.where(wavelen < orig / hi, 1.0, np.where(wavelen > orig / lo, factor, mid))
    return out.astype(np.float32)


def padded_vocab(tokens: list[str], types: list[int], size: int) -> tuple[list[str], list[int]]:
    """The tokenizer's tokens padded to the model's vocab with unique `[PAD{id}]` tokens of type
    NORMAL (llama.cpp's converter pads with that name; NORMAL so every engine detokenizes them to
    text: a random model samples them as often as real tokens)."""
    if size < len(tokens):
        raise ValueError(f"vocab {size} is smaller than the tokenizer's {len(tokens)} tokens")
    pads = [PAD_TOKEN.format(i) for i in range(len(tokens), size)]
    if set(pads) & set(tokens):
        raise ValueError("padding tokens collide with the tokenizer's own")
    return tokens + pads, types + [1] * len(pads)  # 1: gguf.TokenType.NORMAL


@functools.lru_cache(maxsize=2)
def _tokenizer_fields(tokenizer_gguf: str) -> tuple[tuple[str, Any, Any, Any], ...]:
    """Every tokenizer.* key of `tokenizer_gguf` as (key, value, type, array item type). Cached:
    gguf's reader spends ~5 s of Python on a 49k-token vocab, and the tests write many files."""
    import gguf

    from radixlm.model.gguf.fields import field
    from radixlm.model.gguf.reader import open_gguf

    reader = open_gguf(tokenizer_gguf)
    if field(reader, "tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"{tokenizer_gguf}: need a gpt2 (byte-level BPE) tokenizer to pad")
    out = []
    for key, f in reader.fields.items():
        if key.startswith("tokenizer."):
            array = f.types[0] == gguf.GGUFValueType.ARRAY
            out.append((key, f.contents(), f.types[0], f.types[-1] if array else None))
    return tuple(out)


def _copy_tokenizer(writer, tokenizer_gguf: str, vocab: int) -> None:
    """Every tokenizer.* key of `tokenizer_gguf` (a gpt2 BPE vocab, e.g. SmolLM2's), its value type
    kept, with the token list padded to `vocab`."""
    fields = _tokenizer_fields(tokenizer_gguf)
    value_of = {key: value for key, value, _, _ in fields}
    tokens, types = padded_vocab(
        list(value_of["tokenizer.ggml.tokens"]), list(value_of["tokenizer.ggml.token_type"]), vocab
    )
    padded = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types}
    for key, value, kind, sub_type in fields:
        writer.add_key_value(key, padded.get(key, value), kind, sub_type=sub_type)


def _random_tensor(p: TensorPlan, rng: np.random.Generator, std: float) -> np.ndarray:
    """The tensor as stored: norms 1, biases 0, matrices N(0, std) drawn and converted in row chunks
    (peak memory: the stored tensor plus one chunk); experts [E, rows, cols] as E * rows rows.
    Gated DeltaNet's as HF initializes them: ssm_a = -exp(A_log) = -U(1, 16) (A_log = log U(1, 16)),
    dt_bias 1, conv1d U(-1/sqrt(K), 1/sqrt(K)) (stored F32), ssm_norm 1 (stored as is; the other
    norms are stored 1 + w, w = 0)."""
    import gguf
    from gguf.quants import quantize

    if p.name.endswith(".ssm_a"):
        return -rng.uniform(1.0, 16.0, p.shape).astype(np.float32)
    if p.name.endswith(".ssm_dt.bias"):
        return np.ones(p.shape, dtype=np.float32)
    if p.name.endswith(".ssm_conv1d.weight"):
        bound = 1.0 / math.sqrt(p.shape[-1])
        return rng.uniform(-bound, bound, p.shape).astype(np.float32)
    if len(p.shape) == 1:
        value = 0.0 if p.name.endswith(".bias") else 1.0
        return np.full(p.shape, value, dtype=np.float32)
    cols = p.shape[-1]
    rows = math.prod(p.shape[:-1])
    T = gguf.GGMLQuantizationType
    if p.ggml_type == T.MXFP4:
        return _random_mxfp4(rows, cols, rng, std)
    plain = {T.F16: np.float16, T.F32: np.float32}.get(p.ggml_type)
    out = np.empty((rows, cols) if plain else (rows, p.nbytes // rows), dtype=plain or np.uint8)
    step = max(1, CHUNK_VALUES // cols)
    for r in range(0, rows, step):
        chunk = rng.standard_normal((min(step, rows - r), cols), dtype=np.float32) * np.float32(std)
        out[r : r + len(chunk)] = chunk if plain else quantize(chunk, p.ggml_type)
    return out


def _random_mxfp4(rows: int, cols: int, rng: np.random.Generator, std: float) -> np.ndarray:
    """MXFP4 blocks written directly (gguf's quantizer would take hours on 20B values): uniform
    random e2m1 codes under one exponent per block whose scale gives values of about `std` (the
    doubled codes' root mean square is sqrt(34.25))."""
    blocks = cols // 32
    exponent = 128 + round(math.log2(std / math.sqrt(34.25)))  # 2^(e - 128) scales the codes
    out = np.empty((rows, blocks, 17), dtype=np.uint8)
    step = max(1, CHUNK_VALUES // cols)
    for r in range(0, rows, step):
        n = min(step, rows - r)
        out[r : r + n, :, 0] = exponent
        out[r : r + n, :, 1:] = rng.integers(0, 256, (n, blocks, 16), dtype=np.uint8)
    return out.reshape(rows, blocks * 17)


def write_random_gguf(
    path: str,
    shape_name: str,
    type_name: str,
    seed: int = 0,
    std: float = 0.02,
    tokenizer_gguf: str | None = None,
    log=print,
    layers: int | None = None,
) -> None:
    """Write the file tensor by tensor (`type_name` in DIRECT_TYPES)."""
    import gguf

    from radixlm.model.loader import default_model_path

    shape = shape_of(shape_name, layers)
    tensors = plan(shape, type_name)
    w = gguf.GGUFWriter(path, shape.arch)
    w.add_name(f"random-{shape_name}")
    w.add_file_type(
        {
            "f16": gguf.LlamaFileType.MOSTLY_F16,
            "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
            "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
        }[type_name]
    )
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_head_count(shape.heads)
    if isinstance(shape, (Gemma3Shape, Gemma4Shape)):  # the Gemma converters' own keys
        shape.add_keys(w)
    else:
        if shape.intermediate:  # the MoE hybrid has no dense MLP (nor the key)
            w.add_feed_forward_length(shape.intermediate)
        w.add_head_count_kv(shape.kv_heads)
        w.add_key_length(shape.head_dim)
        w.add_value_length(shape.head_dim)
    if isinstance(shape, HybridShape):
        _add_hybrid_keys(w, shape)
    elif not isinstance(shape, Gemma4Shape):
        w.add_rope_dimension_count(shape.head_dim)
    if isinstance(shape, GptOssShape):
        _add_gpt_oss_keys(w, shape)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_vocab_size(shape.vocab)
    _copy_tokenizer(w, tokenizer_gguf or default_model_path(), shape.vocab)
    for p in tensors:
        dtype = np.float16 if p.ggml_type == gguf.GGMLQuantizationType.F16 else np.float32
        w.add_tensor_info(p.name, p.shape, dtype, p.nbytes, raw_dtype=p.ggml_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    # q/k rows are not permuted as the converter would: for random weights it changes nothing.
    for i, p in enumerate(tensors):
        if p.name == "rope_freqs.weight" and isinstance(shape, Gemma4Shape):
            data = shape.rope_freqs()
        elif p.name == "rope_freqs.weight":
            data = llama3_rope_freqs(shape.rope_theta, shape.head_dim, shape.llama3_rope)
        else:  # a generator per tensor: the same seed gives the same tensor whatever the chunking
            data = _random_tensor(p, np.random.default_rng([seed, i]), std)
        w.write_tensor_data(data)
        if len(p.shape) == 2 and log:
            log(f"  {i + 1}/{len(tensors)} {p.name} {p.ggml_type.name} {list(p.shape)}")
    w.close()


def _add_gpt_oss_keys(w, shape: GptOssShape) -> None:
    """The keys convert_hf_to_gguf's GptOssModel adds (gguf/archs/gpt_oss.py reads them back):
    experts, the window (every other layer from layer 0, llama.cpp's fixed pattern) and YaRN."""
    import gguf

    w.add_expert_count(shape.experts)
    w.add_expert_used_count(shape.experts_used)
    w.add_expert_feed_forward_length(shape.intermediate)
    w.add_sliding_window(shape.sliding_window)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(shape.yarn_factor)
    w.add_rope_scaling_orig_ctx_len(shape.yarn_original_context)


def _add_hybrid_keys(w, shape: HybridShape) -> None:
    """The keys convert_hf_to_gguf adds for Qwen3.5 (Qwen2MoeModel's expert sizes,
    Qwen3NextModel's ssm.* and interval, _Qwen35MRopeMixin's sections), as gguf/archs/qwen35.py and
    llama.cpp's loader read them; no nextn_predict_layers (no MTP block is written)."""
    if shape.experts:
        w.add_expert_count(shape.experts)
        w.add_expert_used_count(shape.experts_used)
        w.add_expert_feed_forward_length(shape.expert_intermediate)
        w.add_expert_shared_feed_forward_length(shape.shared_expert_intermediate)
    w.add_ssm_conv_kernel(shape.linear_conv_kernel_dim)
    w.add_ssm_state_size(shape.linear_key_head_dim)
    w.add_ssm_group_count(shape.linear_num_key_heads)
    w.add_ssm_time_step_rank(shape.linear_num_value_heads)
    w.add_ssm_inner_size(shape.linear_value_head_dim * shape.linear_num_value_heads)
    w.add_full_attention_interval(shape.full_attention_interval)
    w.add_rope_dimension_count(shape.rope_dims)  # int(head_dim * partial_rotary_factor)
    w.add_rope_dimension_sections((list(shape.mrope_section) + [0, 0, 0, 0])[:4])


def find_llama_quantize(path: str | None) -> str:
    """The llama-quantize binary, or a FileNotFoundError saying how to build it."""
    found = path and (
        shutil.which(path) or (os.path.isfile(path) and os.access(path, os.X_OK) and path)
    )
    if not found:
        given = f"{path!r} is not an executable" if path else "no --llama-quantize given"
        raise FileNotFoundError(
            f"llama-quantize is needed for k-quants and iq4_xs ({given}); {BUILD_HINT}"
        )
    return found


def quantize_with_llama_cpp(
    binary: str, src: str, dst: str, type_name: str, threads: int | None = None
) -> None:
    # --allow-requantize: the source may be Q8_0 (the 8B intermediate).
    cmd = [
        binary,
        "--allow-requantize",
        src,
        dst,
        LLAMA_QUANTIZE_TYPES[type_name],
        str(threads or os.cpu_count()),
    ]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def shape_of(shape_name: str, layers: int | None = None) -> Shape:
    """SHAPES[shape_name], cut to its first `layers` layers (None: all): every layer's shape and
    the embeddings stay the real ones, for a roofline of a model too big for this machine."""
    shape = SHAPES[shape_name]
    if layers is None or layers == shape.layers:
        return shape
    if not 0 < layers < shape.layers:
        raise ValueError(f"--layers {layers}: {shape_name} has {shape.layers} layers")
    return dataclasses.replace(
        shape, layers=layers, source=f"{shape.source}, {layers} of {shape.layers} layers"
    )


def make(
    out: str,
    shape_name: str,
    type_name: str,
    seed: int = 0,
    std: float = 0.02,
    llama_quantize: str | None = None,
    intermediate: str | None = None,
    tokenizer_gguf: str | None = None,
    log=print,
    layers: int | None = None,
) -> None:
    if type_name in DIRECT_TYPES:
        write_random_gguf(out, shape_name, type_name, seed, std, tokenizer_gguf, log, layers)
        return
    binary = find_llama_quantize(llama_quantize)  # before the minutes of writing the intermediate
    inter = intermediate or ("q8_0" if shape_of(shape_name, layers).num_params() > 4e9 else "f16")
    tmp = f"{out}.{inter}.tmp.gguf"
    try:
        write_random_gguf(tmp, shape_name, inter, seed, std, tokenizer_gguf, log, layers)
        quantize_with_llama_cpp(binary, tmp, out, type_name)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def describe(shape_name: str, type_name: str, layers: int | None = None) -> str:
    """The --dry-run report: config, parameter count and the direct types' tensor list and size."""
    shape = shape_of(shape_name, layers)
    lines = [f"{shape_name} ({shape.source}): {shape}", f"parameters: {shape.num_params():,}"]
    if type_name in DIRECT_TYPES:
        tensors = plan(shape, type_name)
        lines.append(
            f"{type_name}: {len(tensors)} tensors, {sum(p.nbytes for p in tensors) / 2**30:.2f} GiB"
            " of data"
        )
        counts: dict[str, int] = {}
        for p in tensors:
            counts[p.ggml_type.name] = counts.get(p.ggml_type.name, 0) + 1
        lines.append("types: " + ", ".join(f"{k} x{v}" for k, v in counts.items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shape", required=True, choices=list(SHAPES))
    p.add_argument("--type", required=True, choices=[*DIRECT_TYPES, *LLAMA_QUANTIZE_TYPES])
    p.add_argument("-o", "--output", help="the .gguf to write (required unless --dry-run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--std", type=float, default=0.02, help="standard deviation of the matrices' values"
    )
    p.add_argument(
        "--llama-quantize", help="llama.cpp's llama-quantize binary (k-quants and iq4_xs)"
    )
    p.add_argument(
        "--intermediate",
        choices=["f16", "q8_0"],
        help="what llama-quantize starts from (default: f16, q8_0 above 4B parameters)",
    )
    p.add_argument(
        "--tokenizer-gguf",
        help="the GGUF whose gpt2 tokenizer is padded in (default: embedded SmolLM2)",
    )
    p.add_argument(
        "--layers",
        type=int,
        help="keep only the first N layers (the roofline of a shape too big for the machine)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the config and tensors, write nothing"
    )
    a = p.parse_args(argv)
    if a.dry_run:
        print(describe(a.shape, a.type, a.layers))
        return 0
    if not a.output:
        p.error("--output is required (or --dry-run)")
    try:
        make(
            a.output,
            a.shape,
            a.type,
            a.seed,
            a.std,
            a.llama_quantize,
            a.intermediate,
            a.tokenizer_gguf,
            layers=a.layers,
        )
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.output} ({os.path.getsize(a.output) / 2**30:.2f} GiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
