"""Structure-aware fuzzing of every parser of a user's file: it returns, or raises LowbitError.

Valid-ish safetensors files, GGUF files, lowbit.json manifests and plan files
(``tests/fuzz_strategies.py``) are mutated (truncation, byte flips, lying lengths, wrong types,
deep nesting, huge integers, duplicate names) and run through everything lowbit does with such
a file. A bounded, derandomized number of examples keeps ``make test`` fast and repeatable;
``make fuzz`` runs the coverage-guided harnesses of ``fuzz/`` for longer.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import fuzz_strategies as fs
from lowbit import _json
from lowbit.checkpoints.io import gguf_file as _gguf
from lowbit.checkpoints.io import safetensors as _safetensors
from lowbit.errors import LowbitError

pytest.importorskip("gguf")

FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("manifest") / "ckpt"
    return folder, fs.make_manifest_folder(folder).decode()


def _parse_or_error(parse: Any, *args: Any) -> Any:
    """The parse result, or the LowbitError message; anything else propagates (a finding)."""
    try:
        return parse(*args)
    except LowbitError as exc:
        return str(exc)


# --------------------------------------------------------------------------- safetensors


@FUZZ
@given(data=fs.safetensors_files)
def test_safetensors_reader_never_crashes(data: bytes, work: Path) -> None:
    """Open, read every tensor, count for the planner: success or LowbitError."""
    try:
        fs.exercise_safetensors(data, work)
    except LowbitError:
        pass


@FUZZ
@given(data=fs.safetensors_files)
def test_safetensors_parse_bytes_matches_file(data: bytes, work: Path) -> None:
    """Parsing from memory and from the file give the same header or the same error."""
    path = work / "same.safetensors"
    path.write_bytes(data)
    assert _parse_or_error(_safetensors.parse_bytes, data, path) == _parse_or_error(
        _safetensors.parse, path
    )


@FUZZ
@given(data=fs.gguf_files)
def test_gguf_parse_bytes_matches_file(data: bytes, work: Path) -> None:
    """Parsing a GGUF from memory and from the file (mmap) give the same header or error."""
    path = work / "same.gguf"
    path.write_bytes(data)
    assert _parse_or_error(_gguf.parse_bytes, data, path) == _parse_or_error(_gguf.parse, path)


# ---------------------------------------------------------------------------------- GGUF


@FUZZ
@given(data=fs.gguf_files)
def test_gguf_reader_never_crashes(data: bytes, work: Path) -> None:
    """Open, read every tensor and the config, count for the planner, copy the metadata into
    a new GGUF that reads back equal: success or LowbitError."""
    try:
        fs.exercise_gguf(data, work)
    except LowbitError:
        pass


@FUZZ
@given(seed=fs.seeds)
def test_valid_gguf_reads_and_copies(seed: int, work: Path) -> None:
    """Unmutated generated GGUFs whose used keys keep their types always read."""
    kvs = fs.llama_kvs()
    rnd = random.Random(seed)
    kvs += [fs._random_kv(rnd, f"x.extra{i}") for i in range(rnd.randint(0, 4))]
    kvs = [kv for kv in kvs if not (kv[1] == fs.ARRAY and "nests" in _depth_note(kv))]
    data = fs.gguf_model(kvs, seed=seed)
    fs.exercise_gguf(data, work)


def _depth_note(kv: tuple[str, int, Any]) -> str:
    value = kv[2]
    if isinstance(value, bytes):  # a gguf_nested array: count its levels
        depth = 0
        while value[:4] == (fs.ARRAY).to_bytes(4, "little"):
            depth += 1
            value = value[12:]
        return "nests" if depth + 1 > _gguf.MAX_ARRAY_DEPTH else ""
    return ""


# ------------------------------------------------------------------------------ manifest


@FUZZ
@given(seed=fs.seeds)
def test_manifest_json_never_crashes(seed: int, manifest: tuple[Path, str]) -> None:
    """Mutated lowbit.json documents parse or are refused by the JSON limits."""
    _, text = manifest
    mutant = fs.mutate_json_text(text, random.Random(seed))
    try:
        _json.loads(mutant.encode("utf-8", "surrogatepass"), "lowbit.json")
    except LowbitError:
        pass


@FUZZ
@given(seed=fs.seeds)
@example(seed=72)  # KeyError 'kind' before the manifest schema checks (issue 11 case 4)
@example(seed=294)  # KeyError 'tensor'
@example(seed=390)  # AttributeError: 'list' object has no attribute 'get'
def test_manifest_reader_never_crashes(seed: int, manifest: tuple[Path, str]) -> None:
    """A lowbit checkpoint whose lowbit.json is mutated opens and reads, or LowbitError."""
    folder, text = manifest
    mutant = fs.mutate_json_text(text, random.Random(seed))
    try:
        fs.exercise_manifest(mutant.encode("utf-8", "surrogatepass"), folder)
    except LowbitError:
        pass


# ---------------------------------------------------------------------------- plan files


@FUZZ
@given(seed=fs.seeds, yaml=st.booleans())
def test_plan_file_never_crashes(seed: int, yaml: bool, work: Path) -> None:
    """Mutated plan files (JSON or YAML) give a plan or a LowbitError."""
    if yaml:
        pytest.importorskip("yaml")
    text = fs.random_plan_text(random.Random(seed))
    try:
        fs.exercise_plan(text.encode("utf-8", "surrogatepass"), work, ".yaml" if yaml else ".json")
    except LowbitError:
        pass


# ---------------------------------------------------------------------------- JSON reader

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=8)
    | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                               max_size=4),
    max_leaves=30,
)  # fmt: skip


def _true_depth(v: Any) -> int:
    if isinstance(v, list):
        return 1 + max(map(_true_depth, v), default=0)
    if isinstance(v, dict):
        return 1 + max(map(_true_depth, v.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None, derandomize=True)
@given(value=json_values, ascii_only=st.booleans())
def test_json_depth_and_round_trip(value: Any, ascii_only: bool) -> None:
    """depth() is the exact nesting (brackets and escapes inside strings skipped), and a
    document within the limits reads back equal."""
    raw = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    assert _json.depth(raw) == _true_depth(value)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:  # lone surrogates from st.text: not a file's text
        return
    assert _json.loads(raw, "doc") == value


@settings(max_examples=200, deadline=None, derandomize=True)
@given(digits=st.integers(21, 6000), sign=st.sampled_from(["", "-"]))
def test_json_long_integers_refused_cheaply(digits: int, sign: str) -> None:
    """Any integer longer than 20 digits is refused, naming its length, never formatted."""
    with pytest.raises(LowbitError, match=f"an integer of {digits + len(sign)} digits"):
        _json.loads(f'{{"shape": [{sign}{"7" * digits}]}}', "doc")
