"""The frontend language's gen(lora_path=...) through the in-process Engine's backend
(RuntimeEndpoint sends the same body through NativeBackend): the adapter's text, as Engine.generate
gives it."""

import radixlm.lang as sgl
from radixlm import Engine
from tests.conftest import engine_args


@sgl.function
def complete(s, adapter):
    s += "Once upon a time" + sgl.gen(
        "out", max_tokens=8, temperature=0, ignore_eos=True, lora_path=adapter
    )


def test_gen_takes_the_adapter(tiny_model_dir, lora_adapters):
    sp = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    with Engine(tiny_model_dir, **engine_args(lora_paths=[f"a8={lora_adapters['a8'][0]}"])) as e:
        want = {n: e.generate("Once upon a time", sp, lora_path=n)["text"] for n in ("a8", None)}
        backend = sgl.EngineBackend(e)
        got = {n: complete.run(n, backend=backend)["out"] for n in ("a8", None)}
    assert want["a8"] != want[None]
    assert got == want
