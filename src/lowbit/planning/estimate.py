"""What a model costs at each precision, where it fits, and how fast it could go.

Pure arithmetic over a :class:`~lowbit.planning.archs.ModelSpec` (named tensor shapes plus attention
dimensions) and the hardware catalog. The formulas are stated in ``docs/planning.md``; in short:

- weights: per tensor, ``ceil(n*b/8)`` bytes of codes plus ``ceil(s*bs/8)`` bytes of scales
  (``s`` scales of ``bs`` bits; one per group of ``G`` along the last axis, per row, per tensor,
  or per MX block of 32) plus zero points for asymmetric schemes; double quantization (QLoRA)
  stores the scales in 8 bits with one FP32 constant per 256 of them;
- KV cache: ``2 * layers * kv_heads * head_dim * context * batch`` values at the KV precision;
- decode upper bound: tokens/s = bandwidth / (weight bytes read per token + KV bytes);
- prefill upper bound: tokens/s = peak FLOPS / (2 * parameters used per token).

Schemes are ``lowbit.Scheme`` objects (or a plain :class:`~lowbit.quant.scheme.Cast`), priced
with their own storage arithmetic (:meth:`~lowbit.quant.scheme.Scheme.tensor_bytes`, equal to
what ``lowbit.quantize`` stores), and built from text with the one parser every command uses
(:func:`lowbit.quant.scheme_text.parse_scheme`). A plan file is read with the one reader
(:meth:`lowbit.quant.plan.PrecisionPlan.from_file`) and each tensor is priced as that plan
decides it, so ``lowbit plan --plan-file`` prices what ``lowbit quantize --plan`` writes.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lowbit.checkpoints.names import gguf_to_hf_name
from lowbit.errors import LowbitError
from lowbit.planning.archs import load_spec
from lowbit.planning.hardware import Device, load_hardware, select_devices
from lowbit.planning.modelspec import ModelSpec, TensorInfo
from lowbit.quant.components import COMPONENTS
from lowbit.quant.plan import PrecisionPlan
from lowbit.quant.rules import Rule, parse_rule
from lowbit.quant.scheme import Cast, Granularity, Scheme
from lowbit.quant.scheme_text import parse_scheme

__all__ = [
    "DEFAULT_PRECISIONS",
    "KV_FORMATS",
    "TRAINING_REGIMES",
    "Plan",
    "PrecisionRow",
    "TrainingRegime",
    "TrainingRow",
    "compute_precision",
    "inference_activation_bytes",
    "kv_cache_bytes",
    "plan",
    "tensor_decisions",
    "training_activation_bytes",
]

Precision = Scheme | Cast  # what a row or a KV cache is stored as

GB = 10**9
GIB = 2**30

# ---------------------------------------------------------------------------------------
# Training regimes
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingRegime:
    """Bytes per parameter of each training state, and the activation storage width."""

    name: str
    description: str
    weights: float
    grads: float
    master: float
    optimizer: float
    act_bytes: float  # bytes per stored activation value
    gemm_act_bytes: float  # bytes per stored GEMM input (FP8 training keeps these in FP8)
    compute: str  # precision key for throughput

    @property
    def state_bytes(self) -> float:
        return self.weights + self.grads + self.master + self.optimizer


ADAM8_BLOCK = 2048  # bitsandbytes blockwise 8-bit optimizer: one FP32 absmax per 2048 values
TRAINING_REGIMES = (
    TrainingRegime("fp32", "FP32 weights, grads and Adam moments", 4, 4, 0, 8, 4, 4, "fp32"),
    TrainingRegime("mixed_bf16", "BF16 weights+grads, FP32 master, FP32 Adam (m, v)",
                   2, 2, 4, 8, 2, 2, "bf16"),
    TrainingRegime("fp8", "FP8 weights for the GEMMs, BF16 grads, FP32 master, FP32 Adam; "
                   "GEMM inputs saved in FP8", 1, 2, 4, 8, 2, 1, "fp8"),
    TrainingRegime("adam8bit", "mixed BF16 with 8-bit Adam moments (blockwise, 2048)",
                   2, 2, 4, 2 + 2 * 4 / ADAM8_BLOCK, 2, 2, "bf16"),
)  # fmt: skip


# ---------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrecisionRow:
    """Memory and speed bounds of the model at one precision (one weight scheme)."""

    label: str
    scheme: Precision
    base: str | None
    weight_bytes: int
    component_bytes: dict[str, int]
    read_bytes: float
    kv_bytes: int | None
    activation_bytes: int | None
    devices_needed: dict[str, int]
    decode_tokens_per_s: dict[str, float | None]
    prefill_tokens_per_s: dict[str, float | None]
    compute_precision: dict[str, str | None]
    params: int

    @property
    def bits_per_weight(self) -> float:
        """Stored bits per parameter, scales and zero points included, rules applied."""
        return self.weight_bytes * 8 / self.params

    @property
    def total_bytes(self) -> int:
        """Weights + KV cache + activations (the parts that are known)."""
        return self.weight_bytes + (self.kv_bytes or 0) + (self.activation_bytes or 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.label,
            "base": self.base,
            "element_format": self.scheme.element_format.name,
            "scheme": self.scheme.to_dict(),
            "bits_per_weight": self.bits_per_weight,
            "nominal_bits_per_weight": self.scheme.bits_per_value,
            "weight_bytes": self.weight_bytes,
            "weight_gb": self.weight_bytes / GB,
            "weight_gib": self.weight_bytes / GIB,
            "component_bytes": self.component_bytes,
            "read_bytes_per_token": self.read_bytes,
            "kv_bytes": self.kv_bytes,
            "activation_bytes": self.activation_bytes,
            "total_bytes": self.total_bytes,
            "total_gb": self.total_bytes / GB,
            "devices_needed": self.devices_needed,
            "decode_tokens_per_s_upper_bound": self.decode_tokens_per_s,
            "prefill_tokens_per_s_upper_bound": self.prefill_tokens_per_s,
            "compute_precision": self.compute_precision,
        }


@dataclass(frozen=True)
class TrainingRow:
    """Training memory for one regime, with or without activation checkpointing."""

    regime: TrainingRegime
    checkpointing: bool
    weights: int
    grads: int
    master: int
    optimizer: int
    activations: int | None
    devices_needed: dict[str, int]

    @property
    def total_bytes(self) -> int:
        return self.weights + self.grads + self.master + self.optimizer + (self.activations or 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "regime": self.regime.name,
            "description": self.regime.description,
            "activation_checkpointing": self.checkpointing,
            "weights_bytes": self.weights,
            "grads_bytes": self.grads,
            "master_bytes": self.master,
            "optimizer_bytes": self.optimizer,
            "activation_bytes": self.activations,
            "total_bytes": self.total_bytes,
            "total_gb": self.total_bytes / GB,
            "bytes_per_param": self.regime.state_bytes,
            "devices_needed": self.devices_needed,
        }


@dataclass(frozen=True)
class Plan:
    """The result of :func:`plan`: per-precision rows, optional training rows, devices."""

    model: ModelSpec
    rows: tuple[PrecisionRow, ...]
    devices: tuple[Device, ...]
    context: int | None
    batch: int
    kv_scheme: Precision
    kv_options: dict[str, int] = field(default_factory=dict)
    training: tuple[TrainingRow, ...] = ()
    train_context: int | None = None
    rules: tuple[Rule, ...] = ()
    memory_fraction: float = 0.9
    plan_file: PrecisionPlan | None = None

    def row(self, label: str) -> PrecisionRow:
        """The row for a scheme label or string (``"bf16"``, ``"int4:g128:fp16"``, ``"mxfp4"``,
        ``"int8"`` = ``"int8:ch"``)."""
        want = parse_scheme(label).label if label not in {r.label for r in self.rows} else label
        for r in self.rows:
            if r.label == want:
                return r
        raise LowbitError(f"no row {label!r}; rows: {', '.join(r.label for r in self.rows)}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: model summary, one dict per precision row, training rows, devices."""
        return {
            "version": 1,
            "model": self.model.to_dict(),
            "context": self.context,
            "batch": self.batch,
            "kv_format": self.kv_scheme.label,
            "kv_bytes_by_format": self.kv_options,
            "memory_fraction": self.memory_fraction,
            "rules": [r.to_dict() for r in self.rules],
            **({"plan": self.plan_file.to_dict()} if self.plan_file is not None else {}),
            "rows": [r.to_dict() for r in self.rows],
            "training_context": self.train_context,
            "training": [t.to_dict() for t in self.training],
            "devices": [d.to_dict() for d in self.devices],
        }


