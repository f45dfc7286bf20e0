"""The cheat sheet: one page, its formulas, every number recomputed with minispec, its links, its decision table.

As for the interview drill (``test_drill.py``, whose checks this reuses): each number the sheet states is computed
here and must appear as the sheet writes it, and every other decimal, and every integer written with a unit, must be
one the sheet sets itself (the reference setting) or a computed one. So the page cannot drift from the code.
"""

import re
from pathlib import Path

from test_drill import REFERENCE, REFERENCE_INTEGERS, blocks, decimals, found, n, quantities

from minispec import roofline as r
from minispec.roofline.hardware import H100_SXM, H200, Hardware

LESSONS = Path(__file__).parents[2] / "lessons"
SHEET = LESSONS / "cheat_sheet.md"
ROWS = ("batch", "acceptance", "context", "hardware", "draft kind")  # the decision table, in this order


def never_breaks_even(**draft) -> int:
    """The least context (tokens per row) from which gamma 4 never breaks even, by bisection."""
    lo, hi = 0, 4096
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if r.break_even_batch(context=mid, **draft) == float("inf") else (mid, hi)
    return hi


def computed() -> list[str]:
    """Every number the sheet states, recomputed and formatted as the sheet writes it."""
    reached = Hardware("H100, 70 % / 90 %", 0.9 * H100_SXM.memory_bandwidth, 0.7 * H100_SXM.peak_flops,
                       H100_SXM.memory_bytes)
    fp8 = Hardware("H100, FP8", H100_SXM.memory_bandwidth, 2 * H100_SXM.peak_flops, H100_SXM.memory_bytes)
    w4, w8 = r.quantized(r.LLAMA_8B, 4), r.quantized(r.LLAMA_8B, 8)
    alphas = [i / 100 for i in range(100)]
    pays_from = [next(a for a in alphas if r.speculative_speedup(1, a, 4, c) >= 1) for c in (0.05, 0.25)]
    prefill = next(T for T in range(1, 4097) if r.step_time(1, T) > r.step_time(1, 1)) - 1
    gammas = {B: r.best_gamma(B) for B in (32, 64, 128, 258)}
    off = next(B for B in range(1, 1000) if r.best_gamma(B) == 0)
    tree = r.tree_speedup_table([1])[0]
    return [
        n(r.expected_tokens(0.8, 4)), n(1e3 * r.step_time(1)), n(H100_SXM.ridge, ".0f"),
        n(r.compute_bound_batch(), ".0f"), *(n(r.speculative_speedup(B)) for B in (32, 64, 128, 256)),
        n(r.break_even_batch(), ".0f"), n(r.break_even_batch(hardware=H200), ".0f"),
        n(r.break_even_batch(hardware=reached), ".0f"),
        n(r.compute_bound_batch(model=w4), ".0f"), n(r.break_even_batch(model=w4), ".0f"),
        n(r.compute_bound_batch(hardware=fp8, model=w8), ".0f"), n(r.break_even_batch(hardware=fp8, model=w8), ".0f"),
        n(r.speculative_speedup(1, 0.3)), n(r.speculative_speedup(1, 0.3, 4, 0.25)), *(n(a) for a in pays_from),
        n(r.modelled_draft_cost(1, r.LLAMA_1B), ".3f"), n(r.speculative_speedup(1, draft=r.LLAMA_1B)),
        n(r.break_even_batch(draft=r.LLAMA_1B), ".0f"),
        n(r.LLAMA_8B.kv_bytes_per_token, ",.0f"), n(r.LLAMA_1B.kv_bytes_per_token, ",.0f"),
        str(r.max_batch(H100_SXM, r.LLAMA_8B, 4096)), str(r.max_batch(H100_SXM, r.LLAMA_8B, 4096, r.LLAMA_1B)),
        str(never_breaks_even()), str(never_breaks_even(draft=r.LLAMA_1B)), str(prefill),
        f"{r.best_gamma(1)} up to {max(B for B in range(1, 300) if r.best_gamma(B) == r.best_gamma(1))} rows",
        *(f"{g} at {B}" for B, g in gammas.items() if B != 32), f"off from {off}",
        n(r.compute_bound_batch(hardware=H200), ".0f"),
        str(tree["nodes"]), n(tree["tokens_per_step"]), n(tree["speedup"]),
    ]


