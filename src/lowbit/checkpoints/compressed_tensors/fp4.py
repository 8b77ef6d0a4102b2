"""compressed-tensors' FP4 and FP8-block storage: checks, nibble packing, scale bytes, config.

``nvfp4-pack-quantized`` (E2M1 in groups of 16, E4M3 group scales, a float32
``weight_global_scale`` in the encode direction ``448 * 6 / amax``; W4A4 adds
``input_global_scale``), ``mxfp4-pack-quantized`` (E2M1 in groups of 32, E8M0 scale bytes,
``scale_dtype`` uint8 in the config) and FP8 blocks (``float-quantized``/``naive-quantized``
with strategy ``block``), as compressed-tensors 0.20.1's compressors write them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from lowbit._parallel import map_chunks
from lowbit.checkpoints.io.arrays import as_numpy
from lowbit.errors import LowbitError

__all__: list[str] = []

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
#: compressed-tensors' FP4 storage formats and their groups: NVFP4 16 (a global scale),
#: MXFP4 32 (E8M0 bytes).
FP4_FORMATS = {"nvfp4-pack-quantized": 16, "mxfp4-pack-quantized": 32}


#: Layers vLLM fuses into one GEMM, which must share an NVFP4 tensor scale.
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def fused_siblings(name: str) -> tuple[str, ...]:
    """The weights fused with ``name`` (itself included): ``...self_attn.q_proj.weight`` ->
    q/k/v's; ``()`` for a weight vLLM does not fuse."""
    parts = name.split(".")
    if len(parts) < 2:
        return ()
    for group in FUSED:
        if parts[-2] in group:
            return tuple(".".join([*parts[:-2], p, parts[-1]]) for p in group)
    return ()


def fused_scales_differ(get: Callable[[str], Any], names: set[str]) -> str | None:
    """What is wrong when layers vLLM fuses (q/k/v, gate/up) carry different NVFP4 global
    scales (None: nothing): vLLM loads them as one weight with one scale."""
    for name in sorted(n for n in names if n.endswith(".weight_global_scale")):
        weight = name[: -len("_global_scale")]
        group = [s + "_global_scale" for s in fused_siblings(weight)]
        if not group or (name != group[0] and group[0] in names):
            continue  # checked from the group's first member
        present = [n for n in group if n in names]
        values = {n: float(np.ravel(np.asarray(get(n), np.float32))[0]) for n in present}
        if len(set(values.values())) > 1:
            shown = ", ".join(f"{n.rsplit('.', 2)[-2]} {v:.9g}" for n, v in values.items())
            return (
                f"{weight.rsplit('.', 2)[0]}: fused layers have different NVFP4 global scales "
                f"({shown}); vLLM needs one: re-export with lowbit quantize --out-format "
                "compressed-tensors, which shares them"
            )
    return None


def e2m1_values(codes: np.ndarray) -> np.ndarray:
    """float32 values of E2M1 nibbles (bit 3 the sign)."""
    mag = E2M1[codes & 7]
    return np.where(codes & 8, -mag, mag).astype(np.float32)


_PACK_BYTES = 1 << 22  # codes per chunk of pack_fp4: a few MB


