"""The few matplotlib figures the lessons and the CLI share.

Each function takes plain data and returns a ``matplotlib.figure.Figure`` (no pyplot state, so
it works headless); save it with ``fig.savefig(path)`` or show it as a notebook cell's value.
"""

from __future__ import annotations

# What brings matplotlib: the course's extra (the plain install has no plotting library), or matplotlib alone.
PLOT_INSTALL = 'pip install "minispec-decoding[lessons]" (or pip install matplotlib)'


def matplotlib_missing() -> str | None:
    """None when matplotlib imports; else why not and how to install it, for a command to say before its work."""
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError as e:
        return f"matplotlib is not installed ({e}); {PLOT_INSTALL} to draw plots"
    return None


def plot_or_skip(path: str | None) -> str | None:
    """A command's --plot file, or None when matplotlib is missing, said on stderr before the command's work (it
    still prints its report); :func:`plot_skipped` says it again at the end."""
    import sys

    missing = path and matplotlib_missing()
    if missing:
        print(f"minispec: warning: {missing}; the report follows, the plot to {path} is skipped", file=sys.stderr)
        return None
    return path


def plot_skipped(asked: str | None, drawn: str | None) -> None:
    """After the report: the plot asked for (``asked``) was not drawn (``drawn`` None), and how to get it."""
    import sys

    if asked and not drawn:
        sys.stdout.flush()
        print(f"minispec: plot skipped ({asked} not written): matplotlib is not installed; {PLOT_INSTALL}",
              file=sys.stderr)


def figure_class():
    """matplotlib's Figure, or an ImportError that says how to install it."""
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(f"plots need matplotlib: {PLOT_INSTALL}") from e
    return Figure


def plot_speedup_vs_batch(curves: dict[str, list[tuple[float, float]]], compute_bound_batch: float | None = None,
                          title: str = "", measured: dict[str, list[tuple[float, float]]] | None = None,
                          max_batch: float | dict[str, float] | None = None):
    """Speedup against batch (log2 axis): modelled ``curves`` as lines, ``measured`` as markers.

    A measured series under the same key as a curve takes that curve's colour. ``max_batch`` (one
    batch for all curves, or one per curve label) ends each curve where memory ends, marked "x".

    A horizontal line marks break-even (speedup 1.0), a vertical one the batch at which
    verification turns compute-bound.
    """
    Figure = figure_class()
    from matplotlib.ticker import FuncFormatter

    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    measured, colour = measured or {}, {}
    full = "memory full (larger batches do not fit)"  # the legend entry of the first "x" only
    for label, points in curves.items():
        limit = max_batch.get(label) if isinstance(max_batch, dict) else max_batch
        fits = [p for p in points if limit is None or p[0] <= limit]
        if not fits:
            continue
        (line,) = ax.plot(*zip(*fits, strict=True), label=label + (", modelled" if label in measured else ""))
        colour[label] = line.get_color()
        if len(fits) < len(points):
            ax.plot(*fits[-1], "x", color=line.get_color(), markersize=9, label=full)
            full = None
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


def plot_serving(rows: list[dict], tpot_slo_s: float | None = None, title: str = ""):
    """TPOT p50/p99 and SLO-met tokens/s against arrival rate, one colour per setting (rows of ``serving.sweep``).

    Left: TPOT in ms, p50 dashed, p99 solid, the TPOT SLO as a grey line. Right: the output tokens/s of the
    requests that met the SLOs (solid; the rows' ``goodput``, for the SLOs they were summarised with) and all
    output tokens/s (dotted). DistServe's goodput, a request rate, is the highest rate at which the share of
    requests meeting the SLOs stays above a target.
    """
    Figure = figure_class()

    fig = Figure(figsize=(11, 4.5), layout="constrained")
    tpot, good = fig.subplots(1, 2)
    for setting in dict.fromkeys(r["setting"] for r in rows):  # in order of first appearance
        mine = sorted((r for r in rows if r["setting"] == setting), key=lambda r: r["rate"])
        rate = [r["rate"] for r in mine]
        (line,) = tpot.plot(rate, [1e3 * r["tpot_p99_s"] for r in mine], "o-", label=f"{setting}, p99")
        tpot.plot(rate, [1e3 * r["tpot_p50_s"] for r in mine], "--", color=line.get_color(), label=f"{setting}, p50")
        good.plot(rate, [r["goodput"] for r in mine], "o-", color=line.get_color(), label=f"{setting}, SLO-met")
        good.plot(rate, [r["throughput"] for r in mine], ":", color=line.get_color(), label=f"{setting}, throughput")
    if tpot_slo_s is not None:
        tpot.axhline(1e3 * tpot_slo_s, color="gray", linestyle="--", linewidth=1, label=f"SLO {1e3 * tpot_slo_s:g} ms")
    tpot.set(xlabel="arrival rate (requests/s)", ylabel="TPOT (ms)", title="time per output token")
    good.set(xlabel="arrival rate (requests/s)", ylabel="output tokens/s",
             title="tokens/s of requests within the SLOs (solid), of all (dotted)")
    for ax in (tpot, good):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    return fig


