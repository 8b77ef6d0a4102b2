"""Hugging Face -> GGUF (lowbit.checkpoints.gguf.convert): the tiny models of
tests/fixtures/llamacpp/convert/ convert to what llama.cpp's convert_hf_to_gguf.py wrote."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")
gguf = pytest.importorskip("gguf")
pytest.importorskip("safetensors")

import lowbit  # noqa: E402
from lowbit.checkpoints import open_checkpoint  # noqa: E402
from lowbit.checkpoints.gguf.arch import FAMILIES, permute_qk  # noqa: E402
from lowbit.checkpoints.gguf.names import unpermute_qk  # noqa: E402
from lowbit.checkpoints.streaming import convert_hf_to_gguf  # noqa: E402
from lowbit.cli import main  # noqa: E402
from lowbit.errors import LowbitError  # noqa: E402
from tiny_models import llamacpp_tiny_models  # noqa: E402

CONVERT = Path(__file__).parent.parent / "fixtures" / "llamacpp" / "convert"
NAMES = [
    "tiny-llama",
    "tiny-qwen3",
    "tiny-gemma3",
    "tiny-mixtral",
    "tiny-qwen2moe",
    "tiny-qwen3moe",
    "tiny-llama-yarn",
    "tiny-qwen3-yarn",
    "tiny-llama-defaults",
    "tiny-qwen3-dynamic",
    "tiny-phi3-longrope",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Hugging Face models, made by the fixtures' own make_tiny.py with
    SmolLM2's tokenizer as lowbit writes it."""
    return llamacpp_tiny_models(tmp_path_factory.mktemp("convert"))


def _summary(path: Path) -> dict:
    """The fixture's own summary of a GGUF (summarize.py, run as llama.cpp's side was)."""
    subprocess.run(
        [sys.executable, str(CONVERT / "summarize.py"), str(path)], check=True, capture_output=True
    )
    return json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", NAMES)
def test_bf16_conversion_matches_llamacpp(tiny: Path, tmp_path: Path, name: str) -> None:
    """Every metadata key (types and value) and every tensor (name, shape, type, bytes) of
    lowbit's bf16 conversion equals convert_hf_to_gguf.py --outtype bf16's; tensors in order."""
    out = tmp_path / f"{name}.gguf"
    convert_hf_to_gguf(tiny / name, out, outtype="bf16", progress=False)
    got = _summary(out)
    want = json.loads((CONVERT / f"{name}.bf16.json").read_text(encoding="utf-8"))
    assert got["metadata"].pop("lowbit.writer")["value"].startswith("lowbit ")
    assert got["metadata"] == want["metadata"]
    assert got["tensors"] == want["tensors"]


@pytest.mark.parametrize("name", ["tiny-qwen2moe", "tiny-qwen3moe"])
def test_fused_experts_convert_as_per_expert(tiny: Path, tmp_path: Path, name: str) -> None:
    """A Qwen mixture saved as transformers 5 holds it (one 3-D ``experts.gate_up_proj``, gate
    rows then up rows, and ``experts.down_proj`` per block) converts to the same tensors and
    keys as its per-expert folder: llama.cpp's file (its converter splits gate_up_proj too)."""
    from safetensors.numpy import save_file

    folder = tmp_path / name
    shutil.copytree(tiny / name, folder)
    ckpt = open_checkpoint(folder / "model.safetensors")
    weights = {n: ckpt.get(n) for n in ckpt.names()}
    ckpt.close()
    n_exp = json.loads((folder / "config.json").read_text())["num_experts"]
    for layer in range(2):
        p = f"model.layers.{layer}.mlp.experts."
        pop = [[weights.pop(f"{p}{e}.{proj}.weight") for e in range(n_exp)]
               for proj in ("gate_proj", "up_proj", "down_proj")]  # fmt: skip
        weights[p + "gate_up_proj"] = np.concatenate([np.stack(pop[0]), np.stack(pop[1])], axis=1)
        weights[p + "down_proj"] = np.stack(pop[2])
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / f"{name}.gguf"
    convert_hf_to_gguf(folder, out, outtype="bf16", progress=False)
    got = _summary(out)
    want = json.loads((CONVERT / f"{name}.bf16.json").read_text(encoding="utf-8"))
    got["metadata"].pop("lowbit.writer")
    assert got["metadata"] == want["metadata"]
    assert got["tensors"] == want["tensors"]


