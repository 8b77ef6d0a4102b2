"""lowbit.checkpoints.gguf.mix, imatrix and `lowbit quantize --to q4_k_m`: llama.cpp's files."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from lowbit.checkpoints.gguf.imatrix import read_imatrix, write_imatrix
from lowbit.checkpoints.gguf.mix import gguf_mix_types, write_gguf_mix
from lowbit.checkpoints.gguf.writer import write_gguf
from lowbit.checkpoints.opener import open_checkpoint
from lowbit.checkpoints.steps import raw_bytes
from lowbit.cli import main
from lowbit.errors import LowbitError
from lowbit.ggml import blocks, mixes

pytest.importorskip("gguf")

H, F, LAYERS, VOCAB = 512, 768, 4, 256
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp" / "mixes" / "types.json"


def _mid_llama(path: Path) -> Path:
    """A random llama with rows of 512 and 1536 (K-quants fit), GQA 4, untied output."""
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    t = {"token_embd.weight": w(VOCAB, H)}
    for i in range(LAYERS):
        p = f"blk.{i}."
        t |= {
            p + "attn_norm.weight": np.ones(H, np.float32),
            p + "attn_q.weight": w(H, H),
            p + "attn_k.weight": w(128, H),
            p + "attn_v.weight": w(128, H),
            p + "attn_output.weight": w(H, H),
            p + "ffn_norm.weight": np.ones(H, np.float32),
            p + "ffn_gate.weight": w(F, H),
            p + "ffn_up.weight": w(F, H),
            p + "ffn_down.weight": w(H, F),
        }
    t |= {"output_norm.weight": np.ones(H, np.float32), "output.weight": w(VOCAB, H)}
    meta = {
        "llama.block_count": LAYERS,
        "llama.attention.head_count": 8,
        "llama.attention.head_count_kv": 2,
        "llama.embedding_length": H,
        "llama.feed_forward_length": F,
        "llama.context_length": 128,
    }
    return write_gguf(path, t, metadata=meta, arch="llama", progress=False)


@pytest.fixture(scope="module")
def mid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _mid_llama(tmp_path_factory.mktemp("mix") / "mid.gguf")


def _imatrix_for(src: Path, out: Path, *, skip: str = "token_embd") -> tuple[Path, dict]:
    ckpt = open_checkpoint(src)
    rng = np.random.default_rng(1)
    sums, counts = {}, {}
    for n in ckpt.names():
        shape = ckpt.info(n).shape
        if len(shape) == 2 and skip not in n:
            sums[n] = rng.uniform(0, 50, size=shape[-1]).astype(np.float32)
            counts[n] = np.array([17.0], np.float32)
    write_imatrix(out, sums, counts, datasets=["test"], chunk_count=3, chunk_size=512)
    return out, {n: sums[n] / counts[n][0] for n in sums}


def _check_bytes(src: Path, out: Path, vectors: dict | None = None) -> dict[str, str]:
    """Every quantized tensor of ``out`` holds blocks.quantize's bytes of the source's floats."""
    s, o = open_checkpoint(src), open_checkpoint(out)
    types = {}
    for n in o.names():
        t = o.info(n).dtype
        types[n] = t
        if t in blocks.TYPES:
            im = None if vectors is None else vectors.get(n)
            want = blocks.quantize(np.asarray(s.get(n), np.float32), t, imatrix=im)
            assert raw_bytes(o, n).tobytes() == want.tobytes(), n
            back = np.asarray(o.get(n), np.float32)  # the reader decodes every type
            np.testing.assert_array_equal(back, blocks.dequantize(want, t).reshape(back.shape))
        else:
            assert raw_bytes(o, n).tobytes() == raw_bytes(s, n).tobytes(), n
    return types


@pytest.mark.parametrize("mix", ["q4_k_m", "q3_k_m", "q5_k_s", "iq4_xs", "q2_k"])
def test_cli_writes_llamacpp_mix(mid: Path, tmp_path: Path, mix: str) -> None:
    """`lowbit quantize --to MIX --out-format gguf`: llama-quantize's types, llama.cpp's bytes."""
    out = tmp_path / f"mid.{mix}.gguf"
    rc = main(["quantize", str(mid), "--to", mix, "--out-format", "gguf", "--out", str(out),
               "--no-progress"])  # fmt: skip
    assert rc == 0
    types = _check_bytes(mid, out)
    assert types == gguf_mix_types(open_checkpoint(mid), mix)
    assert open_checkpoint(out).metadata["general.file_type"] == mixes.mix(mix).file_type
    assert open_checkpoint(out).metadata["llama.block_count"] == LAYERS  # source's keys kept


def _small_llama(path: Path) -> Path:
    """A random 2-layer llama with rows of 256 and 512 (every i-quant fits), GQA 4."""
    rng = np.random.default_rng(4)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    h, f = 256, 512
    t = {"token_embd.weight": w(VOCAB, h)}
    for i in range(2):
        p = f"blk.{i}."
        t |= {
            p + "attn_norm.weight": np.ones(h, np.float32),
            p + "attn_q.weight": w(h, h),
            p + "attn_k.weight": w(64, h),
            p + "attn_v.weight": w(64, h),
            p + "attn_output.weight": w(h, h),
            p + "ffn_norm.weight": np.ones(h, np.float32),
            p + "ffn_gate.weight": w(f, h),
            p + "ffn_up.weight": w(f, h),
            p + "ffn_down.weight": w(h, f),
        }
    t |= {"output_norm.weight": np.ones(h, np.float32), "output.weight": w(VOCAB, h)}
    meta = {
        "llama.block_count": 2,
        "llama.attention.head_count": 8,
        "llama.attention.head_count_kv": 2,
        "llama.embedding_length": h,
        "llama.feed_forward_length": f,
        "llama.context_length": 128,
    }
    return write_gguf(path, t, metadata=meta, arch="llama", progress=False)


@pytest.mark.parametrize("mix", ["iq2_m", "iq3_xxs"])
def test_cli_writes_iquant_mix(tmp_path: Path, mix: str) -> None:
    """An i-quant mix with --imatrix: llama-quantize's types, llama.cpp's bytes for each."""
    src = _small_llama(tmp_path / "small.gguf")
    path, _ = _imatrix_for(src, tmp_path / "im.gguf")
    out = tmp_path / f"small.{mix}.gguf"
    rc = main(["quantize", str(src), "--to", mix, "--out-format", "gguf", "--out", str(out),
               "--imatrix", str(path), "--no-progress"])  # fmt: skip
    assert rc == 0
    types = _check_bytes(src, out, read_imatrix(path))
    assert types == gguf_mix_types(open_checkpoint(src), mix, has_imatrix=True)
    assert {"IQ2_S", "IQ3_XXS"} & set(types.values())


def test_types_equal_the_fixture_for_a_mid_llama(mid: Path) -> None:
    """The mid-llama GGUF gets the types llama-quantize chose for the fixture's mid-llama."""
    want = json.loads(FIXTURE.read_text())["mid-llama"]["Q4_K_M"]
    got = gguf_mix_types(open_checkpoint(mid), "Q4_K_M")
    for name, t in got.items():
        if name in want:
            assert t == want[name]["to"].upper(), name


