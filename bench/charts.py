"""Histograms for the documentation site, drawn by the benchmarks (``--chart PATH``).

A distribution reads better as a picture than as two percentiles: where the
bulk lies, how long the tail is, and how two contenders measured in the same
run differ. One SVG per chart, overlaid step histograms on shared bins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server
import matplotlib.pyplot as plt  # after the backend is chosen

plt.rcParams["svg.fonttype"] = "none"  # text as text: searchable, and smaller


def histograms(
    path: Path, title: str, unit: str, series: Mapping[str, Sequence[float]], *, note: str = ""
) -> None:
    """Write ``series`` (label -> values in ``unit``) as one SVG histogram at ``path``.

    The x axis ends at the largest p99.9 of the series, so that one outlier
    does not squeeze the rest into a single bin; how many values lie beyond is
    said in the legend."""
    drawn = {label: sorted(values) for label, values in series.items() if values}
    if not drawn:
        raise ValueError(f"no values to draw for {title!r}")
    top = max(v[min(len(v) - 1, int(len(v) * 0.999))] for v in drawn.values()) or 1.0
    bins = [top * i / 60 for i in range(61)]
    figure, axes = plt.subplots(figsize=(8, 5), layout="constrained")
    for label, values in drawn.items():
        beyond = sum(v > top for v in values)
        median = values[len(values) // 2]
        name = f"{label}: median {median:.2f} {unit}, n={len(values)}"
        if beyond:
            name += f", {beyond} beyond the axis"
        axes.hist(
            [min(v, top) for v in values], bins=bins, histtype="step", linewidth=1.5, label=name
        )
    axes.set_title(title)
    axes.set_xlabel(f"{unit}; {note}" if note else unit)
    axes.set_ylabel("count")
    # Below the axes: over them it hides the peaks it names.
    axes.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.15))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="svg", metadata={"Date": None})  # no date: a rerun diffs only data
    plt.close(figure)
