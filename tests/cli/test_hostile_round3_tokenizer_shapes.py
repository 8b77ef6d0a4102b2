"""Issue 41, third round, items 3 and 4: a tokenizer.json the GGUF vocabulary cannot reproduce
is refused in one line naming the feature (not converted approximately), and safetensors whose
tensor shapes contradict config.json are one LowbitError line in every route, before any
allocation sized from them."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lowbit.cli import main
from lowbit.errors import LowbitError

pytest.importorskip("tokenizers")
pytest.importorskip("gguf")


def _run(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, err.getvalue()


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The converter fixtures' tiny models (SmolLM2's tokenizer, as lowbit writes it)."""
    from tiny_models import llamacpp_tiny_models

    return llamacpp_tiny_models(tmp_path_factory.mktemp("convert"))


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------------------- tokenizers


def _set(doc: dict, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for p in parents:
        doc = doc[p] if not p.isdigit() else doc[int(p)]  # type: ignore[index]
    doc[int(last) if last.isdigit() else last] = value  # type: ignore[index]


@pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        ("model.dropout", 0.1, "BPE dropout 0.1"),
        ("model.continuing_subword_prefix", "##", "BPE continuing_subword_prefix '##'"),
        ("model.end_of_word_suffix", "</w>", "BPE end_of_word_suffix '</w>'"),
        ("model.byte_fallback", True, "BPE byte_fallback True"),
        ("model.ignore_merges", True, "BPE ignore_merges True"),
        ("normalizer", {"type": "Lowercase"}, "normalizer 'Lowercase'"),
        ("normalizer", {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "NFKC"}]},
         "normalizer 'NFKC'"),
        ("decoder", {"type": "Sequence", "decoders": [{"type": "ByteLevel"},
                                                      {"type": "Fuse"}]},
         "decoder 'Fuse'"),
        ("added_tokens.1.lstrip", True, "added token '<|im_start|>' lstrip True"),
        ("added_tokens.2.rstrip", True, "added token '<|im_end|>' rstrip True"),
        ("added_tokens.3.single_word", True, "single_word True"),
        ("post_processor", {"type": "TemplateProcessing",
                            "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                       {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}},
                                       {"Sequence": {"id": "A", "type_id": 0}}],
                            "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                     {"Sequence": {"id": "B", "type_id": 1}}],
                            "special_tokens": {
                                t: {"id": t, "ids": [i], "tokens": [t]}
                                for t, i in (("<|im_start|>", 1), ("<|im_end|>", 2))}},
         "post-processor template"),
        ("truncation", {"direction": "Right", "max_length": 8, "strategy": "LongestFirst",
                        "stride": 0}, "truncation"),
    ],
)  # fmt: skip
def test_tokenizer_features_a_gguf_cannot_carry(
    tiny: Path, tmp_path: Path, path: str, value: Any, says: str
) -> None:
    """Each is refused before anything is written, from the library and the CLI."""
    from lowbit.checkpoints.streaming import convert_hf_to_gguf

    folder = _copy(tiny / "tiny-llama", tmp_path / "m")
    doc = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    _set(doc, path, value)
    (folder / "tokenizer.json").write_text(json.dumps(doc), encoding="utf-8")
    out = tmp_path / "x.gguf"
    with pytest.raises(LowbitError) as info:
        convert_hf_to_gguf(folder, out, progress=False)
    msg = str(info.value)
    assert says in msg and "tokenizer.json" in msg and "\n" not in msg, msg
    code, err = _run("quantize", str(folder), "--to", "q8_0", "--out-format", "gguf",
                     "--out", str(out))  # fmt: skip
    assert code == 2 and says in _one_line(err)
    assert not out.exists()


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("normalizer", {"type": "NFC"}),  # Qwen2's: kept (llama.cpp does not normalize either)
        ("model.dropout", 0.0),
        ("model.continuing_subword_prefix", ""),  # Qwen2's empty strings
        ("decoder", {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                     "use_regex": False}),
        ("post_processor", {"type": "ByteLevel", "add_prefix_space": False,
                            "trim_offsets": False, "use_regex": False}),
    ],
)  # fmt: skip
def test_tokenizer_features_llamacpp_reproduces_still_convert(
    tiny: Path, tmp_path: Path, path: str, value: Any
) -> None:
    """What llama.cpp's GGUF vocabulary reproduces (Qwen's NFC normalizer, empty prefixes, the
    byte-level decoder and processor) converts, to the same vocabulary as SmolLM2's."""
    from lowbit.checkpoints.gguf.tokenizer import hf_vocab

    folder = _copy(tiny / "tiny-llama", tmp_path / "m")
    before = hf_vocab(folder, None)
    doc = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    _set(doc, path, value)
    (folder / "tokenizer.json").write_text(json.dumps(doc), encoding="utf-8")
    assert hf_vocab(folder, None) == before


def test_ignore_merges_with_llama3s_pre_tokenizer() -> None:
    """llama.cpp ignores merges for its llama-bpe and tekken pre-tokenizers only (Llama 3's
    files say ignore_merges: true)."""
    from lowbit.checkpoints.gguf._tokenizer_exact import check_exact, check_ignore_merges

    doc = {"model": {"type": "BPE", "ignore_merges": True}, "decoder": {"type": "ByteLevel"}}
    check_exact(doc, "tokenizer.json")
    check_ignore_merges(doc, "tokenizer.json", "llama-bpe")
    check_ignore_merges(doc, "tokenizer.json", "tekken")
    with pytest.raises(LowbitError, match="ignore_merges"):
        check_ignore_merges(doc, "tokenizer.json", "smollm")


