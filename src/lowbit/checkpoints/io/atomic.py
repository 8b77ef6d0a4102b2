"""Write a file or a folder under a temporary name beside it, then swap it in.

The writers (lowbit checkpoints, compressed-tensors, GGUF, safetensors) use these two names;
what they guarantee (no output over an input or over what lowbit did not write, crash-safe
replacement, a lock per output, debris of killed runs cleaned up, the umask honoured, write
errors reported against the output) is described and implemented in
``lowbit.checkpoints.io.outputs``.
"""

from __future__ import annotations

from lowbit.checkpoints.io.outputs import output_dir as atomic_dir
from lowbit.checkpoints.io.outputs import output_file as atomic_file

__all__ = ["atomic_dir", "atomic_file"]