def pack_fp4(codes: np.ndarray) -> np.ndarray:
    """``[out, in]`` nibbles -> ``[out, in/2]`` bytes, even column in the low nibble
    (compressed-tensors' ``pack_fp4_to_uint8``; codes ``[1, 2]`` make byte ``0x21``)."""
    c = np.ascontiguousarray(codes, dtype=np.uint8)
    out = np.empty((c.shape[0], c.shape[1] // 2), dtype=np.uint8)
    step = max(1, _PACK_BYTES // max(1, c.shape[1]))  # rows per chunk

    def rows(r: int) -> None:  # on the chunk threads
        part = c[r : r + step]
        np.left_shift(part[:, 1::2], 4, out=out[r : r + step])
        out[r : r + step] |= part[:, 0::2]

    map_chunks(rows, range(0, c.shape[0], step))
    return out


def unpack_fp4(packed: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pack_fp4`."""
    p = np.asarray(packed, dtype=np.uint8)
    out = np.empty((p.shape[0], p.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2] = p & 15
    out[:, 1::2] = p >> 4
    return out


def e8m0_bytes(scale: np.ndarray) -> np.ndarray:
    """uint8 ``127 + log2(scale)`` of power-of-two scales (compressed-tensors'
    ``compress_mx_scale``)."""
    return (127 + np.frexp(np.asarray(scale, np.float64))[1] - 1).astype(np.uint8)


def e8m0_scales(b: np.ndarray) -> np.ndarray:
    """float32 ``2**(b - 127)`` of E8M0 bytes."""
    return np.ldexp(np.float32(1.0), np.asarray(b).astype(np.int32) - 127).astype(np.float32)


def _scalar(v: Any) -> np.float32 | None:
    a = np.ravel(as_numpy(v)).astype(np.float32)
    return np.float32(a[0]) if a.size == 1 and np.isfinite(a[0]) and a[0] > 0 else None


def all_e4m3(scale: np.ndarray) -> bool:
    """Whether every one of ``scale`` (float32) is a finite float8_e4m3fn value,
    from its bits, without a round trip through float8 (ml_dtypes' cast: 37 ns a value, a
    second for an 8B layer's gate/up scales): a normal one (2^-6 .. 448) keeps 3 of float32's
    23 mantissa bits, a subnormal one is a multiple of 2^-9 below 2^-6."""
    s = np.ascontiguousarray(scale, dtype=np.float32).reshape(-1)
    for i in range(0, s.size, 1 << 22):
        c = np.abs(s[i : i + (1 << 22)])
        if not bool(np.all(c <= np.float32(448.0))):
            return False
        normal = c >= np.float32(2.0**-6)
        if np.any((c.view(np.uint32) & np.uint32(0xFFFFF))[normal]):
            return False
        sub = c[~normal] * np.float32(512.0)  # exact: a power of two
        if np.any(sub != np.floor(sub)):
            return False
    return True


def checked_fp4(
    t: Any, codes: np.ndarray, strategy: str, bad: Callable[[str], LowbitError]
) -> tuple[np.ndarray, np.ndarray, None]:
    """Validate an NVFP4/MXFP4 ``CTTensor``; (uint8 nibbles, float32 scale ``[out, in/G]``,
    None)."""
    nv = t.global_scale is not None
    kind, want_g = ("nvfp4", 16) if nv else ("mxfp4", 32)
    if t.num_bits != 4 or t.zero_point is not None:
        raise bad("fp4 weights are 4-bit and symmetric (no zero point)")
    if t.group_size != want_g or strategy != ("tensor_group" if nv else "group"):
        raise bad(
            f"{kind} takes groups of {want_g} ({'with' if nv else 'without'} a global scale), "
            f"got group_size {t.group_size} and strategy {strategy!r}"
        )
    if codes.dtype != np.uint8 or codes.ndim != 2 or (codes.size and codes.max() > 15):
        raise bad("fp4 codes must be a 2-D uint8 array of E2M1 nibbles (0..15)")
    out, cols = codes.shape
    if cols % want_g:
        raise bad(
            f"{kind} needs the input width to be a multiple of {want_g}, got {cols}: keep this "
            "layer unquantized (a plan rule with format keep) or use a group scheme that fits"
        )
    scale = as_numpy(t.scale)
    if scale.dtype.kind not in "fV" or scale.size != out * (cols // want_g):
        raise bad(f"{kind} scales for shape {codes.shape} need shape [{out}, {cols // want_g}]")
    scale = scale.astype(np.float32).reshape(out, cols // want_g)
    if not (np.isfinite(scale).all() and (scale > 0).all()):
        raise bad("scales must be positive and finite")
    if nv:
        if _scalar(t.global_scale) is None:
            raise bad("the global scale must be one positive finite float32")
        if not all_e4m3(scale):
            raise bad("NVFP4 group scales must be float8_e4m3fn values")
    elif not np.array_equal(e8m0_scales(e8m0_bytes(scale)), scale):
        raise bad("MXFP4 scales must be powers of two in 2**-127..2**127 (E8M0)")
    if (t.activations == "nvfp4") != (t.input_global_scale is not None):
        raise bad("activations 'nvfp4' (W4A4) goes with input_global_scale, and only with it")
    if t.activations not in (None, "nvfp4") or (t.activations and not nv):
        raise bad(
            f"fp4 weights take activations None or 'nvfp4' (NVFP4 only), not {t.activations!r}"
        )
    if t.input_global_scale is not None and _scalar(t.input_global_scale) is None:
        raise bad("input_global_scale must be one positive finite float32")
    return codes, scale, None


def weights_args(kind: str, bits: int, strategy: str, group: Any, block: Any) -> dict[str, Any]:
    """The ``weights`` entry of a config group for the new storages (as compressed-tensors'
    presets NVFP4A16, MXFP4A16 and FP8_BLOCK serialise)."""
    w: dict[str, Any] = {"num_bits": bits, "type": "float", "symmetric": True,
                         "group_size": group, "strategy": strategy, "dynamic": False}  # fmt: skip
    if kind == "fp4":
        w["scale_dtype"] = "torch.float8_e4m3fn" if strategy == "tensor_group" else "torch.uint8"
    if strategy == "block":
        w["block_structure"] = list(block)
    return w


def input_args(activations: str, strategy: str) -> dict[str, Any] | None:
    """The ``input_activations`` entry: NVFP4 (W4A4: dynamic local E4M3 group scales under
    the static ``input_global_scale``), or FP8 per group of 128 beside FP8 blocks."""
    if activations == "nvfp4":
        return {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16,
                "strategy": "tensor_group", "dynamic": "local",
                "scale_dtype": "torch.float8_e4m3fn", "observer": "static_minmax"}  # fmt: skip
    if activations == "fp8" and strategy == "block":
        return {"num_bits": 8, "type": "float", "symmetric": True, "group_size": 128,
                "strategy": "group", "dynamic": True}  # fmt: skip
    return None


def check_fp4_weight(info: Callable[[str], Any], module: str, g: dict[str, Any]) -> str | None:
    """What is wrong with one NVFP4/MXFP4 weight's arrays under its config group (None:
    nothing); ``info(suffix)`` is the stored array's info or None."""
    fmt = g["format"]
    want_g = FP4_FORMATS[fmt]
    nv = fmt.startswith("nvfp4")
    if g["type"] != "float" or g["bits"] != 4 or g["group_size"] != want_g:
        return f"{fmt} holds 4-bit floats in groups of {want_g}"
    if not g["symmetric"]:
        return f"{fmt} is symmetric"
    packed, scale = info("weight_packed"), info("weight_scale")
    if packed is None or scale is None:
        return "needs weight_packed and weight_scale"
    if packed.dtype != "U8" or len(packed.shape) != 2:
        return f"weight_packed is {packed.dtype}{list(packed.shape)}, not 2-D U8"
    out, cols = packed.shape[0], packed.shape[1] * 2
    want = (out, cols // want_g)
    sdtype = "F8_E4M3" if nv else "U8"
    if cols % want_g or scale.dtype != sdtype or tuple(scale.shape) != want:
        return (
            f"weight_scale is {scale.dtype}{list(scale.shape)}, {fmt} of [{out}, {cols}] "
            f"stores {sdtype}{list(want)}"
        )
    gs = info("weight_global_scale")
    if nv and (gs is None or gs.dtype != "F32" or gs.numel != 1):
        return "needs a one-value F32 weight_global_scale"
    if not nv and gs is not None:
        return "MXFP4 has no weight_global_scale"
    return None


def read_fp4(get: Callable[[str], Any], module: str, g: dict[str, Any]) -> dict[str, Any]:
    """The CTTensor fields of one stored NVFP4/MXFP4 weight (arrays already checked)."""
    codes = unpack_fp4(np.asarray(get(f"{module}.weight_packed")))
    raw = np.asarray(get(f"{module}.weight_scale"))
    nv = g["format"].startswith("nvfp4")
    scale = raw.astype(np.float32) if nv else e8m0_scales(raw)
    gs = np.asarray(get(f"{module}.weight_global_scale"), np.float32) if nv else None
    return {"codes": codes, "scale": scale, "kind": "fp4", "num_bits": 4,
            "group_size": g["group_size"], "global_scale": gs}  # fmt: skip