def test_cli_q4_0_from_hugging_face(tiny: Path, tmp_path: Path, capsys) -> None:
    """`lowbit quantize HF --to q4_0 --out-format gguf` writes llama.cpp's names with Q4_0
    weights, F32 norms, the stored embedding, and reads back as a llama GGUF."""
    out = tmp_path / "q.gguf"
    rc = main(["quantize", str(tiny / "tiny-llama"), "--to", "q4_0", "--out-format", "gguf",
               "--out", str(out), "--json"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    r = gguf.GGUFReader(out)
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["blk.0.attn_q.weight"] == "Q4_0"
    assert types["blk.1.ffn_down.weight"] == "Q4_0"
    assert types["blk.0.attn_norm.weight"] == "F32"
    assert types["token_embd.weight"] == "BF16"
    ckpt = open_checkpoint(out)
    assert ckpt.config["model_type"] == "llama" and ckpt.config["num_key_value_heads"] == 2


def test_unsupported_family_is_one_line(tiny: Path, tmp_path: Path) -> None:
    """A model type lowbit does not convert is one LowbitError naming those it does."""
    folder = tmp_path / "m"
    shutil.copytree(tiny / "tiny-llama", folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = "gpt_neox"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LowbitError, match=r"gpt_neox.*supported: .*gemma3.*llama.*phi3") as e:
        convert_hf_to_gguf(folder, tmp_path / "x.gguf", progress=False)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"mlp_only_layers": [1]}, r"mlp_only_layers \[1\].*experts in every layer"),
        ({"decoder_sparse_step": 2}, r"decoder_sparse_step 2.*experts in every layer"),
        ({"num_experts": None}, r"num_experts / num_local_experts is None"),
        ({"num_experts": 0}, r"num_experts / num_local_experts is 0"),
        ({"norm_topk_prob": True}, r"norm_topk_prob True.*qwen2moe always computes it as False"),
    ],
)
def test_moe_config_lowbit_cannot_convert_is_one_line(
    tiny: Path, tmp_path: Path, change: dict, match: str
) -> None:
    """A Qwen mixture with dense layers (llama.cpp's qwen2moe blocks all hold experts) or
    without a positive expert count is one LowbitError naming the folder and the bad key."""
    folder = tmp_path / "m"
    shutil.copytree(tiny / "tiny-qwen2moe", folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(change)
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LowbitError, match=match) as e:
        convert_hf_to_gguf(folder, tmp_path / "x.gguf", progress=False)
    assert "\n" not in str(e.value) and str(folder) in str(e.value)
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize(
    ("drop", "match"),
    [
        # found against config.json first (lowbit.checkpoints.shape_checks)
        ("model.layers.1.mlp.experts.2.up_proj.weight", r"layer 1 lacks expert 2's up_proj"),
        (None, r"experts\.4\.gate_proj\.weight' is expert 4, but config\.json has 4 experts"),
    ],
)
def test_moe_experts_missing_or_extra_is_one_line(
    tiny: Path, tmp_path: Path, drop: str | None, match: str
) -> None:
    """A mixture lacking one expert tensor, or holding an expert past the config's count, is
    one LowbitError (no GGUF written)."""
    from safetensors.numpy import save_file

    folder = tmp_path / "m"
    shutil.copytree(tiny / "tiny-qwen3moe", folder)
    ckpt = open_checkpoint(folder / "model.safetensors")
    weights = {n: ckpt.get(n) for n in ckpt.names()}
    ckpt.close()
    if drop is None:
        weights["model.layers.0.mlp.experts.4.gate_proj.weight"] = weights[
            "model.layers.0.mlp.experts.3.gate_proj.weight"
        ]
    else:
        del weights[drop]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(LowbitError, match=match) as e:
        convert_hf_to_gguf(folder, tmp_path / "x.gguf", progress=False)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "x.gguf").exists()


def test_permute_qk_inverts_unpermute(rng: np.random.Generator) -> None:
    """permute_qk and unpermute_qk are inverse row orders, for weights and biases."""
    for heads, rows in ((4, 64), (2, 32), (1, 8)):
        w = rng.standard_normal((rows, 3))
        assert np.array_equal(unpermute_qk(permute_qk(w, heads), heads), w)
        b = rng.standard_normal(rows)
        assert np.array_equal(permute_qk(unpermute_qk(b, heads), heads), b)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_names_round_trip(model_type: str) -> None:
    """Every family's names map to GGUF and back to themselves."""
    fam = FAMILIES[model_type]
    for hf, _ in fam.layers:
        name = f"model.layers.3.{hf}"
        gname = fam.to_gguf(name)
        assert gname is not None and gname.startswith("blk.3.")
        assert fam.to_hf(gname) == name
    assert fam.to_hf("token_embd.weight") == "model.embed_tokens.weight"


