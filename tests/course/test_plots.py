"""The roofline explorer draws the roofline's own numbers, statically under pytest and with sliders in a kernel."""

import sys

import pytest

from minispec.course import plots
from minispec.roofline import LLAMA_1B, LLAMA_8B, break_even_batch, compute_bound_batch, max_batch, speculative_speedup
from minispec.roofline.hardware import H100_SXM, H200


def curve(fig, prefix):
    """(x, y) of the line whose label starts with ``prefix``."""
    (line,) = [ln for ln in fig.axes[0].lines if ln.get_label().startswith(prefix)]
    return list(line.get_xdata()), list(line.get_ydata())


def test_static_explorer_draws_the_reference_by_default():
    fig = plots.roofline_explorer()  # under pytest: no frontend, so a static figure of the defaults
    assert type(fig).__name__ == "Figure"
    assert fig.axes[0].get_title() == "break-even at batch 187"
    xs, ys = curve(fig, "Llama-3-8B on H100 SXM")
    assert xs[0] == 1 and xs[-1] == 512
    assert ys == [speculative_speedup(B) for B in xs]
    assert round(ys[0], 2) == 2.80 and round(min(ys), 2) < 1
    labels = [ln.get_label() for ln in fig.axes[0].lines]
    assert any("compute-bound (batch 59)" in label for label in labels)
    assert any("stops paying (187)" in label for label in labels)


def test_settings_move_the_curve_as_the_roofline_does():
    fig = plots.roofline_figure(hardware="h200", gamma=2, alpha=0.6)
    be = break_even_batch(0.6, 2, 0.05, H200)
    assert fig.axes[0].get_title() == f"break-even at batch {be:.0f}"
    xs, ys = curve(fig, "Llama-3-8B on H200")
    assert ys == [speculative_speedup(B, 0.6, 2, 0.05, H200) for B in xs]
    ref_x, ref_y = curve(fig, "reference")
    assert ref_y == [speculative_speedup(B) for B in ref_x]  # the reference stays put
    bound = compute_bound_batch(2, H200)
    assert any(f"compute-bound (batch {bound:.0f})" in ln.get_label() for ln in fig.axes[0].lines)


def test_memory_ends_the_curve_and_weight_bits_move_the_bend():
    fig = plots.roofline_figure(context=32768)
    rows = max_batch(H100_SXM, LLAMA_8B, 32768)  # 13 rows of 32k context in 90 % of 80 GB
    assert rows == 13 and fig.axes[0].get_title().endswith("memory holds 13 rows")
    xs, _ = curve(fig, "Llama-3-8B on H100 SXM")
    assert max(xs) <= 13 < 2 * max(xs)
    w4 = plots.roofline_figure(weight_bits=4)
    assert any("compute-bound (batch 15)" in ln.get_label() for ln in w4.axes[0].lines)  # 59 / 4: a quarter the bytes
    drafted = plots.roofline_figure(draft="llama-1b", context=4096, draft_kv_window=256)
    xs, ys = curve(drafted, "Llama-3-8B on H100 SXM, alpha 0.8, gamma 4, draft Llama-3.2-1B")
    assert ys == [speculative_speedup(B, context=4096, draft=LLAMA_1B, draft_kv_window=256) for B in xs]
    too_big = plots.roofline_figure(target="llama-70b", hardware="l4")
    assert "do not fit" in too_big.axes[0].get_title()


def test_unknown_setting_is_an_error():
    with pytest.raises(TypeError, match="alhpa"):
        plots.roofline_explorer(interactive=False, alhpa=0.5)


def test_sliders_redraw_the_figure():
    pytest.importorskip("ipywidgets")
    box = plots.roofline_explorer(interactive=True, alpha=0.7)
    out = box.children[1]
    assert out.figure.axes[0].get_title() == f"break-even at batch {break_even_batch(0.7):.0f}"
    controls = {c.description: c for column in box.children[0].children for c in column.children}
    controls["hardware"].value = "h200"
    assert out.figure.axes[0].get_title() == f"break-even at batch {break_even_batch(0.7, hardware=H200):.0f}"
    assert not controls["c (if constant)"].disabled
    controls["draft"].value = "llama-1b"
    assert controls["c (if constant)"].disabled  # a draft shape brings its own c


def test_no_widgets_means_a_static_figure(monkeypatch):
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # as if it were not installed
    assert plots._widgets_available() is False
    assert type(plots.roofline_explorer()).__name__ == "Figure"
