"""Apple MLX folders (mlx-lm's layout): the writer of ``--out-format mlx`` and their reader.

Written by ``lowbit quantize --out-format mlx``, read back dequantized as sources for eval,
verify and re-quantization.

A folder holds ``config.json`` (the model's, with mlx-lm's ``quantization`` block and its copy
``quantization_config``), ``model.safetensors`` (or ``model-0000i-of-0000n.safetensors`` with
``model.safetensors.index.json``) and the tokenizer files. Each quantized module ``<path>``
stores ``<path>.weight`` as uint32 words (``lowbit.quant.mlx``'s packed rows), ``<path>.scales``
and, in affine mode, ``<path>.biases``.
"""

from lowbit.checkpoints.mlx.params import MLXParams, is_mlx_config

__all__ = ["MLXParams", "is_mlx_config"]
