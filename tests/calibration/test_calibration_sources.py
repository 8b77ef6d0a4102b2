"""lowbit.calibration.data: Calibration from what a Python user holds (texts, token arrays,
a dataset-like iterable) means what the same records in a .jsonl file mean."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lowbit.calibration.data import Calibration, decoder_windows, encoder_texts
from lowbit.errors import LowbitError

TEXTS = ["hello world", "second record here", "x"]


class _Bytes:
    """A tokenizer of UTF-8 bytes (what ``lowbit.calibration.text.tokenize`` calls)."""

    def __call__(self, text: str, **_: Any) -> dict[str, list[int]]:
        return {"input_ids": list(text.encode("utf-8"))}

    def encode(self, text: str, **_: Any) -> list[int]:
        return list(text.encode("utf-8"))


class _Dataset:
    """Dataset-like: iterates dicts with a "text" field (as a Hugging Face Dataset does)."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter([{"text": t, "id": i} for i, t in enumerate(TEXTS)])


@pytest.mark.parametrize(
    "source", [TEXTS, tuple(TEXTS), _Dataset(), iter(TEXTS), [{"text": t} for t in TEXTS]],
    ids=["list", "tuple", "dataset", "generator", "dicts"],
)  # fmt: skip
def test_texts_are_records_like_jsonl(source: Any, tmp_path: Path) -> None:
    """Texts and datasets give exactly the windows and texts of a .jsonl file of them."""
    f = tmp_path / "c.jsonl"
    f.write_text("\n".join(json.dumps(t) for t in TEXTS) + "\n", encoding="utf-8")
    mem = Calibration(source=source, samples=2, length=5)
    disk = Calibration(source=str(f), samples=2, length=5)
    assert decoder_windows(_Bytes(), mem) == decoder_windows(_Bytes(), disk)
    assert decoder_windows(_Bytes(), mem) == [list(b"hello"), list(b"secon")]
    assert encoder_texts(Calibration(source=source) if not isinstance(source, Iterator)
                         else Calibration(source=TEXTS)) == TEXTS  # fmt: skip
    assert mem.source == "<3 texts>" and mem.is_records and mem.tokens is None
    assert mem.describe("causal") == "2 records of <3 texts> (at most 5 tokens each)"
    assert mem == Calibration(source=list(TEXTS), samples=2, length=5)


@pytest.mark.parametrize(
    "source",
    [np.arange(24, dtype=np.int64).reshape(3, 8), [list(range(8)), list(range(8, 16)), range(16, 24)],
     np.arange(24, dtype=np.uint16).reshape(3, 8)],
    ids=["array", "lists", "uint16"],
)  # fmt: skip
def test_token_windows_are_used_as_given(source: Any) -> None:
    """Token windows are the model's inputs as given, cut to ``length`` and ``samples``."""
    calib = Calibration(source=source, samples=2, length=5)
    assert decoder_windows(_Bytes(), calib) == [[0, 1, 2, 3, 4], [8, 9, 10, 11, 12]]
    assert decoder_windows(_Bytes(), Calibration(source=source))[2] == list(range(16, 24))
    assert calib.source == "<3 token windows>" and calib.tokens is not None
    with pytest.raises(LowbitError, match="token ids, which calibrate causal LMs"):
        encoder_texts(calib)
    with pytest.raises(LowbitError, match="separate samples, not one text"):
        calib.text()


def test_one_window_array() -> None:
    assert Calibration(source=np.arange(6)).tokens == ((0, 1, 2, 3, 4, 5),)


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ([], "calibration data is empty"),
        ({"text": "a"}, "got dict"),
        (b"bytes", "got bytes"),
        (42, "got int"),
        ([{"id": 1}], "record 0: a dict must have a string 'text' field"),
        ([{"text": 3}], "record 0: a dict must have a string 'text' field"),
        (["a", [1, 2]], "sample 0 is str: give all texts"),
        ([[1, 2], "a"], "sample 1 is str"),
        ([[1, -2]], "window 0: token ids must be non-negative integers"),
        ([[1.5, 2.0]], "window 0: token ids must be non-negative integers"),
        (np.ones((2, 3), np.float32), "token ids must be integers, got dtype float32"),
        ([[]], "window 0 must be a non-empty 1-D run"),
        ([[[1, 2]]], "window 0 must be a non-empty 1-D run"),
        ("notes.csv", "use 'default', a .txt file or a .jsonl file"),
    ],
)
def test_bad_sources_are_one_line(source: Any, match: str) -> None:
    with pytest.raises(LowbitError, match=match) as err:
        Calibration(source=source)
    assert "\n" not in str(err.value)


def test_sizes_still_checked_for_in_memory_data() -> None:
    with pytest.raises(LowbitError, match="samples must be a positive integer"):
        Calibration(source=TEXTS, samples=0)
