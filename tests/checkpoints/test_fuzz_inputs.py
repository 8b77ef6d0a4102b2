"""Structure-aware fuzzing of the inputs issue 24 found defects in: compressed-tensors folders
(config.json with hostile re: targets, the shard index, the shards), plan files with hostile
regexes and many rules, --eval/--sensitivity documents, and explorer requests. Each returns or
raises LowbitError, within a time bound. The fast slice of ``make fuzz``'s targets."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

import fuzz_strategies as fs
from lowbit.errors import LowbitError

SLICE = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def ct(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    folder = tmp_path_factory.mktemp("ct") / "ct"
    bases = fs.make_ct_folder(folder)
    originals = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    return folder, {**originals, **bases}


@SLICE
@given(seed=fs.seeds)
def test_compressed_tensors_folder_never_crashes(
    seed: int, ct: tuple[Path, dict[str, bytes]]
) -> None:
    """A mutated config.json, index or shard: the folder opens, reads and verifies, or one
    LowbitError; never more than a few seconds."""
    folder, originals = ct
    name, data = fs.ct_mutant(random.Random(seed), originals, folder)
    t0 = time.perf_counter()
    try:
        fs.exercise_ct(name, data, folder, originals)
    except LowbitError:
        pass
    assert time.perf_counter() - t0 < 10


def test_the_unmutated_folder_reads(ct: tuple[Path, dict[str, bytes]]) -> None:
    """The fuzz base itself is valid, biases included."""
    from lowbit.checkpoints import open_checkpoint

    folder, originals = ct
    fs.exercise_ct("config.json", originals["config.json"], folder, originals)
    assert sum(n.endswith(".bias") for n in open_checkpoint(folder).names()) == 3


@SLICE
@given(seed=fs.seeds)
def test_plan_regexes_never_crash_or_hang(
    seed: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Plans of hostile regexes and globs, applied to long names."""
    work = tmp_path_factory.mktemp("plan")
    text = fs.hostile_plan_text(random.Random(seed)).encode("utf-8", "surrogatepass")
    t0 = time.perf_counter()
    try:
        fs.exercise_plan_matching(text, work)
    except LowbitError:
        pass
    assert time.perf_counter() - t0 < 10


@SLICE
@given(seed=fs.seeds)
def test_result_documents_never_crash(seed: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    """--sensitivity / --eval documents, mutated."""
    work = tmp_path_factory.mktemp("res")
    text = fs.sensitivity_text(random.Random(seed)).encode("utf-8", "surrogatepass")
    try:
        fs.exercise_result_files(text, work)
    except LowbitError:
        pass


@settings(max_examples=300, deadline=None, derandomize=True)
@given(seed=fs.seeds)
def test_explorer_requests_never_crash(seed: int) -> None:
    """Any request answers or is one LowbitError, in bounded time."""
    path, query = fs.explorer_request(random.Random(seed))
    t0 = time.perf_counter()
    try:
        fs.exercise_explorer(path, query)
    except LowbitError:
        pass
    assert time.perf_counter() - t0 < 5
