"""lowbit.ggml.iq_lattice / iq1 / iq_grids: the i-quants below 4 bits as llama.cpp writes them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lowbit.errors import LowbitError
from lowbit.ggml import blocks, iq1, iq_grids, iq_lattice

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp" / "blocks"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
IQ_TYPES = {**iq_lattice.BLOCK_BYTES, **iq1.BLOCK_BYTES}
OUTPUTS = [o for o in MANIFEST["outputs"] if o["type"] in IQ_TYPES]


def _load(out: dict) -> tuple[np.ndarray, np.ndarray | None]:
    spec = MANIFEST["inputs"][out["input"]]
    x = np.load(FIXTURES / spec["file"]).astype(np.float32)
    im = np.load(FIXTURES / spec["imatrix"]).astype(np.float32) if out["imatrix"] else None
    return x, im


def test_fixtures_cover_every_lattice_type() -> None:
    """Each type has fixtures with an importance vector, and without one where llama.cpp allows."""
    seen = {(o["type"], o["imatrix"]) for o in OUTPUTS}
    for name in IQ_TYPES:
        assert (name, True) in seen
        assert ((name, False) in seen) == (name not in blocks.NEEDS_IMATRIX)
    assert len(OUTPUTS) == 5 * 11


@pytest.mark.parametrize("path", ["numpy", "kernels"])
def test_quantize_equals_llamacpp_bytes(path: str) -> None:
    """Every fixture: exactly the bytes llama.cpp's ggml_quantize_chunk wrote, on both paths."""
    from lowbit.codecs import _numba

    if path == "kernels" and not _numba.HAVE_NUMBA:
        pytest.skip("numba is not installed (or LOWBIT_NUMBA=0)")
    switch = _numba.numpy_only() if path == "numpy" else _numba.kernels_always()
    with switch:
        for out in OUTPUTS:
            x, im = _load(out)
            got = blocks.quantize(x, out["type"], imatrix=im)
            assert blocks.TYPES[out["type"]].number == out["ggml_type"]
            assert got.tobytes() == (FIXTURES / out["file"]).read_bytes(), out["file"]


def _degenerate_rows(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of 512 with the cases the searches branch on: heavy tails, zero blocks, values
    below the types' zero thresholds, repeated values (ties in IQ1's sort), a constant block,
    one-signed blocks; and an importance vector with zeros."""
    rng = np.random.default_rng(seed)
    x = rng.standard_t(3, size=(6, 512)).astype(np.float32)
    x[0, :32] = 0
    x[0, 64:96] = 1e-9
    x[1, :256] = np.round(x[1, :256] * 2) / 2  # many equal values
    x[2, 256:288] = 0.75
    x[3, :256] = np.abs(x[3, :256])
    x[4] *= 1e-6
    x[5, 100] = 60.0
    im = rng.uniform(0, 5, size=512).astype(np.float32)
    im[:40] = 0
    return x, im


@pytest.mark.parametrize("qtype", sorted(IQ_TYPES))
def test_kernels_equal_numpy(qtype: str) -> None:
    """The compiled searches give the numpy path's bytes on random and degenerate rows."""
    from lowbit.codecs import _numba

    if not _numba.HAVE_NUMBA:
        pytest.skip("numba is not installed (or LOWBIT_NUMBA=0)")
    for seed in range(2):
        x, im = _degenerate_rows(seed)
        for w in (im, None if qtype not in blocks.NEEDS_IMATRIX else np.ones(512)):
            with _numba.numpy_only():
                want = blocks.quantize(x, qtype, imatrix=w)
            with _numba.kernels_always():
                got = blocks.quantize(x, qtype, imatrix=w)
            np.testing.assert_array_equal(got, want)


def test_dequantize_equals_gguf() -> None:
    """Decoding llama.cpp's bytes gives gguf-py's floats bit for bit."""
    gguf = pytest.importorskip("gguf")
    for out in OUTPUTS:
        raw = np.frombuffer((FIXTURES / out["file"]).read_bytes(), dtype=np.uint8)
        raw = raw.reshape(-1, blocks.TYPES[out["type"]].size)
        ours = blocks.dequantize(raw, out["type"])
        theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[out["type"]])
        np.testing.assert_array_equal(
            ours.view(np.uint32), theirs.astype(np.float32).reshape(ours.shape).view(np.uint32)
        )


@pytest.mark.parametrize("name", ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S"])
def test_grids_equal_gguf_tables(name: str) -> None:
    """lowbit's grid data decode to gguf-py's tables entry by entry (and ggml-common.h's sizes)."""
    gguf = pytest.importorskip("gguf")
    cls = getattr(gguf.quants, name)
    cls.init_grid()
    want = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
    np.testing.assert_array_equal(iq_grids.decode_grid(name), want)


def test_neighbour_lists() -> None:
    """IQ3_XXS's map and neighbour lists as iq3xs_init_impl builds them, by brute force."""
    lat = iq_grids.lattice("IQ3_XXS")
    pos = 2 * lat.levels + 1
    assert (lat.kmap >= 0).sum() == 256
    rng = np.random.default_rng(0)
    for u in rng.choice(np.flatnonzero(lat.kmap < 0), 40, replace=False):
        p = 2 * ((u >> (3 * np.arange(4))) & 7) + 1
        d2 = ((pos - p) ** 2).sum(axis=1)
        kept = np.unique(d2)[:2]  # the two smallest distinct distances
        want = [j for j in np.lexsort((np.arange(256), d2)) if d2[j] <= kept[-1]]
        got = lat.nb_flat[lat.nb_start[u] : lat.nb_start[u] + lat.nb_count[u]]
        assert list(got) == want


def test_zero_block_moves_later_iq3_s_codes_up() -> None:
    """IQ3_S: an all-zero block of 32 writes no grid bytes or signs, and llama.cpp's loop does
    not advance its pointers past it, so the later blocks' bytes move up (``qh`` is indexed by
    block and does not move). Pinned as llama.cpp writes it."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    x[0, :32] = 0
    b = blocks.quantize(x, "IQ3_S")[0]
    _, _, gi, signs, _ = iq_lattice._super("IQ3_S", x, None)
    assert b[2 : 2 + 56].tolist() == (gi[0, 8:] & 255).tolist()  # blocks 1..7 at 0..6
    assert b[2 + 56 : 2 + 64].tolist() == [0] * 8
    assert b[74 : 74 + 28].tolist() == signs[0, 4:].tolist()
    assert b[74 + 28 : 74 + 32].tolist() == [0] * 4
    assert b[66] == 0  # block 0's high bits


def test_imatrix_required() -> None:
    """IQ2_XXS, IQ2_XS, IQ1_S without an importance vector: one LowbitError (llama.cpp asserts)."""
    for name in ("IQ2_XXS", "IQ2_XS", "IQ1_S"):
        with pytest.raises(LowbitError, match="needs an importance matrix"):
            blocks.quantize(np.ones((1, 256), np.float32), name)


def test_gguf_write_and_read(tmp_path: Path) -> None:
    """write_gguf stores the i-quants as blocks.quantize makes them; lowbit's GGUF reader (and
    gguf-py's) decode them as blocks.dequantize does."""
    gguf = pytest.importorskip("gguf")
    from lowbit.checkpoints.gguf.reader import GGUFFile
    from lowbit.checkpoints.gguf.writer import GGUFTensor, write_gguf

    rng = np.random.default_rng(3)
    im = rng.uniform(0.5, 2, size=512).astype(np.float32)
    tensors = {
        f"blk.0.{t.lower()}.weight": rng.standard_normal((2, 512)).astype(np.float32)
        for t in IQ_TYPES
    }
    path = write_gguf(
        tmp_path / "iq.gguf",
        {k: GGUFTensor(v, k.split(".")[2].upper(), imatrix=im) for k, v in tensors.items()},
        arch="llama",
    )
    reader = gguf.GGUFReader(path)
    ours = GGUFFile(path)
    for t in reader.tensors:
        qtype = t.tensor_type.name
        want = blocks.quantize(tensors[t.name], qtype, imatrix=im)
        assert np.asarray(t.data).tobytes() == want.tobytes()
        np.testing.assert_array_equal(ours.get(t.name), blocks.dequantize(want, qtype))


def test_kernels_bought_after_a_small_rental(monkeypatch: pytest.MonkeyPatch) -> None:
    """The i-quant searches take the kernels once IQ_KERNEL_WORTH values went down the numpy
    path (or at once where numba is loaded), never under numpy_only()."""
    from lowbit.codecs import _numba

    if not _numba.HAVE_NUMBA:
        pytest.skip("numba is not installed (or LOWBIT_NUMBA=0)")
    rental = _numba._Rental(iq_lattice.IQ_KERNEL_WORTH, lambda: False)
    monkeypatch.setattr(iq_lattice, "_rental", rental)
    # an earlier test of the session may have left kernels_always() on (as test_ggml_numba)
    monkeypatch.setattr(_numba._kernels_always, "on", False)
    half = iq_lattice.IQ_KERNEL_WORTH // 2
    assert not iq_lattice.use_kernels(half)
    assert iq_lattice.use_kernels(half)  # the rental reaches the price: bought
    assert iq_lattice.use_kernels(1)
    with _numba.numpy_only():
        assert not iq_lattice.use_kernels(1 << 30)
