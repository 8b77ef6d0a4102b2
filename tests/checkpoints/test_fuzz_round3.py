"""The fast, fixed slice of issue 41's fuzz targets (``tests/fuzz_round3.py``): every input
returns or raises LowbitError; and one regression test per finding of the long runs."""

from __future__ import annotations

import json
import random
import traceback
import warnings
from pathlib import Path

import pytest

import fuzz_round3 as fr
from lowbit.errors import LowbitError

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

#: inputs per target in ``make test`` (the model-building targets cost ~30-60 ms each)
SLICE = {"hf_config": 300, "tokenizer": 300, "imatrix": 300, "transform": 200,
         "gguf_family": 150, "moe": 80}  # fmt: skip


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> fr.Seeds:
    return fr.Seeds(tmp_path_factory.mktemp("fuzz3"))


@pytest.mark.parametrize("target", fr.TARGETS)
def test_fuzz_slice_only_lowbit_errors(target: str, seeds: fr.Seeds) -> None:
    """A fixed slice of mutants of each target: each returns or is one LowbitError line."""
    found = []
    refused = 0
    for i in range(SLICE[target]):
        data, name = fr.mutant(target, seeds, random.Random(f"{target}:{i}"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                fr.run(target, data, seeds, name)
            except LowbitError as exc:
                refused += 1
                assert "\n" not in str(exc), str(exc)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException:  # a Rust panic in a parser is a BaseException
                found.append(f"#{i} ({name}): {traceback.format_exc(limit=-3)}")
    assert not found, f"{len(found)} findings; first: {found[0]}"
    # the seeds are valid, so the slice reaches past the first check (not all refused)
    assert refused < SLICE[target]


def test_seeds_are_accepted(seeds: fr.Seeds) -> None:
    """Unmutated seeds pass every target, so mutants start from files lowbit accepts."""
    for name, cfg in seeds.configs.items():
        fr.exercise_hf_config(json.dumps(cfg).encode(), seeds)
        if name in fr.MOE_SEEDS:
            fr.exercise_moe(json.dumps(cfg).encode(), seeds, name)
    for seed in seeds.gguf.values():
        fr.exercise_gguf_family(seed.assemble(seed.kvs), seeds)
    for raw in seeds.imatrix:
        fr.exercise_imatrix(raw, seeds)
    fr.exercise_transform(json.dumps(seeds.ct_config).encode(), seeds)


# ------------------------------------------------------------------ findings, one test each


def _refused(run: object, *args: object, says: str) -> str:
    with pytest.raises(LowbitError) as info:
        run(*args)  # type: ignore[operator]
    msg = str(info.value)
    assert says in msg and "\n" not in msg, msg
    return msg


def test_per_layer_count_into_a_gguf_conversion(seeds: fr.Seeds) -> None:
    """``num_experts: [1]`` on a dense llama reached the GGUF writer as a list (struct.error)."""
    cfg = {**seeds.configs["tiny-llama"], "num_experts": [1]}
    _refused(fr.exercise_hf_config, json.dumps(cfg).encode(), seeds,
             says="num_experts is [1]; lowbit expects one integer")  # fmt: skip


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("architectures", [[]], "architectures is [[]]; lowbit expects a list of class names"),
        ("torch_dtype", float("inf"), "torch_dtype is inf; lowbit expects a name"),
        ("torch_dtype", "", "torch_dtype is '', not a torch dtype name"),
        ("mlp_only_layers", 2**31, "transformers cannot build this config"),
        ("pad_token_id", 64, "pad_token_id is 64; it must be a token id below vocab_size 64"),
    ],
)
def test_model_builder_names_and_strict_fields(
    seeds: fr.Seeds, key: str, value: object, says: str
) -> None:
    """A list for a class name (TypeError), a number for the dtype (IndexError inside
    transformers) and a field transformers' strict dataclass refuses (its own exception,
    several lines) are one LowbitError line."""
    cfg = {**seeds.configs["tiny-qwen3moe"], key: value}
    _refused(fr.exercise_moe, json.dumps(cfg).encode(), seeds, "tiny-qwen3moe", says=says)


