"""MLX folders: lowbit's writer against mlx_lm.convert and mlx_lm.load, its reader, and bad
folders (one LowbitError line each)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from lowbit.checkpoints import open_checkpoint
from lowbit.checkpoints.mlx.convert import mixed_recipe, quantize_mlx
from lowbit.checkpoints.mlx.params import MLXParams
from lowbit.checkpoints.mlx.reader import MLXFolder
from lowbit.checkpoints.verify import verify_checkpoint
from lowbit.cli import main
from lowbit.errors import LowbitError
from lowbit.quant import mlx as Q

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_models import save_gguf, save_hf_folder, tiny_llama  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny llama saved three ways: untied (float32), tied (float32) and tied as bfloat16."""
    d = tmp_path_factory.mktemp("mlx-src")
    out = {
        "untied": save_hf_folder(tiny_llama(0), d / "untied"),
        "tied": save_hf_folder(tiny_llama(1, tie=True), d / "tied"),
    }
    bf = tiny_llama(2, tie=True).to(torch.bfloat16)
    out["bf16"] = save_hf_folder(bf, d / "bf16")
    return out


def _read(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out: dict[str, np.ndarray] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _src_weights(folder: Path) -> dict[str, np.ndarray]:
    """The source's tensors as stored (bfloat16 as ml_dtypes)."""
    ck = open_checkpoint(folder)
    return {n: np.asarray(ck.get(n)) for n in ck.names()}


# --- the writer, without mlx ----------------------------------------------------------------


def test_folder_layout_and_config(sources: dict[str, Path], tmp_path: Path) -> None:
    """Every 2-D weight becomes uint32 words, scales and biases of mx.quantize's codec; a
    tied model drops lm_head; config.json carries quantization twice; tokenizer copied."""
    out = tmp_path / "m"
    r = quantize_mlx(sources["tied"], out, progress=False)
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json",
        "tokenizer_config.json",
    ]  # fmt: skip
    cfg = json.loads((out / "config.json").read_text())
    want = {"group_size": 64, "bits": 4, "mode": "affine"}
    assert cfg["quantization"] == want and cfg["quantization_config"] == want
    t = _read(out)
    src = _src_weights(sources["tied"])
    assert "lm_head.weight" not in t
    emb = "model.embed_tokens"
    words, scales, biases = Q.quantize(src[f"{emb}.weight"], group_size=64, bits=4)
    assert t[f"{emb}.weight"].dtype == np.uint32
    assert t[f"{emb}.weight"].tobytes() == words.tobytes()
    assert t[f"{emb}.scales"].tobytes() == scales.tobytes()
    assert t[f"{emb}.biases"].tobytes() == biases.tobytes()
    assert t["model.norm.weight"].tobytes() == src["model.norm.weight"].tobytes()
    assert len(r["quantized"]) == 15  # 7 linears x 2 layers + the embedding


def test_reader_round_trip(sources: dict[str, Path], tmp_path: Path) -> None:
    """An MLX folder opens with the source's names (lm_head dropped when tied) and its weights
    read back as mx.dequantize gives them, in float32."""
    out = tmp_path / "m"
    quantize_mlx(sources["bf16"], out, MLXParams(bits=3, group_size=32), progress=False)
    ck = open_checkpoint(out)
    assert isinstance(ck, MLXFolder) and ck.format == "mlx"
    src = _src_weights(sources["bf16"])
    assert set(ck.names()) == set(src) - {"lm_head.weight"}
    name = "model.layers.1.mlp.down_proj.weight"
    q = Q.quantize(src[name], group_size=32, bits=3)
    back = Q.dequantize(*q, group_size=32, bits=3)
    assert back.dtype == ml_dtypes.bfloat16
    got = ck.get(name)
    assert got.dtype == np.float32 and got.tobytes() == back.astype(np.float32).tobytes()
    assert ck.info(name).dtype == "MLX_AFFINE3"
    assert "config.json quantization (mlx-lm)" in verify_checkpoint(out)["checks"]
    assert "quantization" not in ck.config


