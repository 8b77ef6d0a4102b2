"""``lowbit.compare``: the same data quantized with several schemes, ranked by SQNR (what
``lowbit compare`` prints), and the tensor-file reading it shares with ``quantize-tensor``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lowbit._json import check_regular_file, to_jsonable
from lowbit._results import TableView
from lowbit.errors import LowbitError
from lowbit.formats.mx import is_mx_name
from lowbit.quant.metrics import error
from lowbit.quant.quantized_tensor import QuantizedTensor
from lowbit.quant.scheme import Cast, Granularity, Scheme
from lowbit.quant.scheme_text import parse_scheme
from lowbit.quant.tensor import quantize

__all__ = [
    "DEFAULT_FORMATS",
    "DISTRIBUTIONS",
    "CompareResult",
    "compare",
    "load_tensor",
    "make_data",
    "scheme_for",
]

#: The list compared when ``formats`` is not given. One scale per tensor for the scaled
#: formats: the synthetic data is one 1-D vector.
DEFAULT_FORMATS = "int8:t,int4:t,nf4,fp4:t,mxfp4,fp8_e4m3:t"

#: The synthetic data ``compare`` draws by name.
DISTRIBUTIONS = ("normal", "laplace", "student-t", "uniform")


@dataclass(frozen=True, repr=False)
class CompareResult(TableView):
    """What :func:`compare` measured: one row per scheme, best SQNR first.

    Attributes:
        label: what the data was (a distribution with its size and seed, or a tensor's name
            and shape).
        rows: per scheme ``{"format", "scheme", "bits_per_value", "bytes"}`` and
            :func:`lowbit.error`'s metrics (``sqnr_db``, ``rmse``, ``max_abs``, ``rel_fro``,
            ``cosine``, ...), sorted by falling SQNR.
        quantized: each ``formats`` entry's :class:`~lowbit.QuantizedTensor`, in the order
            given.
        data: the data compared.
    """

    label: str
    rows: tuple[dict[str, Any], ...]
    quantized: Mapping[str, QuantizedTensor] = field(default_factory=dict)
    data: Any = None

    def to_dict(self) -> dict[str, Any]:
        """``{"data": label, "results": rows}``: what ``lowbit compare --json`` prints."""
        out: dict[str, Any] = to_jsonable({"data": self.label, "results": list(self.rows)})
        return out

    @property
    def best(self) -> dict[str, Any]:
        """The row with the highest SQNR."""
        return self.rows[0]

    def _summary(self) -> str:
        b = self.best
        return (
            f"{self.label}: {len(self.rows)} schemes, best {b['scheme']} "
            f"{b['sqnr_db']:.2f} dB at {b['bits_per_value']:.3f} bits/value"
        )

    def _rows(self) -> list[dict[str, Any]]:
        keys = ("scheme", "bits_per_value", "sqnr_db", "rmse", "max_abs", "rel_fro", "cosine")
        return [{k: r.get(k) for k in keys} for r in self.rows]


def compare(
    data: Any = "normal",
    formats: str | Sequence[str] | None = None,
    *,
    size: int = 1 << 18,
    seed: int = 0,
    group_size: int | None = None,
    axis: int | None = None,
    scale_method: str | None = None,
    percentile: float | None = None,
    k_std: float | None = None,
    scale_format: str | None = None,
    asym: bool = False,
    restricted: bool = False,
    double_quant: bool = False,
    rounding: str | None = None,
) -> CompareResult:
    """Quantize the same data with each scheme and rank them by SQNR (``lowbit compare``).

    Args:
        data: an array; a distribution name (``normal``, ``laplace``, ``student-t``,
            ``uniform``: ``size`` float32 values drawn with ``seed``); or a file,
            ``FILE.npy`` or ``FILE.safetensors[:TENSOR]``.
        formats: scheme strings (a list, or comma-separated), each read as every lowbit
            command reads it; None: :data:`DEFAULT_FORMATS`.
        size: values of synthetic data.
        seed: seed of synthetic data and of stochastic rounding.
        group_size, axis, scale_method, percentile, k_std, scale_format, rounding: applied
            to every entry (MX formats keep their blocks of 32 and E8M0 scales).
        asym, restricted: integers with a zero point / the symmetric range
            ``±(2^(n-1)-1)``. With the default list they change its integer entries only;
            for a float format named in ``formats`` they are an error.
        double_quant: NF4's double quantization (NF4 entries only).

    Returns:
        A :class:`CompareResult`; ``to_dict()`` equals ``lowbit compare --json``'s document.

    Raises:
        LowbitError: an unknown distribution or a missing file, an empty or bad entry, an
            option an entry's format cannot take.
    """
    if isinstance(data, str):
        if data in DISTRIBUTIONS:
            arr = make_data(data, size, seed)
            label = f"{data} (n={arr.size:,}, seed {seed})"
        else:
            head = data.partition(".safetensors:")[0] + ".safetensors"
            file = head if ".safetensors:" in data else data
            if not Path(file).exists():
                raise LowbitError(
                    f"--data {data!r} is neither a distribution ({', '.join(DISTRIBUTIONS)}) "
                    "nor an existing .npy / .safetensors file"
                )
            arr, name = load_tensor(data)
            label = f"{name} {tuple(np.shape(arr))}"
    else:
        arr = np.asarray(data)
        if arr.dtype.kind not in "fiu":
            raise LowbitError(f"compare needs numbers, got an array of dtype {arr.dtype}")
        label = f"array {tuple(arr.shape)}"
    explicit = formats is not None
    given = DEFAULT_FORMATS if formats is None else formats
    names = [s.strip() for s in given.split(",")] if isinstance(given, str) else list(given)
    names = [n for n in names if n]
    if not names:
        raise LowbitError("--formats is empty")
    fields = {
        "axis": axis,
        "group_size": group_size,
        "scale_method": scale_method,
        "percentile": percentile,
        "k_std": k_std,
        "scale_format": scale_format,
        "symmetric": False if asym else None,
        "restricted_range": True if restricted else None,
        "double_quant": True if double_quant else None,
        "rounding": rounding,
    }
    shape = tuple(np.shape(arr))
    schemes = {n: _entry_scheme(n, fields, shape, explicit) for n in names}
    rows: list[dict[str, Any]] = []
    quantized: dict[str, QuantizedTensor] = {}
    for n in names:
        qt = quantize(arr, schemes[n], seed=seed)
        quantized[n] = qt
        rows.append(
            {
                "format": n,
                "scheme": qt.scheme.label,
                "bits_per_value": qt.bits_per_value,
                "bytes": qt.nbytes,
                **error(arr, qt),
            }
        )
    rows.sort(key=lambda r: -r["sqnr_db"])
    return CompareResult(label, tuple(rows), quantized, arr)


def scheme_for(spec: str, shape: tuple[int, ...], **fields: Any) -> Scheme:
    """The scheme ``spec`` with ``fields`` applied (None: as the string says), checked against
    the data's shape.

    Raises:
        LowbitError: a bad scheme or field, a plain cast (nothing to scale), or per-channel
            scales on data with no rows (unless ``axis`` asks for them).
    """
    scheme = parse_scheme(spec, **fields)
    if isinstance(scheme, Cast):
        raise LowbitError(
            f"{spec!r} is a plain cast to {scheme.dtype} (no scale): quantize to a scaled "
            f"scheme such as {scheme.label}:t, or convert the array's dtype instead"
        )
    if scheme.granularity is Granularity.CHANNEL and len(shape) < 2 and fields.get("axis") is None:
        raise LowbitError(
            f"{spec!r} is {scheme.label}: one scale per output channel, and a {len(shape)}-D "
            f"tensor of shape {shape} has no rows; use {scheme.label.replace(':ch', ':t', 1)} "
            "(one scale per tensor) or a group size (:g128)"
        )
    return scheme


def _entry_scheme(
    name: str, fields: dict[str, Any], shape: tuple[int, ...], explicit: bool
) -> Scheme:
    """One ``formats`` entry's scheme with the shared fields applied: MX entries keep their
    blocks and scales, ``double_quant`` applies to NF4 only, and with the default list
    ``asym``/``restricted`` apply to its (signed) integer entries only."""
    skip: dict[str, Any] = {}
    base = name.split(":")[0].strip()
    if is_mx_name(base):
        skip = {"group_size": None, "scale_format": None, "scale_method": None}
    if base.lower() != "nf4":
        skip["double_quant"] = None
    if not explicit and (fields["symmetric"] is not None or fields["restricted_range"]):
        loose = {**fields, **skip, "symmetric": None, "restricted_range": None}
        fmt = scheme_for(name, shape, **loose).element_format
        if fmt.kind != "int":
            skip["symmetric"] = None
        if fmt.kind != "int" or not getattr(fmt, "signed", False):
            skip["restricted_range"] = None
    return scheme_for(name, shape, **{**fields, **skip})


def make_data(kind: str, size: int, seed: int) -> np.ndarray:
    """Synthetic data: ``size`` float32 values from a named distribution (unit scale).

    Raises:
        LowbitError: ``size`` below 1, an unknown distribution.
    """
    if size < 1:
        raise LowbitError(f"--size must be >= 1, got {size}")
    rng = np.random.default_rng(seed)
    if kind == "normal":
        x = rng.standard_normal(size)
    elif kind == "laplace":
        x = rng.laplace(0.0, 1.0, size)
    elif kind == "student-t":
        x = rng.standard_t(4.0, size)
    elif kind == "uniform":
        x = rng.uniform(-1.0, 1.0, size)
    else:
        raise LowbitError(f"unknown distribution {kind!r}; allowed: {', '.join(DISTRIBUTIONS)}")
    return x.astype(np.float32)


def _load_npy(p: Path, size: int) -> Any:
    """A numeric .npy file whose header agrees with its size (a 192-byte file may claim 37 GiB:
    refused before anything is allocated)."""
    fmt = np.lib.format
    try:
        with open(p, "rb") as fh:
            version = fmt.read_magic(fh)
            if version == (1, 0):
                shape, _, dtype = fmt.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, _, dtype = fmt.read_array_header_2_0(fh)
            else:
                raise ValueError(f"version {version} of the .npy format")
            offset = fh.tell()
            if dtype.hasobject:
                raise ValueError("it holds Python objects (lowbit reads numbers only)")
            count = 1
            for d in shape:
                count *= int(d)
            need = count * dtype.itemsize
            if need != size - offset:
                raise ValueError(
                    f"its header says {shape} {dtype} ({need:,} bytes) but it holds "
                    f"{size - offset:,} bytes of data"
                )
            fh.seek(0)
            return np.load(fh, allow_pickle=False)
    except (ValueError, EOFError, SyntaxError, OverflowError, MemoryError) as exc:
        raise LowbitError(f"cannot read {p} as a numeric .npy file: {_one_line(exc)}") from None
    except OSError as exc:
        raise LowbitError(f"cannot read {p}: {exc.strerror or exc}") from None


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def load_tensor(source: str) -> tuple[Any, str]:
    """``(array, name)`` from ``FILE.npy`` or ``FILE.safetensors[:TENSOR]`` (floats narrower
    than float64 widened to float32, exactly).

    Raises:
        LowbitError: not a regular file, a .npy header that disagrees with the file's size or
            holds objects, an unreadable safetensors file, a missing or unnamed tensor.
    """

    path, _, name = source.partition(":") if ".safetensors:" in source else (source, "", "")
    p = Path(path)
    size = check_regular_file(p)  # a FIFO would block for good, a device never end
    if p.suffix == ".npy":
        return _load_npy(p, size), p.stem
    if p.suffix != ".safetensors":
        raise LowbitError(f"{path}: expected a .npy or .safetensors file")
    try:
        from safetensors import safe_open
    except ImportError:  # pragma: no cover
        raise ImportError("reading .safetensors needs: pip install 'lowbit[models]'") from None
    try:
        with safe_open(str(p), framework="pt") as f:
            names = list(f.keys())
            if not name:
                if len(names) != 1:
                    shown = ", ".join(names[:8]) + (" ..." if len(names) > 8 else "")
                    raise LowbitError(
                        f"{path} holds {len(names)} tensors; name one as {path}:NAME ({shown})"
                    )
                name = names[0]
            if name not in names:
                raise LowbitError(f"no tensor {name!r} in {path}")
            t = f.get_tensor(name)
    except LowbitError:
        raise
    except Exception as exc:  # safetensors raises its own error types
        raise LowbitError(f"cannot read {path}: {exc}") from None
    if t.is_floating_point() and str(t.dtype) != "torch.float64":
        t = t.float()  # bfloat16 / float16 / float8 widen exactly
    return t.numpy(), name
