"""``lowbit quantize-tensor`` and ``lowbit compare``: in-process, files in tmp_path."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lowbit.cli import main
from lowbit.quant.metrics import error
from lowbit.quant.quantized_tensor import QuantizedTensor
from lowbit.quant.scheme_text import parse_scheme
from lowbit.quant.tensor import quantize


def _run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def weight(tmp_path, rng: np.random.Generator):
    x = rng.standard_normal((32, 256)).astype(np.float32)
    path = tmp_path / "w.npy"
    np.save(path, x)
    return path, x


def test_quantize_tensor_npy_table(capsys, weight) -> None:
    """Prints the scheme, bits/value, bytes and the error metrics."""
    path, _ = weight
    rc, out, _ = _run(capsys, "quantize-tensor", str(path), "--to", "int4", "--group", "128",
                      "--scale-format", "fp16")  # fmt: skip
    assert rc == 0
    assert "int4:g128:fp16" in out and "4.1250" in out and "SQNR" in out and "cosine" in out


def test_quantize_tensor_json_matches_library(capsys, weight) -> None:
    """--json numbers equal lowbit.quantize + lowbit.error on the same data."""
    import lowbit

    path, x = weight
    rc, out, _ = _run(capsys, "quantize-tensor", str(path), "--to", "nf4", "--json")
    assert rc == 0
    res = json.loads(out)
    qt = lowbit.quantize(x, "nf4")
    assert res["bits_per_value"] == qt.bits_per_value and res["bytes"] == qt.nbytes
    assert res["error"]["sqnr_db"] == pytest.approx(lowbit.error(x, qt)["sqnr_db"])
    assert res["scheme"]["group_size"] == 64


def test_quantize_tensor_safetensors_in_and_out(capsys, tmp_path, rng: np.random.Generator) -> None:
    """FILE.safetensors:NAME in; --out writes arrays + metadata that load back bit for bit."""
    st_np = pytest.importorskip("safetensors.numpy")
    from safetensors import safe_open

    x = rng.standard_normal((16, 64)).astype(np.float32)
    src = tmp_path / "m.safetensors"
    st_np.save_file({"a.weight": x, "b.weight": x[:2].copy()}, src)
    out = tmp_path / "q.safetensors"
    rc, text, _ = _run(capsys, "quantize-tensor", f"{src}:a.weight", "--to", "int4", "--group", "32",
                       "--asym", "--out", str(out))  # fmt: skip
    assert rc == 0 and "wrote" in text
    with safe_open(str(out), framework="numpy") as f:
        meta = json.loads(f.metadata()["lowbit"])["a.weight"]
        arrays = {k: f.get_tensor(k) for k in f.keys()}
    back = QuantizedTensor.from_arrays(arrays, meta, "a.weight.")
    want = quantize(x, "int4", group_size=32, symmetric=False)
    np.testing.assert_array_equal(back.dequantize(), want.dequantize())
    rc, _, err = _run(capsys, "quantize-tensor", str(src), "--to", "int4")
    assert rc == 2 and "holds 2 tensors" in err


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--to", "int4", "--axis", "5"], "out of range"),
        (["--to", "int4", "--group", "0"], ">= 1"),
        (["--to", "nope"], "unknown format"),
        (["--to", "fp4", "--asym"], "integer format"),
    ],
)
def test_quantize_tensor_bad_input_exit_2(capsys, weight, argv: list[str], match: str) -> None:
    """Bad options exit 2 with a one-line message naming the problem."""
    path, _ = weight
    rc, _, err = _run(capsys, "quantize-tensor", str(path), *argv)
    assert rc == 2 and match in err and err.count("\n") == 1


def test_quantize_tensor_missing_file(capsys, tmp_path) -> None:
    """A missing file is exit 2 naming it."""
    rc, _, err = _run(capsys, "quantize-tensor", str(tmp_path / "no.npy"), "--to", "int8")
    assert rc == 2 and "no.npy" in err


def test_compare_nf4_beats_int4_on_normal_data(capsys) -> None:
    """On N(0,1) at block 64, NF4 beats INT4 absmax in SQNR; rows sorted by SQNR."""
    rc, out, _ = _run(capsys, "compare", "--group", "64", "--size", "65536", "--json")
    assert rc == 0
    res = json.loads(out)["results"]
    sq = {r["format"]: r["sqnr_db"] for r in res}
    assert set(sq) == {"int8:t", "int4:t", "nf4", "fp4:t", "mxfp4", "fp8_e4m3:t"}
    assert sq["nf4"] > sq["int4:t"] + 1.0
    assert sq["int8:t"] > sq["fp8_e4m3:t"] > sq["nf4"]
    assert [r["sqnr_db"] for r in res] == sorted(sq.values(), reverse=True)
    bits = {r["format"]: r["bits_per_value"] for r in res}
    assert bits["mxfp4"] == 4.25 and bits["int4:t"] == 4.5 and bits["nf4"] == 4.5


def test_compare_table_and_distributions(capsys, weight) -> None:
    """The table lists each scheme once; every named distribution and a file work."""
    rc, out, _ = _run(capsys, "compare", "--formats", "int4,nf4", "--group", "64", "--size", "4096")
    assert rc == 0 and "int4:g64:fp32" in out and "nf4:g64:fp32" in out and "SQNR dB" in out
    for dist in ("laplace", "student-t", "uniform"):
        assert (
            _run(capsys, "compare", "--data", dist, "--size", "2048", "--formats", "int8:t")[0] == 0
        )
    path, _ = weight
    rc, out, _ = _run(capsys, "compare", "--data", str(path), "--formats", "int8,mxfp4")
    assert rc == 0 and "w (32, 256)" in out
    rc, _, err = _run(capsys, "compare", "--data", "cauchy")
    assert rc == 2 and "neither a distribution" in err


def test_compare_plot(capsys, tmp_path) -> None:
    """--plot writes a PNG with the error chart and the histogram with levels."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "c.png"
    rc, _, _ = _run(capsys, "compare", "--size", "4096", "--group", "64", "--plot", str(out),
                    "--levels", "nf4")  # fmt: skip
    assert rc == 0 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rc, _, err = _run(capsys, "compare", "--size", "64", "--plot", str(out), "--levels", "int2")
    assert rc == 2 and "--levels" in err