@pytest.mark.parametrize("mode", ["mxfp4", "mxfp8", "nvfp4"])
def test_fp_modes_write_uint8_scales(sources: dict[str, Path], tmp_path: Path, mode: str) -> None:
    """The FP modes store uint8 scales and no biases, and read back exactly."""
    out = tmp_path / mode
    quantize_mlx(sources["untied"], out, MLXParams(mode=mode), progress=False)
    t = _read(out)
    name = "model.layers.0.self_attn.q_proj"
    assert t[f"{name}.scales"].dtype == np.uint8 and f"{name}.biases" not in t
    src = _src_weights(sources["untied"])[f"{name}.weight"]
    words, scales, _ = Q.quantize(src, mode=mode)
    assert t[f"{name}.weight"].tobytes() == words.tobytes()
    ck = open_checkpoint(out)
    want = Q.dequantize(words, scales, mode=mode, dtype=np.float32)
    assert ck.get(f"{name}.weight").tobytes() == want.tobytes()


def test_mixed_recipe_choices() -> None:
    """mixed_3_6 on 16 layers: v_proj/down_proj of layers 0-1, 14-15 and every third between
    (4, 7, 10, 13) and lm_head get 6 bits; everything else 3 (mlx-lm's predicate)."""
    names = [f"model.layers.{i}.{m}.weight" for i in range(16)
             for m in ("self_attn.v_proj", "mlp.down_proj", "mlp.up_proj")]  # fmt: skip
    names += ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]
    got = mixed_recipe("mixed_3_6", names)
    six = sorted(int(m.split(".")[2]) for m, p in got.items() if p.bits == 6 and "v_proj" in m)
    assert six == [0, 1, 4, 7, 10, 13, 14, 15]
    assert got["lm_head"].bits == 6 and got["model.embed_tokens"].bits == 3
    assert all(p.bits == 3 for m, p in got.items() if "up_proj" in m)


def test_gguf_source(sources: dict[str, Path], tmp_path: Path) -> None:
    """A GGUF source: transformers names, q/k rows un-permuted, a tokenizer written beside."""
    model = tiny_llama(3, tie=True)
    g = save_gguf(model, tmp_path / "m.gguf")
    out = tmp_path / "from-gguf"
    quantize_mlx(g, out, MLXParams(bits=8, group_size=32), dtype="float32", progress=False)
    ck = open_checkpoint(out)
    q = ck.get("model.layers.0.self_attn.q_proj.weight")
    ref = model.model.layers[0].self_attn.q_proj.weight.detach().numpy()
    assert np.max(np.abs(q - ref)) < 0.01  # un-permuted: 8-bit error only
    assert (out / "tokenizer.json").is_file()


# --- bad folders -----------------------------------------------------------------------------


def _doctor(folder: Path, fn: Any) -> None:
    """Rewrite model.safetensors with ``fn(tensors)`` (or config.json with ``fn(config)``)."""
    from safetensors.numpy import save_file

    if fn.__name__.startswith("cfg"):
        cfg = json.loads((folder / "config.json").read_text())
        fn(cfg)
        (folder / "config.json").write_text(json.dumps(cfg))
        return
    t = _read(folder)
    fn(t)
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "mlx"})
    index = {"metadata": {}, "weight_map": dict.fromkeys(sorted(t), "model.safetensors")}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def _scales_short(t: dict) -> None:
    t["model.layers.0.mlp.down_proj.scales"] = t["model.layers.0.mlp.down_proj.scales"][:, :1]


def _rows_lie(t: dict) -> None:
    t["model.layers.0.mlp.down_proj.weight"] = t["model.layers.0.mlp.down_proj.weight"][:-1]


def _words_int(t: dict) -> None:
    t["model.layers.0.mlp.down_proj.weight"] = t["model.layers.0.mlp.down_proj.weight"].view(
        np.int32
    )


def _no_biases(t: dict) -> None:
    del t["model.layers.0.mlp.down_proj.biases"]


def cfg_mode(c: dict) -> None:
    c["quantization"]["mode"] = "int4"


def cfg_bits(c: dict) -> None:
    c["quantization"]["bits"] = 7


def cfg_bits_words(c: dict) -> None:
    c["quantization"]["bits"] = 3  # 4-bit words read as 3-bit codes: scales no longer fit


def cfg_false(c: dict) -> None:
    c["quantization"]["model.layers.0.mlp.down_proj"] = False


def cfg_group(c: dict) -> None:
    c["quantization"]["group_size"] = 48


