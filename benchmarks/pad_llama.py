"""Widen a llama-family Hugging Face checkpoint with zeros so that every linear layer's input is a
whole number of 256-value K-quant super-blocks, computing the same function.

Issue 25 wants llama.cpp's K-quants measured on a model whose rows are multiples of 256; the
only causal LM that reaches this machine, SmolLM2-135M (hidden 576 = 2.25 x 256), makes
llama-quantize fall back to Q5_0/Q8_0 for every tensor but ffn_down. Padded to hidden 768 and 12
query heads (3 of them dummies), every weight of its Q4_K_M is a K-quant, on SmolLM2's own
values:

- embedding, q/k/v, gate/up: input columns 576..767 are zero; o_proj/down_proj: output rows
  576..767 are zero, so the padded dimensions of the residual stream stay zero;
- RMSNorm divides by the mean over 768 values, 0.75 of the mean over 576: the norm weights are
  multiplied by sqrt(0.75) and rms_norm_eps by 0.75, which gives the original norm exactly;
- query heads: old head i becomes head i + i // 3 (so heads 0-2, 4-6, 8-10 keep their
  grouped-query key/value head with 4 heads per group), heads 3, 7, 11 have zero q rows and
  zero o_proj columns: they attend uniformly and contribute nothing.

usage: python benchmarks/pad_llama.py SRC_FOLDER OUT_FOLDER [--hidden 768]
(SRC_FOLDER: float32 weights, e.g. ``lowbit quantize smollm2 --plan f32.json --out-format
compressed-tensors --out SRC`` with f32.json ``{"rules": [{"match": "*", "format": "fp32"}]}``).
It checks the logits of both on a few tokens and prints the largest difference.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

import numpy as np


def pad(t: dict[str, np.ndarray], cfg: dict, hidden: int) -> tuple[dict[str, np.ndarray], dict]:
    h0, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h0 // nh
    group = nh // nkv
    new_nh = hidden // hd
    if hidden % hd or new_nh % nkv or new_nh // nkv < group:
        raise SystemExit(f"cannot place {nh} heads of {hd} in {hidden} with {nkv} kv heads")
    per = new_nh // nkv
    slot = [(i // group) * per + i % group for i in range(nh)]  # old head -> new head
    scale = math.sqrt(h0 / hidden)

    def cols(a: np.ndarray) -> np.ndarray:
        out = np.zeros((a.shape[0], hidden), np.float32)
        out[:, :h0] = a
        return out

    def rows(a: np.ndarray) -> np.ndarray:
        out = np.zeros((hidden, *a.shape[1:]), np.float32)
        out[:h0] = a
        return out

    out: dict[str, np.ndarray] = {}
    for name, a in t.items():
        a = a.astype(np.float32)
        if name.endswith("norm.weight"):
            out[name] = rows(a * np.float32(scale))
        elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
            out[name] = cols(a)
        elif name.endswith("q_proj.weight"):
            q = np.zeros((new_nh, hd, hidden), np.float32)
            q[slot, :, :h0] = a.reshape(nh, hd, h0)
            out[name] = q.reshape(new_nh * hd, hidden)
        elif name.endswith(
            ("k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight")
        ):
            out[name] = cols(a)
        elif name.endswith("o_proj.weight"):
            o = np.zeros((hidden, new_nh, hd), np.float32)
            o[:h0, slot, :] = a.reshape(h0, nh, hd)
            out[name] = o.reshape(hidden, new_nh * hd)
        elif name.endswith("down_proj.weight"):
            out[name] = rows(a)
        else:
            raise SystemExit(f"{name}: no padding rule (llama families only)")
    new = dict(cfg, hidden_size=hidden, num_attention_heads=new_nh, head_dim=hd,
               rms_norm_eps=cfg["rms_norm_eps"] * (h0 / hidden))  # fmt: skip
    return out, new


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--hidden", type=int, default=768)
    a = ap.parse_args(argv)
    from safetensors.numpy import load_file, save_file

    cfg = json.loads((a.src / "config.json").read_text())
    tensors, new = pad(load_file(a.src / "model.safetensors"), cfg, a.hidden)
    a.out.mkdir(parents=True, exist_ok=False)
    save_file(tensors, a.out / "model.safetensors", metadata={"format": "pt"})
    (a.out / "config.json").write_text(json.dumps(new, indent=1))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if (a.src / f).exists():
            shutil.copy(a.src / f, a.out / f)
    import torch
    import transformers

    ids = torch.tensor([[1, 504, 3458, 314, 260, 1345, 28, 2060, 18, 1790]])
    logits = []
    for folder in (a.src, a.out):
        m = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        with torch.no_grad():
            logits.append(m(ids).logits)
    print(f"max |logit difference| {float((logits[0] - logits[1]).abs().max()):.3g} "
          f"(logits up to {float(logits[0].abs().max()):.3g})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
