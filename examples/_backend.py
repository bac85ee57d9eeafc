"""How the examples get a backend: a URL on the command line means a running server
(`radixlm serve`), nothing means a local server process started here on the default model."""

import sys

import radixlm as sgl


def backend_from_argv():
    if len(sys.argv) > 1 and sys.argv[1].startswith("http"):
        return sgl.RuntimeEndpoint(sys.argv[1])
    print(
        "starting a local radixlm server on the default model (pass a URL to use a running one)...",
        flush=True,
    )
    return sgl.Runtime(kv_memory_gb=0.5)


def run_example(main) -> None:
    backend = backend_from_argv()
    try:
        main(backend)
    finally:
        backend.shutdown()