BAD = [
    (_scales_short, "down_proj.scales has shape"),
    (_rows_lie, "down_proj.scales has shape"),
    (_words_int, "not uint32 words"),
    (_no_biases, "stores biases; none found"),
    (cfg_mode, "unknown MLX quantization mode 'int4'"),
    (cfg_bits, "bits 1, 2, 3, 4, 5, 6, 8; got 7"),
    (cfg_bits_words, "rows of 8 words do not hold whole 3-bit codes"),
    (cfg_false, "stores scales but config.json's quantization says it is not quantized"),
    (cfg_group, "groups of 32, 64, 128; got 48"),
]


@pytest.mark.parametrize(("fn", "msg"), BAD, ids=[f.__name__ for f, _ in BAD])
def test_bad_folders(sources: dict[str, Path], tmp_path: Path, fn: Any, msg: str, capsys) -> None:
    """Lying shapes, unknown modes, bits the packing cannot hold, scales of the wrong size:
    one LowbitError line from open_checkpoint, and exit 2 with one line from lowbit verify."""
    out = tmp_path / "bad"
    quantize_mlx(sources["untied"], out, progress=False)
    _doctor(out, fn)
    with pytest.raises(LowbitError, match=msg) as err:
        open_checkpoint(out)
    assert "\n" not in str(err.value)
    capsys.readouterr()
    assert main(["verify", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and msg.split("'")[0] in lines[0]


# --- the CLI -----------------------------------------------------------------------------------


def test_cli_out_format_mlx(sources: dict[str, Path], tmp_path: Path, capsys) -> None:
    """--out-format mlx with mlx_lm.convert's option names; --json reports the quantization."""
    out = tmp_path / "cli"
    argv = ["quantize", str(sources["untied"]), "--out-format", "mlx", "--q-bits", "5",
            "--q-group-size", "32", "--out", str(out), "--json"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["quantization"] == {"group_size": 32, "bits": 5, "mode": "affine"}
    assert open_checkpoint(out).info("lm_head.weight").dtype == "MLX_AFFINE5"


@pytest.mark.parametrize(
    ("extra", "msg"),
    [
        (["--q-bits", "7"], "bits 1, 2, 3, 4, 5, 6, 8"),
        (["--q-mode", "mxfp4", "--q-group-size", "64"], "mxfp4 is 4 bits in groups of 32"),
        (["--to", "int4"], "--to is an mlx-lm recipe"),
        (["--method", "hadamard"], "rounds to nearest"),
        (["--dry-run"], "shows a budget's plan"),
        (["--group", "64"], "--group (use --q-group-size) does not apply"),
        (["--to", "mixed_3_6", "--q-mode", "mxfp4"], "recipes are affine"),
        (["--scale-method", "percentile"], "--scale-method percentile does not apply"),
        (["--scale-method", "mse"], "--scale-method chooses GPTQ's MLX group scales"),
        (["--method", "awq", "--scale-method", "absmax"], "round as mx.quantize does"),
    ],
)
def test_cli_bad_options(
    sources: dict[str, Path], tmp_path: Path, extra: list[str], msg: str, capsys
) -> None:
    """Options MLX cannot take: exit 2, one line."""
    argv = ["quantize", str(sources["untied"]), "--out-format", "mlx", "--out",
            str(tmp_path / "x"), *extra]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0]
    assert not (tmp_path / "x").exists()


def test_cli_recipe(sources: dict[str, Path], tmp_path: Path) -> None:
    """--to mixed_4_6: the recipe's per-module entries in config.json, 6 bits where it says."""
    out = tmp_path / "mixed"
    argv = ["quantize", str(sources["untied"]), "--out-format", "mlx", "--to", "mixed_4_6",
            "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    q = json.loads((out / "config.json").read_text())["quantization"]
    assert q["lm_head"] == {"group_size": 64, "bits": 6, "mode": "affine"}
    assert q["model.layers.0.mlp.up_proj"]["bits"] == 4
    assert open_checkpoint(out).info("model.layers.1.mlp.down_proj.weight").dtype == "MLX_AFFINE6"


def test_cli_mlx_options_need_mlx(sources: dict[str, Path], capsys) -> None:
    """--q-bits without --out-format mlx is an error, not ignored."""
    assert main(["quantize", str(sources["untied"]), "--to", "int4", "--q-bits", "3"]) == 2
    assert "use them with --out-format mlx" in capsys.readouterr().err


# --- checked by mlx-lm -------------------------------------------------------------------------


def _mlx_lm() -> Any:
    pytest.importorskip("mlx.core", reason="mlx[cpu] is not installed (pip install 'mlx[cpu]')")
    return pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install mlx-lm)")


def _convert(src: Path, dst: Path, **kw: Any) -> None:
    from mlx_lm.convert import convert

    with contextlib.redirect_stdout(io.StringIO()):
        convert(str(src), str(dst), quantize=True, **kw)


CONVERT_CASES = [
    ("untied", {}, {}),
    ("tied", {}, {}),
    ("bf16", {"q_bits": 3, "q_group_size": 32}, {"params": MLXParams(bits=3, group_size=32)}),
    ("untied", {"q_bits": 6, "q_group_size": 128}, {"params": MLXParams(bits=6, group_size=128)}),
    ("bf16", {"q_mode": "mxfp4"}, {"params": MLXParams(mode="mxfp4")}),
    ("untied", {"q_mode": "mxfp8"}, {"params": MLXParams(mode="mxfp8")}),
    ("tied", {"q_mode": "nvfp4"}, {"params": MLXParams(mode="nvfp4")}),
    ("untied", {"quant_predicate": "mixed_3_6", "q_group_size": 64}, {"recipe": "mixed_3_6"}),
]


@pytest.mark.parametrize(("src", "theirs", "ours"), CONVERT_CASES)
def test_identical_to_mlx_lm_convert(
    sources: dict[str, Path], tmp_path: Path, src: str, theirs: dict, ours: dict
) -> None:
    """mlx_lm.convert(quantize=True) and lowbit's equivalent: the same tensor names, dtypes,
    shapes and bytes, and the same config.json."""
    _mlx_lm()
    _convert(sources[src], tmp_path / "theirs", **theirs)
    quantize_mlx(sources[src], tmp_path / "ours", progress=False, **ours)
    a, b = _read(tmp_path / "ours"), _read(tmp_path / "theirs")
    assert sorted(a) == sorted(b)
    for k in b:
        assert (a[k].dtype, a[k].shape) == (b[k].dtype, b[k].shape), k
        assert a[k].tobytes() == b[k].tobytes(), k
    ca = json.loads((tmp_path / "ours" / "config.json").read_text())
    cb = json.loads((tmp_path / "theirs" / "config.json").read_text())
    assert ca == cb


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "mistral", "gemma3_text", "phi3"])
def test_families_identical_to_mlx_lm_convert(tmp_path: Path, family: str) -> None:
    """The other families lowbit writes for mlx-lm: the same tensors and config.json as
    mlx_lm.convert -q."""
    _mlx_lm()
    from tiny_models import tiny_family

    src = save_hf_folder(tiny_family(family), tmp_path / "src")
    _convert(src, tmp_path / "theirs")
    quantize_mlx(src, tmp_path / "ours", progress=False)
    a, b = _read(tmp_path / "ours"), _read(tmp_path / "theirs")
    assert sorted(a) == sorted(b)
    assert all(a[k].tobytes() == b[k].tobytes() and a[k].dtype == b[k].dtype for k in b)
    ca = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert ca == json.loads((tmp_path / "theirs" / "config.json").read_text())


