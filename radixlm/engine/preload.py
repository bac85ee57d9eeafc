"""What every engine child process imports first, imported once by the fork server the children
fork from (process_context.py). Third-party modules only: a radixlm module imported here would
read its environment at the server's start, not at the child's."""

import gc

import torch
import torch.utils.cpp_extension  # noqa: F401 (loads the native kernels)
import transformers

# transformers imports these lazily, at first use; every model config imports its type validators
# (which import activations, the hub kernels, torch.distributed.tensor: seconds).
import transformers.activations
import transformers.utils.type_validators  # noqa: F401
from transformers import (  # noqa: F401
    AutoConfig,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedTokenizerFast,
)

# Everything imported so far lives as long as the process: out of the collector's reach (gc.freeze),
# so a child's collections do not walk (and, forked, copy on write) the hundreds of thousands of
# objects these imports made; load_model's gc.collect in a scheduler child took ~0.2 s of them.
gc.freeze()
