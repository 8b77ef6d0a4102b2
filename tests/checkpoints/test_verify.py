"""Verified lowbit checkpoints: the manifest records every file's size and sha256 and its own
digest; a load refuses tampered codes, scales, formats, axes, shapes, file names outside the
folder, a missing manifest, an empty tensor list and every malformed manifest with one
LowbitError (never another exception); ``verify=False`` skips only the hashes."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lowbit
from lowbit.checkpoints import open_checkpoint
from lowbit.checkpoints.io import safetensors as _safetensors
from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint
from lowbit.checkpoints.lowbit_format.manifest import canonical_json, manifest_digest
from lowbit.checkpoints.streaming import quantize_model
from lowbit.errors import LowbitError
from lowbit.plans.plan import PrecisionPlan
from strategies import json_values

Q = "model.layers.0.self_attn.q_proj.weight"  # int4 g32, square: an axis swap keeps sizes
UP = "model.layers.0.mlp.up_proj.weight"  # int4 g32 asym
DOWN = "model.layers.0.mlp.down_proj.weight"  # nf4 double quantization
GATE = "model.layers.0.mlp.gate_proj.weight"  # int8 per channel
HEAD = "lm_head.weight"  # cast to bfloat16
NORM = "model.norm.weight"  # kept

RULES = [
    {"match": "*.up_proj.weight", "format": "int4:g32:asym"},
    {"match": "*.down_proj.weight", "format": "nf4:dq"},
    {"match": "*.gate_proj.weight", "format": "int8:ch"},
    {"match": "lm_head.weight", "format": "bf16"},
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small lowbit checkpoint with every kind of entry and two copied files."""
    from lowbit.checkpoints.io import safetensors_write as _safetensors_write

    rng = np.random.default_rng(11)
    src = tmp_path_factory.mktemp("verify") / "src"
    src.mkdir()
    tensors = {
        Q: rng.standard_normal((64, 64)).astype(np.float32),
        UP: rng.standard_normal((96, 64)).astype(np.float32),
        DOWN: rng.standard_normal((64, 96)).astype(np.float32),
        GATE: rng.standard_normal((96, 64)).astype(np.float32),
        HEAD: rng.standard_normal((50, 64)).astype(np.float32),
        NORM: rng.uniform(0.5, 1.5, 64).astype(np.float32),
    }
    entries = [
        _safetensors_write.Entry(k, v.dtype, v.shape, lambda v=v: v) for k, v in tensors.items()
    ]
    _safetensors_write.write_file(src / "model.safetensors", entries, {"format": "pt"})
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (src / "tokenizer.json").write_text("{}")
    out = src.parent / "q"
    quantize_model(
        src, PrecisionPlan.uniform("int4", group_size=32, rules=RULES), out, progress=False
    )
    return out


@pytest.fixture
def ckpt(built: Path, tmp_path: Path) -> Path:
    """A fresh copy of the checkpoint to tamper with."""
    return Path(shutil.copytree(built, tmp_path / "q"))


def _manifest(out: Path) -> dict[str, Any]:
    return json.loads((out / "lowbit.json").read_text())


def _write(out: Path, doc: Any) -> None:
    (out / "lowbit.json").write_text(json.dumps(doc, indent=1))


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


def _offset(out: Path, key: str) -> int:
    return _safetensors.parse(out / "model.safetensors").tensors[key].offset