def test_unchecked_family_is_refused(tmp_path: Path) -> None:
    """A family not checked against mlx-lm (a mixture of experts with latent attention here):
    one line, no folder."""
    from tiny_models import save_moe_folder, tiny_moe

    src = save_moe_folder(tiny_moe("deepseek_v3"), tmp_path / "moe")
    with pytest.raises(LowbitError, match="model_type 'deepseek_v3': lowbit's MLX output is"):
        quantize_mlx(src, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["tied-4bit", "untied-mxfp4", "gguf-3bit"])
def test_mlx_lm_load_logits_match_lowbit(
    sources: dict[str, Path], tmp_path: Path, case: str
) -> None:
    """mlx_lm.load reads lowbit's folder; its logits equal lowbit's own evaluation of the same
    folder (lowbit.load_model: the dequantized weights in torch, float32) within 2e-4 of the
    logits' range (float32 sums in different orders)."""
    _mlx_lm()
    import mlx.core as mx
    from mlx_lm import load

    from lowbit.models.build import load_model

    out = tmp_path / case
    if case == "tied-4bit":
        quantize_mlx(sources["tied"], out, progress=False)
    elif case == "untied-mxfp4":
        quantize_mlx(sources["untied"], out, MLXParams(mode="mxfp4"), progress=False)
    else:
        g = save_gguf(tiny_llama(4, tie=True), tmp_path / "m.gguf")
        quantize_mlx(g, out, MLXParams(bits=3, group_size=32), dtype="float32", progress=False)
    ids = [[257, 72, 101, 108, 108, 111, 32, 116, 104, 101, 114, 101]]
    model, _ = load(str(out))
    theirs = np.array(model(mx.array(ids)).astype(mx.float32))
    ours_model = load_model(out)
    with torch.no_grad():
        ours = ours_model(torch.tensor(ids)).logits.float().numpy()
    span = float(theirs.max() - theirs.min())
    assert theirs.shape == ours.shape
    assert np.max(np.abs(theirs - ours)) <= 2e-4 * span


