"""The multi-model server's catalog (radixlm/router/model_catalog.py): names from file stems,
directory names and hub ids; a split GGUF is one model; clashes and empty directories refused
with the option named."""

import os

import pytest

from radixlm.router.model_catalog import catalog, models_in_dir


def test_models_in_a_directory(tmp_path):
    (tmp_path / "qwen.gguf").write_bytes(b"x" * 10)
    for part in (1, 2):
        (tmp_path / f"big-0000{part}-of-00002.gguf").write_bytes(b"y" * 3)
    hf = tmp_path / "tiny"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "llama"}')
    (hf / "model.safetensors").write_bytes(b"z" * 7)
    (tmp_path / "not-a-model").mkdir()
    (tmp_path / "notes.txt").write_text("hi")
    assert models_in_dir(str(tmp_path)) == [
        str(tmp_path / "big-00001-of-00002.gguf"),
        str(tmp_path / "qwen.gguf"),
        str(hf),
    ]
    specs = catalog(["Org/Some-Model-1B"], str(tmp_path))
    assert list(specs) == ["Some-Model-1B", "big", "qwen", "tiny"]
    assert (specs["qwen"].format, specs["qwen"].size) == ("gguf", 10)
    tiny = specs["tiny"]
    assert (tiny.format, tiny.family, tiny.size) == (
        "safetensors",
        "llama",
        7 + len(b'{"model_type": "llama"}'),
    )
    assert tiny.modified == os.path.getmtime(hf)
    assert (specs["Some-Model-1B"].path, specs["Some-Model-1B"].size) == ("Org/Some-Model-1B", 0)


def test_refusals(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "m.gguf").write_bytes(b"")
    (tmp_path / "m.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match="model_path: two models are named 'm'"):
        catalog([str(tmp_path / "m.gguf"), str(tmp_path / "b" / "m.gguf")], None)
    with pytest.raises(ValueError, match="models_dir: no GGUF file or HF model directory"):
        catalog([], str(tmp_path / "a"))
    with pytest.raises(ValueError, match="models_dir: .* is not a directory"):
        catalog([], str(tmp_path / "missing"))
