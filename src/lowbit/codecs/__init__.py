"""Bits to values and back, fast: the vectorised numpy codec, its numba kernels, and packing.

- :mod:`~lowbit.codecs.vectorised`: float encode/decode on the integer bit fields of float64
  (numpy), in cache-sized chunks.
- :mod:`~lowbit.codecs._numba` and :mod:`~lowbit.codecs._kernels`: the same codec compiled with
  numba when it is installed (bit for bit the numpy path's results).
- :mod:`~lowbit.codecs.packing`: sub-byte codes packed into bytes, one documented bit order.

Formats (:mod:`lowbit.formats`) call down into these for their array methods; nothing here
knows about scales or tensors (that is :mod:`lowbit.quant`).
"""

from __future__ import annotations

from lowbit.codecs.packing import pack, packed_nbytes, unpack

__all__ = ["pack", "packed_nbytes", "unpack"]
