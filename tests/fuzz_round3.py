"""Fuzz targets of issue 41's parsers: seeds, structure-aware mutants and ``exercise_*`` runs.

Six targets, each a file a user hands lowbit, mutated from valid seeds (bit flips, truncation,
values of another JSON or GGUF type, huge and negative numbers, NaN and infinities, deep
nesting, long strings) and run through what lowbit does with it; the property is that it
returns or raises ``LowbitError``, nothing else:

- ``hf_config``: a Hugging Face ``config.json`` of each family lowbit converts, through the
  HF -> GGUF converter's config path (checks, tensor sources, rope factors, hyperparameter keys,
  the GGUF writer's typed and packed metadata);
- ``tokenizer``: ``tokenizer.json`` -> the GGUF vocabulary (tokens, types, merges, special ids);
- ``imatrix``: importance matrices in llama.cpp's GGUF format and the legacy ``.dat``;
- ``gguf_family``: a GGUF of each family, its metadata mutated, -> model config -> model;
- ``transform``: a compressed-tensors ``transform_config`` -> online rotations, matched and built;
- ``moe``: a mixture's ``config.json`` (Mixtral, Qwen2-MoE, Qwen3-MoE) -> planner and model.

Seeds are tiny (hidden 16, 2 layers, 64 tokens): made once per process by :class:`Seeds`.
``tests/checkpoints/test_fuzz_round3.py`` runs a fixed slice; ``fuzz/structured.py`` long runs.
"""

from __future__ import annotations

import copy
import json
import math
import random
import struct
from pathlib import Path
from typing import Any

import fuzz_strategies as fs

TARGETS = ("hf_config", "tokenizer", "imatrix", "gguf_family", "transform", "moe")

_MAKE_TINY = Path(__file__).resolve().parent / "fixtures/llamacpp/convert/make_tiny.py"
_SMALL = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
          "num_attention_heads": 2, "num_key_value_heads": 1}  # fmt: skip

# ------------------------------------------------------------------------- JSON mutation

HOSTILE_VALUES: list[Any] = [
    0, -1, 1, 2, 3, 7, 2**31, 2**32, 2**63, 2**64, 10**9, 10**30, -(2**63), 1.5, -0.0, 1e308,
    math.nan, math.inf, -math.inf, True, False, None, "", "x", "1e-5", "x" * 70_000, [], [1],
    [1.0] * 5, [math.nan], {}, {"a": 1}, [[[[[]]]]], ["re:(a+)+$"],
]  # fmt: skip


def _hostile(rnd: random.Random) -> Any:
    """A fresh copy of a hostile value (a shared list could be made to contain itself)."""
    return copy.deepcopy(rnd.choice(HOSTILE_VALUES))


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def _paths(doc: Any, prefix: tuple[Any, ...] = (), out: list | None = None) -> list:
    """Every (container path) of a JSON document, breadth bounded (dicts and short lists)."""
    out = [] if out is None else out
    if len(prefix) > 12:
        return out
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.append((*prefix, k))
            _paths(v, (*prefix, k), out)
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:8]):
            out.append((*prefix, i))
            _paths(v, (*prefix, i), out)
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        doc = doc[p]
    return doc


def mutate_doc(doc: Any, rnd: random.Random, keys: tuple[str, ...] = ()) -> Any:
    """One to three structure-aware changes of a JSON document (a deep copy): a value
    replaced by a hostile one, a number scaled, a key removed, a key of ``keys`` added with
    a hostile value, a list truncated or extended, a value nested deep."""
    doc = json.loads(json.dumps(doc))
    for _ in range(rnd.randint(1, 3)):
        paths = _paths(doc)
        kind = rnd.randrange(6)
        if kind == 0 and keys and isinstance(doc, dict):
            doc[rnd.choice(keys)] = _hostile(rnd)
            continue
        if not paths:
            return _hostile(rnd)
        path = rnd.choice(paths)
        parent, last = _get(doc, path[:-1]), path[-1]
        value = parent[last]
        if kind == 1 and isinstance(value, (int, float)) and not isinstance(value, bool):
            parent[last] = rnd.choice([value * 2, value + 1, value - 1, -value, value * 10**6,
                                       value / 3, float(value), 0])  # fmt: skip
        elif kind == 2 and isinstance(parent, dict):
            del parent[last]
        elif kind == 3 and isinstance(value, list):
            parent[last] = (
                value[: rnd.randrange(len(value) + 1)]
                if value and rnd.random() < 0.5
                else value + value[:1] * rnd.choice([1, 3, 5000])
            )
        elif kind == 4:
            parent[last] = _nested(rnd.choice([50, 600]))
        else:
            parent[last] = _hostile(rnd)
    return doc