# ---------------------------------------------------------------- tensor shapes vs config.json


def _shape_variant(src: Path, dst: Path, case: str) -> Path:
    import ml_dtypes  # noqa: F401  (safetensors reads bfloat16 through it)
    from safetensors.numpy import load_file, save_file

    folder = _copy(src, dst)
    t = {
        k: np.asarray(v, np.float32)
        for k, v in load_file(str(folder / "model.safetensors")).items()
    }
    if case == "wrong hidden":
        k = "model.layers.0.self_attn.q_proj.weight"
        t[k] = t[k][:, :32].copy()
    elif case == "transposed":
        k = "model.layers.1.mlp.down_proj.weight"
        t[k] = t[k].T.copy()
    elif case == "wrong vocab":
        t["model.embed_tokens.weight"] = t["model.embed_tokens.weight"][:1000].copy()
    elif case == "missing expert":
        for k in [k for k in t if "layers.1.block_sparse_moe.experts.3." in k]:
            del t[k]
    elif case == "expert of another shape":
        k = "model.layers.0.block_sparse_moe.experts.2.w1.weight"
        t[k] = t[k][:64].copy()
    save_file(t, str(folder / "model.safetensors"))
    return folder


SHAPE_CASES = {
    "wrong hidden": ("tiny-llama", "self_attn.q_proj.weight' has shape [64, 32], but config.json "
                                   "makes it [64, 64]"),
    "transposed": ("tiny-llama", "has shape [128, 64] (transposed), but config.json makes it "
                                 "[64, 128]"),
    # (the config's own check names the field: config_checks, run first)
    "wrong vocab": ("tiny-llama", "vocab_size is 49,152 but the token embedding has 1,000 rows"),
    "missing expert": ("tiny-mixtral", "layer 1 lacks expert 3's w1"),
    "expert of another shape": ("tiny-mixtral", "experts.2.w1.weight' has shape [64, 64], but "
                                                "config.json makes it [128, 64]"),
}  # fmt: skip
ROUTES = {
    "lowbit": ["--to", "int4"],
    "compressed-tensors": ["--to", "int4", "--out-format", "compressed-tensors"],
    "gguf": ["--to", "q8_0", "--out-format", "gguf"],
    "gguf mix": ["--to", "q4_k_m", "--out-format", "gguf"],
    "mlx": ["--to", "affine", "--out-format", "mlx"],
}


@pytest.mark.parametrize("case", SHAPE_CASES)
def test_tensor_shapes_contradicting_the_config_in_every_route(
    tiny: Path, tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """quantize to lowbit / compressed-tensors / GGUF (a conversion and a llama-quantize mix)
    / MLX, HF -> GGUF conversion and the model builder (eval): one line naming the tensor,
    before a tensor is read (no output) or the model allocated (wrote outputs or stacked into
    a traceback before; eval refused only after building the whole model)."""
    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.streaming import convert_hf_to_gguf
    from lowbit.models import build

    src, says = SHAPE_CASES[case]
    folder = _shape_variant(tiny / src, tmp_path / "m", case)
    for route, args in ROUTES.items():
        if route == "mlx" and src == "tiny-mixtral":
            continue  # lowbit's MLX output takes dense families only (refused first, by name)
        out = tmp_path / route.replace(" ", "-")
        code, err = _run("quantize", str(folder), *args, "--out", str(out))
        assert code == 2 and says in _one_line(err), (route, err)
        assert not out.exists(), route
    with pytest.raises(LowbitError) as info:
        convert_hf_to_gguf(folder, tmp_path / "c.gguf", progress=False)
    assert says in str(info.value)

    def no_model(*a: Any) -> None:
        raise AssertionError("the model was allocated before the shapes were checked")

    monkeypatch.setattr(build, "_instantiate", no_model)
    with open_checkpoint(folder) as ckpt, pytest.raises(LowbitError) as info:
        build.build_model(ckpt, progress=False)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_quantized_and_packed_tensors_are_left_to_their_readers() -> None:
    """Integer-coded tensors (packed int4, MLX's uint32 words) have their own shapes: only float
    tensors are compared, and families other than lowbit's are not checked at all."""
    from lowbit.checkpoints.shape_checks import check_tensor_shapes

    cfg = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
           "vocab_size": 100, "intermediate_size": 128}  # fmt: skip
    check_tensor_shapes(cfg, [("model.layers.0.self_attn.q_proj.weight", (64, 8), "U32")], "m")
    check_tensor_shapes({**cfg, "model_type": "deepseek_v3"},
                        [("model.layers.0.self_attn.q_proj.weight", (96, 64), "BF16")], "m")  # fmt: skip
    with pytest.raises(LowbitError, match=r"\[96, 64\], but config.json makes it \[64, 64\]"):
        check_tensor_shapes(cfg, [("model.layers.0.self_attn.q_proj.weight", (96, 64), "BF16")],
                            "m")  # fmt: skip
