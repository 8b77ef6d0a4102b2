"""Pictures of formats and checkpoints: ``lowbit report`` (one self-contained HTML page per
quantized checkpoint) and ``lowbit explore`` (a local format explorer in the browser).

- :mod:`lowbit.view.report`: the data of a report, read tensor by tensor;
- :mod:`lowbit.view.svg`: small inline-SVG charts (heatmap, histogram with levels, scatter with
  a frontier, bars);
- :mod:`lowbit.view.html`: the report page;
- :mod:`lowbit.view.png`: the same figures as PNGs (matplotlib);
- :mod:`lowbit.cli._explore_server`: the explorer's server (standard library only) and page.

Nothing here is imported by ``import lowbit``.
"""

from __future__ import annotations

__all__: list[str] = []