_MAX_MUTANT = 8_000_000


def doc_mutant(doc: Any, rnd: random.Random, keys: tuple[str, ...] = ()) -> bytes:
    """A mutated document's bytes: mostly structure-aware, sometimes text-level (duplicate
    keys, deep wrapping, byte flips: ``fuzz_strategies.mutate_json_text``)."""
    if rnd.random() < 0.75:
        text = json.dumps(mutate_doc(doc, rnd, keys))
        if len(text) > _MAX_MUTANT:  # repeated repetitions reached 350 MB: cut (still hostile)
            text = text[:_MAX_MUTANT]
    else:
        text = fs.mutate_json_text(json.dumps(doc), rnd)
    return text.encode("utf-8", "surrogatepass")


# --------------------------------------------------------------------------------- seeds


def _tiny_configs() -> tuple[dict[str, dict[str, Any]], Any]:
    """make_tiny.py's configs (the converter fixtures') shrunk, and its tensor builder."""
    src = _MAKE_TINY.read_text().split("\nout, tokdir")[0]
    ns: dict[str, Any] = {}
    exec(compile(src, str(_MAKE_TINY), "exec"), ns)
    out = {}
    for name, cfg in ns["CONFIGS"].items():
        cfg = {**cfg, **_SMALL}
        if "head_dim" in cfg:
            cfg["head_dim"] = 8
        for k, v in (("moe_intermediate_size", 8), ("shared_expert_intermediate_size", 16)):
            if k in cfg:
                cfg[k] = v
        rs = cfg.get("rope_scaling")
        if isinstance(rs, dict) and "long_factor" in rs:  # head 8: 4 rotary pairs
            cfg["rope_scaling"] = {**rs, "long_factor": rs["long_factor"][:4],
                                   "short_factor": rs["short_factor"][:4]}  # fmt: skip
        out[name] = cfg
    return out, ns["tensors"]


class Seeds:
    """The seed files of every target, made once in ``folder`` (a tmpfs folder is best)."""

    def __init__(self, folder: Path) -> None:
        import numpy as np
        from safetensors.numpy import save_file

        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        configs, tensors = _tiny_configs()
        self.configs = configs
        self.shapes: dict[str, dict[str, tuple[int, ...]]] = {}
        self.hf_folders: dict[str, Path] = {}
        for i, (name, cfg) in enumerate(configs.items()):
            arrays = tensors(name, cfg, np.random.default_rng(i))
            self.shapes[cfg["model_type"]] = {k: tuple(v.shape) for k, v in arrays.items()}
            d = folder / "hf" / name
            d.mkdir(parents=True, exist_ok=True)
            save_file({k: np.asarray(v, np.float32) for k, v in arrays.items()},
                      str(d / "model.safetensors"))  # fmt: skip
            (d / "config.json").write_text(json.dumps(cfg))
            vocab = {f"t{i}": i for i in range(cfg["vocab_size"])}  # Gemma 3 counts its rows
            (d / "tokenizer.json").write_text(
                json.dumps({"model": {"type": "BPE", "vocab": vocab, "merges": []}})
            )
            self.hf_folders[name] = d
        self.tokenizers = _tokenizer_seeds()
        self.imatrix = _imatrix_seeds(folder / "im")
        self.gguf = {name: _gguf_seed(self, name) for name in configs if "defaults" not in name}
        self.ct_folder = folder / "ct"
        fs.make_ct_folder(self.ct_folder)
        self.ct_config = json.loads((self.ct_folder / "config.json").read_text())
        self.ct_original = (self.ct_folder / "config.json").read_bytes()
        self.ct_config["quantization_config"]["transform_config"] = _transform_seed()