# The roofline explorer's knobs and their defaults: the reference setting of lesson 04.
EXPLORER_DEFAULTS = dict(
    alpha=0.8,  # acceptance rate of one draft token
    gamma=4,  # draft tokens per step
    draft_cost=0.05,  # c, a draft step over a plain target step; used when draft is None
    draft=None,  # None = a constant c; or a key of roofline.MODEL_SHAPES: that shape's own step time
    draft_kv_window=None,  # tokens of KV the draft keeps per row (None = all of the context)
    batches=(1, 512),  # the batch axis, first and last
    context=0,  # tokens of KV per row (0 = weights only, the reference)
    weight_bits=16,  # bits per weight of target and draft shape: 16 (BF16), 8, 4 (W4A16); the KV stays BF16
    hardware="h100",  # a key of hardware.HARDWARE
    target="llama-8b",  # a key of roofline.MODEL_SHAPES
)


def roofline_figure(**settings):
    """Speedup against batch from the roofline for ``settings`` (see ``EXPLORER_DEFAULTS``), beside
    the reference (8B BF16 on an H100, alpha 0.8, gamma 4, c 0.05, weights only) in grey.

    The title gives the break-even batch; the dotted line is where verification turns compute-bound,
    the dashed red one where speculation stops paying, and an "x" ends the curve where memory ends.
    """
    import math

    from minispec import roofline as rl
    from minispec.roofline import hardware as hw_presets

    unknown = set(settings) - set(EXPLORER_DEFAULTS)
    if unknown:
        raise TypeError(f"unknown setting(s) {', '.join(sorted(unknown))}; settings: {', '.join(EXPLORER_DEFAULTS)}")
    s = EXPLORER_DEFAULTS | settings
    hw, bits = hw_presets.HARDWARE[s["hardware"]], s["weight_bits"]
    at_bits = lambda shape: shape if bits == 16 else rl.quantized(shape, bits)  # noqa: E731
    target = at_bits(rl.MODEL_SHAPES[s["target"]])
    draft = None if s["draft"] is None else at_bits(rl.MODEL_SHAPES[s["draft"]])
    knobs = dict(alpha=s["alpha"], gamma=s["gamma"], draft_cost=s["draft_cost"], hardware=hw, model=target,
                 context=s["context"], draft=draft, draft_kv_window=s["draft_kv_window"] if draft else None)
    lo, hi = s["batches"]
    grid = [2 ** (i / 8) for i in range(round(8 * math.log2(lo)), round(8 * math.log2(hi)) + 1)]  # 8 per doubling
    drafted = f"draft {draft.name}" if draft else f"c {s['draft_cost']:g}"
    label = (f"{target.name} on {hw.name}, alpha {s['alpha']:g}, gamma {s['gamma']}, {drafted}, "
             f"context {s['context']}")
    curves = {label: [(B, rl.speculative_speedup(B, **knobs)) for B in grid],
              "reference: 8B BF16 on H100, alpha 0.8, gamma 4, c 0.05": [(B, rl.speculative_speedup(B)) for B in grid]}
    fits = rl.max_batch(hw, target, s["context"], draft, draft_kv_window=knobs["draft_kv_window"])
    bound = rl.compute_bound_batch(s["gamma"], hw, target, s["context"])
    even = rl.break_even_batch(**knobs)
    verdict = ("never pays" if even == 0 else "pays at every batch" if even == math.inf
               else f"break-even at batch {even:.0f}")
    fig = plot_speedup_vs_batch(curves, bound if lo <= bound <= hi else None, title=verdict,
                                max_batch={label: fits})
    ax = fig.axes[0]
    for line in ax.lines:  # the reference: the curve every setting is compared with, in grey behind it
        if line.get_label().startswith("reference"):
            line.set(color="lightgray", zorder=0)
    if fits == 0:
        ax.set_title(f"{verdict}; the weights do not fit in {hw.name}'s memory")
    elif fits < math.inf:
        ax.set_title(f"{verdict}; memory holds {fits} rows")
    if lo <= even <= hi:
        ax.axvline(even, color="tab:red", linestyle="--", linewidth=1, label=f"speculation stops paying ({even:.0f})")
    ax.legend(fontsize="small")
    return fig