def test_imatrix_gguf_and_legacy(mid: Path, tmp_path: Path) -> None:
    """--imatrix: each tensor's vector (sums / counts) goes to llama.cpp's quantizer; the
    legacy .dat format reads to the same vectors."""
    path, vectors = _imatrix_for(mid, tmp_path / "im.gguf")
    read = read_imatrix(path)
    assert set(read) == set(vectors)
    for n, v in vectors.items():
        np.testing.assert_array_equal(read[n], v.astype(np.float32))
    dat = tmp_path / "im.dat"
    _write_legacy(dat, {n: v * 17 for n, v in vectors.items()}, ncall=17)
    for n, v in read_imatrix(dat).items():
        np.testing.assert_allclose(v, vectors[n], rtol=1e-6)
    out = tmp_path / "mid.q4km.im.gguf"
    rc = main(["quantize", str(mid), "--to", "q4_k_m", "--out-format", "gguf", "--out", str(out),
               "--imatrix", str(path), "--no-progress"])  # fmt: skip
    assert rc == 0
    _check_bytes(mid, out, read)


def test_imatrix_counts_zero_means_ones(tmp_path: Path) -> None:
    """An expert that saw no token (count 0) gets all-ones weights, as llama-quantize does."""
    sums = {"blk.0.ffn_up_exps.weight": np.arange(8, dtype=np.float32).reshape(2, 4)}
    counts = {"blk.0.ffn_up_exps.weight": np.array([2.0, 0.0], np.float32)}
    write_imatrix(tmp_path / "e.gguf", sums, counts, datasets=["x"], chunk_count=1, chunk_size=1)
    v = read_imatrix(tmp_path / "e.gguf")["blk.0.ffn_up_exps.weight"]
    np.testing.assert_array_equal(v, [0, 0.5, 1, 1.5, 1, 1, 1, 1])