def _tokenizer_seeds() -> list[dict[str, Any]]:
    """Small byte-level BPE tokenizer.json documents: GPT-2's bytes, a few merges, added
    special and plain tokens, SmolLM2's pre-tokenizer, decoder and post-processor shapes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from lowbit.checkpoints.gguf._pretokenizers import PRE_TOKENIZERS

    byte_chars = [chr(c) for c in range(33, 127)] + [chr(c) for c in range(161, 173)]
    byte_chars += [chr(c) for c in range(174, 256)] + [chr(256 + i) for i in range(68)]
    vocab = {c: i for i, c in enumerate(byte_chars)}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    out = []
    for pre in ("smollm", "gpt-2"):
        tok = Tokenizer(models.BPE(vocab=dict(vocab), merges=list(merges)))
        from tokenizers import Regex

        splits = [pre_tokenizers.Split(Regex(e), behavior="isolated") for e in PRE_TOKENIZERS[pre]]
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens(["<|endoftext|>", "<|im_start|>"])
        tok.add_tokens(["<tool>"])
        out.append(json.loads(tok.to_str()))
    return out


def _imatrix_seeds(folder: Path) -> list[bytes]:
    """An importance matrix in llama.cpp's GGUF format (a plain entry and a stack of three
    experts) and the same in the legacy ``.dat`` format."""
    import numpy as np

    from lowbit.checkpoints.gguf.imatrix import write_imatrix

    folder.mkdir(parents=True, exist_ok=True)
    sums = {"blk.0.attn_q.weight": np.arange(1, 17, dtype=np.float32),
            "blk.0.ffn_up_exps.weight": np.ones((3, 8), np.float32)}  # fmt: skip
    counts = {"blk.0.attn_q.weight": np.float32([4]),
              "blk.0.ffn_up_exps.weight": np.float32([2, 0, 1])}  # fmt: skip
    p = write_imatrix(folder / "seed.gguf", sums, counts, datasets=["t"], chunk_count=2,
                      chunk_size=8, overwrite=True)  # fmt: skip
    dat = struct.pack("<i", 2)
    for name, vals, ncall in (("blk.0.attn_q.weight", sums["blk.0.attn_q.weight"], 4),
                              ("output.weight", np.full(8, 3.0, np.float32), 1)):  # fmt: skip
        raw = name.encode()
        dat += struct.pack("<i", len(raw)) + raw + struct.pack("<ii", ncall, vals.size)
        dat += vals.astype("<f4").tobytes()
    dat += struct.pack("<i", 2)  # llama.cpp appends the chunk count
    return [p.read_bytes(), dat]


def _transform_seed() -> dict[str, Any]:
    """A transform_config as lowbit writes it (a hadamard ``v`` group on the q/k/v layers),
    with an offline entry and a ``re:`` target."""
    from lowbit.checkpoints.compressed_tensors.transforms import transform_entries

    layers = {f"model.layers.0.l{i}": 64 for i in range(3)}
    tc, _ = transform_entries(layers, lambda names: sorted(names))
    group = next(iter(tc["config_groups"].values()))
    group["apply"][0]["targets"] = [*group["apply"][0]["targets"], "re:.*l[0-2]$"]
    group["head_dim"] = 32
    return tc


# ----------------------------------------------------------------------- GGUF assembly


def _walk_kv(data: bytes) -> tuple[list[tuple[str, int, bytes]], int, int]:
    """A GGUF's key/values (key, type, payload), its tensor count and where they end."""
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    pos = 24
    kvs = []
    for _ in range(n_kv):
        (klen,) = struct.unpack_from("<Q", data, pos)
        key = data[pos + 8 : pos + 8 + klen].decode()
        pos += 8 + klen
        (vtype,) = struct.unpack_from("<I", data, pos)
        pos += 4
        end = _skip(data, pos, vtype)
        kvs.append((key, vtype, data[pos:end]))
        pos = end
    return kvs, n_tensors, pos


