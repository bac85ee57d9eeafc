"""What every engine child process imports first, imported once by the fork server the children
fork from (process_context.py). Third-party modules only: a radixlm module imported here would
read its environment at the server's start, not at the child's."""

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
