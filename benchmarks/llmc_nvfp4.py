"""llm-compressor's NVFP4 W4A16 side by side with lowbit's, on lowbit's own calibration tokens.

llm-compressor needs its own environment (its compressed-tensors and transformers pins differ
from lowbit's test extra), so this script runs in two: in lowbit's, it writes the calibration
token ids lowbit's GPTQ uses (SmolLM2: 32 windows of 512 tokens after the scored text; MiniLM:
the 256 default sentences ``lowbit eval`` does not measure) and starts itself again under
``--llmc-python`` to run llm-compressor's ``QuantizationModifier`` (round to nearest) and
``GPTQModifier`` (its defaults) with ``scheme="NVFP4A16"``, and with ``--methods ...,quip-gptq``
its MR-GPTQ recipe (``QuIPModifier(rotations=["v"], transform_type="hadamard",
transform_block_size=16)`` before GPTQ: weights rotated in blocks of 16, the rotation of each
layer's input recorded as ``transform_config``, which ``lowbit eval`` applies); then
``lowbit eval`` measures the compressed-tensors folders on its default slices.
docs/quantization.md has the results.

    python benchmarks/llmc_nvfp4.py --model minilm --llmc-python /path/to/llmc-venv/bin/python
    python benchmarks/llmc_nvfp4.py --model smollm2 --source F32_HF_FOLDER --llmc-python ...

SmolLM2 ships as a Q4_1 GGUF: give ``--source``, a float32 Hugging Face folder of it
(``lowbit quantize smollm2 --plan f32.json --out-format compressed-tensors``, a plan keeping
every tensor as float32). Never part of ``make test``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def _calibration_ids(model: str) -> list[list[int]]:
    """The token ids lowbit's GPTQ calibrates ``model`` on by default."""
    from lowbit.calibration.data import Calibration, decoder_windows, encoder_texts
    from lowbit.calibration.text import evaluated_sentences
    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.shipped import default_model_path
    from lowbit.checkpoints.tokenizer import build_tokenizer

    with open_checkpoint(default_model_path(model)) as ck:
        tok = build_tokenizer(ck)
    if model == "smollm2":
        return decoder_windows(tok, Calibration(samples=32, length=512), avoid=2048)
    calib = Calibration()
    texts = encoder_texts(calib, exclude=evaluated_sentences(calib.text()[1]))
    return [tok(t, truncation=True, max_length=256)["input_ids"] for t in texts]


def _run_llmc(src: str, ids_file: str, out: str, how: str, kind: str) -> None:
    """In llm-compressor's environment: quantize ``src`` and save the compressed folder."""
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from llmcompressor.modifiers.transform import QuIPModifier
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    causal = kind == "causal"
    cls = AutoModelForCausalLM if causal else AutoModel
    model = cls.from_pretrained(src, torch_dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(src)
    ids = json.loads(Path(ids_file).read_text())
    ds = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids]})
    ignore = ["lm_head"] if causal else ["pooler.dense"]
    t0 = time.perf_counter()
    if how == "rtn":
        recipe = QuantizationModifier(targets="Linear", scheme="NVFP4A16", ignore=ignore)
        oneshot(model=model, recipe=recipe)
    else:
        recipe = GPTQModifier(targets="Linear", scheme="NVFP4A16", ignore=ignore)
        if how == "quip-gptq":  # MR-GPTQ: GPTQ over block-Hadamard-rotated weights
            quip = QuIPModifier(rotations=["v"], transform_type="hadamard",
                                transform_block_size=16, ignore=ignore)  # fmt: skip
            recipe = [quip, recipe]
        extra = {} if causal else {"sequential_targets": ["BertLayer"]}
        oneshot(model=model, dataset=ds, recipe=recipe, num_calibration_samples=len(ids),
                max_seq_length=max(map(len, ids)), **extra)  # fmt: skip
    print(f"{how}: {time.perf_counter() - t0:.1f} s")
    model.save_pretrained(out, save_compressed=True)
    tok.save_pretrained(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=["smollm2", "minilm"], default="minilm")
    ap.add_argument("--source", help="float32 Hugging Face folder (SmolLM2: required)")
    ap.add_argument("--llmc-python", required=True, help="python of llm-compressor's venv")
    ap.add_argument("--work", type=Path, default=Path("out/llmc-nvfp4"))
    ap.add_argument(
        "--methods",
        default="rtn,gptq",
        help="llm-compressor runs, of rtn, gptq, quip-gptq (default rtn,gptq)",
    )
    ap.add_argument("--_run", nargs=5, metavar="ARG", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._run:
        _run_llmc(*args._run)
        return 0
    from lowbit.checkpoints.shipped import default_model_path

    if args.model == "smollm2" and not args.source:
        ap.error("--model smollm2 needs --source (a float32 Hugging Face folder)")
    src = args.source or str(default_model_path(args.model))
    args.work.mkdir(parents=True, exist_ok=True)
    ids_file = args.work / f"{args.model}-ids.json"
    ids_file.write_text(json.dumps(_calibration_ids(args.model)))
    kind = "causal" if args.model == "smollm2" else "encoder"
    outs = []
    hows = [h.strip() for h in args.methods.split(",") if h.strip()]
    bad = sorted(set(hows) - {"rtn", "gptq", "quip-gptq"})
    if bad or not hows:
        ap.error(f"--methods takes rtn, gptq, quip-gptq; got {args.methods!r}")
    for how in hows:
        out = args.work / f"{args.model}-{how}"
        subprocess.run([args.llmc_python, __file__, "--llmc-python", args.llmc_python,
                        "--_run", src, str(ids_file), str(out), how, kind], check=True)  # fmt: skip
        outs.append(str(out))
    tokens = ["--tokens", "2048"] if args.model == "smollm2" else []
    cmd = [sys.executable, "-m", "lowbit.cli", "eval", args.model, *outs, "--schemes", "none",
           "--no-progress", *tokens]  # fmt: skip
    return subprocess.run(cmd, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
