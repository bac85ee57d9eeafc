"""transformers' own modelling code evaluated in float64: the exact reference for a tiny model whose
fp32 rounding reaches the tests' tolerance.

`from_pretrained(dtype=torch.float64)` is not enough: the modelling files upcast to float32 on
purpose (RMSNorm, the gated delta rule, the attention softmax, RoPE's frequencies), which for a
bf16 model is an upcast and for a float64 one a downcast. On the tiny Qwen3.5 checkpoints those
float32 steps alone move a logprob by 1e-4 (an AVX2-only CPU's run of
tests/vision/test_qwen35vl_vs_hf), so the reference here is a copy of the class's module with every
float32 cast made a float64 one; transformers' modules themselves are left untouched."""

from __future__ import annotations

import re
import sys
import types

import torch

_FLOAT32 = re.compile(r"torch\.float32\b|torch\.float\b(?!\d)")


def float64_class(cls: type) -> type:
    """`cls` from a float64 copy of its module (cached per module)."""
    name = cls.__module__ + "_float64"
    module = sys.modules.get(name)
    if module is None:
        source_module = sys.modules[cls.__module__]
        with open(source_module.__file__) as f:
            source = f.read()
        source = _FLOAT32.sub("torch.float64", source).replace(".float()", ".double()")
        module = types.ModuleType(name)
        module.__file__ = source_module.__file__
        module.__package__ = source_module.__package__
        sys.modules[name] = module  # before running it: typing resolves its classes' hints there
        exec(compile(source, source_module.__file__, "exec"), module.__dict__)
        module.AutoModel = _AutoModelIn(module)
    return getattr(module, cls.__name__)


class _AutoModelIn:
    """AutoModel.from_config for the copy's own classes: a composite model (a vision tower beside
    a language model) builds its parts through it, which would give transformers' originals."""

    def __init__(self, module: types.ModuleType):
        self.module = module

    def from_config(self, config, **kwargs):
        from transformers import AutoModel

        original = AutoModel._model_mapping[type(config)]
        return getattr(self.module, original.__name__)._from_config(config, **kwargs)


def from_pretrained_float64(cls: type, path: str, **kwargs):
    """The checkpoint in `cls`'s float64 copy, eval mode; experts looped in Python (torch's
    grouped_mm has no float64)."""
    # the copy's config_class stays an unresolved annotation: the original's config, given
    config = cls.config_class.from_pretrained(path)
    model = float64_class(cls).from_pretrained(
        path, config=config, dtype=torch.float64, experts_implementation="eager", **kwargs
    )
    return model.eval()
