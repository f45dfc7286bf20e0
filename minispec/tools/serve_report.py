"""What serve-bench shows a reader: its rows as a table (each setting's goodput below it) or as a plot.

Rows are :func:`minispec.tools.serve_bench.serve_bench`'s; ``cfg`` its :class:`~minispec.tools.serve_bench.LoadConfig`
(the rates, the SLOs and the attainment goodput asks for). Goodput as DistServe (Zhong et al. 2024) defines it:
the highest rate at which at least ``attainment`` of the requests meet both SLOs (:func:`goodput_rate`), shown
as a bound where the sweep does not pin it (:func:`goodput_text`).
"""

from __future__ import annotations

from minispec.course.plots import figure_class
from minispec.tools.bench import text_table

TABLE_SOURCE = "simulated, step table"  # the simulator on step times measured apart (engine_step_table)


def goodput_rate(rows: list[dict], setting: str, attainment: float = 0.9, source: str = "measured") -> float:
    """DistServe's goodput: the highest rate at which ``attainment`` of the requests met both SLOs (0: none)."""
    return max((r["rate"] for r in rows if r["setting"] == setting and r["source"] == source
                and r["slo_met"] >= attainment), default=0.0)


def goodput_text(rows: list[dict], setting: str, attainment: float = 0.9, source: str = "measured") -> str:
    """:func:`goodput_rate` as a reader should take it: ">= R" where R is the highest rate tried (the goodput may be
    higher), "< R" where no rate tried met the SLOs (R the lowest)."""
    tried = sorted(r["rate"] for r in rows if r["setting"] == setting and r["source"] == source)
    rate = goodput_rate(rows, setting, attainment, source)
    if tried and rate == tried[-1]:
        return f">= {rate:g}"
    if tried and rate == 0:
        return f"< {tried[0]:g}"
    return f"{rate:g}"


def report(rows: list[dict], cfg) -> str:
    """The measured rows, the simulated ones beside them when there are any, and each setting's goodput."""
    sim = {(r["setting"], r["rate"]): r for r in rows if r["source"] == "simulated"}
    keep = (lambda i: True) if sim else (lambda i: i not in (3, 5, 7, 9, 11))  # the "sim" columns
    head = ["rate", "setting", "TPOT p50 ms", "sim", "TPOT p99 ms", "sim", "TTFT p99 s", "sim", "tok/s", "sim",
            "SLOs met", "sim", "batch", "gamma", "preempted"]
    cells = [[c for i, c in enumerate(head) if keep(i)]]
    for m in (r for r in rows if r["source"] == "measured"):
        s = sim.get((m["setting"], m["rate"]), {})

        def f(key, scale=1.0, fmt="{:.1f}", r=s):
            return fmt.format(scale * r[key]) if r.get(key) is not None else "-"

        row = [f"{m['rate']:g}", m["setting"], f("tpot_p50_s", 1e3, r=m), f("tpot_p50_s", 1e3),
               f("tpot_p99_s", 1e3, r=m), f("tpot_p99_s", 1e3), f("ttft_p99_s", fmt="{:.2f}", r=m),
               f("ttft_p99_s", fmt="{:.2f}"), f("throughput", fmt="{:.0f}", r=m), f("throughput", fmt="{:.0f}"),
               f("slo_met", 100, "{:.0f}%", r=m), f("slo_met", 100, "{:.0f}%"), f"{m['mean_batch']:.1f}",
               f"{m['mean_gamma']:.1f}", str(m["preemptions"])]
        cells.append([c for i, c in enumerate(row) if keep(i)])
    other = {(r["setting"], r["rate"]): r for r in rows if r["source"] == TABLE_SOURCE}
    if other:
        cells2 = [["rate", "setting", "TPOT p50 ms", "TTFT p99 s", "tok/s", "SLOs met"]]
        for m in (r for r in rows if r["source"] == "measured"):
            o = other[(m["setting"], m["rate"])]
            cells2.append([f"{m['rate']:g}", m["setting"], f"{1e3 * o['tpot_p50_s']:.1f}", f"{o['ttft_p99_s']:.2f}",
                           f"{o['throughput']:.0f}", f"{100 * o['slo_met']:.0f}%"])
    names = list(dict.fromkeys(r["setting"] for r in rows))
    good = "; ".join(f"{n} {goodput_text(rows, n, cfg.attainment)}" + (
        f" (simulated {goodput_text(rows, n, cfg.attainment, 'simulated')})" if sim else "") for n in names)
    title = ("Measured, and simulated on step times fitted to the same run's engine steps (sim):" if sim
             else "Measured (nothing simulated):")
    text = (title + "\n" + text_table(cells, left=2) + f"\n\nGoodput, the highest rate (requests/s) at which >= "
            f"{cfg.attainment:.0%} of requests meet TTFT <= {cfg.ttft_slo_s:g} s and TPOT <= "
            f"{1e3 * cfg.tpot_slo_s:g} ms: {good}\n")
    if ">= " in good:
        text += ("(>= R: R is the highest rate tried and met the SLOs, so the goodput may be higher: try higher "
                 "--rates)\n")
    if "< " in good:
        text += "(< R: no rate tried met the SLOs, R the lowest: the goodput is below it)\n"
    if sim and any(n.startswith("tree ") for n in names):
        text += ("A tree's simulated rows take it as a chain of its depth: acceptance per depth as measured, its "
                 "step times as measured.\n")
    if other:
        text += ("\nSimulated on step times measured apart, closed-loop, just before the sweep (the machine's speed "
                 "drifts with its other load between the two):\n" + text_table(cells2, left=2) + "\n")
    return text