# ---------------------------------------------------------------------------------------
# The arithmetic
# ---------------------------------------------------------------------------------------

#: Default rows: each format in its weight layout (as ``lowbit quantize --to FORMAT`` makes
#: it: per output channel, NF4 in blocks of 64), with other layouts of it beside it.
DEFAULT_PRECISIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("fp32", ()),
    ("bf16", ()),
    ("fp16", ()),
    ("fp8_e4m3", ("mxfp8",)),
    ("int8", ("q8_0", "int8:ch:fp16")),
    ("fp6_e3m2", ("mxfp6",)),
    ("int4", ("int4:g128:fp16", "int4:g128:fp16:asym")),
    ("nf4", ("nf4:dq",)),
    ("fp4", ("mxfp4",)),
)
KV_FORMATS = ("bf16", "fp8", "int8", "int4")

_COMPUTE_KEY = {
    "float64": "fp64", "float32": "fp32", "tensorfloat32": "tf32", "bfloat16": "bf16",
    "float16": "fp16", "int8": "int8", "uint8": "int8", "float4_e2m1fn": "fp4",
    "float6_e3m2fn": "fp6", "float6_e2m3fn": "fp6",
}  # fmt: skip


def compute_precision(scheme: Precision, device: Device) -> str | None:
    """The device peak a scheme runs at: its own precision if listed, else BF16, FP16, FP32.

    Weight-only formats the device has no units for (INT4, NF4, FP4 before Blackwell) are
    dequantized to 16 bits for the matrix products.
    """
    elem = scheme.element_format.name
    key = _COMPUTE_KEY.get(elem) or ("fp8" if elem.startswith("float8") else None)
    if key == "fp6" and device.peak("fp6") is None:
        key = "fp8"
    order = [key] if key else []
    order += ["fp32"] if key in ("fp64", "fp32") else ["bf16", "fp16", "fp32"]
    return next((k for k in order if device.peak(k)), None)