def _skip(data: bytes, pos: int, vtype: int) -> int:
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    if vtype in sizes:
        return pos + sizes[vtype]
    if vtype == fs.STRING:
        return pos + 8 + struct.unpack_from("<Q", data, pos)[0]
    etype, n = struct.unpack_from("<IQ", data, pos)
    pos += 12
    for _ in range(n):
        pos = _skip(data, pos, etype)
    return pos


def _tensor_infos_end(data: bytes, pos: int, n_tensors: int) -> int:
    for _ in range(n_tensors):
        (nlen,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + nlen
        (nd,) = struct.unpack_from("<I", data, pos)
        pos += 4 + 8 * nd + 12
    return pos


class GGUFSeed:
    """A GGUF split into its key/values, tensor infos and data, reassembled after a change."""

    def __init__(self, data: bytes) -> None:
        self.kvs, self.n_tensors, kv_end = _walk_kv(data)
        info_end = _tensor_infos_end(data, kv_end, self.n_tensors)
        self.infos = data[kv_end:info_end]
        self.data = data[info_end + (-info_end % 32) :]

    def assemble(self, kvs: list[tuple[str, int, bytes]]) -> bytes:
        out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, self.n_tensors, len(kvs)))
        for key, vtype, payload in kvs:
            out += fs.gguf_str(key) + struct.pack("<I", vtype) + payload
        out += self.infos
        out += bytes(-len(out) % 32)
        return bytes(out + self.data)


def _gguf_seed(seeds: Seeds, name: str) -> GGUFSeed:
    """The GGUF the converter's config path makes of a tiny family (zero weights, no vocabulary),
    written by lowbit's GGUF writer."""
    import numpy as np

    from lowbit.checkpoints.gguf import writer as gguf_writer
    from lowbit.checkpoints.gguf.writer import GGUFTensor

    cfg = seeds.configs[name]
    fam, metadata, shapes = hf_metadata_without_vocab(cfg, seeds.shapes[cfg["model_type"]],
                                                      seeds.hf_folders[name])  # fmt: skip
    # zero weights; rope factor tensors (Llama 3, Phi-3) must be positive
    tensors = {n: GGUFTensor(np.full(s, float(n.startswith("rope_")), np.float32), "F32")
               for n, s in shapes.items()}  # fmt: skip
    path = seeds.folder / "gguf" / f"{name}.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    gguf_writer.write_gguf(path, tensors, metadata=metadata, arch=fam.arch, overwrite=True,
                           progress=False)  # fmt: skip
    return GGUFSeed(path.read_bytes())


_GGUF_HOSTILE: list[tuple[int, Any]] = [
    (fs.U32, 0), (fs.U32, 1), (fs.U32, 3), (fs.U32, 2**32 - 1), (fs.I32, -1), (fs.I32, 7),
    (fs.U64, 2**63), (fs.U64, 10**9), (fs.F32, math.nan), (fs.F32, math.inf), (fs.F32, -1.0),
    (fs.F32, 0.0), (fs.F64, 1e300), (fs.BOOL, True), (fs.STRING, "yarn"), (fs.STRING, "x" * 5000),
    (fs.STRING, "linear"), (fs.ARRAY, (fs.U32, [])), (fs.ARRAY, (fs.U32, [2, 0, 5])),
    (fs.ARRAY, (fs.F32, [math.nan, 1.0])), (fs.ARRAY, (fs.STRING, ["a", "b"])),
    (fs.ARRAY, (fs.I32, [1] * 3000)),
]  # fmt: skip
_GGUF_EXTRA = ("expert_count", "expert_used_count", "expert_feed_forward_length",
               "expert_shared_feed_forward_length", "rope.scaling.type", "rope.scaling.factor",
               "rope.scaling.original_context_length", "rope.dimension_count",
               "attention.sliding_window", "attn_logit_softcapping", "final_logit_softcapping",
               "attention.key_length", "attention.value_length", "expert_gating_func",
               "expert_weights_norm", "rope.scaling.attn_factor", "vocab_size",
               "rope.scaling.yarn_beta_fast")  # fmt: skip


