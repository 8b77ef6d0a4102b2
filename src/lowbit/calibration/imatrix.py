"""Importance matrices as llama.cpp's ``llama-imatrix`` defines them, from lowbit's calibration text.

For each linear weight of a GGUF model, per input column, the sum over calibration tokens of
the squared input activation, and how many tokens were summed (``collect_imatrix`` in
tools/imatrix/imatrix.cpp): ``sums / counts`` is the importance vector llama-quantize gives
that weight's quantizer. The model is the source as stored (a quantized GGUF runs on its
dequantized weights, as llama-imatrix runs it); windows of ``length`` tokens come from
:func:`lowbit.calibration.data.decoder_windows`. As llama-imatrix does by default, the
LM head (``output.weight``) is left out unless asked for. Sums are kept in float64 (llama.cpp
adds float32), then stored as float32. Write them with
:func:`lowbit.checkpoints.gguf.imatrix.write_imatrix`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lowbit._results import TableView
from lowbit.calibration.data import Calibration, decoder_windows
from lowbit.checkpoints.gguf.names import gguf_to_hf_name
from lowbit.checkpoints.streaming import open_model
from lowbit.checkpoints.tokenizer import build_tokenizer
from lowbit.errors import LowbitError
from lowbit.models._threads import _threads
from lowbit.models.build import build_model

__all__ = ["Imatrix", "compute_imatrix"]


@dataclass(repr=False)
class Imatrix(TableView):
    """Sums of squared inputs and token counts per GGUF weight name, and where they came from.

    ``repr`` is one line; ``to_dict()`` (``arrays=True`` adds the sums and counts),
    ``to_pandas()`` and the Jupyter table give one row per weight: its columns, tokens and
    importance (``sums / counts``) mean and largest (:mod:`lowbit._results`).
    """

    sums: dict[str, np.ndarray]
    counts: dict[str, np.ndarray]
    dataset: str
    chunks: int
    chunk_size: int

    def importance(self, name: str) -> np.ndarray:
        """The importance vector llama-quantize gives ``name``'s quantizer: ``sums / counts``
        (one per column; experts' vectors concatenated; ones where no token was counted), as
        :func:`lowbit.checkpoints.gguf.imatrix.read_imatrix` reads it back from the file.

        Raises:
            LowbitError: a name the matrix does not hold.
        """
        if name not in self.sums:
            raise LowbitError(f"the importance matrix has no {name!r} ({len(self.sums)} weights)")
        counts = np.asarray(self.counts[name], np.float32).reshape(-1)
        sums = np.asarray(self.sums[name], np.float32).reshape(counts.size, -1)
        with np.errstate(divide="ignore", invalid="ignore"):  # a matrix no token reached: ones
            vals = np.where(counts[:, None] > 0, sums / counts[:, None], np.float32(1))
        return vals.astype(np.float32).reshape(-1)

    def to_dict(self, arrays: bool = False) -> dict[str, Any]:
        """Where it came from and one summary row per weight (``weights``); with ``arrays``,
        the sums and counts as lists too (``sums``, ``counts``)."""
        d: dict[str, Any] = {
            "dataset": self.dataset,
            "chunks": self.chunks,
            "chunk_size": self.chunk_size,
            "weights": self._rows(),
        }
        if arrays:
            d["sums"] = {k: np.asarray(v).tolist() for k, v in self.sums.items()}
            d["counts"] = {k: np.asarray(v).tolist() for k, v in self.counts.items()}
        return d

    def _summary(self) -> str:
        return (
            f"{len(self.sums)} weights, {self.chunks} chunks x {self.chunk_size} tokens, "
            f"dataset={self.dataset!r}"
        )

    def _rows(self) -> list[dict[str, Any]]:
        rows = []
        for name in self.sums:
            imp = self.importance(name)
            rows.append({
                "weight": name,
                "columns": int(np.asarray(self.sums[name]).size),
                "tokens": int(np.asarray(self.counts[name]).reshape(-1)[0]),
                "mean_importance": float(imp.mean()) if imp.size else 0.0,
                "max_importance": float(imp.max()) if imp.size else 0.0,
            })  # fmt: skip
        return rows


def compute_imatrix(
    model: Any,
    calibration: Calibration | None = None,
    *,
    process_output: bool = False,
    threads: int | None = None,
    progress: bool | None = None,
) -> Imatrix:
    """Collect llama.cpp's importance matrix of a GGUF causal LM on calibration windows.

    Args:
        model: a GGUF file or shipped model name (``lowbit.checkpoints.streaming.open_model``).
        calibration: the windows (default: lowbit's calibration text, 128 x 512 tokens).
        process_output: also collect ``output.weight`` (llama-imatrix's ``--process-output``).
        threads: torch threads (default: the usable cores).
        progress: progress bar while the model loads (``None``: on a terminal).

    Returns:
        An :class:`Imatrix` keyed by GGUF weight names (``blk.0.attn_q.weight``, ...).

    Raises:
        LowbitError: a source that is not a GGUF llama, or calibration text too short.
    """
    import torch

    calib = calibration or Calibration()
    ckpt = open_model(model)
    if ckpt.format != "gguf":
        raise LowbitError(
            f"{ckpt.path}: importance matrices are keyed by GGUF tensor names; give a GGUF model"
        )
    modules: dict[str, str] = {}
    for name in ckpt.names():
        if not name.endswith(".weight") or len(ckpt.info(name).shape) != 2:
            continue
        if name == "output.weight" and not process_output:
            continue
        try:
            modules[gguf_to_hf_name(name).removesuffix(".weight")] = name
        except LowbitError:
            continue
    tokenizer = build_tokenizer(ckpt)
    net = build_model(ckpt, progress=progress)
    windows = decoder_windows(tokenizer, calib)
    label = calib.text()[0] if not calib.is_records else str(calib.source)
    named = dict(net.named_modules())
    if process_output and "output.weight" not in modules.values():
        modules["lm_head"] = "token_embd.weight"  # tied: the head multiplies by the embedding
    sums: dict[str, Any] = {}
    counts: dict[str, int] = {}

    def hook(gguf_name: str) -> Any:
        def grab(_m: Any, args: tuple[Any, ...]) -> None:
            x = args[0].detach().to(torch.float64)
            x = x.reshape(-1, x.shape[-1])
            sq = (x * x).sum(dim=0)
            sums[gguf_name] = sums[gguf_name] + sq if gguf_name in sums else sq
            counts[gguf_name] = counts.get(gguf_name, 0) + x.shape[0]

        return grab

    handles = []
    for module, gguf_name in modules.items():
        mod = named.get(module)
        if isinstance(mod, torch.nn.Linear):
            handles.append(mod.register_forward_pre_hook(hook(gguf_name)))
    if not handles:
        raise LowbitError(f"{ckpt.path}: no linear layer of the model matches a GGUF weight")
    try:
        with _threads(threads), torch.inference_mode():
            for w in windows:
                net(input_ids=torch.tensor([w], dtype=torch.long))
    finally:
        for h in handles:
            h.remove()
    return Imatrix(
        sums={k: v.numpy().astype(np.float32) for k, v in sums.items()},
        counts={k: np.array([float(c)], dtype=np.float32) for k, c in counts.items()},
        dataset=label,
        chunks=len(windows),
        chunk_size=len(windows[0]) if windows else 0,
    )
