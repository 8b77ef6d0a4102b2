"""Coverage-guided fuzzing (atheris, libFuzzer) of one of lowbit's parsers of a user's file.

    PYTHONPATH=src python fuzz/atheris_fuzz.py gguf -max_total_time=60 [CORPUS_DIR ...]

Targets: ``safetensors``, ``gguf``, ``manifest`` (lowbit.json), ``plan`` (plan files),
``ct`` (a compressed-tensors folder's config.json), ``regex`` (plan rules of hostile regexes,
applied to long names), ``results`` (--eval / --sensitivity documents), ``explore`` (explorer
API requests: the first byte picks the endpoint, the rest is the query string), and issue
41's ``hf_config``, ``tokenizer``, ``imatrix``, ``gguf_family``, ``transform`` and ``moe``
(``tests/fuzz_round3.py``). Each
input runs through everything lowbit does with such a file (``tests/fuzz_strategies.py``'s
``exercise_*``); a ``LowbitError`` is the expected refusal, any other exception a crash, which
libFuzzer saves as ``crash-*`` and reports. The run starts from generated valid files (written
to the first corpus folder, or a temporary one) and mixes libFuzzer's byte mutations with the
structure-aware ones (JSON values swapped for hostile ones, lying lengths). Needs
``pip install atheris`` (``make fuzz`` installs it).
"""

from __future__ import annotations

import random
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

with atheris.instrument_imports():
    import fuzz_round3 as fr
    import fuzz_strategies as fs
    import lowbit._json
    import lowbit._regex
    import lowbit.checkpoints.compressed_tensors.layout
    import lowbit.checkpoints.compressed_tensors.reader
    import lowbit.checkpoints.compressed_tensors.transforms
    import lowbit.checkpoints.config_checks
    import lowbit.checkpoints.gguf.convert
    import lowbit.checkpoints.gguf.imatrix
    import lowbit.checkpoints.gguf.tokenizer
    import lowbit.checkpoints.gguf.writer
    import lowbit.checkpoints.io.gguf_file
    import lowbit.checkpoints.io.safetensors
    import lowbit.checkpoints.lowbit_format.checkpoint
    import lowbit.checkpoints.readers
    import lowbit.checkpoints.shape_checks
    import lowbit.cli._explore_server
    import lowbit.evaluation.sensitivity_result
    import lowbit.plans.plan  # noqa: F401
    from lowbit.errors import LowbitError

TARGETS = ("safetensors", "gguf", "manifest", "plan", "ct", "regex", "results", "explore",
           *fr.TARGETS)  # fmt: skip
_JSON3 = ("hf_config", "tokenizer", "transform", "moe")
_ENDPOINTS = ("show", "decode", "values", "compare", "range")
_SHM = Path("/dev/shm") if Path("/dev/shm").is_dir() else None


def _moe_seed(data: bytes) -> str:
    """The mixture folder a MoE config belongs with (by its model_type)."""
    text = data[:4096].decode("utf-8", "replace")
    return next((n for n, t in (("tiny-qwen2moe", "qwen2_moe"), ("tiny-qwen3moe", "qwen3_moe"))
                 if t in text), "tiny-mixtral")  # fmt: skip


def _seeds(target: str, manifest: str, ct_bases: dict[str, bytes], seeds3: Any) -> list[bytes]:
    rnd = random.Random(0)
    if target in fr.TARGETS:
        return [fr.mutant(target, seeds3, random.Random(i))[0] for i in range(16)]
    if target == "safetensors":
        return [fs.random_safetensors(rnd) for _ in range(16)]
    if target == "gguf":
        return [fs.gguf_model(), *(fs.random_gguf(rnd) for _ in range(15))]
    if target == "manifest":
        return [manifest.encode()]
    if target == "ct":
        return [ct_bases["config.json"]]
    if target == "regex":
        return [fs.hostile_plan_text(rnd).encode("utf-8", "surrogatepass") for _ in range(8)]
    if target == "results":
        return [fs.sensitivity_text(rnd).encode("utf-8", "surrogatepass") for _ in range(8)]
    if target == "explore":
        out = []
        for _ in range(16):
            path, query = fs.explorer_request(rnd)
            name = path.removeprefix("/api/")
            k = _ENDPOINTS.index(name) if name in _ENDPOINTS else 5
            out.append(bytes([k]) + query.encode("utf-8", "surrogatepass"))
        return out
    return [fs.random_plan_text(rnd).encode("utf-8", "surrogatepass") for _ in range(16)]


