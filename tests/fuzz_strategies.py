"""Byte builders and structure-aware fuzz strategies for lowbit's file parsers.

The builders write files byte by byte (no ``gguf``/``safetensors`` package), so a test can put
any lie in them: a GGUF value of the wrong type, a length past the end, arrays nested 900 deep.
The strategies build valid-ish files (safetensors, GGUF, lowbit.json, plan files) and then
mutate them: truncation, byte flips, lying lengths, wrong types, deep nesting, huge integers,
duplicate names. ``fuzz/`` drives the same generators with a ``random.Random`` for long runs.
"""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

# ----------------------------------------------------------------------------- GGUF bytes

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FMT = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?",
        U64: "Q", I64: "q", F64: "d"}  # fmt: skip
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0 = 0, 1, 2, 8
_GGML_SIZE = {GGML_F32: (1, 4), GGML_F16: (1, 2), GGML_Q4_0: (32, 18), GGML_Q8_0: (32, 34)}


def gguf_str(s: str | bytes) -> bytes:
    raw = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def gguf_value(vtype: int, value: Any) -> bytes:
    """A value's bytes after its type: a scalar, a string, or ``(element type, items)``."""
    if vtype in _FMT:
        return struct.pack("<" + _FMT[vtype], value)
    if vtype == STRING:
        return gguf_str(value)
    if isinstance(value, bytes):  # an array already encoded (gguf_nested)
        return value
    etype, items = value
    return struct.pack("<IQ", etype, len(items)) + b"".join(gguf_value(etype, v) for v in items)


def gguf_nested(depth: int) -> tuple[int, bytes]:
    """An array nesting ``depth`` arrays, the innermost empty: ``(ARRAY, encoded value)``
    (built without recursion: 900 levels is a test case)."""
    value = struct.pack("<IQ", U8, 0)
    for _ in range(depth - 1):
        value = struct.pack("<IQ", ARRAY, 1) + value
    return ARRAY, value


