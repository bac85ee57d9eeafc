"""radixlm: a serving engine and a language for LLM programs."""

__version__ = "0.1.0"


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
