"""A notebook user's script, from the README and docs: must be mypy --strict clean."""

from __future__ import annotations

import numpy as np

import lowbit


def main(out: str) -> None:
    w = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    qt: lowbit.QuantizedTensor = lowbit.quantize(w, "int4:g128")
    back = lowbit.dequantize(qt)
    k4: lowbit.GgmlTensor = lowbit.quantize(w, "q4_k")
    scheme = lowbit.parse_scheme("nvfp4")
    assert isinstance(scheme, lowbit.Scheme)
    bits: float = lowbit.quantize(w, scheme).bits_per_value + k4.bits_per_value
    plan = lowbit.PrecisionPlan.uniform("int4", group_size=128)
    calib = lowbit.Calibration(samples=8, length=64)
    texts = lowbit.Calibration(source=["a calibration text", "another one"])
    tokens = lowbit.Calibration(source=np.zeros((4, 64), dtype=np.int64))
    gptq = lowbit.GPTQ(damp=0.01)
    ckpt = lowbit.open_checkpoint("smollm2")
    names: list[str] = ckpt.names()
    model = lowbit.load_model("smollm2")
    res = lowbit.quantize_model("smollm2", plan, out, method=gptq, calibration=calib)
    print(back.shape, bits, names[:3], model, res, texts.source, tokens.tokens)