_KEPT_BYTES = 2  # a kept tensor of a spec without stored sizes: BF16, as checkpoints are stored


def _price(action: Precision | None, t: TensorInfo) -> int:
    """Stored bytes of one tensor: kept as stored, cast, or quantized.

    Per-channel scales on a 1-D tensor (a norm, a bias, a bare parameter count) are priced as
    one scale: a 1-D tensor is one channel (``lowbit quantize`` keeps such tensors)."""
    if action is None:
        return t.nbytes if t.nbytes is not None else t.numel * _KEPT_BYTES
    if (
        isinstance(action, Scheme)
        and action.granularity is Granularity.CHANNEL
        and len(t.shape) < 2
    ):
        action = replace(action, granularity=Granularity.TENSOR, axis=None)
    return action.tensor_bytes(t.shape)


def _alias(spec: ModelSpec, name: str) -> str | None:
    """A GGUF tensor's transformers name (rules may use either, as in ``lowbit quantize``)."""
    if spec.source != "gguf":
        return None
    try:
        return gguf_to_hf_name(name)
    except LowbitError:
        return None


def tensor_decisions(
    spec: ModelSpec,
    scheme: Precision,
    rules: Sequence[Rule] = (),
    plan_file: PrecisionPlan | None = None,
) -> list[tuple[TensorInfo, int | None, Precision | None]]:
    """What each parameter of ``spec`` becomes in a row: ``(tensor, rule index, action)``.

    With a plan file, each tensor is decided as ``lowbit quantize --plan`` decides it (the
    plan's rules, then ``scheme`` for 2-D linear weights, the rest kept); otherwise the first
    matching rule decides, and ``scheme`` takes every other tensor. Action None: kept.
    """
    out: list[tuple[TensorInfo, int | None, Precision | None]] = []
    if plan_file is not None:
        plan = plan_file.with_default(scheme)
        for t in spec.parameters:
            d = plan.decide(t.name, t.shape, t.dtype or "F32", t.nbytes, _alias(spec, t.name))
            out.append((t, d.rule, d.decision))
        return out
    if not rules:  # the common case, without a generator per tensor (100,000 experts)
        return [(t, None, scheme) for t in spec.parameters]
    for t in spec.parameters:
        alias = _alias(spec, t.name)
        idx = next(
            (
                i
                for i, r in enumerate(rules)
                if r.matches(t.name, t.shape, alias, component=t.component)
            ),
            None,
        )
        out.append((t, idx, rules[idx].action if idx is not None else scheme))
    return out


