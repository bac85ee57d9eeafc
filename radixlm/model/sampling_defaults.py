"""A model's recommended sampling settings: generation_config.json of a HF directory, or the
general.sampling.* metadata of a GGUF file (llama.cpp's keys).

With `--sampling-defaults model` (the default, as SGLang) they are the values of every request
that does not give its own, on every route (native /generate, the OpenAI routes, the Engine);
`openai` ignores them (temperature 1, top_p 1, no top-k). /get_model_info shows what applies
under SGLang's key `preferred_sampling_params`.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from radixlm.model.gguf.fields import field
from radixlm.sampling_params import SamplingParams, SamplingParamsError

logger = logging.getLogger(__name__)

SAMPLING_DEFAULTS_MODES = ("model", "openai")
# generation_config.json keys SGLang takes (ModelConfig.get_default_sampling_params).
HF_KEYS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p")
# GGUF metadata (gguf-py's Keys.General.SAMPLING_*) -> sampling_params field. Not taken: mirostat
# (no such sampler here), penalty_last_n (the repetition penalty covers the whole context),
# sequence.
GGUF_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
    "general.sampling.xtc_probability": "xtc_probability",
    "general.sampling.xtc_threshold": "xtc_threshold",
}


def check_mode(mode: str) -> None:
    if mode not in SAMPLING_DEFAULTS_MODES:
        raise ValueError(
            f"sampling_defaults must be one of {', '.join(SAMPLING_DEFAULTS_MODES)}, got {mode!r}"
        )


def applied(mode: str, model_defaults: dict) -> dict:
    """The defaults requests get under --sampling-defaults `mode`."""
    check_mode(mode)
    return dict(model_defaults) if mode == "model" else {}


def from_hf_dir(path: str) -> dict:
    file = os.path.join(path, "generation_config.json")
    if not os.path.isfile(file):
        return {}
    with open(file, encoding="utf-8") as f:
        config = json.load(f)
    return _valid({k: config[k] for k in HF_KEYS if config.get(k) is not None}, file)


def from_gguf(reader) -> dict:
    found = {name: field(reader, key) for key, name in GGUF_KEYS.items()}
    # float32 in the file: its 7 significant digits (0.95, not 0.949999988079071)
    found = {
        k: float(f"{v:.7g}") if isinstance(v, float) else v
        for k, v in found.items()
        if v is not None
    }
    return _valid(found, "the GGUF metadata")


def _valid(raw: dict[str, Any], where: str) -> dict:
    """Normalized values (a top_k of 0 or below means no top-k, as in HF and llama.cpp); a value
    that is no valid sampling parameter is left out with a warning, so it never fails requests."""
    out = {}
    for k, v in raw.items():
        if k == "top_k" and isinstance(v, int) and v <= 0:
            v = -1
        if isinstance(v, float) and k == "top_k" and v.is_integer():
            v = int(v)
        try:
            SamplingParams.from_dict({k: v})
        except (SamplingParamsError, TypeError) as e:
            logger.warning("ignoring the sampling default %s=%r from %s: %s", k, v, where, e)
            continue
        out[k] = v
    if out:
        logger.info("sampling defaults from %s: %s", where, out)
    return out