# Numbers the sheet sets rather than derives: the shares of the peaks, alpha and c of the low-acceptance lines,
# the usable share of memory and the fractions in the formulas.
GIVEN = {"0.7", "0.9", "0.3", "0.25", "3.35", "0.8", "0.05"}
GIVEN_INTEGERS = {"70", "4,096", "256", "128", "64", "32", "80"}


def problems(text: str) -> list[str]:
    """What is wrong with a cheat sheet: a number not recomputed, a number without a source, a dead link, a missing
    formula or decision row, or more than a page."""
    numbers = computed()
    out = [f"{x} (computed by minispec) is not on the sheet" for x in numbers if not found(x, text)]
    derived = {x for s in numbers for x in re.findall(r"\d[\d,]*(?:\.\d+)?", s)}
    out += [f"{x} is neither computed nor given" for x in sorted(decimals(text) - derived - GIVEN - REFERENCE)]
    out += [f"the integer {x} is neither computed nor given" for x in
            sorted(quantities(text) - derived - GIVEN_INTEGERS - REFERENCE_INTEGERS)]
    out += [f"link to {x}, which is not in lessons/" for x in re.findall(r"\]\(([^)#:]+)\)", text)
            if not (LESSONS / x).is_file()]
    for formula in (r"(1 - \alpha^{\gamma+1}) / (1 - \alpha)", r"E / (1 + \gamma c)", r"\text{ridge} / (\gamma + 1)",
                    r"(E - \gamma c) \cdot B_\text{knee}", r"\min(p(x), q(x))", r"\prod_\text{path}",
                    r"\min(\text{ctx}, \text{window})"):
        if formula not in text:
            out.append(f"the formula {formula} is missing")
    table = text[text.index("## Should I turn speculation on?"):] if "## Should I turn speculation on?" in text else ""
    rows = re.findall(r"^\| \*\*(.+?)\*\* \|", table, re.M)
    if tuple(rows) != ROWS:
        out.append(f"the decision table's rows are {rows}, not {list(ROWS)}")
    if len(text.splitlines()) > 70:
        out.append(f"{len(text.splitlines())} lines: more than a page")
    return out


def test_the_cheat_sheet_is_consistent_with_the_code():
    assert problems(SHEET.read_text(encoding="utf-8")) == []


def test_the_goodput_question_it_points_to_is_about_goodput():
    number = re.search(r"\[drill, question (\d+)\]\(interview_drill\.md\)", SHEET.read_text(encoding="utf-8"))[1]
    title = blocks((LESSONS / "interview_drill.md").read_text(encoding="utf-8"))[1][int(number)].splitlines()[0]
    assert "goodput" in title


def test_the_check_catches_drift_a_stray_number_a_dead_link_and_a_lost_row():
    text = SHEET.read_text(encoding="utf-8")
    assert "the integer 188 is neither computed nor given" in problems(text.replace("| 187 rows", "| 188 rows"))
    assert "7.06 (computed by minispec) is not on the sheet" in problems(text.replace("7.06 tokens", "7.60 tokens"))
    assert "2.97 is neither computed nor given" in problems(text.replace("3.36 |", "3.36 (2.97 on a good day) |"))
    assert "the integer 12 is neither computed nor given" in problems(text.replace("104 (79", "104 (12 rows, 79"))
    assert "link to 99_nothing.ipynb, which is not in lessons/" in problems(text.replace(
        "(00_quickstart.ipynb)", "(99_nothing.ipynb)"))
    assert any(p.startswith("the decision table's rows") for p in problems(text.replace("| **context** |", "| x |")))