def _outcome(out: Path, verify: bool) -> str:
    """ "ok" after reading every tensor, or the LowbitError's message; any other exception
    propagates (and fails the test)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a manifest without checksums warns
        try:
            lowbit.load(out, verify=verify, progress=False)
        except LowbitError as exc:
            assert "\n" not in str(exc)
            return f"error: {exc}"
    return "ok"


# --------------------------------------------------------------------------- what is written


def test_manifest_records_every_file_and_itself(built: Path) -> None:
    """checksums has the size and sha256 of every file in the folder (the manifest excepted,
    the shard hashed while written equal to a fresh read); manifest_sha256 is its own digest."""
    doc = _manifest(built)
    files = sorted(
        p.relative_to(built).as_posix() for p in built.rglob("*") if p.name != "lowbit.json"
    )
    assert (
        sorted(doc["checksums"]) == files == ["config.json", "model.safetensors", "tokenizer.json"]
    )
    for rel, rec in doc["checksums"].items():
        data = (built / rel).read_bytes()
        assert rec == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert doc["manifest_sha256"] == manifest_digest(doc)
    assert doc["lowbit_version"] == lowbit.__version__
    want = {k: v for k, v in doc.items() if k != "manifest_sha256"}
    assert doc["manifest_sha256"] == hashlib.sha256(canonical_json(want)).hexdigest()


# ------------------------------------------------------------------------ tampered data files


@pytest.mark.parametrize(
    "key", [f"{Q}:codes", f"{Q}:scale", f"{UP}:zero_point", f"{DOWN}:scale_absmax"]
)
def test_flipped_byte_is_refused_and_loads_with_verify_false(ckpt: Path, key: str) -> None:
    """A flipped byte in codes, scales, zero points or second-level scales fails the shard's
    sha256; verify=False skips the hash and loads the changed values."""
    before = lowbit.load(ckpt, progress=False)
    _flip(ckpt / "model.safetensors", _offset(ckpt, key))
    with pytest.raises(LowbitError, match=r"model\.safetensors: its sha256 .* verify=False"):
        lowbit.load(ckpt)
    with pytest.raises(LowbitError, match="sha256"):
        LowbitCheckpoint(ckpt)
    after = lowbit.load(ckpt, verify=False, progress=False)
    name = key.split(":")[0]
    assert not np.array_equal(after[name], before[name])
    assert all(np.array_equal(after[n], before[n]) for n in before if n != name)


def test_sizes_are_checked_even_with_verify_false(ckpt: Path) -> None:
    """A shard or copied file one byte longer or shorter is refused without hashing."""
    with open(ckpt / "model.safetensors", "ab") as f:
        f.write(b"\0")
    with pytest.raises(
        LowbitError, match=r"shard model\.safetensors is .* bytes but the manifest records"
    ):
        lowbit.load(ckpt, verify=False)
    (ckpt / "config.json").write_text("{}")
    with pytest.raises(LowbitError, match=r"config\.json"):
        lowbit.load(ckpt, verify=False)


def test_copied_file_is_hashed(ckpt: Path) -> None:
    """A copied tokenizer file edited in place (same size) fails its sha256."""
    (ckpt / "tokenizer.json").write_text("[]")
    with pytest.raises(LowbitError, match=r"file tokenizer\.json: its sha256"):
        lowbit.load(ckpt)
    assert _outcome(ckpt, verify=False) == "ok"


def test_unrecorded_gguf_metadata_is_refused(ckpt: Path) -> None:
    """A source_metadata.gguf the manifest does not record (it would be read) is refused."""
    (ckpt / "source_metadata.gguf").write_bytes(b"GGUF")
    with pytest.raises(LowbitError, match="records no checksum"):
        lowbit.load(ckpt, verify=False)


# ------------------------------------------------------------------------ tampered manifests


def _edit(out: Path, fn: Callable[[dict[str, Any]], None], *, reseal: bool = False) -> None:
    """Edit the manifest; ``reseal`` recomputes its digest, as someone who rewrites the
    manifest on purpose would (then only the schema and the file checks stand)."""
    doc = _manifest(out)
    fn(doc)
    if reseal:
        doc["manifest_sha256"] = manifest_digest(doc)
    _write(out, doc)


def test_format_int4_to_nf4_is_refused(ckpt: Path) -> None:
    """int4 -> nf4 fits every size (both 4-bit, same scales): the manifest digest catches it."""
    _edit(ckpt, lambda d: d["tensors"][Q]["tensor"]["scheme"].update(format="nf4"))
    with pytest.raises(LowbitError, match="manifest_sha256 does not match"):
        lowbit.load(ckpt)
    with pytest.raises(LowbitError, match="manifest_sha256 does not match"):
        lowbit.load_model(ckpt)


@pytest.mark.parametrize("name", [Q, GATE])
def test_axis_change_is_refused(ckpt: Path, name: str) -> None:
    """Another axis: the digest with verify, the scale shape it makes without."""
    _edit(ckpt, lambda d: d["tensors"][name]["tensor"]["scheme"].update(axis=0 if name == Q else 1))
    with pytest.raises(LowbitError, match="manifest_sha256"):
        lowbit.load(ckpt)
    with pytest.raises(LowbitError, match=r"tensor\.scale_shape"):
        lowbit.load(ckpt, verify=False)
    _edit(ckpt, lambda d: None, reseal=True)
    with pytest.raises(LowbitError, match=r"tensor\.scale_shape"):
        lowbit.load(ckpt)


def test_shape_change_is_refused(ckpt: Path) -> None:
    """A shape of the same size ([32, 128] for [64, 64]) in the entry and the tensor
    metadata: its scales and arrays no longer fit the shard."""

    def reshape(d: dict[str, Any]) -> None:
        d["tensors"][Q]["shape"] = [32, 128]
        d["tensors"][Q]["tensor"]["shape"] = [32, 128]
        d["tensors"][Q]["tensor"]["scale_shape"] = [32, 4]

    _edit(ckpt, reshape)
    with pytest.raises(LowbitError, match="manifest_sha256"):
        lowbit.load(ckpt)
    with pytest.raises(LowbitError, match=r"stores .*:scale' as F32\[64, 2\] .* make F32\[32, 4\]"):
        lowbit.load(ckpt, verify=False)
    _edit(ckpt, lambda d: None, reseal=True)
    with pytest.raises(LowbitError, match=r"stores .*:scale' as F32\[64, 2\]"):
        lowbit.load(ckpt)
    _edit(ckpt, lambda d: d["tensors"][Q]["tensor"].update(shape=[64, 64]))
    with pytest.raises(LowbitError, match=r"tensor\.shape: \[64, 64\] is not the entry's"):
        lowbit.load(ckpt, verify=False)


@pytest.mark.parametrize("where", ["../other.safetensors", "ABS", "sub/../../other.safetensors"])
def test_files_outside_the_folder_are_refused(ckpt: Path, where: str) -> None:
    """A shard named by a path that leaves the folder is never opened, with or without
    verify, even when the file it names exists."""
    outside = ckpt.parent / "other.safetensors"
    shutil.copyfile(ckpt / "model.safetensors", outside)
    target = str(outside) if where == "ABS" else where

    def redirect(d: dict[str, Any]) -> None:
        d["files"] = [target]
        for e in d["tensors"].values():
            e["file"] = target
        d["checksums"][target] = d["checksums"].pop("model.safetensors")

    _edit(ckpt, redirect, reseal=True)
    for verify in (True, False):
        with pytest.raises(LowbitError, match=r"inside the checkpoint folder|relative path"):
            LowbitCheckpoint(ckpt, verify=verify)


def test_symlink_out_of_the_folder_is_refused(ckpt: Path) -> None:
    """A shard replaced by a symlink to a file outside the folder is refused."""
    outside = ckpt.parent / "other.safetensors"
    shutil.move(ckpt / "model.safetensors", outside)
    os.symlink(outside, ckpt / "model.safetensors")
    with pytest.raises(LowbitError, match="symlink that leads outside"):
        lowbit.load(ckpt, verify=False)
    (ckpt / "model.safetensors").unlink()
    (ckpt / "lowbit.json").rename(outside.parent / "elsewhere.json")
    os.symlink(outside.parent / "elsewhere.json", ckpt / "lowbit.json")
    with pytest.raises(LowbitError, match="not a regular file inside the checkpoint folder"):
        lowbit.load(ckpt)


def test_deleted_manifest_is_not_read_as_raw_codes(ckpt: Path) -> None:
    """Without lowbit.json neither the folder nor its shard loads as packed codes."""
    (ckpt / "lowbit.json").unlink()
    for target in (ckpt, ckpt / "model.safetensors"):
        with pytest.raises(LowbitError, match=r"written by lowbit .* no lowbit\.json"):
            lowbit.load(target)
        with pytest.raises(LowbitError, match=r"no lowbit\.json"):
            open_checkpoint(target)
    with pytest.raises(LowbitError, match="not a lowbit checkpoint"):
        LowbitCheckpoint(ckpt)


def test_shard_opened_directly_points_to_its_folder(ckpt: Path) -> None:
    """A shard of an intact checkpoint, opened on its own, names the folder to open instead."""
    with pytest.raises(LowbitError, match=r"a shard of the lowbit checkpoint .*open the folder"):
        open_checkpoint(ckpt / "model.safetensors")


@pytest.mark.parametrize("tensors", [[], {}])
def test_empty_tensor_list_is_refused(ckpt: Path, tensors: Any) -> None:
    """ "tensors": [] or {} is an error, not an empty dict of weights."""
    _edit(ckpt, lambda d: d.update(tensors=tensors), reseal=True)
    for verify in (True, False):
        with pytest.raises(LowbitError, match="tensors"):
            lowbit.load(ckpt, verify=verify)


def test_manifest_without_checksums(ckpt: Path) -> None:
    """A manifest without checksums (an older lowbit's, or stripped) is refused by default;
    verify=False reads it with a warning that nothing was checked."""

    def strip(d: dict[str, Any]) -> None:
        del d["checksums"], d["manifest_sha256"]

    _edit(ckpt, strip)
    with pytest.raises(LowbitError, match=r"no manifest_sha256 or checksums.*verify=False"):
        lowbit.load(ckpt)
    with pytest.warns(UserWarning, match="read unchecked"):
        assert len(lowbit.load(ckpt, verify=False, progress=False)) == 6


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        "null",
        '{"format": "lowbit-checkpoint", "format": "lowbit-checkpoint"}',
        "[" * 5000 + "]" * 5000,
        '{"version": ' + "9" * 5000 + "}",
        '{"a": ' + '{"a": ' * 100 + "1" + "}" * 101,
        "NaN",
    ],
    ids=["empty", "truncated", "list", "null", "duplicate", "deep", "huge-int", "nested", "nan"],
)
def test_malformed_json_is_refused(ckpt: Path, text: str) -> None:
    """Not-JSON, not an object, duplicate keys, nesting 5,000 deep, 5,000-digit integers."""
    (ckpt / "lowbit.json").write_text(text)
    for verify in (True, False):
        with pytest.raises(LowbitError, match=r"lowbit\.json"):
            lowbit.load(ckpt, verify=verify)


def test_invalid_utf8_manifest_is_refused(ckpt: Path) -> None:
    (ckpt / "lowbit.json").write_bytes(b'{"format": "\xff"}')
    with pytest.raises(LowbitError, match="not valid JSON"):
        lowbit.load(ckpt)


# ------------------------------------------------------------ structured manifest mutations

_HUGE, _DEEP = "\0HUGE", "\0DEEP"  # replaced by raw JSON text: a 5,000-digit int, 1,000-deep list
_VALUES: list[Any] = [None, True, -1, 2**64, 1.5, "x", "../x", [], {}, [[1]], _HUGE, _DEEP]

# Deleting one of these keys still leaves a loadable manifest (with verify=False); so does
# deleting any scheme key but "format" (Scheme.from_dict has defaults).
_OPTIONAL = {"totals", "checksums", "manifest_sha256", "label", "activations", "rule", "default",
             "rules"}  # fmt: skip

_PATHS: list[tuple[Any, ...]] = [
    ("format",), ("version",), ("lowbit_version",), ("source",), ("source", "format"),
    ("source", "path"), ("plan",), ("plan", "default"), ("plan", "rules"), ("config",),
    ("totals",), ("files",), ("files", 0), ("tensors",), ("checksums",),
    ("checksums", "model.safetensors"), ("checksums", "model.safetensors", "size"),
    ("checksums", "model.safetensors", "sha256"), ("manifest_sha256",),
    *[("tensors", Q, k) for k in ("kind", "file", "shape", "source_dtype", "label", "tensor",
                                  "arrays", "activations")],
    ("tensors", Q, "shape", 0), ("tensors", Q, "arrays", 0),
    *[("tensors", Q, "tensor", k) for k in ("version", "shape", "scale_shape", "scheme")],
    *[("tensors", Q, "tensor", "scheme", k) for k in ("format", "granularity", "axis",
                                                      "group_size", "scale_method", "percentile",
                                                      "symmetric", "scale_format", "rounding",
                                                      "pad", "version")],
    ("tensors", DOWN, "tensor", "scheme", "double_quant"),
    ("tensors", UP, "tensor", "scheme", "symmetric"),
    *[("tensors", NORM, k) for k in ("kind", "file", "shape", "dtype", "encoding")],
    ("tensors", HEAD, "dtype"),
]  # fmt: skip


def _set(doc: Any, path: tuple[Any, ...], value: Any, delete: bool = False) -> None:
    for p in path[:-1]:
        doc = doc[p]
    if delete:
        del doc[path[-1]]
    else:
        doc[path[-1]] = value


def _dump(doc: Any) -> str:
    text = json.dumps(doc, indent=1)
    return text.replace(json.dumps(_HUGE), "7" * 5000).replace(
        json.dumps(_DEEP), "[" * 1000 + "]" * 1000
    )


def _mutations(doc: dict[str, Any], path: tuple[Any, ...]) -> Iterator[tuple[str, str, bool]]:
    """(label, manifest text, changed) for deleting the key at ``path`` and for setting it
    to each of the wrong values."""
    d = copy.deepcopy(doc)
    _set(d, path, None, delete=True)
    yield "delete", _dump(d), True
    for v in _VALUES:
        d = copy.deepcopy(doc)
        _set(d, path, v)
        old = doc
        for p in path:
            old = old[p]
        yield f"= {v!r}", _dump(d), v != old or type(v) is not type(old)


@pytest.mark.parametrize("path", _PATHS, ids=lambda p: ".".join(str(x)[-14:] for x in p))
def test_structured_manifest_mutations(ckpt: Path, path: tuple[Any, ...]) -> None:
    """Deleting or retyping any key (null, bool, negative, 2^64, float, strings, lists,
    objects, a 5,000-digit integer, a 1,000-deep list) is a LowbitError or a clean load, never
    another exception; with verify every change is refused; without it, deleting a required
    key is refused naming it."""
    doc = _manifest(ckpt)
    for label, text, changed in _mutations(doc, path):
        (ckpt / "lowbit.json").write_text(text)
        got = _outcome(ckpt, verify=True)
        assert got.startswith("error") == changed, (label, got)
        got = _outcome(ckpt, verify=False)
        key = next(p for p in reversed(path) if isinstance(p, str))  # the field, not an index
        optional = path[-1] in _OPTIONAL or (path[-2:-1] == ("scheme",) and path[-1] != "format")
        if label == "delete" and not optional:
            assert got.startswith("error") and key in got, (label, got)


def _all_paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(doc, dict):
        items: Any = doc.items()
    elif isinstance(doc, list):
        items = enumerate(doc)
    else:
        return
    for k, v in items:
        yield (*prefix, k)
        yield from _all_paths(v, (*prefix, k))


@pytest.fixture(scope="module")
def paths(built: Path) -> list[tuple[Any, ...]]:
    return sorted(_all_paths(_manifest(built)), key=repr)


@settings(
    max_examples=150,
    derandomize=True,  # CI sees the same cases; make fuzz explores
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_random_manifest_mutations(built: Path, tmp_path: Path, paths: list, data: Any) -> None:
    """Any key of the manifest deleted or replaced by any JSON value, one to three times:
    only LowbitError or a clean load of every tensor, with verify on and off; with verify,
    any change of the content is refused."""
    out = tmp_path / "q"
    if not out.exists():
        shutil.copytree(built, out)
    doc = _manifest(built)
    mutated = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        path = data.draw(st.sampled_from(paths), label="path")
        try:
            if data.draw(st.booleans(), label="delete"):
                _set(mutated, path, None, delete=True)
            else:
                _set(mutated, path, data.draw(json_values, label="value"))
        except (KeyError, IndexError, TypeError):  # an earlier edit removed or retyped a parent
            continue
    (out / "lowbit.json").write_text(json.dumps(mutated))
    changed = canonical_json(mutated) != canonical_json(doc)
    assert _outcome(out, verify=True).startswith("error") == changed
    _outcome(out, verify=False)
