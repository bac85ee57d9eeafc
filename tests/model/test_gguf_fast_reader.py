"""radixlm's GGUF reader (model/gguf/reader.py: arrays parsed in one pass) gives exactly gguf's
own reader's fields, part by part, on every value type and both byte orders, and on the default
model."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from radixlm.model.gguf.reader import open_gguf


def assert_same_fields(fast, stock):
    assert type(fast).__name__ == "FastGGUFReader"
    assert list(fast.fields) == list(stock.fields)
    for name, b in stock.fields.items():
        a = fast.fields[name]
        assert (a.offset, a.name, a.data, a.types) == (b.offset, b.name, b.data, b.types), name
        assert len(a.parts) == len(b.parts), name
        for x, y in zip(a.parts, b.parts):
            assert (x.dtype, x.shape, x.tobytes()) == (y.dtype, y.shape, y.tobytes()), name
        assert a.contents() == b.contents(), name
    assert [(t.name, t.tensor_type, t.data_offset) for t in fast.tensors] == [
        (t.name, t.tensor_type, t.data_offset) for t in stock.tensors
    ]


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_every_value_type_as_gguf_reads_it(tmp_path, endian):
    path = str(tmp_path / "fields.gguf")
    w = gguf.GGUFWriter(path, "llama", endianess=endian)
    w.add_string("s.plain", "héllo")
    w.add_array("a.strings", ["", "a", "ünïcode ✓", "x" * 300, "<|end|>"])
    w.add_array("a.int32", [-3, 0, 7, 2**31 - 1])
    w.add_array("a.float32", [0.5, -1.25, 3e-8])
    w.add_array("a.bool", [True, False, True])
    w.add_array("a.empty", [])
    w.add_array("a.nested", [[1, 2], [3]])
    w.add_uint64("u.64", 2**40 + 5)
    w.add_int8("i.8", -7)
    w.add_float64("f.64", 2.5)
    w.add_bool("b", True)
    tensor = np.arange(12, dtype=np.float32).reshape(3, 4)
    w.add_tensor("t", tensor if endian == gguf.GGUFEndian.LITTLE else tensor.byteswap())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_same_fields(open_gguf(path), gguf.GGUFReader(path))


def test_the_default_model_as_gguf_reads_it(default_model_path):
    """A real vocabulary: ~49k tokens and ~48k merges (arrays of strings), token types (int32)."""
    fast = open_gguf(default_model_path)
    assert len(fast.fields["tokenizer.ggml.tokens"].data) > 40_000
    assert_same_fields(fast, gguf.GGUFReader(default_model_path))
