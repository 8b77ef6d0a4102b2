"""compressed-tensors' ``transform_config``: rotations a consumer applies to layer inputs.

A folder whose weights are stored in a rotated basis (``W V``; MR-GPTQ, QuIP's "v" rotation,
``lowbit quantize --method hadamard|hadamard+gptq``) must have the same rotation applied to
each layer's input at run time, ``x ↦ x V``, or it computes another model. compressed-tensors
declares that in ``quantization_config.transform_config`` (``compressed_tensors/transform/``):
``config_groups`` of schemes ``{type, apply, randomize, requires_grad, head_dim, precision}``,
each ``apply`` entry ``{targets, location, inverse, ignore}``. ``location`` ``weight_input``
and ``weight_output`` are *offline*: already fused into the stored weights, nothing to do.
``input`` is *online*: the consumer multiplies the layer's input, in blocks of ``head_dim``
(the whole row when null), by the scheme's matrix (its transpose when ``inverse``), divided
by ``sqrt(size)`` for the Hadamard types. vLLM (``compressed_tensors/transform/``, hadacore)
applies them, and loads the matrix of each targeted layer from the checkpoint tensor
``<layer>.<group>_input.weight`` (``[size, size]``, unnormalised ±1 for ``hadamard``).

What lowbit writes (:func:`transform_entries`) is what llm-compressor 0.14's
``QuIPModifier(rotations=["v"], transform_type="hadamard", transform_block_size=B)`` writes:
one ``hadamard`` group per block size, named ``v`` (``v<B>`` when a folder mixes sizes), its
online ``input`` entry and the offline ``weight_input`` entry (``inverse``) that says the
weights already hold ``W V``, ``precision`` float64; and *one* stored matrix per group, the
float64 ±1 Sylvester matrix under the first target layer's name (compressed-tensors shares
one matrix among the layers and ``save_pretrained`` keeps the first of the tied copies:
``model.layers.0.self_attn.q_proj.v_input.weight``). lowbit names its targets (the rotated
layers) where llm-compressor writes ``Linear``. With ``V`` the normalised block Sylvester
matrix, symmetric and orthogonal, that is ``lowbit.methods.hadamard``'s ``R``:
``(x R)(W R)ᵀ = x Wᵀ``.

What lowbit reads (:func:`input_transforms`): ``hadamard`` and ``random-hadamard`` schemes with
online ``input`` entries (the matrix Sylvester's, or the stored one: the layer's own, else the
group's one shared copy; a stored ``hadamard`` matrix must be Sylvester's); offline entries
are skipped. Online ``output``, ``q_attn`` and
``k_cache`` entries and other types are refused in one line: measuring the folder without
them would measure another model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowbit._regex import MAX_PLAN_REGEX_CHARS, compile_bounded
from lowbit.errors import LowbitError
from lowbit.methods.hadamard import hadamard

__all__ = ["InputTransform", "input_transforms", "transform_entries", "transform_matrix"]

_OFFLINE = ("weight_input", "weight_output")
_ONLINE_OTHER = ("output", "q_attn", "k_cache")
_TYPES = ("hadamard", "random-hadamard")
_RE_WHERE = "transform_config targets"


@dataclass(frozen=True)
class InputTransform:
    """One online ``input`` entry of a folder's ``transform_config``.

    Attributes:
        group: the scheme's name (the layer's matrix is ``<layer>.<group>_input.weight``).
        type: ``hadamard`` or ``random-hadamard``.
        head_dim: the block size (None: the layer's whole input width).
        inverse: the matrix is applied transposed.
        targets: layer names, ``re:`` patterns or layer class names (``Linear``).
        ignore: the same, for layers left out.
    """

    group: str
    type: str
    head_dim: int | None
    inverse: bool
    targets: tuple[str, ...]
    ignore: tuple[str, ...]

    @property
    def tensor_suffix(self) -> str:
        """The module-name part of this transform's stored matrix (``v_input``)."""
        return f"{self.group}_input"

    def __post_init__(self) -> None:
        # compiled once per transform (thousands of distinct patterns would thrash the
        # module-wide compile cache, recompiling on every layer name)
        compiled = {t: compile_bounded(t[3:], _RE_WHERE) for t in {*self.targets, *self.ignore}
                    if t.startswith("re:")}  # fmt: skip
        object.__setattr__(self, "_compiled", compiled)

    def matches(self, name: str, classes: tuple[str, ...]) -> bool:
        """Whether the layer ``name`` (whose class and base classes are ``classes``) is a
        target and not ignored, as compressed-tensors' ``is_match`` decides."""
        rx = self._compiled  # type: ignore[attr-defined]
        return _matches(name, classes, self.targets, rx) and not _matches(
            name, classes, self.ignore, rx
        )


def _matches(name: str, classes: tuple[str, ...], targets: tuple[str, ...], rx: Any) -> bool:
    for t in targets:
        if t.startswith("re:"):  # linear time: a downloaded config must not hang a matcher
            if rx[t].match(name):
                return True
        elif t == name or t in classes:
            return True
    return False


def input_transforms(qc: Mapping[str, Any], where: str) -> list[InputTransform]:
    """The online input transforms a ``quantization_config`` declares (offline ones are
    already in the weights).

    Raises:
        LowbitError: a malformed ``transform_config``, a type other than ``hadamard`` /
            ``random-hadamard``, or an online transform of outputs, queries or keys.
    """
    tc = qc.get("transform_config")
    if not tc:
        return []
    groups = tc.get("config_groups") if isinstance(tc, dict) else None
    if not isinstance(groups, dict):
        raise LowbitError(f"{where}: transform_config has no config_groups mapping")
    total = sum(
        len(t)
        for scheme in groups.values() if isinstance(scheme, dict)
        for a in (scheme.get("apply") if isinstance(scheme.get("apply"), list) else [])
        if isinstance(a, dict)
        for key in ("targets", "ignore")
        for t in (a.get(key) if isinstance(a.get(key), list) else [a.get(key)])
        if isinstance(t, str) and t.startswith("re:")
    )  # fmt: skip
    if total > MAX_PLAN_REGEX_CHARS:  # each is matched against every layer name
        raise LowbitError(
            f"{where}: transform_config's re: targets hold {total:,} characters; at most "
            f"{MAX_PLAN_REGEX_CHARS:,}"
        )
    out = []
    for gname, scheme in groups.items():
        at = f"{where}: transform_config group {gname!r}"
        if not isinstance(scheme, dict) or not isinstance(scheme.get("apply", []), list):
            raise LowbitError(f"{at} is not a scheme with an apply list")
        kind, head = scheme.get("type"), scheme.get("head_dim")
        online = [
            a
            for a in scheme.get("apply") or []
            if not (isinstance(a, dict) and a.get("location") in _OFFLINE)
        ]
        if online and scheme.get("randomize", False):
            raise LowbitError(
                f"{at} is randomized (a permutation per layer); lowbit applies unrandomized "
                "transforms only"
            )
        if head is not None and (not isinstance(head, int) or isinstance(head, bool) or head < 1):
            raise LowbitError(f"{at}: head_dim {head!r} is not a positive integer")
        for args in scheme.get("apply") or []:
            loc = args.get("location") if isinstance(args, dict) else None
            if loc in _OFFLINE:
                continue
            if loc in _ONLINE_OTHER:
                raise LowbitError(
                    f"{at} applies a transform to {loc} at run time; lowbit applies online "
                    "transforms to layer inputs only, and measuring without it would measure "
                    "another model"
                )
            if loc != "input":
                raise LowbitError(f"{at}: unknown transform location {loc!r}")
            if kind not in _TYPES:
                raise LowbitError(
                    f"{at}: online {kind!r} transforms are not applied by lowbit (it applies "
                    f"{', '.join(_TYPES)})"
                )
            targets, ignore = args.get("targets", []), args.get("ignore", [])
            targets = [targets] if isinstance(targets, str) else targets
            ignore = [ignore] if isinstance(ignore, str) else ignore
            ok = isinstance(targets, list) and isinstance(ignore, list)
            if not ok or not all(isinstance(t, str) for t in [*targets, *ignore]):
                raise LowbitError(f"{at}: targets and ignore must be strings or lists of them")
            for t in [*targets, *ignore]:  # refused here, naming the group, not when matched
                if t.startswith("re:"):
                    try:
                        compile_bounded(t[3:], _RE_WHERE)
                    except LowbitError as exc:
                        raise LowbitError(f"{at}: {exc}") from None
            inverse = bool(args.get("inverse", False))
            out.append(
                InputTransform(str(gname), kind, head, inverse, tuple(targets), tuple(ignore))
            )
    return out


def transform_matrix(
    t: InputTransform, layer: str, width: int, stored: Callable[[str], Any] | None
) -> np.ndarray:
    """The float64 matrix ``M`` with which ``layer``'s input is rotated: each consecutive
    block of ``M.shape[0]`` values of a row ``x`` becomes ``x_block @ M``.

    Args:
        t: the transform.
        layer: the layer's name.
        width: the layer's input width.
        stored: the matrix stored for a layer name: the layer's own, else the group's shared
            copy, else None (then Sylvester's matrix, ``hadamard`` only).

    Raises:
        LowbitError: a block that does not divide ``width``, a ``hadamard`` size that is not
            a power of two, a missing ``random-hadamard`` matrix, a stored matrix of the wrong
            shape, not finite, or (``hadamard``) not Sylvester's.
    """
    size = t.head_dim or width
    name = f"{layer}.{t.tensor_suffix}.weight"
    if width % size:
        raise LowbitError(f"{name}: blocks of {size} do not divide the input width {width}")
    m = None if stored is None else stored(layer)
    if m is None and t.type != "hadamard":
        raise LowbitError(f"{name}: a {t.type} transform needs its stored matrix; none is stored")
    if m is not None:
        m = np.asarray(m, dtype=np.float64)
        if m.shape != (size, size) or not np.isfinite(m).all():
            raise LowbitError(
                f"{name}: shape {list(m.shape)}, expected a finite [{size}, {size}] matrix"
            )
    if t.type == "hadamard":
        if size & (size - 1):
            raise LowbitError(f"{name}: a Sylvester Hadamard matrix of order {size} (not 2^k)")
        h = hadamard(size)  # normalised
        if m is not None and not np.array_equal(m, h * np.sqrt(size)):
            raise LowbitError(f"{name}: the stored matrix is not the ±1 Sylvester Hadamard matrix")
        m = h
    else:
        m = m / np.sqrt(size)
    return np.ascontiguousarray(m.T if t.inverse else m)


def _group_names(blocks: Mapping[str, int]) -> dict[int, str]:
    sizes = sorted(set(blocks.values()))
    return {b: "v" if len(sizes) == 1 else f"v{b}" for b in sizes}


#: transformers' registration order of a decoder block's parts (attention before the MLP)
_ORDER = ("self_attn", "attention", "attn", "q_proj", "k_proj", "v_proj", "o_proj", "mlp",
          "feed_forward", "gate_proj", "up_proj", "down_proj")  # fmt: skip


def _model_order(layer: str) -> tuple[Any, ...]:
    """A sort key that puts layers in the order a transformers decoder registers them (block
    numbers as numbers; attention's q, k, v, o, then the MLP's gate, up, down), so the first
    is the one whose copy of a shared matrix ``save_pretrained`` keeps."""
    return tuple(
        (0, int(p), "") if p.isdigit() else (1, _ORDER.index(p) if p in _ORDER else 99, p)
        for p in layer.split(".")
    )


def transform_entries(
    blocks: Mapping[str, int], targets: Callable[[set[str]], list[str]]
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The ``transform_config`` and the stored matrices of layers whose weights are stored
    rotated by block Hadamard matrices.

    Args:
        blocks: layer (module) name -> block size, a power of two.
        targets: layer names -> the config's targets for exactly them (the quantization
            config's target compaction).

    Returns:
        ``(transform_config, {"<first layer>.<group>_input.weight": float64 ±1 matrix})``.

    Raises:
        LowbitError: a block that is not a power of two.
    """
    groups: dict[str, Any] = {}
    tensors: dict[str, np.ndarray] = {}
    for b, gname in _group_names(blocks).items():
        if b < 1 or b & (b - 1):
            raise LowbitError(f"a Hadamard block is a power of two, not {b}")
        members = {m for m, v in blocks.items() if v == b}
        tg = targets(members)
        groups[gname] = {
            "type": "hadamard",
            "apply": [
                {"targets": tg, "location": "input", "inverse": False, "ignore": []},
                {"targets": tg, "location": "weight_input", "inverse": True, "ignore": []},
            ],
            "randomize": False,
            "requires_grad": False,
            "head_dim": b,
            "precision": "torch.float64",
        }
        first = min(members, key=_model_order)
        tensors[f"{first}.{gname}_input.weight"] = (hadamard(b) * np.sqrt(b)).round()
    return {"config_groups": groups}, tensors