def _write_legacy(path: Path, values: dict, ncall: int, cut: int = 0) -> None:
    data = struct.pack("<i", len(values))
    for name, v in values.items():
        raw = name.encode()
        v = np.asarray(v, "<f4")
        data += struct.pack("<i", len(raw)) + raw + struct.pack("<ii", ncall, v.size) + v.tobytes()
    path.write_bytes(data[: len(data) - cut])


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda p: _write_legacy(p, {"x": [1.0, np.nan]}, 1), "NaN"),
        (lambda p: _write_legacy(p, {"x": [1.0, 2.0]}, -3), "negative counts"),
        (lambda p: _write_legacy(p, {"x": [1.0, -2.0]}, 1), "negative sums"),
        (lambda p: p.write_bytes(struct.pack("<ii", 1, 5) + b"ab"), "not an importance matrix"),
        (lambda p: _write_legacy(p, {"x": [1.0] * 9}, 1, cut=3), "truncated"),
        (lambda p: p.write_bytes(b""), "truncated"),
        (lambda p: p.write_bytes(struct.pack("<i", 0)), "0 entries"),
    ],
)
def test_malformed_legacy_imatrix(tmp_path: Path, make, match: str) -> None:
    """Malformed .dat files are one LowbitError each."""
    p = tmp_path / "bad.dat"
    make(p)
    with pytest.raises(LowbitError, match=match):
        read_imatrix(p)


def test_malformed_gguf_imatrix(tmp_path: Path) -> None:
    """A sums tensor without its counts, or a GGUF without the imatrix keys, is refused."""
    p = write_gguf(
        tmp_path / "a.gguf",
        {"w.in_sum2": np.ones((1, 4), np.float32)},
        metadata={"imatrix.datasets": ["x"], "imatrix.chunk_count": 1, "imatrix.chunk_size": 1},
        arch="imatrix",
        progress=False,
    )
    with pytest.raises(LowbitError, match="not both"):
        read_imatrix(p)
    q = write_gguf(tmp_path / "b.gguf", {"w": np.ones(4, np.float32)}, arch="x", progress=False)
    with pytest.raises(LowbitError, match=r"not a llama\.cpp importance matrix"):
        read_imatrix(q)
    with pytest.raises(LowbitError, match="negative counts"):
        write_imatrix(tmp_path / "c.gguf", {"w": np.ones(4)}, {"w": [-1.0]}, datasets=["x"],
                      chunk_count=1, chunk_size=1)  # fmt: skip