def plot(rows: list[dict], cfg, title: str = ""):
    """TTFT p99, TPOT p50 (and p99), SLO attainment and throughput against the arrival rate, a colour per setting;
    measured solid, simulated dashed."""
    Figure = figure_class()  # an ImportError saying what to install

    fig = Figure(figsize=(12, 8), layout="constrained")
    (ttft, tpot), (met, thr) = fig.subplots(2, 2)
    for setting in dict.fromkeys(r["setting"] for r in rows):
        color = None
        for source, style in (("measured", "o-"), ("simulated", "x--")):
            mine = sorted((r for r in rows if r["setting"] == setting and r["source"] == source),
                          key=lambda r: r["rate"])
            if not mine:
                continue
            x, label = [r["rate"] for r in mine], f"{setting} ({source})"
            (line,) = tpot.plot(x, [1e3 * r["tpot_p50_s"] for r in mine], style, color=color, label=f"{label} p50")
            color = line.get_color()
            if source == "measured":
                tpot.plot(x, [1e3 * r["tpot_p99_s"] for r in mine], ":", color=color, label=f"{setting} p99")
            for ax, key, scale in ((ttft, "ttft_p99_s", 1), (met, "slo_met", 100), (thr, "throughput", 1)):
                ax.plot(x, [scale * r[key] for r in mine], style, color=color, label=label)
    tpot.axhline(1e3 * cfg.tpot_slo_s, color="gray", ls="--", lw=1)
    ttft.axhline(cfg.ttft_slo_s, color="gray", ls="--", lw=1)
    met.axhline(100 * cfg.attainment, color="gray", ls="--", lw=1)
    for ax, ylabel, name in ((ttft, "TTFT p99 (s)", "time to first token, p99"),
                             (tpot, "TPOT (ms)", "time per output token"),
                             (met, "% of requests", "meeting both SLOs"), (thr, "output tokens/s", "throughput")):
        ax.set(xlabel="arrival rate (requests/s)", ylabel=ylabel, title=name, xscale="log")
        ax.set_xticks(list(cfg.rates), [f"{r:g}" for r in cfg.rates])
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="xx-small")
    ttft.set_yscale("log")
    if title:
        fig.suptitle(title)
    return fig