def gguf_family_mutant(seed: GGUFSeed, rnd: random.Random) -> bytes:
    """A family GGUF with one to three metadata values changed (a hostile value of any type,
    a key removed, a family key added), or its bytes mutated."""
    if rnd.random() < 0.1:
        return fs.mutate_bytes(seed.assemble(seed.kvs), rnd)
    kvs = list(seed.kvs)
    arch = next(bytes(p[8:]).decode() for k, _, p in kvs if k == "general.architecture")
    for _ in range(rnd.randint(1, 3)):
        kind = rnd.randrange(4)
        vtype, value = rnd.choice(_GGUF_HOSTILE)
        payload = fs.gguf_value(vtype, value)
        if kind == 0 and len(kvs) > 1:
            del kvs[rnd.randrange(1, len(kvs))]
        elif kind == 1:
            kvs.append((f"{arch}.{rnd.choice(_GGUF_EXTRA)}", vtype, payload))
        else:
            i = rnd.randrange(1, len(kvs))
            kvs[i] = (kvs[i][0], vtype, payload)
    return seed.assemble(kvs)


# --------------------------------------------------------------------------- exercises


class _HFStub:
    """What the converter's config path asks of a Hugging Face checkpoint: path, config,
    tensor names and shapes (the weights are not read)."""

    format = "safetensors"

    def __init__(self, folder: Path, config: Any, shapes: dict[str, tuple[int, ...]]) -> None:
        from lowbit.checkpoints.readers import TensorInfo

        self.path = folder
        self.config = config
        self._infos = {n: TensorInfo(n, s, "F32", 4 * math.prod(s), folder, 0)
                       for n, s in shapes.items()}  # fmt: skip

    def names(self) -> list[str]:
        return list(self._infos)

    def info(self, name: str) -> Any:
        return self._infos[name]

    def close(self) -> None:
        pass


def hf_metadata_without_vocab(
    cfg: Any, shapes: dict[str, tuple[int, ...]], folder: Path
) -> tuple[Any, dict[str, Any], dict[str, tuple[int, ...]]]:
    """The converter's family, typed metadata (no ``tokenizer.*`` keys) and GGUF tensor shapes
    for a config and tensor shapes: ``convert.hf_metadata``'s config half."""
    import gguf

    from lowbit.checkpoints.gguf import convert
    from lowbit.checkpoints.gguf.hf_config import converter_config
    from lowbit.checkpoints.gguf.hf_view import _keep_plan
    from lowbit.checkpoints.gguf.hparams import add_hparams

    stub = _HFStub(folder, cfg, shapes)
    fam = convert.hf_family(stub)
    convert.check_hf_config(stub)
    applied = _keep_plan().apply(
        [(n, s, "F32", 4 * math.prod(s), None) for n, s in shapes.items()], source="fuzz"
    )
    srcs = convert._sources(stub, applied, fam)
    out_shapes = {n: convert._shape(s) for n, s in srcs.items()}
    for s in srcs.values():
        convert._gguf_type(s)
    w = gguf.GGUFWriter(path=None, arch=fam.arch)
    add_hparams(w, fam, converter_config(cfg))
    kv = {k: convert._packed(v) for k, v in w.kv_data[0].items()}
    kv.pop("general.architecture", None)
    return fam, kv, out_shapes