def _mutate3(data: bytes, rnd: random.Random) -> bytes:
    """A round-3 mutation of a JSON document or a GGUF (bytes mutations when it is neither)."""
    import json

    if data[:4] == b"GGUF":
        try:
            return fr.gguf_family_mutant(fr.GGUFSeed(data), rnd)
        except Exception:  # not a whole GGUF any more: mutate its bytes
            return fs.mutate_bytes(data, rnd)
    try:
        return fr.doc_mutant(json.loads(data), rnd)
    except Exception:  # not JSON any more (or not encodable back)
        return fs.mutate_bytes(data, rnd)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(TARGETS)}}} [libFuzzer options] [CORPUS]")
    target = sys.argv.pop(1)
    warnings.simplefilter("ignore")
    work = Path(tempfile.mkdtemp(prefix=f"lowbit-fuzz-{target}-", dir=_SHM))
    folder = work / "ckpt"
    manifest = fs.make_manifest_folder(folder).decode()
    ct_folder = work / "ct"
    ct_bases = fs.make_ct_folder(ct_folder) if target == "ct" else {}
    ct_originals = {p.name: p.read_bytes() for p in ct_folder.glob("*") if p.is_file()}
    seeds3 = fr.Seeds(work / "round3") if target in fr.TARGETS else None
    corpus = [a for a in sys.argv[1:] if not a.startswith("-")]
    seed_dir = Path(corpus[0]) if corpus else Path(tempfile.mkdtemp(dir=_SHM))
    if not corpus:
        sys.argv.append(str(seed_dir))
    seed_dir.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(_seeds(target, manifest, ct_bases, seeds3)):
        (seed_dir / f"seed-{i}").write_bytes(seed)

    def one_input(data: bytes) -> None:
        try:
            if target in fr.TARGETS:
                fr.run(target, data, seeds3, _moe_seed(data))
            elif target == "safetensors":
                fs.exercise_safetensors(data, work)
            elif target == "gguf":
                fs.exercise_gguf(data, work)
            elif target == "manifest":
                fs.exercise_manifest(data, folder)
            elif target == "ct":
                fs.exercise_ct("config.json", data, ct_folder, ct_originals)
            elif target == "regex":
                fs.exercise_plan_matching(data, work)
            elif target == "results":
                fs.exercise_result_files(data, work)
            elif target == "explore":
                name = _ENDPOINTS[data[0] % 6] if data and data[0] % 6 < 5 else "nope"
                fs.exercise_explorer("/api/" + name, data[1:].decode("utf-8", "replace"))
            else:
                fs.exercise_plan(data, work, ".yaml" if data[:1] == b"#" else ".json")
        except LowbitError:
            pass

    def mutate(data: bytes, max_size: int, seed: int) -> bytes:
        rnd = random.Random(seed)
        if rnd.random() < 0.5:
            return atheris.Mutate(data, max_size)
        if target in fr.TARGETS:
            return _mutate3(data, rnd)[:max_size]
        if target in ("manifest", "plan", "ct", "regex", "results") or (
            target == "safetensors" and rnd.random() < 0.5
        ):
            text = data.decode("utf-8", errors="replace")
            if target == "safetensors" and len(data) >= 8:
                hlen = int.from_bytes(data[:8], "little")
                body = data[8 : 8 + hlen].decode("utf-8", errors="replace")
                out = fs.safetensors_bytes(fs.mutate_json_text(body, rnd), data[8 + hlen :])
            else:
                out = fs.mutate_json_text(text, rnd).encode("utf-8", "surrogatepass")
        else:
            out = fs.mutate_bytes(data, rnd)
        return out[:max_size]

    atheris.Setup(sys.argv, one_input, custom_mutator=mutate)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