def _weights(
    spec: ModelSpec,
    scheme: Precision,
    rules: Sequence[Rule],
    plan_file: PrecisionPlan | None,
) -> tuple[int, dict[str, int], float]:
    cache: dict[tuple[int | None, tuple[int, ...], int | None], int] = {}
    total, read = 0, 0.0
    comps = dict.fromkeys(COMPONENTS, 0)
    for t, idx, action in tensor_decisions(spec, scheme, rules, plan_file):
        key = (idx, t.shape, t.nbytes if action is None else None)
        if key not in cache or plan_file is not None:
            cache[key] = _price(action, t)
        b = cache[key]
        total += b
        comps[t.component] += b
        read += b * t.use
    return total, comps, read


def kv_cache_bytes(spec: ModelSpec, context: int, batch: int, scheme: Precision) -> int | None:
    """KV cache bytes: ``2 * layers * kv_heads * head_dim * context * batch`` values.

    Grouped-query attention enters through ``kv_heads``; scaled KV schemes group along
    ``head_dim``. None when the model's attention shape is unknown or it is an encoder.
    """
    per_token = spec.kv_elements_per_token
    if per_token is None:
        return None
    head_dim = spec.head_dim or 1
    return _price(scheme, TensorInfo("kv", (per_token // head_dim * context * batch, head_dim), ""))


def _act_dims(spec: ModelSpec) -> tuple[int, int, int, int, int, bool] | None:
    h, layers, heads, hd = spec.hidden_size, spec.n_layers, spec.n_heads, spec.head_dim
    inter = spec.active_intermediate or spec.intermediate_size
    if None in (h, layers, heads, hd, inter):
        return None
    kv_heads = spec.n_kv_heads or heads
    return h, layers, heads * hd, kv_heads * hd, inter, bool(spec.gated_mlp)  # type: ignore[return-value,operator]


def inference_activation_bytes(
    spec: ModelSpec, context: int, batch: int, act_bytes: int = 2
) -> int | None:
    """Peak transient activations of a prefill, one layer at a time, flash attention.

    ``B*S*(2h + m*i)*a + B*V*4``: the residual stream and the normed input (2h), the MLP
    intermediate (m = 3 values per position for gated MLPs: gate, up and their product;
    2 otherwise), and FP32 logits for the last position only.
    """
    dims = _act_dims(spec)
    if dims is None:
        return None
    h, _, _, _, inter, gated = dims
    per_token = (2 * h + (3 if gated else 2) * inter) * act_bytes
    logits = batch * (spec.vocab_size or 0) * 4 if spec.is_decoder else 0
    return batch * context * per_token + logits


def training_activation_bytes(
    spec: ModelSpec, context: int, batch: int, regime: TrainingRegime, checkpointing: bool
) -> int | None:
    """Activations saved for the backward pass (formula in docs/planning.md).

    Per token and layer the backward pass keeps ``E = 4h + 2q + 2kv + (4i | 2i)`` values:
    the two norm inputs and outputs (4h), Q and the attention output (2q), K and V (2kv),
    and the MLP's gate, up, activation and product (4i, gated) or its two intermediates (2i).
    GEMM inputs (h + q + h + i of them) use ``regime.gemm_act_bytes``, the rest
    ``regime.act_bytes``. Full checkpointing keeps each layer's input (h values) and
    recomputes one layer at a time. Logits for the loss: ``B*S*V*4`` (FP32).
    """
    dims = _act_dims(spec)
    if dims is None:
        return None
    h, layers, q, kv, inter, gated = dims
    total_vals = 4 * h + 2 * q + 2 * kv + (4 if gated else 2) * inter
    gemm_vals = 2 * h + q + inter
    layer = gemm_vals * regime.gemm_act_bytes + (total_vals - gemm_vals) * regime.act_bytes
    stored = h * regime.act_bytes * layers + layer if checkpointing else layer * layers
    tokens = batch * context
    logits = tokens * (spec.vocab_size or 0) * 4
    return math.ceil(tokens * (stored + h * regime.act_bytes) + logits)


def _fit(total: int, devices: Sequence[Device], fraction: float) -> dict[str, int]:
    return {d.id: max(1, math.ceil(total / (d.memory_bytes * fraction))) for d in devices}


def plan(
    model: Any,
    *,
    precisions: Sequence[Any] | None = None,
    context: int | None = None,
    batch: int = 1,
    kv: Any = "bf16",
    train: bool = False,
    train_context: int | None = None,
    keep_embeddings: Any = None,
    keep_norms: Any = None,
    rules: Iterable[Any] | str | Path | None = None,
    devices: Sequence[str] | None = None,
    hardware_file: str | Path | Iterable[str | Path] | None = None,
    memory_fraction: float = 0.9,
    name: str | None = None,
) -> Plan:
    """Plan a model's memory and speed at each precision.

    Args:
        model: a parameter count (``7e9``, ``"7B"``), a ``config.json`` path or dict, a
            safetensors file or folder, a ``.gguf`` file, a shipped model name
            (``"smollm2"``, ``"minilm"``), or a :class:`~lowbit.planning.archs.ModelSpec`.
        precisions: weight schemes, one row each (strings as :func:`parse_scheme`, dicts or
            ``lowbit.Scheme`` objects); default :data:`DEFAULT_PRECISIONS` (every plain
            format followed by its scaled forms).
        context: tokens in the KV cache (and the prefill length for activations).
        batch: sequences decoded together.
        kv: KV-cache precision (``bf16``, ``fp8``, ``int8``, ``int4`` or any scheme).
        train: add the training breakdown (FP32, mixed BF16, FP8, 8-bit Adam; each with and
            without activation checkpointing).
        train_context: sequence length for training activations (default: context or 2048).
        keep_embeddings: scheme for embeddings and lm_head in every row (a mixed plan).
        keep_norms: scheme for 1-D tensors (norms and biases) in every row.
        rules: ordered rules (plan-file rule dicts or :class:`~lowbit.quant.rules.Rule`; the
            first match decides, the row's scheme takes the rest), or a plan file path or
            :class:`~lowbit.quant.plan.PrecisionPlan` (each tensor priced as ``lowbit quantize
            --plan`` decides it; the plan's ``default`` becomes the only row unless
            ``precisions`` is given, and each row replaces it). Rules from the keep flags come
            first.
        devices: catalog ids or names to fit and time (default: all).
        hardware_file: extra catalog rows (JSON/YAML), overriding same-id rows.
        memory_fraction: share of device memory usable for the model (default 0.9).
        name: display name for the model.

    Returns:
        A :class:`Plan`; ``plan.to_dict()`` is what ``lowbit plan --json`` prints.

    Raises:
        LowbitError: bad model input, scheme, rule or hardware row.
    """
    spec = load_spec(model, name)
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise LowbitError(f"batch must be a positive integer, got {batch!r}")
    for what, value in (("context", context), ("train_context", train_context)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise LowbitError(f"{what} must be a positive integer, got {value!r}")
    if not 0 < memory_fraction <= 1:
        raise LowbitError(f"memory_fraction must be in (0, 1], got {memory_fraction!r}")

    rule_list: list[Rule] = []
    if keep_embeddings is not None:
        rule_list.append(Rule(parse_scheme(keep_embeddings), component=("embeddings", "lm_head")))
    if keep_norms is not None:
        rule_list.append(Rule(parse_scheme(keep_norms), ndim=1))
    plan_file = None
    if isinstance(rules, (str, Path)):
        plan_file = PrecisionPlan.from_file(rules)
    elif isinstance(rules, PrecisionPlan):
        plan_file = rules
    elif rules is not None:
        rule_list += [parse_rule(r) for r in rules]
    if plan_file is not None:
        plan_file = replace(plan_file, rules=tuple(rule_list) + plan_file.rules)
        rule_list = list(plan_file.rules)

    for r in rule_list:
        if not any(
            r.matches(t.name, t.shape, _alias(spec, t.name), component=t.component)
            for t in spec.parameters
        ):
            warnings.warn(f"plan rule {r.to_dict()} matches no tensor of {spec.name}", stacklevel=2)

    rows_spec: list[tuple[Precision, str | None]] = []
    if precisions is not None:
        schemes = [parse_scheme(p) for p in precisions]
        bases: dict[str, str] = {}
        for sch in schemes:
            elem = sch.element_format.name
            base = bases.get(elem)
            rows_spec.append((sch, base if base != sch.label else None))
            bases.setdefault(elem, sch.label)
    elif plan_file is not None and plan_file.default is not None:
        rows_spec = [(plan_file.default, None)]
    else:
        for base, variants in DEFAULT_PRECISIONS:
            b = parse_scheme(base)
            rows_spec.append((b, None))
            rows_spec += [(parse_scheme(v), b.label) for v in variants]
    if not rows_spec:
        raise LowbitError("no precisions to plan")

    catalog = load_hardware(hardware_file)
    chosen = select_devices(devices, catalog)
    kv_scheme = parse_scheme(kv)
    kv_bytes = kv_cache_bytes(spec, context, batch, kv_scheme) if context else None
    kv_options = {}
    if context and kv_bytes is not None:
        for k in KV_FORMATS:
            kv_options[parse_scheme(k).label] = kv_cache_bytes(
                spec, context, batch, parse_scheme(k)
            )

    params = spec.params
    used = spec.params_per_token
    rows = []
    for scheme, base in rows_spec:
        wbytes, comps, read = _weights(spec, scheme, rule_list, plan_file)
        act_b = 4 if scheme.element_bits >= 32 else 2
        act = inference_activation_bytes(spec, context, batch, act_b) if context else None
        total = wbytes + (kv_bytes or 0) + (act or 0)
        need = _fit(total, chosen, memory_fraction)
        decode, prefill, comp = {}, {}, {}
        for d in chosen:
            n = need[d.id]
            step = read + (kv_bytes or 0)
            decode[d.id] = n * d.bandwidth_gbs * 1e9 / step if spec.is_decoder and step else None
            key = compute_precision(scheme, d)
            comp[d.id] = key
            peak = d.peak(key) if key else None
            prefill[d.id] = n * peak * 1e12 / (2 * used) if peak and used else None
        rows.append(
            PrecisionRow(
                label=scheme.label,
                scheme=scheme,
                base=base,
                weight_bytes=wbytes,
                component_bytes=comps,
                read_bytes=read,
                kv_bytes=kv_bytes,
                activation_bytes=act,
                devices_needed=need,
                decode_tokens_per_s=decode,
                prefill_tokens_per_s=prefill,
                compute_precision=comp,
                params=params,
            )
        )

    training: list[TrainingRow] = []
    tctx = None
    if train:
        tctx = train_context or context or 2048
        for regime in TRAINING_REGIMES:
            for ckpt in (False, True):
                act = training_activation_bytes(spec, tctx, batch, regime, ckpt)
                states = [math.ceil(params * b) for b in (regime.weights, regime.grads,
                                                          regime.master, regime.optimizer)]  # fmt: skip
                total = sum(states) + (act or 0)
                training.append(
                    TrainingRow(regime, ckpt, *states, act, _fit(total, chosen, memory_fraction))
                )
    return Plan(
        model=spec,
        rows=tuple(rows),
        devices=chosen,
        context=context,
        batch=batch,
        kv_scheme=kv_scheme,
        kv_options=kv_options,
        training=tuple(training),
        train_context=tctx,
        rules=tuple(rule_list),
        memory_fraction=memory_fraction,
        plan_file=plan_file,
    )
