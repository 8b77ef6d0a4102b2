"""Memory of a whole-model calibration run: blocks read from the checkpoint only at their turn, parameters freed once used, the checkpoint unmapped between blocks, quantized tensors kept on disk until written, the C heap trimmed."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re
import shutil
import tempfile
import weakref
from collections.abc import Iterator, MutableMapping
from typing import Any

import numpy as np

from lowbit.methods._ggml_gptq import GgmlQuantized
from lowbit.methods._mlx_gptq import MLXQuantized
from lowbit.methods.mr_gptq import RotatedTensor
from lowbit.models.build import load_deferred
from lowbit.quant.quantized_tensor import QuantizedTensor


def _release_heap() -> bool:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim(0)``; a no-op
    where there is none). Between blocks the allocator keeps what the last block's temporaries
    freed; measured on SmolLM2 (32 samples) the resident memory grew 220 MB over the 30 blocks
    without this and 54 MB with it (the quantized tensors kept). Computes nothing.

    Returns:
        Whether anything could be asked (glibc found).
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows)
        return None


def _own(blocks: Any, block: Any) -> list[Any]:
    """The parameters of ``block`` that no other block of the stack shares."""
    elsewhere = {id(p) for other in blocks if other is not block for p in other.parameters()}
    return [p for p in block.parameters() if id(p) not in elsewhere]


#: A parameter of a numbered block (``model.layers.3.``): the blocks GPTQ loads in turn.
_BLOCK_KEY = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)\.")


_HEAD_KEY = re.compile(r"(?:^|\.)(?:lm_head|embed_out)\.weight$")


def _later_block(key: str) -> bool:
    """Whether a model key belongs to a block after the first (read at its turn) or is the LM
    head (never run: the capture stops at the first block; a head tied to the embedding is
    loaded with it)."""
    if _HEAD_KEY.search(key):
        return True
    m = _BLOCK_KEY.search(key)
    return m is not None and int(m.group(1)) > 0


class _Deferred:
    """The blocks after the first, read from the checkpoint only when their turn comes.

    ``build_model(defer=_later_block)`` leaves them unread (no memory: their pages are never
    written), so GPTQ holds one block's weights at a time besides the embeddings it drops after
    the capture, whatever the model's depth (``benchmarks/bench_gptq_memory.py``). Deferred
    parameters outside the block stack are loaded at once.
    """

    def __init__(self, net: Any, ckpt: Any, prefix: str) -> None:
        self._net, self._ckpt = net, ckpt
        lead = re.compile(re.escape(prefix) + r"\.(\d+)\.")
        self._by_block: dict[int, list[str]] = {}
        outside = []
        for key in getattr(net, "lowbit_deferred", ()):
            m = lead.match(key)
            if m is None and _HEAD_KEY.search(key):
                continue  # never needed
            if m is None:
                outside.append(key)
            else:
                self._by_block.setdefault(int(m.group(1)), []).append(key)
        if outside:
            load_deferred(net, ckpt, outside)

    def restore(self, index: int) -> None:
        """Read block ``index``'s parameters (a block never deferred: nothing to do).

        The checkpoint's memory maps are dropped before and after: pages of a mapped file
        that were read count as the process's resident memory until it is unmapped, so
        without this every block's stored weights (read twice: into the model, and again
        as GPTQ's float64 copies) stayed resident to the end, one block's bf16 bytes more
        per layer (88 MB a layer at TinyLlama-1.1B's width).
        """
        self._ckpt.close()
        keys = self._by_block.pop(index, [])
        if keys:
            import torch

            with torch.inference_mode(False), torch.no_grad():
                load_deferred(self._net, self._ckpt, keys)
            self._ckpt.close()


def _drop(params: Any) -> None:
    """Free parameters the run needs no more (the model is the run's own and then discarded):
    the embeddings once the first block's inputs are captured, each block once it is done."""
    import torch

    with torch.inference_mode(False), torch.no_grad():
        for p in params:
            p.data = torch.empty(0, dtype=p.dtype)


_ROTATION = "lowbit.spilled.hadamard_block"  # a RotatedTensor's block, in its stored meta


class SpilledTensors(MutableMapping[str, "QuantizedTensor | GgmlQuantized"]):
    """Name -> :class:`~lowbit.quant.quantized_tensor.QuantizedTensor`, each written to a temporary
    file when stored and read back when asked for: a whole-model run's results take disk,
    not memory, until the writer reads them one at a time (before, GPTQ's results stayed in
    memory to the end: 23 MB of int4 codes and scales a layer at TinyLlama-1.1B's width).

    Each tensor is one uncompressed ``.npz`` of :meth:`QuantizedTensor.to_arrays` (read back
    bit for bit by ``from_arrays``), in a folder of ``tempfile``'s (``TMPDIR``) made at the
    first store and removed with this object (or at exit). Reading one costs one file read;
    nothing is cached, so no tensor stays alive here.
    """

    def __init__(self) -> None:
        self._index: dict[str, tuple[str, dict[str, Any]]] = {}
        self._folder: str | None = None
        self._files = 0

    def _dir(self) -> str:
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix="lowbit-quantized-")
            weakref.finalize(self, shutil.rmtree, self._folder, ignore_errors=True)
        return self._folder

    def __setitem__(self, name: str, qt: QuantizedTensor | GgmlQuantized) -> None:
        arrays, meta = qt.to_arrays()
        if isinstance(qt, RotatedTensor):  # MR-GPTQ: the rotation travels with the codes
            meta = {**meta, _ROTATION: qt.block}
        old = self._index.get(name)
        if old is None:
            self._files += 1
        path = old[0] if old is not None else os.path.join(self._dir(), f"{self._files}.npz")
        with open(path, "wb") as f:
            np.savez(f, **arrays)
        self._index[name] = (path, meta)

    def __getitem__(self, name: str) -> QuantizedTensor | GgmlQuantized:
        path, meta = self._index[name]
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        if "ggml_type" in meta:  # GPTQ onto a llama.cpp block type: the tensor's GGUF bytes
            return GgmlQuantized.from_arrays(arrays, meta)
        if "mlx_affine" in meta:  # GPTQ onto MLX's affine grid: words, scales, biases
            return MLXQuantized.from_arrays(arrays, meta)
        if _ROTATION in meta:
            rest = {k: v for k, v in meta.items() if k != _ROTATION}
            return RotatedTensor(QuantizedTensor.from_arrays(arrays, rest), meta[_ROTATION])
        return QuantizedTensor.from_arrays(arrays, meta)

    def __reduce__(self) -> tuple[Any, ...]:
        # to another process (calibration workers hand worker 0's run to the driver): the
        # tensors travel as values and are spilled again there; the files here stay ours
        return (_respill, ([(n, self[n]) for n in self._index],))

    def __delitem__(self, name: str) -> None:
        path, _ = self._index.pop(name)
        os.remove(path)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._index))

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __repr__(self) -> str:
        return f"<SpilledTensors: {len(self)} quantized tensors in {self._folder}>"


def _respill(items: list[tuple[str, Any]]) -> SpilledTensors:
    """A :class:`SpilledTensors` of ``(name, tensor)`` pairs (its unpickling)."""
    out = SpilledTensors()
    for name, qt in items:
        out[name] = qt
    return out
