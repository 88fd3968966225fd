"""Plots of an :class:`~hdmm.georelease.report.AccuracyReport`: error by level and bias by unit size.

matplotlib is an optional extra (``pip install 'hdmm[plot]'``), imported only when a plot is made.
The figures are :class:`matplotlib.figure.Figure` objects made without pyplot (no global state, no
display needed); a notebook shows them, ``path=`` saves them (PNG, or any type matplotlib writes).
"""

from __future__ import annotations

import os

import numpy as np

from .report import AccuracyReport

__all__ = ["plot_error_by_level", "plot_bias_by_size"]


def _figure(width: float, height: float):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("plots of the accuracy report need matplotlib: pip install 'hdmm[plot]'") from None
    return Figure(figsize=(width, height), layout="constrained")


def _save(fig, path: str | os.PathLike | None):
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def plot_error_by_level(report: AccuracyReport, measure: str = "total population", *,
                        path: str | os.PathLike | None = None, log: bool = False):
    """Grouped bars: the RMSE of ``measure`` per level (x) for every output (one bar each).

    Returns the figure; saved to ``path`` if given.
    """
    table = report.rmse(measure)
    fig = _figure(1.6 + 1.1 * len(table), 3.4)
    ax = fig.add_subplot()
    x = np.arange(len(table))
    width = 0.8 / max(1, table.shape[1])
    for i, output in enumerate(table.columns):
        ax.bar(x + (i - (table.shape[1] - 1) / 2) * width, table[output].to_numpy(), width, label=str(output))
    ax.set_xticks(x, [str(v) for v in table.index])
    ax.set_ylabel(f"RMSE of {measure}")
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize="small")
    ax.set_title(f"Error by level\n{report.privacy}" if report.privacy else "Error by level", fontsize="medium")
    return _save(fig, path)


def plot_bias_by_size(report: AccuracyReport, *, levels=None, path: str | os.PathLike | None = None):
    """Mean signed error of the total population by unit size, with +/- 1 standard error bars.

    One panel per level (``levels``: default every level with more than one unit), one series per
    output, the size bins on the x axis (only the bins that hold units). Returns the figure.
    """
    bias = report.bias
    units = report.errors.drop_duplicates("level").set_index("level")["units"]
    if levels is None:
        levels = [lv for lv in bias["level"].cat.categories if units.get(lv, 0) > 1] or list(units.index)
    levels = [str(lv) for lv in levels]
    fig = _figure(max(4.0, 3.6 * len(levels)), 3.4)
    axes = fig.subplots(1, len(levels), squeeze=False)[0]
    outputs = list(bias["output"].cat.categories)
    for ax, level in zip(axes, levels):
        here = bias[bias["level"] == level]
        bins = [b for b in bias["size"].cat.categories if (here["size"] == b).any()]
        x = np.arange(len(bins))
        shift = 0.5 / max(1, len(outputs))
        for i, output in enumerate(outputs):
            rows = here[here["output"] == output].set_index("size").reindex(bins)
            se = np.nan_to_num(rows["standard error"].to_numpy(dtype=float))
            ax.errorbar(x + (i - (len(outputs) - 1) / 2) * shift, rows["mean signed error"].to_numpy(dtype=float),
                        yerr=se, fmt="o", capsize=3, label=str(output))
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_xticks(x, bins, rotation=30)
        ax.set_xlabel("true population of the unit")
        ax.set_title(level, fontsize="medium")
    axes[0].set_ylabel("mean signed error of total population")
    axes[0].legend(fontsize="small")
    if report.privacy:
        fig.suptitle(f"Bias by unit size (bars: +/- 1 standard error)\n{report.privacy}", fontsize="medium")
    return _save(fig, path)
