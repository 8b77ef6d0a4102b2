"""What quality a quantized model keeps (needs torch and transformers, imported on use).

- :mod:`~lowbit.evaluation.perplexity`: perplexity/KL for causal LMs, embedding fidelity for
  encoders.
- :mod:`~lowbit.evaluation.variants`: one table of quantized variants against the reference
  (:mod:`~lowbit.evaluation.calibrated_variants`: its GPTQ, AWQ and SmoothQuant rows).
- :mod:`~lowbit.evaluation.sensitivity`: what each tensor costs when it alone is quantized.

The models come from :mod:`lowbit.models`, the text and the calibrated methods' drivers from
:mod:`lowbit.calibration`.
"""

from __future__ import annotations

__all__: list[str] = []