def test_gemma3_without_a_readable_tokenizer(seeds: fr.Seeds, tmp_path: Path) -> None:
    """Gemma 3's embedding rows come from tokenizer.json: absent or not a vocabulary, it was a
    FileNotFoundError / KeyError."""
    from lowbit.checkpoints.gguf.convert import _gemma3_vocab_rows

    class Stub:
        path = tmp_path

    _refused(_gemma3_vocab_rows, Stub(), says="tokenizer.json")
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": [1]}}')
    _refused(_gemma3_vocab_rows, Stub(), says="model.vocab is not a mapping")


def test_phi3_gguf_per_layer_head_counts(seeds: fr.Seeds) -> None:
    """A Phi-3 GGUF whose head count is an array (llama.cpp allows one per layer) was a
    TypeError while deriving its config; now one line naming the field."""
    import fuzz_strategies as fs

    seed = seeds.gguf["tiny-phi3-longrope"]
    kvs = [
        (k, fs.ARRAY, fs.gguf_value(fs.ARRAY, (fs.U32, [2, 2])))
        if k == "phi3.attention.head_count" else (k, t, p)
        for k, t, p in seed.kvs
    ]  # fmt: skip
    assert any(t == fs.ARRAY and k.endswith("head_count") for k, t, _ in kvs)
    _refused(fr.exercise_gguf_family, seed.assemble(kvs), seeds, says="num_attention_heads")


@pytest.mark.parametrize("value", [{}, float("nan"), 170.66666666666666, -1])
def test_rope_original_length_inside_the_rope_settings(seeds: fr.Seeds, value: object) -> None:
    """``rope_scaling.original_max_position_embeddings`` of another type reached the GGUF
    writer's packing unchecked (struct.error)."""
    cfg = {**seeds.configs["tiny-qwen3-yarn"]}
    cfg["rope_scaling"] = {**cfg["rope_scaling"], "original_max_position_embeddings": value}
    _refused(fr.exercise_hf_config, json.dumps(cfg).encode(), seeds,
             says=".original_max_position_embeddings is")  # fmt: skip


def test_encoded_fields_check_what_they_pack() -> None:
    """The converted view encodes metadata without write_gguf: the same range check applies
    (a float packed as UINT32 was a struct.error)."""
    import gguf

    from lowbit.checkpoints.gguf import writer as gguf_writer

    typed = {"llama.context_length": (1.5, gguf.GGUFValueType.UINT32, None)}
    _refused(gguf_writer.encoded_fields, "llama", typed, says="is not an integer (UINT32)")


def test_tokenizer_merge_into_a_missing_token(seeds: fr.Seeds) -> None:
    """A merge whose join is not in the vocabulary made tokenizers panic (a Rust panic, a
    BaseException past ``except Exception``): found by the long run (seed 41, input 826)."""
    doc = json.loads(json.dumps(seeds.tokenizers[0]))
    del doc["model"]["vocab"]["Ġthe"]
    _refused(fr.exercise_tokenizer, json.dumps(doc).encode(), seeds,
             says="merge 2 ['Ġt', 'he'] does not fit the vocabulary")  # fmt: skip


def _gguf_with(seed: fr.GGUFSeed, changes: dict[str, tuple[int, object] | None]) -> bytes:
    import fuzz_strategies as fs

    kvs = [(k, t, p) for k, t, p in seed.kvs if k not in changes]
    kvs += [(k, c[0], fs.gguf_value(c[0], c[1])) for k, c in changes.items() if c is not None]
    return seed.assemble(kvs)