# --- GPTQ onto MLX grids --------------------------------------------------------------------


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_cli_gptq_onto_mlx(sources: dict[str, Path], tmp_path: Path, source: str, capsys) -> None:
    """--method gptq --out-format mlx: every block's linear layer GPTQ'd onto its MLX grid
    (less layer error than round to nearest), a GGUF source's q/k rows back in transformers'
    order, and the folder as the writer's checks want it."""
    model = tiny_llama(1, tie=True)
    src = sources["tied"] if source == "hf" else save_gguf(model, tmp_path / "m.gguf")
    out = tmp_path / "gptq"
    argv = ["quantize", str(src), "--out-format", "mlx", "--q-bits", "3", "--q-group-size",
            "32", "--method", "gptq", "--calib-samples", "4", "--calib-len", "64", "--out",
            str(out), "--threads", "2", "--json"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    rec = doc["method"]
    assert rec["gptq_tensors"] == 14  # 7 linears x 2 layers; the embedding stays RTN
    assert rec["mean_error"]["gptq"] < 0.5 * rec["mean_error"]["rtn"]
    ck = open_checkpoint(out)
    q = ck.get("model.layers.0.self_attn.q_proj.weight")
    ref = model.model.layers[0].self_attn.q_proj.weight.detach().numpy()
    # q/k rows un-permuted: the error is a 3-bit grid's, not that of rows out of place
    assert np.abs(q - ref).mean() < 0.5 * np.abs(ref).mean()
    assert verify_checkpoint(out)["kind"] == "mlx"


def test_cli_gptq_scale_methods(sources: dict[str, Path], tmp_path: Path, capsys) -> None:
    """GPTQ's MLX group scales: searched by default (less layer error than with MLX's edge
    rule, ``--scale-method absmax``, on the same calibration), other bytes, both loadable."""
    argv = ["quantize", str(sources["untied"]), "--out-format", "mlx", "--q-bits", "3",
            "--method", "gptq", "--calib-samples", "4", "--calib-len", "64", "--threads", "1",
            "--json", "--out"]  # fmt: skip
    errors = {}
    for label, extra in (("mse", []), ("absmax", ["--scale-method", "absmax"])):
        assert main([*argv, str(tmp_path / label), *extra]) == 0
        errors[label] = json.loads(capsys.readouterr().out)["method"]["mean_error"]["gptq"]
        assert verify_checkpoint(tmp_path / label)["kind"] == "mlx"
    assert errors["mse"] < errors["absmax"]
    a, b = open_checkpoint(tmp_path / "mse"), open_checkpoint(tmp_path / "absmax")
    name = "model.layers.0.mlp.down_proj.weight"
    assert not np.array_equal(a.get(name), b.get(name))


def test_gptq_mlx_refuses_fp_modes(sources: dict[str, Path], tmp_path: Path, capsys) -> None:
    """GPTQ onto MLX is affine only: one line, before any calibration."""
    argv = ["quantize", str(sources["untied"]), "--out-format", "mlx", "--q-mode", "mxfp4",
            "--method", "gptq", "--out", str(tmp_path / "x")]  # fmt: skip
    assert main(argv) == 2
    assert "affine only" in capsys.readouterr().err


def test_dtype_overflow_is_one_line(tmp_path: Path) -> None:
    """A weight past float16's range, written as float16: one LowbitError line naming it."""
    from safetensors.numpy import save_file

    src = tmp_path / "src"
    src.mkdir()
    w = np.full((4, 64), 1e5, dtype=np.float32)
    save_file({"model.layers.0.mlp.up_proj.weight": w}, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(LowbitError, match="overflow the model dtype float16; pass --dtype"):
        quantize_mlx(src, tmp_path / "out", dtype="float16", progress=False)
    assert not (tmp_path / "out").exists()