def exercise_hf_config(data: bytes, seeds: Seeds) -> None:
    """config.json -> the converter's checks, sources, rope factors and hyperparameter keys ->
    the GGUF writer's typed, range-checked and encoded metadata."""
    import numpy as np

    from lowbit.checkpoints.gguf import writer as gguf_writer
    from lowbit.checkpoints.gguf.writer import GGUFTensor
    from lowbit.checkpoints.readers import read_config

    folder = seeds.folder / "hfcfg"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_bytes(data)
    (folder / "tokenizer.json").write_bytes(
        (seeds.hf_folders["tiny-llama"] / "tokenizer.json").read_bytes()
    )
    cfg = read_config(folder / "config.json")
    mt = cfg.get("model_type") if isinstance(cfg, dict) else None
    shapes = seeds.shapes.get(mt if isinstance(mt, str) else "", seeds.shapes["llama"])
    fam, metadata, out_shapes = hf_metadata_without_vocab(cfg, shapes, folder)
    planned = {n: gguf_writer._plan(n, GGUFTensor(np.broadcast_to(np.float32(0), s), "F32"))
               for n, s in out_shapes.items()}  # fmt: skip
    arch, typed = gguf_writer.header_fields(planned, metadata=metadata, arch=fam.arch)
    gguf_writer.encoded_fields(arch, typed)


def exercise_tokenizer(data: bytes, seeds: Seeds) -> None:
    """tokenizer.json -> the GGUF vocabulary (tokens, types, pre-tokenizer, merges) and the
    ``tokenizer.*`` keys with special ids. Past the pre-tokenizer check (which the small seeds
    fail: their check hash is no model's), the rest runs again as if it had passed."""
    import gguf

    from lowbit.checkpoints.gguf import tokenizer as tk
    from lowbit.errors import LowbitError

    folder = seeds.folder / "tok"
    folder.mkdir(exist_ok=True)
    (folder / "tokenizer.json").write_bytes(data)
    tk._parsed.cache_clear()
    try:
        tk.check_hf_tokenizer(folder)
    except LowbitError as exc:
        if "pre-tokenizer" not in str(exc):
            raise
    real = tk.pre_tokenizer_name
    tk.pre_tokenizer_name = lambda _tok: "gpt-2"
    try:
        w = gguf.GGUFWriter(path=None, arch="llama")
        tk.add_hf_vocab(w, folder, None)
    finally:
        tk.pre_tokenizer_name = real


def exercise_imatrix(data: bytes, seeds: Seeds) -> None:
    """An importance-matrix file (GGUF or .dat) read as llama-quantize reads it."""
    from lowbit.checkpoints.gguf.imatrix import read_imatrix

    path = seeds.folder / "im" / "fuzz.imatrix"
    path.write_bytes(data)
    read_imatrix(path)


def exercise_gguf_family(data: bytes, seeds: Seeds) -> None:
    """A family GGUF -> its derived config -> the planner's count -> the model built from it
    (transformers, zero weights: the allocation is what is bounded)."""
    from lowbit.checkpoints import open_checkpoint
    from lowbit.models.build import build_model
    from lowbit.planning.archs import spec_from_checkpoint

    path = seeds.folder / "gguf" / "fuzz.gguf"
    path.write_bytes(data)
    spec_from_checkpoint(path)
    with open_checkpoint(path) as ckpt:
        build_model(ckpt, progress=False)


def exercise_transform(data: bytes, seeds: Seeds) -> None:
    """A compressed-tensors config.json with a transform_config: the folder opened and
    verified (each transform's stored matrix checked), and every transform matched against
    layer names and built for a 64-wide layer."""
    from lowbit import _json
    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.compressed_tensors.transforms import input_transforms, transform_matrix
    from lowbit.checkpoints.verify import verify_checkpoint
    from lowbit.errors import LowbitError

    path = seeds.ct_folder / "config.json"
    try:
        path.write_bytes(data)
        with open_checkpoint(seeds.ct_folder) as ckpt:
            ckpt.names()
        verify_checkpoint(seeds.ct_folder, hashes=False)
    finally:
        path.write_bytes(seeds.ct_original)
    doc = _json.loads(data, "config.json")
    qc = doc.get("quantization_config") if isinstance(doc, dict) else None
    if not isinstance(qc, dict):
        raise LowbitError("no quantization_config")
    layers = [f"model.layers.{i}.self_attn.{p}" for i in range(3) for p in "qkv"]
    layers += ["a" * 3000, "model.layers.0.l1"]
    for t in input_transforms(qc, "config.json"):
        for name in layers:
            if t.matches(name, ("Linear", "Module")):
                transform_matrix(t, name, 64, None)


