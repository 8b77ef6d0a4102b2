"""Bits to values and back, fast: the vectorised numpy codec, its numba kernels, and packing.

- :mod:`~lowbit.codecs.vectorised`: float encode/decode on the integer bit fields of float64
  (numpy), in cache-sized chunks.
- :mod:`~lowbit.codecs._numba` and :mod:`~lowbit.codecs._kernels`: the same codec compiled with
  numba when it is installed (bit for bit the numpy path's results).
- :mod:`~lowbit.codecs._common`: what both paths share (errors, value tables, and
  :class:`~lowbit.codecs._common.FloatFields`, the fields a codec reads of a format).
- :mod:`~lowbit.codecs.packing`: sub-byte codes packed into bytes, one documented bit order.

The codecs sit below the formats: :mod:`lowbit.formats` calls down into them for its array
methods, and they import no format class (only :mod:`lowbit.enums`). Nothing here knows
about scales or tensors (that is :mod:`lowbit.quant`).
"""

from __future__ import annotations

from lowbit.codecs.packing import pack, packed_nbytes, unpack

__all__ = ["pack", "packed_nbytes", "unpack"]