@pytest.mark.parametrize("given", [False, True])
def test_q4_0_values_equal_lowbit_codes(tiny: Path, tmp_path: Path, given: bool) -> None:
    """`--to q4_0` from Hugging Face stores lowbit's own q4_0 codes: every GGUF weight,
    dequantized by the gguf package and put back in transformers' row order, equals the
    QuantizedTensor's values (rounded here, or given as weights= as GPTQ gives them: q/k rows
    reordered with their codes and scales)."""
    import lowbit
    from lowbit.checkpoints.gguf.arch import FAMILIES
    from lowbit.checkpoints.streaming import open_model, plan_model, quantize_model
    from lowbit.plans.plan import PrecisionPlan

    src = tiny / "tiny-llama"
    plan = PrecisionPlan.uniform("q4_0")
    ckpt = open_model(src)
    applied = plan_model(ckpt, plan, out_format="gguf")
    qts = {t.name: lowbit.quantize(ckpt.get(t.name), t.scheme) for t in applied.quantized}
    out = tmp_path / "q.gguf"
    quantize_model(src, plan, out, out_format="gguf", progress=False,
                   weights=qts if given else None)  # fmt: skip
    r = gguf.GGUFReader(out)
    fam = FAMILIES["llama"]
    for t in r.tensors:
        hf = fam.to_hf(t.name)
        if hf not in qts:
            continue
        vals = gguf.quants.dequantize(t.data, t.tensor_type)
        heads = 4 if ".q_proj." in hf else 2
        if ".q_proj." in hf or ".k_proj." in hf:
            vals = unpermute_qk(vals, heads)
        np.testing.assert_array_equal(vals, qts[hf].dequantize(), err_msg=t.name)


