"""The fast GGUF index (``backends/gguf_index.py``): the same tensors (names, types,
shapes, bytes) and scalar metadata as gguf-py's ``GGUFReader``, on the default model's
file and on a file holding every metadata type, in a fraction of its time; a damaged file
is one clear ``DraftwiseError`` naming it."""

from __future__ import annotations

import time

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from draftwise.backends.gguf_index import GGUFIndex  # noqa: E402
from draftwise.backends.gguf_q4 import gguf_source  # noqa: E402
from draftwise.errors import DraftwiseError  # noqa: E402


def _reader_value(field):
    """A GGUFReader field's scalar or string value (None for an array)."""
    kinds = [t.name for t in field.types]
    if kinds[0] == "ARRAY":
        return None
    val = field.parts[field.data[0]]
    return bytes(val).decode() if kinds[0] == "STRING" else val[0].item()


def _same_as_reader(path) -> GGUFIndex:
    idx = GGUFIndex(path)
    ref = gguf.GGUFReader(str(path))
    assert [t.name for t in idx.tensors] == [t.name for t in ref.tensors]
    for got, want in zip(idx.tensors, ref.tensors, strict=True):
        assert got.kind == want.tensor_type.name, got.name
        assert got.shape == tuple(int(d) for d in want.shape), got.name
        assert got.data.dtype == want.data.dtype and got.data.shape == want.data.shape, got.name
        assert np.array_equal(got.data, want.data), got.name
    scalars = {k: _reader_value(f) for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert idx.fields == {k: v for k, v in scalars.items() if v is not None}
    return idx


def test_the_default_models_gguf_reads_as_gguf_py_reads_it(default_model_dir):
    path = gguf_source(default_model_dir)
    if path is None:
        pytest.skip("the default model's GGUF is not recorded here")
    t0 = time.perf_counter()
    idx = _same_as_reader(path)
    assert idx.fields["general.architecture"] == "llama"
    assert {t.kind for t in idx.tensors} >= {"Q4_1", "Q8_0", "F32"}
    t1 = time.perf_counter()
    GGUFIndex(path)
    assert time.perf_counter() - t1 < 0.5 * (t1 - t0)  # the reader's walk is the slow part


def _write(path, alignment: int | None = None):
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 7)
    w.add_int8("t.i8", -7)
    w.add_uint16("t.u16", 65000)
    w.add_int16("t.i16", -300)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -5)
    w.add_float32("t.f32", 0.5)
    w.add_uint64("t.u64", 2**40)
    w.add_int64("t.i64", -(2**40))
    w.add_float64("t.f64", 0.25)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_array("t.ints", [1, 2, 3])
    w.add_array("t.strs", ["a", "", "ünïcode", "z" * 300])
    rng = np.random.default_rng(0)
    w.add_tensor("a.f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("b.f16", rng.standard_normal(7).astype(np.float16))
    q8_type = gguf.GGMLQuantizationType.Q8_0
    q8 = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), q8_type)
    w.add_tensor("c.q8", q8, raw_dtype=q8_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64])
def test_every_metadata_type_and_the_alignment(tmp_path, alignment):
    idx = _same_as_reader(_write(tmp_path / "t.gguf", alignment))
    assert idx.fields["t.str"] == "héllo" and idx.fields["t.u64"] == 2**40
    assert "t.strs" not in idx.fields and "t.ints" not in idx.fields  # arrays are skipped
    q8 = next(t for t in idx.tensors if t.name == "c.q8")
    assert q8.kind == "Q8_0" and q8.shape == (64, 4) and q8.data.shape == (4, 68)


def test_a_damaged_file_is_one_clear_error(tmp_path):
    good = _write(tmp_path / "t.gguf").read_bytes()
    cases = {
        "magic": b"GGUX" + good[4:],
        "version": good[:4] + (9).to_bytes(4, "little") + good[8:],
        "header": good[:200],  # cut inside the metadata
        "data": good[:-40],  # the last tensor runs past the end
    }
    for name, blob in cases.items():
        p = tmp_path / f"{name}.gguf"
        p.write_bytes(blob)
        with pytest.raises(DraftwiseError, match=f"cannot read GGUF file .*{name}.gguf"):
            GGUFIndex(p)
    with pytest.raises(DraftwiseError, match="cannot read GGUF file"):
        GGUFIndex(tmp_path / "missing.gguf")