def roofline_explorer(interactive: bool | None = None, **defaults):
    """:func:`roofline_figure` with sliders: alpha, gamma, c or a draft shape, the draft's KV window, the
    batch range, context, weight bits, hardware and target. ``defaults`` override ``EXPLORER_DEFAULTS``.

    ``interactive``: True = ipywidgets controls that redraw the figure (returns the widget box);
    False = a static figure of the defaults (returns it). None = controls when ipywidgets imports and
    an IPython kernel runs the call, except under pytest (nbmake runs notebooks with no frontend).
    """
    if interactive is None:
        interactive = _widgets_available()
    if not interactive:
        return roofline_figure(**defaults)
    import math

    import ipywidgets as w
    from IPython.display import display

    from minispec import roofline as rl
    from minispec.roofline import hardware as hw_presets

    s = EXPLORER_DEFAULTS | defaults
    roofline_figure(**s)  # fail here, on a bad default, rather than inside a widget callback
    slider = dict(continuous_update=False, style={"description_width": "110px"})
    log2 = [2**i for i in range(0, 17)]  # batch 1 .. 65536
    controls = dict(
        alpha=w.FloatSlider(s["alpha"], min=0, max=1, step=0.05, description="alpha", **slider),
        gamma=w.IntSlider(s["gamma"], min=0, max=12, description="gamma", **slider),
        draft=w.Dropdown(options=[("constant c", None)] + [(v.name, k) for k, v in rl.MODEL_SHAPES.items()],
                         value=s["draft"], description="draft", style=slider["style"]),
        draft_cost=w.FloatSlider(s["draft_cost"], min=0, max=0.5, step=0.01, description="c (if constant)",
                                 **slider),
        draft_kv_window=w.Dropdown(options=[("all of the context", None)] + sorted({256, 1024, 4096} | {
                                       s["draft_kv_window"] or 256}),
                                   value=s["draft_kv_window"], description="draft KV window", style=slider["style"]),
        batches=w.SelectionRangeSlider(options=log2, index=tuple(round(math.log2(b)) for b in s["batches"]),
                                       description="batch range", **slider),  # powers of two
        context=w.SelectionSlider(options=sorted({0, 256, 1024, 4096, 16384, 32768, 131072, s["context"]}),
                                  value=s["context"], description="context", **slider),
        weight_bits=w.ToggleButtons(options=[16, 8, 4], value=s["weight_bits"], description="weight bits",
                                    style=slider["style"]),
        hardware=w.Dropdown(options=[(v.name, k) for k, v in hw_presets.HARDWARE.items()], value=s["hardware"],
                            description="hardware", style=slider["style"]),
        target=w.Dropdown(options=[(v.name, k) for k, v in rl.MODEL_SHAPES.items()], value=s["target"],
                          description="target", style=slider["style"]),
    )
    out = w.Output()
    controls["draft_cost"].disabled = s["draft"] is not None  # c is the draft shape's own, then
    controls["draft"].observe(lambda change: setattr(controls["draft_cost"], "disabled", change.new is not None),
                              "value")

    def redraw(**settings):
        out.figure = roofline_figure(**settings)  # kept for tests and for saving: box.children[1].figure
        out.clear_output(wait=True)
        with out:
            display(out.figure)

    w.interactive_output(redraw, controls)
    names = list(controls)
    return w.VBox([w.HBox([w.VBox([controls[k] for k in names[:5]]), w.VBox([controls[k] for k in names[5:]])]), out])


def _widgets_available() -> bool:
    """Whether sliders can work here: ipywidgets imports, an IPython kernel runs, and not under pytest."""
    import os

    if "PYTEST_CURRENT_TEST" in os.environ:
        return False
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in shell.config