_MOE_KEYS = ("num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
             "shared_expert_intermediate_size", "n_group", "topk_group", "norm_topk_prob",
             "decoder_sparse_step", "mlp_only_layers", "n_routed_experts", "router_aux_loss_coef",
             "output_router_logits", "first_k_dense_replace", "n_shared_experts")  # fmt: skip
MOE_SEEDS = ("tiny-mixtral", "tiny-qwen2moe", "tiny-qwen3moe")


def exercise_moe(data: bytes, seeds: Seeds, name: str) -> None:
    """A mixture's folder with this config.json -> the planner's count and the model built
    (the same tiny weights for every config)."""
    from lowbit.checkpoints import open_checkpoint
    from lowbit.models.build import build_model
    from lowbit.planning.archs import spec_from_checkpoint

    folder = seeds.hf_folders[name]
    path = folder / "config.json"
    original = json.dumps(seeds.configs[name]).encode()
    try:
        path.write_bytes(data)
        spec_from_checkpoint(folder)
        with open_checkpoint(folder) as ckpt:
            build_model(ckpt, progress=False)
    finally:
        path.write_bytes(original)


def mutant(target: str, seeds: Seeds, rnd: random.Random) -> tuple[bytes, str]:
    """One input of ``target`` and the seed it came from."""
    if target == "hf_config":
        name = rnd.choice(list(seeds.configs))
        return doc_mutant(seeds.configs[name], rnd, tuple(fs_keys())), name
    if target == "tokenizer":
        doc = rnd.choice(seeds.tokenizers)
        return doc_mutant(doc, rnd, _TOKENIZER_KEYS), "tokenizer"
    if target == "imatrix":
        raw = rnd.choice(seeds.imatrix)
        if raw[:4] == b"GGUF" and rnd.random() < 0.5:
            return gguf_family_mutant(GGUFSeed(raw), rnd), "imatrix.gguf"
        return fs.mutate_bytes(raw, rnd), "imatrix"
    if target == "gguf_family":
        name = rnd.choice(list(seeds.gguf))
        return gguf_family_mutant(seeds.gguf[name], rnd), name
    if target == "transform":
        doc = json.loads(json.dumps(seeds.ct_config))
        tc = mutate_doc(doc["quantization_config"]["transform_config"], rnd, _TRANSFORM_KEYS)
        doc["quantization_config"]["transform_config"] = tc
        text = json.dumps(doc) if rnd.random() < 0.9 else fs.mutate_json_text(json.dumps(doc), rnd)
        # cut as doc_mutant cuts (a list repeated 5,000 times inside one repeated 5,000 times
        # made a 2.25 GB document at seed 4141, input 65,986: the harness's memory, not lowbit's)
        return text[:_MAX_MUTANT].encode("utf-8", "surrogatepass"), "transform"
    name = rnd.choice(MOE_SEEDS)
    return doc_mutant(seeds.configs[name], rnd, _MOE_KEYS), name


def fs_keys() -> list[str]:
    from lowbit.checkpoints.config_checks import FIELDS

    return [*FIELDS, "rope_scaling", "rope_parameters", "model_type", "tie_word_embeddings"]


_TOKENIZER_KEYS = ("normalizer", "pre_tokenizer", "decoder", "post_processor", "added_tokens",
                   "model", "truncation", "padding")  # fmt: skip
_TRANSFORM_KEYS = ("config_groups", "v", "w")


def run(target: str, data: bytes, seeds: Seeds, seed_name: str) -> None:
    """Run one input of ``target`` (``seed_name`` from :func:`mutant`)."""
    if target == "hf_config":
        exercise_hf_config(data, seeds)
    elif target == "tokenizer":
        exercise_tokenizer(data, seeds)
    elif target == "imatrix":
        exercise_imatrix(data, seeds)
    elif target == "gguf_family":
        exercise_gguf_family(data, seeds)
    elif target == "transform":
        exercise_transform(data, seeds)
    else:
        exercise_moe(data, seeds, seed_name if seed_name in MOE_SEEDS else MOE_SEEDS[0])