def gguf_bytes(
    kvs: list[tuple[str, int, Any]],
    tensors: list[tuple[str, list[int], int, int]] = (),  # type: ignore[assignment]
    data: bytes = b"",
    *,
    version: int = 3,
    alignment: int = 32,
) -> bytes:
    """A GGUF file: key/values ``(key, type, value)``, tensor infos ``(name, ggml dims
    innermost first, ggml type, offset in the data section)`` and the data section."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)))
    for key, vtype, value in kvs:
        out += gguf_str(key) + struct.pack("<I", vtype) + gguf_value(vtype, value)
    for name, dims, ttype, offset in tensors:
        out += gguf_str(name) + struct.pack("<I", len(dims))
        out += struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", ttype, offset)
    out += bytes(-len(out) % alignment)
    return bytes(out + data)


def llama_kvs(arch: str | bytes = "llama") -> list[tuple[str, int, Any]]:
    """The metadata of a small llama GGUF, every key lowbit reads of the right type."""
    tokens = ["<s>", "</s>", "a", "b", "ab"]
    return [
        ("general.architecture", STRING, arch),
        ("general.name", STRING, "fuzz"),
        ("llama.block_count", U32, 1),
        ("llama.context_length", U32, 64),
        ("llama.embedding_length", U32, 32),
        ("llama.feed_forward_length", U32, 64),
        ("llama.attention.head_count", U32, 4),
        ("llama.attention.head_count_kv", U32, 2),
        ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        ("llama.rope.freq_base", F32, 10000.0),
        ("tokenizer.ggml.model", STRING, "gpt2"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        ("tokenizer.ggml.token_type", ARRAY, (I32, [3, 3, 1, 1, 1])),
        ("tokenizer.ggml.merges", ARRAY, (STRING, ["a b"])),
        ("tokenizer.ggml.bos_token_id", U32, 0),
        ("tokenizer.ggml.eos_token_id", U32, 1),
    ]


def gguf_model(
    kvs: list[tuple[str, int, Any]] | None = None,
    shapes: list[tuple[str, list[int], int]] | None = None,
    seed: int = 0,
) -> bytes:
    """A GGUF with tensors ``(name, ggml dims, ggml type)`` laid out 32-aligned, random bytes
    (Q8_0/Q4_0 scales are float16 bytes, any value is fine for parsing)."""
    rng = random.Random(seed)
    shapes = shapes or [
        ("token_embd.weight", [32, 5], GGML_Q8_0),
        ("output_norm.weight", [32], GGML_F32),
        ("blk.0.attn_q.weight", [32, 32], GGML_Q4_0),
    ]
    infos, data = [], bytearray()
    for name, dims, ttype in shapes:
        block, size = _GGML_SIZE[ttype]
        n = 1
        for d in dims:
            n *= d
        nbytes = n // block * size
        infos.append((name, dims, ttype, len(data)))
        chunk = bytearray(rng.randbytes(nbytes))
        if ttype in (GGML_F32, GGML_F16):  # finite values: a small float pattern
            chunk = bytearray(bytes(nbytes))
        data += chunk + bytes(-nbytes % 32)
    return gguf_bytes(llama_kvs() if kvs is None else kvs, infos, bytes(data))


# ---------------------------------------------------------------------- safetensors bytes


def safetensors_bytes(header: dict[str, Any] | bytes | str, data: bytes = b"") -> bytes:
    """A safetensors file of a header (a dict, or its JSON text as is) and a data section."""
    if isinstance(header, dict):
        header = json.dumps(header)
    raw = header.encode("utf-8") if isinstance(header, str) else header
    return struct.pack("<Q", len(raw)) + raw + data


_ST_SIZES = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "U8": 1, "F8_E4M3": 1, "I32": 4}


def safetensors_model(shapes: dict[str, tuple[str, list[int]]], seed: int = 0) -> bytes:
    """A valid safetensors file of ``name: (dtype, shape)`` with random data bytes."""
    rng = random.Random(seed)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in shapes.items():
        n = _ST_SIZES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    return safetensors_bytes(header, rng.randbytes(offset))


# ------------------------------------------------------------------------------ mutations

INTERESTING_U64 = [0, 1, 7, 8, 31, 32, 255, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62,
                   2**63 - 1, 2**63, 2**64 - 1]  # fmt: skip
HOSTILE_JSON = [
    "[" * 1000 + "]" * 1000,
    "{" + '"a":{' * 900 + "}" * 901,
    "9" * 5000,
    "-" + "9" * 4400,
    "1e999999",
    str(2**64),
    str(2**63),
    "-1",
    "1.5",
    "true",
    "null",
    '"x"',
    "[]",
    "{}",
    "[0, 18446744073709551615]",
    "[" + ", ".join(["9223372036854775808"] * 2) + "]",
    "[" + ", ".join(["0"] * 70) + "]",
    "[" + ", ".join(["1"] * 65) + "]",
    "[0, 9223372036854775808]",
    "[0, 4611686018427387904, 4]",
]


def mutate_bytes(data: bytes, rnd: random.Random) -> bytes:
    """One to four byte-level mutations of ``data``: truncate, flip, insert, delete, splice a
    lying little-endian integer, or duplicate a slice."""
    out = bytearray(data)
    for _ in range(rnd.randint(1, 4)):
        kind = rnd.randrange(7)
        pos = rnd.randrange(len(out) + 1)
        if kind == 0 and out:
            del out[rnd.randrange(len(out)) :]
        elif kind == 1 and out:
            i = rnd.randrange(len(out))
            out[i] ^= 1 << rnd.randrange(8)
        elif kind == 2:
            out[pos:pos] = rnd.randbytes(rnd.randint(1, 8))
        elif kind == 3 and out:
            del out[pos : pos + rnd.randint(1, 16)]
        elif kind == 4:
            width = rnd.choice((4, 8))
            value = rnd.choice(INTERESTING_U64) % (1 << (8 * width))
            out[pos : pos + width] = value.to_bytes(width, "little")
        elif kind == 5 and out:
            i = rnd.randrange(len(out))
            out[pos:pos] = out[i : i + rnd.randint(1, 64)]
        else:
            if out:
                out[rnd.randrange(len(out))] = rnd.randrange(256)
    return bytes(out)


def mutate_json_text(text: str, rnd: random.Random) -> str:
    """Swap one JSON value for a hostile one (deep nesting, huge ints, wrong types), duplicate
    a key, or fall back to a byte mutation."""
    kind = rnd.randrange(4)
    if kind == 0:  # replace a number, string or bracket by a hostile value
        starts = [i for i, c in enumerate(text) if c in '0123456789"[{tfn-']
        if starts:
            i = rnd.choice(starts)
            j = _value_end(text, i)
            return text[:i] + rnd.choice(HOSTILE_JSON) + text[j:]
    if kind == 1:  # duplicate the first key of some object
        opens = [i for i, c in enumerate(text) if c == "{" and text[i + 1 : i + 2] == '"']
        if opens:
            i = rnd.choice(opens)
            j = text.find(",", i)
            k = text.find("}", i)
            end = min(x for x in (j, k) if x != -1) if max(j, k) != -1 else -1
            if end != -1:
                return text[: i + 1] + text[i + 1 : end] + "," + text[i + 1 :]
    if kind == 2:  # wrap the whole document deep
        depth = rnd.choice((2, 63, 64, 65, 200, 1500))
        return "[" * depth + text + "]" * depth
    return mutate_bytes(text.encode("utf-8"), rnd).decode("utf-8", errors="replace")


def _value_end(text: str, i: int) -> int:
    """End index of the JSON scalar or bracketed value starting at ``i`` (best effort)."""
    c = text[i]
    if c == '"':
        j = i + 1
        while j < len(text) and text[j] != '"':
            j += 2 if text[j] == "\\" else 1
        return min(j + 1, len(text))
    if c in "[{":
        depth, j = 0, i
        while j < len(text):
            if text[j] in "[{":
                depth += 1
            elif text[j] in "]}":
                depth -= 1
                if depth == 0:
                    return j + 1
            elif text[j] == '"':
                j = _value_end(text, j) - 1
            j += 1
        return len(text)
    j = i + 1
    while j < len(text) and text[j] not in ",]} \n":
        j += 1
    return j


# ------------------------------------------------------------------ random valid-ish files


def random_safetensors(rnd: random.Random) -> bytes:
    """A valid safetensors file of 0-5 small tensors, sometimes scalars or empty ones."""
    shapes = {}
    for i in range(rnd.randint(0, 5)):
        rank = rnd.randint(0, 3)
        shape = [rnd.choice((0, 1, 2, 3, 4)) for _ in range(rank)]
        shapes[f"t{i}.weight"] = (rnd.choice(list(_ST_SIZES)), shape)
    return safetensors_model(shapes, seed=rnd.randrange(2**32))


def random_safetensors_mutant(rnd: random.Random) -> bytes:
    base = random_safetensors(rnd)
    if rnd.random() < 0.15:
        return base
    if rnd.random() < 0.5:  # mutate the header as JSON, keep the data
        (hlen,) = struct.unpack("<Q", base[:8])
        text = mutate_json_text(base[8 : 8 + hlen].decode(), rnd)
        return safetensors_bytes(text, base[8 + hlen :])
    return mutate_bytes(base, rnd)


def _random_kv(rnd: random.Random, key: str) -> tuple[str, int, Any]:
    vtype = rnd.choice([*_FMT, STRING, ARRAY])
    if vtype == STRING:
        return key, STRING, rnd.choice(["x", "", "llama", b"\xff\xfe", "é" * 3])
    if vtype == ARRAY:
        etype = rnd.choice([*_FMT, STRING, ARRAY])
        if etype == ARRAY:
            return key, *gguf_nested(rnd.choice((1, 2, 4, 5, 900)))
        n = rnd.randint(0, 6)
        if etype == STRING:
            return key, ARRAY, (STRING, ["t"] * n)
        return key, ARRAY, (etype, [_scalar(etype, rnd) for _ in range(n)])
    return key, vtype, _scalar(vtype, rnd)


def _scalar(vtype: int, rnd: random.Random) -> Any:
    if vtype in (F32, F64):
        return rnd.choice((0.0, 1e-5, -3.5, float("inf")))
    if vtype == BOOL:
        return rnd.random() < 0.5
    bits = struct.calcsize(_FMT[vtype]) * 8
    signed = _FMT[vtype].islower()
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    return rnd.choice((lo, hi, 0, 1, min(hi, 5)))


_USED_KEYS = [k for k, _, _ in llama_kvs()] + ["general.alignment"]


def random_gguf(rnd: random.Random) -> bytes:
    """A small llama GGUF, some keys re-typed at random (used keys included), some tensors
    of odd shapes (zero-sized, no dims, a dim of 2**63)."""
    kvs = llama_kvs()
    for _ in range(rnd.randint(0, 3)):
        i = rnd.randrange(len(kvs))
        kvs[i] = _random_kv(rnd, kvs[i][0])
    if rnd.random() < 0.3:
        kvs.append(_random_kv(rnd, rnd.choice([*_USED_KEYS, "x.extra"])))
        seen: set[str] = set()
        kvs = [kv for kv in kvs if not (kv[0] in seen or seen.add(kv[0]))]  # type: ignore[func-returns-value]
    shapes = [("output_norm.weight", [32], GGML_F32), ("blk.0.w", [32, 2], GGML_Q8_0)]
    if rnd.random() < 0.3:
        odd = rnd.choice(([], [0], [32, 0], [0, 2**63], [64, 2**62]))
        shapes.append(("odd", odd, rnd.choice((GGML_F32, GGML_Q4_0))))
    try:
        return gguf_model(kvs, shapes, seed=rnd.randrange(2**32))
    except (struct.error, OverflowError):  # a dim too large to lay out: header only
        return gguf_bytes(kvs, [(n, d, t, 0) for n, d, t in shapes])


def random_gguf_mutant(rnd: random.Random) -> bytes:
    base = random_gguf(rnd)
    return base if rnd.random() < 0.25 else mutate_bytes(base, rnd)


def random_plan(rnd: random.Random) -> dict[str, Any]:
    """A plan document (``PrecisionPlan.from_dict``), valid or nearly."""
    rules = []
    for _ in range(rnd.randint(0, 4)):
        rule: dict[str, Any] = rnd.choice(
            [{"match": "*.weight"}, {"regex": ".*attn.*"}, {"component": "mlp"}, {"ndim": 2}]
        )
        rule["format"] = rnd.choice(
            ["int4:g128", "nf4:dq", "keep", "fp8_e4m3:ch", "int8", "bf16", "mxfp4",
             {"format": "int4", "group_size": 32, "version": 1}, 7]
        )  # fmt: skip
        if rnd.random() < 0.2:
            rule[rnd.choice(["scale_method", "activations", "pad"])] = rnd.choice(
                ["mse", "fp8", False, None]
            )
        rules.append(rule)
    doc: dict[str, Any] = {"rules": rules, "default": rnd.choice(["int4", "keep", "nf4:g64"])}
    if rnd.random() < 0.2:
        doc["version"] = rnd.choice([1, 2, "1"])
    return doc


def random_plan_text(rnd: random.Random) -> str:
    text = json.dumps(random_plan(rnd))
    return text if rnd.random() < 0.2 else mutate_json_text(text, rnd)


# --------------------------------------------------------------------- hypothesis adapters

seeds = st.integers(0, 2**32 - 1)
safetensors_files = seeds.map(lambda s: random_safetensors_mutant(random.Random(s)))
gguf_files = seeds.map(lambda s: random_gguf_mutant(random.Random(s)))
plan_texts = seeds.map(lambda s: random_plan_text(random.Random(s)))


def json_mutants(text: str) -> st.SearchStrategy[str]:
    """Mutants of one JSON document (a manifest)."""
    return seeds.map(lambda s: mutate_json_text(text, random.Random(s)))


# ------------------------------------------------------------------------ fuzz targets
# Each runs one input through everything lowbit does with such a file; the property under
# test is that it returns or raises LowbitError, nothing else.


def exercise_safetensors(data: bytes, folder: Path) -> None:
    """Open a safetensors file, read every tensor, count it for the planner."""
    from lowbit.checkpoints import open_checkpoint
    from lowbit.planning.archs import spec_from_checkpoint

    path = folder / "fuzz.safetensors"
    path.write_bytes(data)
    with open_checkpoint(path) as ckpt:
        for name in ckpt.names():
            ckpt.get(name)
    spec_from_checkpoint(path)


def exercise_gguf(data: bytes, folder: Path) -> None:
    """Open a GGUF, read every tensor and the derived config, count it for the planner, and
    copy its metadata into a new GGUF, which must read back with the same metadata."""
    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.gguf.writer import write_gguf
    from lowbit.checkpoints.io import gguf_file as _gguf
    from lowbit.planning.archs import spec_from_checkpoint

    path = folder / "fuzz.gguf"
    path.write_bytes(data)
    with open_checkpoint(path) as ckpt:
        for name in ckpt.names():
            ckpt.get(name)
        metadata = dict(ckpt.metadata)
    spec_from_checkpoint(path)
    out = write_gguf(folder / "copy.gguf", {}, source=path, overwrite=True, progress=False)
    copied = _gguf.parse(out).metadata
    # keys the writer sets itself (lowbit.writer marks an output lowbit wrote)
    for key in ("general.alignment", "general.file_type", "general.quantization_version",
                "lowbit.writer"):  # fmt: skip
        metadata.pop(key, None)
        copied.pop(key, None)
    assert _same(copied, metadata), "metadata changed in the copy"


def _same(a: Any, b: Any) -> bool:
    """Equality that holds NaN equal to itself (a copied NaN is still the same value)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (a != a and b != b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def exercise_manifest(text: bytes, folder: Path) -> None:
    """Open a lowbit checkpoint folder whose lowbit.json is ``text`` and read every tensor."""
    from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint

    (folder / "lowbit.json").write_bytes(text)
    ckpt = LowbitCheckpoint(folder, verify=False)  # hashes would refuse every mutant first
    for name in ckpt.names():
        ckpt.get(name)
    ckpt.close()


def exercise_plan(text: bytes, folder: Path, suffix: str = ".json") -> None:
    """Read a plan file (JSON, or YAML with ``suffix=".yaml"``)."""
    from lowbit.plans.plan import PrecisionPlan

    path = folder / f"plan{suffix}"
    path.write_bytes(text)
    PrecisionPlan.from_file(path)


def make_manifest_folder(folder: Path) -> bytes:
    """A small lowbit checkpoint (int4, nf4, kept and cast tensors) in ``folder``; returns its
    lowbit.json bytes (the fuzz base)."""
    import numpy as np

    from lowbit.checkpoints.streaming import quantize_model
    from lowbit.plans.plan import PrecisionPlan

    rng = np.random.default_rng(0)
    src = folder.parent / f"{folder.name}-src.safetensors"
    shapes = {"a.weight": ("F32", [4, 64]), "b.weight": ("F32", [2, 32]), "norm": ("F32", [8])}
    data = safetensors_model(shapes)
    floats = rng.standard_normal(len(data) // 4 + 1).astype("<f4").tobytes()
    hlen = struct.unpack("<Q", data[:8])[0]
    src.write_bytes(data[: 8 + hlen] + floats[: len(data) - 8 - hlen])
    doc = {"rules": [{"match": "b.*", "format": "nf4:g32"}], "default": "int4:g32"}
    quantize_model(src, PrecisionPlan.from_dict(doc), folder, overwrite=True, progress=False)
    # the same bytes wherever the folder is: the source path is the only thing that varies
    text = (folder / "lowbit.json").read_text().replace(str(src), "model.safetensors")
    (folder / "lowbit.json").write_text(text)
    return text.encode()


# ------------------------------------------------- issue 24: compressed-tensors folders,
# plan-file regexes, --eval/--sensitivity documents, explorer requests

HOSTILE_REGEXES = [
    "(.*.*)*z", "(a+)+$", "(a|a)*b", "(?=x)x", r"(a)\1", "a{1000}{1000}", "[", "x" * 2000,
    ".*" * 40 + "z", "(?i)A", r"\bq", "9" * 5000,
]  # fmt: skip


def hostile_plan_text(rnd: random.Random) -> str:
    """A plan whose rules carry hostile regexes, globs and many rules."""
    rules: list[dict[str, Any]] = []
    for _ in range(rnd.choice([1, 3, 200])):
        key = rnd.choice(["regex", "match"])
        pattern = rnd.choice([*HOSTILE_REGEXES, "*" * 50 + "q", "*a*a*a*a*a*b", "[!x]*"])
        rules.append({key: ("re:" + pattern) if key == "match" and rnd.random() < 0.3
                      else pattern, "format": "int4"})  # fmt: skip
    text = json.dumps({"default": "int8", "rules": rules})
    return text if rnd.random() < 0.5 else mutate_json_text(text, rnd)


def exercise_plan_matching(text: bytes, folder: Path) -> None:
    """Read a plan file and decide a few long tensor names with it (its regexes run)."""
    import warnings

    from lowbit.plans.plan import PrecisionPlan

    path = folder / "plan.json"
    path.write_bytes(text)
    plan = PrecisionPlan.from_file(path)
    names = ["model.layers.0.mlp.up_proj.weight", "a" * 3000 + "!", "x" * 200 + "z"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan.apply([(n, (32, 32), "F32", 4096) for n in names])


def make_ct_folder(folder: Path) -> dict[str, bytes]:
    """A small compressed-tensors folder (int4 groups, asymmetric int8 channels, fp8, a bias
    and a norm) in ``folder``; returns its config.json and index bytes, the fuzz bases."""
    import numpy as np

    import lowbit
    from lowbit.checkpoints.compressed_tensors.tensor import from_quantized
    from lowbit.checkpoints.compressed_tensors.writer import write_compressed_tensors
    from lowbit.quant.scheme_text import parse_scheme

    rng = np.random.default_rng(0)
    tensors: dict[str, Any] = {}
    for i, s in enumerate(["int4:g32", "int8:ch:asym", "fp8_e4m3:ch"]):
        w = rng.standard_normal((8, 64)).astype(np.float32)
        tensors[f"model.layers.0.l{i}.weight"] = from_quantized(lowbit.quantize(w, parse_scheme(s)))
        tensors[f"model.layers.0.l{i}.bias"] = rng.standard_normal(8).astype(np.float32)
    tensors["model.norm.weight"] = np.ones(64, np.float32)
    write_compressed_tensors(folder, tensors, {"model_type": "llama"}, max_shard_size=700,
                             overwrite=True, progress=False)  # fmt: skip
    index = folder / "model.safetensors.index.json"
    assert index.is_file(), "the fuzz base is sharded, so its index is fuzzed too"
    return {"config.json": (folder / "config.json").read_bytes(), index.name: index.read_bytes()}


def ct_mutant(rnd: random.Random, bases: dict[str, bytes], folder: Path) -> tuple[str, bytes]:
    """One file of the folder and its mutated bytes: config.json (hostile targets too), the
    shard index, or a shard."""
    which = rnd.choice(["config.json", "config.json", "model.safetensors.index.json", "shard"])
    if which == "shard":
        shards = sorted(p.name for p in folder.glob("*.safetensors"))
        name = rnd.choice(shards)
        return name, mutate_bytes((folder / name).read_bytes(), rnd)
    text = bases[which].decode()
    if which == "config.json" and rnd.random() < 0.3:
        doc = json.loads(text)
        group = next(iter(doc["quantization_config"]["config_groups"].values()))
        group["targets"] = ["re:" + rnd.choice(HOSTILE_REGEXES), *group["targets"]]
        text = json.dumps(doc)
    return which, mutate_json_text(text, rnd).encode("utf-8", "surrogatepass")


def exercise_ct(name: str, data: bytes, folder: Path, originals: dict[str, bytes]) -> None:
    """Replace one file of the compressed-tensors folder, then open it, read every tensor and
    verify it; the file is put back afterwards."""
    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.verify import verify_checkpoint

    path = folder / name
    try:
        path.write_bytes(data)
        with open_checkpoint(folder) as ckpt:
            for n in ckpt.names():
                ckpt.get(n)
        verify_checkpoint(folder)
    finally:
        path.write_bytes(originals[name])


def sensitivity_text(rnd: random.Random) -> str:
    """A ``lowbit sensitivity --json`` document, valid or mutated."""
    entries = [
        {"tensor": f"w{i}", "scheme": rnd.choice(["int4", "int8", "nf4"]), "numel": 256,
         "bits": rnd.choice([1024, 2048, 0]), "proxy": rnd.random(),
         "damage": rnd.choice([None, 0.5])}
        for i in range(rnd.randint(0, 4))
    ]  # fmt: skip
    doc = {"version": 1, "model": "m", "kind": "causal", "measure": "proxy", "metric": "kl",
           "proxy": "input", "calibration": "c", "schemes": ["int4", "int8"], "seconds": {},
           "entries": entries}  # fmt: skip
    text = json.dumps(doc)
    return text if rnd.random() < 0.2 else mutate_json_text(text, rnd)


def exercise_result_files(text: bytes, folder: Path) -> None:
    """Read a --sensitivity document as lowbit plan/report do, and render it as --eval."""
    from lowbit import _json
    from lowbit.evaluation.sensitivity_result import SensitivityResult
    from lowbit.view.html import _evaluation

    path = folder / "result.json"
    path.write_bytes(text)
    doc = _json.load(path)
    _evaluation(doc)
    SensitivityResult.from_dict(doc)


_QUERY_VALUES = ["1", "0.3952", "-0", "nan", "1e999999/3", "9" * 900, "0x1p-3", "", "a", "1/0",
                 "fp4", "e4m3,e5m2", "all", "int8:t", "int4:g" + "9" * 30, "normal", "/etc/passwd",
                 "65536", "2001", "2", "0b1111", "x" * 5000]  # fmt: skip


def explorer_request(rnd: random.Random) -> tuple[str, str]:
    """A request path and query string for the explorer's API, valid or hostile."""
    path = "/api/" + rnd.choice(["show", "decode", "values", "compare", "range", "nope"])
    keys = ["value", "formats", "format", "code", "data", "size", "group", "lo", "hi", "n",
            "rounding", "saturate"]  # fmt: skip
    parts = [f"{rnd.choice(keys)}={rnd.choice(_QUERY_VALUES)}" for _ in range(rnd.randint(0, 5))]
    query = "&".join(parts)
    if rnd.random() < 0.2:
        query = mutate_json_text(query, rnd) if query else "%ff%00&&=="
    return path, query


def exercise_explorer(path: str, query: str) -> None:
    """One explorer API request: an answer or a LowbitError."""
    from lowbit.cli._explore_server import api

    api(path, query)