def test_gguf_to_hf_array_per_family(rng: np.random.Generator) -> None:
    """A GGUF tensor goes back to transformers' layout by its family: llama's q/k rows
    un-permuted (k by the KV heads), Gemma's norms less one, Qwen's and Phi-3's unchanged."""
    from lowbit.checkpoints.gguf.names import gguf_to_hf_array, gguf_to_hf_name

    q, k = rng.standard_normal((64, 8)), rng.standard_normal((32, 8))
    norm = rng.random(16).astype(np.float32)
    llama = {"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2}
    hq = gguf_to_hf_name("blk.0.attn_q.weight", llama)
    hk = gguf_to_hf_name("blk.0.attn_k.weight", llama)
    assert np.array_equal(gguf_to_hf_array(hq, q, llama), unpermute_qk(q, 4))
    assert np.array_equal(gguf_to_hf_array(hk, k, llama), unpermute_qk(k, 2))
    for model_type in ("qwen2", "qwen3", "phi3"):
        cfg = {**llama, "model_type": model_type}
        assert gguf_to_hf_array(hq, q, cfg) is q
    gemma = {**llama, "model_type": "gemma3_text"}
    name = gguf_to_hf_name("blk.1.ffn_norm.weight", gemma)
    assert name == "model.layers.1.pre_feedforward_layernorm.weight"
    assert np.array_equal(gguf_to_hf_array(name, norm, gemma), norm - np.float32(1))
    assert gguf_to_hf_name("blk.1.ffn_norm.weight", llama).endswith(
        "post_attention_layernorm.weight"
    )
    with pytest.raises(LowbitError, match="'mamba'"):
        gguf_to_hf_name("blk.0.attn_q.weight", {"model_type": "mamba"})


def test_gguf_expert_stacks_split_per_family(rng: np.random.Generator) -> None:
    """A GGUF expert stack splits into the family's per-expert transformers tensors, expert e
    being slice e (Mixtral's w1/w2/w3, Qwen's gate/up/down_proj); other tensors are not
    stacks; a stack that is not 3-D is one LowbitError."""
    from lowbit.checkpoints.gguf.names import gguf_to_hf_experts

    stack = rng.standard_normal((3, 8, 4)).astype(np.float32)
    cases = [
        ("mixtral", "blk.1.ffn_down_exps.weight", "model.layers.1.block_sparse_moe.experts.{}.w2"),
        ("qwen2_moe", "blk.0.ffn_gate_exps.weight", "model.layers.0.mlp.experts.{}.gate_proj"),
        ("qwen3_moe", "blk.1.ffn_up_exps.weight", "model.layers.1.mlp.experts.{}.up_proj"),
    ]
    for model_type, name, want in cases:
        got = gguf_to_hf_experts(name, stack, {"model_type": model_type})
        assert got is not None
        assert [n for n, _ in got] == [want.format(e) + ".weight" for e in range(3)]
        for e, (_, arr) in enumerate(got):
            assert np.array_equal(arr, stack[e])
        assert (
            gguf_to_hf_experts("blk.0.ffn_gate_inp.weight", stack[0], {"model_type": model_type})
            is None
        )
    with pytest.raises(LowbitError, match=r"'blk\.0\.ffn_up_exps\.weight' has shape \(3, 8\)"):
        gguf_to_hf_experts("blk.0.ffn_up_exps.weight", stack[:, :, 0], {"model_type": "qwen3_moe"})


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mixtral", "tiny-qwen2moe", "tiny-qwen3moe"])
def test_mix_from_hugging_face_equals_two_steps(tiny: Path, tmp_path: Path, name: str) -> None:
    """`lowbit quantize HF --to q4_k_m --out-format gguf` writes the tensors (names, types,
    bytes) and metadata that converting first and then quantizing the GGUF write, and leaves
    no temporary file beside the output."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    direct = out_dir / "direct.gguf"
    rc = main(["quantize", str(tiny / name), "--to", "q4_k_m", "--out-format", "gguf",
               "--out", str(direct), "--no-progress"])  # fmt: skip
    assert rc == 0
    assert sorted(p.name for p in out_dir.iterdir()) == ["direct.gguf"]
    converted = tmp_path / "converted.gguf"
    rc = main(["quantize", str(tiny / name), "--plan", str(_keep_plan(tmp_path)),
               "--out-format", "gguf", "--out", str(converted), "--no-progress"])  # fmt: skip
    assert rc == 0
    two = tmp_path / "two.gguf"
    rc = main(["quantize", str(converted), "--to", "q4_k_m", "--out-format", "gguf",
               "--out", str(two), "--no-progress"])  # fmt: skip
    assert rc == 0
    a, b = gguf.GGUFReader(direct), gguf.GGUFReader(two)
    assert [(t.name, t.tensor_type.name, bytes(t.data)) for t in a.tensors] == [
        (t.name, t.tensor_type.name, bytes(t.data)) for t in b.tensors
    ]
    assert any(t.tensor_type.name in ("Q4_K", "Q5_0") for t in a.tensors)  # rows of 64 fall back
    skip = {"general.name", "lowbit.writer"}
    fields = {k: f.contents() for k, f in a.fields.items() if k not in skip}
    assert fields == {k: f.contents() for k, f in b.fields.items() if k not in skip}
    if name == "tiny-llama":  # the one call from Python writes the command's bytes
        api = out_dir / "api.gguf"
        lowbit.quantize_model(tiny / name, "q4_k_m", api, out_format="gguf", progress=False)
        assert api.read_bytes() == direct.read_bytes()
        assert sorted(p.name for p in out_dir.iterdir()) == ["api.gguf", "direct.gguf"]


def _keep_plan(folder: Path) -> Path:
    plan = folder / "keep.json"
    plan.write_text(json.dumps({"rules": [{"match": "*", "format": "keep"}]}))
    return plan


def test_mix_from_hugging_face_bad_out_is_one_line(tiny: Path, tmp_path: Path, capsys) -> None:
    """An --out in a folder that does not exist fails at once, in one line, before any
    conversion (the temporary GGUF would go beside it)."""
    out = tmp_path / "missing" / "x.gguf"
    rc = main(["quantize", str(tiny / "tiny-llama"), "--to", "q4_k_m", "--out-format", "gguf",
               "--out", str(out), "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "does not exist" in err[0]
    assert not (tmp_path / "missing").exists()


def test_tied_qwen2moe_is_one_line(tiny: Path, tmp_path: Path) -> None:
    """A Qwen2-MoE without lm_head.weight is refused in one line: llama.cpp's converter writes
    it, but its qwen2moe loader requires output.weight (unlike qwen3moe, which reuses the
    embedding)."""
    from safetensors.numpy import save_file

    folder = tmp_path / "m"
    shutil.copytree(tiny / "tiny-qwen2moe", folder)
    ckpt = open_checkpoint(folder / "model.safetensors")
    weights = {n: ckpt.get(n) for n in ckpt.names() if n != "lm_head.weight"}
    ckpt.close()
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(LowbitError, match=r"tied embeddings.*output\.weight") as e:
        convert_hf_to_gguf(folder, tmp_path / "x.gguf", progress=False)
    assert "\n" not in str(e.value) and str(folder) in str(e.value)
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize(
    ("rope", "match"),
    [
        ({"type": "linear", "long_factor": [1.0] * 8, "short_factor": [1.0] * 8},
         r"Phi-3 rope scaling 'linear' with long_factor"),
        ({"type": "longrope", "long_factor": [1.0] * 7, "short_factor": [1.0] * 7},
         r"must both hold 8 factors.*not 7 / 7"),
        ({"type": "longrope", "long_factor": [1.0] * 8}, r"not 8 / None"),
        ({"rope_type": "mrope", "factor": 2.0}, r"rope scaling 'mrope' is not converted"),
    ],
)  # fmt: skip
def test_rope_scaling_lowbit_refuses_is_one_line(
    tiny: Path, tmp_path: Path, rope: dict, match: str
) -> None:
    """Rope settings the converter refuses (Phi-3 factors of another type or length) or does
    not know are one LowbitError, no GGUF written."""
    folder = tmp_path / "m"
    name = "tiny-phi3-longrope" if "long_factor" in rope else "tiny-qwen3-dynamic"
    shutil.copytree(tiny / name, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["rope_scaling"] = rope
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LowbitError, match=match) as e:
        convert_hf_to_gguf(folder, tmp_path / "x.gguf", progress=False)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize("orig", [1, 0, None])
def test_phi3_longrope_bad_original_length_is_one_line(
    tiny: Path, tmp_path: Path, orig: int | None
) -> None:
    """A long-context Phi-3 whose original context length is no length (1, 0, null) is one
    LowbitError line, not a division by zero or a TypeError."""
    folder = tmp_path / "m"
    shutil.copytree(tiny / "tiny-phi3-longrope", folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["original_max_position_embeddings"] = orig
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        LowbitError,
        match=r"needs whole context lengths|original_max_position_embeddings is [01]; it must",
    ) as e:
        convert_hf_to_gguf(folder, tmp_path / "x.gguf", progress=False)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("name", "length"),
    [("tiny-llama-yarn", 700), ("tiny-qwen3-yarn", 700), ("tiny-llama", 700),
     ("tiny-phi3-longrope", 1000), ("tiny-phi3-longrope", 2100)],
)  # fmt: skip
def test_rope_scaled_gguf_builds_the_source_model(
    tiny: Path, tmp_path: Path, name: str, length: int
) -> None:
    """A converted rope-scaled model's GGUF builds back into the model it came from (yarn from
    llama.cpp's rope.scaling.* keys, Phi-3's longrope from its rope_factors_long/short tensors):
    the same logits, past the original context length too (yarn's 512; Phi-3's 2,048, where
    transformers switches to the long factors). Without them the yarn models differ by 0.2 and
    1.5 in logits and the Phi-3 GGUF is refused."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from lowbit.models.build import build_model

    out = tmp_path / f"{name}.gguf"
    convert_hf_to_gguf(tiny / name, out, outtype="f32", progress=False)
    ids = (torch.arange(1, length) % 997).reshape(1, -1)
    with torch.no_grad():
        want = build_model(open_checkpoint(tiny / name), progress=False)(input_ids=ids).logits
        got = build_model(open_checkpoint(out), progress=False)(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_rope_scaling_gguf_lowbit_cannot_build_is_one_line() -> None:
    """A GGUF rope scaling type lowbit does not rebuild, or a bad factor: one LowbitError."""
    from lowbit.checkpoints.gguf.config import derive_config

    base = {"general.architecture": "llama", "llama.block_count": 1}
    with pytest.raises(LowbitError, match="linear or yarn rope scaling only"):
        derive_config({**base, "llama.rope.scaling.type": "longrope"}, set())
    with pytest.raises(LowbitError, match=r"positive llama\.rope\.scaling\.factor"):
        derive_config({**base, "llama.rope.scaling.type": "yarn"}, set())
    yarn = {**base, "llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}
    with pytest.raises(LowbitError, match="positive length"):
        derive_config({**yarn, "llama.rope.scaling.original_context_length": 0}, set())
    with pytest.raises(LowbitError, match="yarn_beta_fast is nan, not finite"):
        derive_config({**yarn, "llama.rope.scaling.yarn_beta_fast": float("nan")}, set())
    cfg = derive_config({**base, "llama.rope.scaling.type": "linear",
                         "llama.rope.scaling.factor": 2.0}, set())  # fmt: skip
    assert cfg["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
