"""The few matplotlib figures the lessons and the CLI share.

Each function takes plain data and returns a ``matplotlib.figure.Figure`` (no pyplot state, so
it works headless); save it with ``fig.savefig(path)`` or show it as a notebook cell's value.
"""

from __future__ import annotations


def plot_speedup_vs_batch(curves: dict[str, list[tuple[float, float]]], compute_bound_batch: float | None = None,
                          title: str = "", measured: dict[str, list[tuple[float, float]]] | None = None):
    """Speedup against batch (log2 axis): modelled ``curves`` as lines, ``measured`` as markers.

    A measured series under the same key as a curve takes that curve's colour.

    A horizontal line marks break-even (speedup 1.0), a vertical one the batch at which
    verification turns compute-bound.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    measured, colour = measured or {}, {}
    for label, points in curves.items():
        (line,) = ax.plot(*zip(*points, strict=True), label=label + (", modelled" if label in measured else ""))
        colour[label] = line.get_color()
    for label, points in measured.items():
        ax.plot(*zip(*points, strict=True), "o", color=colour.get(label),
                label=label + (", measured" if label in colour else ""))
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1, label="break-even (1.0x)")
    if compute_bound_batch is not None:
        ax.axvline(compute_bound_batch, color="gray", linestyle=":", linewidth=1,
                   label=f"verification compute-bound (batch {compute_bound_batch:.0f})")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))  # 64, not 2^6 or 64.0
    ax.set(xlabel="batch size (rows)", ylabel="speedup over plain decoding (x)", title=title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig
