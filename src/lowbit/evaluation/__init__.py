"""What quality a quantized model keeps (needs torch and transformers, imported on use).

- :mod:`~lowbit.evaluation.models`: runnable transformers models built from checkpoints.
- :mod:`~lowbit.evaluation.perplexity`: perplexity/KL for causal LMs, embedding fidelity for
  encoders.
- :mod:`~lowbit.evaluation.variants`: one table of quantized variants against the reference.
- :mod:`~lowbit.evaluation.activations`: simulated activation quantization (W8A8).
"""

from __future__ import annotations

__all__: list[str] = []
