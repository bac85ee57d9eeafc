"""Native CPU kernels (C++ torch ops under torch.ops.radixlm), built on first use.

`available()` builds/loads them once per process; False (with one warning line) means the torch
path everywhere. See build.py for how and where they are built, formats.py for the weight formats.
"""

from radixlm.kernels.build import load as available
from radixlm.kernels.build import unavailable_reason

__all__ = ["available", "unavailable_reason"]