@pytest.mark.parametrize(("flag", "suffix"), [("--asym", ":asym"), ("--restricted", ":restricted")])
def test_compare_default_list_applies_integer_options_to_integers_only(
    capsys, flag: str, suffix: str
) -> None:
    """--asym / --restricted with the default list change its integer entries (their rows
    equal lowbit.quantize with that scheme) and leave the floats exactly as without the flag;
    naming a float in --formats with the flag is still an error."""
    base = ["compare", "--size", "4096", "--json"]
    rc, out, _ = _run(capsys, *base)
    assert rc == 0
    plain = {r["format"]: r for r in json.loads(out)["results"]}
    rc, out, err = _run(capsys, *base, flag)
    assert rc == 0, err
    res = {r["format"]: r for r in json.loads(out)["results"]}
    assert set(res) == set(plain) == {"int8:t", "int4:t", "nf4", "fp4:t", "mxfp4", "fp8_e4m3:t"}
    data = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    for name in ("int8:t", "int4:t"):
        assert res[name]["scheme"] == f"{name}:fp32{suffix}"
        qt = quantize(data, parse_scheme(f"{name}{suffix}"))
        assert res[name]["sqnr_db"] == error(data, qt)["sqnr_db"]
        if flag == "--asym":  # a zero point changes the codes; restricted may not (int8 absmax)
            assert res[name]["sqnr_db"] != plain[name]["sqnr_db"]
    for name in ("nf4", "fp4:t", "mxfp4", "fp8_e4m3:t"):
        assert res[name] == plain[name]
    rc, _, err = _run(capsys, *base, flag, "--formats", "int8:t,fp4:t")
    assert rc == 2 and "fp4" in err
