"""GGUF quality as llama.cpp measures it: ``llama-perplexity --kl-divergence`` of llama-quantize's
files and lowbit's against the unquantized model, on text the calibration never saw.

Not part of ``make bench`` or ``make test``: it needs llama.cpp's tools, built from the
llama-cpp-python source distribution (which vendors llama.cpp; about 25 minutes on 2 cores)::

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/lcpp
    tar xzf /tmp/lcpp/llama_cpp_python-0.3.36.tar.gz -C /tmp/lcpp
    cd /tmp/lcpp/llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF
    cmake --build build -j2 --target llama-quantize llama-perplexity llama-imatrix

    python benchmarks/gguf_kld.py --llamacpp /tmp/lcpp/.../vendor/llama.cpp/build/bin

What it does, on the shipped SmolLM2-135M (its Q4_1 GGUF decoded to an all-F32 GGUF: the
reference every file is compared with), or on ``--model`` (e.g. SmolLM2 widened to whole K-quant
super-blocks by ``benchmarks/pad_llama.py``):

1. Text: the default text (``pydoc_data.topics``) tokenized by SmolLM2's tokenizer; the
   evaluation text is its start (the tokens ``lowbit eval`` scores), the calibration text starts
   at token 32,768 (where ``lowbit quantize --method gptq`` and ``lowbit imatrix`` take theirs).
   Both are written as text files and llama.cpp tokenizes them itself.
2. ``llama-imatrix`` on the calibration text: the importance matrix both tools use.
3. llama-quantize writes Q4_0, Q4_K_M and Q4_K_M with the importance matrix; lowbit writes the
   same three from the same F32 GGUF (their tensor bytes are compared: byte-identical or not),
   then its own: any ``--lowbit NAME='ARGS'`` given (e.g. GPTQ onto the K-quant grids, a
   budget mix at the Q4_K_M + imatrix file's bytes).
4. ``llama-perplexity --kl-divergence`` of every file against the F32 reference's logits:
   mean KLD, 99.9 % KLD, same top token, perplexity, and the file's bytes.

On CPUs with AMX pass ``--no-repack`` (added to llama-perplexity and llama-imatrix), or they
crash. The table goes to stdout as markdown (``--json``: JSON).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _machine import cpu

EVAL_AT, CALIB_AT = 0, 32768  # token offsets of the two slices (lowbit's defaults)


def _run(cmd: list[str], log: Path) -> tuple[str, float]:
    """Run ``cmd``; its stdout+stderr go to ``log`` and are returned with the wall time."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t0
    log.write_text(" ".join(shlex.quote(c) for c in cmd) + "\n" + proc.stdout)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-15:])
        raise SystemExit(f"{cmd[0]} failed ({proc.returncode}); see {log}\n{tail}")
    return proc.stdout, wall


def texts(work: Path, eval_tokens: int, calib_tokens: int) -> tuple[Path, Path]:
    """The evaluation and calibration text files, cut from the default text at token offsets."""
    from lowbit.calibration.text import default_text
    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.shipped import default_model_path
    from lowbit.checkpoints.tokenizer import build_tokenizer

    _, text = default_text()
    with open_checkpoint(default_model_path("smollm2")) as ck:
        tok = build_tokenizer(ck)
    enc = tok.backend_tokenizer.encode(text, add_special_tokens=False)
    offsets = enc.offsets

    def cut(start: int, n: int) -> str:
        end = min(start + n, len(offsets)) - 1
        return text[offsets[start][0] : offsets[end][1]]

    ev, ca = work / "eval.txt", work / "calib.txt"
    ev.write_text(cut(EVAL_AT, eval_tokens))
    ca.write_text(cut(CALIB_AT, calib_tokens))
    return ev, ca


def lowbit(args: list[str], log: Path) -> float:
    cmd = [sys.executable, "-m", "lowbit.cli", "quantize", *args, "--no-progress", "--overwrite"]
    return _run(cmd, log)[1]


