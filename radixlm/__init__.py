"""radixlm: a serving engine and a language for LLM programs."""

import os

from radixlm.version import __version__  # noqa: F401 (re-exported)

# Transparent huge pages for torch's large CPU buffers (weights, the KV pool): a decode step walks
# ~100 MB of weights and, with long shared prefixes, GBs of K/V, and with 4 KiB pages the TLB misses
# cost 15-20% of a 32-request step (docs/benchmarks.md). torch reads this once, at its first CPU
# allocation, so it is set here, before torch is imported; child processes inherit it. =0 turns it
# off.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def __getattr__(name):
    # Lazy: importing radixlm must not pull in torch for light users (CLI --help, lang).
    if name == "Engine":
        from radixlm.engine.engine import Engine

        return Engine
    if name == "ServerArgs":
        from radixlm.config import ServerArgs

        return ServerArgs
    if name == "SamplingParams":
        from radixlm.sampling_params import SamplingParams

        return SamplingParams
    import radixlm.lang as lang  # the language: radixlm.function, radixlm.gen, radixlm.select, ...

    if name in getattr(lang, "__all__", ()):
        return getattr(lang, name)
    raise AttributeError(name)
