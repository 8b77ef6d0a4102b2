"""Emulated matmuls: :class:`EmulatedLinear`, :class:`EmulatedMatMul`, :func:`emulate`.

Each matmul rounds its operands, its output and its three gradients through per-role
quantizers; rounding is the identity in the backward pass (the straight-through estimator
FP8 training and absmax QAT use: nothing is clipped there). :func:`emulate` swaps them into a
model in place; :func:`emulation_stats` sums their counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from lowbit.formats.base import Format
from lowbit.torch.quantizer import Quantizer

__all__ = ["EmulatedLinear", "EmulatedMatMul", "MatMul", "RoleSpec", "emulate", "emulation_stats"]

RoleSpec = str | Format | Callable[[], Any] | None


def _make(spec: RoleSpec, role: str = "input") -> Any:
    if spec is None:
        return None
    if isinstance(spec, (str, Format)):
        # underflow is counted where it matters (gradients): counting costs two passes
        return Quantizer(spec, count=True if role.startswith("grad") else "overflow")
    return spec()


class _Roles:
    """The six quantizers of one matmul: two operands, output, and three gradients."""

    names = ("input", "weight", "output", "grad_output", "grad_input", "grad_weight")

    def __init__(self, specs: dict[str, RoleSpec]) -> None:
        for n in self.names:
            setattr(self, n, _make(specs.get(n), n))

    def items(self) -> list[tuple[str, Any]]:
        return [(n, getattr(self, n)) for n in self.names if getattr(self, n) is not None]


def _q(qz: Any, x: torch.Tensor) -> torch.Tensor:
    return x if qz is None else qz(x)


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, roles: _Roles
    ) -> Any:  # type: ignore[override]
        xq = _q(roles.input, x)
        wq = _q(roles.weight, w)
        y = torch.nn.functional.linear(xq, wq, b)
        ctx.save_for_backward(xq, wq)
        ctx.roles = roles
        ctx.has_bias = b is not None
        return _q(roles.output, y)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:  # type: ignore[override]
        xq, wq = ctx.saved_tensors
        r = ctx.roles
        need_x, need_w, need_b, _ = ctx.needs_input_grad
        gq = _q(r.grad_output, g)
        dx = _q(r.grad_input, gq @ wq) if need_x else None
        g2 = gq.reshape(-1, gq.shape[-1])
        dw = _q(r.grad_weight, g2.t() @ xq.reshape(-1, xq.shape[-1])) if need_w else None
        db = _q(r.grad_weight, g2.sum(0)) if ctx.has_bias and need_b else None
        return dx, dw, db, None


class _MatMulFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, roles: _Roles, rb: Any) -> Any:  # type: ignore[override]
        aq = _q(roles.input, a)
        bq = _q(rb, b)
        ctx.save_for_backward(aq, bq)
        ctx.roles = roles
        return _q(roles.output, aq @ bq)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:  # type: ignore[override]
        aq, bq = ctx.saved_tensors
        r = ctx.roles
        gq = _q(r.grad_output, g)
        da = _q(r.grad_input, gq @ bq.transpose(-1, -2))
        db = _q(r.grad_weight, aq.transpose(-1, -2) @ gq)
        return da, db, None, None


class EmulatedLinear(nn.Module):
    """An ``nn.Linear`` whose matmuls run on rounded inputs, weights and gradients.

    Forward: ``y = R_out(R_in(x) @ R_w(W).T + b)``; backward: ``g' = R_grad_out(g)``,
    ``dx = R_grad_in(g' @ R_w(W))``, ``dW = R_grad_w(g'.T @ R_in(x))``, ``db = R_grad_w(sum g')``
    (accumulation in the working dtype, like a float32 accumulator; rounding is the identity
    to the gradient). Shares the parameters of the linear it wraps.

    Args:
        linear: the module to wrap.
        **roles: ``input``, ``weight``, ``output``, ``grad_output``, ``grad_input``,
            ``grad_weight``: a format (plain rounding), a zero-argument factory returning a
            quantizer (a callable on tensors, e.g. :class:`Quantizer` or a delayed scaler),
            or None (no rounding).
    """

    def __init__(self, linear: nn.Linear, **roles: RoleSpec) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.roles = _Roles(roles)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _LinearFn.apply(x, self.weight, self.bias, self.roles)

    def extra_repr(self) -> str:
        q = ", ".join(f"{n}={qz!r}" for n, qz in self.roles.items())
        return f"in_features={self.in_features}, out_features={self.out_features}, {q}"


class MatMul(nn.Module):
    """``a @ b`` as a module, so :func:`emulate` can find the matmuls that are not linears."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


class EmulatedMatMul(nn.Module):
    """``a @ b`` with both operands rounded by ``input``-role quantizers (as :class:`EmulatedLinear`)."""

    def __init__(self, **roles: RoleSpec) -> None:
        super().__init__()
        self.roles = _Roles(roles)
        self.rhs = _make(roles.get("input"))  # its own scaling state

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return _MatMulFn.apply(a, b, self.roles, self.rhs)


def emulate(
    model: nn.Module,
    *,
    input: RoleSpec = None,
    weight: RoleSpec = None,
    output: RoleSpec = None,
    grad_output: RoleSpec = None,
    grad_input: RoleSpec = None,
    grad_weight: RoleSpec = None,
    matmuls: bool = True,
    exclude: Iterable[str] = (),
) -> nn.Module:
    """Swap every ``nn.Linear`` (and :class:`MatMul`) of ``model`` for an emulated one, in place.

    Each wrapped module gets its own quantizers (a factory is called once per role per
    module), so per-tensor scaling state is per tensor.

    Args:
        model: the model; its parameters are kept (optimizers built before stay valid).
        input, weight, output, grad_output, grad_input, grad_weight: as :class:`EmulatedLinear`.
        matmuls: also replace :class:`MatMul` modules (attention's matmuls); their operands
            use the ``input`` role.
        exclude: qualified module names (or prefixes) to leave alone, e.g. ``"lm_head"``.

    Returns:
        The same model.
    """
    roles = {
        "input": input,
        "weight": weight,
        "output": output,
        "grad_output": grad_output,
        "grad_input": grad_input,
        "grad_weight": grad_weight,
    }
    skip = tuple(exclude)
    for name, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if any(full == s or full.startswith(s + ".") for s in skip):
                continue
            if type(child) is nn.Linear:
                setattr(mod, child_name, EmulatedLinear(child, **roles))
            elif matmuls and type(child) is MatMul:
                setattr(mod, child_name, EmulatedMatMul(**roles))
    return model


def emulation_stats(model: nn.Module) -> dict[str, dict[str, int]]:
    """Counters of every quantizer in ``model``, summed per role (``grad_output``, ...)."""
    out: dict[str, dict[str, int]] = {}
    for mod in model.modules():
        if isinstance(mod, (EmulatedLinear, EmulatedMatMul)):
            items = mod.roles.items()
            if isinstance(mod, EmulatedMatMul) and mod.rhs is not None:
                items.append(("input", mod.rhs))
            for role, qz in items:
                st = getattr(qz, "stats", None)
                if st:
                    acc = out.setdefault(role, dict.fromkeys(st, 0))
                    for k, v in st.items():
                        acc[k] = acc.get(k, 0) + v
    return out
