"""What quality a quantized model keeps (needs torch and transformers, imported on use).

- :mod:`~lowbit.evaluation.models`: runnable transformers models built from checkpoints.
- :mod:`~lowbit.evaluation.perplexity`: perplexity/KL for causal LMs, embedding fidelity for
  encoders.
- :mod:`~lowbit.evaluation.variants`: one table of quantized variants against the reference.
- :mod:`~lowbit.evaluation.activations`: simulated activation quantization (W8A8).
- :mod:`~lowbit.evaluation.calibration`: calibration data (never what an evaluation measures)
  and the per-layer Hessians collected on it.
- :mod:`~lowbit.evaluation.gptq_model`: GPTQ of a whole model, block by block.
- :mod:`~lowbit.evaluation.awq_model`: AWQ and SmoothQuant of a whole model, block by block.
- :mod:`~lowbit.evaluation.calibrated`: ``lowbit.quantize_model``: any method (round to
  nearest, GPTQ, AWQ, SmoothQuant), then the checkpoint written.
"""

from __future__ import annotations

__all__: list[str] = []