def tensor_digest(path: Path) -> dict[str, str]:
    """Each tensor's type and the sha256 of its bytes (metadata aside)."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    return {
        t.name: f"{t.tensor_type.name}:{hashlib.sha256(bytes(t.data)).hexdigest()[:16]}"
        for t in r.tensors
    }


_KLD = {
    "ppl": r"Mean PPL\(Q\)\s*:\s*([\d.]+)",
    "mean_kld": r"Mean\s+KLD:\s*([\d.eE+-]+)",
    "kld_99_9": r"99\.9%\s+KLD:\s*([\d.eE+-]+)",
    "same_top": r"Same top p:\s*([\d.]+)",
}


def kld(
    tools: Path, model: Path, base_logits: Path, extra: list[str], log: Path, reuse: bool = False
) -> dict:
    if reuse and log.exists() and log.stat().st_mtime > model.stat().st_mtime:
        out, wall = log.read_text(), float("nan")  # an earlier run's measurement of this file
        if re.search(_KLD["mean_kld"], out):
            return _kld_row(out, wall)
    out, wall = _run(
        [str(tools / "llama-perplexity"), "-m", str(model), "--kl-divergence-base",
         str(base_logits), "--kl-divergence", "-t", str(os.cpu_count() or 1), *extra],
        log,
    )  # fmt: skip
    return _kld_row(out, wall)


def _kld_row(out: str, wall: float) -> dict:
    row: dict = {"seconds": round(wall, 1)}
    for key, pat in _KLD.items():
        m = re.search(pat, out)
        row[key] = float(m.group(1)) if m else None
    return row


def lowbit_ppl(path: Path, text: str, n_ctx: int, llamacpp: bool = False) -> float:
    """Perplexity of a GGUF as ``lowbit`` computes it, by llama-perplexity's protocol: the
    text tokenized whole (BOS first where the GGUF asks for it), cut into chunks of ``n_ctx``
    tokens whose first token becomes BOS, and only each chunk's second half scored.
    ``llamacpp``: with llama.cpp's arithmetic (``lowbit eval --act llamacpp``: each layer's
    input rounded to its weight type's Q8_0/Q8_K blocks, keys and values through the F16
    cache, the rest of attention in float32)."""
    import contextlib

    import torch

    from lowbit.calibration.text import tokenize
    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.tokenizer import build_tokenizer
    from lowbit.evaluation.act_modes import simulate_llamacpp_activations
    from lowbit.models.build import load_model

    with open_checkpoint(path) as ck:
        tok = build_tokenizer(ck)
        md = ck.metadata
    bos = md.get("tokenizer.ggml.bos_token_id")
    add_bos = bool(md.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
    ids = ([int(bos)] if add_bos else []) + tokenize(tok, text)
    model = load_model(path)
    nll, count = 0.0, 0
    first = n_ctx // 2
    emulate = simulate_llamacpp_activations(model) if llamacpp else contextlib.nullcontext()
    with torch.inference_mode(), emulate:
        for c in range(len(ids) // n_ctx):
            chunk = torch.tensor([ids[c * n_ctx : (c + 1) * n_ctx]])
            if add_bos:
                chunk[0, 0] = int(bos)
            logp = torch.log_softmax(model(input_ids=chunk).logits[0].float(), dim=-1)
            target = chunk[0, first + 1 :]
            nll -= float(logp[first:-1].gather(1, target[:, None]).sum())
            count += target.numel()
    return float(np.exp(nll / count))


def _cached_ppl(work: Path, path: Path, text: str, n_ctx: int, llamacpp: bool = False) -> float:
    """:func:`lowbit_ppl`, kept in ``work/lowbit-ppl.json`` by file, size, time, text and
    arithmetic."""
    cache = work / "lowbit-ppl.json"
    known = json.loads(cache.read_text()) if cache.exists() else {}
    st = path.stat()
    key = (
        f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{n_ctx}|"
        + hashlib.sha256(text.encode()).hexdigest()[:16]
        + ("|llamacpp" if llamacpp else "")
    )
    if key not in known:
        known[key] = round(lowbit_ppl(path, text, n_ctx, llamacpp), 4)
        cache.write_text(json.dumps(known, indent=1))
    return known[key]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llamacpp", required=True, type=Path, help="folder of llama.cpp's tools")
    ap.add_argument("--work", type=Path, default=Path("out/gguf-kld"))
    ap.add_argument(
        "--model", default="smollm2",
        help="the model (what lowbit quantize takes; default smollm2), written as the F32 GGUF "
        "reference",
    )  # fmt: skip
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--eval-tokens", type=int, default=20480, help="evaluation text (tokens)")
    ap.add_argument("--calib-tokens", type=int, default=65536, help="calibration text (tokens)")
    ap.add_argument("--no-repack", action="store_true", help="CPUs with AMX")
    ap.add_argument(
        "--lowbit", action="append", default=[], metavar="NAME='ARGS'",
        help="an extra lowbit file: quantize arguments after the source (REF_BYTES in them "
        "becomes the Q4_K_M + imatrix file's bytes, CALIB the calibration text, IMATRIX the "
        "importance matrix)",
    )  # fmt: skip
    ap.add_argument(
        "--agreement", action="store_true",
        help="also the perplexity lowbit computes, by llama-perplexity's protocol, of the "
        "reference, every file lowbit wrote and the --file files: in float32, and with "
        "llama.cpp's arithmetic (lowbit eval --act llamacpp)",
    )  # fmt: skip
    ap.add_argument(
        "--reuse", action="store_true",
        help="keep the reference, importance matrix and llama-quantize files of an earlier run",
    )  # fmt: skip
    ap.add_argument(
        "--file", action="append", default=[], metavar="NAME=PATH",
        help="also measure a GGUF made elsewhere (e.g. by an earlier lowbit run)",
    )  # fmt: skip
    ap.add_argument("--only-lowbit", action="store_true", help="measure only the --lowbit files")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    tools, work = a.llamacpp, a.work
    work.mkdir(parents=True, exist_ok=True)
    threads = str(os.cpu_count() or 1)
    repack = ["--no-repack"] if a.no_repack else []
    ev, ca = texts(work, a.eval_tokens, a.calib_tokens)
    base = work / "f32.gguf"
    plan = work / "f32-plan.json"
    plan.write_text(json.dumps({"rules": [{"match": "*", "format": "fp32"}]}))
    if not (a.reuse and base.exists()):
        lowbit([a.model, "--plan", str(plan), "--out-format", "gguf", "--out", str(base)],
               work / "f32.log")  # fmt: skip

    imatrix = work / "imatrix.gguf"
    if not (a.reuse and imatrix.exists()):
        _run([str(tools / "llama-imatrix"), "-m", str(base), "-f", str(ca), "-o", str(imatrix),
              "-c", str(a.ctx), "-t", threads, *repack], work / "imatrix.log")  # fmt: skip

    files: dict[str, tuple[Path, float, str]] = {}
    for name, ftype, imx in (("Q4_0", "Q4_0", False), ("Q4_K_M", "Q4_K_M", False),
                             ("Q4_K_M+imatrix", "Q4_K_M", True)):  # fmt: skip
        ref = work / f"llama-{name}.gguf"
        if a.reuse and ref.exists() and (work / f"lowbit-{name}.gguf").exists():
            files[f"llama-quantize {name}"] = (ref, float("nan"), "llama.cpp (earlier run)")
            mine = work / f"lowbit-{name}.gguf"
            same = tensor_digest(ref) == tensor_digest(mine)
            files[f"lowbit {name}"] = (
                mine,
                float("nan"),
                "byte-identical" if same else "DIFFERENT",
            )
            continue
        cmd = [str(tools / "llama-quantize")]
        cmd += ["--imatrix", str(imatrix)] if imx else []
        _, t_ref = _run([*cmd, str(base), str(ref), ftype, threads], work / f"llama-{name}.log")
        files[f"llama-quantize {name}"] = (ref, t_ref, "llama.cpp")
        mine = work / f"lowbit-{name}.gguf"
        args = [str(base), "--to", ftype.lower(), "--out-format", "gguf", "--out", str(mine)]
        # --to q4_0 alone is lowbit's plan (linear weights only); any mix option asks for
        # llama.cpp's Q4_0 mix (embedding and output by its rules): one that matches nothing
        args += ["--tensor-type", "^$=q4_0"] if ftype == "Q4_0" else []
        args += ["--imatrix", str(imatrix)] if imx else []
        t_mine = lowbit(args, work / f"lowbit-{name}.log")
        same = tensor_digest(ref) == tensor_digest(mine)
        files[f"lowbit {name}"] = (mine, t_mine, "byte-identical" if same else "DIFFERENT")
    ref_bytes = files["llama-quantize Q4_K_M+imatrix"][0].stat().st_size
    extra = set()
    for spec in a.lowbit:
        name, _, rest = spec.partition("=")
        rest = rest.replace("REF_BYTES", str(ref_bytes)).replace("CALIB", str(ca))
        rest = rest.replace("IMATRIX", str(imatrix))
        out = work / f"lowbit-{re.sub(r'[^A-Za-z0-9_.+-]', '_', name)}.gguf"
        t = lowbit([str(base), *shlex.split(rest), "--out-format", "gguf", "--out", str(out)],
                   work / f"{out.stem}.log")  # fmt: skip
        files[f"lowbit {name}"] = (out, t, rest)
        extra.add(f"lowbit {name}")

    for spec in a.file:  # files made elsewhere (their making not timed here)
        name, _, path = spec.rpartition("=")  # a path holds no "="; a label may
        files[name] = (Path(path), float("nan"), "given")
        extra.add(name)
    base_logits = work / "f32.kld"
    if a.only_lowbit:
        files = {k: v for k, v in files.items() if k in extra}
    if not (a.reuse and base_logits.exists()):
        _run([str(tools / "llama-perplexity"), "-m", str(base), "-f", str(ev), "-c",
              str(a.ctx), "--kl-divergence-base", str(base_logits), "-t", threads, *repack],
             work / "f32-ppl.log")  # fmt: skip
    out = (work / "f32-ppl.log").read_text()
    m = re.search(r"Final estimate: PPL = ([\d.]+)", out)
    ref: dict = {"file": "F32 reference", "bytes": base.stat().st_size, "ppl": m and float(m[1])}
    ref.update(mean_kld=0.0, kld_99_9=0.0, same_top=100.0, quantize_s=None, note="lowbit")
    if a.agreement:
        ref["lowbit_ppl"] = _cached_ppl(work, base, ev.read_text(), a.ctx)
        ref["lowbit_ppl_llamacpp"] = _cached_ppl(work, base, ev.read_text(), a.ctx, True)
    rows = [ref]
    by_path: dict[str, dict] = {}
    for label, (path, seconds, note) in files.items():
        twin = files.get(label.replace("lowbit ", "llama-quantize ", 1))
        if note == "byte-identical" and twin is not None and str(twin[0]) in by_path:
            # the same tensor bytes give the same logits: llama-perplexity's row is this one's
            row = {k: by_path[str(twin[0])][k] for k in ("ppl", "mean_kld", "kld_99_9", "same_top")}
        else:
            log = work / f"{path.stem}-kld.log"
            row = kld(tools, path, base_logits, repack, log, reuse=a.reuse)
        by_path[str(path)] = row
        row.update(file=label, bytes=path.stat().st_size, quantize_s=round(seconds, 1), note=note)
        if a.agreement and (label in extra or label.startswith("lowbit ")):
            # issue 25: lowbit's perplexity of a file it wrote within 0.5 % of llama.cpp's
            row["lowbit_ppl"] = _cached_ppl(work, path, ev.read_text(), a.ctx)
            row["lowbit_ppl_llamacpp"] = _cached_ppl(work, path, ev.read_text(), a.ctx, True)
        rows.append(row)
    if a.json:
        print(json.dumps({"cpu": cpu(), "rows": rows}, indent=1))
        return 0
    print(f"CPU: {cpu()}. Evaluation text: tokens {EVAL_AT}..{EVAL_AT + a.eval_tokens} of the "
          f"default text, {a.ctx}-token chunks; calibration: tokens {CALIB_AT}.."
          f"{CALIB_AT + a.calib_tokens}.\n")  # fmt: skip
    print("| file | bytes | mean KLD | 99.9 % KLD | same top | PPL | lowbit PPL f32 | lowbit PPL "
          "llamacpp | quantize s | note |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")  # fmt: skip
    for r in rows:
        print(f"| {r['file']} | {r['bytes']:,} | {r['mean_kld']} | {r['kld_99_9']} | "
              f"{r['same_top']} % | {r['ppl']} | {r.get('lowbit_ppl', '')} | "
              f"{r.get('lowbit_ppl_llamacpp', '')} | {r['quantize_s']} | {r['note']} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