def test_imatrix_that_fits_no_tensor(mid: Path, tmp_path: Path) -> None:
    """An importance matrix for another model (no name matches, or a wrong length) is refused."""
    ckpt = open_checkpoint(mid)
    other = tmp_path / "o.dat"
    _write_legacy(other, {"blk.0.attn_q.weightx": [1.0] * 4}, 1)
    with pytest.raises(LowbitError, match="names none of this model"):
        write_gguf_mix(ckpt, tmp_path / "x.gguf", "q4_k_m", imatrix=read_imatrix(other))
    _write_legacy(other, {"blk.0.attn_q.weight": [1.0] * 4}, 1)
    with pytest.raises(LowbitError, match="has 4 values"):
        write_gguf_mix(ckpt, tmp_path / "x.gguf", "q4_k_m", imatrix=read_imatrix(other))
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--to", "q4_k_m"], "add --out-format gguf"),
        (["--to", "q4_k_x", "--out-format", "gguf"], "unknown llama.cpp mix 'q4_k_x'"),
        (["--to", "iq2_xxs", "--out-format", "gguf"], "IQ2_XXS needs an importance matrix"),
        (["--to", "iq3_xxs", "--out-format", "gguf"], "IQ3_XXS needs an importance matrix"),
        (["--to", "int4", "--imatrix", "x.gguf"], "llama.cpp mix options"),
        (
            [
                "--to",
                "q4_k_m",
                "--out-format",
                "gguf",
                "--output-tensor-type",
                "q4_k",
                "--token-embedding-type",
                "q4_k",
            ],
            "not a multiple",
        ),
        (["--to", "q4_k_m", "--out-format", "gguf", "--tensor-type", "attn_v"], "PATTERN=TYPE"),
        (["--to", "q2_k_s", "--out-format", "gguf"], "needs an importance matrix"),
        (["--to", "q4_k_m", "--out-format", "gguf", "--method", "awq"], "or with --method gptq"),
    ],
)
def test_cli_errors_are_one_line(
    mid: Path, tmp_path: Path, capsys: pytest.CaptureFixture, argv: list, match: str
) -> None:
    """Bad mix runs exit 2 with one line naming the problem."""
    src = mid
    if "not a multiple" in match:  # rows of 576: SmolLM2's width
        src = _narrow(tmp_path / "narrow.gguf")
    rc = main(["quantize", str(src), *argv, "--out", str(tmp_path / "o.gguf"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and match in err, err


def _narrow(path: Path) -> Path:
    rng = np.random.default_rng(2)
    t = {
        "token_embd.weight": rng.standard_normal((64, 576)).astype(np.float32),
        "blk.0.attn_q.weight": rng.standard_normal((576, 576)).astype(np.float32),
        "output.weight": rng.standard_normal((64, 576)).astype(np.float32),
    }
    return write_gguf(path, t, metadata={"llama.block_count": 1}, arch="llama", progress=False)


def test_non_gguf_source_is_refused(tmp_path: Path) -> None:
    """Mixes need a GGUF source (its metadata); anything else is one LowbitError."""
    from safetensors.numpy import save_file

    p = tmp_path / "m.safetensors"
    save_file({"w": np.ones((4, 256), np.float32)}, str(p))
    with pytest.raises(LowbitError, match="read a GGUF source"):
        gguf_mix_types(open_checkpoint(p), "q4_k_m")


def test_smollm2_types_equal_llama_quantize() -> None:
    """The shipped SmolLM2 (Q4_1) gets, tensor for tensor, the types llama-quantize chose for
    SmolLM2 (from its F32 conversion: the kept norms are F32 in both)."""
    from tiny_models import shipped_path

    ckpt = open_checkpoint(shipped_path("smollm2"))
    fixture = json.loads(FIXTURE.read_text())["smollm2"]
    for mix in ("Q4_K_M", "Q3_K_M", "Q6_K", "IQ4_XS"):
        got = gguf_mix_types(ckpt, mix)
        assert got == {n: t["to"].upper() for n, t in fixture[mix].items()}, mix


def test_experts_take_one_vector_each(tmp_path: Path) -> None:
    """A 3-D tensor of experts is quantized expert by expert, each with its own vector."""
    from lowbit.checkpoints.gguf.writer import GGUFTensor

    rng = np.random.default_rng(3)
    w = rng.standard_normal((3, 8, 256)).astype(np.float32)
    im = rng.uniform(0.1, 4, size=3 * 256).astype(np.float32)
    p = write_gguf(tmp_path / "e.gguf", {"blk.0.ffn_up_exps.weight": GGUFTensor(w, "Q4_K", imatrix=im)},
                   arch="llama", progress=False)  # fmt: skip
    got = raw_bytes(open_checkpoint(p), "blk.0.ffn_up_exps.weight").tobytes()
    want = b"".join(
        blocks.quantize(w[e], "Q4_K", imatrix=im[e * 256 : (e + 1) * 256]).tobytes()
        for e in range(3)
    )
    assert got == want
    with pytest.raises(LowbitError, match="one per column and expert"):
        write_gguf(tmp_path / "f.gguf", {"x": GGUFTensor(w, "Q4_K", imatrix=im[:256])},
                   arch="llama", progress=False)  # fmt: skip


@pytest.mark.slow
def test_smollm2_q4_k_m_bytes(tmp_path: Path) -> None:
    """The shipped SmolLM2 as Q4_K_M: llama-quantize's types, and every quantized tensor's
    bytes equal to blocks.quantize of the same (dequantized) floats (about 30 s)."""
    from tiny_models import shipped_path

    src = shipped_path("smollm2")
    out = tmp_path / "smol.Q4_K_M.gguf"
    write_gguf_mix(open_checkpoint(src), out, "q4_k_m", progress=False)
    types = _check_bytes(src, out)
    fixture = json.loads(FIXTURE.read_text())["smollm2"]["Q4_K_M"]
    assert types == {n: t["to"].upper() for n, t in fixture.items()}