@pytest.mark.parametrize(
    ("seed", "changes", "says"),
    [
        # KeyError in the q/k un-permutation: the head count fell back to transformers' default
        ("tiny-llama", {"llama.attention.head_count": None}, "no llama.attention.head_count"),
        # TypeError choosing Mixtral for a llama file with an expert-count array
        ("tiny-llama", {"llama.expert_count": (9, (4, [2, 2]))}, "expert_count"),
        # list / string local rope bases reached transformers' rope (TypeError)
        ("tiny-gemma3", {"gemma3.rope.freq_base_swa": (9, (4, [1, 2]))}, "rope.freq_base_swa"),
        ("tiny-gemma3", {"gemma3.rope.freq_base_swa": (8, "yarn")}, "rope.freq_base_swa"),
        # a rope base of 1: log(1) = 0 in yarn's correction range (ZeroDivisionError)
        ("tiny-qwen3-yarn", {"qwen3.rope.freq_base": (4, 1)}, "qwen3.rope.freq_base is 1"),
        # an original context of 1: log(1) = 0 in longrope's attention factor
        ("tiny-phi3-longrope", {"phi3.rope.scaling.original_context_length": (4, 1)},
         "original_context_length is 1"),
        # no head count and a key length of 0 gave head_dim 0 (0.0 ** -0.5)
        ("tiny-qwen2moe", {"qwen2moe.attention.head_count": None}, "no qwen2moe.attention"),
    ],
)  # fmt: skip
def test_gguf_family_findings(seeds: fr.Seeds, seed: str, changes: dict, says: str) -> None:
    """What the long gguf_family run found (seed 41): each is one LowbitError line now."""
    _refused(fr.exercise_gguf_family, _gguf_with(seeds.gguf[seed], changes), seeds, says=says)


@pytest.mark.parametrize("key", ["hidden_size", "num_attention_heads"])
def test_null_width_or_heads_into_a_gguf_conversion(seeds: fr.Seeds, key: str) -> None:
    """A null hidden size or head count reached Phi-3's rope factors (TypeError; long run,
    seed 41, inputs 32694 and 35652)."""
    cfg = {**seeds.configs["tiny-phi3-longrope"], key: None}
    _refused(fr.exercise_hf_config, json.dumps(cfg).encode(), seeds,
             says=f"{key} is null or absent")  # fmt: skip


def test_transform_config_regex_total_is_bounded() -> None:
    """20,000 distinct ``re:`` targets (0.4 MB) took more than 300 s: each match recompiled its
    pattern, the compile cache holding 1,024. Their characters are now bounded as a plan's are,
    and a transform compiles its patterns once."""
    from lowbit.checkpoints.compressed_tensors.transforms import input_transforms

    def qc(targets: list[str]) -> dict:
        apply = [{"location": "input", "targets": targets}]
        return {"transform_config": {"config_groups": {"v": {"type": "hadamard",
                                                               "apply": apply}}}}  # fmt: skip

    _refused(input_transforms, qc([f"re:(.*.*)*z{i}" for i in range(20_000)]), "c.json",
             says="transform_config's re: targets hold 308,890 characters; at most 20,000")  # fmt: skip
    [t] = input_transforms(qc([f"re:.*s\\.{i}\\.p" for i in range(1200)]), "c.json")
    assert [t.matches(f"m.layers.{i}.p", ("Linear",)) for i in (0, 1199, 1200)] == [
        True, True, False,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("seed", "key", "value"),
    [
        ("tiny-qwen2moe", "decoder_sparse_step", 0),  # integer modulo by zero
        ("tiny-qwen3moe", "hidden_act", "x"),  # KeyError in transformers' activations
        ("tiny-qwen2moe", "rope_theta", None),  # None ** Tensor
        ("tiny-qwen3moe", "head_dim", None),  # None ** -0.5
    ],
)
def test_moe_configs_transformers_cannot_build(
    seeds: fr.Seeds, seed: str, key: str, value: object
) -> None:
    """Values lowbit's checks let through that the model class cannot use (long moe run,
    seed 41): transformers' own error, in one line, instead of its traceback."""
    cfg = {**seeds.configs[seed], key: value}
    _refused(fr.exercise_moe, json.dumps(cfg).encode(), seeds, seed,
             says="transformers cannot build")  # fmt: skip


def test_tokenizer_json_nesting_is_bounded_before_parsing(seeds: fr.Seeds) -> None:
    """A 6 MB tokenizer.json of 5,000 lists nested 600 deep took 11.8 s and 280 MB in Python's
    json (long tokenizer run, seed 41, input 70959); lowbit's JSON limits refuse it first."""
    doc = json.loads(json.dumps(seeds.tokenizers[0]))
    nested: list = []
    for _ in range(600):
        nested = [nested]
    doc["added_tokens"] = [nested] * 50
    _refused(fr.exercise_tokenizer, json.dumps(doc).encode(), seeds,
             says="JSON nested 603 levels deep; lowbit reads at most 64")  # fmt: skip
